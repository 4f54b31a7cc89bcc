/* Threads that count, for the ptrace hold tests: progress, signals, thread churn, a stuck thread.
 *
 * usage: hold_counter WORKERS [busy|idle] [alarm=USEC] [churn] [leader-exits] [vfork]
 * WORKERS threads each increment their own counter, once per 200 us nanosleep (default), in a
 * tight loop (busy), or never (idle: they sleep 1 s at a time, for measuring a quiet target).
 * alarm=USEC: a one-shot ITIMER_REAL that its own SIGALRM handler re-arms, so a SIGALRM lost
 * by a tracer ends the chain for good (a periodic timer would lose some by itself, since
 * standard signals coalesce while the process is held).
 * churn: one more thread creates short-lived threads (each lives 0-2 ms) without pause.
 * leader-exits: the main thread hands the command loop to a thread and calls pthread_exit,
 * leaving a zombie leader beside live threads.
 * vfork: one more thread calls vfork(); the child writes "ready vfork=PID" (instead of the
 * main thread's "ready") and pauses, so the parent thread waits in the kernel, killable only,
 * until the child is killed; no ptrace interrupt wakes it. Then that thread counts too.
 * Commands on stdin, one per line: "counts" -> "counts ALARMS CREATED VFORKER C1 C2 ... CN"
 * (CREATED: short-lived threads made; VFORKER: the vfork thread's count after vfork returned).
 * Prints "ready" (unless vfork); exits when its stdin closes (the test that started it ended),
 * the vfork child at the latest after 300 s.
 */
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

#define MAX_WORKERS 1024

enum mode { PACED, BUSY, IDLE };

static enum mode worker_mode = PACED;
static volatile unsigned long counters[MAX_WORKERS];
static volatile unsigned long threads_created;
static volatile unsigned long vforker_counter;
static volatile sig_atomic_t alarms;
static long alarm_usec;
static int workers;

static void arm_alarm(void) {
    struct itimerval once = {{0, 0}, {alarm_usec / 1000000, alarm_usec % 1000000}};
    setitimer(ITIMER_REAL, &once, NULL);
}

static void on_alarm(int sig) {
    (void)sig;
    alarms++;
    arm_alarm();
}

static void *worker(void *arg) {
    long index = (long)arg;
    struct timespec pace = {0, 200000L}, idle = {1, 0};
    for (;;) {
        if (worker_mode == IDLE) {
            nanosleep(&idle, NULL);
            continue;
        }
        counters[index]++;
        if (worker_mode == PACED) nanosleep(&pace, NULL);
    }
    return NULL;
}

static void *short_lived(void *arg) {
    struct timespec life = {0, (long)arg};
    nanosleep(&life, NULL);
    return NULL;
}

static void *churn(void *arg) {
    (void)arg;
    pthread_attr_t attr;
    pthread_attr_init(&attr);
    pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
    pthread_attr_setstacksize(&attr, 64 * 1024);
    struct timespec pause_a_little = {0, 100000L};
    for (unsigned long n = 0;; n++) {
        pthread_t tid;
        long life_ns = (long)((n * 7919) % 2000) * 1000L;
        if (pthread_create(&tid, &attr, short_lived, (void *)life_ns) == 0) threads_created++;
        nanosleep(&pause_a_little, NULL);
    }
    return NULL;
}

static void *vforker(void *arg) {
    (void)arg;
    pid_t child = vfork();
    if (child == 0) {
        /* Only raw system calls here: the child borrows this thread's stack and memory. */
        char line[48] = "ready vfork=";
        long pid = syscall(SYS_getpid);
        char digits[24];
        int n = 0, at = 12;
        do digits[n++] = (char)('0' + pid % 10); while ((pid /= 10) > 0);
        while (n > 0) line[at++] = digits[--n];
        line[at++] = '\n';
        syscall(SYS_write, 1, line, at);
        syscall(SYS_alarm, 300);
        for (;;) syscall(SYS_pause);
    }
    struct timespec pace = {0, 200000L};
    for (;;) {
        vforker_counter++;
        nanosleep(&pace, NULL);
    }
    return NULL;
}

static void *command_loop(void *arg) {
    (void)arg;
    char line[256];
    while (fgets(line, sizeof line, stdin)) {
        if (strncmp(line, "counts", 6) == 0) {
            printf("counts %d %lu %lu", (int)alarms, threads_created, vforker_counter);
            for (int i = 0; i < workers; i++) printf(" %lu", counters[i]);
            printf("\n");
            fflush(stdout);
        }
    }
    exit(0);
}

static void start(void *(*fn)(void *), void *arg) {
    pthread_t tid;
    if (pthread_create(&tid, NULL, fn, arg) != 0) exit(1);
    pthread_detach(tid);
}

int main(int argc, char **argv) {
    if (argc < 2) return 2;
    workers = atoi(argv[1]);
    if (workers < 0 || workers > MAX_WORKERS) return 2;
    int with_churn = 0, leader_exits = 0, with_vfork = 0;
    for (int i = 2; i < argc; i++) {
        if (strcmp(argv[i], "busy") == 0) worker_mode = BUSY;
        else if (strcmp(argv[i], "idle") == 0) worker_mode = IDLE;
        else if (strncmp(argv[i], "alarm=", 6) == 0) alarm_usec = atol(argv[i] + 6);
        else if (strcmp(argv[i], "churn") == 0) with_churn = 1;
        else if (strcmp(argv[i], "leader-exits") == 0) leader_exits = 1;
        else if (strcmp(argv[i], "vfork") == 0) with_vfork = 1;
        else return 2;
    }
    setvbuf(stdout, NULL, _IOLBF, 0);
    if (alarm_usec > 0) {
        struct sigaction sa;
        memset(&sa, 0, sizeof sa);
        sa.sa_handler = on_alarm;
        sa.sa_flags = SA_RESTART;
        sigaction(SIGALRM, &sa, NULL);
        arm_alarm();
    }
    for (long i = 0; i < workers; i++) start(worker, (void *)i);
    if (with_churn) start(churn, NULL);
    if (with_vfork) start(vforker, NULL);
    else printf("ready\n");
    if (leader_exits) {
        start(command_loop, NULL);
        pthread_exit(NULL);
    }
    command_loop(NULL);
    return 0;
}
