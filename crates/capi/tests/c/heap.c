/*
 * zmem's heap from C: chosen data in tiered memory without LD_PRELOAD.
 *
 * 1. A 128 MiB heap that keeps 4 MiB resident: 20,000 objects of 16 B to 4 KiB (about 40 MiB),
 *    filled, resized, half of them freed, all checked byte for byte, calloc'd blocks checked for
 *    zeros; the statistics must agree with what the program did.
 * 2. The error paths: NULL heap, overflow, no room, foreign pointers (refused and left alone).
 * 3. A quarter of that through 1 MiB resident over an SSD tier in the directory given as argv[1]
 *    (1 MiB of compressed pool): the data must come back through the log.
 * 4. Destroyed with live blocks.
 *
 * Exits 0 when every check passed, 77 when this user may not use userfaultfd (the test suite
 * reports a skip), 1 otherwise.
 */
#include <errno.h>
#include <inttypes.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "zmem.h"

#define MIB ((uint64_t)1 << 20)
#define OBJECTS 20000

static int failures = 0;

#define CHECK(cond, ...)                                                                          \
    do {                                                                                          \
        if (!(cond)) {                                                                            \
            printf("FAIL line %d: ", __LINE__);                                                   \
            printf(__VA_ARGS__);                                                                  \
            printf(" (last error: %s)\n", zmem_last_error());                                     \
            failures++;                                                                           \
        }                                                                                         \
    } while (0)

/* The byte at offset i of object `seed`: half noise, half text, so pages compress about 2:1. */
static unsigned char pattern(uint64_t seed, size_t i) {
    if (i % 8 < 4) {
        uint64_t x = (seed ^ (i / 8)) * UINT64_C(0x9E3779B97F4A7C15);
        return (unsigned char)(x >> 56);
    }
    return (unsigned char)"zmem heap "[i % 10];
}

static void fill(unsigned char *p, size_t n, uint64_t seed) {
    for (size_t i = 0; i < n; i++) p[i] = pattern(seed, i);
}

static int intact(const unsigned char *p, size_t n, uint64_t seed) {
    for (size_t i = 0; i < n; i++)
        if (p[i] != pattern(seed, i)) return 0;
    return 1;
}

struct object {
    unsigned char *p;
    size_t size;
    uint64_t seed;
};

static struct object objects[OBJECTS];

static zmem_heap *create(uint64_t size, uint64_t resident, const char *ssd) {
    zmem_options o;
    if (zmem_options_init(&o) != ZMEM_OK) return NULL;
    o.size = size;
    o.resident = resident;
    if (ssd != NULL) {
        o.ssd_path = ssd;
        o.ssd_size = 128 * MIB;
        o.store_limit = 1 * MIB;
    }
    zmem_heap *h = NULL;
    zmem_status st = zmem_heap_create(&o, &h);
    if (st == ZMEM_PERMISSION || st == ZMEM_UNSUPPORTED) {
        printf("skip: %s\n", zmem_last_error());
        exit(77);
    }
    CHECK(st == ZMEM_OK && h != NULL, "zmem_heap_create: %s", zmem_status_str(st));
    return h;
}

static void objects_round_trip(zmem_heap *h, const char *what, size_t count) {
    uint64_t seed = 1;
    size_t live = 0;
    for (size_t i = 0; i < count; i++) {
        size_t size = 16 + (i * 7919) % 4080;
        unsigned char *p = zmem_malloc(h, size);
        CHECK(p != NULL, "%s: zmem_malloc(%zu)", what, size);
        if (p == NULL) return;
        CHECK(zmem_usable_size(h, p) >= size, "%s: usable size", what);
        fill(p, size, seed);
        objects[i] = (struct object){p, size, seed++};
        live++;
    }
    /* Every third object grows or shrinks; its prefix must survive the move. */
    for (size_t i = 0; i < count; i += 3) {
        struct object *o = &objects[i];
        size_t size = o->size % 2 ? o->size * 2 : o->size / 2 + 1;
        unsigned char *q = zmem_realloc(h, o->p, size);
        CHECK(q != NULL, "%s: zmem_realloc", what);
        if (q == NULL) continue;
        CHECK(intact(q, size < o->size ? size : o->size, o->seed), "%s: realloc kept object %zu",
              what, i);
        fill(q, size, seed);
        *o = (struct object){q, size, seed++};
    }
    /* Half are freed, the rest checked from last to first (long evicted by now). */
    for (size_t i = 0; i < count; i += 2) {
        CHECK(intact(objects[i].p, objects[i].size, objects[i].seed), "%s: object %zu", what, i);
        CHECK(zmem_free(h, objects[i].p) == ZMEM_OK, "%s: zmem_free", what);
        objects[i].p = NULL;
        live--;
    }
    for (size_t i = count; i-- > 0;) {
        if (objects[i].p != NULL)
            CHECK(intact(objects[i].p, objects[i].size, objects[i].seed), "%s: object %zu", what,
                  i);
    }
    /* calloc'd memory is zero even where freed objects were. */
    for (size_t i = 0; i < 1000; i++) {
        size_t n = 1 + i % 300;
        unsigned char *z = zmem_calloc(h, n, 7);
        CHECK(z != NULL, "%s: zmem_calloc", what);
        if (z == NULL) continue;
        for (size_t k = 0; k < n * 7; k++) CHECK(z[k] == 0, "%s: calloc byte %zu", what, k);
        CHECK(zmem_free(h, z) == ZMEM_OK, "%s: free calloc'd", what);
    }
    zmem_heap_statistics s;
    CHECK(zmem_heap_stats(h, &s) == ZMEM_OK, "%s: zmem_heap_stats", what);
    CHECK(s.live_blocks == live, "%s: live_blocks %" PRIu64 ", expected %zu", what,
          s.live_blocks, live);
    CHECK(s.region.evictions > 0 && s.region.major_faults > 0, "%s: nothing was evicted", what);
    printf("%s: %" PRIu64 " live blocks, %" PRIu64 " KiB allocated, %" PRIu64
           " KiB resident of %" PRIu64 " KiB budget, %" PRIu64 " evictions, %" PRIu64
           " major faults, ratio %.2f, SSD written %" PRIu64 " read %" PRIu64 " pages\n",
           what, s.live_blocks, s.allocated >> 10, s.region.resident >> 10,
           s.region.budget >> 10, s.region.evictions, s.region.major_faults,
           s.region.compression_ratio, s.region.ssd_writeback_pages, s.region.ssd_reads);
}

