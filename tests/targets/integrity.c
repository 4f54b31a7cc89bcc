/* A target that notices any disturbance: registers, vector registers, a pipe, signals, heap.
 *
 * usage: integrity
 * The main thread loops: it loads known values into general registers (rbx, r8-r15) and all
 * sixteen ymm registers (upper lanes included), spins ~1 ms in assembly holding them, stores
 * and compares them; then it blocks in read() on a pipe that a writer thread feeds every
 * millisecond with a byte sequence, checking that every byte arrives, in order; then it
 * checks a set of heap buffers. SIGALRM arrives every 2 ms (SA_RESTART). Whoever interrupts
 * it (a debugger's stop, a call made on its thread) must leave all of this as it was.
 * Prints "ready"; on any mismatch prints "corrupt <what>" and exits 3; on SIGTERM prints
 * "ok loops=N bytes=B alarms=A" and exits 0. Lives at most 300 s.
 */
#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

#define BUFFERS 64

static int pipe_fds[2];
static volatile sig_atomic_t stop_requested;
static volatile sig_atomic_t alarms;
static unsigned char *buffers[BUFFERS];
static size_t buffer_bytes[BUFFERS];

static void on_term(int sig) { (void)sig; stop_requested = 1; }
static void on_alarm(int sig) { (void)sig; alarms++; }

static void corrupt(const char *what, unsigned long loop) {
    printf("corrupt %s at loop %lu\n", what, loop);
    fflush(stdout);
    _exit(3);
}

static void *writer(void *arg) {
    (void)arg;
    unsigned char next = 0, chunk[64];
    struct timespec one_ms = {0, 1000000L};
    for (;;) {
        for (size_t i = 0; i < sizeof chunk; i++) chunk[i] = next++;
        size_t done = 0;
        while (done < sizeof chunk) {
            ssize_t n = write(pipe_fds[1], chunk + done, sizeof chunk - done);
            if (n > 0) done += (size_t)n;
        }
        nanosleep(&one_ms, NULL);
    }
    return NULL;
}

/* Hold values in registers across a spin; return 0 when they all came back unchanged. */
static int registers_hold(uint64_t seed, long spins) {
    uint64_t in_g[9], out_g[9];
    uint8_t in_y[16 * 32] __attribute__((aligned(32)));
    uint8_t out_y[16 * 32] __attribute__((aligned(32)));
    for (int i = 0; i < 9; i++) in_g[i] = seed * 0x9E3779B97F4A7C15ULL + (uint64_t)i;
    for (int i = 0; i < 16 * 32; i++) in_y[i] = (uint8_t)(seed + (uint64_t)i * 7);
    __asm__ volatile(
        "vmovdqu 0(%[iy]), %%ymm0\n\t"
        "vmovdqu 32(%[iy]), %%ymm1\n\t"
        "vmovdqu 64(%[iy]), %%ymm2\n\t"
        "vmovdqu 96(%[iy]), %%ymm3\n\t"
        "vmovdqu 128(%[iy]), %%ymm4\n\t"
        "vmovdqu 160(%[iy]), %%ymm5\n\t"
        "vmovdqu 192(%[iy]), %%ymm6\n\t"
        "vmovdqu 224(%[iy]), %%ymm7\n\t"
        "vmovdqu 256(%[iy]), %%ymm8\n\t"
        "vmovdqu 288(%[iy]), %%ymm9\n\t"
        "vmovdqu 320(%[iy]), %%ymm10\n\t"
        "vmovdqu 352(%[iy]), %%ymm11\n\t"
        "vmovdqu 384(%[iy]), %%ymm12\n\t"
        "vmovdqu 416(%[iy]), %%ymm13\n\t"
        "vmovdqu 448(%[iy]), %%ymm14\n\t"
        "vmovdqu 480(%[iy]), %%ymm15\n\t"
        "mov 0(%[ig]), %%rbx\n\t"
        "mov 8(%[ig]), %%r8\n\t"
        "mov 16(%[ig]), %%r9\n\t"
        "mov 24(%[ig]), %%r10\n\t"
        "mov 32(%[ig]), %%r11\n\t"
        "mov 40(%[ig]), %%r12\n\t"
        "mov 48(%[ig]), %%r13\n\t"
        "mov 56(%[ig]), %%r14\n\t"
        "mov 64(%[ig]), %%r15\n\t"
        "1: dec %[n]\n\t"
        "jnz 1b\n\t"
        "vmovdqu %%ymm0, 0(%[oy])\n\t"
        "vmovdqu %%ymm1, 32(%[oy])\n\t"
        "vmovdqu %%ymm2, 64(%[oy])\n\t"
        "vmovdqu %%ymm3, 96(%[oy])\n\t"
        "vmovdqu %%ymm4, 128(%[oy])\n\t"
        "vmovdqu %%ymm5, 160(%[oy])\n\t"
        "vmovdqu %%ymm6, 192(%[oy])\n\t"
        "vmovdqu %%ymm7, 224(%[oy])\n\t"
        "vmovdqu %%ymm8, 256(%[oy])\n\t"
        "vmovdqu %%ymm9, 288(%[oy])\n\t"
        "vmovdqu %%ymm10, 320(%[oy])\n\t"
        "vmovdqu %%ymm11, 352(%[oy])\n\t"
        "vmovdqu %%ymm12, 384(%[oy])\n\t"
        "vmovdqu %%ymm13, 416(%[oy])\n\t"
        "vmovdqu %%ymm14, 448(%[oy])\n\t"
        "vmovdqu %%ymm15, 480(%[oy])\n\t"
        "mov %%rbx, 0(%[og])\n\t"
        "mov %%r8, 8(%[og])\n\t"
        "mov %%r9, 16(%[og])\n\t"
        "mov %%r10, 24(%[og])\n\t"
        "mov %%r11, 32(%[og])\n\t"
        "mov %%r12, 40(%[og])\n\t"
        "mov %%r13, 48(%[og])\n\t"
        "mov %%r14, 56(%[og])\n\t"
        "mov %%r15, 64(%[og])\n\t"
        "vzeroupper\n\t"
        : [n] "+r"(spins)
        : [iy] "r"(in_y), [ig] "r"(in_g), [oy] "r"(out_y), [og] "r"(out_g)
        : "rbx", "r8", "r9", "r10", "r11", "r12", "r13", "r14", "r15", "xmm0", "xmm1", "xmm2",
          "xmm3", "xmm4", "xmm5", "xmm6", "xmm7", "xmm8", "xmm9", "xmm10", "xmm11", "xmm12",
          "xmm13", "xmm14", "xmm15", "cc", "memory");
    return memcmp(in_g, out_g, sizeof in_g) != 0 || memcmp(in_y, out_y, sizeof in_y) != 0;
}

