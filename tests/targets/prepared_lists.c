/* A thread arena whose free lists lie far apart (each stop of its read checks the scout's copy
 * word by word), changed or corrupted on command while a read waits between its scout and its
 * stop (tests/integration/test_prepared_stop.py).
 *
 * usage: prepared_lists XML_PATH   (with GLIBC_TUNABLES=glibc.malloc.arena_max=2:
 *                                   glibc.malloc.mmap_threshold=33554432)
 *
 * One worker thread fills its own arena with PAIRS pairs of a live block of LIVE_BYTES (every
 * byte written: the heap is resident) and a block of a large bin's size, frees the second of
 * each pair (they cannot coalesce: live blocks lie between them), then asks for a block none
 * of them fits, so that malloc sorts them into their large bins. One large bin (chunks of
 * 3,072 to 3,135 bytes) holds, from its head: two chunks of 3,104 bytes, two of 3,088 and
 * TAKE_CHUNKS of 3,072. The others' sizes run from 1,104 bytes up, a few to a bin.
 *
 * Commands on stdin, one per line, each carried out by the worker in its arena and answered
 * by a line (stdout is unbuffered):
 *   take     malloc(3064): glibc takes the second chunk of 3,072 bytes, an exact fit from the
 *            middle of its bin (the first of a size keeps the nextsize links): the bin's head,
 *            fd and bk alike, and every other head of the arena stay as they were; its
 *            neighbours' links change. Answers "took ADDRESS".
 *   corrupt  the bk of the third chunk of 3,072 bytes overwritten (it no longer names the
 *            chunk before it): that bin is corrupt, its head unchanged. Answers "corrupted
 *            ADDRESS" (the chunk's).
 *   xml      malloc_info(0) written to XML_PATH through a FILE opened before the first
 *            allocation, with a static buffer (writing it allocates nothing). Answers "xml".
 * Prints "ready" once the bins are sorted. stdin and stdout are unbuffered (no stdio buffer is
 * malloc'ed once it is ready). On EOF it keeps sleeping.
 */
#include <malloc.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define PAIRS 96
#define LIVE_BYTES (512u << 10) /* 128 pages between two free chunks: the lists lie far apart */
#define TAKE_CHUNKS 5
#define TAKE_REQUEST 3064 /* a 3,072-byte chunk */

static FILE *xml;
static char xml_buffer[1 << 16];
static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t wake = PTHREAD_COND_INITIALIZER;
static char request[32];  /* the command the worker is to carry out, "" when none */
static char answer[64];   /* its answer, "" until done */
static void *taken_chunks[TAKE_CHUNKS];

/* The request size of free block ``i``: the bin of 3,072..3,135 bytes gets 2 x 3,104,
 * 2 x 3,088 and TAKE_CHUNKS x 3,072 (freed in that order, so the bin holds them so); the rest
 * spread over the large bins below it. */
static size_t free_request(int i, int *take_index) {
    static const size_t special[] = {3096, 3096, 3080, 3080};
    *take_index = -1;
    if (i < 4) return special[i];
    if (i < 4 + TAKE_CHUNKS) {
        *take_index = i - 4;
        return TAKE_REQUEST;
    }
    return 1096 + (size_t)(i % 29) * 64; /* 1,104 .. 2,896-byte chunks */
}

static void build(void) {
    void *live[PAIRS], *freed[PAIRS];
    for (int i = 0; i < PAIRS; i++) {
        live[i] = malloc(LIVE_BYTES);
        int take_index;
        freed[i] = malloc(free_request(i, &take_index));
        if (live[i] == NULL || freed[i] == NULL) {
            fprintf(stderr, "out of memory\n");
            exit(1);
        }
        memset(live[i], 0x5a, LIVE_BYTES);
        if (take_index >= 0) taken_chunks[take_index] = (char *)freed[i] - 16;
    }
    for (int i = 0; i < PAIRS; i++) free(freed[i]);
    void *sorter = malloc(64u << 10); /* fits no free chunk: sorts them into their bins */
    if (sorter == NULL) exit(1);
    memset(sorter, 0x5a, 64u << 10);
}

static void *worker(void *unused) {
    (void)unused;
    build();
    pthread_mutex_lock(&lock);
    strcpy(answer, "ready");
    pthread_cond_broadcast(&wake);
    for (;;) {
        while (request[0] == '\0') pthread_cond_wait(&wake, &lock);
        if (strcmp(request, "take") == 0) {
            void *block = malloc(TAKE_REQUEST);
            snprintf(answer, sizeof answer, "took %p", block ? (char *)block - 16 : NULL);
        } else if (strcmp(request, "corrupt") == 0) {
            /* (A chunk's bk lies 24 bytes into it; the third of its size is mid-bin.) */
            uintptr_t *bk = (uintptr_t *)((char *)taken_chunks[2] + 24);
            *bk ^= 0x1010;
            snprintf(answer, sizeof answer, "corrupted %p", taken_chunks[2]);
        } else if (strcmp(request, "xml") == 0) {
            rewind(xml);
            malloc_info(0, xml);
            fflush(xml);
            strcpy(answer, "xml");
        } else {
            snprintf(answer, sizeof answer, "unknown %s", request);
        }
        request[0] = '\0';
        pthread_cond_broadcast(&wake);
    }
    return NULL;
}

int main(int argc, char **argv) {
    if (argc != 2) {
        fprintf(stderr, "usage: prepared_lists XML_PATH\n");
        return 2;
    }
    /* (Unbuffered: no stdio buffer is malloc'ed later, in the middle of a read.) */
    setvbuf(stdin, NULL, _IONBF, 0);
    setvbuf(stdout, NULL, _IONBF, 0);
    xml = fopen(argv[1], "w"); /* before the first allocation, buffered in static memory */
    if (xml == NULL) return 1;
    setvbuf(xml, xml_buffer, _IOFBF, sizeof xml_buffer);
    pthread_t thread;
    if (pthread_create(&thread, NULL, worker, NULL) != 0) return 1;
    pthread_mutex_lock(&lock);
    while (answer[0] == '\0') pthread_cond_wait(&wake, &lock);
    answer[0] = '\0';
    pthread_mutex_unlock(&lock);
    printf("ready\n");
    char line[32];
    while (fgets(line, sizeof line, stdin) != NULL) {
        line[strcspn(line, "\n")] = '\0';
        pthread_mutex_lock(&lock);
        snprintf(request, sizeof request, "%s", line);
        pthread_cond_broadcast(&wake);
        while (request[0] != '\0') pthread_cond_wait(&wake, &lock);
        printf("%s\n", answer);
        answer[0] = '\0';
        pthread_mutex_unlock(&lock);
    }
    for (;;) pause();
}
