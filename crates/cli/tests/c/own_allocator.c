/* A program that brings its own allocator, exported from its executable (as rustc exports
 * jemalloc): its malloc, not zmem's, then serves the program, the C library and the loader.
 * The allocator takes its memory with mmap (so under zmem it lives in the map space and is
 * evicted like any data) and calls mmap and munmap while it holds its one lock, as jemalloc
 * does. zmem code that runs on a program thread (the interposed munmap, the signal route's
 * fault handler) or on zmem's own threads must then never reach this malloc: glibc's calloc
 * for a thread-local's destructor, opendir's malloc, std's System allocator all did, and the
 * thread waited for the lock that it, or a thread waiting for its fault, held
 * (docs/DESIGN-NOTES.md, "rustc").
 *
 * usage: own_allocator MIB ROUNDS; prints one checksum per worker and "ALL OK" (the same with
 * and without zmem). Each round starts fresh threads, so each new thread's first lock, first
 * fault and first thread-local happen while the others keep the allocator busy.
 *
 * Build with -fno-builtin (else the compiler turns calloc's malloc + memset into a call to
 * calloc) and -rdynamic (every allocator symbol exported). */
#define _GNU_SOURCE
#include <errno.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

/* ---- the allocator: size classes of 16 B .. 32 KiB from 1 MiB chunks, one mapping per
 * large or over-aligned block; every block has a 16-byte header before it. */

#define HDR 16
#define CLASSES 12 /* 16 << 11 = 32 KiB */
#define CHUNK (1 << 20)
#define PAGE 4096

struct hdr {
    size_t size;   /* the block's usable size */
    size_t mapped; /* 0: a size-class block; else the length of its own mapping */
};

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static void *free_list[CLASSES];
static char *chunk_at, *chunk_end;

static int class_of(size_t n) {
    int c = 0;
    while (((size_t)16 << c) < n) c++;
    return c;
}

static void *map(size_t len) {
    void *p = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    return p == MAP_FAILED ? NULL : p;
}

/* A block with its own mapping (so page-aligned): the header sits just below the block. */
static void *alloc_mapped(size_t n) {
    size_t len = (PAGE + n + PAGE - 1) & ~(size_t)(PAGE - 1);
    pthread_mutex_lock(&lock); /* mmap under the lock, as jemalloc does */
    char *m = map(len);
    pthread_mutex_unlock(&lock);
    if (!m) { errno = ENOMEM; return NULL; }
    char *p = m + PAGE;
    struct hdr *h = (struct hdr *)(p - HDR);
    h->size = n;
    h->mapped = len;
    return p;
}

void *malloc(size_t n) {
    if (n == 0) n = 1;
    if (n > ((size_t)16 << (CLASSES - 1))) return alloc_mapped(n);
    int c = class_of(n);
    size_t sz = (size_t)16 << c;
    pthread_mutex_lock(&lock);
    char *p = free_list[c];
    if (p) {
        free_list[c] = *(void **)p; /* reads the block: may fault under the lock */
    } else {
        if (!chunk_at || (size_t)(chunk_end - chunk_at) < sz + HDR) {
            chunk_at = map(CHUNK);
            if (!chunk_at) { pthread_mutex_unlock(&lock); errno = ENOMEM; return NULL; }
            chunk_end = chunk_at + CHUNK;
        }
        p = chunk_at + HDR;
        chunk_at += sz + HDR;
    }
    struct hdr *h = (struct hdr *)(p - HDR);
    h->size = sz;
    h->mapped = 0;
    pthread_mutex_unlock(&lock);
    return p;
}

void free(void *p) {
    if (!p) return;
    struct hdr *h = (struct hdr *)((char *)p - HDR);
    pthread_mutex_lock(&lock);
    if (h->mapped) {
        munmap((char *)p - PAGE, h->mapped); /* munmap under the lock */
    } else {
        int c = class_of(h->size);
        *(void **)p = free_list[c];
        free_list[c] = p;
    }
    pthread_mutex_unlock(&lock);
}

void *calloc(size_t k, size_t n) {
    if (n && k > SIZE_MAX / n) { errno = ENOMEM; return NULL; }
    void *p = malloc(k * n);
    if (p) memset(p, 0, k * n);
    return p;
}

size_t malloc_usable_size(void *p) {
    return p ? ((struct hdr *)((char *)p - HDR))->size : 0;
}

