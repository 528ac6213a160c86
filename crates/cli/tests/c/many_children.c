// Forks N children that all stay alive until the parent says so, each checking the parent's
// heap (MB megabytes, pattern by block) when it starts and again at the end. Prints "ok N"
// when every fork succeeded and every child saw its memory; else what failed.
// Under zmem each live child holds a snapshot sized for the whole region: with those tables
// charged to the commit count, forks failed with ENOMEM past ~110 live children.
// usage: many_children MB N
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

static int check(char **blocks, size_t nblocks) {
    for (size_t i = 0; i < nblocks; i++)
        for (size_t j = 0; j < 65536; j += 512)
            if (blocks[i][j] != (char)(i * 7 + j / 512)) return 0;
    return 1;
}

int main(int argc, char **argv) {
    if (argc != 3) { fprintf(stderr, "usage: many_children MB N\n"); return 2; }
    size_t nblocks = (size_t)atoi(argv[1]) * 16;
    int n = atoi(argv[2]);
    char **blocks = malloc(nblocks * sizeof *blocks);
    for (size_t i = 0; i < nblocks; i++) {
        blocks[i] = malloc(65536);
        for (size_t j = 0; j < 65536; j += 512) blocks[i][j] = (char)(i * 7 + j / 512);
    }
    int go[2];
    if (pipe(go) != 0) { perror("pipe"); return 2; }
    pid_t *pids = calloc(n, sizeof *pids);
    int failed = 0, first_errno = 0;
    for (int k = 0; k < n; k++) {
        pid_t p = fork();
        if (p < 0) {
            if (!failed) first_errno = errno;
            failed++;
            continue;
        }
        if (p == 0) {
            close(go[1]);
            int ok = check(blocks, nblocks);
            char c;
            while (read(go[0], &c, 1) < 0 && errno == EINTR) {}
            _exit(ok && check(blocks, nblocks) ? 0 : 9);
        }
        pids[k] = p;
    }
    close(go[1]);  // every child reads EOF and ends
    int wrong = 0;
    for (int k = 0; k < n; k++) {
        if (!pids[k]) continue;
        int st;
        if (waitpid(pids[k], &st, 0) != pids[k] || !WIFEXITED(st) || WEXITSTATUS(st) != 0) wrong++;
    }
    if (failed || wrong) {
        printf("%d forks failed (first: %s), %d children saw wrong memory\n", failed,
               failed ? strerror(first_errno) : "-", wrong);
        return 1;
    }
    printf("ok %d\n", n);
    return 0;
}
