/* posix_spawn with its file actions and attributes in the (evicted) heap, as ninja spawns every
 * build step: addopen of a path glibc keeps in the heap, adddup2, addclose, addchdir (glibc
 * 2.29+), a signal mask and SETSIGDEF in the attributes. The spawn child runs in the parent's
 * memory with every signal handler reset to the default, so on the signal route it can serve
 * neither a fault nor a trapped call: its openat of the heap path was trapped and the child
 * died of SIGSYS (ninja: "FAILED" with no output; cmake: "the C++ compiler is broken").
 * Then popen and system, whose spawn is glibc's own, with the command and the environment in
 * the evicted heap.
 * Usage: spawn_actions DIR (a directory to write in). */
#define _GNU_SOURCE
#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "evicting.h"

extern char **environ;

int main(int argc, char **argv) {
    const char *dir = argc > 1 ? argv[1] : "/tmp";
    for (int round = 0; round < 3; round++) {
        posix_spawn_file_actions_t *fa = malloc(sizeof *fa);
        posix_spawnattr_t *attr = malloc(sizeof *attr);
        CHECK(posix_spawn_file_actions_init(fa) == 0, "actions init");
        CHECK(posix_spawnattr_init(attr) == 0, "attr init");
        char *out = malloc(4096);
        snprintf(out, 4096, "%s/spawned-%d.txt", dir, round);
        char *path = strdup(out);
        /* stdout to the file, stdin from /dev/null, into the directory, fd 9 closed. */
        CHECK(posix_spawn_file_actions_addopen(fa, 1, path, O_WRONLY | O_CREAT | O_TRUNC, 0644) == 0, "addopen");
        char *devnull = strdup("/dev/null");
        CHECK(posix_spawn_file_actions_addopen(fa, 0, devnull, O_RDONLY, 0) == 0, "addopen null");
        CHECK(posix_spawn_file_actions_adddup2(fa, 1, 2) == 0, "adddup2");
        CHECK(posix_spawn_file_actions_addclose(fa, 9) == 0, "addclose");
        char *cd = strdup(dir);
        CHECK(posix_spawn_file_actions_addchdir_np(fa, cd) == 0, "addchdir");
        sigset_t mask, def;
        sigemptyset(&mask);
        sigfillset(&def);
        sigdelset(&def, SIGKILL);
        sigdelset(&def, SIGSTOP);
        CHECK(posix_spawnattr_setsigmask(attr, &mask) == 0, "setsigmask");
        CHECK(posix_spawnattr_setsigdefault(attr, &def) == 0, "setsigdefault");
        CHECK(posix_spawnattr_setflags(attr, POSIX_SPAWN_SETSIGMASK | POSIX_SPAWN_SETSIGDEF) == 0, "setflags");
        char **args = malloc(4 * sizeof *args);
        args[0] = strdup("sh");
        args[1] = strdup("-c");
        char word[64];
        snprintf(word, sizeof word, "echo spawned round %d in $(pwd)", round);
        args[2] = strdup(word);
        args[3] = NULL;
        evict();
        pid_t pid = 0;
        int e = posix_spawnp(&pid, args[0], fa, attr, args, environ);
        CHECK(e == 0, "posix_spawnp: %s", strerror(e));
        int status = 0;
        if (e == 0) CHECK(waitpid(pid, &status, 0) == pid, "waitpid");
        CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0, "round %d: status %#x", round, status);
        char want[4200], got[4200] = {0};
        snprintf(want, sizeof want, "spawned round %d in %s\n", round, dir);
        FILE *f = fopen(out, "r");
        CHECK(f != NULL, "%s", out);
        if (f) {
            size_t n = fread(got, 1, sizeof got - 1, f);
            got[n] = 0;
            fclose(f);
        }
        CHECK(strcmp(got, want) == 0, "round %d wrote %s", round, got);
        posix_spawn_file_actions_destroy(fa);
        posix_spawnattr_destroy(attr);
        free(fa); free(attr); free(out); free(path); free(devnull); free(cd);
        for (int k = 0; k < 3; k++) free(args[k]);
        free(args);
    }
    /* popen and system: glibc's own spawn (not posix_spawn above) runs `sh -c` with the
     * command and the environment in the evicted heap. Its child got EFAULT from execve for
     * an evicted command and exited 127: popen read nothing. */
    char *val = malloc(64);
    snprintf(val, 64, "word-%d", (int)getpid());
    CHECK(setenv("ZMEM_SPAWN_WORD", val, 1) == 0, "setenv");
    for (int round = 0; round < 3; round++) {
        char *cmd = malloc(256);
        snprintf(cmd, 256, "echo popen round %d $ZMEM_SPAWN_WORD", round);
        char *mode = strdup("r");
        evict();
        FILE *p = popen(cmd, mode);
        CHECK(p != NULL, "popen");
        char got[256] = {0};
        if (p) {
            size_t n = fread(got, 1, sizeof got - 1, p);
            got[n] = 0;
            int st = pclose(p);
            CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 0, "pclose: status %#x", st);
        }
        char want[256];
        snprintf(want, sizeof want, "popen round %d %s\n", round, val);
        CHECK(strcmp(got, want) == 0, "popen round %d read '%s'", round, got);
        snprintf(cmd, 256, "test \"$ZMEM_SPAWN_WORD\" = %s && exit %d", val, 10 + round);
        evict();
        int st = system(cmd);
        CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 10 + round, "system round %d: status %#x", round, st);
        free(cmd);
        free(mode);
    }
    printf(bad ? "spawn: %d failed\n" : "spawn: ok\n", bad);
    return bad != 0;
}
