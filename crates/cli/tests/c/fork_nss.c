// fork() after glibc's NSS state was evicted. getpwuid() makes glibc keep its NSS state in
// malloc'd memory (the program heap); filling MIB MiB then evicts that page at a small budget.
// glibc's fork() locks that state after the pthread_atfork prepare hooks ran
// (__nss_database_fork_prepare_parent), so the forking thread faults while zmem's handlers are
// parked for the fork. Forks ROUNDS times; each child checks the data and the NSS answer.
//
// usage: fork_nss MIB ROUNDS   (prints "ok")
#include <pwd.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

static unsigned word(size_t i) { return (unsigned)((i % 1000) * 7 + (i >> 12)); }

int main(int argc, char **argv) {
    if (argc != 3) {
        fprintf(stderr, "usage: fork_nss MIB ROUNDS\n");
        return 2;
    }
    struct passwd *pw = getpwuid(getuid());
    if (!pw) return 3;
    char *name = strdup(pw->pw_name);
    size_t words = ((size_t)atoi(argv[1]) << 20) / sizeof(unsigned);
    int rounds = atoi(argv[2]);
    for (int r = 0; r < rounds; r++) {
        unsigned *p = malloc(words * sizeof(unsigned));
        if (!p) return 4;
        for (size_t i = 0; i < words; i++) p[i] = word(i);
        pid_t pid = fork();
        if (pid < 0) return 5;
        if (pid == 0) {
            size_t bad = 0;
            for (size_t i = 0; i < words; i++) bad += p[i] != word(i);
            struct passwd *again = getpwuid(getuid());
            _exit(bad ? 1 : !again || strcmp(again->pw_name, name) ? 7 : 0);
        }
        int st;
        if (waitpid(pid, &st, 0) != pid || !WIFEXITED(st) || WEXITSTATUS(st)) {
            printf("round %d: child failed (%d)\n", r, WIFEXITED(st) ? WEXITSTATUS(st) : -1);
            return 6;
        }
        free(p);
    }
    printf("ok\n");
    return 0;
}
