/* A fragmented heap under whatever allocator LD_PRELOAD puts behind malloc/free, with that
 * allocator's own statistics on demand: the oracle the foreign-allocator tests compare with.
 *
 * Usage: foreign_alloc BLOCKS BLOCK_BYTES KEEP_EVERY THREADS
 * Each of THREADS threads mallocs BLOCKS blocks of BLOCK_BYTES, writes every byte, frees all
 * but every KEEP_EVERY-th (index % KEEP_EVERY == 0), then blocks until the process exits, so
 * its thread cache and arena stay as they are. Then the main thread prints "ready <pid>" and
 * answers one line per command on stdin:
 *   figures  the allocator's own statistics, one line of JSON (see print_figures)
 *   keep     "kept <bytes>": the bytes of every block still held (threads' and main's)
 *   more N   the main thread mallocs N more blocks of BLOCK_BYTES, writes and keeps them:
 *            "more <total kept bytes>"
 *   quit     exits 0
 * Unknown commands are answered "error <what>".
 *
 * The only malloc calls the program makes are the blocks themselves: its bookkeeping
 * (pointer arrays) lives in mmap'd memory and stdio runs on static buffers, so an allocator's
 * "allocated" figure is the kept bytes plus what the C library allocates for itself (thread
 * control blocks, dlsym), a small constant the tests measure.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

/* The main thread's "more" blocks: reserved, not committed, so only used slots cost RSS. */
#define MORE_CAPACITY (1u << 22)

typedef int (*mallctl_fn)(const char *, void *, size_t *, void *, size_t);
typedef int (*tc_property_fn)(const char *, size_t *);
typedef void (*mi_process_info_fn)(size_t *, size_t *, size_t *, size_t *, size_t *, size_t *,
                                   size_t *, size_t *);
typedef int (*mi_version_fn)(void);

static long blocks;
static size_t block_bytes;
static long keep_every;
static long threads;

static mallctl_fn je_mallctl;
static tc_property_fn tc_property;
static mi_process_info_fn mi_info;
static mi_version_fn mi_ver;
static const char *malloc_library = "";

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t all_done = PTHREAD_COND_INITIALIZER;
static pthread_cond_t never = PTHREAD_COND_INITIALIZER;
static long threads_done;
static size_t kept_bytes;

static void **more_blocks;
static size_t more_count;

/* stdio allocates its buffers on first use; static ones keep it off the heap entirely. */
static char stdout_buffer[8192];
static char stdin_buffer[8192];
static char line[8192];

static void *map_or_die(size_t bytes) {
    void *p = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE,
                   -1, 0);
    if (p == MAP_FAILED) {
        fprintf(stderr, "mmap %zu: %s\n", bytes, strerror(errno));
        exit(2);
    }
    return p;
}

static void *block_or_die(unsigned char fill) {
    unsigned char *p = malloc(block_bytes);
    if (p == NULL) {
        fprintf(stderr, "malloc %zu failed\n", block_bytes);
        exit(2);
    }
    memset(p, fill, block_bytes);
    /* Without this the compiler may drop the writes to blocks that are freed unread, and
     * their pages would never become resident (dirty) memory in the allocator. */
    __asm__ volatile("" : : "r"(p) : "memory");
    return p;
}

static void *worker(void *arg) {
    long index = (long)(intptr_t)arg;
    void **mine = map_or_die((size_t)blocks * sizeof *mine);
    for (long i = 0; i < blocks; i++) mine[i] = block_or_die((unsigned char)(index + i + 1));
    size_t kept = 0;
    for (long i = 0; i < blocks; i++) {
        if (i % keep_every == 0) {
            kept += block_bytes;
        } else {
            free(mine[i]);
            mine[i] = NULL;
        }
    }
    pthread_mutex_lock(&lock);
    kept_bytes += kept;
    threads_done++;
    pthread_cond_signal(&all_done);
    /* Stay alive holding the blocks: the thread's cache and arena must outlive the run. */
    for (;;) pthread_cond_wait(&never, &lock);
    return NULL;
}

/* Resolve the allocator's statistics entry points once, before any figures are taken:
 * dlsym may allocate (its error state), which must not land between two snapshots. */
