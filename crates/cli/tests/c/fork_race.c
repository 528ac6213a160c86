// Forks while other threads fault, free and move memory: the child must see the parent's memory
// as it was at the fork, every page of it.
//
// Two reader threads read random pages of a set of pages (each page's bytes depend on its
// index) and check them, faulting evicted pages back in; a mover thread frees, reallocates
// (256 <-> 512 KiB, moved by zmem rather than copied) and refills a set of large blocks under a
// mutex, which the main thread holds across each fork so that no block is half moved in the
// child. Each child checks every page and every block (content from the block's number and
// generation) and exits 1 with a count of wrong ones. On the signal route zmem once mapped
// pages (and freed and moved stored ones) between a fork's copy of the page tables and the
// child's snapshot: 24 to 30 children of 40 saw wrong pages.
//
// usage: fork_race MB FORKS   (prints "ok FORKS")
#define _GNU_SOURCE
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#define BLOCKS 16
#define SMALL (256 << 10)
#define LARGE (512 << 10)

static size_t npages;
static unsigned char **pages;
static atomic_int stop;
static atomic_ulong bad_reads;

static pthread_mutex_t blocks_lock = PTHREAD_MUTEX_INITIALIZER;
static unsigned char *block[BLOCKS];
static size_t block_len[BLOCKS];
static unsigned gen[BLOCKS];

static unsigned char page_byte(size_t i, int k) { return (unsigned char)(i * 7 + k / 512); }
static unsigned char block_byte(int j, unsigned g, size_t k) {
    return (unsigned char)(j * 31 + g * 13 + k / 4096);
}

static int page_ok(size_t i) {
    for (int k = 0; k < 4096; k += 512)
        if (pages[i][k] != page_byte(i, k)) return 0;
    return 1;
}

static int block_ok(int j) {
    for (size_t k = 0; k < block_len[j]; k += 1024)
        if (block[j][k] != block_byte(j, gen[j], k)) return 0;
    return 1;
}

static void fill_block(int j) {
    for (size_t k = 0; k < block_len[j]; k += 1024) block[j][k] = block_byte(j, gen[j], k);
}

static void *reader(void *arg) {
    unsigned long x = (unsigned long)arg * 2654435761u + 1;
    while (!atomic_load(&stop)) {
        x = x * 6364136223846793005ul + 1442695040888963407ul;
        if (!page_ok((x >> 17) % npages)) atomic_fetch_add(&bad_reads, 1);
    }
    return NULL;
}

static void *mover(void *arg) {
    (void)arg;
    unsigned long x = 99;
    while (!atomic_load(&stop)) {
        x = x * 6364136223846793005ul + 1442695040888963407ul;
        int j = (int)((x >> 33) % BLOCKS);
        pthread_mutex_lock(&blocks_lock);
        if (!block_ok(j)) atomic_fetch_add(&bad_reads, 1);
        if (x & (1ul << 20)) {
            // Moved: the pages keep their content, and the rest is written.
            size_t len = block_len[j] == SMALL ? LARGE : SMALL;
            unsigned char *p = realloc(block[j], len);
            if (p) {
                block[j] = p;
                block_len[j] = len;
            }
        } else {
            free(block[j]);
            block[j] = malloc(block_len[j]);
            if (!block[j]) abort();
        }
        gen[j]++;
        fill_block(j);
        pthread_mutex_unlock(&blocks_lock);
    }
    return NULL;
}

int main(int argc, char **argv) {
    size_t mb = argc > 1 ? (size_t)atoi(argv[1]) : 32;
    int forks = argc > 2 ? atoi(argv[2]) : 40;
    npages = mb * 256;
    pages = malloc(npages * sizeof *pages);
    for (size_t i = 0; i < npages; i++) {
        pages[i] = aligned_alloc(4096, 4096);
        for (int k = 0; k < 4096; k++) pages[i][k] = page_byte(i, k);
    }
    for (int j = 0; j < BLOCKS; j++) {
        block_len[j] = SMALL;
        block[j] = malloc(SMALL);
        fill_block(j);
    }
    pthread_t t[3];
    pthread_create(&t[0], NULL, reader, (void *)1);
    pthread_create(&t[1], NULL, reader, (void *)2);
    pthread_create(&t[2], NULL, mover, NULL);
    int bad_children = 0;
    for (int f = 0; f < forks; f++) {
        pthread_mutex_lock(&blocks_lock);
        pid_t pid = fork();
        if (pid == 0) {
            size_t bad = 0, bad_blocks = 0;
            for (size_t i = 0; i < npages; i++) bad += !page_ok(i);
            for (int j = 0; j < BLOCKS; j++) bad_blocks += !block_ok(j);
            if (bad || bad_blocks) {
                fprintf(stderr, "fork %d: the child saw %zu wrong pages of %zu, %zu wrong blocks\n",
                        f, bad, npages, bad_blocks);
                _exit(1);
            }
            _exit(0);
        }
        pthread_mutex_unlock(&blocks_lock);
        int st;
        if (pid < 0 || waitpid(pid, &st, 0) != pid || !WIFEXITED(st) || WEXITSTATUS(st) != 0)
            bad_children++;
    }
    atomic_store(&stop, 1);
    for (int i = 0; i < 3; i++) pthread_join(t[i], NULL);
    if (bad_children || atomic_load(&bad_reads)) {
        printf("bad: %d children of %d, %lu reads in the parent\n", bad_children, forks,
               atomic_load(&bad_reads));
        return 1;
    }
    printf("ok %d\n", forks);
    return 0;
}
