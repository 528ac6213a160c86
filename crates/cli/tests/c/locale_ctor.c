// A library constructor that makes a locale object before zmem has started (libp11-kit does
// this in gdb's process): glibc's newlocale holds its locale lock while it calls malloc, so
// zmem starts inside that malloc, with the lock held by the starting thread. zmem's start must
// not take that lock itself (glibc's rwlock gives the owner EDEADLK, which glibc's own callers
// ignore: the lock was then released by the wrong caller and the program's next setlocale
// waited forever). Then the program sets its locale, makes and frees locale objects and
// starts threads while its data passes through a small budget.
//
// Built twice: with -DLOCALE_LIB -shared -fPIC as liblocale_ctor.so, and as the program,
// linked with it.
#include <errno.h>
#include <locale.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifdef LOCALE_LIB
locale_t lib_locale;

__attribute__((constructor)) static void make_locale(void) {
    lib_locale = newlocale(LC_ALL_MASK, "C.UTF-8", (locale_t)0);
}
#else
extern locale_t lib_locale;

static void *worker(void *arg) {
    long id = (long)arg;
    unsigned long sum = 0;
    for (int i = 0; i < 200; i++) {
        locale_t l = newlocale(LC_CTYPE_MASK | LC_COLLATE_MASK, "C.UTF-8", (locale_t)0);
        if (!l) {
            fprintf(stderr, "newlocale failed in thread %ld: %s\n", id, strerror(errno));
            exit(2);
        }
        char a[32], b[32];
        snprintf(a, sizeof a, "k%ld-%d", id, i);
        snprintf(b, sizeof b, "k%ld-%d", id, i + 1);
        sum += strcoll_l(a, b, l) < 0;
        freelocale(l);
    }
    return (void *)sum;
}

int main(int argc, char **argv) {
    size_t mib = argc > 1 ? strtoul(argv[1], 0, 10) : 16;
    if (!lib_locale) {
        printf("the library's constructor made no locale (is C.UTF-8 installed?)\n");
        return 1;
    }
    if (!setlocale(LC_ALL, "C.UTF-8") || !setlocale(LC_MESSAGES, "")) {
        printf("setlocale failed\n");
        return 1;
    }
    // Data through the budget, so that the locale data malloc'd above may be evicted.
    size_t n = mib << 20;
    unsigned char *big = malloc(n);
    for (size_t i = 0; i < n; i++) big[i] = (unsigned char)(i * 2654435761u >> 13);
    for (int round = 0; round < 3; round++) {
        pthread_t t[4];
        for (long k = 0; k < 4; k++) pthread_create(&t[k], 0, worker, (void *)k);
        unsigned long ok = 0;
        for (int k = 0; k < 4; k++) {
            void *r;
            pthread_join(t[k], &r);
            ok += (unsigned long)r;
        }
        if (!setlocale(LC_COLLATE, round % 2 ? "C" : "C.UTF-8")) {
            printf("setlocale in round %d failed\n", round);
            return 1;
        }
        unsigned long sum = 0;
        for (size_t i = 0; i < n; i += 4096) sum += big[i];
        printf("round %d: %lu comparisons in order, sum %lu, %s\n", round, ok, sum,
               strerror(ENOENT));
    }
    free(big);
    freelocale(lib_locale);
    printf("ALL OK\n");
    return 0;
}
#endif
