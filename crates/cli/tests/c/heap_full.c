// The program heap is a region of fixed address space (`--size`). Blocks of 256 MiB are
// allocated (first and last byte written) until malloc refuses: the refusal must be NULL with
// errno ENOMEM (never a hang or a crash), every block must keep its bytes, and once all are
// freed the same number must fit again.
//
// usage: heap_full   (prints "BLOCKS BLOCKS_AGAIN")
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>

#define BLOCK ((size_t)256 << 20)
#define MAX 256

static unsigned char *blocks[MAX];

static int fill(void) {
    int n = 0;
    for (;;) {
        errno = 0;
        unsigned char *b = malloc(BLOCK);
        if (!b) return errno == ENOMEM ? n : -1;
        if (n == MAX) return -2;
        b[0] = (unsigned char)(n + 1);
        b[BLOCK - 1] = (unsigned char)(n + 2);
        blocks[n++] = b;
    }
}

static int check_and_free(int n) {
    for (int i = 0; i < n; i++) {
        if (blocks[i][0] != (unsigned char)(i + 1) || blocks[i][BLOCK - 1] != (unsigned char)(i + 2))
            return 1;
        free(blocks[i]);
    }
    return 0;
}

int main(void) {
    int n = fill();
    if (n < 0) return 2;
    if (check_and_free(n)) return 3;
    int again = fill();
    if (again < 0) return 4;
    if (check_and_free(again)) return 5;
    printf("%d %d\n", n, again);
    return 0;
}
