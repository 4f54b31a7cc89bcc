/* Test target: a process in which malloc never ran (gzip reading a pipe is one): main_arena
 * as glibc's static initializer left it, no [heap], no thread arena. Nothing here allocates:
 * "ready" is written with write(2), the command read with read(2) (stdio would allocate its
 * buffers), and malloc_info's own document goes to stderr, which is unbuffered.
 * Usage: no_heap. Prints "ready"; on any line on stdin, writes its malloc_info(0, stderr)
 * (malloc initializes itself first, taking no memory) and exits. */
#include <malloc.h>
#include <stdio.h>
#include <unistd.h>

int main(void) {
    static const char ready[] = "ready\n";
    if (write(1, ready, sizeof ready - 1) != (ssize_t)(sizeof ready - 1)) return 2;
    char command[16];
    if (read(0, command, sizeof command) <= 0) return 0;
    return malloc_info(0, stderr) == 0 ? 0 : 3;
}