static void find_allocator(void) {
    je_mallctl = (mallctl_fn)dlsym(RTLD_DEFAULT, "mallctl");
    tc_property = (tc_property_fn)dlsym(RTLD_DEFAULT, "MallocExtension_GetNumericProperty");
    mi_info = (mi_process_info_fn)dlsym(RTLD_DEFAULT, "mi_process_info");
    mi_ver = (mi_version_fn)dlsym(RTLD_DEFAULT, "mi_version");
    Dl_info where;
    void *malloc_address = dlsym(RTLD_DEFAULT, "malloc");
    if (malloc_address != NULL && dladdr(malloc_address, &where) && where.dli_fname != NULL)
        malloc_library = where.dli_fname;
}

static size_t je_size(const char *name, int *ok) {
    size_t value = 0, len = sizeof value;
    if (je_mallctl(name, &value, &len, NULL, 0) != 0) *ok = 0;
    return value;
}

/* Every number is read before anything is printed: the figures describe the heap as the
 * program left it, not as formatting the answer changed it. snprintf of integers into a
 * static buffer does not allocate. */
static char json[4096];

static void print_figures(void) {
    size_t n = 0;
    if (je_mallctl != NULL) {
        uint64_t epoch = 1;
        size_t epoch_len = sizeof epoch;
        /* Writing "epoch" makes jemalloc refresh its cached statistics. */
        je_mallctl("epoch", &epoch, &epoch_len, &epoch, sizeof epoch);
        int ok = 1;
        size_t allocated = je_size("stats.allocated", &ok);
        size_t active = je_size("stats.active", &ok);
        size_t metadata = je_size("stats.metadata", &ok);
        size_t resident = je_size("stats.resident", &ok);
        size_t mapped = je_size("stats.mapped", &ok);
        size_t retained = je_size("stats.retained", &ok);
        size_t page = je_size("arenas.page", &ok);
        unsigned narenas = 0;
        size_t len = sizeof narenas;
        if (je_mallctl("arenas.narenas", &narenas, &len, NULL, 0) != 0) ok = 0;
        size_t pdirty = 0, pmuzzy = 0;
        unsigned arenas_read = 0;
        char name[128];
        for (unsigned i = 0; i < narenas; i++) {
            /* Arenas no thread has used yet have no statistics: their mallctl fails. */
            size_t dirty = 0, muzzy = 0, size_len = sizeof dirty;
            snprintf(name, sizeof name, "stats.arenas.%u.pdirty", i);
            if (je_mallctl(name, &dirty, &size_len, NULL, 0) != 0) continue;
            snprintf(name, sizeof name, "stats.arenas.%u.pmuzzy", i);
            size_len = sizeof muzzy;
            if (je_mallctl(name, &muzzy, &size_len, NULL, 0) != 0) continue;
            pdirty += dirty;
            pmuzzy += muzzy;
            arenas_read++;
        }
        n = (size_t)snprintf(
            json, sizeof json,
            "{\"allocator\":\"jemalloc\",\"ok\":%s,\"allocated\":%zu,\"active\":%zu,"
            "\"metadata\":%zu,\"resident\":%zu,\"mapped\":%zu,\"retained\":%zu,"
            "\"narenas\":%u,\"page\":%zu,\"pdirty\":%zu,\"pmuzzy\":%zu,\"arenas_read\":%u",
            ok ? "true" : "false", allocated, active, metadata, resident, mapped, retained,
            narenas, page, pdirty, pmuzzy, arenas_read);
    } else if (tc_property != NULL) {
        static const char *const names[] = {
            "generic.current_allocated_bytes",    "generic.heap_size",
            "tcmalloc.pageheap_free_bytes",       "tcmalloc.pageheap_unmapped_bytes",
            "tcmalloc.central_cache_free_bytes",  "tcmalloc.transfer_cache_free_bytes",
            "tcmalloc.thread_cache_free_bytes",
        };
        enum { COUNT = sizeof names / sizeof names[0] };
        size_t values[COUNT];
        int ok = 1;
        for (int i = 0; i < COUNT; i++) {
            values[i] = 0;
            if (!tc_property(names[i], &values[i])) ok = 0; /* returns true on success */
        }
        n = (size_t)snprintf(json, sizeof json, "{\"allocator\":\"tcmalloc\",\"ok\":%s",
                             ok ? "true" : "false");
        for (int i = 0; i < COUNT; i++)
            n += (size_t)snprintf(json + n, sizeof json - n, ",\"%s\":%zu", names[i], values[i]);
    } else if (mi_info != NULL) {
        size_t elapsed = 0, user = 0, sys = 0, rss = 0, peak_rss = 0, commit = 0, peak_commit = 0,
               faults = 0;
        mi_info(&elapsed, &user, &sys, &rss, &peak_rss, &commit, &peak_commit, &faults);
        int version = mi_ver != NULL ? mi_ver() : -1;
        n = (size_t)snprintf(
            json, sizeof json,
            "{\"allocator\":\"mimalloc\",\"ok\":true,\"elapsed_msecs\":%zu,\"user_msecs\":%zu,"
            "\"system_msecs\":%zu,\"current_rss\":%zu,\"peak_rss\":%zu,\"current_commit\":%zu,"
            "\"peak_commit\":%zu,\"page_faults\":%zu",
            elapsed, user, sys, rss, peak_rss, commit, peak_commit, faults);
        if (version >= 0) n += (size_t)snprintf(json + n, sizeof json - n, ",\"version\":%d", version);
    } else {
        n = (size_t)snprintf(json, sizeof json, "{\"allocator\":\"glibc\",\"ok\":true");
    }
    /* Which object serves malloc: proof that LD_PRELOAD took, not just that it loaded. The
     * path comes from the dynamic linker and holds no quote or backslash in practice. */
    snprintf(json + n, sizeof json - n, ",\"malloc_library\":\"%s\"}", malloc_library);
    puts(json);
    fflush(stdout);
}

