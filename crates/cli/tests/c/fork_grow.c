// Forks while the heap reaches new address ranges: four threads each malloc 25 blocks of
// 512 MiB (one page touched; every block starts a new 512 MiB range, so mimalloc fills a new
// page-map submap under its page-map lock), while the main thread forks FORKS times; each
// child mallocs a block of its own (a new range again), writes its last byte and exits. A
// child that inherited the lock held hangs there, and so does this program (in waitpid).
//
// usage: fork_grow FORKS   (prints "ok")
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#define BLOCK ((size_t)512 << 20)

static void *allocate(void *arg) {
    (void)arg;
    for (int i = 0; i < 25; i++) {
        char *b = malloc(BLOCK);
        if (!b) return (void *)1;
        b[0] = 1;
        usleep(2000);
    }
    return NULL;
}

int main(int argc, char **argv) {
    int forks = argc > 1 ? atoi(argv[1]) : 40;
    pthread_t t[4];
    for (int i = 0; i < 4; i++)
        if (pthread_create(&t[i], NULL, allocate, NULL)) return 2;
    for (int f = 0; f < forks; f++) {
        pid_t p = fork();
        if (p < 0) return 3;
        if (p == 0) {
            char *b = malloc(BLOCK);
            if (!b) _exit(3);
            b[BLOCK - 1] = 2;
            _exit(0);
        }
        int st;
        if (waitpid(p, &st, 0) != p || !WIFEXITED(st) || WEXITSTATUS(st)) {
            fprintf(stderr, "child %d: status %d\n", f, st);
            return 4;
        }
    }
    for (int i = 0; i < 4; i++) {
        void *r;
        if (pthread_join(t[i], &r) || r) return 5;
    }
    puts("ok");
    return 0;
}
