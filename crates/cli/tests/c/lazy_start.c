/* lazy_start MODE: a process the run's program execs, for the late start (lazy.rs).
 *   small:  a few small blocks, freed: stays below any start point.
 *   big:    32 MiB of malloc'd blocks, filled, evicted, checked.
 *   thread: small heap, then a thread that fills and checks 8 MiB (zmem starts before it).
 *   map:    a 32 MiB private anonymous mapping, filled, evicted, checked.
 *   mixed:  2 MiB of small blocks before the start point, 32 MiB after, every block checked,
 *           then freed and realloc'd across the start (glibc's blocks stay glibc's).
 * Prints "<mode> pid <pid>: ok"; exits 1 on any mismatch. */
#include <pthread.h>
#include <stdint.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>
#include "evicting.h"

static int check(unsigned char *p, size_t n, unsigned seed) {
    for (size_t i = 0; i < n; i++)
        if (p[i] != (unsigned char)(i * seed + i / 4096)) { CHECK(0, "mismatch at %zu", i); return 0; }
    return 1;
}
static void fill(unsigned char *p, size_t n, unsigned seed) {
    for (size_t i = 0; i < n; i++) p[i] = (unsigned char)(i * seed + i / 4096);
}

static void *worker(void *a) {
    size_t n = 8 << 20;
    unsigned char *p = malloc(n);
    CHECK(p != NULL, "malloc");
    if (p) { fill(p, n, 5); evict(); check(p, n, 5); free(p); }
    return a;
}

int main(int argc, char **argv) {
    const char *mode = argc > 1 ? argv[1] : "small";
    if (!strcmp(mode, "small")) {
        for (int i = 0; i < 16; i++) free(malloc(1000 + i));
    } else if (!strcmp(mode, "big")) {
        size_t n = 32 << 20;
        unsigned char *p = malloc(n);
        CHECK(p != NULL, "malloc");
        if (p) { fill(p, n, 3); evict(); check(p, n, 3); free(p); }
    } else if (!strcmp(mode, "thread")) {
        pthread_t t;
        CHECK(pthread_create(&t, NULL, worker, NULL) == 0, "pthread_create");
        pthread_join(t, NULL);
    } else if (!strcmp(mode, "map")) {
        size_t n = 32 << 20;
        unsigned char *p = mmap(NULL, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        CHECK(p != MAP_FAILED, "mmap");
        if (p != MAP_FAILED) { fill(p, n, 7); evict(); check(p, n, 7); munmap(p, n); }
    } else if (!strcmp(mode, "mixed")) {
        enum { SMALL = 512, BIG = 64 };
        static unsigned char *small[SMALL], *big[BIG];
        for (int i = 0; i < SMALL; i++) { small[i] = malloc(4096); fill(small[i], 4096, i + 1); }
        for (int i = 0; i < BIG; i++) { big[i] = malloc(512 << 10); fill(big[i], 512 << 10, i + 2); }
        evict();
        for (int i = 0; i < SMALL; i++) check(small[i], 4096, i + 1);
        for (int i = 0; i < BIG; i++) check(big[i], 512 << 10, i + 2);
        for (int i = 0; i < SMALL; i += 2) {
            small[i] = realloc(small[i], 64 << 10);
            CHECK(small[i] != NULL, "realloc");
            if (small[i]) check(small[i], 4096, i + 1);
        }
        for (int i = 0; i < SMALL; i++) free(small[i]);
        for (int i = 0; i < BIG; i++) free(big[i]);
    } else {
        printf("unknown mode %s\n", mode);
        return 2;
    }
    if (bad) return 1;
    printf("%s pid %d: ok\n", mode, (int)getpid());
    return 0;
}
