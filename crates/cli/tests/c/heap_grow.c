// The program heap grows past its first arena. zmem hands mimalloc one arena at start and the
// next ones as the heap fills: THREADS threads each malloc blocks of 512 MiB (touching three
// pages of each) until GIB GiB are allocated in all, one block is realloc'd up to 1 GiB, and
// the process forks while the threads allocate (the child allocates 2 GiB more, checks what it
// can see and exits). Then every block is checked, a request larger than any arena must fail
// with ENOMEM (not hang), and everything is freed and allocated again.
//
// usage: heap_grow THREADS GIB   (prints "ok")
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#define BLOCK ((size_t)512 << 20)
#define MAX_BLOCKS 4096 /* 64 per thread */

static size_t per_thread;
static unsigned char *blocks[MAX_BLOCKS];
static int nblocks_of[64];

static unsigned char mark(size_t block, size_t where) { return (unsigned char)(block * 31 + where + 1); }

static void touch(unsigned char *b, size_t len, size_t id) {
    b[0] = mark(id, 0);
    b[len / 2] = mark(id, 1);
    b[len - 1] = mark(id, 2);
}

static int check(const unsigned char *b, size_t len, size_t id) {
    return b[0] == mark(id, 0) && b[len / 2] == mark(id, 1) && b[len - 1] == mark(id, 2);
}

static void *allocate(void *arg) {
    int t = (int)(long)arg;
    for (size_t i = 0; i < per_thread; i++) {
        size_t id = (size_t)t * (MAX_BLOCKS / 64) + i;
        unsigned char *b = malloc(BLOCK);
        if (!b) {
            fprintf(stderr, "thread %d: malloc of block %zu failed: %s\n", t, i, strerror(errno));
            return (void *)1;
        }
        touch(b, BLOCK, id);
        blocks[id] = b;
        nblocks_of[t] = (int)i + 1;
    }
    return NULL;
}

static int check_all(int threads) {
    for (int t = 0; t < threads; t++)
        for (int i = 0; i < nblocks_of[t]; i++) {
            size_t id = (size_t)t * (MAX_BLOCKS / 64) + (size_t)i;
            if (!check(blocks[id], BLOCK, id)) {
                fprintf(stderr, "block %zu of thread %d is wrong\n", id, t);
                return 1;
            }
        }
    return 0;
}

int main(int argc, char **argv) {
    if (argc != 3) {
        fprintf(stderr, "usage: heap_grow THREADS GIB\n");
        return 2;
    }
    int threads = atoi(argv[1]);
    size_t gib = (size_t)atoi(argv[2]);
    if (threads < 1 || threads > 64) return 2;
    per_thread = gib * 2 / (size_t)threads;
    if (per_thread > MAX_BLOCKS / 64) return 2;

    // A small block realloc'd up to 1 GiB, moved as it grows.
    unsigned char *r = malloc(1 << 20);
    if (!r) return 3;
    memset(r, 0x5a, 1 << 20);

    pthread_t th[64];
    for (int t = 0; t < threads; t++)
        if (pthread_create(&th[t], NULL, allocate, (void *)(long)t)) return 4;

    // Fork while the threads allocate: the child allocates on its own and exits.
    for (int f = 0; f < 3; f++) {
        usleep(20000);
        pid_t pid = fork();
        if (pid < 0) return 5;
        if (pid == 0) {
            for (int i = 0; i < 4; i++) {
                unsigned char *b = malloc(BLOCK);
                if (!b) _exit(10);
                touch(b, BLOCK, 999);
                if (!check(b, BLOCK, 999)) _exit(11);
            }
            for (int i = 0; i < (1 << 20); i += 4096)
                if (r[i] != 0x5a) _exit(12);
            _exit(0);
        }
        int st;
        if (waitpid(pid, &st, 0) != pid || !WIFEXITED(st) || WEXITSTATUS(st)) {
            fprintf(stderr, "child %d failed: status %d\n", f, st);
            return 6;
        }
    }
    for (int t = 0; t < threads; t++) {
        void *res;
        if (pthread_join(th[t], &res) || res) return 7;
    }
    if (check_all(threads)) return 8;

    for (size_t len = (size_t)2 << 20; len <= ((size_t)1 << 30); len *= 2) {
        unsigned char *q = realloc(r, len);
        if (!q) {
            fprintf(stderr, "realloc to %zu failed\n", len);
            return 9;
        }
        r = q;
        r[len - 1] = 0x5a;
    }
    for (int i = 0; i < (1 << 20); i += 4096)
        if (r[i] != 0x5a) return 10;

    // Larger than any arena: a clear failure, never a hang.
    errno = 0;
    void *huge = malloc((size_t)100 << 30);
    if (huge || errno != ENOMEM) {
        fprintf(stderr, "a 100 GiB malloc gave %p, errno %d\n", huge, errno);
        return 11;
    }

    // Freed, then allocated again: the heap's arenas are reused.
    for (int t = 0; t < threads; t++)
        for (int i = 0; i < nblocks_of[t]; i++) free(blocks[(size_t)t * (MAX_BLOCKS / 64) + (size_t)i]);
    free(r);
    for (int i = 0; i < (int)(gib * 2); i++) {
        blocks[i] = malloc(BLOCK);
        if (!blocks[i]) return 12;
        touch(blocks[i], BLOCK, (size_t)i);
    }
    for (int i = 0; i < (int)(gib * 2); i++)
        if (!check(blocks[i], BLOCK, (size_t)i)) return 13;
    puts("ok");
    return 0;
}
