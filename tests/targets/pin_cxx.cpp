// A C++ heap whose pin is a polymorphic object: 300 buffers of 64 KiB, then one shop::Cart
// (virtual, about 60 KiB), then every buffer deleted: the Cart pins them all. Compiled
// stripped (tests/support/census_targets.compile_cxx): its type is named by RTTI alone.
// Prints "ready pin=ADDR:FREED_USER_BYTES:FREED_CHUNK_BYTES" (ADDR: the Cart's pointer) and
// then waits until killed, calling nothing into malloc.
#include <malloc.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>

namespace shop {
struct Base {
    virtual ~Base() {}
    long id = 0;
};
struct Cart : Base {
    char items[60000];
    ~Cart() override {}
};
}  // namespace shop

static shop::Base *volatile kept;
static char *buffers[300];

int main() {
    const size_t size = 64 * 1024;
    for (auto &buffer : buffers) {
        buffer = new char[size];
        memset(buffer, 0x41, size);
    }
    auto *cart = new shop::Cart;
    memset(cart->items, 0, sizeof cart->items);
    kept = cart;
    size_t user = 0, chunk = 0;
    for (auto &buffer : buffers) {
        user += size;
        chunk += malloc_usable_size(buffer) + 8;
        delete[] buffer;
    }
    char line[128];
    int length = snprintf(line, sizeof line, "ready pin=%p:%zu:%zu\n",
                          static_cast<void *>(const_cast<shop::Base *>(kept)), user, chunk);
    if (write(1, line, static_cast<size_t>(length)) != length) return 3;
    for (;;) pause();
}
