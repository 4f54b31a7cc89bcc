/* A busy multi-threaded service over a fragmented heap, for residency on a moving heap.
 *
 * usage: churn_arenas DIR THREADS BLOCKS WORKING_SET [BURST_OPS [PAUSE_US]]
 *   Every worker thread (each in its own arena while below arena_max) mallocs BLOCKS blocks
 *   of sizes spread over small and large bins (64 … 3000 bytes, every 64th 20,000 bytes so
 *   some free chunks hold whole pages), writes them, frees every
 *   other one (a fragmented heap: free chunks between live ones that cannot merge) and sorts
 *   the unsorted bin into the bins with one request nothing fits. Then it churns: a ring of
 *   WORKING_SET blocks of random sizes (16 … 1024 bytes) freed and malloced again, BURST_OPS
 *   operations at a time with a PAUSE_US sleep between bursts (0 = never sleeps), forever.
 *   So the heap keeps moving under any reader while most of its free memory stays put, as
 *   in a service whose working set is small next to what it once allocated.
 * Prints "ready PID" when every worker has built its heap and started churning, then waits
 * for signals, doing the work in the main thread (no allocator calls from handlers):
 *   SIGUSR1: malloc_info(0) into DIR/dump.xml (FILE opened first), then writes DIR/dump.done
 *   SIGUSR2: malloc_trim(0), then writes its return value into DIR/trim.done
 * A worker checks the pattern of every block it frees; a mismatch prints "corrupt" and
 * aborts, so a reader that damaged the heap would be seen. */
#define _GNU_SOURCE
#include <fcntl.h>
#include <malloc.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static long blocks;
static long working_set;
static long burst_ops = 200;
static long pause_us = 200;
static pthread_barrier_t built;
static atomic_ulong operations;

struct slot {
    unsigned char *block;
    size_t size;
};

static void build_fragmented_heap(unsigned int *seed) {
    void **kept = calloc((size_t)blocks, sizeof(void *));
    if (kept == NULL) abort();
    for (long i = 0; i < blocks; i++) {
        /* Every 64th block is big and freed: a free chunk holding whole pages (what
         * malloc_trim can give back), steady because the churn's small requests fit the
         * smaller free chunks first. */
        size_t size = i % 64 == 62 ? 20000 : 64 + (size_t)(rand_r(seed) % 2937);
        kept[i] = malloc(size);
        if (kept[i] == NULL) abort();
        memset(kept[i], 0x5a, size);
    }
    for (long i = 0; i < blocks; i += 2) {
        free(kept[i]);
        kept[i] = NULL;
    }
    /* A request no free chunk fits: malloc sorts the unsorted bin into the bins first. */
    free(malloc(64 * 1024));
    /* kept stays allocated: the live blocks must stay reachable. */
}

static void churn(unsigned int *seed) {
    struct slot *ring = calloc((size_t)working_set, sizeof(struct slot));
    if (ring == NULL) abort();
    struct timespec pause = {0, pause_us * 1000L};
    for (unsigned long i = 0;; i++) {
        struct slot *s = &ring[i % (unsigned long)working_set];
        if (s->block != NULL) {
            if (s->block[0] != (unsigned char)s->size || s->block[s->size - 1] != 0xa5) {
                printf("corrupt block of %zu bytes\n", s->size);
                fflush(stdout);
                abort();
            }
            free(s->block);
        }
        s->size = 16 + (size_t)(rand_r(seed) % 1009);
        s->block = malloc(s->size);
        if (s->block == NULL) abort();
        s->block[0] = (unsigned char)s->size;
        s->block[s->size - 1] = 0xa5;
        atomic_fetch_add_explicit(&operations, 1, memory_order_relaxed);
        if (pause_us > 0 && i % (unsigned long)burst_ops == 0) nanosleep(&pause, NULL);
    }
}

static void *worker(void *arg) {
    unsigned int seed = (unsigned int)(uintptr_t)arg * 2654435761u;
    build_fragmented_heap(&seed);
    pthread_barrier_wait(&built);
    churn(&seed);
    return NULL;
}

static void write_marker(const char *dir, const char *name, const char *text) {
    char path[4096];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0600);
    if (fd < 0) abort();
    if (write(fd, text, strlen(text)) < 0) abort();
    close(fd);
}

int main(int argc, char **argv) {
    if (argc < 5) {
        fprintf(stderr, "usage: %s DIR THREADS BLOCKS WORKING_SET [BURST_OPS [PAUSE_US]]\n",
                argv[0]);
        return 2;
    }
    const char *dir = argv[1];
    int threads = atoi(argv[2]);
    blocks = atol(argv[3]);
    working_set = atol(argv[4]);
    if (argc > 5) burst_ops = atol(argv[5]);
    if (argc > 6) pause_us = atol(argv[6]);
    if (threads < 1 || blocks < 2 || working_set < 1 || burst_ops < 1) return 2;

    char dump_path[4096];
    snprintf(dump_path, sizeof dump_path, "%s/dump.xml", dir);
    FILE *dump = fopen(dump_path, "w");
    if (dump == NULL) abort();

    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, SIGUSR1);
    sigaddset(&set, SIGUSR2);
    pthread_sigmask(SIG_BLOCK, &set, NULL); /* inherited by the workers */

    pthread_barrier_init(&built, NULL, (unsigned)threads + 1);
    for (int t = 0; t < threads; t++) {
        pthread_t tid;
        if (pthread_create(&tid, NULL, worker, (void *)(uintptr_t)(t + 1)) != 0) abort();
    }
    pthread_barrier_wait(&built);
    printf("ready %d\n", (int)getpid());
    fflush(stdout);

    for (;;) {
        int sig = 0;
        if (sigwait(&set, &sig) != 0) abort();
        if (sig == SIGUSR1) {
            rewind(dump);
            if (ftruncate(fileno(dump), 0) != 0) abort();
            malloc_info(0, dump);
            fflush(dump);
            char text[32];
            snprintf(text, sizeof text, "%lu\n", atomic_load(&operations));
            write_marker(dir, "dump.done", text);
        } else if (sig == SIGUSR2) {
            char text[32];
            snprintf(text, sizeof text, "%d\n", malloc_trim(0));
            write_marker(dir, "trim.done", text);
        }
    }
}
