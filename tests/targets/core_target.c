/* An idle multi-threaded target for the core file tests: memory of every kind a core may or
 * may not hold, with contents the tests can recognise, then every thread blocks in pause().
 * Usage: core_target DIR THREADS. Works in DIR (its cwd, where a kernel core lands) and
 * prints "ready KEY=0xADDRESS ..." once set up:
 *   heap     64 KiB from malloc in the main arena ([heap]), each word its address ^ MAGIC
 *   big      1 MiB from malloc: an mmapped chunk, same pattern
 *   shared   64 KiB MAP_SHARED|MAP_ANONYMOUS ("/dev/zero (deleted)" in maps)
 *   sparse   16 MiB anonymous, only every 16th page touched
 *   mapped   a 64 KiB file in DIR mapped read-only, then unlinked ("(deleted)")
 *   written  the same file mapped private and writable, its first page written
 * Each worker thread mallocs 256 KiB in its own arena (same pattern) before blocking. */
#include <fcntl.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#define MAGIC 0x5eedc0de00000000ULL
#define PAGE 4096

static pthread_barrier_t barrier;

static void fill(void *start, size_t bytes) {
    uint64_t *word = start;
    for (size_t i = 0; i < bytes / 8; i++) word[i] = (uint64_t)(uintptr_t)&word[i] ^ MAGIC;
}

static void *worker(void *arg) {
    (void)arg;
    fill(malloc(256 * 1024), 256 * 1024);
    pthread_barrier_wait(&barrier);
    for (;;) pause();
    return NULL;
}

int main(int argc, char **argv) {
    if (argc < 3 || chdir(argv[1]) != 0) return 2;
    int threads = atoi(argv[2]);

    char *heap = malloc(64 * 1024);
    fill(heap, 64 * 1024);
    char *big = malloc(1024 * 1024);
    fill(big, 1024 * 1024);

    char *shared = mmap(NULL, 64 * 1024, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS,
                        -1, 0);
    char *sparse = mmap(NULL, 16 << 20, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS,
                        -1, 0);
    if (shared == MAP_FAILED || sparse == MAP_FAILED) return 3;
    fill(shared, 64 * 1024);
    for (size_t at = 0; at < (16 << 20); at += 16 * PAGE) fill(sparse + at, PAGE);

    int fd = open("mapped-file", O_RDWR | O_CREAT | O_TRUNC, 0600);
    if (fd < 0) return 4;
    for (int i = 0; i < 16; i++) {
        char page[PAGE];
        memset(page, 'a' + i, sizeof page);
        if (write(fd, page, sizeof page) != (ssize_t)sizeof page) return 5;
    }
    char *mapped = mmap(NULL, 64 * 1024, PROT_READ, MAP_PRIVATE, fd, 0);
    char *written = mmap(NULL, 64 * 1024, PROT_READ | PROT_WRITE, MAP_PRIVATE, fd, 0);
    if (mapped == MAP_FAILED || written == MAP_FAILED) return 6;
    volatile char touch = mapped[PAGE];  /* a resident page the core should still leave out */
    (void)touch;
    memset(written, 'W', PAGE);
    close(fd);
    unlink("mapped-file");

    pthread_barrier_init(&barrier, NULL, (unsigned)threads + 1);
    for (int i = 0; i < threads; i++) {
        pthread_t tid;
        if (pthread_create(&tid, NULL, worker, NULL) != 0) return 7;
    }
    pthread_barrier_wait(&barrier);
    printf("ready heap=%p big=%p shared=%p sparse=%p mapped=%p written=%p\n", (void *)heap,
           (void *)big, (void *)shared, (void *)sparse, (void *)mapped, (void *)written);
    fflush(stdout);
    for (;;) pause();
}
