/* A target with many arenas (or one huge free list) and a ticker that feels every stop.
 *
 * usage: many_arenas THREADS BLOCKS
 * Each of THREADS workers allocates BLOCKS small blocks (24..984 bytes) in its own arena
 * (run it with GLIBC_TUNABLES=glibc.malloc.arena_max=N to get one arena per thread beyond
 * glibc's 8-per-core default) and frees every other one: BLOCKS/2 free chunks per arena that
 * cannot coalesce, so malloc_info's walk and document grow with THREADS x BLOCKS. The workers
 * then sleep. A ticker thread wakes every millisecond and records the longest gap between two
 * wake-ups: the longest stop the process felt.
 * Prints "ready threads=T" once every worker is done. Then reads commands on stdin, one per
 * line: "reset" clears the longest gap, "gap" prints "gap <microseconds>". On EOF it keeps
 * sleeping (tests that start it with stdin closed still get a live target).
 */
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static pthread_barrier_t barrier;
static long blocks_per_thread;
static atomic_long longest_gap_us;

static long now_us(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1000000L + ts.tv_nsec / 1000L;
}

static void *worker(void *arg) {
    (void)arg;
    void **blocks = malloc((size_t)blocks_per_thread * sizeof(void *));
    if (!blocks) abort();
    for (long i = 0; i < blocks_per_thread; i++) {
        size_t size = 24 + (size_t)(i % 61) * 16;
        blocks[i] = malloc(size);
        if (!blocks[i]) abort();
        memset(blocks[i], 0x5a, size);
    }
    for (long i = 1; i < blocks_per_thread; i += 2) free(blocks[i]);
    /* A request no free chunk fits sorts the unsorted chunks into their bins, so that
     * malloc_info lists each size range (as in a heap that has lived a while). */
    void *volatile sorter = malloc(64 * 1024 - 64); /* volatile: the pair is not optimised away */
    free(sorter);
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
    if (argc != 3) {
        fprintf(stderr, "usage: %s THREADS BLOCKS\n", argv[0]);
        return 2;
    }
    int threads = atoi(argv[1]);
    blocks_per_thread = atol(argv[2]);
    if (threads < 1 || blocks_per_thread < 2) return 2;
    pthread_barrier_init(&barrier, NULL, (unsigned)threads + 1);
    pthread_attr_t attr;
    pthread_attr_init(&attr);
    pthread_attr_setstacksize(&attr, 256 * 1024); /* thousands of threads: small stacks */
    for (int i = 0; i < threads; i++) {
        pthread_t tid;
        if (pthread_create(&tid, &attr, worker, NULL) != 0) {
            fprintf(stderr, "pthread_create failed at thread %d\n", i);
            return 1;
        }
    }
    pthread_barrier_wait(&barrier);
    pthread_t tick;
    pthread_create(&tick, NULL, ticker, NULL);
    printf("ready threads=%d\n", threads);
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
    for (;;) pause();
}
