/* Shared by the signal-route test programs (guarded_calls.c, heap_stacks.c): a failed check is
 * counted and printed; evict() touches 24 MiB of other data, which in a 4M budget pushes every
 * page touched before it out of DRAM. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>

static int bad;
#define CHECK(c, ...) do { if (!(c)) { bad++; printf("FAIL %s:%d: ", __FILE__, __LINE__); printf(__VA_ARGS__); printf(" (errno %d)\n", errno); } } while (0)

static void evict(void) {
    static unsigned char *junk;
    size_t n = 24 << 20;
    if (!junk) junk = malloc(n);
    for (size_t i = 0; i < n; i += 4096) junk[i] = (unsigned char)(i >> 12);
}
