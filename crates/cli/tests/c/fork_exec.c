/* fork_exec: fills MIB megabytes of malloc'ed, checksummed blocks, then forks. The child
 * verifies every block, overwrites half of them in its own copy, allocates and frees more,
 * frees some of the inherited blocks and trims the heap (malloc_trim), and execs this same
 * program with the argument "exec", which allocates and verifies some memory and exits 7. The
 * parent waits for the child, expects status 7, and verifies that its own data is unchanged
 * (the child's writes, frees and allocations must not show through), then frees it all.
 * Exits 1 with a message on any mismatch; prints "ok ..." on success.
 *
 * Usage: fork_exec MIB | fork_exec exec */
#define _GNU_SOURCE
#include <malloc.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#define BLOCK (64 << 10)

static const char TEXT[] =
    "Call me Ishmael. Some years ago - never mind how long precisely - having little or no "
    "money in my purse, and nothing particular to interest me on shore, I thought I would "
    "sail about a little and see the watery part of the world. ";
#define TEXT_LEN (sizeof(TEXT) - 1)

static inline unsigned char expect(uint64_t id, uint64_t gen, size_t i) {
    size_t r = i & 1023;
    if (r < 16) {
        uint64_t v = r < 8 ? id * 1000003 + gen : (uint64_t)(i >> 10);
        return (unsigned char)(v >> (8 * (r & 7)));
    }
    return (unsigned char)TEXT[(i + id * 17 + gen * 5) % TEXT_LEN];
}

static void fill(unsigned char *p, size_t n, uint64_t id, uint64_t gen) {
    for (size_t i = 0; i < n; i++) p[i] = expect(id, gen, i);
}

static void verify(const char *who, const unsigned char *p, size_t n, uint64_t id, uint64_t gen) {
    for (size_t i = 0; i < n; i++) {
        unsigned char w = expect(id, gen, i);
        if (p[i] != w) {
            fprintf(stderr,
                    "fork_exec: MISMATCH in the %s (pid %d): block %llu generation %llu offset "
                    "%zu: got 0x%02x want 0x%02x\n",
                    who, (int)getpid(), (unsigned long long)id, (unsigned long long)gen, i, p[i],
                    w);
            exit(1);
        }
    }
}

static void *xmalloc(size_t n) {
    void *p = malloc(n);
    if (!p) {
        fprintf(stderr, "fork_exec: malloc(%zu) failed in pid %d\n", n, (int)getpid());
        exit(1);
    }
    return p;
}

/* Allocates `mib` MiB in blocks, verifies and frees them (ids from `base`). */
static void churn(const char *who, size_t mib, uint64_t base) {
    size_t nb = mib * (1 << 20) / BLOCK;
    unsigned char **b = xmalloc(nb * sizeof *b);
    for (size_t i = 0; i < nb; i++) {
        b[i] = xmalloc(BLOCK);
        fill(b[i], BLOCK, base + i, 9);
    }
    for (size_t i = 0; i < nb; i++) verify(who, b[i], BLOCK, base + i, 9);
    for (size_t i = 0; i < nb; i++) free(b[i]);
    free(b);
}

int main(int argc, char **argv) {
    if (argc == 2 && strcmp(argv[1], "exec") == 0) {
        churn("exec'd child", 32, 5000000);
        printf("ok exec'd child pid %d\n", (int)getpid());
        fflush(stdout);
        return 7;
    }
    if (argc != 2) {
        fprintf(stderr, "usage: %s MIB | %s exec\n", argv[0], argv[0]);
        return 2;
    }
    /* Exec by path, so that the exec'd program's name (its comm) is this program's. */
    static char self[4096];
    ssize_t sn = readlink("/proc/self/exe", self, sizeof self - 1);
    if (sn <= 0) {
        perror("fork_exec: readlink /proc/self/exe");
        return 1;
    }
    self[sn] = 0;
    size_t nb = (size_t)atol(argv[1]) * (1 << 20) / BLOCK;
    unsigned char **b = xmalloc(nb * sizeof *b);
    for (size_t i = 0; i < nb; i++) {
        b[i] = xmalloc(BLOCK);
        fill(b[i], BLOCK, i, 1);
    }
    fflush(stdout);
    pid_t pid = fork();
    if (pid < 0) {
        perror("fork_exec: fork");
        return 1;
    }
    if (pid == 0) {
        for (size_t i = 0; i < nb; i++) verify("forked child", b[i], BLOCK, i, 1);
        for (size_t i = 0; i < nb; i += 2) fill(b[i], BLOCK, i, 2);
        churn("forked child", 16, 1000000);
        for (size_t i = 0; i < nb; i++) verify("forked child", b[i], BLOCK, i, i % 2 ? 1 : 2);
        /* Free some of the inherited blocks and give the memory back (mimalloc purges: the
         * region sees the child drop pages that were resident at fork time). */
        for (size_t i = 1; i < nb; i += 4) free(b[i]);
        malloc_trim(0);
        execl(self, argv[0], "exec", (char *)NULL);
        perror("fork_exec: exec");
        _exit(1);
    }
    /* The parent works on its own copy meanwhile. */
    churn("parent", 8, 2000000);
    int status = 0;
    if (waitpid(pid, &status, 0) != pid) {
        perror("fork_exec: waitpid");
        return 1;
    }
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 7) {
        fprintf(stderr, "fork_exec: the child ended with status 0x%x, not exit 7\n", status);
        return 1;
    }
    for (size_t i = 0; i < nb; i++) verify("parent", b[i], BLOCK, i, 1);
    for (size_t i = 0; i < nb; i++) free(b[i]);
    free(b);
    printf("ok parent pid %d, child pid %d\n", (int)getpid(), (int)pid);
    return 0;
}
