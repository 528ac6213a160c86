/* main_thread_exits: the main thread ends with pthread_exit and leaves two workers (one
 * detached) to fill, check and evict heap memory; the last one to end must end the process
 * with status 0, running the atexit handlers, after its own thread-specific destructors (as
 * glibc does when its last thread ends). One worker first forks; the child's only thread (not
 * its main thread) starts a thread, joins it and returns from its start routine: the child
 * must end with status 0 too. Prints "main_thread_exits: ok" from the atexit handler when
 * every check passed; _exit(1) there otherwise. */
#include <pthread.h>
#include <stdatomic.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>
#include "evicting.h"

static pthread_key_t key;
static atomic_int destructors;
static atomic_int workers_done;

static void destructor(void *v) { (void)v; atomic_fetch_add(&destructors, 1); }

static void fill_and_check(unsigned seed) {
    size_t n = 8 << 20;
    unsigned char *p = malloc(n);
    CHECK(p != NULL, "malloc");
    if (!p) return;
    for (size_t i = 0; i < n; i++) p[i] = (unsigned char)(i * seed + i / 4096);
    evict();
    for (size_t i = 0; i < n; i++)
        if (p[i] != (unsigned char)(i * seed + i / 4096)) { CHECK(0, "mismatch at %zu", i); break; }
    free(p);
}

static void *child_helper(void *a) { fill_and_check(5); return a; }

static void *forking_worker(void *a) {
    pthread_setspecific(key, (void *)1);
    fflush(stdout);
    pid_t c = fork();
    if (c == 0) {
        /* The child: this thread is its only one, and not its main thread. */
        pthread_t t;
        CHECK(pthread_create(&t, NULL, child_helper, NULL) == 0, "child pthread_create");
        pthread_join(t, NULL);
        return NULL; /* the child must end here, with status 0 */
    }
    int st = -1;
    CHECK(c > 0 && waitpid(c, &st, 0) == c, "waitpid");
    CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 0, "child status %#x", st);
    fill_and_check(3);
    atomic_fetch_add(&workers_done, 1);
    return a;
}

static void *detached_worker(void *a) {
    pthread_setspecific(key, (void *)1);
    fill_and_check(7);
    usleep(100 * 1000); /* outlives the other worker, most runs */
    atomic_fetch_add(&workers_done, 1);
    return a;
}

static pid_t parent;

static void at_exit(void) {
    if (getpid() != parent) return; /* the forked child's exit */
    CHECK(atomic_load(&workers_done) == 2, "workers done: %d", atomic_load(&workers_done));
    CHECK(atomic_load(&destructors) == 2, "destructors run: %d", atomic_load(&destructors));
    if (bad) { fflush(stdout); _exit(1); }
    printf("main_thread_exits: ok\n");
    fflush(stdout);
}

int main(void) {
    parent = getpid();
    atexit(at_exit);
    pthread_key_create(&key, destructor);
    pthread_t a, b;
    pthread_attr_t detached;
    pthread_attr_init(&detached);
    pthread_attr_setdetachstate(&detached, PTHREAD_CREATE_DETACHED);
    CHECK(pthread_create(&a, NULL, forking_worker, NULL) == 0, "pthread_create");
    CHECK(pthread_create(&b, &detached, detached_worker, NULL) == 0, "pthread_create detached");
    pthread_exit(NULL);
}
