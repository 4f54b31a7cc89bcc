/* Test target: a heap of a few pages, as a small tool's (sleep, cat): a few dozen blocks,
 * every other one freed, so main_arena's bins point a few KiB past the start of [heap].
 * Writes "ready" with write(2) and reads its command with read(2) (no stdio buffer in the
 * heap); on any line on stdin, writes its malloc_info(0, stderr) and exits. */
#include <malloc.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

int main(void) {
    void *blocks[64];
    for (int i = 0; i < 64; i++) {
        blocks[i] = malloc(24 + (size_t)(i % 8) * 40 + (i % 5 == 0 ? 1500 : 0));
        if (blocks[i] == NULL) return 2;
        memset(blocks[i], 0x5a, 24);
    }
    for (int i = 0; i < 64; i += 2) free(blocks[i]);
    /* A chunk past tcache and the fastbins: the unsorted and small bins hold chunks too. */
    void *big[4];
    for (int i = 0; i < 4; i++) big[i] = malloc(2000 + (size_t)i * 100);
    void *keep = malloc(32);
    for (int i = 0; i < 4; i += 2) free(big[i]);
    static const char ready[] = "ready\n";
    if (write(1, ready, sizeof ready - 1) != (ssize_t)(sizeof ready - 1)) return 2;
    char command[16];
    if (read(0, command, sizeof command) <= 0) return 0;
    int status = malloc_info(0, stderr);
    free(keep);
    return status == 0 ? 0 : 3;
}
