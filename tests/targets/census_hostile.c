/* A heap made hostile on purpose (tests/integration/test_census_hostile.py): the main arena
 * holds 2,000 chunks of 100 bytes, then MODE breaks it:
 *   size     one chunk's size field overwritten with a huge value (past the heap's end)
 *   garbage  64 KiB in the middle of the heap overwritten with random words
 *   loop     one chunk's size field set to 0
 * A thread arena keeps 1,000 intact chunks of 200 bytes: the census must still count them.
 * Prints "ready" and sleeps; it never calls malloc again. */
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static pthread_barrier_t barrier;

static void *worker(void *arg) {
    (void)arg;
    for (int i = 0; i < 1000; i++) memset(malloc(200), 'w', 199);
    pthread_barrier_wait(&barrier);
    for (;;) pause();
    return NULL;
}

int main(int argc, char **argv) {
    if (argc < 2) return 2;
    setvbuf(stdout, NULL, _IONBF, 0);
    pthread_barrier_init(&barrier, NULL, 2);
    pthread_t thread;
    pthread_create(&thread, NULL, worker, NULL);
    static char *blocks[2000];
    for (int i = 0; i < 2000; i++) blocks[i] = memset(malloc(100), 'm', 99);
    pthread_barrier_wait(&barrier);
    uint64_t *header = (uint64_t *)blocks[1000] - 1;
    if (strcmp(argv[1], "size") == 0) {
        *header = 0x7ffffffffff0ull | 1;
    } else if (strcmp(argv[1], "loop") == 0) {
        *header = 0;
    } else {
        uint64_t x = 88172645463325252ull;
        uint64_t *at = (uint64_t *)blocks[500];
        for (int i = 0; i < 8192; i++) {
            x ^= x << 13; x ^= x >> 7; x ^= x << 17;
            at[i] = x;
        }
    }
    printf("ready\n");
    for (;;) pause();
}
