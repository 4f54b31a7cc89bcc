/* Benchmark target in the seeds' shapes (issue 31), with a ticker that feels every stop.
 *
 * usage: seeds_heap THREADS MEGABYTES BUSY [XML_PATH]
 *        seeds_heap spread THREADS MEGABYTES [XML_PATH]
 *        seeds_heap unsorted BLOCKS [ORDER [XML_PATH]]
 *
 * THREADS MEGABYTES BUSY: each of THREADS workers fills its own arena (run it with
 * GLIBC_TUNABLES=glibc.malloc.arena_max=THREADS+1) with MEGABYTES MiB of blocks: four fifths
 * in big blocks of 0.5 to 32 MiB (mostly under 4 MiB), one fifth in runs of small ones
 * (24..1000 bytes), big and small interleaved. The big ones come from the arena only under a
 * raised mmap threshold (GLIBC_TUNABLES=...:glibc.malloc.mmap_threshold=33554432, what
 * glibc's dynamic threshold reaches after big frees; glibc ignores a value over 32 MiB, and
 * a thread arena's 64 MiB heaps could not hold a bigger block anyway); the target sets none
 * itself. Every byte is written (the heap is resident, as a real one is). Each worker then
 * frees two big blocks in three and about 3,000 small ones, each between live blocks (the
 * first and last of every small run stay live), so the free chunks cannot coalesce, and
 * makes one request no free chunk fits so that malloc sorts its unsorted chunks into bins.
 * SEEDS_SEED=N, SEEDS_SMALL_FREES=N and SEEDS_SMALL_PERCENT=P (5..60) in the environment give
 * another heap of the shape, one no read was tuned on: other sizes in another order, about N
 * small blocks freed per arena, P% of its bytes in small blocks (0, 3,000 and 20 by default).
 * BUSY 0: the workers then sleep. BUSY 1: each keeps replacing small blocks of a ring of
 * 512 in its arena, 256 frees and mallocs every millisecond (SEEDS_CHURN=N in the
 * environment: N; enough of them and a worker never pauses). XML_PATH (idle workers): once
 * the heap is built, malloc_info(0) is written there through a FILE opened before the first
 * allocation, with a static buffer, so that writing it allocates nothing: the document
 * describes the heap as it stays (the oracle of tests/integration/test_seeds_read.py).
 *
 * spread THREADS MEGABYTES [XML_PATH]: as above with idle workers, but each fills its arena
 * with pairs of a live block of SPREAD_LIVE bytes and a small one (136..1000 bytes), and
 * frees every small one: one free chunk every three pages or so, so that the free lists lie
 * on about a third of the arena's pages however big it is (a few hundred MiB of arena: more
 * pages than a read copies in one stop without a care, fewer than its copy budget). With
 * SEEDS_DENSE=N in the environment, N more workers start once those arenas are built (so their
 * arenas come later in main_arena's list, and are read first), each filling 16 MiB (or
 * SEEDS_DENSE_MIB MiB) with small blocks and freeing every other one: lists on every page of
 * their arenas. With SEEDS_GROW_MIB=N, the spread workers then keep allocating an 80 KiB block
 * every 2 ms, N MiB each: no free chunk of theirs fits it (the biggest is 64 KiB), so their
 * heaps grow from the top, and their small bins stay as malloc_info described them.
 *
 * unsorted BLOCKS: the main thread allocates BLOCKS blocks of 136..264 bytes (chunks too big
 * for the fast bins), writes them, and frees every other one in a scattered order: BLOCKS/2
 * chunks in the main arena's unsorted bin (but the few tcache holds), which stay there
 * because the main thread never calls malloc again (stdin and stdout are unbuffered: no
 * stdio buffer is malloc'ed later, and the ticker thread exists before the blocks do).
 * ORDER "ordered" frees them in address order instead (the list then leads from page to
 * page); XML_PATH: malloc_info(0) written there once the bin is built, as above. With
 * SEEDS_CORRUPT=1 in the environment, the bk of the chunk halfway down the list is then
 * overwritten (printed on the ready line as corrupt=ADDRESS): the list is corrupt there.
 * With SEEDS_CORRUPT=3, that chunk's fd is overwritten with the list's first chunk instead:
 * the list loops without its head (malloc_info's loop over it would never end).
 * With SEEDS_CORRUPT=2, the size word of the live block halfway up the heap is overwritten
 * instead (as a buffer overrun before it would): no list is broken, but a walk of the heap's
 * headers cannot pass that chunk.
 * SEEDS_SORT=1: the freed chunks are then sorted into their 9 small bins (one per block size),
 * by requests none of them fits: with ORDER "ordered", 9 lists interleaved through the whole
 * heap, each in address order (glibc 2.41 leaves them so without it).
 * SEEDS_UNSORTED_BUSY=1 (with glibc.malloc.arena_max=1): a thread then churns small blocks
 * in the main arena, its first mallocs sorting the bin into the small bins.
 * SEEDS_UNSORTED_THREAD=1 (with arena_max 2 or more): the blocks are allocated and freed by a
 * thread of their own, in a thread arena of sub-heaps, which with SEEDS_UNSORTED_BUSY=1 then
 * churns in that arena itself.
 * SEEDS_BLOCK_BYTES=N (at least 136): the blocks are N..N+128 bytes instead (N of a page or
 * more: free chunks with whole pages inside, what malloc_trim gives back).
 *
 * A ticker thread wakes every millisecond and records the longest gap between two wake-ups:
 * the longest stop the process felt. Prints "ready ..." once built. Then reads commands on
 * stdin, one per line: "reset" clears the longest gap, "gap" prints "gap <microseconds>".
 * On EOF it keeps sleeping.
 */
