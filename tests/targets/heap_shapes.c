/* Seeded glibc heap shapes, for checking the residency walk against glibc's own malloc_info.
 *
 * usage: heap_shapes SEED SHAPE XML_PATH
 *   SEED      any unsigned number: the same seed and shape give the same heap every run
 *   SHAPE     fast | small | large | unsorted | mixed | threads | bigmain | subheaps |
 *             mmapped | nocontig | busy | random
 *   XML_PATH  where malloc_info(0) is written once the shape is built ("-": not written)
 *
 * Building blocks, each in the arena of the thread that runs it (allocations first, frees
 * after, in an order that keeps every bin class what it is meant to be):
 *   fast      1-5 fastbin sizes (48 … 128-byte chunks), 8-31 chunks each, all freed: the
 *             first 7 of a size fill its tcache bin, the rest go to the fastbin;
 *   small     1-6 small-bin sizes (144 … 1008), 8-19 chunks each, freed (tcache full, so
 *             into the unsorted bin), then sorted into the small bins (see "sort" below);
 *   large     1-4 large bins (64 … 122), 2-6 different sizes in each (1-3 chunks a size;
 *             none of the 1024 and 1040 the tcache would take),
 *             freed in a shuffled order, then sorted: the large bins hold several sizes;
 *   unsorted  1-20 chunks of 1 … 64 KiB and 8-12 of one small size, freed after the sort:
 *             the unsorted bin is left non-empty;
 *   sort      one request bigger than any free chunk (a 126 KiB chunk): malloc first moves
 *             every unsorted chunk into its small or large bin, then serves it from the top.
 * Every freed chunk sits between two live 32-byte guards, so no two frees coalesce (32-byte
 * chunks are never freed by any block). Fastbin frees come last: any later large request
 * would consolidate them.
 *
 * Shapes:
 *   fast, small, large, unsorted  that block alone, in the main arena
 *   mixed     all four blocks in the main arena
 *   threads   mixed in the main arena and in 2-6 threads, each its own arena
 *   bigmain   mixed over a main heap of more than 64 MiB (blocks of 1 … 100 KiB, about
 *             half freed, coalescing where neighbours are both free)
 *   subheaps  one thread allocates 150 MiB in 100 KiB blocks (dynamic mmap threshold off at
 *             128 KiB), so its arena spans three 64 MiB sub-heaps; about half are freed;
 *             plus mixed in that arena and in the main arena
 *   mmapped   mixed plus 2-6 live blocks of 256 KiB … 4 MiB, each served by mmap
 *   nocontig  brk is blocked before the first malloc (a page mapped MAP_FIXED_NOREPLACE at
 *             the page-aligned program break), so the main arena's memory comes from mmap,
 *             1 MiB the first time, then what each growth needs (on glibc 2.36): 6 MiB of
 *             1 … 100 KiB blocks (about half freed) spread it over some 30 segments, which
 *             the kernel merges into a few mappings; mixed in it and in one thread
 *   busy      mixed in the main arena and 2 threads; after "ready" the main thread churns a
 *             ring of 8 blocks of 16 … 4096 bytes forever (the heap keeps moving)
 *   random    the blocks, a thread count (0-3) and mmapped blocks (0-3) all drawn from SEED
 *
 * When the shape is built (every thread done), the main thread writes malloc_info(0) to
 * XML_PATH through a FILE opened before the first allocation, with a static stdio buffer
 * (so the dump itself allocates nothing and the heap after it is the heap it describes),
 * writes "ready shape=... threads=N mmapped=N" on stdout with write(2) (no stdio buffer
 * either), and then blocks in pause() until killed; so do the threads. Memory: at most
 * 160 MiB of heap (subheaps; about 45 MiB of it resident), start-up under 0.1 s. */
#define _GNU_SOURCE
#include <errno.h>
#include <malloc.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

