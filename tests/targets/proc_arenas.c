/* A fragmented glibc heap for residency and trim-forecast tests.
 *
 * usage: proc_arenas DIR THREADS CHUNKS CHUNK_BYTES PATTERN [MMAP_CHUNKS [scaled]]
 *   THREADS worker threads (each gets its own arena while below arena_max) and then the main
 *   thread each malloc CHUNKS buffers of CHUNK_BYTES, write every byte (so they are resident),
 *   then free them by PATTERN: "alternate" (every other one: a fragmented heap),
 *   "allbutlast" (all but the last: the demo case, a huge free chunk below a live one),
 *   "runs" (keep every 16th: free runs of 15 buffers, each holding a few whole pages),
 *   "none". The main thread also keeps MMAP_CHUNKS live 1 MiB blocks (served by mmap).
 *   "scaled": worker number t (from 1) allocates t times CHUNKS, so every arena has its own
 *   size and a test can tell them apart. "busy": after the workload every worker churns
 *   malloc/free forever (random sizes), so the arenas change under any reader.
 * Then it prints "ready" and waits for signals, doing the work in the main thread (no
 * allocator calls from signal handlers):
 *   SIGUSR1: malloc_info(0) into DIR/dump.xml (through a FILE opened before the workload,
 *            so the dump itself perturbs no arena), then writes DIR/dump.done
 *   SIGUSR2: malloc_trim(0), then writes its return value into DIR/trim.done
 */
#define _GNU_SOURCE
#include <fcntl.h>
#include <malloc.h>
#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static long chunks;
static size_t chunk_bytes;
static const char *pattern;
static pthread_barrier_t done_barrier;

static void workload(long count) {
    char **bufs = calloc((size_t)count, sizeof(char *));
    if (bufs == NULL) abort();
    for (long i = 0; i < count; i++) {
        bufs[i] = malloc(chunk_bytes);
        if (bufs[i] == NULL) abort();
        memset(bufs[i], 0x5a, chunk_bytes);
    }
    for (long i = 0; i < count; i++) {
        int drop = 0;
        if (strcmp(pattern, "alternate") == 0) drop = (i % 2 == 0);
        else if (strcmp(pattern, "allbutlast") == 0) drop = (i != count - 1);
        else if (strcmp(pattern, "runs") == 0) drop = (i % 16 != 15);
        if (drop) {
            free(bufs[i]);
            bufs[i] = NULL;
        }
    }
    /* bufs itself stays allocated: the kept buffers must stay reachable. */
}

static int busy;

/* Churn forever: random sizes up to 8 KiB, a ring of 512 live blocks per thread. */
static void churn(void) {
    void *ring[512] = {0};
    unsigned int seed = (unsigned int)(uintptr_t)&ring;
    for (unsigned long i = 0;; i++) {
        size_t slot = i % 512;
        free(ring[slot]);
        size_t size = 16 + (size_t)(rand_r(&seed) % 8192);
        ring[slot] = malloc(size);
        if (ring[slot] == NULL) abort();
        memset(ring[slot], (int)i, size < 64 ? size : 64);
    }
}

static void *worker(void *arg) {
    workload(chunks * (long)(intptr_t)arg);
    pthread_barrier_wait(&done_barrier);
    if (busy) churn();
    for (;;) pause();
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
    if (argc < 6) {
        fprintf(stderr, "usage: %s DIR THREADS CHUNKS CHUNK_BYTES PATTERN [MMAP_CHUNKS]\n", argv[0]);
        return 2;
    }
    const char *dir = argv[1];
    int threads = atoi(argv[2]);
    chunks = atol(argv[3]);
    chunk_bytes = (size_t)atol(argv[4]);
    pattern = argv[5];
    int mmap_chunks = argc > 6 ? atoi(argv[6]) : 0;
    int scaled = argc > 7 && strcmp(argv[7], "scaled") == 0;
    busy = argc > 7 && strcmp(argv[7], "busy") == 0;

    char dump_path[4096];
    snprintf(dump_path, sizeof dump_path, "%s/dump.xml", dir);
    FILE *dump = fopen(dump_path, "w");
    if (dump == NULL) abort();

    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, SIGUSR1);
    sigaddset(&set, SIGUSR2);
    pthread_sigmask(SIG_BLOCK, &set, NULL); /* inherited by the workers */

    pthread_barrier_init(&done_barrier, NULL, (unsigned)threads + 1);
    for (int t = 0; t < threads; t++) {
        pthread_t tid;
        intptr_t factor = scaled ? t + 1 : 1;
        if (pthread_create(&tid, NULL, worker, (void *)factor) != 0) abort();
    }
    pthread_barrier_wait(&done_barrier);
    workload(chunks);
    for (int i = 0; i < mmap_chunks; i++) {
        char *big = malloc(1 << 20);
        if (big == NULL) abort();
        memset(big, 0x33, 1 << 20);
    }
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
            write_marker(dir, "dump.done", "1\n");
        } else if (sig == SIGUSR2) {
            char text[32];
            snprintf(text, sizeof text, "%d\n", malloc_trim(0));
            write_marker(dir, "trim.done", text);
        }
    }
}
