/* Multi-threaded fragmentation: every thread allocates blocks of mixed sizes, frees most of
 * them in an interleaved pattern (so the survivors pin holes between free chunks), and the
 * main thread dumps malloc_info while all threads are still alive.
 *
 * usage: threads_fragmented NTHREADS BLOCKS_PER_THREAD OUT.xml
 * Run with GLIBC_TUNABLES=glibc.malloc.arena_max=1 to force every thread into arena 0. */
#include <malloc.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static pthread_barrier_t freed_barrier;
static pthread_barrier_t dumped_barrier;
static size_t blocks_per_thread;

/* xorshift64: a fixed, seedable sequence so every run of the script makes the same pattern. */
static uint64_t next_random(uint64_t *state) {
    uint64_t x = *state;
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    *state = x;
    return x;
}

/* Mostly small objects (fastbin and small-bin sizes), some medium, a few large-bin sizes. */
static size_t pick_size(uint64_t *state) {
    uint64_t r = next_random(state) % 100;
    if (r < 50) return 16 + next_random(state) % 112;
    if (r < 85) return 128 + next_random(state) % 896;
    if (r < 97) return 1024 + next_random(state) % 7168;
    return 8192 + next_random(state) % 57344;
}

static void *worker(void *arg) {
    uint64_t state = 0x9e3779b97f4a7c15ULL ^ (uint64_t)(uintptr_t)arg;
    void **blocks = calloc(blocks_per_thread, sizeof(void *));
    if (blocks == NULL) abort();
    for (size_t i = 0; i < blocks_per_thread; i++) {
        size_t size = pick_size(&state);
        blocks[i] = malloc(size);
        if (blocks[i] == NULL) abort();
        memset(blocks[i], 0xa5, size); /* touch the pages so they count in RSS */
    }
    /* Free about four in five; keep every fifth plus a random few, so live blocks sit
     * between free runs and neither coalescing nor trimming can give the holes back. */
    for (size_t i = 0; i < blocks_per_thread; i++) {
        if (i % 5 != 4 && next_random(&state) % 16 != 0) {
            free(blocks[i]);
            blocks[i] = NULL;
        }
    }
    /* One large request makes malloc sort the whole unsorted list into the small and large
     * bins (consolidating fastbins first), as the next big allocation of a service would. */
    void *large = malloc(60000);
    if (large == NULL) abort();
    /* Then some later frees: beyond the 7 tcache slots per size, small chunks land in
     * fastbins again and larger ones on the unsorted list. */
    for (size_t i = 4; i < blocks_per_thread; i += 25) {
        free(blocks[i]);
        blocks[i] = NULL;
    }
    blocks[0] = blocks[0] ? blocks[0] : large;
    pthread_barrier_wait(&freed_barrier);
    pthread_barrier_wait(&dumped_barrier); /* stay alive until the dump is written */
    return blocks;
}

int main(int argc, char **argv) {
    if (argc != 4) {
        fprintf(stderr, "usage: %s NTHREADS BLOCKS_PER_THREAD OUT.xml\n", argv[0]);
        return 2;
    }
    int nthreads = atoi(argv[1]);
    blocks_per_thread = (size_t)strtoul(argv[2], NULL, 10);
    if (nthreads < 1 || blocks_per_thread < 32) return 2;
    pthread_t *threads = calloc((size_t)nthreads, sizeof(pthread_t));
    if (threads == NULL) return 1;
    pthread_barrier_init(&freed_barrier, NULL, (unsigned)nthreads + 1);
    pthread_barrier_init(&dumped_barrier, NULL, (unsigned)nthreads + 1);
    for (int t = 0; t < nthreads; t++) {
        if (pthread_create(&threads[t], NULL, worker, (void *)(uintptr_t)(t + 1)) != 0) return 1;
    }
    pthread_barrier_wait(&freed_barrier);
    FILE *out = fopen(argv[3], "w");
    if (out == NULL) { perror(argv[3]); return 1; }
    if (malloc_info(0, out) != 0) return 1;
    if (fclose(out) != 0) return 1;
    pthread_barrier_wait(&dumped_barrier);
    for (int t = 0; t < nthreads; t++) pthread_join(threads[t], NULL);
    printf("threads=%d blocks_per_thread=%zu\n", nthreads, blocks_per_thread);
    return 0;
}
