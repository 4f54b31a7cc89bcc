/* The classic glibc bloat with a live main loop: COUNT blocks of SIZE bytes are written and
 * all freed but the last (one big free chunk that the last block keeps from the top), then
 * the main thread keeps allocating and freeing a few small blocks, as a service's loop does.
 *
 * usage: classic_loop COUNT SIZE [top]
 * With "top" every block is freed, so they merge into the main arena's top chunk (run it with
 * a high glibc.malloc.trim_threshold so free() keeps that top).
 * Prints "ready" once the big chunk is free, then churns 16 small blocks every millisecond.
 * Lives at most 300 s.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

int main(int argc, char **argv) {
    if (argc != 3 && !(argc == 4 && strcmp(argv[3], "top") == 0)) {
        fprintf(stderr, "usage: classic_loop COUNT SIZE [top]\n");
        return 2;
    }
    long count = atol(argv[1]);
    size_t size = (size_t)atol(argv[2]);
    char **blocks = calloc((size_t)count, sizeof *blocks);
    if (blocks == NULL || count < 2 || size == 0) return 2;
    for (long i = 0; i < count; i++) {
        blocks[i] = malloc(size);
        if (blocks[i] == NULL) return 3;
        memset(blocks[i], 0x5a, size);
    }
    long kept = argc == 4 ? 0 : 1;
    for (long i = 0; i < count - kept; i++) free(blocks[i]);
    printf("ready %ld\n", count);
    fflush(stdout);
    void *ring[16] = {0};
    unsigned seed = 7;
    struct timespec tick = {0, 1000000};
    for (time_t end = time(NULL) + 300; time(NULL) < end;) {
        for (int i = 0; i < 16; i++) {
            free(ring[i]);
            seed = seed * 1103515245u + 12345u;
            ring[i] = malloc(32 + (seed >> 16) % 224);
        }
        nanosleep(&tick, NULL);
    }
    return 0;
}
