/* System calls into an evicted heap on the signal route (zmem run --fault-route signal): the
 * kernel reads or writes the program's buffers from kernel mode, where a missing page fails
 * the call with EFAULT unless zmem's syscall guard brought it back first. Each buffer is
 * evicted (24 MiB of other data touched in a 4M budget) before the call that uses it.
 *
 * usage: guarded_calls MODE [STATIC_BINARY]; prints "MODE: ok" or what went wrong.
 * 0 read/write/pread through a file, paths and stat buffers in the heap
 * 1 a pipe between threads, mutex and condition variable in the heap (futexes)
 * 2 writev/readv with stack iovecs, sendmsg/recvmsg with a heap msghdr
 * 3 poll and epoll_wait arrays in the heap, getdents64, the raw syscall(2) of read
 * 4 signals: the program's own SIGBUS and SIGSYS handlers, every signal blocked, an
 *   alternate stack in the heap
 * 5 exec: a static binary (the inherited filter must trap nothing there), an execve with an
 *   empty environment and a heap argv, io_uring_setup answered ENOSYS
 * 6 fork: a child and a grandchild served through the link, a pipeline through popen, a
 *   raw-forked child; the parent intact
 * 7 async: a timer's handler reads the evicted heap while the main thread faults on it */
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <spawn.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/time.h>
#include <sys/uio.h>
#include <sys/wait.h>
#include <unistd.h>

#include "evicting.h"
static unsigned char *pattern(size_t n, int s) {
    unsigned char *p = malloc(n);
    for (size_t i = 0; i < n; i++) p[i] = (unsigned char)(i * s + i / 4096);
    return p;
}
static int same(const unsigned char *p, size_t n, int s) {
    for (size_t i = 0; i < n; i++) if (p[i] != (unsigned char)(i * s + i / 4096)) return 0;
    return 1;
}

static void files(void) {
    size_t n = 6 << 20;
    unsigned char *data = pattern(n, 3);
    char *path = malloc(64);
    snprintf(path, 64, "/tmp/zmem-guard-%d", getpid());
    struct stat *st = malloc(sizeof *st);
    evict();
    int fd = open(path, O_RDWR | O_CREAT | O_TRUNC, 0600);
    CHECK(fd >= 0, "open of a heap path");
    evict();
    ssize_t w = write(fd, data, n);
    CHECK(w == (ssize_t)n, "write of %zu evicted bytes: %zd", n, w);
    unsigned char *back = malloc(n);
    memset(back, 0, n);
    evict();
    CHECK(pread(fd, back, n, 0) == (ssize_t)n && same(back, n, 3), "pread into an evicted buffer");
    memset(back, 0, n);
    evict();
    lseek(fd, 0, SEEK_SET);
    size_t got = 0;
    while (got < n) { ssize_t r = read(fd, back + got, n - got); if (r <= 0) break; got += r; }
    CHECK(got == n && same(back, n, 3), "read into an evicted buffer: %zu", got);
    evict();
    CHECK(fstat(fd, st) == 0 && st->st_size == (off_t)n, "fstat into the heap");
    evict();
    CHECK(stat(path, st) == 0 && st->st_size == (off_t)n, "stat of a heap path");
    close(fd);
    evict();
    CHECK(unlink(path) == 0, "unlink of a heap path");
}

struct shared { pthread_mutex_t m; pthread_cond_t c; int turn; int pipe[2]; unsigned char *out; size_t n; };
static void *writer(void *arg) {
    struct shared *s = arg;
    for (int k = 0; k < 50; k++) {
        pthread_mutex_lock(&s->m);
        while (s->turn != 1) pthread_cond_wait(&s->c, &s->m);
        s->turn = 0;
        pthread_cond_signal(&s->c);
        pthread_mutex_unlock(&s->m);
    }
    size_t off = 0;
    while (off < s->n) { ssize_t r = write(s->pipe[1], s->out + off, s->n - off); if (r <= 0) break; off += r; }
    close(s->pipe[1]);
    return NULL;
}
static void threads(void) {
    struct shared *s = malloc(sizeof *s);
    pthread_mutex_init(&s->m, NULL);
    pthread_cond_init(&s->c, NULL);
    s->turn = 0;
    s->n = 4 << 20;
    s->out = pattern(s->n, 5);
    CHECK(pipe(s->pipe) == 0, "pipe into the heap");
    pthread_t t;
    pthread_create(&t, NULL, writer, s);
    for (int k = 0; k < 50; k++) {
        if (k % 10 == 0) evict();
        pthread_mutex_lock(&s->m);
        s->turn = 1;
        pthread_cond_signal(&s->c);
        while (s->turn != 0) pthread_cond_wait(&s->c, &s->m);
        pthread_mutex_unlock(&s->m);
    }
    unsigned char *in = malloc(s->n);
    size_t got = 0;
    while (got < s->n) {
        if (got % (1 << 20) == 0) evict();
        ssize_t r = read(s->pipe[0], in + got, s->n - got > 65536 ? 65536 : s->n - got);
        if (r <= 0) break;
        got += r;
    }
    pthread_join(t, NULL);
    CHECK(got == s->n && same(in, s->n, 5), "pipe between threads: %zu bytes", got);
}

