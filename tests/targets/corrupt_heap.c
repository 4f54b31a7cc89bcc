/* A target that corrupts its own free lists, then idles: the bad input memforensics must
 * report, never call into. Run it with GLIBC_TUNABLES=glibc.malloc.tcache_count=0 so that
 * frees reach the bins.
 *
 * Usage: [CORRUPT_HEAP_PAD_MIB=N] corrupt_heap SPEC...  Each SPEC corrupts one arena: the first the main arena, each
 * further one a thread's own arena (one thread per SPEC). A SPEC is a named case:
 *   intact      nothing corrupted (the control)
 *   cycle       two small-bin chunks linked in a cycle (the fd of each names the other)
 *   self        a small-bin chunk linked to itself
 *   unmapped    a small-bin chunk's fd pointing to unmapped memory
 *   fastloop    a fastbin looping (its second chunk's fd names the first)
 *   largeloop   a large bin looping
 *   topsize     the top chunk's size absurd
 *   badsize     a small-bin chunk's size absurd
 *   zerosize    a small-bin chunk's size 0
 * or a number, a seed: one free chunk's header field (size, fd, bk, fd_nextsize,
 * bk_nextsize) set to a random value, another chunk, a small integer or itself.
 * For each SPEC it prints "arena INDEX 0x..." (its malloc_state, found from the unsorted bin)
 * and "corrupted INDEX SPEC chunk=0x... field=F value=0x..." (or "intact INDEX"), then "ready N" once every arena is set up, and
 * sleeps in pause() for ever. */
/* It reads and writes freed chunks on purpose: that is its job. */
#pragma GCC diagnostic ignored "-Wpragmas"
#pragma GCC diagnostic ignored "-Wuse-after-free"
#include <gnu/libc-version.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#define NFAST 3
#define NSMALL 3
#define NLARGE 3

struct arena_set {
    uintptr_t fast[NFAST];   /* chunk addresses (header), in a fastbin */
    uintptr_t small[NSMALL]; /* in one small bin (0x110 bytes) */
    uintptr_t large[NLARGE]; /* in one large bin (0x500, 0x510, 0x520) */
    uintptr_t unsorted;      /* in the unsorted bin (0x210 bytes) */
    uintptr_t guard;         /* an allocated chunk */
    uintptr_t top;           /* the arena's top chunk */
    uintptr_t arena;         /* its malloc_state, from the unsorted chunk's fd */
};

static int safe_linking;
static int small_bins_first; /* glibc >= 2.41: free puts small chunks in their bin */
static pthread_barrier_t barrier;
static pthread_mutex_t print_lock = PTHREAD_MUTEX_INITIALIZER;
/* Every line printed before "ready" is also appended to the ready line, after " ; ", for a
 * test harness that keeps only that line. */
static char records[1 << 15];
static size_t records_used;

static void say(const char *format, ...) __attribute__((format(printf, 1, 2)));
static void say(const char *format, ...) {
    char line[512];
    va_list args;
    va_start(args, format);
    vsnprintf(line, sizeof line, format, args);
    va_end(args);
    pthread_mutex_lock(&print_lock);
    printf("%s\n", line);
    fflush(stdout);
    records_used += (size_t)snprintf(records + records_used, sizeof records - records_used,
                                     " ; %s", line);
    if (records_used >= sizeof records) records_used = sizeof records - 1;
    pthread_mutex_unlock(&print_lock);
}

#define CHUNK(p) ((uintptr_t)(p) - 16)
#define WORD(chunk, n) (((uintptr_t *)(chunk))[n])
/* Word indexes in a chunk: prev_size, size, fd, bk, fd_nextsize, bk_nextsize. */
enum { W_PREV, W_SIZE, W_FD, W_BK, W_FDN, W_BKN };

