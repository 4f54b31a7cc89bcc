// The census benchmark's target (benchmarks/bench_census.py): THREADS threads, each filling
// its own arena with MB mebibytes of polymorphic objects of OBJECT_BYTES (every eighth
// allocation a text instead), then printing nothing more. Run with
// GLIBC_TUNABLES=glibc.malloc.arena_max=N so that every thread keeps an arena of its own.
//   census_bench THREADS MB OBJECT_BYTES
#include <pthread.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <new>
#include <vector>

namespace bench {
struct Base {
    virtual ~Base() {}
};
struct Record : Base {
    long id = 1;
};
}  // namespace bench

static long megabytes, object_bytes;
static pthread_barrier_t barrier;

static void *fill(void *) {
    long made = 0, target = megabytes << 20;
    std::vector<void *> *keep = new std::vector<void *>();
    for (long i = 0; made < target; i++) {
        if (i % 8 == 7) {
            char *text = (char *)malloc(object_bytes);
            memset(text, 'a' + i % 26, object_bytes - 1);
            text[object_bytes - 1] = 0;
            keep->push_back(text);
        } else {
            keep->push_back(new (::operator new(object_bytes)) bench::Record());
        }
        made += object_bytes + 8;
    }
    pthread_barrier_wait(&barrier);
    for (;;) pause();
    return nullptr;
}

int main(int argc, char **argv) {
    if (argc < 4) return 2;
    int threads = atoi(argv[1]);
    megabytes = atol(argv[2]);
    object_bytes = atol(argv[3]);
    pthread_barrier_init(&barrier, nullptr, threads + 1);
    for (int t = 0; t < threads; t++) {
        pthread_t thread;
        pthread_create(&thread, nullptr, fill, nullptr);
    }
    pthread_barrier_wait(&barrier);
    printf("ready\n");
    fflush(stdout);
    for (;;) pause();
}
