// Session 46: fork() + child _exit(0) + waitpid, N times, from a program with a heap of MB
// megabytes in 64 KiB blocks. Prints medians: the whole round, fork() in the parent, when the
// child's own code first runs (counted from the fork call) and from then until the parent has
// reaped it. usage: forkexit2 MB N   e.g. zmem run --resident 16M -- ./forkexit2 2 300
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
static double now(void) { struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t); return t.tv_sec * 1e6 + t.tv_nsec / 1e3; }
static int cmp(const void *a, const void *b) { double x = *(double *)a, y = *(double *)b; return x < y ? -1 : x > y; }
int main(int c, char **v) {
    if (c != 3) { fprintf(stderr, "usage: forkexit2 MB N\n"); return 2; }
    size_t mb = atoi(v[1]); int n = atoi(v[2]);
    char **blocks = malloc(mb * 16 * sizeof(char *));
    for (size_t i = 0; i < mb * 16; i++) { blocks[i] = malloc(65536); for (int j = 0; j < 65536; j += 64) blocks[i][j] = (char)(i + j / 64); }
    volatile double *sh = mmap(0, 4096, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    double *r = malloc(n * sizeof(double)), *f = malloc(n * sizeof(double)), *cs = malloc(n * sizeof(double)), *ce = malloc(n * sizeof(double));
    for (int i = 0; i < n; i++) {
        double a = now();
        pid_t p = fork();
        if (p < 0) { perror("fork"); return 1; }
        if (p == 0) { sh[0] = now(); _exit(0); }
        f[i] = now() - a;
        int st;
        if (waitpid(p, &st, 0) != p || st != 0) { fprintf(stderr, "child %d: status %x\n", i, st); return 1; }
        double e = now(); r[i] = e - a; cs[i] = sh[0] - a; ce[i] = e - sh[0];
    }
    qsort(r, n, sizeof(double), cmp); qsort(f, n, sizeof(double), cmp); qsort(cs, n, sizeof(double), cmp); qsort(ce, n, sizeof(double), cmp);
    printf("%zu MB: round %.0f us; fork() in parent %.0f; child runs at %.0f; child run->reaped %.0f (medians)\n", mb, r[n / 2], f[n / 2], cs[n / 2], ce[n / 2]);
    return 0;
}
