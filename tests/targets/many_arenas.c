/* A target with many arenas (or one huge free list) and a ticker that feels every stop.
 *
 * usage: many_arenas THREADS BLOCKS [MAX_BYTES]
 * Each of THREADS workers allocates BLOCKS small blocks (24..MAX_BYTES, default 984) in its own arena
 * (run it with GLIBC_TUNABLES=glibc.malloc.arena_max=N to get one arena per thread beyond
 * glibc's 8-per-core default) and frees every other one: BLOCKS/2 free chunks per arena that
 * cannot coalesce, so malloc_info's walk and document grow with THREADS x BLOCKS. The workers
 * then sleep. A ticker thread wakes every millisecond and records the longest gap between two
 * wake-ups: the longest stop the process felt.
 * Prints "ready threads=T" once every worker is done. Then reads commands on stdin, one per
 * line: "reset" clears the longest gap, "gap" prints "gap <microseconds>", "stall" starts a
 * thread that fills stderr (give it a pipe of 4 KiB nobody reads yet) and then calls
 * malloc_stats(), which blocks in its fprintf holding the main arena's mutex until stderr is
 * drained: a malloc_info called meanwhile waits for it, a call as long as the test wants.
 * "churn N" (before "stall": it mallocs in the main arena) takes N blocks of 40 bytes there
 * and starts a thread that frees them one every CHURN_GAP_US: past its tcache, each free
 * pushes onto a main-arena fastbin without the arena's mutex (glibc frees to fastbins
 * lock-free), so that fastbin moves even while "stall" holds the mutex. "churned" prints
 * "churned <frees so far>".
 * On EOF it keeps sleeping (tests that start it with stdin closed still get a live target).
 * With MANY_ARENAS_XML=PATH in the environment, malloc_info(0) is written there once every
 * worker is done, through a FILE opened before the first thread with a static buffer, and with
 * stdout unbuffered and the ticker started before the workers: nothing is malloc'ed after the
 * document, which then describes the heap as it stays (an oracle of a read).
 */
#include <malloc.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static pthread_barrier_t barrier;
static long blocks_per_thread;
static long size_steps = 61; /* block sizes 24, 40, ... 24 + 16 * (size_steps - 1) */
static atomic_long longest_gap_us;
#define CHURN_GAP_US 20
static void **churn_blocks;
static long churn_count;
static atomic_long churned;

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
        size_t size = 24 + (size_t)(i % size_steps) * 16;
        blocks[i] = malloc(size);
        if (!blocks[i]) abort();
        memset(blocks[i], 0x5a, size);
    }
    /* Every other block, in a scattered order: the free lists then jump around memory as a
     * long-lived heap's do, and walking them (malloc_info) costs a cache miss per chunk. */
    long odd = blocks_per_thread / 2, stride = 7919; /* a prime: k * stride % odd visits all */
    while (odd % stride == 0) stride += 2;
    for (long k = 0; k < odd; k++) free(blocks[2 * ((k * stride) % odd) + 1]);
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

static void *staller(void *arg) {
    (void)arg;
    static char filler[4096 - 64];
    memset(filler, '.', sizeof filler);
    if (write(2, filler, sizeof filler) < 0) return NULL;
    malloc_stats();
    return NULL;
}

static void *churner(void *arg) {
    (void)arg;
    for (long i = 0; i < churn_count; i++) {
        long until = now_us() + CHURN_GAP_US;
        while (now_us() < until) {}
        free(churn_blocks[i]);
        atomic_store(&churned, i + 1);
    }
    return NULL;
}

int main(int argc, char **argv) {
    if (argc != 3 && argc != 4) {
        fprintf(stderr, "usage: %s THREADS BLOCKS [MAX_BYTES]\n", argv[0]);
        return 2;
    }
    int threads = atoi(argv[1]);
    blocks_per_thread = atol(argv[2]);
    if (argc == 4) size_steps = (atol(argv[3]) - 24) / 16 + 1;
    if (size_steps < 1) return 2;
    if (threads < 1 || blocks_per_thread < 2) return 2;
    pthread_barrier_init(&barrier, NULL, (unsigned)threads + 1);
    const char *xml_path = getenv("MANY_ARENAS_XML");
    static char xml_buffer[1 << 20];
    FILE *xml = NULL;
    pthread_t tick;
    if (xml_path != NULL) {
        xml = fopen(xml_path, "w"); /* before any thread: its FILE is the heap's first block */
        if (xml == NULL || setvbuf(xml, xml_buffer, _IOFBF, sizeof xml_buffer) != 0) {
            perror(xml_path);
            return 1;
        }
        setvbuf(stdout, NULL, _IONBF, 0);
        pthread_create(&tick, NULL, ticker, NULL); /* its thread's blocks before the document */
    }
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
    if (xml == NULL) pthread_create(&tick, NULL, ticker, NULL);
    /* Unbuffered: a buffered stdin mallocs its 4 KiB buffer from the main arena at the first
     * fgets, after "ready", and two reads of an idle target would then differ. */
    setvbuf(stdin, NULL, _IONBF, 0);
    if (xml != NULL && (malloc_info(0, xml) != 0 || fflush(xml) != 0)) {
        perror("malloc_info");
        return 1;
    }
    printf("ready threads=%d\n", threads);
    fflush(stdout);
    char line[64];
    while (fgets(line, sizeof line, stdin)) {
        if (strncmp(line, "reset", 5) == 0) {
            atomic_store(&longest_gap_us, 0);
        } else if (strncmp(line, "stall", 5) == 0) {
            pthread_t stall;
            pthread_create(&stall, NULL, staller, NULL);
            printf("stalling\n");
            fflush(stdout);
        } else if (strncmp(line, "churned", 7) == 0) {
            printf("churned %ld\n", atomic_load(&churned));
            fflush(stdout);
        } else if (strncmp(line, "churn ", 6) == 0 && churn_blocks == NULL) {
            churn_count = atol(line + 6);
            churn_blocks = malloc((size_t)(churn_count > 0 ? churn_count : 1) * sizeof(void *));
            if (!churn_blocks) abort();
            for (long i = 0; i < churn_count; i++) {
                churn_blocks[i] = malloc(40);
                if (!churn_blocks[i]) abort();
            }
            pthread_t churn;
            pthread_create(&churn, NULL, churner, NULL);
            printf("churning\n");
            fflush(stdout);
        } else if (strncmp(line, "gap", 3) == 0) {
            printf("gap %ld\n", atomic_load(&longest_gap_us));
            fflush(stdout);
        }
    }
    for (;;) pause();
}
