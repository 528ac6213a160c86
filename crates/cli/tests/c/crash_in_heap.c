/* crash_in_heap: a page of pointers in the heap is evicted (64 MiB written after it, far more
 * than the test's budget), read back, and one of its NULL pointers followed: SIGSEGV at
 * address 4 with a register (rdi) pointing into the heap page, as a program that lost a page
 * would die. For `zmem run --trace-pages`, whose report must name that page and its history. */
#include <stdlib.h>
#include <string.h>

__attribute__((noinline)) static int follow(int *volatile *table) { return table[5][1]; }

int main(void) {
    int *volatile *table = calloc(512, sizeof(int *)); /* one page of NULL pointers */
    size_t n = 64 << 20;
    char *junk = malloc(n);
    if (!table || !junk) return 2;
    for (size_t i = 0; i < n; i++) junk[i] = (char)(i % 251 + (i >> 12));
    return follow(table);
}
