/*
 * zmem from C: a 64 MiB region that may keep only 8 MiB resident in DRAM.
 *
 * Fills every page with text-like bytes (which compress) ending in a checksum, reads everything
 * back twice (in order, then scattered) and checks each page byte for byte, then prints the
 * region's statistics. Exits 0 when every page came back intact, 77 when this user may not use
 * userfaultfd (the test suite reports that as a skip), 1 on any other error or mismatch.
 *
 * Build: see README.md next to this file.
 */
#include <inttypes.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "zmem.h"

#define MIB ((uint64_t)1 << 20)
#define PAGE_SIZE 4096u
#define REGION_SIZE (64 * MIB)
#define RESIDENT (8 * MIB)
/* Bytes of a page before its 8-byte checksum. */
#define BODY (PAGE_SIZE - 8u)

static const char *const WORDS[] = {
    "the",    "memory", "page",     "region", "compressed", "cold",    "hot",    "fault",
    "budget", "zmem",   "resident", "evict",  "store",      "pool",    "lz4",    "zstd",
    "of",     "and",    "a",        "to",     "in",         "is",      "that",   "for",
    "data",   "user",   "space",    "kernel", "program",    "touches", "stays",  "returns",
};
#define NWORDS (sizeof WORDS / sizeof WORDS[0])

static uint64_t next_random(uint64_t *state) {
    /* xorshift64*: cheap and deterministic, so a page can be regenerated from its index. */
    uint64_t x = *state;
    x ^= x >> 12;
    x ^= x << 25;
    x ^= x >> 27;
    *state = x;
    return x * UINT64_C(2685821657736338717);
}

static uint64_t fnv1a(const unsigned char *p, size_t n) {
    uint64_t h = UINT64_C(14695981039346656037);
    for (size_t i = 0; i < n; i++) {
        h ^= p[i];
        h *= UINT64_C(1099511628211);
    }
    return h;
}

/* Writes the content of page `index` to `out` (PAGE_SIZE bytes): a header line, words, and the
 * FNV-1a checksum of the first BODY bytes in the last 8 bytes. */
static void make_page(uint64_t index, unsigned char *out) {
    uint64_t state = (index + 1) * UINT64_C(0x9E3779B97F4A7C15);
    size_t n = (size_t)snprintf((char *)out, BODY, "zmem page %" PRIu64 ":\n", index);
    unsigned words_on_line = 0;
    while (n < BODY) {
        const char *w = WORDS[next_random(&state) % NWORDS];
        size_t len = strlen(w);
        for (size_t i = 0; i < len && n < BODY; i++) {
            out[n++] = (unsigned char)w[i];
        }
        if (n < BODY) {
            out[n++] = (++words_on_line % 12 == 0) ? '\n' : ' ';
        }
    }
    uint64_t sum = fnv1a(out, BODY);
    memcpy(out + BODY, &sum, sizeof sum);
}

/* Checks page `index` of the region: its checksum, then every byte against a regenerated copy. */
static int check_page(const unsigned char *base, uint64_t index, unsigned char *expected) {
    const unsigned char *page = base + index * PAGE_SIZE;
    uint64_t stored;
    memcpy(&stored, page + BODY, sizeof stored);
    if (stored != fnv1a(page, BODY)) {
        fprintf(stderr, "region: page %" PRIu64 ": checksum mismatch\n", index);
        return -1;
    }
    make_page(index, expected);
    if (memcmp(page, expected, PAGE_SIZE) != 0) {
        fprintf(stderr, "region: page %" PRIu64 ": content differs from what was written\n",
                index);
        return -1;
    }
    return 0;
}

static int fail(const char *what, zmem_status status) {
    fprintf(stderr, "region: %s failed: %s (%d): %s\n", what, zmem_status_str(status),
            (int)status, zmem_last_error());
    return status == ZMEM_PERMISSION ? 77 : 1;
}