#include <malloc.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define SMALL_RUN 64           /* small blocks allocated in a row */
#define SMALL_FREES 3000       /* about this many small blocks freed per arena */
#define RING 512               /* a busy worker's small blocks */
#define BIG_MAX ((32u << 20) - (64u << 10)) /* under a 32 MiB mmap threshold */
#define SPREAD_LIVE (12u << 10)  /* spread: the live block between two free chunks */
#define GROW_BLOCK (80u << 10)   /* spread with SEEDS_GROW_MIB: each block a growing worker keeps */
static size_t dense_bytes = 16u << 20; /* spread with SEEDS_DENSE: each dense worker's blocks */

static pthread_barrier_t barrier;
static size_t bytes_per_arena;
static int busy;
static int churn_per_ms = 256; /* SEEDS_CHURN: a busy worker's frees and mallocs a millisecond */
static uint64_t seed_mix;        /* SEEDS_SEED: another heap of the same shape (0: the usual one) */
static size_t small_frees = SMALL_FREES; /* SEEDS_SMALL_FREES: small blocks freed per arena */
static size_t small_percent = 20;         /* SEEDS_SMALL_PERCENT: the small blocks' share */
static int spread;
static int spread_workers;       /* spread: workers 1..spread_workers fill spread arenas */
static atomic_int spread_built;  /* spread workers done (the dense ones start after) */
static atomic_long longest_gap_us;

static long now_us(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1000000L + ts.tv_nsec / 1000L;
}

static uint64_t next_random(uint64_t *state) { /* xorshift64: the same heap every run */
    uint64_t x = *state;
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    return *state = x;
}

static size_t big_size(uint64_t *state) {
    uint64_t r = next_random(state);
    unsigned bucket = (unsigned)(r % 64);
    size_t low, high;
    if (bucket < 40) low = 512u << 10, high = 1u << 20;
    else if (bucket < 56) low = 1u << 20, high = 4u << 20;
    else if (bucket < 62) low = 4u << 20, high = 16u << 20;
    else low = 16u << 20, high = BIG_MAX;
    return low + (size_t)((r >> 8) % (high - low));
}

static size_t small_size(uint64_t *state) { return 24 + (size_t)(next_random(state) % 62) * 16; }

