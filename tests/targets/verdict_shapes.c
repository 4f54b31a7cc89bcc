/* Memory shapes over time whose verdicts are easy to get wrong, for `watch` and `report`:
 *
 *   mmap-leak     every tick 8 blocks of 256 KiB (above the mmap threshold: each is its own
 *                 mapping) are allocated, written and never freed: mmapped chunks grow
 *                 2 MiB a tick, the arenas do not.
 *   mmap-to-heap  40 blocks of 1 MiB are allocated (mmapped) and written; from tick 2 on,
 *                 every tick 4 of them are freed and allocated again at the same size. The
 *                 first free raises glibc's dynamic mmap threshold above 1 MiB, so the new
 *                 blocks come from the heap: live memory stays 40 MiB while 40 MiB moves
 *                 from mmapped chunks to the arena's in use over ten ticks.
 *   step          8 MiB in use; at tick STEP_TICK (4) another 40 MiB in 1 KiB blocks is
 *                 allocated and written at once; then nothing: one step, not a trend.
 *   sawtooth      every tick 16 blocks of ~120 KiB (below the mmap threshold, each larger
 *                 than any before) are allocated, written and shrunk in place to 16-byte
 *                 pins, so their tails become free chunks no later request can use; every
 *                 3rd tick malloc_trim(0) gives their pages back. malloc_info's free grows
 *                 2 MiB a tick (released pages stay in the bins), free resident rises and
 *                 falls back: a sawtooth.
 *
 * usage: verdict_shapes MODE TICK_MS MAX_TICKS
 * Prints "ready PID" after the first tick; after MAX_TICKS it idles (memory bounded by
 * MAX_TICKS: at most 2 MiB a tick, 48 MiB for step and mmap-to-heap).
 */
#include <malloc.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define LEAK_BLOCKS 8
#define LEAK_BYTES (256 * 1024)
#define MOVE_BLOCKS 40
#define MOVE_PER_TICK 4
#define MOVE_BYTES (1024 * 1024)
#define STEP_TICK 4
#define STEP_BLOCKS (40 * 1024)
#define SAW_BLOCKS 16
#define SAW_BYTES (120 * 1024)
#define SAW_TRIM_EVERY 3
#define PIN_BYTES 16

static char *moved[MOVE_BLOCKS];

static void sleep_ms(long ms) {
    struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};
    while (nanosleep(&ts, &ts) != 0) {
    }
}

static char *written(size_t size) {
    char *block = malloc(size);
    if (block == NULL) exit(2);
    memset(block, 0x5a, size);
    return block;
}

static void small_blocks(int count) {
    for (int i = 0; i < count; i++) (void)written(1024);
}

static void mmap_to_heap_tick(int tick) {
    int first = (tick - 2) * MOVE_PER_TICK;
    for (int i = first; i < first + MOVE_PER_TICK && i >= 0 && i < MOVE_BLOCKS; i++) {
        free(moved[i]);
        moved[i] = written(MOVE_BYTES);
    }
}

static void sawtooth_tick(int tick) {
    static char *blocks[SAW_BLOCKS];
    size_t size = SAW_BYTES + (size_t)tick * 64;
    for (int i = 0; i < SAW_BLOCKS; i++) blocks[i] = written(size);
    for (int i = 0; i < SAW_BLOCKS; i++) {
        if (realloc(blocks[i], PIN_BYTES) != blocks[i]) exit(3); /* glibc shrinks in place */
    }
    if (tick % SAW_TRIM_EVERY == SAW_TRIM_EVERY - 1) malloc_trim(0);
}

int main(int argc, char **argv) {
    if (argc < 4) {
        fprintf(stderr, "usage: %s mmap-leak|mmap-to-heap|step|sawtooth TICK_MS MAX_TICKS\n",
                argv[0]);
        return 64;
    }
    const char *mode = argv[1];
    long tick_ms = atol(argv[2]);
    int max_ticks = atoi(argv[3]);
    if (strcmp(mode, "mmap-to-heap") == 0) {
        for (int i = 0; i < MOVE_BLOCKS; i++) moved[i] = written(MOVE_BYTES);
    } else if (strcmp(mode, "step") == 0) {
        small_blocks(8 * 1024);
    }
    for (int tick = 0;; tick++) {
        if (tick < max_ticks) {
            if (strcmp(mode, "mmap-leak") == 0) {
                for (int i = 0; i < LEAK_BLOCKS; i++) (void)written(LEAK_BYTES);
            } else if (strcmp(mode, "mmap-to-heap") == 0) {
                mmap_to_heap_tick(tick);
            } else if (strcmp(mode, "step") == 0 && tick == STEP_TICK) {
                small_blocks(STEP_BLOCKS);
            } else if (strcmp(mode, "sawtooth") == 0) {
                sawtooth_tick(tick);
            }
        }
        if (tick == 0) {
            printf("ready %d\n", (int)getpid());
            fflush(stdout);
        }
        sleep_ms(tick_ms);
    }
}
