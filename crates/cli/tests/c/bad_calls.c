/* The calls issue 10 lists as bad input for a program under zmem, each on a heap that is
 * evicted (16 MiB of data in a 4M budget): clearenv, vfork + exec, fork without exec (the child
 * reads the parent's evicted heap and allocates its own), exec of a static binary (no zmem in
 * it) from a forked child, clone(2) through glibc's wrapper (no atfork handlers run), and a
 * mid-size block freed twice (the exact-fit allocator ignores the second free and says so).
 *
 * usage: bad_calls MODE [STATIC_BINARY]; prints one line ending in "bad 0" when the heap is
 * intact and every child succeeded (status 0). */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <sys/wait.h>
#include <sched.h>
#include <signal.h>
static unsigned char *fill(size_t n, int s) { unsigned char *p = malloc(n); for (size_t i=0;i<n;i++) p[i]=(unsigned char)(i*s+i/4096); return p; }
static size_t check(unsigned char *p, size_t n, int s) { size_t b=0; for (size_t i=0;i<n;i++) if (p[i]!=(unsigned char)(i*s+i/4096)) b++; return b; }
static int child_fn(void *arg) { unsigned char *p = arg; _exit(check(p, 16<<20, 3) != 0); }
int main(int argc, char **argv) {
    int mode = atoi(argv[1]);
    size_t n = 16 << 20;
    unsigned char *p = fill(n, 3);
    int st = 0;
    if (mode == 0) { clearenv(); unsigned char *q = fill(n, 5); printf("clearenv: status 0 bad %zu\n", check(p,n,3) + check(q,n,5)); }
    if (mode == 1) { pid_t c = vfork(); if (c == 0) { execl("/bin/true", "true", NULL); _exit(127); } waitpid(c, &st, 0); printf("vfork: status %d bad %zu\n", st, check(p,n,3)); }
    if (mode == 2) { pid_t c = fork(); if (c == 0) { unsigned char *q = fill(n, 7); _exit(check(p,n,3) != 0 || check(q,n,7) != 0); } waitpid(c, &st, 0); printf("fork: status %d bad %zu\n", st, check(p,n,3)); }
    if (mode == 3) { pid_t c = fork(); if (c == 0) { execl(argv[2], argv[2], NULL); _exit(127); } waitpid(c, &st, 0); printf("static exec: status %d bad %zu\n", st, check(p,n,3)); }
    if (mode == 5) { void *volatile a = malloc(4368); free(a); free(a); unsigned char *q = fill(4368, 9); printf("double free: status 0 bad %zu\n", check(p,n,3) + check(q,4368,9)); }
    if (mode == 4) { char *stack = malloc(1<<20); pid_t c = clone(child_fn, stack + (1<<20), SIGCHLD, p); waitpid(c, &st, 0); printf("clone: status %d bad %zu\n", st, check(p,n,3)); }
    return 0;
}
