/* Holds another process under ptrace (PTRACE_SEIZE: the tracee keeps running), the way a
 * debugger or strace would, so that tests can check that an already-traced target is
 * refused. Usage: tracer PID. Prints "ready" once attached; detaches when killed. */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/ptrace.h>
#include <unistd.h>

int main(int argc, char **argv) {
    if (argc < 2) return 2;
    pid_t pid = (pid_t)atoi(argv[1]);
    if (ptrace(PTRACE_SEIZE, pid, NULL, NULL) != 0) {
        perror("PTRACE_SEIZE");
        return 1;
    }
    printf("ready\n");
    fflush(stdout);
    for (;;) pause();
}
