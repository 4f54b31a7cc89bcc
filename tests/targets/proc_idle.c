/* An idle process for refusal tests: allocates a little (so the allocator is loaded and
 * used), says "ready", then sleeps until killed. Built as a normal glibc binary, as a static
 * binary (-static) and with musl-gcc; run with LD_PRELOAD for jemalloc/tcmalloc. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

int main(void) {
    char *keep = malloc(4096);
    if (keep == NULL) return 1;
    memset(keep, 1, 4096);
    printf("ready %d\n", (int)getpid());
    fflush(stdout);
    for (;;) pause();
}
