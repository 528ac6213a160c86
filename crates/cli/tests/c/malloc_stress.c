/* malloc_stress: several threads allocate, resize and free blocks of random sizes through every
 * entry point of the C allocator (malloc, calloc, realloc, free, posix_memalign, aligned_alloc,
 * memalign, valloc, reallocarray) and check each block's contents, which depend only on
 * (seed, block id, offset), before every realloc and free and at the end. Blocks also move
 * between threads (freed by a thread that did not allocate them). Exits 1 with a message on
 * the first mismatch; prints "ok ..." with the peak of live bytes on success.
 *
 * Usage: malloc_stress THREADS OPS_PER_THREAD SLOTS_PER_THREAD SEED */
#define _GNU_SOURCE
#include <malloc.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static const char TEXT[] =
    "It was the best of times, it was the worst of times, it was the age of wisdom, it was "
    "the age of foolishness, it was the epoch of belief, it was the epoch of incredulity, it "
    "was the season of Light, it was the season of Darkness, it was the spring of hope, it "
    "was the winter of despair. ";
#define TEXT_LEN (sizeof(TEXT) - 1)

static uint64_t seed;
static atomic_ullong live_bytes, peak_bytes, checked_bytes, next_id;

typedef struct {
    unsigned char *p;
    size_t size;
    size_t align; /* 0: no alignment promised beyond malloc's */
    uint64_t id;
} block;

/* The byte at offset i of block id: text (compresses somewhat), with the block id and the
 * offset stamped every 512 bytes so that no two blocks or pages are alike. */
static inline unsigned char expect(uint64_t id, size_t i) {
    size_t r = i & 511;
    if (r < 16) {
        uint64_t v = r < 8 ? (id ^ seed) : (uint64_t)(i >> 9);
        return (unsigned char)(v >> (8 * (r & 7)));
    }
    return (unsigned char)TEXT[(i + id * 31) % TEXT_LEN];
}

static void fill(unsigned char *p, uint64_t id, size_t from, size_t to) {
    for (size_t i = from; i < to; i++) p[i] = expect(id, i);
}

static void die(const char *what, const block *b, size_t off, int got, int want) {
    char msg[256];
    int n = snprintf(msg, sizeof msg,
                     "malloc_stress: MISMATCH %s: block id %llu size %zu at %p offset %zu: "
                     "got 0x%02x want 0x%02x\n",
                     what, (unsigned long long)b->id, b->size, (void *)b->p, off, got, want);
    if (write(2, msg, n) < 0) {}
    _exit(1);
}

static void fail(const char *msg) {
    fprintf(stderr, "malloc_stress: %s\n", msg);
    _exit(1);
}

static void check(const char *what, const block *b, size_t upto) {
    for (size_t i = 0; i < upto; i++) {
        unsigned char w = expect(b->id, i);
        if (b->p[i] != w) die(what, b, i, b->p[i], w);
    }
    atomic_fetch_add(&checked_bytes, upto);
}

static void account(long long delta) {
    unsigned long long now = atomic_fetch_add(&live_bytes, delta) + delta;
    unsigned long long peak = atomic_load(&peak_bytes);
    while (now > peak && !atomic_compare_exchange_weak(&peak_bytes, &peak, now)) {}
}

static inline uint64_t rnd(uint64_t *s) {
    uint64_t x = *s;
    x ^= x >> 12;
    x ^= x << 25;
    x ^= x >> 27;
    *s = x;
    return x * 0x2545F4914F6CDD1DULL;
}

/* Mostly small, some medium, a few of 256 KiB .. 4 MiB. */
static size_t pick_size(uint64_t *s) {
    unsigned r = rnd(s) % 100;
    if (r < 55) return 1 + rnd(s) % 512;
    if (r < 85) return 512 + rnd(s) % (16 << 10);
    if (r < 97) return (16 << 10) + rnd(s) % (240 << 10);
    return (256 << 10) + rnd(s) % ((4 << 20) - (256 << 10));
}

static void check_usable(const block *b) {
    if (malloc_usable_size(b->p) < b->size) fail("malloc_usable_size is below the requested size");
    if (b->align && ((uintptr_t)b->p % b->align) != 0) fail("alignment not honoured");
    if ((uintptr_t)b->p % 16 != 0 && b->size >= 16) fail("malloc result not 16-byte aligned");
}

