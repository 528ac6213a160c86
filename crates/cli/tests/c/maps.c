// A program that manages its own memory with mmap, as allocators, VMs and garbage collectors
// do: many private anonymous mappings filled with data far larger than zmem's budget, checked
// against what was written after munmap, mremap (shrink, grow, move), MAP_FIXED renewal,
// MAP_FIXED_NOREPLACE, mprotect, MADV_DONTNEED/MADV_FREE, a file mapped over anonymous memory,
// fork, and a use after munmap (which must still fault). It prints one line per phase; the
// output of a run under zmem must equal a plain run's.
//
// usage: maps MIB SEED
#define _GNU_SOURCE
#include <setjmp.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#define PAGE 4096UL
#define SLOTS 256

static uint64_t rng;
static uint64_t next(void) {
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return rng;
}

struct slot {
    unsigned char *p;
    size_t len;   // bytes mapped
    uint64_t tag; // content: word i of the mapping is tag ^ i (0 means zeros)
};
static struct slot slots[SLOTS];

static void fill(unsigned char *p, size_t len, uint64_t tag) {
    uint64_t *w = (uint64_t *)p;
    for (size_t i = 0; i < len / 8; i++) w[i] = tag ^ i;
}

// Checks `len` bytes at `p`, which is byte `from` of a mapping filled with `tag`.
static int check_from(const unsigned char *p, size_t from, size_t len, uint64_t tag, const char *what) {
    const uint64_t *w = (const uint64_t *)p;
    for (size_t i = 0; i < len / 8; i++) {
        uint64_t want = tag ? (tag ^ (from / 8 + i)) : 0;
        if (w[i] != want) {
            printf("WRONG %s at byte %zu: %016llx, want %016llx\n", what, i * 8,
                   (unsigned long long)w[i], (unsigned long long)want);
            return 0;
        }
    }
    return 1;
}

static int check(const unsigned char *p, size_t len, uint64_t tag, const char *what) {
    return check_from(p, 0, len, tag, what);
}

static void die(const char *what) {
    perror(what);
    exit(2);
}

static sigjmp_buf jump;
static void on_segv(int sig) {
    (void)sig;
    siglongjmp(jump, 1);
}

