/* exact_fit: mid-size blocks (sqlite's 4368-byte page-cache pages) take what they ask for.
 * Allocates N blocks of 4368 bytes with contents that depend on (block, offset), resizes some
 * in place and some across heaps (a 100-byte block grown to 3000, 4368-byte ones shrunk to
 * 200 or grown to 9000, 20000 or 30000), reuses freed memory through calloc (must read zero), checks every
 * block in a forked child that also allocates and frees, then in the parent, and frees all.
 * Prints "ok usable=U" (U: malloc_usable_size of a 4368-byte block). Exits 1 on a mismatch.
 *
 * Usage: exact_fit N [PAUSE_MS [rss]]: pauses PAUSE_MS after the first allocations and after the
 * resizes (where the heap's data peaks), for a sampler to see them. With "rss", it also waits
 * 150 ms after freeing everything, allocates and frees one block (the allocator's next call,
 * which drops holes that stayed free long enough) and prints how much its resident memory fell
 * from before the frees: " rss_drop_kb=D" after the usable size. */
#define _GNU_SOURCE
#include <malloc.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#define SIZE 4368

static void fail(const char *what, size_t i) {
    fprintf(stderr, "exact_fit: %s (block %zu)\n", what, i);
    exit(1);
}

static unsigned char byte(size_t block, size_t i) { return (unsigned char)(block * 131 + i / 7 + (i >> 9)); }

static void fill(unsigned char *p, size_t block, size_t n) {
    for (size_t i = 0; i < n; i++) p[i] = byte(block, i);
}

static long rss_kb(void) {
    FILE *f = fopen("/proc/self/status", "r");
    char line[256];
    long kb = -1;
    while (f && fgets(line, sizeof line, f))
        if (sscanf(line, "VmRSS: %ld kB", &kb) == 1) break;
    if (f) fclose(f);
    return kb;
}

static void check(const unsigned char *p, size_t block, size_t n) {
    for (size_t i = 0; i < n; i++)
        if (p[i] != byte(block, i)) fail("contents changed", block);
}

int main(int argc, char **argv) {
    size_t n = argc > 1 ? strtoul(argv[1], 0, 10) : 20000;
    unsigned pause_ms = argc > 2 ? (unsigned)atoi(argv[2]) : 0;
    unsigned char **b = calloc(n, sizeof *b);
    size_t *len = calloc(n, sizeof *len);
    if (!b || !len) fail("out of memory", 0);
    for (size_t i = 0; i < n; i++) {
        b[i] = malloc(SIZE);
        if (!b[i]) fail("malloc", i);
        len[i] = SIZE;
        fill(b[i], i, SIZE);
    }
    if (pause_ms) usleep(pause_ms * 1000u);
    size_t usable = malloc_usable_size(b[0]);
    if (usable < SIZE) fail("usable size below the request", 0);
    /* Holes: every third block freed, then taken again by calloc, which must zero it. */
    for (size_t i = 0; i < n; i += 3) free(b[i]);
    for (size_t i = 0; i < n; i += 3) {
        unsigned char *p = calloc(1, SIZE);
        if (!p) fail("calloc", i);
        for (size_t k = 0; k < SIZE; k++)
            if (p[k]) fail("calloc returned memory that is not zero", i);
        fill(p, i, SIZE);
        b[i] = p;
    }
    /* Resizes: shrink, grow in place or elsewhere, grow far, and a small block grown into the
     * mid sizes. */
    for (size_t i = 1; i < n; i += 5) {
        check(b[i], i, len[i]);
        size_t want = (i % 4 == 1) ? 200 : (i % 4 == 2) ? 9000 : (i % 4 == 3) ? 20000 : 30000;
        unsigned char *q = realloc(b[i], want);
        if (!q) fail("realloc", i);
        check(q, i, want < len[i] ? want : len[i]);
        fill(q, i, want);
        b[i] = q;
        len[i] = want;
    }
    if (pause_ms) usleep(pause_ms * 1000u);
    unsigned char *small = malloc(100);
    fill(small, 7, 100);
    small = realloc(small, 3000);
    if (!small) fail("realloc of a small block", 7);
    check(small, 7, 100);
    free(small);
    void *aligned = 0;
    if (posix_memalign(&aligned, 64, 4096) || (uintptr_t)aligned % 64) fail("posix_memalign", 0);
    free(aligned);

    pid_t pid = fork();
    if (pid < 0) fail("fork", 0);
    if (pid == 0) {
        for (size_t i = 0; i < n; i++) check(b[i], i, len[i]);
        for (size_t i = 0; i < n; i += 2) free(b[i]);
        for (size_t i = 0; i < n; i += 2) {
            b[i] = malloc(SIZE);
            if (!b[i]) fail("malloc in the child", i);
            fill(b[i], i + 1, SIZE);
        }
        for (size_t i = 0; i < n; i += 2) check(b[i], i + 1, SIZE);
        _exit(0);
    }
    int st;
    if (waitpid(pid, &st, 0) != pid || !WIFEXITED(st) || WEXITSTATUS(st)) fail("the child failed", 0);
    for (size_t i = 0; i < n; i++) check(b[i], i, len[i]);
    int rss = argc > 3 && !strcmp(argv[3], "rss");
    long before = rss_kb();
    for (size_t i = 0; i < n; i++) free(b[i]);
    free(b);
    free(len);
    if (rss) {
        usleep(150000);
        void *p = malloc(SIZE);
        if (!p) fail("malloc after the frees", 0);
        memset(p, 1, SIZE);
        free(p);
        printf("ok usable=%zu rss_drop_kb=%ld\n", usable, before - rss_kb());
    } else {
        printf("ok usable=%zu\n", usable);
    }
    return 0;
}
