/* errno is the program's: nothing zmem does for it may change it. Code that sets errno to 0,
 * calls something and takes a non-zero errno as that call's failure (sort's strcoll check,
 * getpwnam's "not found", strtol) must not see the errno of a call zmem made meanwhile: a
 * fault served on this thread (the signal route's SIGBUS handler), a system call made through
 * the guard (its SIGSYS handler, or the preload library's wrapper), or the heap's own calls
 * inside malloc and free. Found: `sort -u` under `zmem run` in a UTF-8 locale stopped with
 * "string comparison failed: File exists" (an EEXIST from the fault's handler).
 *
 * Each check sets errno to a value no call here sets, does something zmem serves, and checks
 * errno still holds it. Prints "ok" (or the failed checks, exit 1). */
#include <fcntl.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "evicting.h"

#define BLOCKS 4096
#define MARK 4242

int main(void) {
    static char *blocks[BLOCKS];
    for (int i = 0; i < BLOCKS; i++) {
        blocks[i] = malloc(4000);
        CHECK(blocks[i] != NULL, "malloc %d", i);
        if (!blocks[i]) return 1;
        memset(blocks[i], 'a' + i % 26, 4000);
    }
    evict();
    /* Faults: reads and writes of evicted pages, in a scattered order (as sort's comparisons
     * touch its lines), three times over. */
    long sum = 0;
    for (int pass = 0; pass < 3; pass++) {
        for (int k = 0; k < BLOCKS; k++) {
            int i = (int)(((unsigned)k * 2654435761u + (unsigned)pass) % BLOCKS);
            errno = MARK;
            sum += blocks[i][k % 4000];
            blocks[i][(k * 7) % 4000] = 'z';
            CHECK(errno == MARK, "after the fault on block %d", i);
        }
        evict();
    }
    /* System calls into evicted buffers: read(2) and write(2) through the C library. */
    int zero = open("/dev/zero", O_RDONLY), null = open("/dev/null", O_WRONLY);
    CHECK(zero >= 0 && null >= 0, "open");
    for (int i = 0; i < BLOCKS; i += 8) {
        errno = MARK;
        CHECK(read(zero, blocks[i], 4000) == 4000, "read into block %d", i);
        CHECK(errno == MARK, "after read into evicted block %d", i);
        errno = MARK;
        CHECK(write(null, blocks[i + 1], 4000) == 4000, "write from block %d", i + 1);
        CHECK(errno == MARK, "after write from evicted block %d", i + 1);
        /* A raw call: trapped by the guard's filter on the signal route (its SIGSYS handler). */
        errno = MARK;
        CHECK(syscall(SYS_read, zero, blocks[i + 2], 4000) == 4000, "raw read, block %d", i + 2);
        CHECK(errno == MARK, "after a raw read into evicted block %d", i + 2);
    }
    evict();
    /* The heap's own work: blocks of every size (large ones are new mappings of the heap),
     * resized and freed, some of them evicted meanwhile. */
    for (int round = 0; round < 4; round++) {
        for (int i = 0; i < BLOCKS; i += 16) {
            size_t n = (size_t)(i + 1) << (round * 3);
            errno = MARK;
            char *p = malloc(n);
            CHECK(p != NULL && errno == MARK, "malloc(%zu)", n);
            if (!p) continue;
            p[n - 1] = 1;
            errno = MARK;
            char *q = realloc(p, n * 3);
            CHECK(q != NULL && errno == MARK, "realloc(%zu)", n * 3);
            if (q) p = q;
            errno = MARK;
            free(p);
            CHECK(errno == MARK, "free of %zu bytes", n * 3);
            errno = MARK;
            free(blocks[i]);
            blocks[i] = calloc(1, 4000);
            CHECK(blocks[i] != NULL && errno == MARK, "free and calloc of block %d", i);
        }
        evict();
    }
    if (sum == 42) puts("");
    if (bad) return 1;
    puts("ok");
    return 0;
}