static void more(long count) {
    pthread_mutex_lock(&lock);
    for (long i = 0; i < count; i++) {
        more_blocks[more_count++] = block_or_die((unsigned char)(i + 7));
        kept_bytes += block_bytes;
    }
    size_t total = kept_bytes;
    pthread_mutex_unlock(&lock);
    printf("more %zu\n", total);
    fflush(stdout);
}

static long parse_positive(const char *text, const char *what) {
    char *end = NULL;
    long value = strtol(text, &end, 10);
    if (end == text || *end != '\0' || value <= 0) {
        fprintf(stderr, "%s must be a positive integer, not '%s'\n", what, text);
        exit(2);
    }
    return value;
}

int main(int argc, char **argv) {
    setvbuf(stdout, stdout_buffer, _IOFBF, sizeof stdout_buffer);
    setvbuf(stdin, stdin_buffer, _IOFBF, sizeof stdin_buffer);
    if (argc != 5) {
        fprintf(stderr, "usage: %s BLOCKS BLOCK_BYTES KEEP_EVERY THREADS\n", argv[0]);
        return 2;
    }
    blocks = parse_positive(argv[1], "BLOCKS");
    block_bytes = (size_t)parse_positive(argv[2], "BLOCK_BYTES");
    keep_every = parse_positive(argv[3], "KEEP_EVERY");
    threads = parse_positive(argv[4], "THREADS");
    find_allocator();
    more_blocks = map_or_die(MORE_CAPACITY * sizeof *more_blocks);

    for (long t = 0; t < threads; t++) {
        pthread_t id;
        int rc = pthread_create(&id, NULL, worker, (void *)(intptr_t)t);
        if (rc != 0) {
            fprintf(stderr, "pthread_create: %s\n", strerror(rc));
            return 2;
        }
    }
    pthread_mutex_lock(&lock);
    while (threads_done < threads) pthread_cond_wait(&all_done, &lock);
    pthread_mutex_unlock(&lock);

    printf("ready %d\n", (int)getpid());
    fflush(stdout);
    while (fgets(line, sizeof line, stdin) != NULL) {
        line[strcspn(line, "\r\n")] = '\0';
        if (strcmp(line, "figures") == 0) {
            print_figures();
        } else if (strcmp(line, "keep") == 0) {
            pthread_mutex_lock(&lock);
            size_t total = kept_bytes;
            pthread_mutex_unlock(&lock);
            printf("kept %zu\n", total);
            fflush(stdout);
        } else if (strncmp(line, "more ", 5) == 0) {
            char *end = NULL;
            long count = strtol(line + 5, &end, 10);
            if (end == line + 5 || *end != '\0' || count < 0) {
                printf("error bad count '%s'\n", line + 5);
                fflush(stdout);
            } else if ((size_t)count > MORE_CAPACITY - more_count) {
                printf("error at most %zu more blocks\n", (size_t)MORE_CAPACITY - more_count);
                fflush(stdout);
            } else {
                more(count);
            }
        } else if (strcmp(line, "quit") == 0) {
            return 0;
        } else {
            printf("error unknown command '%s'\n", line);
            fflush(stdout);
        }
    }
    return 0; /* stdin closed: the test is gone */
}
