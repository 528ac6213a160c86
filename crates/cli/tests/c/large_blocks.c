/* large_blocks: grows two buffers by realloc, as programs that read input of unknown size or
 * append to a list do (CPython's list, jq's strings, a file slurped in chunks): buffer A
 * doubles to MIB megabytes, buffer B grows by 1.25x steps to MIB/2, their growths interleaved,
 * every byte written once and checked after every realloc (a sample) and at the end (all).
 * Then A shrinks to a quarter and grows back, and both are freed. Then three rounds of calloc
 * of MIB megabytes (memory just freed, with old data in it): every byte must be zero, and a
 * quarter of the block is written before it is freed again. Exits 1 with a message on any mismatch; prints "ok ..." on
 * success.
 *
 * Usage: large_blocks MIB */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static inline unsigned char expect(int buf, size_t i) {
    uint64_t x = (uint64_t)i / 8 * 0x9e3779b97f4a7c15ull + (uint64_t)buf * 77;
    /* Half of each page compressible text, half numbers: some pages stay resident, some go. */
    if ((i >> 11) & 1) return (unsigned char)("grow the buffer, keep every byte "[i % 33]);
    return (unsigned char)(x >> (8 * (i % 8)));
}

struct buf {
    int id;
    unsigned char *p;
    size_t len, cap;
};

static void check_range(struct buf *b, size_t from, size_t to, const char *when) {
    for (size_t i = from; i < to; i++) {
        if (b->p[i] != expect(b->id, i)) {
            fprintf(stderr, "large_blocks: MISMATCH in buffer %d at byte %zu of %zu (%s): got 0x%02x want 0x%02x\n",
                    b->id, i, b->len, when, b->p[i], expect(b->id, i));
            exit(1);
        }
    }
}

static void grow(struct buf *b, size_t cap) {
    unsigned char *q = realloc(b->p, cap);
    if (!q) {
        fprintf(stderr, "large_blocks: realloc to %zu failed\n", cap);
        exit(1);
    }
    b->p = q;
    b->cap = cap;
    /* A sample of what was kept: first and last pages, and every 61st page. */
    size_t pages = b->len / 4096;
    for (size_t pg = 0; pg < pages; pg++)
        if (pg < 2 || pg + 2 >= pages || pg % 61 == 0)
            check_range(b, pg * 4096, (pg + 1) * 4096, "after realloc");
}

static void append(struct buf *b, size_t n) {
    for (size_t i = b->len; i < b->len + n; i++) b->p[i] = expect(b->id, i);
    b->len += n;
}

int main(int argc, char **argv) {
    if (argc != 2) {
        fprintf(stderr, "usage: %s MIB\n", argv[0]);
        return 2;
    }
    size_t total = (size_t)atol(argv[1]) << 20;
    struct buf a = {1, NULL, 0, 0}, b = {2, NULL, 0, 0};
    grow(&a, 1 << 12);
    grow(&b, 1 << 12);
    size_t reallocs = 0;
    while (a.len < total || b.len < total / 2) {
        if (a.len < total) {
            if (a.len + 4096 > a.cap) { grow(&a, a.cap * 2); reallocs++; }
            append(&a, 4096);
        }
        if (b.len < total / 2) {
            if (b.len + 4096 > b.cap) { grow(&b, b.cap + b.cap / 4 + 4096); reallocs++; }
            append(&b, 4096);
        }
    }
    check_range(&a, 0, a.len, "at the end");
    check_range(&b, 0, b.len, "at the end");
    /* Shrink to a quarter, grow back: the kept quarter survives, the rest is written again. */
    a.len /= 4;
    grow(&a, a.len);
    grow(&a, total);
    append(&a, total - a.len);
    check_range(&a, 0, a.len, "after shrinking and growing");
    free(a.p);
    free(b.p);
    for (int round = 0; round < 3; round++) {
        unsigned char *z = calloc(total, 1);
        if (!z) {
            fprintf(stderr, "large_blocks: calloc of %zu failed\n", total);
            exit(1);
        }
        for (size_t i = 0; i < total; i++) {
            if (z[i]) {
                fprintf(stderr, "large_blocks: MISMATCH calloc round %d byte %zu is 0x%02x\n", round, i, z[i]);
                exit(1);
            }
        }
        /* A quarter written: the next round's block holds old data there. */
        struct buf c = {3 + round, z, 0, total};
        append(&c, total / 4);
        check_range(&c, 0, total / 4, "calloc'd block");
        free(z);
    }
    printf("ok %zu reallocs, %zu MiB\n", reallocs, total >> 20);
    return 0;
}
