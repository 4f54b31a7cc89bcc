/* Benchmark target: 16 worker threads each build a fragmented heap in their own arena and
 * go idle; a ticker thread wakes every millisecond and records the longest gap between two
 * wake-ups, i.e. the longest time the process was kept from running (a debugger's pause).
 * Usage: bench_fragmented [THREADS] [BLOCKS]. Reads commands on stdin, one per line:
 * "reset" clears the longest gap, "gap" prints "gap <microseconds>". Prints "ready". */
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static pthread_barrier_t barrier;
static int blocks_per_thread = 20000;
static atomic_long longest_gap_us;

static long now_us(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1000000L + ts.tv_nsec / 1000L;
}

static void *worker(void *arg) {
    (void)arg;
    void **blocks = calloc((size_t)blocks_per_thread, sizeof(void *));
    for (int i = 0; i < blocks_per_thread; i++) {
        size_t size = 32 + (size_t)(i % 61) * 40;
        blocks[i] = malloc(size);
        memset(blocks[i], 0x33, size);
    }
    for (int i = 0; i < blocks_per_thread; i++)
        if (i % 3 != 0) { free(blocks[i]); blocks[i] = NULL; }
    pthread_barrier_wait(&barrier);
    for (;;) pause();
    return NULL;
}

static void *ticker(void *arg) {
    (void)arg;
    struct timespec one_ms = {0, 1000000L};
    long last = now_us();
    for (;;) {
        nanosleep(&one_ms, NULL);
        long now = now_us();
        long gap = now - last;
        last = now;
        long seen = atomic_load(&longest_gap_us);
        while (gap > seen && !atomic_compare_exchange_weak(&longest_gap_us, &seen, gap)) {}
    }
    return NULL;
}

int main(int argc, char **argv) {
    int threads = argc > 1 ? atoi(argv[1]) : 16;
    if (argc > 2) blocks_per_thread = atoi(argv[2]);
    pthread_barrier_init(&barrier, NULL, (unsigned)threads + 1);
    for (int i = 0; i < threads; i++) {
        pthread_t tid;
        if (pthread_create(&tid, NULL, worker, NULL) != 0) return 2;
    }
    pthread_barrier_wait(&barrier);
    pthread_t tick;
    pthread_create(&tick, NULL, ticker, NULL);
    printf("ready %d\n", threads);
    fflush(stdout);
    char line[64];
    while (fgets(line, sizeof line, stdin)) {
        if (strncmp(line, "reset", 5) == 0) {
            atomic_store(&longest_gap_us, 0);
        } else if (strncmp(line, "gap", 3) == 0) {
            printf("gap %ld\n", atomic_load(&longest_gap_us));
            fflush(stdout);
        }
    }
    return 0;
}
