/* Busy single-threaded allocator churn that checks its own heap.
 *
 * usage: trim_busy SLOTS MAX_BLOCK_BYTES
 * Keeps SLOTS live blocks of random size (16 .. MAX_BLOCK_BYTES), each filled with a pattern
 * derived from its slot and generation; forever replaces a random slot, first verifying the old
 * block's pattern. Being single-threaded, glibc takes no arena lock: a call into malloc made from
 * inside malloc corrupts the heap silently, which this program (or glibc's own checks) notices.
 * On SIGTERM it verifies every live block, prints "verified N blocks after M operations" and
 * exits 0; on a bad pattern it prints "corrupt …" and exits 3. Lives at most 300 s.
 */
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

struct slot { unsigned char *data; size_t bytes; unsigned char fill; };

static volatile sig_atomic_t stop_requested;
static void on_term(int sig) { (void)sig; stop_requested = 1; }

static int check(const struct slot *s) {
    for (size_t i = 0; i < s->bytes; i++)
        if (s->data[i] != s->fill) return 0;
    return 1;
}

int main(int argc, char **argv) {
    if (argc != 3) {
        fprintf(stderr, "usage: %s SLOTS MAX_BLOCK_BYTES\n", argv[0]);
        return 2;
    }
    size_t slots = strtoul(argv[1], NULL, 10), max_bytes = strtoul(argv[2], NULL, 10);
    if (slots < 1 || max_bytes < 16) return 2;
    struct slot *table = calloc(slots, sizeof *table);
    if (!table) return 1;
    signal(SIGTERM, on_term);
    srand(12345);
    unsigned long long operations = 0;
    time_t started = time(NULL);
    for (size_t i = 0; i < slots; i++) {
        table[i].bytes = 16 + (size_t)rand() % (max_bytes - 15);
        table[i].fill = (unsigned char)(i * 31 + 7);
        table[i].data = malloc(table[i].bytes);
        if (!table[i].data) return 1;
        memset(table[i].data, table[i].fill, table[i].bytes);
    }
    printf("ready slots=%zu\n", slots);
    fflush(stdout);
    while (!stop_requested && time(NULL) - started < 300) {
        struct slot *s = &table[(size_t)rand() % slots];
        if (!check(s)) {
            printf("corrupt block after %llu operations\n", operations);
            fflush(stdout);
            return 3;
        }
        free(s->data);
        s->bytes = 16 + (size_t)rand() % (max_bytes - 15);
        s->fill = (unsigned char)(s->fill + 1);
        s->data = malloc(s->bytes);
        if (!s->data) return 1;
        memset(s->data, s->fill, s->bytes);
        operations++;
    }
    for (size_t i = 0; i < slots; i++) {
        if (!check(&table[i])) {
            printf("corrupt block at exit after %llu operations\n", operations);
            fflush(stdout);
            return 3;
        }
    }
    printf("verified %zu blocks after %llu operations\n", slots, operations);
    fflush(stdout);
    return 0;
}