static void *must_malloc(size_t size) {
    void *block = malloc(size);
    if (!block) abort();
    return block;
}

/* spread: pairs of a live SPREAD_LIVE block and a small one, every small one freed. */
static void fill_spread(uint64_t *state) {
    size_t pair = SPREAD_LIVE + 1024, pairs = bytes_per_arena / pair;
    void **smalls = must_malloc(pairs * sizeof(void *));
    for (size_t i = 0; i < pairs; i++) {
        void *live = must_malloc(SPREAD_LIVE);
        memset(live, 0x42, SPREAD_LIVE);
        size_t size = 136 + (size_t)(next_random(state) % 54) * 16;
        smalls[i] = must_malloc(size);
        memset(smalls[i], 0x5a, size);
    }
    for (size_t i = 0; i < pairs; i++) free(smalls[i]);
    free(smalls);
}

/* spread with SEEDS_DENSE: small blocks, every other one freed, lists on every page. */
static void fill_dense(uint64_t *state) {
    size_t count = dense_bytes / 568;
    void **blocks = must_malloc(count * sizeof(void *));
    for (size_t i = 0; i < count; i++) {
        size_t size = 136 + (size_t)(next_random(state) % 54) * 16;
        blocks[i] = must_malloc(size);
        memset(blocks[i], 0x5a, size);
    }
    for (size_t i = 0; i < count; i += 2) free(blocks[i]);
}

/* Keep replacing the blocks of ``ring`` (RING small blocks), churn_per_ms a millisecond, in
 * the calling thread's arena: a busy thread. Never returns. */
static void churn(uint64_t *state, void **ring) {
    struct timespec one_ms = {0, 1000000L};
    for (;;) {
        for (int i = 0; i < churn_per_ms; i++) {
            uint64_t r = next_random(state);
            unsigned slot = (unsigned)(r % RING);
            free(ring[slot]);
            ring[slot] = must_malloc(small_size(state));
            *(volatile char *)ring[slot] = 1;
        }
        nanosleep(&one_ms, NULL);
    }
}

