/* A program that closes or overwrites descriptors it did not open, as daemons and shells do,
 * while its heap is evicted: zmem's userfaultfd must survive every C library way of doing it,
 * and a raw system call must end the program with a message, never let it run on zeros.
 *
 * usage: closer MODE; 0 close(3..4095), 1 close_range(3, ~0U, 0), 2 closefrom(3),
 * 3 dup2(2, fd) for fd 3..1023, 4 the close_range system call itself.
 * Prints "bad bytes: N" (0 when the heap is intact) and exits 0 only if N is 0. */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>
#include <sys/syscall.h>

int main(int argc, char **argv) {
    size_t n = 32 << 20;
    unsigned char *p = malloc(n);
    if (!p) return 2;
    for (size_t i = 0; i < n; i++) p[i] = (unsigned char)(i * 7 + i / 4096);
    int mode = argc > 1 ? atoi(argv[1]) : 0;
    int refused = 0;
    switch (mode) {
    case 0: for (int fd = 3; fd < 4096; fd++) close(fd); break;
    case 1: close_range(3, ~0U, 0); break;
    case 2: closefrom(3); break;
    case 3: for (int fd = 3; fd < 1024; fd++) if (dup2(2, fd) < 0) refused++; break;
    case 4: syscall(SYS_close_range, 3, ~0U, 0); break;
    }
    size_t bad = 0;
    for (size_t i = 0; i < n; i++) if (p[i] != (unsigned char)(i * 7 + i / 4096)) bad++;
    printf("bad bytes: %zu (dup2 refused %d)\n", bad, refused);
    return bad != 0;
}
