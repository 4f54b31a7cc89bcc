/* A target whose heap changes over time in one of three ways, for `watch` and `report`:
 *
 *   leak      every tick 2048 x 1 KiB blocks are allocated, written and never freed:
 *             in use grows 2 MiB a tick (RSS with it).
 *   fragment  every tick 256 blocks of a size larger than any before are allocated and
 *             shrunk in place to 16-byte pins: each block's tail becomes a free chunk that
 *             pins keep apart and later (larger) requests cannot use, so free grows 4 MiB+
 *             a tick while in use grows only by the pins (8 KiB a tick); the blocks are
 *             written, so their free tails stay resident until malloc_trim releases them.
 *   idle      8 MiB in 1 KiB blocks allocated and written once, then nothing.
 *
 * usage: watch_pattern MODE TICK_MS MAX_TICKS [EXIT_AFTER_TICKS]
 * Prints "ready PID" after the first tick; after MAX_TICKS it keeps running idle (memory
 * bounded by MAX_TICKS); with EXIT_AFTER_TICKS it exits with status 0 after that many.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define LEAK_BLOCKS 2048
#define LEAK_BYTES 1024
#define HOLES 256
#define HOLE_BYTES (16 * 1024)
#define PIN_BYTES 16

static void sleep_ms(long ms) {
    struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};
    while (nanosleep(&ts, &ts) != 0) {
    }
}

static void leak_tick(void) {
    for (int i = 0; i < LEAK_BLOCKS; i++) {
        char *block = malloc(LEAK_BYTES);
        if (block == NULL) exit(2);
        memset(block, 0x5a, LEAK_BYTES);
    }
}

static void fragment_tick(int tick) {
    /* Blocks larger than every earlier one (no free chunk can serve them: they come from the
     * top, side by side), then each shrunk in place to a small pin: every block's tail
     * becomes a free chunk held apart by the next pin, which later (larger) requests cannot
     * use and which never coalesces. */
    static char *blocks[HOLES];
    size_t size = HOLE_BYTES + (size_t)tick * 64;
    for (int i = 0; i < HOLES; i++) {
        blocks[i] = malloc(size);
        if (blocks[i] == NULL) exit(2);
        memset(blocks[i], 0x11, size); /* resident: a trim has whole pages to give back */
    }
    for (int i = 0; i < HOLES; i++) {
        if (realloc(blocks[i], PIN_BYTES) != blocks[i]) exit(3); /* glibc shrinks in place */
    }
}

int main(int argc, char **argv) {
    if (argc < 4) {
        fprintf(stderr, "usage: %s leak|fragment|idle TICK_MS MAX_TICKS [EXIT_AFTER]\n", argv[0]);
        return 64;
    }
    const char *mode = argv[1];
    long tick_ms = atol(argv[2]);
    int max_ticks = atoi(argv[3]);
    int exit_after = argc > 4 ? atoi(argv[4]) : -1;
    if (strcmp(mode, "idle") == 0) {
        for (int i = 0; i < 8192; i++) { /* 8 MiB in use inside the arena, then nothing */
            char *keep = malloc(1024);
            if (keep == NULL) return 2;
            memset(keep, 1, 1024);
        }
    }
    for (int tick = 0;; tick++) {
        if (tick < max_ticks) {
            if (strcmp(mode, "leak") == 0) leak_tick();
            else if (strcmp(mode, "fragment") == 0) fragment_tick(tick);
        }
        if (tick == 0) {
            printf("ready %d\n", (int)getpid());
            fflush(stdout);
        }
        if (exit_after >= 0 && tick >= exit_after) return 0;
        sleep_ms(tick_ms);
    }
}
