/* vfork_pins: many vfork + execve with the path and the argument strings in the heap (as
 * CPython's subprocess spawns), then new threads started after the heap, the locale's data
 * included, was evicted. Each exec's strings are pinned in memory (on the signal route) in
 * the table the vfork child shares with its parent; a successful exec used to leave its pins
 * there, the table filled, the pin that keeps the locale's data in memory while a new thread
 * starts with every signal blocked was refused, and the new thread died of SIGBUS in glibc's
 * __ctype_init. Prints "vfork_pins: ok". */
#include <locale.h>
#include <pthread.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>
#include "evicting.h"

extern char **environ;

static void *worker(void *a) { return a; }

int main(int argc, char **argv) {
    const char *prog = argc > 1 ? argv[1] : "/bin/true";
    CHECK(setlocale(LC_ALL, "C.UTF-8") != NULL, "setlocale");
    char *path = strdup(prog);
    char **args = malloc(3 * sizeof *args);
    args[0] = strdup("true");
    args[1] = strdup("an-argument-in-the-heap");
    args[2] = NULL;
    for (int round = 0; round < 4; round++) {
        for (int i = 0; i < 100; i++) {
            pid_t c = vfork();
            if (c == 0) {
                execve(path, args, environ);
                _exit(127);
            }
            int st = -1;
            CHECK(c > 0 && waitpid(c, &st, 0) == c && WIFEXITED(st) && WEXITSTATUS(st) == 0,
                  "exec %d: status %#x", i, st);
        }
        evict();
        for (int t = 0; t < 4; t++) {
            pthread_t th;
            CHECK(pthread_create(&th, NULL, worker, NULL) == 0, "pthread_create");
            pthread_join(th, NULL);
            evict();
        }
    }
    if (bad) return 1;
    printf("vfork_pins: ok\n");
    return 0;
}
