// A program that daemonizes: fills MIB MiB with data that compresses (so that most of it is
// evicted at a small budget), forks, and the parent ends at once, by exit() or _exit()
// (daemon(3) and python's os._exit use the latter). The child waits until its parent is gone,
// reads everything back and writes "ok" or "bad N" into OUT.
//
// usage: daemonize MIB exit|_exit OUT
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static unsigned word(size_t i) { return (unsigned)((i % 1000) * 7 + (i >> 12)); }

int main(int argc, char **argv) {
    if (argc != 4) {
        fprintf(stderr, "usage: daemonize MIB exit|_exit OUT\n");
        return 2;
    }
    size_t words = ((size_t)atoi(argv[1]) << 20) / sizeof(unsigned);
    unsigned *p = malloc(words * sizeof(unsigned));
    if (!p) return 3;
    for (size_t i = 0; i < words; i++) p[i] = word(i);
    pid_t parent = getpid();
    pid_t pid = fork();
    if (pid < 0) return 4;
    if (pid > 0) {
        if (strcmp(argv[2], "_exit") == 0) _exit(0);
        exit(0);
    }
    setsid();
    while (getppid() == parent) usleep(10000);
    size_t bad = 0;
    for (size_t i = 0; i < words; i++) bad += p[i] != word(i);
    FILE *f = fopen(argv[3], "w");
    if (!f) return 5;
    if (bad) fprintf(f, "bad %zu\n", bad); else fprintf(f, "ok\n");
    fclose(f);
    free(p);
    return 0;
}