int main(int argc, char **argv) {
    if (argc != 3) {
        fprintf(stderr, "usage: maps MIB SEED\n");
        return 2;
    }
    size_t total = strtoul(argv[1], 0, 10) << 20;
    rng = strtoull(argv[2], 0, 10) * 0x9e3779b97f4a7c15ULL + 1;
    int ok = 1;

    // 1. Fill: mappings of 1 page to 2 MiB until `total` bytes are live.
    size_t live = 0;
    int n = 0;
    while (live < total && n < SLOTS) {
        size_t len = ((next() % 512) + 1) * PAGE;
        unsigned char *p = mmap(0, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (p == MAP_FAILED) die("mmap");
        uint64_t tag = next() | 1;
        fill(p, len, tag);
        slots[n++] = (struct slot){p, len, tag};
        live += len;
    }
    for (int i = 0; i < n; i++) ok &= check(slots[i].p, slots[i].len, slots[i].tag, "fill");
    printf("fill: %d mappings, %zu MiB, %s\n", n, live >> 20, ok ? "ok" : "WRONG");

    // 2. Churn: unmap, map anew, shrink, grow and move, re-check everything.
    for (int round = 0; round < 3 * n; round++) {
        struct slot *s = &slots[next() % n];
        switch (next() % 4) {
        case 0: // unmap and map a new one
            if (munmap(s->p, s->len)) die("munmap");
            s->len = ((next() % 512) + 1) * PAGE;
            s->p = mmap(0, s->len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
            if (s->p == MAP_FAILED) die("mmap");
            ok &= check(s->p, s->len, 0, "new mapping");
            s->tag = next() | 1;
            fill(s->p, s->len, s->tag);
            break;
        case 1: { // shrink in place
            if (s->len <= PAGE) break;
            size_t len = (s->len / PAGE / 2 + 1) * PAGE;
            unsigned char *q = mremap(s->p, s->len, len, 0);
            if (q == MAP_FAILED) die("mremap shrink");
            if (q != s->p) { printf("WRONG shrink moved\n"); ok = 0; }
            s->len = len;
            break;
        }
        case 2: { // grow (may move): the old content follows, the new part is zero
            size_t len = s->len + ((next() % 256) + 1) * PAGE;
            unsigned char *q = mremap(s->p, s->len, len, MREMAP_MAYMOVE);
            if (q == MAP_FAILED) die("mremap grow");
            ok &= check(q, s->len, s->tag, "grown, old part");
            ok &= check(q + s->len, len - s->len, 0, "grown, new part");
            s->p = q;
            s->len = len;
            fill(s->p, s->len, s->tag);
            break;
        }
        case 3: // rewrite
            s->tag = next() | 1;
            fill(s->p, s->len, s->tag);
            break;
        }
    }
    for (int i = 0; i < n; i++) ok &= check(slots[i].p, slots[i].len, slots[i].tag, "churn");
    printf("churn: %s\n", ok ? "ok" : "WRONG");

    // 3. A reserve-then-commit heap, as a JVM keeps it: PROT_NONE reservation, MAP_FIXED
    // read-write commits, uncommit with MAP_FIXED PROT_NONE, commit again (zeros).
    size_t rlen = 64 * PAGE * 16;
    unsigned char *r = mmap(0, rlen, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (r == MAP_FAILED) die("reserve");
    if (mmap(r, rlen / 2, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED, -1, 0) != r)
        die("commit");
    fill(r, rlen / 2, 77);
    if (mmap(r + rlen / 4, rlen / 4, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED | MAP_NORESERVE, -1, 0) !=
        r + rlen / 4)
        die("uncommit");
    if (mmap(r + rlen / 4, rlen / 4, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED, -1, 0) !=
        r + rlen / 4)
        die("recommit");
    ok &= check(r, rlen / 4, 77, "committed");
    ok &= check(r + rlen / 4, rlen / 4, 0, "recommitted");
    // MAP_FIXED_NOREPLACE: refused over a mapping, granted in the reservation's free tail only
    // after that tail is unmapped.
    void *q = mmap(r, PAGE, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED_NOREPLACE, -1, 0);
    printf("noreplace over a mapping: %s\n", q == MAP_FAILED ? "refused" : "GRANTED");
    if (munmap(r + rlen / 2, rlen / 2)) die("munmap tail");
    q = mmap(r + rlen / 2, PAGE, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED_NOREPLACE, -1, 0);
    printf("noreplace on a hole: %s\n", q == r + rlen / 2 ? "granted" : "REFUSED");
    if (q != MAP_FAILED) {
        ok &= check(q, PAGE, 0, "noreplace page");
        munmap(q, PAGE);
    }
    printf("reserve/commit: %s\n", ok ? "ok" : "WRONG");

    // 4. Read-only data stays right; writable again, it can leave DRAM again.
    struct slot *ro = &slots[0];
    if (mprotect(ro->p, ro->len, PROT_READ)) die("mprotect ro");
    for (int i = 1; i < n; i++) ok &= check(slots[i].p, slots[i].len, slots[i].tag, "beside read-only");
    ok &= check(ro->p, ro->len, ro->tag, "read-only");
    if (mprotect(ro->p, ro->len, PROT_READ | PROT_WRITE)) die("mprotect rw");
    printf("mprotect: %s\n", ok ? "ok" : "WRONG");

    // 5. Dropped pages read as zeros (MADV_DONTNEED; after MADV_FREE they may also keep their
    // data); the rest of the mapping keeps its data.
    for (int i = 0; i < n; i += 7) {
        struct slot *s = &slots[i];
        if (s->len < 4 * PAGE) continue;
        int advice = (i / 7) % 2 ? MADV_FREE : MADV_DONTNEED;
        if (madvise(s->p, 2 * PAGE, advice)) die("madvise");
        if (advice == MADV_DONTNEED) ok &= check(s->p, 2 * PAGE, 0, "dropped pages");
        ok &= check_from(s->p + 2 * PAGE, 2 * PAGE, s->len - 2 * PAGE, s->tag, "kept pages");
        s->tag = next() | 1;
        fill(s->p, s->len, s->tag);
    }
    printf("madvise: %s\n", ok ? "ok" : "WRONG");

    // 6. A file mapped over anonymous memory shows the file; its neighbours keep their data.
    char path[] = "/tmp/zmem-maps-XXXXXX";
    int fd = mkstemp(path);
    if (fd < 0) die("mkstemp");
    unlink(path);
    unsigned char fpage[PAGE];
    fill(fpage, PAGE, 0x5a5a);
    if (write(fd, fpage, PAGE) != (ssize_t)PAGE) die("write");
    struct slot *fs = &slots[1];
    if (fs->len >= 3 * PAGE) {
        if (mmap(fs->p + PAGE, PAGE, PROT_READ, MAP_PRIVATE | MAP_FIXED, fd, 0) != fs->p + PAGE)
            die("file over anonymous");
        ok &= check(fs->p + PAGE, PAGE, 0x5a5a, "file page");
        ok &= check(fs->p, PAGE, fs->tag, "before the file page");
        ok &= check_from(fs->p + 2 * PAGE, 2 * PAGE, fs->len - 2 * PAGE, fs->tag, "after the file page");
        if (munmap(fs->p, fs->len)) die("munmap with file page");
        fs->p = mmap(0, fs->len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (fs->p == MAP_FAILED) die("mmap after file");
        ok &= check(fs->p, fs->len, 0, "anonymous again");
        fill(fs->p, fs->len, fs->tag);
    }
    close(fd);
    printf("file over anonymous: %s\n", ok ? "ok" : "WRONG");

    // 7. A forked child sees everything; its writes stay its own.
    pid_t pid = fork();
    if (pid < 0) die("fork");
    if (pid == 0) {
        int cok = 1;
        for (int i = 0; i < n; i++) cok &= check(slots[i].p, slots[i].len, slots[i].tag, "child");
        for (int i = 0; i < n; i += 3) fill(slots[i].p, slots[i].len, 12345);
        _exit(cok ? 0 : 1);
    }
    int status;
    if (waitpid(pid, &status, 0) != pid) die("waitpid");
    int child_ok = WIFEXITED(status) && WEXITSTATUS(status) == 0;
    for (int i = 0; i < n; i++) ok &= check(slots[i].p, slots[i].len, slots[i].tag, "parent after fork");
    printf("fork: child %s, parent %s\n", child_ok ? "ok" : "WRONG", ok ? "ok" : "WRONG");

    // 8. Memory unmapped is gone: touching it faults, as without zmem.
    struct slot *g = &slots[2];
    if (munmap(g->p, g->len)) die("munmap gone");
    signal(SIGSEGV, on_segv);
    volatile int faulted = 0;
    if (sigsetjmp(jump, 1) == 0) {
        volatile unsigned char c = g->p[0];
        (void)c;
    } else {
        faulted = 1;
    }
    signal(SIGSEGV, SIG_DFL);
    printf("use after munmap: %s\n", faulted ? "faults" : "DOES NOT FAULT");

    printf("%s\n", ok && child_ok && faulted ? "ALL OK" : "FAILED");
    return ok && child_ok && faulted ? 0 : 1;
}
