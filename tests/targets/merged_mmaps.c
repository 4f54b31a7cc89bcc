/* glibc's mmapped chunks inside anonymous mappings the kernel merged, with other memory.
 *
 * usage: merged_mmaps [COUNT [KIB]]   (default 6 blocks of 300 KiB)
 * mallocs COUNT blocks of KIB KiB (above the mmap threshold: each its own mmap), and after
 * every third block, and after the last, mmaps 64 KiB of its own (written, read-write: the
 * same flags as the chunks, so the kernel merges them all into fewer mappings, the program's
 * own memory first). That is what a Python process looks like: obmalloc's arenas are mmapped
 * between big objects'. Writes every block, prints "ready CHUNK SIZE CHUNK SIZE …" (hex: each
 * chunk's start, the pointer minus 16, and its size from its own header) and sleeps until
 * killed.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#define MAX_BLOCKS 64

int main(int argc, char **argv) {
    int count = argc > 1 ? atoi(argv[1]) : 6;
    long kib = argc > 2 ? atol(argv[2]) : 300;
    if (count < 1 || count > MAX_BLOCKS || kib < 256) return 2;
    setvbuf(stdout, NULL, _IONBF, 0);
    char *blocks[MAX_BLOCKS];
    for (int i = 0; i < count; i++) {
        blocks[i] = malloc((size_t)kib << 10);
        if (blocks[i] == NULL) return 1;
        memset(blocks[i], 'x', (size_t)kib << 10);
        if (i % 3 == 2 || i == count - 1) {
            char *own = mmap(NULL, 64 << 10, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS,
                             -1, 0);
            if (own == MAP_FAILED) return 1;
            memset(own, 'o', 64 << 10);
        }
    }
    printf("ready");
    for (int i = 0; i < count; i++) {
        uint64_t size = ((uint64_t *)blocks[i])[-1];
        if (!(size & 2)) return 3; /* not an mmapped chunk: the threshold moved */
        printf(" %lx %lx", (unsigned long)((uintptr_t)blocks[i] - 16),
               (unsigned long)(size & ~(uint64_t)7));
    }
    printf("\n");
    for (;;) pause();
}
