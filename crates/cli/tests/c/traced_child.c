/* A debugger's `run` (gdb's): vfork, PTRACE_TRACEME in the child, then exec with the argument
 * and environment strings in the (evicted) heap; the parent traces the program like a debugger
 * that passes every signal on (the exec'd program runs under zmem too, and on the signal route
 * its faults and traps are signals its tracer sees: counted, "signals passed on"). On the
 * signal route the child used to fault on the parent's heap right after TRACEME, stop for its
 * tracer, and the tracer, still inside vfork, never let it go on: gdb hung at `run`.
 * Usage: traced_child PROGRAM (an echo). */
#include <string.h>
#include <sys/ptrace.h>
#include <sys/wait.h>
#include <unistd.h>

#include "evicting.h"

extern char **environ;

int main(int argc, char **argv) {
    const char *prog = argc > 1 ? argv[1] : "/bin/echo";
    size_t nenv = 0;
    while (environ[nenv]) nenv++;
    /* The strings and arrays the exec reads, in the heap, as gdb keeps them. */
    char **env = malloc((nenv + 1) * sizeof *env);
    for (size_t i = 0; i < nenv; i++) env[i] = strdup(environ[i]);
    env[nenv] = NULL;
    char **args = malloc(4 * sizeof *args);
    args[0] = strdup(prog);
    args[1] = strdup("traced");
    args[3] = NULL;
    int passed = 0; /* signals other than the exec's SIGTRAP: zmem's, on the signal route */
    for (int round = 0; round < 3; round++) {
        char word[16];
        snprintf(word, sizeof word, "round-%d", round);
        args[2] = strdup(word);
        evict();
        pid_t pid = vfork();
        if (pid == 0) {
            ptrace(PTRACE_TRACEME, 0, NULL, NULL);
            execve(args[0], args, env);
            _exit(127);
        }
        CHECK(pid > 0, "vfork");
        /* Stopped at the exec (SIGTRAP), then at whatever signals the program gets: each is
         * passed on, as `handle ... pass` would. */
        int status = 0, stops = 0;
        for (;;) {
            if (waitpid(pid, &status, 0) != pid) {
                CHECK(0, "waitpid");
                break;
            }
            if (WIFEXITED(status) || WIFSIGNALED(status)) break;
            int sig = WSTOPSIG(status);
            if (stops++ == 0) CHECK(sig == SIGTRAP, "first stop by signal %d, not the exec's SIGTRAP", sig);
            else if (sig != SIGTRAP) passed++;
            if (ptrace(PTRACE_CONT, pid, NULL, (void *)(long)(sig == SIGTRAP ? 0 : sig)) != 0) {
                CHECK(0, "PTRACE_CONT");
                break;
            }
        }
        CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0, "round %d: status %#x", round, status);
        CHECK(stops >= 1, "round %d: the program was not traced", round);
        free(args[2]);
    }
    fflush(stdout);
    printf("signals passed on: %d\n", passed);
    printf(bad ? "traced: %d failed\n" : "traced: ok\n", bad);
    return bad != 0;
}