static void vectors(void) {
    size_t n = 1 << 20;
    unsigned char *a = pattern(n, 7), *b = pattern(n, 9);
    int sv[2];
    CHECK(socketpair(AF_UNIX, SOCK_STREAM, 0, sv) == 0, "socketpair");
    int big = 8 << 20;
    setsockopt(sv[0], SOL_SOCKET, SO_SNDBUF, &big, sizeof big);
    setsockopt(sv[1], SOL_SOCKET, SO_RCVBUF, &big, sizeof big);
    struct iovec iov[2] = {{a, n}, {b, n}};
    evict();
    ssize_t w = writev(sv[0], iov, 2);
    unsigned char *x = malloc(n), *y = malloc(n);
    struct iovec in[2] = {{x, n}, {y, n}};
    evict();
    size_t got = 0;
    while (got < 2 * n) {
        struct iovec part[2];
        int cnt = 0;
        if (got < n) { part[cnt].iov_base = x + got; part[cnt++].iov_len = n - got; part[cnt].iov_base = y; part[cnt++].iov_len = n; }
        else { part[cnt].iov_base = y + (got - n); part[cnt++].iov_len = 2 * n - got; }
        ssize_t r = readv(sv[1], part, cnt);
        if (r <= 0) break;
        got += r;
    }
    (void)in;
    CHECK(w == (ssize_t)(2 * n) && got == 2 * n && same(x, n, 7) && same(y, n, 9), "writev/readv: %zd %zu", w, got);
    struct msghdr *m = malloc(sizeof *m);
    struct iovec *mv = malloc(sizeof *mv);
    memset(m, 0, sizeof *m);
    mv->iov_base = a; mv->iov_len = n;
    m->msg_iov = mv; m->msg_iovlen = 1;
    evict();
    CHECK(sendmsg(sv[0], m, 0) == (ssize_t)n, "sendmsg from a heap msghdr");
    memset(x, 0, n);
    mv->iov_base = x;
    got = 0;
    while (got < n) {
        evict();
        mv->iov_base = x + got; mv->iov_len = n - got;
        ssize_t r = recvmsg(sv[1], m, 0);
        if (r <= 0) break;
        got += r;
    }
    CHECK(got == n && same(x, n, 7), "recvmsg into a heap msghdr: %zu", got);
}

static void waits(void) {
    int p[2];
    CHECK(pipe(p) == 0, "pipe");
    struct pollfd *pf = malloc(sizeof *pf);
    pf->fd = p[0]; pf->events = POLLIN; pf->revents = 0;
    write(p[1], "x", 1);
    evict();
    CHECK(poll(pf, 1, 1000) == 1 && (pf->revents & POLLIN), "poll with a heap array");
    int ep = epoll_create1(0);
    struct epoll_event *ev = malloc(4 * sizeof *ev);
    ev[0].events = EPOLLIN; ev[0].data.u64 = 0x1234;
    CHECK(epoll_ctl(ep, EPOLL_CTL_ADD, p[0], ev) == 0, "epoll_ctl with a heap event");
    memset(ev, 0, 4 * sizeof *ev);
    evict();
    CHECK(epoll_wait(ep, ev, 4, 1000) == 1 && ev[0].data.u64 == 0x1234, "epoll_wait into the heap");
    char *buf = malloc(1 << 16);
    int d = open("/", O_RDONLY | O_DIRECTORY);
    evict();
    long r = syscall(SYS_getdents64, d, buf, 1 << 16);
    CHECK(r > 0, "getdents64 into the heap: %ld", r);
    evict();
    char *one = malloc(8);
    CHECK(syscall(SYS_read, p[0], one, 1) == 1 && one[0] == 'x', "raw syscall(2) read into the heap");
}

static volatile int own_bus, own_sys, on_alt;
static void bus_handler(int s) { (void)s; own_bus++; }
static void sys_handler(int s, siginfo_t *si, void *c) { (void)s; (void)si; (void)c; own_sys++; }
static char *alt;
static void usr_handler(int s) { (void)s; char here; on_alt = &here >= alt && &here < alt + (1 << 16); }
/* The C library's other ways to set a handler (zstd calls __sysv_signal(SIGBUS, ...) at
 * start): each keeps zmem's handler, so the heap still reads back, and each program handler
 * runs for a SIGBUS that is not zmem's; sysv_signal's runs once, as without zmem. */