enum {
    BLOCK_FAST = 1,
    BLOCK_SMALL = 2,
    BLOCK_LARGE = 4,
    BLOCK_UNSORTED = 8,
    BLOCK_ALL = 15,
};

enum bulk { BULK_NONE, BULK_BIGMAIN, BULK_SUBHEAPS, BULK_NOCONTIG };

#define KIB ((size_t)1024)
#define MIB (1024 * KIB)
#define GUARD_REQUEST 24                  /* a 32-byte chunk: never freed by any block */
#define SORT_CHUNK (126 * KIB)            /* bigger than any chunk a block frees */
#define LARGE_MAX_CHUNK (120 * KIB)       /* below the default 128 KiB mmap threshold */
#define TCACHE_MAX_CHUNK 1040             /* the largest chunk the tcache takes (64-bit) */
#define MAX_THREADS 8
#define CHURN_BLOCKS 8
#define CHURN_MAX_REQUEST 4096

struct config {
    unsigned blocks;        /* BLOCK_* in the main arena */
    int threads;            /* worker threads, each its own arena running thread_blocks */
    unsigned thread_blocks;
    int mmapped;            /* live mmapped blocks in the main thread */
    enum bulk main_bulk;
    int subheaps_thread;    /* worker 0 also builds the 150 MiB bulk */
    int fixed_threshold;    /* mallopt(M_MMAP_THRESHOLD, 128 KiB): no dynamic threshold */
    int nocontig;
    int busy;
};

struct rng {
    uint64_t state;
};

