/* A main arena whose brk is blocked, so that glibc mmaps its memory instead.
 *
 * usage: brk_blocked XML_PATH
 * A first malloc makes [heap]; then a read-only page is mapped right at the program break
 * (MAP_FIXED_NOREPLACE), so every later sbrk fails and glibc's sysmalloc falls back to
 * mmapping segments of 1 MiB or more for the main arena (and marks it non-contiguous). Then
 * 4,000 blocks of 1,500 and 2,600 bytes (above tcache's sizes) are allocated, every other
 * one freed, a bigger malloc sorts them into their bins and a few more are freed to stay in
 * the unsorted bin. malloc_info(0, f) is written to XML_PATH (its FILE opened and given a
 * static buffer before, so nothing is allocated or freed after the document); then prints
 * "ready N" (N: blocks that lie outside [heap]) and sleeps until killed.
 */
#define _GNU_SOURCE
#include <malloc.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#ifndef MAP_FIXED_NOREPLACE
#define MAP_FIXED_NOREPLACE 0x100000
#endif
#define BLOCKS 4000

char *blocks[BLOCKS]; /* global: the compiler may not drop these mallocs as unused */
char *first, *sorter;
static char file_buffer[1 << 16];

int main(int argc, char **argv) {
    if (argc != 2) return 2;
    setvbuf(stdout, NULL, _IONBF, 0);
    FILE *xml = fopen(argv[1], "w");
    if (xml == NULL) return 1;
    setvbuf(xml, file_buffer, _IOFBF, sizeof file_buffer);
    first = malloc(100);
    long page = sysconf(_SC_PAGESIZE);
    uintptr_t brk_now = (uintptr_t)sbrk(0);
    uintptr_t wall = (brk_now + (uintptr_t)page - 1) / (uintptr_t)page * (uintptr_t)page;
    void *got = mmap((void *)wall, (size_t)page, PROT_READ,
                     MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED_NOREPLACE, -1, 0);
    if (got != (void *)wall) return 3; /* the kernel could not place the wall there */
    for (int i = 0; i < BLOCKS; i++) {
        blocks[i] = malloc(i % 2 ? 2600 : 1500);
        if (blocks[i] == NULL) return 1;
        memset(blocks[i], 'x', i % 2 ? 2600 : 1500);
    }
    for (int i = 0; i < BLOCKS - 200; i += 2) free(blocks[i]);
    sorter = malloc(5000); /* sorts the unsorted chunks into their bins */
    for (int i = BLOCKS - 200; i < BLOCKS; i += 2) free(blocks[i]);
    int outside = 0;
    for (int i = 1; i < BLOCKS; i += 2) outside += (uintptr_t)blocks[i] >= wall;
    if (malloc_info(0, xml) != 0 || fflush(xml) != 0) return 1;
    printf("ready %d\n", outside);
    for (;;) pause();
}