static void *worker(void *arg) {
    uint64_t state = 0x9e3779b97f4a7c15ull ^ (uint64_t)(uintptr_t)arg * 0x100000001b3ull;
    state ^= seed_mix * 0xbf58476d1ce4e5b9ull;
    if (state == 0) state = 1; /* xorshift's one fixed point */
    size_t big_budget = small_percent == 20 ? bytes_per_arena / 5 * 4 /* as it always was */
                                            : bytes_per_arena / 100 * (100 - small_percent);
    size_t small_budget = bytes_per_arena - big_budget;
    size_t big_cap = big_budget / (512u << 10) + 2, small_cap = small_budget / 24 + SMALL_RUN;
    void **bigs = must_malloc(big_cap * sizeof(void *));
    void **smalls = must_malloc(small_cap * sizeof(void *));
    size_t nbig = 0, nsmall = 0, big_used = 0, small_used = 0;
    if (spread && (int)(uintptr_t)arg > spread_workers) {
        fill_dense(&state);
        big_budget = small_budget = 0;
    } else if (spread) {
        fill_spread(&state);
        atomic_fetch_add(&spread_built, 1);
        big_budget = small_budget = 0;
    }
    while (big_used < big_budget || small_used < small_budget) {
        /* Whichever kind is furthest behind its share comes next: big and small interleave. */
        int big_next = small_used >= small_budget ||
                       (big_used < big_budget &&
                        (double)big_used / (double)big_budget <=
                            (double)small_used / (double)small_budget);
        if (big_next && nbig < big_cap) {
            size_t size = big_size(&state);
            bigs[nbig++] = must_malloc(size);
            memset(bigs[nbig - 1], 0x42, size);
            big_used += size;
        } else if (nsmall + SMALL_RUN <= small_cap) {
            for (int i = 0; i < SMALL_RUN; i++) {
                size_t size = small_size(&state);
                smalls[nsmall++] = must_malloc(size);
                memset(smalls[nsmall - 1], 0x5a, size);
                small_used += size;
            }
        } else {
            break;
        }
    }
    size_t stride = nsmall / small_frees > 2 ? nsmall / small_frees : 2;
    for (size_t i = 0; i < nsmall; i++) {
        size_t in_run = i % SMALL_RUN;
        if (i % stride == stride / 2 && in_run != 0 && in_run != SMALL_RUN - 1) {
            free(smalls[i]);
            smalls[i] = NULL;
        }
    }
    for (size_t i = 0; i < nbig; i++)
        if (i % 3 != 0) {
            free(bigs[i]);
            bigs[i] = NULL;
        }
    void *volatile sorter = malloc(64 * 1024 - 64); /* volatile: the pair is not optimised away */
    free(sorter);
    const char *grow = spread ? getenv("SEEDS_GROW_MIB") : NULL;
    int grows = grow != NULL && (int)(uintptr_t)arg <= spread_workers;
    /* A malloc sorts at most 10,000 unsorted chunks (glibc's MAX_ITERS): a growing arena has
     * all of them sorted into their bins before malloc_info describes it, by requests that
     * no free chunk fits, so that its growth (the same requests) leaves its bins as they are. */
    for (int i = 0; grows && i < 4; i++) *(volatile char *)must_malloc(GROW_BLOCK) = 1;
    void *ring[RING];
    if (busy)
        for (int i = 0; i < RING; i++) ring[i] = must_malloc(small_size(&state));
    pthread_barrier_wait(&barrier);
    if (grows) {
        /* A spread arena that keeps growing: blocks no free chunk fits, kept, one every 2 ms,
         * so its heap grows from its top between any scout and the stop after it. */
        struct timespec tick = {0, 2000000L};
        for (size_t kept = 0; kept < ((size_t)atol(grow) << 20); kept += GROW_BLOCK) {
            *(volatile char *)must_malloc(GROW_BLOCK) = 1;
            nanosleep(&tick, NULL);
        }
    }
    if (!busy)
        for (;;) pause();
    churn(&state, ring);
    return NULL;
}

/* SEEDS_UNSORTED_BUSY=1: a thread that churns in the main arena (arena_max=1) once its
 * unsorted bin is built; its first mallocs sort that bin into the small bins (10,000 chunks
 * a malloc), then it keeps taking from and giving back to them. */
