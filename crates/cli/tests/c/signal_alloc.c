/* signal_alloc: a signal handler that allocates, resizes and frees mid-size blocks (undefined
 * in C, done in practice) while the interrupted thread does the same: a signal that lands
 * while the thread holds the exact-fit allocator's lock must not wait for that lock. A timer
 * fires every 100 us; the main loop allocates, fills, resizes and frees blocks of 1.5-5 KB and
 * checks them. Prints "ok handled=H" (H: handler runs that allocated) or exits 1.
 *
 * Usage: signal_alloc ITERATIONS */
#define _GNU_SOURCE
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/time.h>

static volatile sig_atomic_t handled, bad;
static void *volatile kept; /* a block the handler keeps from one run to the next */

static void on_alarm(int sig) {
    (void)sig;
    unsigned char *p = malloc(2000 + handled % 1000);
    if (!p) { bad = 1; return; }
    memset(p, 0x5a, 2000);
    p = realloc(p, 6000);
    if (!p || p[1999] != 0x5a) { bad = 1; return; }
    free(kept);
    kept = p;
    handled++;
}

int main(int argc, char **argv) {
    long n = argc > 1 ? atol(argv[1]) : 300000;
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_alarm;
    sa.sa_flags = SA_RESTART;
    sigaction(SIGALRM, &sa, NULL);
    struct itimerval it = {{0, 100}, {0, 100}};
    setitimer(ITIMER_REAL, &it, NULL);
    for (long i = 0; i < n; i++) {
        size_t size = 1500 + (size_t)(i % 3500);
        unsigned char *p = malloc(size);
        if (!p) { fprintf(stderr, "malloc failed\n"); return 1; }
        memset(p, (int)(i & 0xff), size);
        unsigned char *q = realloc(p, size + 1500);
        if (!q || q[size - 1] != (unsigned char)(i & 0xff)) { fprintf(stderr, "realloc lost data\n"); return 1; }
        free(q);
    }
    struct itimerval off = {{0, 0}, {0, 0}};
    setitimer(ITIMER_REAL, &off, NULL);
    free(kept);
    if (bad) { fprintf(stderr, "the handler's block was wrong\n"); return 1; }
    printf("ok handled=%d\n", (int)handled);
    return 0;
}