static void fill_buffer(int i, unsigned long loop) {
    free(buffers[i]);
    buffer_bytes[i] = 16 + (size_t)((loop * 131 + (unsigned)i * 977) % 8192);
    buffers[i] = malloc(buffer_bytes[i]);
    if (!buffers[i]) corrupt("malloc", loop);
    memset(buffers[i], (int)((unsigned)i * 3 + 1), buffer_bytes[i]);
}

int main(void) {
    if (pipe(pipe_fds) != 0) return 1;
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_alarm;
    sa.sa_flags = SA_RESTART;
    sigaction(SIGALRM, &sa, NULL);
    sa.sa_handler = on_term;
    sigaction(SIGTERM, &sa, NULL);
    for (int i = 0; i < BUFFERS; i++) fill_buffer(i, 0);
    pthread_t tid;
    pthread_create(&tid, NULL, writer, NULL);
    struct itimerval every_2ms = {{0, 2000}, {0, 2000}};
    setitimer(ITIMER_REAL, &every_2ms, NULL);
    printf("ready\n");
    fflush(stdout);
    unsigned char expected = 0, chunk[64];
    unsigned long loop = 0, bytes = 0;
    time_t started = time(NULL);
    while (!stop_requested && time(NULL) - started < 300) {
        loop++;
        if (registers_hold(loop, 300000)) corrupt("registers", loop);
        ssize_t n = read(pipe_fds[0], chunk, sizeof chunk);
        if (n < 0) corrupt("read", loop);
        for (ssize_t i = 0; i < n; i++)
            if (chunk[i] != expected++) corrupt("pipe order", loop);
        bytes += (unsigned long)n;
        for (int i = 0; i < BUFFERS; i++) {
            unsigned char want = (unsigned char)((unsigned)i * 3 + 1);
            for (size_t j = 0; j < buffer_bytes[i]; j++)
                if (buffers[i][j] != want) corrupt("heap buffer", loop);
        }
        fill_buffer((int)(loop % BUFFERS), loop);
    }
    printf("ok loops=%lu bytes=%lu alarms=%d\n", loop, bytes, (int)alarms);
    fflush(stdout);
    return 0;
}
