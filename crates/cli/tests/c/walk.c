/* Fills MIB mebibytes with words that depend on their place (compressible: the top bits are a
 * small random number), then walks it from start to end PASSES times checking every word.
 * Exit 0 and "ok" when every word read back is the one written; 1 and the first bad place
 * otherwise. Under a small budget with an SSD tier the walk reads the log in address order. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

static uint64_t word(size_t i, uint64_t *x) {
    *x = *x * 6364136223846793005ULL + 1442695040888963407ULL;
    return ((*x >> 60) * 0x0101010101010101ULL) ^ i;
}

int main(int argc, char **argv) {
    if (argc != 3) {
        fprintf(stderr, "usage: walk MIB PASSES\n");
        return 2;
    }
    size_t n = (size_t)atoi(argv[1]) << 20;
    int passes = atoi(argv[2]);
    uint64_t *p = malloc(n);
    if (!p) {
        perror("malloc");
        return 2;
    }
    uint64_t x = 1;
    for (size_t i = 0; i < n / 8; i++) p[i] = word(i, &x);
    for (int r = 0; r < passes; r++) {
        x = 1;
        for (size_t i = 0; i < n / 8; i++) {
            if (p[i] != word(i, &x)) {
                printf("bad word %zu in pass %d\n", i, r);
                return 1;
            }
        }
    }
    printf("ok\n");
    return 0;
}