/* Declared here: glibc's headers no longer have bsd_signal, and mark sigset deprecated. */
extern __sighandler_t bsd_signal_(int, __sighandler_t) __asm__("bsd_signal");
extern __sighandler_t sigset_(int, __sighandler_t) __asm__("sigset");
static volatile int other_bus;
static void other_bus_handler(int s) { (void)s; other_bus++; }
static void heap_reads_back(const char *after) {
    unsigned char *q = pattern(4 << 20, 13);
    evict();
    CHECK(same(q, 4 << 20, 13), "the heap reads back after %s", after);
    free(q);
}
static void other_ways_to_set_a_handler(void) {
    struct sigaction old;
    CHECK(__sysv_signal(SIGBUS, other_bus_handler) == bus_handler, "__sysv_signal returns the program's handler");
    heap_reads_back("__sysv_signal(SIGBUS)");
    raise(SIGBUS);
    CHECK(other_bus == 1, "the __sysv_signal handler runs: %d", other_bus);
    CHECK(sigaction(SIGBUS, NULL, &old) == 0 && old.sa_handler == SIG_DFL, "a __sysv_signal handler runs once");
    CHECK(bsd_signal_(SIGBUS, other_bus_handler) == SIG_DFL, "bsd_signal returns the default");
    heap_reads_back("bsd_signal(SIGBUS)");
    raise(SIGBUS);
    raise(SIGBUS);
    CHECK(other_bus == 3, "the bsd_signal handler runs every time: %d", other_bus);
    CHECK(sigset_(SIGBUS, bus_handler) == other_bus_handler, "sigset returns the program's handler");
    CHECK(sigset_(SIGBUS, SIG_HOLD) == bus_handler, "sigset(SIG_HOLD) returns the handler");
    heap_reads_back("sigset(SIGBUS)");
    raise(SIGBUS);
    CHECK(own_bus == 2 && other_bus == 3, "the sigset handler runs: %d %d", own_bus, other_bus);
}
static void signals(void) {
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = bus_handler;
    CHECK(sigaction(SIGBUS, &sa, NULL) == 0, "sigaction(SIGBUS)");
    sa.sa_sigaction = sys_handler; sa.sa_flags = SA_SIGINFO;
    CHECK(sigaction(SIGSYS, &sa, NULL) == 0, "sigaction(SIGSYS)");
    raise(SIGBUS);
    raise(SIGSYS);
    CHECK(own_bus == 1 && own_sys == 1, "the program's handlers run: %d %d", own_bus, own_sys);
    struct sigaction old;
    CHECK(sigaction(SIGBUS, NULL, &old) == 0 && old.sa_handler == bus_handler, "sigaction reports the program's handler");
    other_ways_to_set_a_handler();
    /* Every signal blocked, then an evicted page touched and a system call into the heap. */
    unsigned char *p = pattern(4 << 20, 11);
    sigset_t all, prev;
    sigfillset(&all);
    CHECK(sigprocmask(SIG_BLOCK, &all, &prev) == 0, "sigprocmask");
    evict();
    CHECK(same(p, 4 << 20, 11), "the heap reads back with every signal blocked");
    char *b = malloc(16);
    int z = open("/dev/zero", O_RDONLY);
    evict();
    CHECK(read(z, b, 16) == 16, "read with every signal blocked");
    sigprocmask(SIG_SETMASK, &prev, NULL);
    /* An alternate stack in the heap, evicted before the signal comes. */
    alt = malloc(1 << 16);
    stack_t ss = {.ss_sp = alt, .ss_size = 1 << 16, .ss_flags = 0};
    CHECK(sigaltstack(&ss, NULL) == 0, "sigaltstack");
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = usr_handler; sa.sa_flags = SA_ONSTACK;
    sigaction(SIGUSR1, &sa, NULL);
    evict();
    raise(SIGUSR1);
    CHECK(on_alt, "the handler ran on the alternate stack");
}

static void execs(const char *stat_bin) {
    int st = 0;
    pid_t c = fork();
    if (c == 0) { execl(stat_bin, stat_bin, (char *)NULL); _exit(127); }
    waitpid(c, &st, 0);
    CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 0, "a static binary exec'd from a child: status %d", st);
    char **argv = malloc(3 * sizeof *argv);
    argv[0] = strdup("/bin/sh"); argv[1] = strdup("-c"); argv[2] = NULL;
    char *cmd = malloc(64);
    strcpy(cmd, "exit 7");
    char **argv2 = malloc(4 * sizeof *argv2);
    argv2[0] = argv[0]; argv2[1] = argv[1]; argv2[2] = cmd; argv2[3] = NULL;
    char *empty[] = {NULL};
    evict();
    /* posix_spawn shares the parent's memory until the exec (the vfork child is served as the
     * parent). */
    CHECK(posix_spawn(&c, "/bin/sh", NULL, NULL, argv2, empty) == 0, "posix_spawn");
    waitpid(c, &st, 0);
    CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 7, "exec of a heap argv without zmem's environment: status %d", st);
    errno = 0;
    long r = syscall(SYS_io_uring_setup, 8, malloc(128));
    CHECK(r == -1 && errno == ENOSYS, "io_uring_setup: %ld", r);
}

