/* Code running on stacks in the evicted heap (zmem run --fault-route signal): a fault there
 * raises SIGBUS, whose frame the kernel cannot write on a stack page that is evicted itself;
 * zmem's alternate signal stack takes it. Each stack is evicted (24 MiB of other data touched
 * in a 4M budget) before it is used again.
 *
 * usage: heap_stacks MODE; prints "MODE: ok" or what went wrong.
 * 0 coroutines: four ucontext coroutines on malloc'd stacks, recursing 64 KiB deep and
 *   reading the evicted heap, switched to after each eviction; their stack data intact
 * 1 clone: a child process (clone without CLONE_VM) on a malloc'd stack, evicted first
 * 2 the program's own small alternate stack: sigaltstack reports it, its SA_ONSTACK handler
 *   runs (on an alternate stack), and faults are not served on it (its bytes untouched)
 * 3 a thread on zmem's alternate stack made by pthread_create: the same as 0 on a thread
 * 4 threads on malloc'd stacks (pthread_attr_setstack; glibc keeps the thread's block, its
 *   static thread-locals and rseq area at the top of that stack): each recurses on it, waits
 *   while the heap is evicted (blocked in a futex), checks its frames, and is joined; the same
 *   stacks serve three rounds of threads, then are freed */
#define _GNU_SOURCE
#include <errno.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <ucontext.h>
#include <unistd.h>

#include "evicting.h"

static unsigned char *heap;
#define HEAP (8 << 20)
static unsigned sum_heap(void) {
    unsigned s = 0;
    for (size_t i = 0; i < HEAP; i += 4096) s += heap[i];
    return s;
}

/* ---------------------------------------------------------------- coroutines */

#define COROS 4
#define STACK (256 << 10)
static ucontext_t main_ctx, coro_ctx[COROS];
static int coro_bad[COROS];

/* Recurses `depth` frames of 1 KiB each, yielding to main at the bottom, then checks every
 * frame's bytes on the way back up. */
static void dive(int id, int depth) {
    volatile unsigned char frame[1024];
    for (int i = 0; i < 1024; i++) frame[i] = (unsigned char)(id * 7 + depth + i);
    if (depth > 0) {
        dive(id, depth - 1);
    } else {
        swapcontext(&coro_ctx[id], &main_ctx);
        if (sum_heap() == 0) coro_bad[id]++;
        swapcontext(&coro_ctx[id], &main_ctx);
    }
    for (int i = 0; i < 1024; i++)
        if (frame[i] != (unsigned char)(id * 7 + depth + i)) { coro_bad[id]++; break; }
}

static void coro_main(int id) { dive(id, 64); }

static void coroutines(void) {
    unsigned want = sum_heap();
    for (int c = 0; c < COROS; c++) {
        getcontext(&coro_ctx[c]);
        coro_ctx[c].uc_stack.ss_sp = malloc(STACK);
        coro_ctx[c].uc_stack.ss_size = STACK;
        coro_ctx[c].uc_link = &main_ctx;
        makecontext(&coro_ctx[c], (void (*)(void))coro_main, 1, c);
    }
    for (int round = 0; round < 3; round++)
        for (int c = 0; c < COROS; c++) {
            evict();
            swapcontext(&main_ctx, &coro_ctx[c]);
        }
    for (int c = 0; c < COROS; c++) CHECK(coro_bad[c] == 0, "coroutine %d: %d frames wrong", c, coro_bad[c]);
    CHECK(sum_heap() == want, "the heap reads back");
}

/* ---------------------------------------------------------------- clone */

static int child_fn(void *arg) {
    (void)arg;
    volatile unsigned char frame[32 << 10];
    for (size_t i = 0; i < sizeof frame; i++) frame[i] = (unsigned char)i;
    evict();
    for (size_t i = 0; i < sizeof frame; i++)
        if (frame[i] != (unsigned char)i) return 3;
    return sum_heap() == 0 ? 4 : 0;
}

static void cloned(void) {
    char *stack = malloc(1 << 20);
    memset(stack, 0, 1 << 20);
    evict();
    int st = 0;
    pid_t c = clone(child_fn, stack + (1 << 20), SIGCHLD, NULL);
    CHECK(c > 0, "clone");
    CHECK(waitpid(c, &st, 0) == c && WIFEXITED(st) && WEXITSTATUS(st) == 0, "the cloned child: status %d", st);
}

/* ---------------------------------------------------------------- the program's own stack */

static unsigned char *small;
#define SMALL (16 << 10)
static volatile int handled, onstack;
static void usr(int s) {
    (void)s;
    stack_t o;
    handled = 1;
    onstack = sigaltstack(NULL, &o) == 0 && (o.ss_flags & SS_ONSTACK);
}

