/* Busy target that spends its time in malloc/free and verifies its own heap.
 * Usage: busy_heap [THREADS]. Each thread keeps SLOTS live blocks, each filled with a
 * pattern derived from (thread, slot, generation); before a block is freed or replaced
 * its whole content is checked. A mismatch prints "corrupt ..." and aborts. The main
 * thread prints "beat N" every 50 ms (N = total operations so far) so a test can see
 * that the process keeps running. With THREADS = 0 the main thread itself is the only
 * (single-threaded) worker and prints the heartbeat between operations. */
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define SLOTS 512

static atomic_ulong operations;

static double now_seconds(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static unsigned char pattern_byte(unsigned seed, size_t i) {
    return (unsigned char)((seed * 2654435761u + (unsigned)i * 40503u) >> 13);
}

struct slot {
    unsigned char *block;
    size_t size;
    unsigned seed;
};

static void fill(struct slot *s) {
    for (size_t i = 0; i < s->size; i++) s->block[i] = pattern_byte(s->seed, i);
}

static void verify(const struct slot *s, int worker, int index) {
    for (size_t i = 0; i < s->size; i++) {
        if (s->block[i] != pattern_byte(s->seed, i)) {
            printf("corrupt worker %d slot %d byte %zu\n", worker, index, i);
            fflush(stdout);
            abort();
        }
    }
}

/* One step: replace a pseudo-random slot with a new block of a pseudo-random size. */
static void step(struct slot *slots, unsigned *rng, int worker) {
    *rng = *rng * 1103515245u + 12345u;
    int index = (int)((*rng >> 8) % SLOTS);
    struct slot *s = &slots[index];
    if (s->block) {
        verify(s, worker, index);
        free(s->block);
    }
    s->size = 16 + ((*rng >> 4) % 240);
    s->seed = *rng;
    s->block = malloc(s->size);
    if (!s->block) abort();
    fill(s);
    atomic_fetch_add_explicit(&operations, 1, memory_order_relaxed);
}

static void *worker(void *arg) {
    int id = (int)(intptr_t)arg;
    struct slot *slots = calloc(SLOTS, sizeof *slots);
    unsigned rng = 7u + (unsigned)id * 31u;
    for (;;) step(slots, &rng, id);
    return NULL;
}

int main(int argc, char **argv) {
    int threads = argc > 1 ? atoi(argv[1]) : 0;
    setvbuf(stdout, NULL, _IOLBF, 0);
    for (int i = 0; i < threads; i++) {
        pthread_t tid;
        if (pthread_create(&tid, NULL, worker, (void *)(intptr_t)(i + 1)) != 0) return 2;
    }
    printf("ready %d\n", threads);
    double next_beat = now_seconds() + 0.05;
    if (threads == 0) {
        struct slot *slots = calloc(SLOTS, sizeof *slots);
        unsigned rng = 7u;
        for (unsigned long n = 0;; n++) {
            step(slots, &rng, 0);
            if ((n & 1023) == 0 && now_seconds() >= next_beat) {
                printf("beat %lu\n", (unsigned long)atomic_load(&operations));
                next_beat = now_seconds() + 0.05;
            }
        }
    }
    for (;;) {
        usleep(50000);
        printf("beat %lu\n", (unsigned long)atomic_load(&operations));
    }
}
