// A program whose runtime, like Go's in a cgo build, installs its SIGBUS and SIGSEGV handlers
// with the raw system call (past the preload's sigaction) and exports cgo's entry point
// `_cgo_topofstack` (link with -rdynamic). Its handler ends the program with status 9, as Go's
// does for a fault it did not expect. It then fills 8 MiB, evicts it and reads it back.
//
// usage: raw_sigbus   (prints "ok SUM")
#include <signal.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>
#include "evicting.h"

void *_cgo_topofstack(void) { return 0; }

static void fatal(int sig) { (void)sig; _exit(9); }

struct kernel_sigaction { void (*handler)(int); unsigned long flags; void (*restorer)(void); unsigned long mask; };
extern void restore_rt(void) __asm__("restore_rt");
__asm__(".text\nrestore_rt:\n mov $15, %rax\n syscall\n");

int main(void) {
    struct kernel_sigaction sa = { fatal, 0x04000000 /* SA_RESTORER */, restore_rt, 0 };
    if (syscall(SYS_rt_sigaction, SIGBUS, &sa, NULL, 8) || syscall(SYS_rt_sigaction, SIGSEGV, &sa, NULL, 8))
        return 2;
    size_t n = 8 << 20;
    unsigned char *b = malloc(n);
    CHECK(b != NULL, "malloc");
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
