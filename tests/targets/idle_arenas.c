/* Idle multi-threaded target with many malloc arenas: each worker thread allocates a
 * fragmented heap (every other block freed) in its own arena, then all threads sleep.
 * Usage: idle_arenas [THREADS] [BLOCKS_PER_THREAD]. Prints "ready THREADS" when set up. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static pthread_barrier_t barrier;
static int blocks_per_thread = 2000;

static void *worker(void *arg) {
    (void)arg;
    void **blocks = calloc((size_t)blocks_per_thread, sizeof(void *));
    for (int i = 0; i < blocks_per_thread; i++) {
        size_t size = 64 + (size_t)(i % 37) * 48;
        blocks[i] = malloc(size);
        memset(blocks[i], 0x5a, size);
    }
    for (int i = 0; i < blocks_per_thread; i += 2) {
        free(blocks[i]);
        blocks[i] = NULL;
    }
    pthread_barrier_wait(&barrier);
    for (;;) pause();
    return NULL;
}

int main(int argc, char **argv) {
    int threads = argc > 1 ? atoi(argv[1]) : 8;
    if (argc > 2) blocks_per_thread = atoi(argv[2]);
    pthread_barrier_init(&barrier, NULL, (unsigned)threads + 1);
    for (int i = 0; i < threads; i++) {
        pthread_t tid;
        if (pthread_create(&tid, NULL, worker, NULL) != 0) return 2;
    }
    pthread_barrier_wait(&barrier);
    printf("ready %d\n", threads);
    fflush(stdout);
    for (;;) pause();
}
