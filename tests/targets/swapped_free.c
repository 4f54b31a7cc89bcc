/* Free chunks of the main arena, some of whose pages are swapped out, for the residency walk.
 *
 * usage: swapped_free
 * Main arena ([heap]) only, no tcache and no fastbins involved (every freed chunk is bigger):
 *   B0 … B7  32 KiB blocks, freed and then sorted into their large bin by a bigger malloc;
 *   A0 … A7  64 KiB blocks, freed last: they stay in the unsorted bin.
 * Every block has a small block kept after it, so no two free chunks merge. Then, with
 * madvise(MADV_PAGEOUT) (Linux 5.4+), retried until /proc/self/pagemap says so:
 *   A3's chunk, its header page included (up to its last whole page, so that B4's header
 *   after it stays in RAM): the unsorted list leads through a swapped page;
 *   B5's whole pages after its header page: its list stays readable, its bytes half gone.
 * Prints "ready OK A3_CHUNK A3_END B5_FROM B5_TO B_CHUNK0 … B_CHUNK7 B_SIZE" (hex; a chunk is
 * the pointer malloc returned minus 16; [A3_CHUNK, A3_END) and [B5_FROM, B5_TO) page-aligned
 * spans that are swapped), or "ready NOSWAP" when the kernel would not page them out (no
 * swap), and sleeps until killed.
 */
#define _GNU_SOURCE
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#ifndef MADV_PAGEOUT
#define MADV_PAGEOUT 21
#endif
#define BLOCKS 8

static long page;
char *keep[2 * BLOCKS + 1]; /* global: the compiler may not drop these mallocs as unused */

/* 1 when every page of [from, to) is swapped (pagemap bit 62) and none is present (bit 63). */
static int all_swapped(uintptr_t from, uintptr_t to) {
    int fd = open("/proc/self/pagemap", O_RDONLY);
    if (fd < 0) return 0;
    int ok = 1;
    for (uintptr_t at = from; at < to && ok; at += (uintptr_t)page) {
        uint64_t entry = 0;
        if (pread(fd, &entry, 8, (off_t)(at / (uintptr_t)page * 8)) != 8) ok = 0;
        if (!(entry >> 62 & 1) || entry >> 63 & 1) ok = 0;
    }
    close(fd);
    return ok;
}

static int page_out(uintptr_t from, uintptr_t to) {
    for (int attempt = 0; attempt < 50; attempt++) {
        madvise((void *)from, to - from, MADV_PAGEOUT);
        if (all_swapped(from, to)) return 1;
        usleep(20000);
    }
    return 0;
}

int main(void) {
    page = sysconf(_SC_PAGESIZE);
    setvbuf(stdout, NULL, _IONBF, 0); /* stdio allocates nothing later */
    char *a[BLOCKS], *b[BLOCKS];
    for (int i = 0; i < BLOCKS; i++) {
        b[i] = malloc(32 << 10);
        keep[2 * i] = malloc(64);
        a[i] = malloc(64 << 10);
        keep[2 * i + 1] = malloc(64);
        memset(a[i], 'a', 64 << 10);
        memset(b[i], 'b', 32 << 10);
    }
    for (int i = 0; i < BLOCKS; i++) free(b[i]);
    keep[2 * BLOCKS] = malloc(40 << 10); /* sorts the B chunks out of the unsorted bin */
    memset(keep[2 * BLOCKS], 'k', 40 << 10);
    for (int i = 0; i < BLOCKS; i++) free(a[i]);

    uintptr_t a3 = (uintptr_t)a[3] - 16, a3_size = ((uint64_t *)a[3])[-1] & ~(uint64_t)7;
    uintptr_t a3_from = a3 / (uintptr_t)page * (uintptr_t)page;
    uintptr_t a3_to = (a3 + a3_size) / (uintptr_t)page * (uintptr_t)page; /* B4's header stays */
    uintptr_t b5 = (uintptr_t)b[5] - 16, b_size = ((uint64_t *)b[5])[-1] & ~(uint64_t)7;
    uintptr_t b5_from = (b5 + 48 + (uintptr_t)page - 1) / (uintptr_t)page * (uintptr_t)page;
    uintptr_t b5_to = (b5 + b_size) / (uintptr_t)page * (uintptr_t)page;
    if (!page_out(a3_from, a3_to) || !page_out(b5_from, b5_to)) {
        printf("ready NOSWAP\n");
    } else {
        printf("ready OK %lx %lx %lx %lx", (unsigned long)a3_from, (unsigned long)a3_to,
               (unsigned long)b5_from, (unsigned long)b5_to);
        for (int i = 0; i < BLOCKS; i++) printf(" %lx", (unsigned long)((uintptr_t)b[i] - 16));
        printf(" %lx\n", (unsigned long)b_size);
    }
    for (;;) pause();
}
