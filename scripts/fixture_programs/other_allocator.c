/* Allocates and frees through whatever malloc the process runs with, then asks glibc's
 * malloc_info. Run under LD_PRELOAD=libjemalloc.so.2 or libtcmalloc_minimal.so.4: malloc
 * goes to the preloaded allocator, malloc_info still resolves to glibc and describes
 * glibc's arena, which nothing used.
 *
 * usage: other_allocator OUT.xml */
#include <malloc.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int main(int argc, char **argv) {
    if (argc != 2) {
        fprintf(stderr, "usage: %s OUT.xml\n", argv[0]);
        return 2;
    }
    enum { NBLOCKS = 20000 };
    static void *blocks[NBLOCKS];
    for (int i = 0; i < NBLOCKS; i++) {
        size_t size = (size_t)(16 + (i % 97) * 24);
        blocks[i] = malloc(size);
        if (blocks[i] == NULL) return 1;
        memset(blocks[i], 1, size);
    }
    void *big = malloc(4 * 1024 * 1024);
    if (big == NULL) return 1;
    for (int i = 0; i < NBLOCKS; i += 2) free(blocks[i]);
    FILE *out = fopen(argv[1], "w");
    if (out == NULL) { perror(argv[1]); return 1; }
    if (malloc_info(0, out) != 0) return 1;
    if (fclose(out) != 0) return 1;
    free(big);
    printf("blocks=%d\n", NBLOCKS);
    return 0;
}
