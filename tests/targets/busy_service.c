/* A busy multi-threaded service over a fragmented heap, with a health check on loopback.
 *
 * Usage: busy_service [THREADS [FRAG_BLOCKS [BLOCK_BYTES [KEEP_EVERY]]]]
 * (defaults 4 4000 2048 8). The main thread and every worker first allocate FRAG_BLOCKS
 * blocks of BLOCK_BYTES, fill them, and free all but every KEEP_EVERY-th: each arena then
 * holds runs of free blocks between pinned ones (the fragmented heap a trim can shrink).
 * Each worker then churns a small working set (WORKSET slots of 16 .. 1040 bytes) in
 * bursts: replace a random slot after checking its whole content, and re-check one pinned
 * block per burst. The working set has a constant size, so the arena's free memory is
 * steady while its free lists change all the time. A content mismatch is counted, never
 * ignored: the health check reports it.
 *
 * Health check: a TCP listener on 127.0.0.1 (port chosen by the kernel, printed as
 * "ready port=N"); each line received is answered "ok ops=N errors=E pinned=P".
 */
#include <arpa/inet.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#define WORKSET 256
#define BURST_OPS 400

static int frag_blocks = 4000;
static size_t block_bytes = 2048;
static int keep_every = 8;
static atomic_ulong operations;
static atomic_ulong errors;
static atomic_ulong pinned_total;

static unsigned char pattern_byte(unsigned seed, size_t i) {
    return (unsigned char)((seed * 2654435761u + (unsigned)i * 40503u) >> 13);
}

struct block {
    unsigned char *data;
    size_t size;
    unsigned seed;
};

static void fill(struct block *b) {
    for (size_t i = 0; i < b->size; i++) b->data[i] = pattern_byte(b->seed, i);
}

static void check(const struct block *b) {
    for (size_t i = 0; i < b->size; i++) {
        if (b->data[i] != pattern_byte(b->seed, i)) {
            atomic_fetch_add(&errors, 1);
            return;
        }
    }
}

/* Allocate frag_blocks blocks, keep every keep_every-th: returns the pinned ones. */
static struct block *fragment(unsigned seed_base, int *pinned_count) {
    struct block *all = calloc((size_t)frag_blocks, sizeof *all);
    int kept = 0;
    for (int i = 0; i < frag_blocks; i++) {
        all[i].size = block_bytes;
        all[i].seed = seed_base + (unsigned)i;
        all[i].data = malloc(block_bytes);
        fill(&all[i]);
    }
    for (int i = 0; i < frag_blocks; i++) {
        if (i % keep_every == 0) {
            all[kept++] = all[i];
        } else {
            check(&all[i]);
            free(all[i].data);
        }
    }
    *pinned_count = kept;
    atomic_fetch_add(&pinned_total, (unsigned long)kept);
    return all;
}

static void *worker(void *arg) {
    unsigned id = (unsigned)(uintptr_t)arg;
    int pinned_count = 0;
    struct block *pinned = fragment(id * 1000003u, &pinned_count);
    struct block set[WORKSET];
    unsigned state = id * 7919u + 1;
    unsigned generation = 0;
    for (int i = 0; i < WORKSET; i++) {
        set[i].size = 16 + (i * 37) % 1024;
        set[i].seed = ++generation + id * 100000000u;
        set[i].data = malloc(set[i].size);
        fill(&set[i]);
    }
    struct timespec pause = {0, 1000000}; /* 1 ms between bursts: busy, not a CPU hog */
    int next_pinned = 0;
    for (;;) {
        for (int op = 0; op < BURST_OPS; op++) {
            state = state * 1103515245u + 12345u;
            int slot = (int)((state >> 8) % WORKSET);
            check(&set[slot]);
            free(set[slot].data);
            set[slot].size = 16 + (state >> 4) % 1025;
            set[slot].seed = ++generation + id * 100000000u;
            set[slot].data = malloc(set[slot].size);
            fill(&set[slot]);
        }
        check(&pinned[next_pinned]);
        next_pinned = (next_pinned + 1) % pinned_count;
        atomic_fetch_add(&operations, BURST_OPS);
        nanosleep(&pause, NULL);
    }
    return NULL;
}

int main(int argc, char **argv) {
    int threads = argc > 1 ? atoi(argv[1]) : 4;
    if (argc > 2) frag_blocks = atoi(argv[2]);
    if (argc > 3) block_bytes = (size_t)atol(argv[3]);
    if (argc > 4) keep_every = atoi(argv[4]);
    if (threads < 1 || frag_blocks < 1 || block_bytes < 16 || keep_every < 1) {
        fprintf(stderr, "usage: busy_service [THREADS [FRAG_BLOCKS [BLOCK_BYTES [KEEP]]]]\n");
        return 2;
    }

    int main_pinned = 0;
    struct block *main_blocks = fragment(0xabcdefu, &main_pinned);

    int listener = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in addr = {0};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof addr;
    if (listener < 0 || bind(listener, (struct sockaddr *)&addr, sizeof addr) != 0 ||
        listen(listener, 8) != 0 || getsockname(listener, (struct sockaddr *)&addr, &len) != 0) {
        perror("listen");
        return 1;
    }

    for (int t = 0; t < threads; t++) {
        pthread_t tid;
        if (pthread_create(&tid, NULL, worker, (void *)(uintptr_t)(t + 1)) != 0) {
            perror("pthread_create");
            return 1;
        }
        pthread_detach(tid);
    }
    /* Ready once every worker has fragmented its arena: the heap shape is then steady. */
    unsigned long expected = (unsigned long)main_pinned * (unsigned long)(threads + 1);
    while (atomic_load(&pinned_total) < expected || atomic_load(&operations) == 0) {
        usleep(1000);
    }
    printf("ready port=%d\n", ntohs(addr.sin_port));
    fflush(stdout);

    for (;;) {
        int conn = accept(listener, NULL, NULL);
        if (conn < 0) continue;
        FILE *io = fdopen(conn, "r+");
        char line[256];
        while (io != NULL && fgets(line, sizeof line, io) != NULL) {
            for (int i = 0; i < main_pinned; i += 97) check(&main_blocks[i]);
            fprintf(io, "ok ops=%lu errors=%lu pinned=%lu\n", atomic_load(&operations),
                    atomic_load(&errors), atomic_load(&pinned_total));
            fflush(io);
        }
        if (io != NULL) fclose(io);
    }
}
