/* Multi-arena fragmented heap for trim tests.
 *
 * usage: trim_fragmented THREADS BLOCKS_PER_THREAD BLOCK_BYTES KEEP_EVERY
 * Each thread (its own arena) allocates BLOCKS_PER_THREAD blocks, writes them, then frees all
 * but every KEEP_EVERY-th block and the last one. The kept blocks split the free space into runs
 * of KEEP_EVERY-1 blocks: some runs hold whole pages (trim can release them), the page-straddling
 * edges cannot. Threads stay parked (not exited) so each keeps its arena attached. The main
 * thread prints "ready" and sleeps in nanosleep, a safe point, for at most 300 s.
 */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static size_t blocks_per_thread, block_bytes, keep_every;
static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t done_cond = PTHREAD_COND_INITIALIZER;
static pthread_cond_t park_cond = PTHREAD_COND_INITIALIZER;
static int finished;

static void *worker(void *arg) {
    (void)arg;
    char **blocks = calloc(blocks_per_thread, sizeof *blocks);
    if (!blocks) abort();
    for (size_t i = 0; i < blocks_per_thread; i++) {
        blocks[i] = malloc(block_bytes);
        if (!blocks[i]) abort();
        memset(blocks[i], 0x5a, block_bytes);
    }
    for (size_t i = 0; i + 1 < blocks_per_thread; i++) {
        if (i % keep_every != 0) free(blocks[i]);
    }
    pthread_mutex_lock(&lock);
    finished++;
    pthread_cond_broadcast(&done_cond);
    for (;;) pthread_cond_wait(&park_cond, &lock); /* parked until the process ends */
    return NULL;
}

int main(int argc, char **argv) {
    if (argc != 5) {
        fprintf(stderr, "usage: %s THREADS BLOCKS BLOCK_BYTES KEEP_EVERY\n", argv[0]);
        return 2;
    }
    int threads = atoi(argv[1]);
    blocks_per_thread = strtoul(argv[2], NULL, 10);
    block_bytes = strtoul(argv[3], NULL, 10);
    keep_every = strtoul(argv[4], NULL, 10);
    if (threads < 1 || blocks_per_thread < 2 || block_bytes < 1 || keep_every < 1) return 2;
    for (int t = 0; t < threads; t++) {
        pthread_t id;
        if (pthread_create(&id, NULL, worker, NULL) != 0) abort();
        /* One at a time, so each thread meets no contention and gets a fresh arena. */
        pthread_mutex_lock(&lock);
        while (finished < t + 1) pthread_cond_wait(&done_cond, &lock);
        pthread_mutex_unlock(&lock);
    }
    printf("ready threads=%d\n", threads);
    fflush(stdout);
    for (int i = 0; i < 300; i++) sleep(1);
    return 0;
}
