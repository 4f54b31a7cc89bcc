/* A process that logs malloc_info periodically into one file: each step grows a working
 * set, frees part of it, and appends one more <malloc> document to the same stream.
 *
 * usage: series NDUMPS OUT.xml */
#include <malloc.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

int main(int argc, char **argv) {
    if (argc != 3) {
        fprintf(stderr, "usage: %s NDUMPS OUT.xml\n", argv[0]);
        return 2;
    }
    int ndumps = atoi(argv[1]);
    if (ndumps < 2) return 2;
    FILE *out = fopen(argv[2], "w");
    if (out == NULL) { perror(argv[2]); return 1; }
    enum { PER_STEP = 4000 };
    void **kept = calloc((size_t)ndumps * PER_STEP, sizeof(void *));
    if (kept == NULL) return 1;
    const struct timespec pause = {0, 20 * 1000 * 1000}; /* 20 ms between dumps */
    for (int step = 0; step < ndumps; step++) {
        for (int i = 0; i < PER_STEP; i++) {
            size_t size = (size_t)(48 + ((step * 7 + i) % 61) * 40);
            void *p = malloc(size);
            if (p == NULL) return 1;
            memset(p, step, size);
            kept[step * PER_STEP + i] = p;
        }
        /* Free two of every three blocks of this step: the heap grows, and holes stay. */
        for (int i = 0; i < PER_STEP; i++) {
            if (i % 3 != 0) {
                free(kept[step * PER_STEP + i]);
                kept[step * PER_STEP + i] = NULL;
            }
        }
        if (malloc_info(0, out) != 0) return 1;
        fflush(out);
        nanosleep(&pause, NULL);
    }
    if (fclose(out) != 0) return 1;
    printf("ndumps=%d\n", ndumps);
    return 0;
}
