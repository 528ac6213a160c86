/* low_fds: zmem's own descriptors never take the low numbers a program expects from its next
 * open (CPython's test_subprocess passes descriptors by number and checks which are open in
 * the child). Checks that 3..15 are free at main, after heap use that evicts, in a thread, and
 * in a forked child; then that the first open gets a low number. Prints "low_fds: ok". */
#include <fcntl.h>
#include <string.h>
#include <pthread.h>
#include <sys/wait.h>
#include <unistd.h>
#include "evicting.h"

/* Descriptors 3..15 hold nothing zmem makes (an eventfd, a userfaultfd, a socket); what the
 * program inherited from whoever started it is left out. */
static void all_free(const char *where) {
    for (int fd = 3; fd < 16; fd++) {
        char path[64], target[256];
        snprintf(path, sizeof path, "/proc/self/fd/%d", fd);
        ssize_t n = readlink(path, target, sizeof target - 1);
        if (n < 0) continue;
        target[n] = 0;
        CHECK(strncmp(target, "anon_inode:", 11) != 0 && strncmp(target, "socket:", 7) != 0,
              "%s: descriptor %d is %s", where, fd, target);
    }
}

static void *in_thread(void *a) { all_free("thread"); return a; }

int main(void) {
    all_free("main");
    evict();
    all_free("after eviction");
    pthread_t t;
    CHECK(pthread_create(&t, NULL, in_thread, NULL) == 0, "pthread_create");
    pthread_join(t, NULL);
    fflush(stdout);
    pid_t c = fork();
    if (c == 0) {
        all_free("forked child");
        evict();
        _exit(bad ? 1 : 0);
    }
    int st = -1;
    CHECK(c > 0 && waitpid(c, &st, 0) == c && WIFEXITED(st) && WEXITSTATUS(st) == 0,
          "child status %#x", st);
    int fd = open("/dev/null", O_RDONLY);
    CHECK(fd >= 0 && fd < 16, "first open got %d", fd);
    if (bad) return 1;
    printf("low_fds: ok\n");
    return 0;
}
