/* The classic case on any glibc, plus fragmented thread arenas, then idle.
 *
 * usage: freed_arenas BLOCKS BLOCK_BYTES THREADS THREAD_BLOCKS
 * The main thread mallocs BLOCKS blocks of BLOCK_BYTES, writes them, and frees all but the
 * last (200000 x 1024: ~200 MiB free in one chunk of the main arena that the last block keeps
 * from the top). Then THREADS threads, one at a time so each gets its own arena, malloc
 * THREAD_BLOCKS blocks cycling through 40, 1024, 100, 6144, 40 and 12288 bytes, write them
 * and free all but every 8th and the last: small chunks land in fastbins (48 and 112 bytes,
 * not the 32-byte one) beyond tcache's 7, the big ones in the unsorted bin with whole pages
 * inside. The threads stay parked so their arenas stay attached; the main thread prints
 * "ready glibc=VERSION threads=THREADS" and sleeps in sleep() (a safe point) for at most
 * 600 s.
 */
#include <gnu/libc-version.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static const size_t thread_sizes[] = {40, 1024, 100, 6144, 40, 12288};
static size_t thread_blocks;
static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t done_cond = PTHREAD_COND_INITIALIZER;
static pthread_cond_t park_cond = PTHREAD_COND_INITIALIZER;
static int finished;

static void *worker(void *arg) {
    (void)arg;
    char **blocks = calloc(thread_blocks, sizeof *blocks);
    if (!blocks) abort();
    size_t kinds = sizeof thread_sizes / sizeof thread_sizes[0];
    for (size_t i = 0; i < thread_blocks; i++) {
        size_t size = thread_sizes[i % kinds];
        blocks[i] = malloc(size);
        if (!blocks[i]) abort();
        memset(blocks[i], 0x5a, size);
    }
    for (size_t i = 0; i + 1 < thread_blocks; i++) {
        if (i % 8 != 0) free(blocks[i]);
    }
    pthread_mutex_lock(&lock);
    finished++;
    pthread_cond_broadcast(&done_cond);
    for (;;) pthread_cond_wait(&park_cond, &lock); /* parked until the process ends */
    return NULL;
}

int main(int argc, char **argv) {
    if (argc != 5) {
        fprintf(stderr, "usage: %s BLOCKS BLOCK_BYTES THREADS THREAD_BLOCKS\n", argv[0]);
        return 2;
    }
    size_t count = strtoul(argv[1], NULL, 10);
    size_t size = strtoul(argv[2], NULL, 10);
    int threads = atoi(argv[3]);
    thread_blocks = strtoul(argv[4], NULL, 10);
    if (count < 2 || size < 1 || threads < 0 || (threads > 0 && thread_blocks < 2)) return 2;

    char **blocks = malloc(count * sizeof *blocks);
    if (!blocks) abort();
    for (size_t i = 0; i < count; i++) {
        blocks[i] = malloc(size);
        if (!blocks[i]) abort();
        memset(blocks[i], 0x5a, size);
    }
    for (size_t i = 0; i + 1 < count; i++) free(blocks[i]);

    for (int t = 0; t < threads; t++) {
        pthread_t id;
        if (pthread_create(&id, NULL, worker, NULL) != 0) abort();
        /* One at a time, so each thread meets no contention and gets a fresh arena. */
        pthread_mutex_lock(&lock);
        while (finished < t + 1) pthread_cond_wait(&done_cond, &lock);
        pthread_mutex_unlock(&lock);
    }
    printf("ready glibc=%s threads=%d\n", gnu_get_libc_version(), threads);
    fflush(stdout);
    for (int i = 0; i < 600; i++) sleep(1);
    return 0;
}