static void error_paths(zmem_heap *h) {
    errno = 0;
    CHECK(zmem_malloc(NULL, 8) == NULL && errno == EINVAL, "malloc on a NULL heap");
    CHECK(strstr(zmem_last_error(), "heap is NULL") != NULL, "message for a NULL heap");
    errno = 0;
    CHECK(zmem_calloc(h, SIZE_MAX / 2, 3) == NULL && errno == ENOMEM, "calloc overflow");
    CHECK(strstr(zmem_last_error(), "overflows") != NULL, "message for an overflow");
    errno = 0;
    CHECK(zmem_malloc(h, (size_t)1 << 40) == NULL && errno == ENOMEM, "malloc of 1 TiB");
    CHECK(strstr(zmem_last_error(), "out of memory") != NULL, "message for no room");

    long local = 42;
    long *outside = malloc(sizeof *outside);
    void *foreign[] = {&local, outside, (char *)zmem_malloc(h, 64) + 3};
    const char *names[] = {"a stack address", "a malloc'd block", "a misaligned pointer into a block"};
    for (int i = 0; i < 3; i++) {
        zmem_status st = zmem_free(h, foreign[i]);
        CHECK(st == ZMEM_INVALID_ARGUMENT, "free of %s: %s", names[i], zmem_status_str(st));
        CHECK(strstr(zmem_last_error(), "is not a block of this heap") != NULL,
              "message for %s", names[i]);
        errno = 0;
        CHECK(zmem_realloc(h, foreign[i], 100) == NULL && errno == EINVAL, "realloc of %s",
              names[i]);
        CHECK(zmem_usable_size(h, foreign[i]) == 0, "usable size of %s", names[i]);
    }
    CHECK(local == 42, "the stack was left alone");
    free(outside);
    CHECK(zmem_free(h, NULL) == ZMEM_OK, "free(NULL)");
    CHECK(zmem_free(NULL, NULL) == ZMEM_INVALID_ARGUMENT, "free on a NULL heap");
    zmem_heap_statistics s;
    CHECK(zmem_heap_stats(NULL, &s) == ZMEM_INVALID_ARGUMENT, "stats of a NULL heap");
    CHECK(zmem_heap_stats(h, NULL) == ZMEM_INVALID_ARGUMENT, "stats into NULL");
    zmem_options o;
    zmem_options_init(&o);
    zmem_heap *none = (zmem_heap *)&o;
    CHECK(zmem_heap_create(NULL, &none) == ZMEM_INVALID_ARGUMENT && none == NULL,
          "create without options");
    CHECK(zmem_heap_create(&o, NULL) == ZMEM_INVALID_ARGUMENT, "create without out");
    o.size = MIB;
    o.resident = MIB;
    CHECK(zmem_heap_create(&o, &none) == ZMEM_INVALID_ARGUMENT, "a heap of 1 MiB");
    zmem_heap_destroy(NULL);
    printf("error paths checked\n");
}

int main(int argc, char **argv) {
    zmem_heap *h = create(128 * MIB, 4 * MIB, NULL);
    if (h == NULL) return 1;
    objects_round_trip(h, "dram", OBJECTS);
    error_paths(h);
    zmem_heap_destroy(h); /* half the objects still live */

    if (argc > 1) {
        zmem_heap *s = create(128 * MIB, 1 * MIB, argv[1]);
        if (s == NULL) return 1;
        objects_round_trip(s, "ssd", OBJECTS / 4);
        zmem_heap_statistics st;
        zmem_heap_stats(s, &st);
        CHECK(st.region.ssd_writeback_pages > 0 && st.region.ssd_reads > 0 &&
                  st.region.ssd_errors == 0,
              "the SSD tier was not used");
        zmem_heap_destroy(s);
    }
    if (failures) {
        printf("%d checks FAILED\n", failures);
        return 1;
    }
    printf("OK\n");
    return 0;
}
