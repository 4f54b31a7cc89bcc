/* A single-threaded target that never leaves the allocator: it fills its stderr pipe,
 * then calls malloc_stats(), which blocks writing its report to stderr. Its only thread
 * therefore sits inside malloc.c (malloc_stats -> fprintf -> write) for as long as nobody
 * reads the pipe: there is no safe point. When the pipe is drained, malloc_stats returns
 * and the process exits at once with _exit(0), without calling malloc or free again. */
#include <errno.h>
#include <fcntl.h>
#include <malloc.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

int main(void) {
    char junk[4096];
    memset(junk, '.', sizeof junk);
    for (int i = 0; i < 64; i++) free(malloc(100 + (size_t)i * 64)); /* a non-empty heap */
    int flags = fcntl(2, F_GETFL);
    fcntl(2, F_SETFL, flags | O_NONBLOCK);
    for (;;) {
        ssize_t n = write(2, junk, sizeof junk);
        if (n < 0 && errno == EAGAIN) {
            if (write(2, junk, 1) < 0 && errno == EAGAIN) break;
        } else if (n < 0) {
            return 3;
        }
    }
    fcntl(2, F_SETFL, flags);
    printf("ready\n");
    fflush(stdout);
    malloc_stats();
    _exit(0);
}
