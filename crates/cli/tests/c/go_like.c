// What Go's runtime does in a dynamically linked (cgo) build, as far as zmem is concerned: the
// executable exports cgo's entry point `_cgo_topofstack` (link with -rdynamic), and each
// thread's alternate signal stack is memory of the program's own heap, set with the raw
// sigaltstack system call (Go's gsignal stacks, past any C library wrapper). The program
// fills 8 MiB, evicts it (the idle alternate stack goes with it) and reads it back: on the
// signal route each fault's SIGBUS frame would go to that evicted stack, which the kernel
// cannot write, and the program would be killed.
//
// usage: go_like   (prints "ok SUM")
#include <signal.h>
#include <sys/syscall.h>
#include <unistd.h>
#include "evicting.h"

void *_cgo_topofstack(void) { return 0; }

int main(void) {
    stack_t ss = { .ss_sp = malloc(32 << 10), .ss_size = 32 << 10, .ss_flags = 0 };
    if (!ss.ss_sp || syscall(SYS_sigaltstack, &ss, NULL)) return 2;
    size_t n = 8 << 20;
    unsigned char *b = malloc(n);
    if (!b) return 1;
    for (size_t i = 0; i < n; i++) b[i] = (unsigned char)(i * 7 + (i >> 12));
    evict();
    unsigned long sum = 0;
    for (size_t i = 0; i < n; i++) {
        CHECK(b[i] == (unsigned char)(i * 7 + (i >> 12)), "byte %zu", i);
        if (bad) return 1;
        sum += b[i];
    }
    printf("ok %lu\n", sum);
    return 0;
}
