/* zmem's own memory stays in one glibc arena (zmem's internal heap; the program's mallocs go to
 * mimalloc in the region). Six threads each fill 2 MiB of the heap, the heap is evicted, and
 * each thread reads its buffer back: on the signal route every one of them serves its faults
 * itself and allocates zmem's per-thread state. Then glibc's malloc_stats() lists the internal
 * heap's arenas on stderr ("Arena N:"), which the test counts. */
#include <malloc.h>
#include <pthread.h>
#include <stdint.h>
#include "evicting.h"

#define THREADS 6
#define BYTES (2 << 20)

static pthread_barrier_t filled, evicted;

static void *worker(void *arg) {
    uintptr_t id = (uintptr_t)arg;
    unsigned char *buf = malloc(BYTES);
    CHECK(buf != NULL, "malloc");
    for (size_t i = 0; i < BYTES; i++) buf[i] = (unsigned char)((i / 64) * 7 + id);
    pthread_barrier_wait(&filled);
    pthread_barrier_wait(&evicted);
    for (size_t i = 0; i < BYTES; i++)
        if (buf[i] != (unsigned char)((i / 64) * 7 + id)) {
            CHECK(0, "thread %lu: byte %zu changed", (unsigned long)id, i);
            break;
        }
    free(buf);
    return NULL;
}

int main(void) {
    pthread_t t[THREADS];
    pthread_barrier_init(&filled, NULL, THREADS + 1);
    pthread_barrier_init(&evicted, NULL, THREADS + 1);
    for (uintptr_t i = 0; i < THREADS; i++) CHECK(pthread_create(&t[i], NULL, worker, (void *)i) == 0, "pthread_create");
    pthread_barrier_wait(&filled);
    evict();
    pthread_barrier_wait(&evicted);
    for (int i = 0; i < THREADS; i++) pthread_join(t[i], NULL);
    malloc_stats();
    if (bad) return 1;
    printf("own memory: ok\n");
    return 0;
}
