/* Heaps whose pins the program knows: the live chunk that holds freed memory below it in
 * place, at the user address the program holds, and the bytes it freed below it.
 *   pin_shapes last  [N] [SIZE]   main heap: N buffers, all but the last freed (the last,
 *                                 text "GET /api/v1/orders…", pins every other one)
 *   pin_shapes first [N] [SIZE]   main heap: all but the first freed (nothing pinned)
 *   pin_shapes thread [N] [SIZE]  a thread arena's heap: all but the middle buffer freed
 *                                 (it pins the lower half; the upper half goes back)
 *   pin_shapes arenas [K] [N]     K threads, each pinning N-1 freed buffers in its own arena
 * Prints one line, "ready" then per pin " pin=ADDR:FREED_USER_BYTES:FREED_CHUNK_BYTES"
 * (chunk bytes by glibc's own malloc_usable_size + 8), with no malloc before the shape is
 * built (the line is written with write(2) from a stack buffer). Reads commands on stdin:
 * "release" frees every pin, then frees one more block (a later free()), and prints
 * "released"; "quit" exits; at the end of stdin it stays as it is until killed. */
#include <malloc.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define MAX_PINS 64
static void *pins[MAX_PINS];
static size_t freed_user[MAX_PINS], freed_chunk[MAX_PINS];
static int pin_count;
static int buffers = 200;
static size_t buffer_bytes = 64 * 1024;
static pthread_barrier_t built;
static pthread_mutex_t record = PTHREAD_MUTEX_INITIALIZER;

static const char REQUEST[] = "GET /api/v1/orders?page=7 HTTP/1.1\r\nHost: shop.example\r\n";

static void fill(void *block, size_t bytes, int text) {
    if (text) {  /* the request over and over, as a log buffer holds it; NUL-terminated */
        char *at = block;
        for (size_t i = 0; i + 1 < bytes; i++) at[i] = REQUEST[i % (sizeof REQUEST - 1)];
        at[bytes - 1] = 0;
    } else {
        memset(block, 0x5a, bytes);
    }
}

/* Allocate ``count`` buffers, keep the one at ``keep``, free the others; record the pin
 * and what it holds below it (the buffers before it). */
static void build(int count, int keep, int text) {
    void **blocks = malloc((size_t)count * sizeof(void *));
    for (int i = 0; i < count; i++) {
        blocks[i] = malloc(buffer_bytes);
        fill(blocks[i], buffer_bytes, text && i == keep);
    }
    size_t user = 0, chunk = 0;
    for (int i = 0; i < count; i++) {
        if (i == keep) continue;
        if (i < keep) {
            user += buffer_bytes;
            chunk += malloc_usable_size(blocks[i]) + 8;
        }
        free(blocks[i]);
    }
    void *kept = blocks[keep];
    /* The table of pointers lives above the buffers only if it was allocated last; it was
     * allocated first, so freeing it touches nothing the pin holds. */
    free(blocks);
    pthread_mutex_lock(&record);
    if (keep > 0 && pin_count < MAX_PINS) {
        pins[pin_count] = kept;
        freed_user[pin_count] = user;
        freed_chunk[pin_count] = chunk;
        pin_count++;
    } else if (pin_count < MAX_PINS) {
        pins[pin_count] = kept;  /* kept but pinning nothing: reported with 0 bytes */
        freed_user[pin_count] = 0;
        freed_chunk[pin_count] = 0;
        pin_count++;
    }
    pthread_mutex_unlock(&record);
}

static void *thread_middle(void *arg) {
    (void)arg;
    build(buffers, buffers / 2, 0);
    pthread_barrier_wait(&built);
    for (;;) pause();
    return NULL;
}

static void *thread_last(void *arg) {
    (void)arg;
    build(buffers, buffers - 1, 0);
    pthread_barrier_wait(&built);
    for (;;) pause();
    return NULL;
}

static void say(const char *line) {
    size_t left = strlen(line);
    while (left) {
        ssize_t done = write(1, line, left);
        if (done <= 0) exit(3);
        line += done;
        left -= (size_t)done;
    }
}

int main(int argc, char **argv) {
    const char *mode = argc > 1 ? argv[1] : "last";
    int threads = 0;
    if (strcmp(mode, "arenas") == 0) {
        threads = argc > 2 ? atoi(argv[2]) : 4;
        if (argc > 3) buffers = atoi(argv[3]);
    } else {
        if (argc > 2) buffers = atoi(argv[2]);
        if (argc > 3) buffer_bytes = (size_t)atol(argv[3]);
    }
    if (buffers < 2 || threads > MAX_PINS) return 2;
    if (strcmp(mode, "last") == 0) {
        build(buffers, buffers - 1, 1);
    } else if (strcmp(mode, "first") == 0) {
        build(buffers, 0, 1);
    } else if (strcmp(mode, "thread") == 0 || strcmp(mode, "arenas") == 0) {
        int count = threads ? threads : 1;
        pthread_barrier_init(&built, NULL, (unsigned)count + 1);
        for (int i = 0; i < count; i++) {
            pthread_t tid;
            if (pthread_create(&tid, NULL, threads ? thread_last : thread_middle, NULL) != 0)
                return 2;
        }
        pthread_barrier_wait(&built);
    } else {
        return 2;
    }
    char line[64 * MAX_PINS + 16];
    size_t used = (size_t)snprintf(line, sizeof line, "ready");
    for (int i = 0; i < pin_count; i++)
        used += (size_t)snprintf(line + used, sizeof line - used, " pin=%p:%zu:%zu", pins[i],
                                 freed_user[i], freed_chunk[i]);
    snprintf(line + used, sizeof line - used, "\n");
    say(line);
    char command[64];
    while (fgets(command, sizeof command, stdin)) {
        if (strncmp(command, "release", 7) == 0) {
            for (int i = 0; i < pin_count; i++) free(pins[i]);
            pin_count = 0;
            void *later = malloc(buffer_bytes);
            memset(later, 1, buffer_bytes);
            free(later);
            say("released\n");
        } else if (strncmp(command, "quit", 4) == 0) {
            return 0;
        }
    }
    for (;;) pause();  /* no command pipe (stdin at EOF): stay as built until killed */
}