static void allocate(block *b, uint64_t *s) {
    size_t n = pick_size(s);
    b->id = atomic_fetch_add(&next_id, 1);
    b->size = n;
    b->align = 0;
    size_t align = (size_t)1 << (4 + rnd(s) % 9); /* 16 .. 4096 */
    switch (rnd(s) % 8) {
    case 0:
    case 1:
    case 2:
        b->p = malloc(n);
        break;
    case 3: {
        b->p = calloc(1, n);
        if (!b->p) fail("calloc returned NULL");
        for (size_t i = 0; i < n; i++)
            if (b->p[i] != 0) fail("calloc memory is not zero");
        break;
    }
    case 4: {
        void *p = NULL;
        int e = posix_memalign(&p, align, n);
        if (e != 0) fail("posix_memalign failed");
        b->p = p;
        b->align = align;
        break;
    }
    case 5:
        b->p = aligned_alloc(align, (n + align - 1) / align * align);
        b->align = align;
        break;
    case 6:
        b->p = memalign(align, n);
        b->align = align;
        break;
    default:
        if (rnd(s) % 4 == 0) {
            b->p = valloc(n);
            b->align = 4096;
        } else {
            b->p = reallocarray(NULL, n, 1);
        }
        break;
    }
    if (!b->p) fail("an allocation returned NULL");
    check_usable(b);
    fill(b->p, b->id, 0, n);
    account((long long)n);
}

static void release(block *b) {
    check("before free", b, b->size);
    free(b->p);
    account(-(long long)b->size);
    b->p = NULL;
}

static void resize(block *b, uint64_t *s) {
    check("before realloc", b, b->size);
    size_t n = rnd(s) % 3 == 0 ? 1 + b->size / 2 : pick_size(s);
    unsigned char *q = realloc(b->p, n);
    if (!q) fail("realloc returned NULL");
    size_t keep = n < b->size ? n : b->size;
    b->p = q;
    b->align = 0;
    size_t old = b->size;
    b->size = n;
    check("prefix after realloc", b, keep);
    check_usable(b);
    fill(b->p, b->id, keep, n);
    account((long long)n - (long long)old);
}

/* Blocks handed between threads. */
#define EXCHANGE 64
static pthread_mutex_t ex_lock = PTHREAD_MUTEX_INITIALIZER;
static block exchange[EXCHANGE];
static int ex_count;

static int give(block *b) {
    int ok = 0;
    pthread_mutex_lock(&ex_lock);
    if (ex_count < EXCHANGE) {
        exchange[ex_count++] = *b;
        ok = 1;
    }
    pthread_mutex_unlock(&ex_lock);
    if (ok) b->p = NULL;
    return ok;
}

static int take(block *b) {
    int ok = 0;
    pthread_mutex_lock(&ex_lock);
    if (ex_count > 0) {
        *b = exchange[--ex_count];
        ok = 1;
    }
    pthread_mutex_unlock(&ex_lock);
    return ok;
}

static long ops, slots;

static void *worker(void *arg) {
    uint64_t s = seed * 0x9E3779B97F4A7C15ULL + (uintptr_t)arg * 7919 + 1;
    block *t = calloc(slots, sizeof(block));
    if (!t) fail("calloc of the table failed");
    /* Fill every slot first, so that the live data reaches its peak early. */
    for (long i = 0; i < slots; i++) allocate(&t[i], &s);
    for (long k = 0; k < ops; k++) {
        block *b = &t[rnd(&s) % slots];
        unsigned r = rnd(&s) % 100;
        if (!b->p) {
            if (r < 10 && take(b)) {
                check("after a hand-over", b, b->size);
                continue;
            }
            allocate(b, &s);
        } else if (r < 30) {
            release(b);
        } else if (r < 60) {
            resize(b, &s);
        } else if (r < 65) {
            check("before a hand-over", b, b->size);
            if (!give(b)) release(b);
        } else {
            check("spot check", b, b->size);
        }
    }
    for (long i = 0; i < slots; i++)
        if (t[i].p) release(&t[i]);
    free(t);
    return NULL;
}

int main(int argc, char **argv) {
    if (argc != 5) {
        fprintf(stderr, "usage: %s THREADS OPS SLOTS SEED\n", argv[0]);
        return 2;
    }
    int threads = atoi(argv[1]);
    ops = atol(argv[2]);
    slots = atol(argv[3]);
    seed = strtoull(argv[4], NULL, 10);
    pthread_t th[64];
    if (threads < 1 || threads > 64) fail("1..64 threads");
    for (int i = 0; i < threads; i++)
        if (pthread_create(&th[i], NULL, worker, (void *)(uintptr_t)i) != 0)
            fail("pthread_create failed");
    for (int i = 0; i < threads; i++) pthread_join(th[i], NULL);
    block b;
    while (take(&b)) release(&b);
    if (atomic_load(&live_bytes) != 0) fail("live byte count is not zero at the end");
    printf("ok peak_live=%llu checked=%llu blocks=%llu\n",
           (unsigned long long)atomic_load(&peak_bytes),
           (unsigned long long)atomic_load(&checked_bytes),
           (unsigned long long)atomic_load(&next_id));
    return 0;
}
