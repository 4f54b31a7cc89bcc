// The oracle of the C++ census (tests/integration/test_census_cpp.py): a known population,
// compiled stripped (g++ -O2 -s), printed on the "ready" line as name=count pairs.
//   census_service [churn]
// With "churn", a thread allocates and frees unrelated blocks without pause. Commands on
// stdin: "grow N" makes N more shop::Leak (each owning a 100-byte text), then prints "grown".
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

namespace shop {
struct Base {
    virtual ~Base() {}
    long id = 0;
};
struct Session : Base {
    char token[40];
    ~Session() override {}
};
struct Priced {
    virtual double price() const { return 1.0; }
    virtual ~Priced() {}
    double amount = 2.0;
};
struct Logged {
    virtual void log() const {}
    virtual ~Logged() {}
    int level = 3;
};
struct Order : Priced, Logged {  // multiple inheritance: the primary vptr names Order
    double price() const override { return 3.0; }
    void log() const override {}
    long lines[6] = {0};
};
template <typename T>
struct Box : Base {
    T value{};
};
struct Cart {
    virtual ~Cart() {}
    long items[5] = {0};
};
struct Item {  // no virtual: new Item[n] with a destructor has an array cookie
    ~Item() { volatile int x = 0; (void)x; }
    long a = 1, b = 2;
};
struct Widget : Base {  // new Widget[n]: a cookie, then polymorphic objects
    long w = 4;
};
struct Leak : Base {
    char *text = nullptr;
};
}  // namespace shop

static std::vector<void *> keep;
static std::atomic<bool> churning{false};

static void churn() {
    std::mt19937 rng(7);
    std::vector<void *> slots(4096, nullptr);
    while (churning.load(std::memory_order_relaxed)) {
        size_t i = rng() % slots.size();
        free(slots[i]);
        slots[i] = malloc(16 + rng() % 3000);
    }
}

int main(int argc, char **argv) {
    const int sessions = 20000, orders = 7000, boxes_int = 3000, boxes_str = 2000;
    const int carts = 4000, item_arrays = 500, widget_arrays = 300, texts = 5000, zeros = 1500;
    std::vector<shop::Base *> objects;
    for (int i = 0; i < sessions; i++) objects.push_back(new shop::Session());
    std::vector<shop::Order *> order_list;
    for (int i = 0; i < orders; i++) order_list.push_back(new shop::Order());
    for (int i = 0; i < boxes_int; i++) objects.push_back(new shop::Box<int>());
    for (int i = 0; i < boxes_str; i++) objects.push_back(new shop::Box<std::string>());
    std::vector<std::shared_ptr<shop::Cart>> cart_list;
    for (int i = 0; i < carts; i++) cart_list.push_back(std::make_shared<shop::Cart>());
    std::vector<shop::Item *> items;
    for (int i = 0; i < item_arrays; i++) items.push_back(new shop::Item[3 + i % 5]);
    std::vector<shop::Widget *> widgets;
    for (int i = 0; i < widget_arrays; i++) widgets.push_back(new shop::Widget[2 + i % 3]);
    for (int i = 0; i < texts; i++) {
        char line[200];
        int n = snprintf(line, sizeof line, "GET /api/v1/orders/%d?session=%08x HTTP/1.1", i,
                         i * 2654435761u);
        char *copy = (char *)malloc(n + 1);
        memcpy(copy, line, n + 1);
        keep.push_back(copy);
    }
    for (int i = 0; i < zeros; i++) keep.push_back(calloc(1, 64 + (i % 8) * 48));
    std::thread churner;
    if (argc > 1 && strcmp(argv[1], "churn") == 0) {
        churning = true;
        churner = std::thread(churn);
    }
    printf("ready shop::Session=%d shop::Order=%d shop::Box<int>=%d "
           "box_string=%d "
           "make_shared=%d item_arrays=%d widget_arrays=%d text=%d zeros=%d\n",
           sessions, orders, boxes_int, boxes_str, carts, item_arrays, widget_arrays, texts, zeros);
    fflush(stdout);
    std::vector<shop::Leak *> leaks;
    std::string command;
    while (std::cin >> command) {
        if (command == "grow") {
            long n = 0;
            std::cin >> n;
            for (long i = 0; i < n; i++) {
                auto *leak = new shop::Leak();
                leak->text = (char *)malloc(101);
                memset(leak->text, 'x', 100);
                leak->text[100] = 0;
                leaks.push_back(leak);
            }
            printf("grown %zu\n", leaks.size());
            fflush(stdout);
        }
    }
    churning = false;
    if (churner.joinable()) churner.join();
    return 0;
}