int main(void) {
    printf("zmem %s\n", zmem_version());

    zmem_options options;
    zmem_status status = zmem_options_init(&options);
    if (status != ZMEM_OK) {
        return fail("zmem_options_init", status);
    }
    options.size = REGION_SIZE;
    options.resident = RESIDENT;

    zmem_region *region = NULL;
    status = zmem_region_create(&options, &region);
    if (status != ZMEM_OK) {
        return fail("zmem_region_create", status);
    }
    unsigned char *base = zmem_region_base(region);
    size_t size = zmem_region_size(region);
    if (base == NULL || size != REGION_SIZE) {
        fprintf(stderr, "region: base %p, size %zu (expected %" PRIu64 ")\n", (void *)base, size,
                REGION_SIZE);
        zmem_region_destroy(region);
        return 1;
    }
    uint64_t pages = size / PAGE_SIZE;
    printf("region: %" PRIu64 " MiB, resident budget %" PRIu64 " MiB\n", size / MIB,
           RESIDENT / MIB);

    /* Write every page in place: most of them are evicted (compressed) as the budget fills. */
    for (uint64_t i = 0; i < pages; i++) {
        make_page(i, base + i * PAGE_SIZE);
    }
    printf("wrote %" PRIu64 " pages\n", pages);

    /* Read back in order, then scattered (7919 is prime, so i*7919 mod pages visits every page
     * once). Each touch of an evicted page brings it back from the compressed store. */
    static unsigned char expected[PAGE_SIZE];
    int bad = 0;
    for (uint64_t i = 0; i < pages && !bad; i++) {
        bad = check_page(base, i, expected) != 0;
    }
    for (uint64_t i = 0; i < pages && !bad; i++) {
        bad = check_page(base, (i * 7919) % pages, expected) != 0;
    }
    if (bad) {
        zmem_region_destroy(region);
        return 1;
    }
    printf("verified %" PRIu64 " pages twice\n", pages);

    zmem_stats st;
    status = zmem_region_stats(region, &st);
    if (status != ZMEM_OK) {
        zmem_region_destroy(region);
        return fail("zmem_region_stats", status);
    }
    printf("faults: %" PRIu64 " (major %" PRIu64 ", zero %" PRIu64 ", staged %" PRIu64
           ", fault-around pages %" PRIu64 ")\n",
           st.faults, st.major_faults, st.zero_faults, st.staged_faults, st.fault_around_pages);
    printf("evictions: %" PRIu64 " (direct %" PRIu64 ")\n", st.evictions, st.direct_evictions);
    printf("fault latency: p50 %.1f us, p99 %.1f us, p99.9 %.1f us\n",
           st.fault_latency_p50_ns / 1e3, st.fault_latency_p99_ns / 1e3,
           st.fault_latency_p999_ns / 1e3);
    printf("resident %.1f MiB, staged %.1f MiB, budget %.1f MiB\n", (double)st.resident / MIB,
           (double)st.staged / MIB, (double)st.budget / MIB);
    printf("store: %.1f MiB of pages in %.1f MiB compressed, pool %.1f MiB, %" PRIu64
           " same-filled\n",
           (double)st.orig_data_size / MIB, (double)st.compr_data_size / MIB,
           (double)st.mem_used_total / MIB, st.same_pages);
    printf("ratio: %.2f (region data per byte of DRAM), store %.2f\n", st.effective_ratio,
           st.compression_ratio);

    /* 64 MiB through an 8 MiB budget cannot stay resident: the region must have tiered. */
    if (st.evictions == 0 || st.major_faults == 0) {
        fprintf(stderr, "region: expected evictions and major faults, got %" PRIu64 " and %" PRIu64
                        "\n",
                st.evictions, st.major_faults);
        zmem_region_destroy(region);
        return 1;
    }

    /* A smaller budget for the rest of the program's life. */
    status = zmem_region_set_resident(region, 4 * MIB);
    if (status != ZMEM_OK) {
        zmem_region_destroy(region);
        return fail("zmem_region_set_resident", status);
    }
    zmem_region_destroy(region);
    printf("OK\n");
    return 0;
}
