/* A forked server's heap: every page of it shared copy-on-write with a child, for the rule
 * that reading a target changes nothing in it (a read that pinned the pages would make the
 * kernel give this process a private copy of each page it read).
 *
 * usage: forked_heap [MAIN_MIB [THREAD_MIB]]
 * The main arena gets MAIN_MIB (default 40) of 4,000-byte blocks and a worker thread's arena
 * THREAD_MIB (default 8) of 1,000-byte ones; every sixteenth block of the main arena is freed
 * (its free lists on an eighth of its pages: it is read the way a big arena is, the pages its
 * lists lie on), every other one of the worker's.
 * Then the process forks: the child only sleeps (and dies with its parent), so each heap page
 * stays shared, but for those of the main arena's blocks the parent frees after the fork
 * (every thirty-second, eight blocks on): written since, they are its own. Prints
 * "ready CHILD_PID BLOCK_ADDRESS" (a live block of the main arena, never written after the
 * fork, hex) and sleeps until killed. */
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <unistd.h>

static size_t thread_mib = 8;

static void **fragment(size_t total_bytes, size_t block_bytes, size_t stride) {
    size_t count = total_bytes / block_bytes;
    void **blocks = calloc(count, sizeof(void *));
    if (blocks == NULL) exit(2);
    for (size_t i = 0; i < count; i++) {
        blocks[i] = malloc(block_bytes);
        if (blocks[i] == NULL) exit(2);
        memset(blocks[i], (int)(i & 0xff) | 1, block_bytes);
    }
    for (size_t i = 0; i < count; i += stride) {
        free(blocks[i]);
        blocks[i] = NULL;
    }
    return blocks;
}

static void *worker(void *arg) {
    (void)arg;
    fragment(thread_mib << 20, 1000, 2);
    return NULL;
}

int main(int argc, char **argv) {
    size_t main_mib = argc > 1 ? strtoul(argv[1], NULL, 10) : 40;
    if (argc > 2) thread_mib = strtoul(argv[2], NULL, 10);
    void **blocks = fragment(main_mib << 20, 4000, 16);
    pthread_t thread;
    /* The worker's arena stays after it ends (glibc keeps an arena for the next thread). */
    if (pthread_create(&thread, NULL, worker, NULL) != 0 || pthread_join(thread, NULL) != 0)
        return 2;
    pid_t parent = getpid();
    pid_t child = fork();
    if (child < 0) return 2;
    if (child == 0) {
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        if (getppid() != parent) _exit(0);
        for (;;) pause();
    }
    size_t count = (main_mib << 20) / 4000;
    for (size_t i = 8; i < count; i += 32) {
        free(blocks[i]);
        blocks[i] = NULL;
    }
    printf("ready %d %p\n", (int)child, blocks[1]);
    fflush(stdout);
    for (;;) pause();
}