/* Forked children on the signal route ask the program's handler for their faults: a child
 * reads the evicted heap, writes its own copy and allocates anew; a grandchild forked from it
 * does the same; a shell pipeline through popen sees data the parent wrote to it; a child of
 * a raw fork system call (no fork hooks) too; the parent is intact. */
static int child_checks(unsigned char *p, size_t n) {
    if (!same(p, n, 13)) return 1;
    unsigned char *q = pattern(n, 17); /* new heap pages in the child */
    evict();
    for (size_t i = 0; i < n; i += 4096) p[i] = 0;
    if (!same(q, n, 17)) return 2;
    for (size_t i = 0; i < n; i += 4096) if (p[i] != 0) return 3;
    return 0;
}
static void forked(void) {
    size_t n = 4 << 20;
    unsigned char *p = pattern(n, 13);
    evict();
    pid_t c = fork();
    if (c == 0) {
        int r = child_checks(p, n);
        if (r) _exit(r);
        /* The child's own changes are what its child sees. */
        for (size_t i = 0; i < n; i += 4096) p[i] = (unsigned char)(i * 13 + i / 4096);
        evict();
        pid_t g = fork();
        if (g == 0) _exit(child_checks(p, n) ? 4 : 0);
        int gs = 0;
        waitpid(g, &gs, 0);
        _exit(WIFEXITED(gs) ? WEXITSTATUS(gs) : 5);
    }
    int st = 0;
    waitpid(c, &st, 0);
    CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 0, "the child's status: %#x", st);
    CHECK(same(p, n, 13), "the parent's heap after its child");
    /* A pipeline: popen forks a shell that forks again; the parent's heap text goes through. */
    char *cmd = malloc(64);
    strcpy(cmd, "tr a-z A-Z | wc -c");
    char *script = malloc(256);
    snprintf(script, 256, "printf '%%s' %s | %s", "zmem-pipeline-text", cmd);
    evict();
    FILE *out = popen(script, "r");
    CHECK(out != NULL, "popen");
    char *line = malloc(64);
    if (out) {
        CHECK(fgets(line, 64, out) && atoi(line) == 18, "the pipeline's output: %s", line);
        CHECK(pclose(out) == 0, "the pipeline's status");
    }
    /* A raw fork (no hooks): served through the link the program keeps for such children. */
    evict();
    c = (pid_t)syscall(SYS_fork);
    if (c == 0) _exit(child_checks(p, n));
    waitpid(c, &st, 0);
    CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 0, "the raw-forked child's status: %#x", st);
    CHECK(same(p, n, 13), "the parent's heap");
}

/* Asynchronous signals while faults are served: a timer's handler reads the evicted heap
 * every 50 us while the main thread faults on it too. A handler that ran in the middle of zmem
 * serving a fault and faulted itself used to serve a second fault on the same thread (a panic,
 * or a deadlock on the first fault's locks). */
static unsigned char *async_heap;
static volatile unsigned long async_sum, async_ticks;
static void on_alarm(int sig) {
    (void)sig;
    size_t pages = (16 << 20) / 4096, k = async_ticks++;
    async_sum += async_heap[((k * 7919) % pages) * 4096 + 1];
}
static void async_signals(void) {
    size_t n = 16 << 20;
    async_heap = pattern(n, 5);
    signal(SIGALRM, on_alarm);
    struct itimerval it = {{0, 50}, {0, 50}};
    setitimer(ITIMER_REAL, &it, NULL);
    for (int round = 0; round < 3; round++)
        CHECK(same(async_heap, n, 5), "round %d", round);
    struct itimerval off = {{0, 0}, {0, 0}};
    setitimer(ITIMER_REAL, &off, NULL);
    CHECK(async_ticks > 10, "the timer fired %lu times", async_ticks);
}

int main(int argc, char **argv) {
    int mode = atoi(argv[1]);
    static const char *names[] = {"files", "threads", "vectors", "waits", "signals", "execs", "fork", "async"};
    switch (mode) {
    case 0: files(); break;
    case 1: threads(); break;
    case 2: vectors(); break;
    case 3: waits(); break;
    case 4: signals(); break;
    case 5: execs(argv[2]); break;
    case 6: forked(); break;
    case 7: async_signals(); break;
    }
    printf("%s: %s\n", names[mode], bad ? "FAILED" : "ok");
    return bad != 0;
}
