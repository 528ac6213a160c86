/* ends_with_exit: a vfork child that ends with _exit at once (it shares the parent's memory:
 * its end must not count as the parent's), then fills MIB megabytes of malloc'ed memory, checks
 * it, and ends with _exit(5) (as dash ends every shell, and python's os._exit): the run's
 * report must still be made.
 * Prints "ok" before the _exit; exits 1 on a mismatch. Usage: ends_with_exit MIB */
#include <stdio.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

int main(int argc, char **argv) {
    pid_t c = vfork();
    if (c == 0) _exit(0);
    int st = 0;
    if (c < 0 || waitpid(c, &st, 0) != c || st != 0) return 1;
    size_t n = (size_t)atol(argc > 1 ? argv[1] : "16") << 20;
    unsigned char *p = malloc(n);
    if (!p) return 1;
    for (size_t i = 0; i < n; i++) p[i] = (unsigned char)(i * 7 + i / 4096);
    for (size_t i = 0; i < n; i++)
        if (p[i] != (unsigned char)(i * 7 + i / 4096)) {
            printf("MISMATCH at %zu\n", i);
            return 1;
        }
    printf("ok\n");
    fflush(stdout);
    _exit(5);
}
