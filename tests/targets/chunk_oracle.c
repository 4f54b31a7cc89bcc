/* The oracle of the chunk walk (tests/integration/test_heap_chunks.py): allocates a known
 * population in the main arena and in THREADS thread arenas, frees a known part of it, and
 * writes every pointer it holds or freed to the file argv[1], one per line:
 *   L <ptr> <malloc_usable_size>   a live allocation
 *   F <ptr>                        freed (now in tcache, a fastbin, a bin, or merged)
 *   M <ptr> <malloc_usable_size>   a live allocation above the mmap threshold
 * then prints "ready" and sleeps (its threads too), allocating nothing more. */
#include <malloc.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define THREADS 3
#define PER_THREAD 4000

static FILE *out;
static pthread_mutex_t out_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_barrier_t barrier;
static unsigned seed_of[THREADS + 1];

static size_t pick(unsigned *seed) {
    unsigned r = rand_r(seed) % 100;
    if (r < 50) return 8 + rand_r(seed) % 120;     /* fastbin / tcache sizes */
    if (r < 90) return 128 + rand_r(seed) % 900;   /* small bins, tcache up to 1032 */
    if (r < 99) return 1100 + rand_r(seed) % 6000; /* larger */
    return 200000 + rand_r(seed) % 50000;          /* mmapped */
}

static void populate(int which) {
    unsigned seed = seed_of[which];
    void *ptrs[PER_THREAD];
    size_t sizes[PER_THREAD];
    for (int i = 0; i < PER_THREAD; i++) {
        sizes[i] = pick(&seed);
        ptrs[i] = malloc(sizes[i]);
        memset(ptrs[i], 0x41 + which, sizes[i] < 64 ? sizes[i] : 64);
    }
    /* Free every third: tcache takes the first 7 of a size, fastbins and bins the rest. */
    pthread_mutex_lock(&out_lock);
    for (int i = 0; i < PER_THREAD; i++) {
        if (i % 3 == 1) {
            fprintf(out, "F %p\n", ptrs[i]);
            free(ptrs[i]);
            ptrs[i] = NULL;
        }
    }
    for (int i = 0; i < PER_THREAD; i++) {
        if (ptrs[i] != NULL)
            fprintf(out, "%c %p %zu\n", sizes[i] >= 200000 ? 'M' : 'L', ptrs[i],
                    malloc_usable_size(ptrs[i]));
    }
    pthread_mutex_unlock(&out_lock);
}

static void *thread_main(void *arg) {
    int which = (int)(long)arg;
    populate(which);
    pthread_barrier_wait(&barrier);
    for (;;) pause();
    return NULL;
}

int main(int argc, char **argv) {
    static char buffer[1 << 16];
    if (argc < 2) return 2;
    setvbuf(stdout, NULL, _IONBF, 0); /* "ready" then allocates no stdout buffer */
    out = fopen(argv[1], "w");
    if (out == NULL) return 2;
    setvbuf(out, buffer, _IOFBF, sizeof buffer); /* a static buffer: the file allocates once */
    for (int i = 0; i <= THREADS; i++) seed_of[i] = 1234 + 77 * i;
    pthread_barrier_init(&barrier, NULL, THREADS + 1);
    pthread_t threads[THREADS];
    for (long t = 0; t < THREADS; t++) pthread_create(&threads[t], NULL, thread_main, (void *)(t + 1));
    populate(0);
    pthread_barrier_wait(&barrier);
    fclose(out);
    printf("ready\n");
    fflush(stdout);
    for (;;) pause();
}
