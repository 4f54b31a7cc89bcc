/* The classic retention case: allocate many small buffers, free all but the last one.
 * The last buffer sits just below the top chunk, so glibc cannot shrink the heap and the
 * freed memory stays in the arena's bins. Dumps malloc_info, measures RSS, calls
 * malloc_trim(0) (which MADV_DONTNEEDs whole free pages inside bins), dumps and measures again.
 *
 * usage: free_all_but_last COUNT BLOCK_BYTES BEFORE.xml AFTER.xml
 * stdout: one line "rss_before_kib=N rss_after_kib=N trim_returned=R". */
#include <malloc.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* Resident set size in KiB from /proc/self/statm (second field, in pages). */
static long rss_kib(void) {
    FILE *f = fopen("/proc/self/statm", "r");
    long size_pages = 0, resident_pages = 0;
    if (f == NULL) return -1;
    if (fscanf(f, "%ld %ld", &size_pages, &resident_pages) != 2) resident_pages = -1;
    fclose(f);
    return resident_pages * (sysconf(_SC_PAGESIZE) / 1024);
}

static int dump(const char *path) {
    FILE *out = fopen(path, "w");
    if (out == NULL) { perror(path); return -1; }
    int rc = malloc_info(0, out);
    return fclose(out) == 0 ? rc : -1;
}

int main(int argc, char **argv) {
    if (argc != 5) {
        fprintf(stderr, "usage: %s COUNT BLOCK_BYTES BEFORE.xml AFTER.xml\n", argv[0]);
        return 2;
    }
    size_t count = (size_t)strtoul(argv[1], NULL, 10);
    size_t block_bytes = (size_t)strtoul(argv[2], NULL, 10);
    if (count < 2 || block_bytes == 0) return 2;
    char **blocks = malloc(count * sizeof(char *));
    if (blocks == NULL) return 1;
    for (size_t i = 0; i < count; i++) {
        blocks[i] = malloc(block_bytes);
        if (blocks[i] == NULL) return 1;
        memset(blocks[i], 0x5a, block_bytes);
    }
    for (size_t i = 0; i + 1 < count; i++) free(blocks[i]);
    long before_kib = rss_kib();
    if (dump(argv[3]) != 0) return 1;
    int trimmed = malloc_trim(0);
    long after_kib = rss_kib();
    if (dump(argv[4]) != 0) return 1;
    printf("rss_before_kib=%ld rss_after_kib=%ld trim_returned=%d\n", before_kib, after_kib,
           trimmed);
    free(blocks[count - 1]);
    free(blocks);
    return 0;
}