void *realloc(void *p, size_t n) {
    if (!p) return malloc(n);
    if (n == 0) { free(p); return NULL; }
    size_t have = malloc_usable_size(p);
    if (n <= have) return p;
    void *q = malloc(n);
    if (q) { memcpy(q, p, have); free(p); }
    return q;
}

void *memalign(size_t align, size_t n) {
    if (align <= 16) return malloc(n);
    if (align > PAGE || (align & (align - 1))) { errno = EINVAL; return NULL; }
    return alloc_mapped(n);
}

void *aligned_alloc(size_t align, size_t n) { return memalign(align, n); }
void *valloc(size_t n) { return memalign(PAGE, n); }
void *pvalloc(size_t n) { return memalign(PAGE, (n + PAGE - 1) & ~(size_t)(PAGE - 1)); }

int posix_memalign(void **out, size_t align, size_t n) {
    if (align < sizeof(void *) || (align & (align - 1))) return EINVAL;
    void *p = memalign(align, n);
    if (!p) return ENOMEM;
    *out = p;
    return 0;
}

/* ---- the work ---- */

struct node {
    struct node *next;
    uint64_t key;
    size_t len;
    unsigned char data[];
};

struct job {
    int id;
    size_t bytes;
    uint64_t sum;
};

static uint64_t next_rand(uint64_t *x) {
    *x ^= *x << 13; *x ^= *x >> 7; *x ^= *x << 17;
    return *x;
}

static void *work(void *arg) {
    struct job *j = arg;
    uint64_t x = 0x9E3779B97F4A7C15ull * (uint64_t)(j->id + 1);
    enum { BUCKETS = 1024 };
    struct node **table = calloc(BUCKETS, sizeof *table);
    size_t held = 0;
    uint64_t sum = 1469598103934665603ull;
    while (held < j->bytes) {
        uint64_t r = next_rand(&x);
        size_t len = 24 + r % 2000; /* small blocks: the size classes */
        struct node *n = malloc(sizeof *n + len);
        n->key = r;
        n->len = len;
        for (size_t i = 0; i < len; i++) n->data[i] = (unsigned char)('a' + (r >> (i % 48)) % 6);
        size_t b = r % BUCKETS;
        n->next = table[b];
        table[b] = n;
        held += len;
        if (r % 7 == 0 && table[(r >> 20) % BUCKETS]) { /* drop one: free lists */
            struct node **at = &table[(r >> 20) % BUCKETS];
            struct node *d = *at;
            *at = d->next;
            held -= d->len;
            sum = (sum ^ d->key) * 1099511628211ull;
            free(d);
        }
        if (r % 97 == 0) { /* a large block: its own mapping, munmap'd under the lock */
            size_t big = 64 * 1024 + r % (256 * 1024);
            unsigned char *p = malloc(big);
            for (size_t i = 0; i < big; i += 512) p[i] = (unsigned char)i;
            p = realloc(p, big * 2);
            sum = (sum ^ p[big / 2]) * 1099511628211ull;
            free(p);
        }
    }
    for (size_t b = 0; b < BUCKETS; b++) {
        for (struct node *n = table[b], *next; n; n = next) {
            next = n->next;
            for (size_t i = 0; i < n->len; i += 7) sum = (sum ^ n->data[i]) * 1099511628211ull;
            free(n);
        }
    }
    free(table);
    j->sum = sum;
    return NULL;
}

int main(int argc, char **argv) {
    size_t mib = argc > 1 ? strtoul(argv[1], NULL, 10) : 16;
    int rounds = argc > 2 ? atoi(argv[2]) : 3;
    enum { THREADS = 4 };
    for (int round = 0; round < rounds; round++) {
        pthread_t t[THREADS];
        struct job jobs[THREADS];
        for (int i = 0; i < THREADS; i++) {
            jobs[i] = (struct job){.id = round * THREADS + i, .bytes = (mib << 20) / THREADS};
            if (pthread_create(&t[i], NULL, work, &jobs[i]) != 0) { perror("pthread_create"); return 2; }
        }
        for (int i = 0; i < THREADS; i++) pthread_join(t[i], NULL);
        for (int i = 0; i < THREADS; i++) printf("round %d worker %d: %016llx\n", round, i, (unsigned long long)jobs[i].sum);
    }
    printf("ALL OK\n");
    return 0;
}