/* Build the lists: every free chunk between two allocated guards, so none coalesces. */
/* CORRUPT_HEAP_PAD_MIB=N: N MiB (at most 512) of live, written 64 KiB blocks in the arena
 * first, so that the read scouts it (an arena of 32 MiB or more; past the copies' budget, one
 * never copied whole): the corruption is then met by the scout and by the walk over the
 * scouted copy.
 * CORRUPT_HEAP_SPREAD=N: then N (at most 20,000) pairs of a live, written 24 KiB block and a
 * small one, the small ones freed: N free chunks of 0x120 to 0x3f0 bytes (never a size the
 * named lists use), each on a page of its own, one page in six, so that the arena's lists
 * lie on more pages than one stop of the read copies (and on few enough of its pages to be
 * scouted), and it is read in parts (a run of bins per stop). The named lists, built after,
 * are sorted with them. */
static void pad(void) {
    const char *value = getenv("CORRUPT_HEAP_PAD_MIB");
    long blocks = value == NULL ? 0 : atol(value) * 16;
    for (long i = 0; i < blocks && i < 16 * 512; i++) {
        void *block = malloc(64 * 1024 - 64);
        if (block != NULL) memset(block, 0x5a, 64 * 1024 - 64);
    }
    value = getenv("CORRUPT_HEAP_SPREAD");
    long pairs = value == NULL ? 0 : atol(value);
    if (pairs > 20000) pairs = 20000;
    if (pairs <= 0) return;
    /* (The pointers kept outside the heap: the arena holds the pairs alone.) */
    void **smalls = mmap(NULL, 20000 * sizeof *smalls, PROT_READ | PROT_WRITE,
                         MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (smalls == MAP_FAILED) return;
    for (long i = 0; i < pairs; i++) {
        void *block = malloc(24 * 1024 - 16);
        if (block != NULL) memset(block, 0x5a, 24 * 1024 - 16);
        size_t size = 0x120 + 0x10 * (size_t)(i % 46); /* 0x120 .. 0x3f0 */
        if (size == 0x210) size = 0x220;                /* the named unsorted chunk's */
        smalls[i] = malloc(size - 8);
    }
    for (long i = 0; i < pairs; i++) free(smalls[i]);
    munmap(smalls, 20000 * sizeof *smalls);
}

static void build(struct arena_set *set) {
    void *keep[32];
    int kept = 0;
    pad();
    void *small[NSMALL], *large[NLARGE], *fast[NFAST], *unsorted;
    for (int i = 0; i < NSMALL; i++) {
        small[i] = malloc(0x108);
        keep[kept++] = malloc(0x18);
    }
    for (int i = 0; i < NLARGE; i++) {
        large[i] = malloc(0x4f8 + 0x10 * (size_t)i);
        keep[kept++] = malloc(0x18);
    }
    for (int i = 0; i < NFAST; i++) {
        fast[i] = malloc(0x38);
        keep[kept++] = malloc(0x18);
    }
    unsorted = malloc(0x208);
    keep[kept++] = malloc(0x18);
    /* Addresses taken while the blocks are still allocated. */
    for (int i = 0; i < NSMALL; i++) set->small[i] = CHUNK(small[i]);
    for (int i = 0; i < NLARGE; i++) set->large[i] = CHUNK(large[i]);
    for (int i = 0; i < NFAST; i++) set->fast[i] = CHUNK(fast[i]);
    set->unsorted = CHUNK(unsorted);
    set->guard = CHUNK(keep[0]);
    for (int i = 0; i < NSMALL; i++) free(small[i]);
    for (int i = 0; i < NLARGE; i++) free(large[i]);
    /* A request no free chunk fits sorts the unsorted bin into the small and large bins. */
    keep[kept++] = malloc(0x2000);
    uintptr_t big = CHUNK(keep[kept - 1]);
    set->top = big + (WORD(big, W_SIZE) & ~(uintptr_t)7);
    for (int i = 0; i < NFAST; i++) free(fast[i]);
    free(unsorted);
    /* Freed last, it heads its bin: its bk is bin_at(arena, bin), at the arena's bins (0x70)
     * less 0x10 plus 16 per bin. That is the unsorted bin (1), but from glibc 2.41 on a
     * freed small chunk goes straight to its small bin (0x210 bytes: bin 33). The test reads
     * the arena's mutex (its first word) there itself. */
    set->arena = WORD(set->unsorted, W_BK) - 0x60 - (small_bins_first ? 16 * 32 : 0);
}

static uintptr_t protect(uintptr_t position, uintptr_t pointer) {
    return safe_linking ? ((position + 16) >> 12) ^ pointer : pointer;
}

static uint64_t next_random(uint64_t *state) { /* splitmix64 */
    uint64_t z = (*state += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

static void report(int index, const char *spec, uintptr_t chunk, const char *field, uintptr_t value) {
    say("corrupted %d %s chunk=0x%lx field=%s value=0x%lx", index, spec, (unsigned long)chunk,
        field, (unsigned long)value);
}

static const char *FIELDS[] = {"prev_size", "size", "fd", "bk", "fd_nextsize", "bk_nextsize"};

static void seeded(struct arena_set *set, int index, const char *spec, uint64_t seed) {
    uint64_t state = seed * 0x2545f4914f6cdd1dULL + 1;
    uintptr_t all[NFAST + NSMALL + NLARGE + 2];
    int n = 0;
    for (int i = 0; i < NFAST; i++) all[n++] = set->fast[i];
    for (int i = 0; i < NSMALL; i++) all[n++] = set->small[i];
    for (int i = 0; i < NLARGE; i++) all[n++] = set->large[i];
    all[n++] = set->unsorted;
    all[n++] = set->guard;
    for (int attempt = 0; attempt < 64; attempt++) {
        int which = (int)(next_random(&state) % (uint64_t)(n - 1)); /* a free chunk */
        uintptr_t chunk = all[which];
        int is_large = which >= NFAST + NSMALL && which < NFAST + NSMALL + NLARGE;
        int is_fast = which < NFAST;
        int field = is_large ? W_SIZE + (int)(next_random(&state) % 5)
                  : is_fast  ? W_SIZE + (int)(next_random(&state) % 2)
                             : W_SIZE + (int)(next_random(&state) % 3);
        uintptr_t value;
        switch (next_random(&state) % 4) {
        case 0: value = (uintptr_t)next_random(&state); break;
        case 1: value = all[next_random(&state) % (uint64_t)n]; break;
        case 2: value = (uintptr_t)(next_random(&state) % 65); break;
        default: value = chunk; break;
        }
        if (is_fast && field == W_FD) {
            /* A fastbin is singly linked (fast[2] -> fast[1] -> fast[0] -> NULL): an fd that
             * skips ahead to a later chunk of its own list, or ends it early, leaves a valid
             * shorter list, a leak no reader can see (glibc neither): drawn again. */
            int valid = value == 0;
            for (int j = 0; j < which; j++) valid |= value == set->fast[j];
            if (valid) continue;
            value = protect(chunk, value);
        }
        /* The unsorted chunk is alone in its bin: its nextsize words mean nothing. */
        if (WORD(chunk, field) == value) continue; /* no change: draw again */
        /* Only the flag bits changed: glibc reads the same size, so does everyone. */
        if (field == W_SIZE && (WORD(chunk, field) & ~(uintptr_t)7) == (value & ~(uintptr_t)7))
            continue;
        WORD(chunk, field) = value;
        report(index, spec, chunk, FIELDS[field], value);
        return;
    }
}

static void corrupt(struct arena_set *set, int index, const char *spec) {
    uintptr_t a = set->small[0], b = set->small[1];
    say("arena %d 0x%lx", index, (unsigned long)set->arena);
    if (strcmp(spec, "intact") == 0) {
        say("intact %d", index);
    } else if (strcmp(spec, "cycle") == 0) {
        /* small[0] and small[1] linked to each other, whichever order the bin has. */
        WORD(b, W_FD) = a;
        WORD(a, W_FD) = b;
        report(index, spec, a, "fd", b);
    } else if (strcmp(spec, "self") == 0) {
        WORD(a, W_FD) = a;
        report(index, spec, a, "fd", a);
    } else if (strcmp(spec, "unmapped") == 0) {
        WORD(a, W_FD) = 0x10000000000UL;
        report(index, spec, a, "fd", 0x10000000000UL);
    } else if (strcmp(spec, "fastloop") == 0) {
        /* fastbin: head -> fast[2] -> fast[1] -> fast[0]; fast[0]'s fd made fast[2]. */
        uintptr_t value = protect(set->fast[0], set->fast[2]);
        WORD(set->fast[0], W_FD) = value;
        report(index, spec, set->fast[0], "fd", value);
    } else if (strcmp(spec, "largeloop") == 0) {
        uintptr_t first = set->large[0], second = set->large[1];
        WORD(second, W_FD) = first;
        WORD(first, W_FD) = second;
        report(index, spec, first, "fd", second);
    } else if (strcmp(spec, "topsize") == 0) {
        uintptr_t top = set->top;
        WORD(top, W_SIZE) = 0x7ffffffffff1UL;
        report(index, spec, top, "size", 0x7ffffffffff1UL);
    } else if (strcmp(spec, "badsize") == 0) {
        WORD(a, W_SIZE) = 0x4141414141414141UL;
        report(index, spec, a, "size", 0x4141414141414141UL);
    } else if (strcmp(spec, "zerosize") == 0) {
        WORD(a, W_SIZE) = 0;
        report(index, spec, a, "size", 0);
    } else {
        seeded(set, index, spec, strtoull(spec, NULL, 10));
    }
}

struct job {
    int index;
    const char *spec;
};

static void *worker(void *arg) {
    struct job *job = arg;
    struct arena_set set;
    build(&set);
    /* A thread arena's malloc_state is its heaps' ar_ptr, the first word of the heap_info at
     * the start of each heap (aligned to HEAP_MAX_SIZE, 64 MiB on 64-bit): exact whichever bin
     * the unsorted chunk went to (glibc 2.41 puts it in the unsorted bin all the same once the
     * padding has spread the arena over several heaps). */
    set.arena = WORD(set.unsorted & ~(((uintptr_t)64 << 20) - 1), 0);
    corrupt(&set, job->index, job->spec);
    pthread_barrier_wait(&barrier);
    for (;;) pause();
    return NULL;
}

int main(int argc, char **argv) {
    if (argc < 2) {
        fprintf(stderr, "usage: corrupt_heap SPEC...\n");
        return 2;
    }
    /* stdout's buffer is ours, not malloc's: nothing is allocated after the corruption. */
    static char out_buffer[1 << 16];
    setvbuf(stdout, out_buffer, _IOFBF, sizeof out_buffer);
    int major = 0, minor = 0;
    sscanf(gnu_get_libc_version(), "%d.%d", &major, &minor);
    safe_linking = major > 2 || (major == 2 && minor >= 32);
    small_bins_first = major > 2 || (major == 2 && minor >= 41);
    int threads = argc - 2;
    pthread_barrier_init(&barrier, NULL, (unsigned)threads + 1);
    static struct job jobs[256];
    if (threads > 255) return 2;
    /* Thread arenas first: the main arena's corruption must not meet their start-up. */
    for (int i = 0; i < threads; i++) {
        pthread_t tid;
        jobs[i].index = i + 1;
        jobs[i].spec = argv[i + 2];
        if (pthread_create(&tid, NULL, worker, &jobs[i]) != 0) return 2;
    }
    pthread_barrier_wait(&barrier);
    struct arena_set set;
    build(&set);
    corrupt(&set, 0, argv[1]);
    printf("ready %d%s\n", threads + 1, records);
    fflush(stdout);
    for (;;) pause();
}