static void *unsorted_churner(void *arg) {
    (void)arg;
    uint64_t state = 0x5eed5eed;
    void *ring[RING];
    for (int i = 0; i < RING; i++) ring[i] = must_malloc(small_size(&state));
    churn(&state, ring);
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

/* SEEDS_CORRUPT: the chunk whose bk (1) or size word (2) was overwritten */
static uintptr_t corrupted_chunk;

/* The main arena's unsorted bin of BLOCKS/2 chunks (freed in a scattered order, or in
 * address order when ``ordered``); the main thread mallocs nothing after. */
static void build_unsorted(long blocks, int ordered) {
    void **block = must_malloc((size_t)blocks * sizeof(void *)); /* mmapped: not in the bins */
    const char *bytes = getenv("SEEDS_BLOCK_BYTES");
    size_t base = bytes != NULL && atol(bytes) >= 136 ? (size_t)atol(bytes) : 136;
    for (long i = 0; i < blocks; i++) {
        size_t size = base + (size_t)(i % 9) * 16;
        block[i] = must_malloc(size);
        memset(block[i], 0x5a, size);
    }
    long odd = blocks / 2, stride = ordered ? 1 : 7919; /* a prime: k * stride % odd visits all */
    while (!ordered && odd % stride == 0) stride += 2;
    for (long k = 0; k < odd; k++) free(block[2 * ((k * stride) % odd) + 1]);
    const char *sort = getenv("SEEDS_SORT");
    if (sort != NULL && atoi(sort) == 1)
        /* Requests none of them fits, kept: each sorts at most 10,000 unsorted chunks into
         * their small bins (glibc's MAX_ITERS), so these leave none unsorted. */
        for (long k = 0; k <= odd / 10000; k++) *(volatile char *)must_malloc(64 * 1024 - 64) = 1;
    const char *corrupt = getenv("SEEDS_CORRUPT");
    if (corrupt != NULL && atoi(corrupt) == 1) {
        uintptr_t *user = block[2 * (odd / 2) + 1]; /* freed: fd and bk are its first words */
        user[1] = (uintptr_t)0x5a5a5a5a5a50;
        corrupted_chunk = (uintptr_t)user - 16;
    } else if (corrupt != NULL && atoi(corrupt) == 3) {
        uintptr_t *user = block[2 * (odd / 2) + 1];
        /* The list's first chunk (the last one freed): following fd now loops back to it. */
        user[0] = (uintptr_t)block[2 * (((odd - 1) * stride) % odd) + 1] - 16;
        corrupted_chunk = (uintptr_t)user - 16;
    } else if (corrupt != NULL && atoi(corrupt) == 2) {
        uintptr_t *user = block[2 * (odd / 2)]; /* live: its chunk's size word precedes it */
        user[-1] = (uintptr_t)0x5a5a5a5a5a51;    /* runs past the heap's end, PREV_INUSE */
        corrupted_chunk = (uintptr_t)user - 16;
    }
}

/* SEEDS_UNSORTED_THREAD=1 (with glibc.malloc.arena_max of 2 or more): the unsorted bin built
 * by a thread of its own, in a thread arena, which then churns there itself when
 * SEEDS_UNSORTED_BUSY=1 (else sleeps): the same shape away from main_arena. */
struct unsorted_job {
    long blocks;
    int ordered, busy;
    pthread_barrier_t built;
};

static void *unsorted_thread(void *arg) {
    struct unsorted_job *job = arg;
    build_unsorted(job->blocks, job->ordered);
    pthread_barrier_wait(&job->built);
    if (job->busy) unsorted_churner(NULL);
    for (;;) pause();
    return NULL;
}

int main(int argc, char **argv) {
    /* Unbuffered: a stdio buffer would be malloc'ed at the first fgets or printf, after the
     * heap is built (and in the unsorted shape, sort part of the bin). */
    setvbuf(stdin, NULL, _IONBF, 0);
    setvbuf(stdout, NULL, _IONBF, 0);
    pthread_attr_t attr;
    pthread_attr_init(&attr);
    pthread_attr_setstacksize(&attr, 256 * 1024);
    pthread_t tick;
    if (pthread_create(&tick, &attr, ticker, NULL) != 0) return 1;
    if (argc >= 3 && argc <= 5 && strcmp(argv[1], "unsorted") == 0) {
        static char unsorted_xml_buffer[1 << 20];
        FILE *xml = NULL;
        if (argc == 5) {
            xml = fopen(argv[4], "w"); /* before any block: its FILE is the heap's first */
            if (xml == NULL || setvbuf(xml, unsorted_xml_buffer, _IOFBF, sizeof unsorted_xml_buffer) != 0) {
                perror(argv[4]);
                return 1;
            }
        }
        long blocks = atol(argv[2]);
        if (blocks < 2) return 2;
        int ordered = argc >= 4 && strcmp(argv[3], "ordered") == 0;
        const char *churning = getenv("SEEDS_UNSORTED_BUSY");
        int busy_bin = churning != NULL && atoi(churning) == 1;
        const char *in_thread = getenv("SEEDS_UNSORTED_THREAD");
        static struct unsorted_job job;
        pthread_t builder, churner;
        if (in_thread != NULL && atoi(in_thread) == 1) {
            job.blocks = blocks, job.ordered = ordered, job.busy = busy_bin;
            if (pthread_barrier_init(&job.built, NULL, 2) != 0 ||
                pthread_create(&builder, &attr, unsorted_thread, &job) != 0)
                return 1;
            pthread_barrier_wait(&job.built);
            busy_bin = 0; /* (it churns itself) */
        } else {
            build_unsorted(blocks, ordered);
        }
        if (xml != NULL && (malloc_info(0, xml) != 0 || fflush(xml) != 0)) {
            perror("malloc_info");
            return 1;
        }
        if (busy_bin && pthread_create(&churner, &attr, unsorted_churner, NULL) != 0) return 1;
        printf("ready unsorted=%ld corrupt=%#lx\n", blocks / 2, (unsigned long)corrupted_chunk);
    } else if (argc == 4 || argc == 5) {
        static char xml_buffer[1 << 20];
        FILE *xml = NULL;
        spread = strcmp(argv[1], "spread") == 0;
        const char *xml_path = argc == 5 ? argv[4] : NULL;
        if (xml_path != NULL) {
            xml = fopen(xml_path, "w"); /* before any block: its FILE is the heap's first */
            if (xml == NULL || setvbuf(xml, xml_buffer, _IOFBF, sizeof xml_buffer) != 0) {
                perror(xml_path);
                return 1;
            }
        }
        int threads = atoi(argv[1 + spread]);
        bytes_per_arena = (size_t)atol(argv[2 + spread]) << 20;
        busy = spread ? 0 : atoi(argv[3]) != 0;
        const char *seed_env = getenv("SEEDS_SEED");
        if (seed_env != NULL) seed_mix = strtoull(seed_env, NULL, 0);
        const char *frees_env = getenv("SEEDS_SMALL_FREES");
        if (frees_env != NULL && atol(frees_env) > 0) small_frees = (size_t)atol(frees_env);
        const char *share_env = getenv("SEEDS_SMALL_PERCENT");
        if (share_env != NULL && atoi(share_env) >= 5 && atoi(share_env) <= 60)
            small_percent = (size_t)atoi(share_env);
        const char *churn_env = getenv("SEEDS_CHURN");
        if (churn_env != NULL && atoi(churn_env) > 0) churn_per_ms = atoi(churn_env);
        if (threads < 1 || bytes_per_arena == 0) return 2;
        const char *dense_env = getenv("SEEDS_DENSE");
        int dense = spread && dense_env != NULL ? atoi(dense_env) : 0;
        const char *dense_mib = getenv("SEEDS_DENSE_MIB");
        if (dense_mib != NULL && atol(dense_mib) > 0) dense_bytes = (size_t)atol(dense_mib) << 20;
        spread_workers = threads;
        pthread_barrier_init(&barrier, NULL, (unsigned)(threads + dense) + 1);
        for (int i = 0; i < threads + dense; i++) {
            struct timespec tick = {0, 1000000L};
            while (i == threads && atomic_load(&spread_built) < threads) nanosleep(&tick, NULL);
            pthread_t tid;
            if (pthread_create(&tid, &attr, worker, (void *)(uintptr_t)(i + 1)) != 0) {
                fprintf(stderr, "pthread_create failed at thread %d\n", i);
                return 1;
            }
        }
        pthread_barrier_wait(&barrier);
        if (xml != NULL && (malloc_info(0, xml) != 0 || fflush(xml) != 0)) {
            perror("malloc_info");
            return 1;
        }
        printf("ready threads=%d mb=%s busy=%d spread=%d\n", threads, argv[2 + spread], busy,
               spread);
    } else {
        fprintf(stderr,
                "usage: %s THREADS MEGABYTES BUSY [XML] | %s spread THREADS MEGABYTES [XML] | "
                "%s unsorted BLOCKS\n",
                argv[0], argv[0], argv[0]);
        return 2;
    }
    char line[64];
    while (fgets(line, sizeof line, stdin)) {
        if (strncmp(line, "reset", 5) == 0) {
            atomic_store(&longest_gap_us, 0);
        } else if (strncmp(line, "gap", 3) == 0) {
            printf("gap %ld\n", atomic_load(&longest_gap_us));
        }
    }
    for (;;) pause();
}