static void own_stack(void) {
    /* A guard page below, as Rust's threads have. */
    unsigned char *m = mmap(NULL, SMALL + 4096, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    mprotect(m, 4096, PROT_NONE);
    small = m + 4096;
    memset(small, 0xab, SMALL);
    stack_t ss = {.ss_sp = small, .ss_size = SMALL, .ss_flags = 0}, o;
    CHECK(sigaltstack(&ss, NULL) == 0, "sigaltstack");
    CHECK(sigaltstack(NULL, &o) == 0 && o.ss_sp == small && o.ss_size == SMALL && !(o.ss_flags & (SS_DISABLE | SS_ONSTACK)),
          "sigaltstack reports the program's stack: %p %zu %d", o.ss_sp, o.ss_size, o.ss_flags);
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = usr;
    sa.sa_flags = SA_ONSTACK;
    sigaction(SIGUSR1, &sa, NULL);
    raise(SIGUSR1);
    CHECK(handled && onstack, "the SA_ONSTACK handler ran on an alternate stack: %d %d", handled, onstack);
    /* Faults are served, and not on the program's small stack. */
    memset(small, 0xab, SMALL);
    unsigned want = sum_heap();
    for (int round = 0; round < 3; round++) {
        evict();
        CHECK(sum_heap() == want, "round %d: the heap reads back", round);
    }
    size_t touched = 0;
    for (size_t i = 0; i < SMALL; i++) touched += small[i] != 0xab;
    CHECK(touched == 0, "%zu bytes of the program's 16 KiB stack were written", touched);
    ss.ss_flags = SS_DISABLE;
    CHECK(sigaltstack(&ss, NULL) == 0 && sigaltstack(NULL, &o) == 0 && (o.ss_flags & SS_DISABLE), "disabled: %d", o.ss_flags);
    CHECK(sum_heap() == want, "the heap reads back after");
}

static void *on_thread(void *arg) {
    (void)arg;
    coroutines();
    return NULL;
}

/* ---------------------------------------------------------------- threads on heap stacks */

#define STACKED 4
static pthread_barrier_t deep, evicted;
static __thread int tls_id;

static void stacked_dive(int id, int depth) {
    volatile unsigned char frame[1024];
    for (int i = 0; i < 1024; i++) frame[i] = (unsigned char)(id * 5 + depth + i);
    if (depth > 0) {
        stacked_dive(id, depth - 1);
    } else {
        pthread_barrier_wait(&deep);
        pthread_barrier_wait(&evicted);
        if (sum_heap() == 0) coro_bad[id]++;
    }
    for (int i = 0; i < 1024; i++)
        if (frame[i] != (unsigned char)(id * 5 + depth + i)) { coro_bad[id]++; break; }
}

static void *stacked_main(void *arg) {
    tls_id = (int)(long)arg;
    stacked_dive(tls_id, 48);
    if (tls_id != (int)(long)arg) coro_bad[tls_id]++;
    return arg;
}

static void stacked_threads(void) {
    unsigned want = sum_heap();
    void *stacks[STACKED];
    for (int t = 0; t < STACKED; t++) stacks[t] = malloc(STACK);
    pthread_barrier_init(&deep, NULL, STACKED + 1);
    pthread_barrier_init(&evicted, NULL, STACKED + 1);
    for (int round = 0; round < 3; round++) {
        pthread_t th[STACKED];
        for (int t = 0; t < STACKED; t++) {
            pthread_attr_t a;
            pthread_attr_init(&a);
            pthread_attr_setstack(&a, stacks[t], STACK);
            CHECK(pthread_create(&th[t], &a, stacked_main, (void *)(long)t) == 0, "pthread_create");
            pthread_attr_destroy(&a);
        }
        pthread_barrier_wait(&deep);
        evict();
        pthread_barrier_wait(&evicted);
        for (int t = 0; t < STACKED; t++) {
            void *r = NULL;
            CHECK(pthread_join(th[t], &r) == 0 && r == (void *)(long)t, "join %d", t);
        }
        evict();
    }
    for (int t = 0; t < STACKED; t++) {
        CHECK(coro_bad[t] == 0, "thread %d: %d frames wrong", t, coro_bad[t]);
        free(stacks[t]);
    }
    CHECK(sum_heap() == want, "the heap reads back");
}

int main(int argc, char **argv) {
    int mode = argc > 1 ? atoi(argv[1]) : 0;
    static const char *names[] = {"coroutines", "clone", "own stack", "thread", "stacked threads"};
    if (mode < 0 || mode > 4) return 2;
    heap = malloc(HEAP);
    for (size_t i = 0; i < HEAP; i++) heap[i] = (unsigned char)(i * 13 + 1);
    switch (mode) {
    case 0: coroutines(); break;
    case 1: cloned(); break;
    case 2: own_stack(); break;
    case 3: { pthread_t t; pthread_create(&t, NULL, on_thread, NULL); pthread_join(t, NULL); break; }
    case 4: stacked_threads(); break;
    }
    printf("%s: %s\n", names[mode], bad ? "FAILED" : "ok");
    return bad != 0;
}
