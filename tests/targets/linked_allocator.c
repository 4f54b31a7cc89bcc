/* A program that carries an allocator of its own, linked into the executable, for the tests of
 * how memforensics finds which allocator serves malloc (tests/integration/
 * test_allocator_detection.py):
 *
 *   cc linked_allocator.c /usr/lib/x86_64-linux-gnu/libjemalloc.a -ldl -lm
 *       jemalloc linked in, unprefixed: it defines malloc and mallctl, and serves malloc;
 *   cc -DPREFIXED_MALLCTL=je_mallctl linked_allocator.c
 *       a renamed copy beside glibc's malloc, as Redis's bundled jemalloc (je_) or Rust's
 *       tikv-jemallocator (_rjem_): only its mallctl is stood in for, which is all the search
 *       looks at; glibc still serves malloc.
 *
 * Prints "ready", keeps a block, and waits for stdin to close.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#ifdef PREFIXED_MALLCTL
/* The renamed copy's statistics entry point; never called. */
__attribute__((used, noinline)) int PREFIXED_MALLCTL(const char *name, void *oldp,
                                                     size_t *oldlenp, void *newp,
                                                     size_t newlen) {
    (void)name, (void)oldp, (void)oldlenp, (void)newp, (void)newlen;
    return 2; /* ENOENT: no such name */
}
#endif

int main(void) {
    char *block = malloc(1 << 20);
    if (block == NULL)
        return 1;
    memset(block, 7, 1 << 20);
    printf("ready\n");
    fflush(stdout);
    char line[64];
    while (fgets(line, sizeof line, stdin) != NULL) {
    }
    free(block);
    return 0;
}
