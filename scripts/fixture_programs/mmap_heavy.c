/* mmap-heavy: many live blocks above the mmap threshold (128 KiB by default), so glibc
 * serves them with mmap outside the arenas, plus a little ordinary heap traffic.
 * None of the big blocks is freed before the dump: freeing one would raise the dynamic
 * mmap threshold and send later blocks of that size into the heap.
 *
 * usage: mmap_heavy NBLOCKS OUT.xml */
#include <malloc.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int main(int argc, char **argv) {
    if (argc != 3) {
        fprintf(stderr, "usage: %s NBLOCKS OUT.xml\n", argv[0]);
        return 2;
    }
    int nblocks = atoi(argv[1]);
    if (nblocks < 1) return 2;
    void **big = calloc((size_t)nblocks, sizeof(void *));
    void *small[256];
    if (big == NULL) return 1;
    size_t mapped_bytes = 0;
    for (int i = 0; i < nblocks; i++) {
        /* 256 KiB .. 2 MiB in 64 KiB steps: all above the default threshold. */
        size_t size = (size_t)(4 + i % 29) * 64 * 1024;
        big[i] = malloc(size);
        if (big[i] == NULL) return 1;
        memset(big[i], 0x33, 4096); /* touch only the first page of each */
        mapped_bytes += size;
    }
    for (int i = 0; i < 256; i++) {
        small[i] = malloc((size_t)(32 + (i % 16) * 48));
        if (small[i] == NULL) return 1;
    }
    for (int i = 0; i < 256; i += 2) free(small[i]);
    FILE *out = fopen(argv[2], "w");
    if (out == NULL) { perror(argv[2]); return 1; }
    if (malloc_info(0, out) != 0) return 1;
    if (fclose(out) != 0) return 1;
    printf("nblocks=%d requested_bytes=%zu\n", nblocks, mapped_bytes);
    return 0;
}
