// A forked child keeps the parent's evicted large blocks after the parent frees them: the
// parent fills blocks through a small budget (most pages end up compressed), forks a child that
// waits, frees every block, and lets the child check its copy-on-write view of them. The free
// hands each stored page the child still needs to the child's store, on the program's thread,
// inside the region's lock; that store's first pages need a pool chunk, which zmem mapped with
// the C library's mmap, i.e. the preload's, into the region, whose lock the thread held:
// a hang (tests/c/fork_race.c in CI, session 52).
//
// usage: fork_free BLOCKS MB_EACH   (prints "ok")
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

static unsigned char byte_of(int b, size_t k) { return (unsigned char)(b * 37 + k / 4096 * 11 + 1); }

int main(int argc, char **argv) {
    int blocks = argc > 1 ? atoi(argv[1]) : 16;
    size_t each = (size_t)(argc > 2 ? atoi(argv[2]) : 1) << 20;
    unsigned char **b = malloc(blocks * sizeof *b);
    for (int i = 0; i < blocks; i++) {
        b[i] = malloc(each);
        if (!b[i]) return 2;
        for (size_t k = 0; k < each; k += 512) b[i][k] = byte_of(i, k);
    }
    int go[2];
    if (pipe(go) != 0) return 2;
    pid_t pid = fork();
    if (pid < 0) return 2;
    if (pid == 0) {
        char c;
        close(go[1]);
        if (read(go[0], &c, 1) != 1) _exit(3);
        size_t bad = 0;
        for (int i = 0; i < blocks; i++)
            for (size_t k = 0; k < each; k += 512) bad += b[i][k] != byte_of(i, k);
        if (bad) fprintf(stderr, "child: %zu wrong bytes\n", bad);
        _exit(bad ? 1 : 0);
    }
    close(go[0]);
    for (int i = 0; i < blocks; i++) free(b[i]);
    if (write(go[1], "x", 1) != 1) return 2;
    int status;
    if (waitpid(pid, &status, 0) != pid) return 2;
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
        printf("child failed (%d)\n", status);
        return 1;
    }
    printf("ok\n");
    return 0;
}
