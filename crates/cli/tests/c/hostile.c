/* A program hostile to a user-space pager (issue 10's invariant): its environment, its locale
 * data and its stdout buffer all live in its heap, which a tiny budget evicts, while it frees
 * and reallocates memory (so the allocator purges) and asks libc for error texts. A zmem thread
 * that read any of these (getenv, strerror/gettext, stdio) would fault on a page only it can
 * bring back, and the program would hang.
 *
 * usage: hostile MIB ROUNDS; prints "checksum=N" (the same with and without zmem). */
#include <errno.h>
#include <locale.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define BLOCK (64 * 1024)

static void fill(unsigned char *p, size_t n, uint64_t seed) {
    uint64_t x = seed * 0x9E3779B97F4A7C15ull + 1;
    for (size_t i = 0; i < n; i++) {
        x ^= x << 13; x ^= x >> 7; x ^= x << 17;
        /* Compressible: runs of a few distinct bytes. */
        p[i] = (unsigned char)('a' + (x % 4));
    }
}

static uint64_t sum(const unsigned char *p, size_t n) {
    uint64_t s = 1469598103934665603ull;
    for (size_t i = 0; i < n; i++) s = (s ^ p[i]) * 1099511628211ull;
    return s;
}

int main(int argc, char **argv) {
    size_t mib = argc > 1 ? strtoul(argv[1], NULL, 10) : 32;
    int rounds = argc > 2 ? atoi(argv[2]) : 3;
    /* 1. The environment moves into the heap: setenv grows environ with malloc. */
    for (int i = 0; i < 300; i++) {
        char k[48], v[64];
        snprintf(k, sizeof k, "ZMEM_HOSTILE_%d", i);
        snprintf(v, sizeof v, "value-%d-%0*d", i, 40, i);
        if (setenv(k, v, 1) != 0) { perror("setenv"); return 2; }
    }
    /* 2. Locale data in the heap (absent locales leave "C": still a heap-allocated name). */
    if (!setlocale(LC_ALL, "C.UTF-8")) setlocale(LC_ALL, "");
    /* 3. stdout's buffer in the heap. */
    char *obuf = malloc(1 << 16);
    if (!obuf || setvbuf(stdout, obuf, _IOFBF, 1 << 16) != 0) { fprintf(stderr, "setvbuf\n"); return 2; }

    size_t n = mib * 1024 * 1024 / BLOCK;
    unsigned char **blocks = calloc(n, sizeof *blocks);
    size_t *sizes = calloc(n, sizeof *sizes);
    if (!blocks || !sizes) { fprintf(stderr, "calloc\n"); return 2; }
    uint64_t checksum = 0;
    for (int r = 0; r < rounds; r++) {
        for (size_t i = 0; i < n; i++) {
            if (!blocks[i]) {
                sizes[i] = BLOCK;
                blocks[i] = malloc(sizes[i]);
                if (!blocks[i]) { fprintf(stderr, "malloc failed\n"); return 2; }
                fill(blocks[i], sizes[i], i * 131 + r);
            }
        }
        /* Free every other block (the allocator purges freed pages), grow the rest. */
        for (size_t i = r % 2; i < n; i += 2) { free(blocks[i]); blocks[i] = NULL; }
        for (size_t i = (r + 1) % 2; i < n; i += 2) {
            unsigned char *q = realloc(blocks[i], sizes[i] + BLOCK / 2);
            if (!q) { fprintf(stderr, "realloc failed\n"); return 2; }
            fill(q + sizes[i], BLOCK / 2, i * 7 + r);
            blocks[i] = q;
            sizes[i] += BLOCK / 2;
        }
        for (size_t i = 0; i < n; i++)
            if (blocks[i]) checksum ^= sum(blocks[i], sizes[i]) + i;
        /* The program itself reads its (evicted) environment, locale and error texts. */
        char want[64];
        snprintf(want, sizeof want, "value-%d-%0*d", 123, 40, 123);
        const char *got = getenv("ZMEM_HOSTILE_123");
        if (!got || strcmp(got, want) != 0) { fprintf(stderr, "environment lost\n"); return 3; }
        if (strlen(strerror(ENOENT)) == 0) { fprintf(stderr, "strerror empty\n"); return 3; }
        printf("round %d of %d done\n", r + 1, rounds);
        for (size_t i = 0; i < n; i += 2) {
            /* Shrink back so the blocks' sizes repeat each round. */
            if (blocks[i] && sizes[i] > 4 * BLOCK) { free(blocks[i]); blocks[i] = NULL; }
        }
    }
    printf("checksum=%llu\n", (unsigned long long)checksum);
    return 0;
}
