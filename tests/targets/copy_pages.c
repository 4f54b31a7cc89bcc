/* A mapping whose pages a memory copy must treat differently, for the residency walk's copy.
 *
 * usage: copy_pages PAGES
 * Maps PAGES anonymous pages and writes page i full of the byte (i * 7 + 1) & 0xff, except:
 *   pages PAGES/4 .. PAGES/4 + 1   written, then mprotect(PROT_NONE): resident, and
 *                                   /proc/PID/mem still reads them (FOLL_FORCE);
 *   pages PAGES/2 .. PAGES/2 + 7   never touched: not present, must read as zeros;
 *   pages PAGES .. PAGES + 3       mapped, then unmapped again: a hole nothing else maps.
 * Prints "ready ADDRESS" (hex) and sleeps until killed.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

int main(int argc, char **argv) {
    if (argc != 2) {
        fprintf(stderr, "usage: %s PAGES\n", argv[0]);
        return 2;
    }
    long pages = atol(argv[1]);
    long page = sysconf(_SC_PAGESIZE);
    if (pages < 32) return 2;
    unsigned char *map =
        mmap(NULL, (size_t)((pages + 4) * page), PROT_READ | PROT_WRITE,
             MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (map == MAP_FAILED || munmap(map + pages * page, (size_t)(4 * page)) != 0) return 1;
    for (long i = 0; i < pages; i++) {
        if (i >= pages / 2 && i < pages / 2 + 8) continue;
        memset(map + i * page, (int)((i * 7 + 1) & 0xff), (size_t)page);
    }
    if (mprotect(map + pages / 4 * page, (size_t)(2 * page), PROT_NONE) != 0) return 1;
    printf("ready %lx\n", (unsigned long)map);
    fflush(stdout);
    for (;;) pause();
}