/* splitmix64: small, good enough, the same on every machine. */
static uint64_t next_random(struct rng *rng) {
    uint64_t z = (rng->state += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

static size_t below(struct rng *rng, size_t n) { return (size_t)(next_random(rng) % n); }

static size_t between(struct rng *rng, size_t low, size_t high) {
    return low + below(rng, high - low + 1);
}

/* A live block, its first bytes written (the page is touched, as a program would). */
static void *take(size_t request) {
    void *block = malloc(request);
    if (block == NULL) {
        static const char message[] = "heap_shapes: malloc failed\n";
        (void)!write(2, message, sizeof message - 1);
        abort();
    }
    memset(block, 0xa5, request < 64 ? request : 64);
    return block;
}

/* The request that gives a chunk of exactly CHUNK bytes (a multiple of 16, >= 32). */
static size_t request_for(size_t chunk) { return chunk - 8; }

/* glibc's bin_index on 64-bit (malloc/malloc.c, smallbin_index / largebin_index_64). */
static unsigned bin_of(size_t chunk) {
    if (chunk < 1024) return (unsigned)(chunk >> 4);
    if ((chunk >> 6) <= 48) return 48 + (unsigned)(chunk >> 6);
    if ((chunk >> 9) <= 20) return 91 + (unsigned)(chunk >> 9);
    if ((chunk >> 12) <= 10) return 110 + (unsigned)(chunk >> 12);
    if ((chunk >> 15) <= 4) return 119 + (unsigned)(chunk >> 15);
    if ((chunk >> 18) <= 2) return 124 + (unsigned)(chunk >> 18);
    return 126;
}

#define LIST_MAX 512
#define BULK_MAX 4096

struct list {
    size_t count;
    void *items[LIST_MAX];
};

/* What one arena frees later; allocated in that arena before anything else, never freed. */
struct plan {
    struct list fast, small, large, unsorted;
    size_t bulk_count;
    void *bulk[BULK_MAX];
};

static void push(struct list *list, void *block) {
    if (list->count == LIST_MAX) abort();
    list->items[list->count++] = block;
}

/* A block to free later, between two live guards: it never merges with another free. */
static void guarded(struct list *list, size_t chunk) {
    take(GUARD_REQUEST);
    push(list, take(request_for(chunk)));
    take(GUARD_REQUEST);
}

static void shuffle(struct rng *rng, void **items, size_t count) {
    for (size_t i = count; i > 1; i--) {
        size_t j = below(rng, i);
        void *swap = items[i - 1];
        items[i - 1] = items[j];
        items[j] = swap;
    }
}

static void free_all(struct rng *rng, struct list *list, int shuffled) {
    if (shuffled) shuffle(rng, list->items, list->count);
    for (size_t i = 0; i < list->count; i++) free(list->items[i]);
    list->count = 0;
}

static void alloc_fast(struct rng *rng, struct plan *plan) {
    size_t sizes = between(rng, 1, 5);
    for (size_t s = 0; s < sizes; s++) {
        size_t chunk = 16 * between(rng, 3, 8); /* 48 … 128: fastbins 1 … 6 */
        size_t count = 7 + between(rng, 1, 24);
        for (size_t i = 0; i < count; i++) guarded(&plan->fast, chunk);
    }
}

static void alloc_small(struct rng *rng, struct plan *plan) {
    size_t sizes = between(rng, 1, 6);
    for (size_t s = 0; s < sizes; s++) {
        size_t chunk = 16 * between(rng, 9, 63); /* 144 … 1008: small bins 9 … 63 */
        size_t count = 7 + between(rng, 1, 12);
        for (size_t i = 0; i < count; i++) guarded(&plan->small, chunk);
    }
}

/* Several different sizes in each of a few large bins (their nextsize lists get sorted). */
static void alloc_large(struct rng *rng, struct plan *plan) {
    size_t bins = between(rng, 1, 4);
    for (size_t b = 0; b < bins; b++) {
        unsigned bin = (unsigned)between(rng, 64, bin_of(LARGE_MAX_CHUNK));
        size_t low = 0, high = 0;
        /* From 1056: chunks of 1024 and 1040 bytes (bin 64) would go to the tcache. */
        for (size_t chunk = TCACHE_MAX_CHUNK + 16; chunk <= LARGE_MAX_CHUNK; chunk += 16) {
            if (bin_of(chunk) == bin) {
                if (low == 0) low = chunk;
                high = chunk;
            }
        }
        size_t choices = (high - low) / 16 + 1;
        size_t wanted = between(rng, 2, 6);
        if (wanted > choices) wanted = choices;
        size_t picked[6];
        size_t have = 0;
        while (have < wanted) {
            size_t chunk = low + 16 * below(rng, choices);
            int seen = 0;
            for (size_t i = 0; i < have; i++) seen |= picked[i] == chunk;
            if (!seen) picked[have++] = chunk;
        }
        for (size_t i = 0; i < have; i++) {
            size_t copies = between(rng, 1, 3);
            for (size_t c = 0; c < copies; c++) guarded(&plan->large, picked[i]);
        }
    }
}

static void alloc_unsorted(struct rng *rng, struct plan *plan) {
    size_t count = between(rng, 1, 20);
    for (size_t i = 0; i < count; i++) guarded(&plan->unsorted, 16 * between(rng, 65, 4095));
    size_t small = 16 * between(rng, 9, 63);
    size_t copies = 7 + between(rng, 1, 5);
    for (size_t i = 0; i < copies; i++) guarded(&plan->unsorted, small);
}

/* Blocks until TOTAL bytes: a heap bigger than one 64 MiB sub-heap. Some fully written. */
static void alloc_bulk(struct rng *rng, struct plan *plan, enum bulk kind) {
    size_t total = kind == BULK_SUBHEAPS ? 150 * MIB : kind == BULK_NOCONTIG ? 6 * MIB : 80 * MIB;
    for (size_t used = 0; used < total;) {
        size_t request = kind == BULK_SUBHEAPS ? 100 * KIB : 16 * between(rng, 64, 6400);
        if (plan->bulk_count == BULK_MAX) abort();
        void *block = take(request);
        if (below(rng, 4) == 0) memset(block, 0x5a, request);
        plan->bulk[plan->bulk_count++] = block;
        used += request;
    }
}

static void free_bulk(struct rng *rng, struct plan *plan) {
    for (size_t i = 0; i < plan->bulk_count; i++) {
        if (below(rng, 2) == 0) free(plan->bulk[i]);
    }
}

/* Build one arena's shape: every allocation first, then frees, sort, unsorted, fastbins. */
static void build_arena(uint64_t seed, unsigned blocks, enum bulk bulk) {
    struct rng rng = {seed};
    struct plan *plan = calloc(1, sizeof *plan);
    if (plan == NULL) abort();
    if (bulk != BULK_NONE) alloc_bulk(&rng, plan, bulk);
    if (blocks & BLOCK_FAST) alloc_fast(&rng, plan);
    if (blocks & BLOCK_SMALL) alloc_small(&rng, plan);
    if (blocks & BLOCK_LARGE) alloc_large(&rng, plan);
    if (blocks & BLOCK_UNSORTED) alloc_unsorted(&rng, plan);
    if (bulk != BULK_NONE) free_bulk(&rng, plan);
    free_all(&rng, &plan->small, 1);
    free_all(&rng, &plan->large, 1);
    if (bulk != BULK_NONE || blocks & (BLOCK_SMALL | BLOCK_LARGE)) take(request_for(SORT_CHUNK));
    free_all(&rng, &plan->unsorted, 1);
    free_all(&rng, &plan->fast, 1);
}

struct worker {
    pthread_t thread;
    uint64_t seed;
    unsigned blocks;
    enum bulk bulk;
};

static pthread_barrier_t built;

static void *worker_main(void *arg) {
    struct worker *worker = arg;
    build_arena(worker->seed, worker->blocks, worker->bulk);
    pthread_barrier_wait(&built);
    for (;;) pause();
    return NULL;
}

/* Map one page right at the program break: brk cannot grow, glibc's main arena falls back
 * to mmap (sysmalloc: MORECORE fails, then MMAP, and the arena is marked noncontiguous). */
static void block_brk(void) {
    long page = sysconf(_SC_PAGESIZE);
    uintptr_t end = ((uintptr_t)sbrk(0) + (uintptr_t)page - 1) & ~((uintptr_t)page - 1);
    void *mapped = mmap((void *)end, (size_t)page, PROT_NONE,
                        MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED_NOREPLACE, -1, 0);
    if (mapped == MAP_FAILED || (uintptr_t)mapped != end) {
        static const char message[] = "heap_shapes: cannot map a page at the program break\n";
        (void)!write(2, message, sizeof message - 1);
        exit(2);
    }
}

static int configure(const char *shape, struct rng *rng, struct config *cfg) {
    memset(cfg, 0, sizeof *cfg);
    cfg->thread_blocks = BLOCK_ALL;
    if (strcmp(shape, "fast") == 0) cfg->blocks = BLOCK_FAST;
    else if (strcmp(shape, "small") == 0) cfg->blocks = BLOCK_SMALL;
    else if (strcmp(shape, "large") == 0) cfg->blocks = BLOCK_LARGE;
    else if (strcmp(shape, "unsorted") == 0) cfg->blocks = BLOCK_UNSORTED;
    else if (strcmp(shape, "mixed") == 0) cfg->blocks = BLOCK_ALL;
    else if (strcmp(shape, "threads") == 0) {
        cfg->blocks = BLOCK_ALL;
        cfg->threads = (int)between(rng, 2, 6);
    } else if (strcmp(shape, "bigmain") == 0) {
        cfg->blocks = BLOCK_ALL;
        cfg->main_bulk = BULK_BIGMAIN;
        cfg->fixed_threshold = 1;
    } else if (strcmp(shape, "subheaps") == 0) {
        cfg->blocks = BLOCK_ALL;
        cfg->threads = 1;
        cfg->subheaps_thread = 1;
        cfg->fixed_threshold = 1;
    } else if (strcmp(shape, "mmapped") == 0) {
        cfg->blocks = BLOCK_ALL;
        cfg->mmapped = (int)between(rng, 2, 6);
    } else if (strcmp(shape, "nocontig") == 0) {
        cfg->blocks = BLOCK_ALL;
        cfg->threads = 1;
        cfg->main_bulk = BULK_NOCONTIG;
        cfg->nocontig = 1;
    } else if (strcmp(shape, "busy") == 0) {
        cfg->blocks = BLOCK_ALL;
        cfg->threads = 2;
        cfg->busy = 1;
    } else if (strcmp(shape, "random") == 0) {
        cfg->blocks = (unsigned)between(rng, 1, BLOCK_ALL);
        cfg->threads = (int)between(rng, 0, 3);
        cfg->thread_blocks = (unsigned)between(rng, 1, BLOCK_ALL);
        cfg->mmapped = (int)between(rng, 0, 3);
    } else {
        return -1;
    }
    return 0;
}

/* Allocate and free a few blocks forever. Sizes above 1032 bytes bypass the tcache, so
 * the unsorted and small bins keep changing (splits, remainders, sorting), while the arena's
 * free total moves by at most the ring's few KiB: a reader can still measure most of it. */
static void churn(struct rng *rng) {
    void *ring[CHURN_BLOCKS] = {0};
    for (size_t i = 0;; i++) {
        size_t slot = i % CHURN_BLOCKS;
        free(ring[slot]);
        ring[slot] = take(between(rng, 16, CHURN_MAX_REQUEST));
    }
}

static char xml_buffer[4 * 1024 * 1024];

int main(int argc, char **argv) {
    if (argc != 4) {
        fprintf(stderr, "usage: %s SEED SHAPE XML_PATH\n", argv[0]);
        return 2;
    }
    char *end = NULL;
    errno = 0;
    uint64_t seed = strtoull(argv[1], &end, 10);
    if (errno != 0 || *end != '\0') {
        fprintf(stderr, "heap_shapes: bad seed %s\n", argv[1]);
        return 2;
    }
    struct rng rng = {seed};
    struct config cfg;
    if (configure(argv[2], &rng, &cfg) != 0) {
        fprintf(stderr, "heap_shapes: unknown shape %s\n", argv[2]);
        return 2;
    }
    if (cfg.nocontig) block_brk(); /* before the first malloc (fopen's) */
    FILE *xml = NULL;
    if (strcmp(argv[3], "-") != 0) {
        xml = fopen(argv[3], "w");
        if (xml == NULL || setvbuf(xml, xml_buffer, _IOFBF, sizeof xml_buffer) != 0) {
            perror(argv[3]);
            return 2;
        }
    }
    if (cfg.fixed_threshold) mallopt(M_MMAP_THRESHOLD, (int)(128 * KIB));

    /* Threads first: pthread_create allocates in the main arena, before its shape. */
    static struct worker workers[MAX_THREADS];
    if (pthread_barrier_init(&built, NULL, (unsigned)cfg.threads + 1) != 0) abort();
    for (int t = 0; t < cfg.threads; t++) {
        workers[t].seed = next_random(&rng);
        workers[t].blocks = cfg.thread_blocks;
        workers[t].bulk = t == 0 && cfg.subheaps_thread ? BULK_SUBHEAPS : BULK_NONE;
        if (pthread_create(&workers[t].thread, NULL, worker_main, &workers[t]) != 0) abort();
    }
    for (int m = 0; m < cfg.mmapped; m++) take(between(&rng, 256, 4096) * KIB);
    build_arena(next_random(&rng), cfg.blocks, cfg.main_bulk);
    pthread_barrier_wait(&built);

    if (xml != NULL) {
        if (malloc_info(0, xml) != 0 || fflush(xml) != 0) {
            perror("malloc_info");
            return 1;
        }
    }
    char line[128];
    int length = snprintf(line, sizeof line, "ready shape=%s threads=%d mmapped=%d\n", argv[2],
                          cfg.threads, cfg.mmapped);
    if (write(1, line, (size_t)length) != length) return 1;
    if (cfg.busy) churn(&rng);
    for (;;) pause();
}
