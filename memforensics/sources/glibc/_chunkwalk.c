/* Optional accelerator for memforensics.sources.glibc.glibc_walk: the copy of a heap mapping out
 * of the target (_procmem_read.h) and the two loops of the residency walk
 * (follow_list: a circular free list; follow_fastbin: a fastbin) through those private copies,
 * in C. heapcopy.copy_into, follow_list and follow_fastbin are the Python twins: the same
 * bytes, checks and results; the package works without this module (pip install on a machine
 * with no compiler builds none and uses the Python code).
 *
 * Every entry point releases the GIL while it works: inspect runs the residency scan in a
 * worker thread while the main thread drives the gdb session, and a copy of hundreds of MiB
 * or a walk of millions of chunks holding the GIL would stall that session (and with it the
 * target's pause) for as long. The buffers stay valid meanwhile because they are held through
 * Py_buffer views: an exported mmap or bytearray cannot be closed or resized until they are
 * released. Nothing here writes to the target; reads go only to the pages the caller marks
 * readable: those the pagemap says are present in RAM, never a swapped-out page (reading it
 * would fault it back into the target) nor a never-touched one, as procmem.py explains; with
 * pread of /proc/PID/mem, and process_vm_readv only for the pages a held target alone maps
 * (_procmem_read.h says why). */
#define _GNU_SOURCE
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <errno.h>
#include <stdlib.h>
#include <pthread.h>
#include <math.h>
#include <stdint.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include "_procmem_read.h"

#define ALIGN_MASK 15  /* MALLOC_ALIGNMENT - 1 on 64-bit glibc */
#define MAX_SEGMENTS 4096

static uint64_t word_at(const unsigned char *base, uint64_t slot) {
    uint64_t value;
    memcpy(&value, base + slot * 8, sizeof value);
    return value;
}

/* ---- copy ----------------------------------------------------------------------------- */

/* A stretch of the copy that no read fills must read as zeros (a pooled buffer holds another
 * arena's bytes). Whole pages of an anonymous private mapping are dropped instead of written:
 * they then read as zeros and cost no memory (a trimmed heap's holes can be hundreds of MiB). */
static void zero_hole(unsigned char *buf, size_t from, size_t to, size_t page, int anonymous) {
    if (anonymous && ((uintptr_t)buf % page) == 0 && from % page == 0 && to - from >= page) {
        size_t whole = (to - from) / page * page;
        if (madvise(buf + from, whole, MADV_DONTNEED) == 0) from += whole;
    }
    if (to > from) memset(buf + from, 0, to - from);
}

typedef struct {
    int fd; /* the target's /proc/PID/mem */
    int complete;
    unsigned char *buf;
    uint64_t address;
    Pinned pinned; /* runs of pages the held target alone maps: process_vm_readv, batched */
} Copy;

/* Bytes [from, to) of the copy read from the target: pinned (batched) where ``pin`` says the
 * pagemap, read in this stop, has every page of the run present and the target's alone, else
 * one pread for the run (the kernel reads it page by page either way); what cannot be read
 * reads as zeros. */
static void read_run(Copy *copy, size_t from, size_t to, int pin) {
    if (pin)
        pinned_read(&copy->pinned, copy->buf + from, copy->address + from, to - from);
    else if (!pread_fill(copy->fd, copy->buf + from, to - from, copy->address + from))
        copy->complete = 0;
}

/* Pages [first, last) of one copy: readable runs read, the rest zeroed. With a pagemap fd
 * and recheck, a page flagged readable is read only when the pagemap says it is present in RAM
 * now (its flag is cleared otherwise): the flags may come from an earlier pagemap, and a page
 * that left RAM since must not be read (a swapped one would be faulted back in). With a
 * pagemap fd and held (every thread of the target is held still), the pages it says the target
 * alone maps are read pinned (_procmem_read.h). */
typedef struct {
    Copy *copy;
    unsigned char *can_read;
    size_t first, last, pages, known, length, page;
    int anonymous, zero_holes, pagemap_fd, recheck, held;
} Part;

#define PAGEMAP_WINDOW 512 /* pagemap entries read at a time: 4 KiB, 2 MiB of address space */
/* Pages to be read this far apart share one pagemap read. A read costs a fixed part (the
 * call, the lock, the walk's setup) and a part per entry asked: here ~1.8 us for one entry
 * and ~50 ns for each more (33 entries ~3.6 us, two one-entry reads' worth), so two pages up
 * to 32 apart cost less read together than apart. A scouted copy's pages lie a few in each 2
 * MiB of its heap, often a few tens of pages apart (one free chunk's header each). */
#define PAGEMAP_GAP 32

typedef struct {
    size_t first, count;
    uint64_t entries[PAGEMAP_WINDOW];
} Window;

/* The pagemap entry of page ``index`` of the copy now (0: not read). */
static uint64_t entry_now(const Part *part, Window *window, size_t index) {
    if (window->count == 0 || index < window->first || index >= window->first + window->count) {
        /* From this page to the last page to be read that lies within PAGEMAP_GAP pages of
         * the one to be read before it: the pagemap costs its walk of every entry asked (a
         * 512-entry read ~14 times a one-entry one), and a window up to the last page to be
         * read in 2 MiB would walk almost every entry in between. */
        size_t end = part->last - index < PAGEMAP_WINDOW ? part->last : index + PAGEMAP_WINDOW;
        if (end > part->known) end = part->known; /* (index < known: take's check) */
        size_t want = 1;
        for (size_t k = index + 1; k < end && k - (index + want - 1) <= PAGEMAP_GAP; k++)
            if (part->can_read[k]) want = k - index + 1;
        window->count = pagemap_read(part->pagemap_fd, window->entries, want,
                                     part->copy->address / part->page + index);
        window->first = index;
        if (window->count == 0) return 0;
    }
    return window->entries[index - window->first];
}

enum { SKIP = 0, READ = 1, READ_PINNED = 2 };

/* How page ``index`` is read: not (not flagged readable, or rechecked and not in RAM now),
 * with pread, or pinned (the held target alone maps it now). */
static int take(Part *part, Window *window, size_t index) {
    if (index >= part->known || !part->can_read[index]) return SKIP;
    if (part->pagemap_fd < 0) return READ;
    uint64_t entry = entry_now(part, window, index);
    if (!(entry & PM_PRESENT) && part->recheck) {
        part->can_read[index] = 0; /* left RAM since the caller's pagemap: not read, and told */
        return SKIP;
    }
    return part->held && pinnable(entry) ? READ_PINNED : READ;
}

static void *copy_part(void *arg) {
    Part *part = arg;
    Copy *copy = part->copy;
    Window window = {.count = 0};
    size_t index = part->first;
    int how = index < part->last ? take(part, &window, index) : SKIP;
    while (index < part->last) {
        size_t run = index + 1;
        int next = SKIP;
        while (run < part->last && (next = take(part, &window, run)) == how) run++;
        size_t from = index * part->page;
        size_t to = run * part->page < part->length ? run * part->page : part->length;
        if (how != SKIP)
            read_run(copy, from, to, how == READ_PINNED);
        else if (part->zero_holes)
            zero_hole(copy->buf, from, to, part->page, part->anonymous);
        index = run;
        how = next;
    }
    pinned_flush(&copy->pinned);
    if (!copy->pinned.complete) copy->complete = 0;
    return NULL;
}

/* A copy of at least this many pages may be split between two threads: on a target held
 * still its CPUs are idle, and two readers copy a big arena in about 0.6 of one's time. */
#define SPLIT_MIN_PAGES 512

/* A copy's arguments as the reads need them (ValueError otherwise): a page size, dividing the
 * address where the pagemap is read, and the pagemap for a held read (its pins). */
static int copy_args_ok(unsigned long long page, unsigned long long address, int pagemap_fd,
                        int held_pid) {
    if (page == 0 || (pagemap_fd >= 0 && address % page != 0)) {
        PyErr_SetString(PyExc_ValueError, "page must be positive (and divide address)");
        return 0;
    }
    if (held_pid > 0 && pagemap_fd < 0) {
        PyErr_SetString(PyExc_ValueError, "a held read decides its pins from the pagemap");
        return 0;
    }
    return 1;
}

/* copy(fd, buffer, address, readable, page, anonymous[, threads[, zero_holes[, pagemap_fd[,
 *      recheck[, held_pid]]]]]) -> complete
 * Fill buffer with the target's bytes at address: readable holds one byte per page of the
 * buffer (nonzero = present in RAM, may be read; zero = swapped, never touched or unknown,
 * never read; missing entries are not read), pages not readable read as zeros. complete:
 * every readable byte was read. fd: the target's /proc/PID/mem. threads: 2 lets a copy of SPLIT_MIN_PAGES pages or more read
 * its second half in a second thread (the bytes are the same; only the time differs); with
 * zero_holes 0, of SPLIT_MIN_PAGES pages to read or more.
 * zero_holes: 0 leaves the pages not read as they are (a caller that copies again only the
 * pages it copied before, into a buffer whose other pages are zeros already). pagemap_fd
 * (the target's /proc/PID/pagemap, -1: none; address must then be page-aligned): the copy
 * reads each flagged page's entry as it goes. With recheck (the default), readable may be
 * older than the copy: a flagged page is read only if present in RAM now, and its flag
 * (readable must then be writable) is cleared where it is not. held_pid (0: none): the
 * caller holds every thread of that process, the target, still: the pages its pagemap says it
 * alone maps are read with process_vm_readv (_procmem_read.h); it needs pagemap_fd. */
static PyObject *copy_pages(PyObject *self, PyObject *args) {
    (void)self;
    PyObject *target, *flags;
    int fd, anonymous, threads = 1, zero_holes = 1, pagemap_fd = -1, recheck = 1, held_pid = 0;
    unsigned long long address, page;
    if (!PyArg_ParseTuple(args, "iOKOKp|iiipi", &fd, &target, &address, &flags, &page,
                          &anonymous, &threads, &zero_holes, &pagemap_fd, &recheck, &held_pid))
        return NULL;
    if (!copy_args_ok(page, address, pagemap_fd, held_pid)) return NULL;
    recheck = recheck && pagemap_fd >= 0;
    Py_buffer view, readable;
    if (PyObject_GetBuffer(target, &view, PyBUF_WRITABLE) < 0) return NULL;
    if (PyObject_GetBuffer(flags, &readable, recheck ? PyBUF_WRITABLE : PyBUF_SIMPLE) < 0) {
        PyBuffer_Release(&view);
        return NULL;
    }
    Copy *copy = PyMem_RawCalloc(2, sizeof(Copy));
    if (copy == NULL) {
        PyBuffer_Release(&view);
        PyBuffer_Release(&readable);
        return PyErr_NoMemory();
    }
    for (int half = 0; half < 2; half++) {
        copy[half].fd = fd;
        copy[half].complete = 1;
        copy[half].buf = view.buf;
        copy[half].address = address;
        copy[half].pinned = (Pinned){.pid = held_pid, .fd = fd, .complete = 1};
    }
    size_t length = (size_t)view.len, pages = (length + page - 1) / page;
    Part parts[2];
    for (int half = 0; half < 2; half++) {
        parts[half] = (Part){.copy = &copy[half], .can_read = readable.buf, .pages = pages,
                             .known = (size_t)readable.len, .length = length, .page = page,
                             .anonymous = anonymous, .zero_holes = zero_holes,
                             .pagemap_fd = pagemap_fd, .recheck = recheck,
                             .held = held_pid > 0};
    }
    /* The halves meet at a page boundary: each fills its own pages of the buffer. A copy
     * that leaves the pages it does not read as they are is split where half the pages it
     * reads lie, and only when they are SPLIT_MIN_PAGES or more (a part of a scouted heap
     * reads a few hundred of its tens of thousands: a second thread would cost more than
     * it saves). */
    size_t middle = pages;
    if (threads >= 2 && zero_holes && pages >= SPLIT_MIN_PAGES) {
        middle = pages / 2;
    } else if (threads >= 2) {
        const unsigned char *can = readable.buf;
        size_t known = (size_t)readable.len < pages ? (size_t)readable.len : pages, wanted = 0;
        for (size_t i = 0; i < known; i++) wanted += can[i] != 0;
        for (size_t i = 0, seen = 0; wanted >= SPLIT_MIN_PAGES && i < known; i++)
            if (can[i] && ++seen == wanted / 2) {
                middle = i + 1;
                break;
            }
    }
    parts[0].first = 0;
    parts[0].last = middle;
    parts[1].first = middle;
    parts[1].last = pages;
    Py_BEGIN_ALLOW_THREADS
    pthread_t helper;
    int split = middle < pages && pthread_create(&helper, NULL, copy_part, &parts[1]) == 0;
    copy_part(&parts[0]);
    if (split)
        pthread_join(helper, NULL);
    else if (middle < pages)
        copy_part(&parts[1]); /* no second thread to be had: the same bytes, one after the other */
    Py_END_ALLOW_THREADS
    PyObject *result = PyBool_FromLong(copy[0].complete && copy[1].complete);
    PyMem_RawFree(copy);
    PyBuffer_Release(&view);
    PyBuffer_Release(&readable);
    return result;
}

/* The pages a part of copy_each's may read: its flagged pages below ``known``. */
static size_t wanted_pages(const unsigned char *can, size_t known, size_t first, size_t last) {
    size_t wanted = 0;
    for (size_t i = first; i < last && i < known; i++) wanted += can[i] != 0;
    return wanted;
}

typedef struct {
    Part *parts;
    size_t count;
} Parts;

static void *copy_parts(void *arg) {
    Parts *run = arg;
    for (size_t i = 0; i < run->count; i++) copy_part(&run->parts[i]);
    return NULL;
}

/* copy_each(fd, items, page, threads, pagemap_fd, recheck, held_pid) -> complete
 * copy_pages with zero_holes 0 over several buffers at once, for a stop that copies again the
 * pages its scout read in each heap of an arena: items is a sequence of (buffer, address,
 * readable), each as copy_pages takes them (readable writable where recheck). With threads 2
 * and SPLIT_MIN_PAGES pages or more to read in all, the pages are split between two threads
 * where half of all of them lie (one buffer's pages may be split, at a page boundary), not
 * buffer by buffer: a GiB arena's stop reads a few hundred pages in each of its 16 heaps,
 * each too few for a second thread of its own. The bytes and flags are copy_pages's, buffer by
 * buffer. */
static PyObject *copy_each(PyObject *self, PyObject *args) {
    (void)self;
    PyObject *items;
    int fd, threads, pagemap_fd, recheck, held_pid;
    unsigned long long page;
    if (!PyArg_ParseTuple(args, "iOKiipi", &fd, &items, &page, &threads, &pagemap_fd,
                          &recheck, &held_pid))
        return NULL;
    if (!copy_args_ok(page, 0, pagemap_fd, held_pid)) return NULL;
    recheck = recheck && pagemap_fd >= 0;
    PyObject *seq = PySequence_Fast(items, "items must be a sequence");
    if (seq == NULL) return NULL;
    Py_ssize_t count = PySequence_Fast_GET_SIZE(seq);
    /* Two parts a buffer (the second empty unless the split falls inside it), each with its
     * own Copy: a part's pinned runs are its own. */
    Py_buffer *views = PyMem_RawCalloc((size_t)count * 2 + 1, sizeof(Py_buffer));
    Copy *copies = PyMem_RawCalloc((size_t)count * 2 + 1, sizeof(Copy));
    Part *parts = PyMem_RawCalloc((size_t)count * 2 + 1, sizeof(Part));
    Py_ssize_t held_views = 0;
    PyObject *result = NULL;
    if (views == NULL || copies == NULL || parts == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    size_t total = 0;
    for (Py_ssize_t i = 0; i < count; i++) {
        PyObject *item = PySequence_Fast_GET_ITEM(seq, i);
        PyObject *target, *flags;
        unsigned long long address;
        if (!PyArg_ParseTuple(item, "OKO", &target, &address, &flags)) goto done;
        if (!copy_args_ok(page, address, pagemap_fd, held_pid)) goto done;
        Py_buffer *view = &views[2 * i], *readable = &views[2 * i + 1];
        if (PyObject_GetBuffer(target, view, PyBUF_WRITABLE) < 0) goto done;
        held_views++;
        if (PyObject_GetBuffer(flags, readable, recheck ? PyBUF_WRITABLE : PyBUF_SIMPLE) < 0) {
            goto done;
        }
        held_views++;
        size_t length = (size_t)view->len, pages = (length + page - 1) / page;
        for (int half = 0; half < 2; half++) {
            Copy *copy = &copies[2 * i + half];
            *copy = (Copy){.fd = fd, .complete = 1, .buf = view->buf, .address = address,
                           .pinned = (Pinned){.pid = held_pid, .fd = fd, .complete = 1}};
            parts[2 * i + half] = (Part){
                .copy = copy, .can_read = readable->buf, .pages = pages,
                .known = (size_t)readable->len, .length = length, .page = page,
                .anonymous = 1, .zero_holes = 0, .pagemap_fd = pagemap_fd,
                .recheck = recheck, .held = held_pid > 0, .first = 0, .last = pages};
            if (half) parts[2 * i + half].first = pages; /* empty until a split says */
        }
        total += wanted_pages(readable->buf, (size_t)readable->len, 0, pages);
    }
    /* Parts [0, cut) for this thread, [cut, 2 * count) for the helper. */
    size_t cut = 2 * (size_t)count;
    if (threads >= 2 && total >= SPLIT_MIN_PAGES) {
        size_t seen = 0;
        for (Py_ssize_t i = 0; i < count && cut == 2 * (size_t)count; i++) {
            Part *first = &parts[2 * i];
            const unsigned char *can = first->can_read;
            size_t known = first->known < first->pages ? first->known : first->pages;
            for (size_t k = 0; k < known; k++) {
                if (can[k] && ++seen == total / 2) {
                    first->last = k + 1;
                    parts[2 * i + 1].first = k + 1;
                    cut = 2 * (size_t)i + 1;
                    break;
                }
            }
        }
    }
    Parts mine = {.parts = parts, .count = cut};
    Parts theirs = {.parts = parts + cut, .count = 2 * (size_t)count - cut};
    Py_BEGIN_ALLOW_THREADS
    pthread_t helper;
    int split = theirs.count > 0 && cut > 0 &&
                pthread_create(&helper, NULL, copy_parts, &theirs) == 0;
    copy_parts(&mine);
    if (split)
        pthread_join(helper, NULL);
    else if (cut < 2 * (size_t)count)
        copy_parts(&theirs); /* no second thread to be had: the same bytes, one after the other */
    Py_END_ALLOW_THREADS
    int complete = 1;
    for (Py_ssize_t i = 0; i < 2 * count; i++) complete = complete && copies[i].complete;
    result = PyBool_FromLong(complete);
done:
    for (Py_ssize_t i = 0; i < held_views; i++) PyBuffer_Release(&views[i]);
    PyMem_RawFree(views);
    PyMem_RawFree(copies);
    PyMem_RawFree(parts);
    Py_DECREF(seq);
    return result;
}

/* ---- walk ----------------------------------------------------------------------------- */

typedef struct {
    const unsigned char *base;
    uint64_t start, length, pages;
    const unsigned char *present; /* one byte per page, 1 = in RAM; NULL = all resident */
    /* rings only: one byte per page, 1 = copied (NULL: every page is); a word elsewhere is
     * not known (heap_checks copies such a page as it reads it) */
    const unsigned char *filled;
    uint64_t filled_pages;
} Seg;

/* Page ``index`` of seg is present (in RAM); a page past its flags is not. */
static int page_present(const Seg *seg, uint64_t index) {
    return index < seg->pages && seg->present[index];
}

/* How many of seg's pages [from, to) are present: eight flags a step (a free chunk of 64 MiB
 * spans 16,384 pages, and a GiB arena's lists hold hundreds of such chunks). */
static uint64_t present_pages(const Seg *seg, uint64_t from, uint64_t to) {
    const uint64_t low7 = 0x7F7F7F7F7F7F7F7FULL, high = 0x8080808080808080ULL;
    const unsigned char *flags = seg->present;
    if (to > seg->pages) to = seg->pages;
    uint64_t count = 0, i = from;
    for (; i < to && (i & 7); i++) count += flags[i] != 0;
    for (; i + 8 <= to; i += 8) {
        uint64_t word;
        memcpy(&word, flags + i, sizeof word);
        /* A byte's high bit after this is set exactly where the byte is not zero (its low
         * seven bits plus 0x7F carry into bit 7 unless they are all zero; no byte carries
         * into the next). */
        count += (uint64_t)__builtin_popcountll((((word & low7) + low7) | word) & high);
    }
    for (; i < to; i++) count += flags[i] != 0;
    return count;
}

/* Bytes of [from, to) on present pages of seg (from and to inside seg, from <= to). */
static uint64_t resident_span(const Seg *seg, uint64_t from, uint64_t to, uint64_t page) {
    if (from >= to) return 0;
    uint64_t first = (from - seg->start) / page, last = (to - 1 - seg->start) / page;
    if (first == last) return page_present(seg, first) ? to - from : 0;
    uint64_t total = present_pages(seg, first + 1, last) * page;
    if (page_present(seg, first)) total += seg->start + (first + 1) * page - from;
    if (page_present(seg, last)) total += to - (seg->start + last * page);
    return total;
}

/* The segment whose start is the last at or below ``address`` when ``length`` bytes from there
 * lie inside it, else NULL; segs sorted by start, not overlapping (heap_checks._Copy._segment's
 * rule). */
static const Seg *holding(const Seg *segs, Py_ssize_t count, uint64_t address, uint64_t length) {
    Py_ssize_t low = 0, high = count;
    while (low < high) {
        Py_ssize_t middle = (low + high) / 2;
        if (segs[middle].start <= address)
            low = middle + 1;
        else
            high = middle;
    }
    if (low == 0) return NULL;
    const Seg *seg = &segs[low - 1];
    return seg->length >= length && address - seg->start <= seg->length - length ? seg : NULL;
}

/* The segment holding [chunk, chunk + 32), or NULL. */
static const Seg *find_seg(const Seg *segs, Py_ssize_t count, uint64_t chunk) {
    return holding(segs, count, chunk, 32);
}

/* What a loop measured. raw_min, raw_max and raw_total are over the chunks' size words
 * with their flag bits (glibc's chunksize_nomask), the figures malloc_info prints per bin. */
typedef struct {
    uint64_t count, total, resident, trimmable, raw_min, raw_max, raw_total;
    int consistent, out_of_time;
} Tally;

/* What a loop read of the copies, as (address, length) pairs, for a caller that checks those
 * bytes against the held target (``unchanged``); NULL where no one asks. ``failed``: out of
 * memory (or past ``max_pairs``): the trace is incomplete and must not be trusted. */
typedef struct {
    uint64_t *pairs;
    size_t count, room, max_pairs;
    int failed;
} Trace;

static void trace_add(Trace *trace, uint64_t address, uint64_t length) {
    if (trace == NULL || trace->failed) return;
    if (trace->count + 2 > trace->room) {
        size_t room = trace->room ? trace->room * 2 : 4096;
        uint64_t *more = room / 2 > trace->max_pairs
                             ? NULL
                             : PyMem_RawRealloc(trace->pairs, room * sizeof *more);
        if (more == NULL) {
            trace->failed = 1;
            return;
        }
        trace->pairs = more;
        trace->room = room;
    }
    trace->pairs[trace->count++] = address;
    trace->pairs[trace->count++] = length;
}

#define TALLY_FIELDS 7 /* heapcopy.TALLY_FIELDS: the length of the tuple a walk returns */

/* The loops look at the clock when their chunk count is a multiple of CLOCK_EVERY_CHUNKS + 1
 * (65,536 chunks, ~10 ms at 5 M chunks/s): the same constant as
 * memforensics.sources.glibc.heapcopy.CLOCK_EVERY_CHUNKS, exported as the module's
 * CLOCK_EVERY_CHUNKS (a build without it is stale, and the Python loops run instead). */
#define CLOCK_EVERY_CHUNKS 0xFFFF
#define MINSIZE 32           /* the smallest chunk: a list longer than its room is a cycle */
#define MALLOC_CHUNK_BYTES 48 /* sizeof(struct malloc_chunk): what mtrim keeps of a chunk */
#define OFF_FD 16             /* the fd pointer after prev_size and size */

/* time.monotonic() of Python on Linux */
static double monotonic_seconds(void) {
    struct timespec now;
    clock_gettime(CLOCK_MONOTONIC, &now);
    return (double)now.tv_sec + (double)now.tv_nsec * 1e-9;
}

/* The most chunks a list through segs can hold (heapcopy.chunk_limit). */
static uint64_t chunk_limit(const Seg *segs, Py_ssize_t nsegs) {
    uint64_t limit = 0;
    for (Py_ssize_t i = 0; i < nsegs; i++) limit += segs[i].length / MINSIZE;
    return limit;
}

/* The whole pages mtrim madvises in a free chunk, as page numbers [*first, *last) (empty when
 * *last <= *first): from align_up(chunk + 48) to align_down(chunk + size). The same arithmetic
 * as memforensics.model.glibc.mtrim_span and mtrim_whole_pages_bytes, which C cannot call. */
static void mtrim_pages(uint64_t chunk, uint64_t size, uint64_t page, uint64_t *first,
                        uint64_t *last) {
    *first = (chunk + MALLOC_CHUNK_BYTES + page - 1) / page;
    *last = (chunk + size) / page;
}

/* One circular free list of bin head (its fd and bk) through segs; runs without the GIL.
 * heapcopy.follow_list is its Python twin: the same checks in the same order. Per chunk: the
 * 32-byte header inside a segment; 16-byte aligned; bk naming the chunk before; at most
 * chunk_limit chunks (a static copy cannot cycle without coming back to the head once every
 * bk names the chunk before, so this is a backstop); the clock every 65,536 chunks; size
 * within [low, high] and the chunk within its segment; the next chunk's prev_size equal to
 * the size (where in the copy, on a page in RAM). At the end: bk names the last chunk. */
static Tally follow_list(const Seg *segs, Py_ssize_t nsegs, uint64_t head, uint64_t fd,
                         uint64_t bk, uint64_t low, uint64_t high, uint64_t page,
                         double deadline, Trace *trace, uint64_t header_bytes) {
    Tally t = {0, 0, 0, 0, 0, 0, 0, 1, 0};
    uint64_t limit = chunk_limit(segs, nsegs);
    uint64_t previous = head, chunk = fd;
    const Seg *seg = nsegs ? &segs[0] : NULL;
    while (chunk != head) {
        if (seg == NULL || chunk < seg->start || seg->length < 32 ||
            chunk - seg->start > seg->length - 32) {
            seg = find_seg(segs, nsegs, chunk);
            if (seg == NULL) goto inconsistent;
        }
        uint64_t offset = chunk - seg->start, slot = offset >> 3;
        trace_add(trace, chunk + 8, header_bytes);
        if ((chunk & ALIGN_MASK) || word_at(seg->base, slot + 3) != previous || ++t.count > limit)
            goto inconsistent;
        if (!(t.count & CLOCK_EVERY_CHUNKS) && monotonic_seconds() > deadline) {
            t.out_of_time = 1;
            goto inconsistent;
        }
        uint64_t raw = word_at(seg->base, slot + 1), size = raw & ~(uint64_t)7;
        if (size < low || size > high || (slot + (size >> 3)) > (seg->length >> 3))
            goto inconsistent;
        /* glibc's set_foot: the next chunk's prev_size repeats a binned chunk's size ("corrupted
         * size vs. prev_size"), checked where that word is in the copy on a page in RAM. */
        uint64_t foot = offset + size;
        if (foot + 8 <= seg->length &&
            (seg->present == NULL || (foot / page < seg->pages && seg->present[foot / page]))) {
            trace_add(trace, chunk + size, 8);
            if (word_at(seg->base, foot >> 3) != size) goto inconsistent;
        }
        t.total += size;
        t.raw_total += raw;
        if (t.count == 1 || raw < t.raw_min) t.raw_min = raw;
        if (raw > t.raw_max) t.raw_max = raw;
        uint64_t first, last;
        mtrim_pages(chunk, size, page, &first, &last);
        if (seg->present == NULL) {
            t.resident += size;
            if (last > first) t.trimmable += (last - first) * page;
        } else {
            t.resident += resident_span(seg, chunk, chunk + size, page);
            if (last > first)
                t.trimmable += present_pages(seg, first - seg->start / page,
                                             last - seg->start / page) * page;
        }
        previous = chunk;
        chunk = word_at(seg->base, slot + 2);
    }
    t.consistent = bk == previous;
    return t;
inconsistent:
    t.consistent = 0;
    return t;
}

/* Segments for a loop: (buffer, start, present or None) items of ``items`` into ``segs``,
 * their buffers held in ``views`` (``*held`` of them, to release). 0, or -1 with an error. */
static int take_segments(PyObject *items, Py_ssize_t nsegs, unsigned long long page, Seg *segs,
                         Py_buffer *views, Py_ssize_t *held) {
    for (Py_ssize_t i = 0; i < nsegs; i++) {
        PyObject *buffer, *present;
        unsigned long long start;
        if (!PyArg_ParseTuple(PySequence_Fast_GET_ITEM(items, i), "OKO", &buffer, &start,
                              &present))
            return -1;
        if (start % page || (i && start < segs[i - 1].start + segs[i - 1].length)) {
            PyErr_SetString(PyExc_ValueError, "segments must be page-aligned, sorted, disjoint");
            return -1;
        }
        if (PyObject_GetBuffer(buffer, &views[*held], PyBUF_SIMPLE) < 0) return -1;
        segs[i].base = views[*held].buf;
        segs[i].length = (uint64_t)views[*held].len;
        (*held)++;
        segs[i].start = start;
        if (present != Py_None) {
            if (PyObject_GetBuffer(present, &views[*held], PyBUF_SIMPLE) < 0) return -1;
            segs[i].present = views[*held].buf;
            segs[i].pages = (uint64_t)views[*held].len;
            (*held)++;
        }
    }
    return 0;
}

/* A fastbin: NULL-terminated, singly linked through fd from chunk, each chunk of the bin's
 * one size; mangled: every fd is stored safe-linked, as (its own address >> 12) ^ pointer
 * (glibc >= 2.32). heapcopy.follow_fastbin is its Python twin. Per chunk: the header inside
 * a segment; 16-byte aligned; at most chunk_limit chunks; the clock every 65,536 chunks; size
 * equal to the bin's and the chunk within its segment; then the next chunk must not be the
 * one Brent's check marked: a fastbin has no bk to catch a loop (a corrupt heap's), and one
 * followed to chunk_limit would spin for as many chunks as the heaps hold (tens of millions
 * in a gigabyte arena, inside a stop) where this ends it within about twice its start and
 * length. */
static Tally follow_fastbin(const Seg *segs, Py_ssize_t nsegs, uint64_t chunk, uint64_t size,
                            uint64_t page, int mangled, double deadline, Trace *trace) {
    Tally t = {0, 0, 0, 0, 0, 0, 0, 1, 0};
    uint64_t limit = chunk_limit(segs, nsegs);
    uint64_t mark = chunk, power = 1, steps = 0;
    while (chunk) {
        const Seg *seg = find_seg(segs, nsegs, chunk);
        if (seg == NULL || (chunk & ALIGN_MASK) || ++t.count > limit) goto inconsistent;
        trace_add(trace, chunk + 8, 16);
        if (!(t.count & CLOCK_EVERY_CHUNKS) && monotonic_seconds() > deadline) {
            t.out_of_time = 1;
            goto inconsistent;
        }
        uint64_t offset = chunk - seg->start, slot = offset >> 3;
        uint64_t raw = word_at(seg->base, slot + 1);
        if ((raw & ~(uint64_t)7) != size || offset + size > seg->length) goto inconsistent;
        t.total += size;
        t.raw_total += raw;
        if (t.count == 1 || raw < t.raw_min) t.raw_min = raw;
        if (raw > t.raw_max) t.raw_max = raw;
        t.resident += seg->present == NULL ? size : resident_span(seg, chunk, chunk + size, page);
        uint64_t stored = word_at(seg->base, slot + 2);
        chunk = mangled ? ((chunk + OFF_FD) >> 12) ^ stored : stored;
        if (chunk == mark) goto inconsistent;
        if (++steps == power) {
            mark = chunk;
            power <<= 1;
            steps = 0;
        }
    }
    return t;
inconsistent:
    t.consistent = 0;
    return t;
}

typedef struct {
    Seg *segs;
    Py_buffer *views;
    Py_ssize_t nsegs, held;
    PyObject *items;
} Segments;

static int open_segments(PyObject *sequence, unsigned long long page, Segments *out) {
    out->segs = NULL;
    out->views = NULL;
    out->held = 0;
    if (page == 0) {
        PyErr_SetString(PyExc_ValueError, "page must be positive");
        return -1;
    }
    out->items = PySequence_Fast(sequence, "segments must be a sequence");
    if (out->items == NULL) return -1;
    out->nsegs = PySequence_Fast_GET_SIZE(out->items);
    if (out->nsegs > MAX_SEGMENTS) {
        PyErr_SetString(PyExc_ValueError, "too many segments");
        return -1;
    }
    out->segs = PyMem_RawCalloc((size_t)out->nsegs + 1, sizeof(Seg));
    out->views = PyMem_RawCalloc(2 * (size_t)out->nsegs + 1, sizeof(Py_buffer));
    if (out->segs == NULL || out->views == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    return take_segments(out->items, out->nsegs, page, out->segs, out->views, &out->held);
}

static void close_segments(Segments *segments) {
    for (Py_ssize_t i = 0; i < segments->held; i++) PyBuffer_Release(&segments->views[i]);
    PyMem_RawFree(segments->views);
    PyMem_RawFree(segments->segs);
    Py_XDECREF(segments->items);
}

/* walk_segments(segments, head, fd, bk, low, high, page, deadline=inf)
 * segments: sequence of (buffer, start, present or None), sorted by start: private copies of
 * one arena's heaps. -> (count, total, resident, trimmable, raw_min, raw_max, raw_total) (see
 * Tally), or None when the list does not
 * read back consistently (every chunk 16-byte aligned and inside a segment, bk naming the
 * chunk before, size fitting the bin and the segment, the list returning to the head whose
 * bk names the last chunk), or False when time.monotonic() passed deadline first (looked at
 * every 65,536 chunks). present: one byte per page of that copy (1 = in RAM). */
static PyObject *walk_segments(PyObject *self, PyObject *args) {
    (void)self;
    PyObject *sequence;
    unsigned long long head, fd, bk, low, high, page;
    double deadline = HUGE_VAL;
    if (!PyArg_ParseTuple(args, "OKKKKKK|d", &sequence, &head, &fd, &bk, &low, &high, &page,
                          &deadline))
        return NULL;
    Segments segments;
    PyObject *result = NULL;
    if (open_segments(sequence, page, &segments) == 0) {
        Tally t;
        Py_BEGIN_ALLOW_THREADS
        t = follow_list(segments.segs, segments.nsegs, head, fd, bk, low, high, page,
                        deadline, NULL, 24);
        Py_END_ALLOW_THREADS
        if (t.consistent)
            result = Py_BuildValue("KKKKKKK", t.count, t.total, t.resident, t.trimmable,
                                   t.raw_min, t.raw_max, t.raw_total);
        else {
            result = t.out_of_time ? Py_False : Py_None;
            Py_INCREF(result);
        }
    }
    close_segments(&segments);
    return result;
}

/* walk_fastbin(segments, head, size, page, mangled, deadline=inf) -> (count, total, resident,
 * 0, raw_min, raw_max, raw_total), or None when the fastbin does not read back consistently (follow_fastbin's checks), or
 * False when time.monotonic() passed deadline first. segments as for walk_segments. */
static PyObject *walk_fastbin(PyObject *self, PyObject *args) {
    (void)self;
    PyObject *sequence;
    unsigned long long head, size, page;
    int mangled;
    double deadline = HUGE_VAL;
    if (!PyArg_ParseTuple(args, "OKKKp|d", &sequence, &head, &size, &page, &mangled, &deadline))
        return NULL;
    Segments segments;
    PyObject *result = NULL;
    if (open_segments(sequence, page, &segments) == 0) {
        Tally t;
        Py_BEGIN_ALLOW_THREADS
        t = follow_fastbin(segments.segs, segments.nsegs, head, size, page, mangled, deadline,
                           NULL);
        Py_END_ALLOW_THREADS
        if (t.consistent)
            result = Py_BuildValue("KKKKKKK", t.count, t.total, t.resident, 0ULL, t.raw_min,
                                   t.raw_max, t.raw_total);
        else {
            result = t.out_of_time ? Py_False : Py_None;
            Py_INCREF(result);
        }
    }
    close_segments(&segments);
    return result;
}

/* ---- unchanged: a scouted copy checked against the held target, word by word ---------------- */

/* Our memory for one check, bounded whatever the lists: past either bound the check fails and
 * the caller copies the pages as before. A trace pair is 16 bytes, and its spans 32 more (4 MiB
 * and 8 MiB here; a 1 GiB arena with a few thousand free chunks needs ~10,000 pairs); the words
 * read are at most a page per page the lists touch (~1 MiB there). */
#define UNCHANGED_MAX_PAIRS (1 << 18)
#define UNCHANGED_MAX_READ_BYTES (8u << 20)

static int compare_pairs(const void *a, const void *b) {
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

/* A large bin's nextsize ring as heap_checks._nextsize reads it (the same steps, from the first
 * chunk, at most ``steps`` links): each chunk's 40 bytes from its size word traced. A ring that
 * does not come back within ``steps`` fails the trace (the check would read on). */
static void trace_ring(const Seg *segs, Py_ssize_t nsegs, uint64_t head, uint64_t first,
                       uint64_t steps, Trace *trace) {
    const Seg *seg = find_seg(segs, nsegs, first);
    if (first == head || seg == NULL || first + 48 > seg->start + seg->length) return;
    uint64_t chunk = first;
    trace_add(trace, chunk + 8, 40);
    uint64_t size = word_at(seg->base, (chunk - seg->start + 8) >> 3) & ~(uint64_t)7;
    for (uint64_t step = 0; step <= steps; step++) {
        uint64_t following = word_at(seg->base, (chunk - seg->start + 32) >> 3);
        const Seg *next = find_seg(segs, nsegs, following);
        if (next == NULL || following + 48 > next->start + next->length || (following & 15))
            return;
        trace_add(trace, following + 8, 40);
        if (word_at(next->base, (following - next->start + 40) >> 3) != chunk || following == first)
            return;
        uint64_t next_size = word_at(next->base, (following - next->start + 8) >> 3) & ~(uint64_t)7;
        if (next_size >= size) return;
        chunk = following;
        seg = next;
        size = next_size;
    }
    trace->failed = 1;
}

/* One reader's share of ``unchanged``'s spans [first, last): each span's page looked up in the
 * pagemap (entry_now's windows), read into scratch from ``at`` on (pinned where the held
 * target alone maps it). same: every page was in RAM and every read complete. */
typedef struct {
    const uint64_t *spans;
    size_t first, last;
    unsigned char *scratch;
    uint64_t at, page;
    int mem_fd, pagemap_fd;
    pid_t pid;
    int same;
} Reads;

static void *read_spans(void *arg) {
    Reads *r = arg;
    Pinned pinned = {.pid = r->pid, .fd = r->mem_fd, .complete = 1, .runs = 0};
    uint64_t window[PAGEMAP_WINDOW];
    uint64_t window_first = 0, window_count = 0, at = r->at, page = r->page;
    r->same = 1;
    for (size_t i = r->first; i < r->last; i++) {
        uint64_t lo = r->spans[2 * i], hi = r->spans[2 * i + 1], number = lo / page;
        if (window_count == 0 || number < window_first || number >= window_first + window_count) {
            /* Entries from this page to the last span's page within PAGEMAP_GAP pages of the
             * one before (entry_now's rule: the pagemap costs its walk of every entry asked). */
            size_t want = 1;
            uint64_t last = number;
            for (size_t k = i + 1; k < r->last; k++) {
                uint64_t other = r->spans[2 * k] / page;
                if (other - last > PAGEMAP_GAP || other - number >= PAGEMAP_WINDOW) break;
                last = other;
                want = (size_t)(other - number + 1);
            }
            window_first = number;
            window_count = pagemap_read(r->pagemap_fd, window, want, number);
            if (window_count == 0) {
                r->same = 0;
                break;
            }
        }
        uint64_t entry = window[number - window_first];
        if (!(entry & PM_PRESENT)) {
            r->same = 0; /* left RAM since the scout: never read (it would be faulted back in) */
            break;
        }
        if (pinnable(entry))
            pinned_read(&pinned, r->scratch + at, lo, hi - lo);
        else if (!pread_fill(r->mem_fd, r->scratch + at, hi - lo, lo))
            pinned.complete = 0;
        at += hi - lo;
    }
    if (r->same) pinned_flush(&pinned);
    r->same = r->same && pinned.complete;
    return NULL;
}

/* A plan of ``unchanged``'s reads and comparisons, made from the copies alone (before the stop
 * where it can be: the trace, its sort and the copy's bytes, which lie a page apart in a buffer
 * of up to a GiB, are then no part of the stop), as one block: a PlanHead, the spans to read
 * (lo, hi) one per page touched, the comparisons (offset in what the spans read, length) and
 * the copy's bytes they must equal, in the same order. */
typedef struct {
    uint64_t page, nspans, ncmps, total, nexpected;
} PlanHead;

/* The plan of the traced ``pairs`` (sorted here) over the copies: NULL where a range lies
 * outside them, past UNCHANGED_MAX_READ_BYTES, or out of memory (the caller then takes the
 * copy as not unchanged). A page's ranges are read as one span (from the first to the end of
 * the last); a range on a page the copy does not hold is neither read nor compared (heap_checks
 * reads it from the target, and the C walk reads zeros there in both the trace and the walk).
 * Only the traced bytes are compared, not the whole span: the bytes between two free chunks'
 * words on a page are live chunks', which a running program changes. *size: the plan's bytes. */
static unsigned char *build_plan(const Seg *segs, Py_ssize_t nsegs, const Py_buffer *filled,
                                 uint64_t *pairs, size_t npairs, uint64_t page, size_t *size) {
    qsort(pairs, npairs, 2 * sizeof *pairs, compare_pairs);
    /* (A range splits in two at most: it is shorter than a page.) */
    uint64_t *spans = PyMem_RawMalloc((npairs + 1) * 2 * 2 * sizeof *spans);
    uint64_t *cmps = PyMem_RawMalloc((npairs + 1) * 2 * 2 * sizeof *cmps);
    unsigned char *plan = NULL;
    size_t nspans = 0, ncmps = 0;
    uint64_t total = 0, nexpected = 0;
    if (spans == NULL || cmps == NULL) goto done;
    for (size_t i = 0; i < npairs; i++) {
        uint64_t lo = pairs[2 * i], hi = lo + pairs[2 * i + 1];
        while (lo < hi) {
            uint64_t end = (lo / page + 1) * page;
            if (end > hi) end = hi;
            const Seg *seg = holding(segs, nsegs, lo, end - lo);
            if (seg == NULL) goto done;
            const Py_buffer *flags = &filled[seg - segs];
            uint64_t index = (lo - seg->start) / page;
            if (index < (uint64_t)flags->len && ((const unsigned char *)flags->buf)[index]) {
                if (nspans && spans[2 * nspans - 2] / page == lo / page) {
                    if (end > spans[2 * nspans - 1]) spans[2 * nspans - 1] = end;
                } else {
                    spans[2 * nspans] = lo;
                    spans[2 * nspans + 1] = end;
                    nspans++;
                }
            }
            lo = end;
        }
    }
    for (size_t i = 0; i < nspans; i++) total += spans[2 * i + 1] - spans[2 * i];
    if (total > UNCHANGED_MAX_READ_BYTES) goto done;
    /* The comparisons: each traced piece's place in what the spans read (overlapping and
     * adjacent pieces merged: the pairs are sorted), its length. */
    size_t span = 0, last_span = 0;
    uint64_t span_at = 0;
    for (size_t i = 0; i < npairs; i++) {
        uint64_t lo = pairs[2 * i], hi = lo + pairs[2 * i + 1];
        for (; lo < hi; lo = lo / page * page + page) {
            uint64_t end = (lo / page + 1) * page;
            if (end > hi) end = hi;
            while (span < nspans && spans[2 * span + 1] <= lo) {
                span_at += spans[2 * span + 1] - spans[2 * span];
                span++;
            }
            if (span == nspans || lo < spans[2 * span]) continue; /* (a page not held) */
            uint64_t at = span_at + (lo - spans[2 * span]), length = end - lo;
            /* (Merged within one span only: two spans next to each other in what is read
             * are pages apart in the target.) */
            if (ncmps && span == last_span && at <= cmps[2 * ncmps - 2] + cmps[2 * ncmps - 1]) {
                uint64_t last_end = cmps[2 * ncmps - 2] + cmps[2 * ncmps - 1];
                if (at + length > last_end) {
                    nexpected += at + length - last_end;
                    cmps[2 * ncmps - 1] = at + length - cmps[2 * ncmps - 2];
                }
            } else {
                cmps[2 * ncmps] = at;
                cmps[2 * ncmps + 1] = length;
                ncmps++;
                nexpected += length;
                last_span = span;
            }
        }
    }
    *size = sizeof(PlanHead) + (2 * nspans + 2 * ncmps) * sizeof(uint64_t) + nexpected;
    plan = PyMem_RawMalloc(*size ? *size : 1);
    if (plan == NULL) goto done;
    PlanHead head = {page, nspans, ncmps, total, nexpected};
    memcpy(plan, &head, sizeof head);
    uint64_t *plan_spans = (uint64_t *)(plan + sizeof head);
    memcpy(plan_spans, spans, 2 * nspans * sizeof *spans);
    memcpy(plan_spans + 2 * nspans, cmps, 2 * ncmps * sizeof *cmps);
    /* The copy's bytes of each comparison: found again through its span's address. */
    unsigned char *expected = (unsigned char *)(plan_spans + 2 * nspans + 2 * ncmps);
    span = 0;
    span_at = 0;
    for (size_t c = 0; c < ncmps; c++) {
        uint64_t at = cmps[2 * c], length = cmps[2 * c + 1];
        while (span_at + (spans[2 * span + 1] - spans[2 * span]) <= at) {
            span_at += spans[2 * span + 1] - spans[2 * span];
            span++;
        }
        uint64_t address = spans[2 * span] + (at - span_at);
        const Seg *seg = holding(segs, nsegs, address, length);
        if (seg == NULL) { /* (not by construction: a span lies in one page of one copy) */
            PyMem_RawFree(plan);
            plan = NULL;
            goto done;
        }
        memcpy(expected, seg->base + (address - seg->start), length);
        expected += length;
    }
done:
    PyMem_RawFree(spans);
    PyMem_RawFree(cmps);
    return plan;
}

/* The plan's spans read from the held target and compared: 1 when every span's page is in RAM
 * now (its pagemap entry read first: a page not in RAM is never read) and every traced byte
 * equals the copy's as the plan holds them, 0 otherwise (or on a failed read). A page the
 * target alone maps is read pinned (_procmem_read.h), others by pread; two readers where there
 * is enough to read (the target's CPUs are idle while it is held). *read_bytes: the bytes read
 * from the target. */
static int plan_same(const unsigned char *plan, int mem_fd, int pagemap_fd, pid_t pid,
                     uint64_t *read_bytes) {
    PlanHead head;
    memcpy(&head, plan, sizeof head);
    const uint64_t *spans = (const uint64_t *)(plan + sizeof head);
    const uint64_t *cmps = spans + 2 * head.nspans;
    const unsigned char *expected = (const unsigned char *)(cmps + 2 * head.ncmps);
    size_t nspans = (size_t)head.nspans;
    unsigned char *scratch = PyMem_RawMalloc(head.total + 1);
    if (scratch == NULL) return 0;
    Reads halves[2] = {
        {.spans = spans, .first = 0, .last = nspans, .scratch = scratch, .page = head.page,
         .mem_fd = mem_fd, .pagemap_fd = pagemap_fd, .pid = pid},
        {.spans = spans, .first = nspans, .last = nspans, .scratch = scratch, .page = head.page,
         .mem_fd = mem_fd, .pagemap_fd = pagemap_fd, .pid = pid},
    };
    pthread_t second;
    int threaded = 0;
    if (nspans >= SPLIT_MIN_PAGES) {
        size_t middle = nspans / 2;
        uint64_t at = 0;
        for (size_t i = 0; i < middle; i++) at += spans[2 * i + 1] - spans[2 * i];
        halves[0].last = middle;
        halves[1].first = middle;
        halves[1].last = nspans;
        halves[1].at = at;
        threaded = pthread_create(&second, NULL, read_spans, &halves[1]) == 0;
        if (!threaded) halves[0].last = nspans;
    }
    read_spans(&halves[0]);
    if (threaded) pthread_join(second, NULL);
    int same = halves[0].same && (!threaded || halves[1].same);
    for (uint64_t c = 0; c < head.ncmps && same; c++) {
        same = memcmp(scratch + cmps[2 * c], expected, cmps[2 * c + 1]) == 0;
        expected += cmps[2 * c + 1];
    }
    *read_bytes = head.total;
    PyMem_RawFree(scratch);
    return same;
}

/* The plan (build_plan) of the lists of ``lists_obj`` and the ranges of ``extra_obj`` over the
 * copies ``sequence`` (their pages held: ``filled_obj``), as ``unchanged`` and ``plan`` take
 * them: each list followed through the copies exactly as the walk does, every word it reads
 * traced. NULL, *error 0: no plan (a list does not read back consistently, the trace is past
 * UNCHANGED_MAX_PAIRS, a range lies outside the copies or the reads past their bound); NULL,
 * *error 1: a Python exception is set. */
static unsigned char *plan_of(PyObject *sequence, PyObject *filled_obj, PyObject *lists_obj,
                              PyObject *extra_obj, unsigned long long page, double deadline,
                              size_t *size, int *error) {
    *error = 1;
    PyObject *lists = PySequence_Fast(lists_obj, "lists must be a sequence");
    if (lists == NULL) return NULL;
    PyObject *extra = PySequence_Fast(extra_obj, "extra must be a sequence");
    if (extra == NULL) {
        Py_DECREF(lists);
        return NULL;
    }
    Py_ssize_t nlists = PySequence_Fast_GET_SIZE(lists), nextra = PySequence_Fast_GET_SIZE(extra);
    unsigned long long *params = PyMem_Malloc((size_t)(nlists ? nlists : 1) * 7 * sizeof *params);
    unsigned char *plan = NULL;
    Segments segments = {0};
    int opened = 0, same = 1;
    Trace trace = {.max_pairs = UNCHANGED_MAX_PAIRS};
    PyObject *filled_items = NULL;
    Py_buffer *filled = NULL;
    Py_ssize_t nfilled = 0;
    if (params == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    for (Py_ssize_t i = 0; i < nlists; i++) {
        unsigned long long *p = params + i * 7;
        if (!PyArg_ParseTuple(PySequence_Fast_GET_ITEM(lists, i), "KKKKKKK", &p[0], &p[1], &p[2],
                              &p[3], &p[4], &p[5], &p[6]))
            goto done;
    }
    for (Py_ssize_t i = 0; i < nextra; i++) {
        unsigned long long address, length;
        if (!PyArg_ParseTuple(PySequence_Fast_GET_ITEM(extra, i), "KK", &address, &length))
            goto done;
        trace_add(&trace, address, length);
    }
    opened = 1; /* (close_segments undoes a failed open too) */
    if (open_segments(sequence, page, &segments) != 0) goto done;
    filled_items = PySequence_Fast(filled_obj, "filled must be a sequence");
    if (filled_items == NULL) goto done;
    if (PySequence_Fast_GET_SIZE(filled_items) != segments.nsegs) {
        PyErr_SetString(PyExc_ValueError, "one filled flag string per segment");
        goto done;
    }
    filled = PyMem_Calloc((size_t)(segments.nsegs ? segments.nsegs : 1), sizeof *filled);
    if (filled == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    for (; nfilled < segments.nsegs; nfilled++)
        if (PyObject_GetBuffer(PySequence_Fast_GET_ITEM(filled_items, nfilled), &filled[nfilled],
                               PyBUF_SIMPLE) < 0)
            goto done;
    *error = 0;
    Py_BEGIN_ALLOW_THREADS
    for (Py_ssize_t i = 0; i < nlists && same && !trace.failed; i++) {
        const unsigned long long *p = params + i * 7;
        if (p[0] == 0) {
            Tally t = follow_list(segments.segs, segments.nsegs, p[1], p[2], p[3], p[4], p[5],
                                  page, deadline, &trace, p[6]);
            same = t.consistent;
            if (same && p[6] > 24) trace_ring(segments.segs, segments.nsegs, p[1], p[2], t.count,
                                             &trace);
        } else {
            Tally plain = follow_fastbin(segments.segs, segments.nsegs, p[1], p[2], page, 0,
                                         deadline, &trace);
            Tally linked = follow_fastbin(segments.segs, segments.nsegs, p[1], p[2], page, 1,
                                          deadline, &trace);
            same = (plain.consistent || linked.consistent) && !plain.out_of_time &&
                   !linked.out_of_time;
        }
    }
    if (same && !trace.failed)
        plan = build_plan(segments.segs, segments.nsegs, filled, trace.pairs, trace.count / 2,
                          page, size);
    Py_END_ALLOW_THREADS
done:
    for (Py_ssize_t i = 0; i < nfilled; i++) PyBuffer_Release(&filled[i]);
    PyMem_Free(filled);
    Py_XDECREF(filled_items);
    if (opened) close_segments(&segments);
    PyMem_RawFree(trace.pairs);
    PyMem_Free(params);
    Py_DECREF(lists);
    Py_DECREF(extra);
    return plan;
}

/* unchanged(segments, filled, lists, extra, page, pid, mem_fd, pagemap_fd, deadline)
 *     -> (same, read)
 * In a stop, every thread of the target (pid) held: whether the copies (``segments``, as for
 * walk_segments) hold, at every byte the residency walk and heap_checks read of the lists of
 * ``lists``, what the target holds now; then that walk over the copies reads what it would
 * read in the target itself, and the stop need not copy the pages again. lists: (kind, a, b,
 * c, d, e, f) each: kind 0 a circular list (head, fd, bk, low, high, header bytes read from
 * the size word: 24, or 40 for a large bin, whose nextsize ring is traced too); kind 1 a
 * fastbin (first chunk, size, 0, 0, 0, 0), followed both ways (as stored and safe-linked);
 * ``extra``: (address, length) pairs read besides (the top's header). Each list is followed
 * through the copies exactly as the walk does, every word it reads traced; any list that does
 * not read back consistently, a trace past ``max_pairs``, a range outside the copies or on a
 * page not in RAM now, or one byte that differs: False. filled: per segment, one byte per
 * page, the pages the copy holds (Segment.filled): a word on a page it does not hold is not
 * compared (heap_checks reads it from the target; a C loop reads zeros there, in the trace as
 * in the walk, and a list whose words read zeros does not read back consistently). read:
 * bytes read from the target. plan() and same() are its two halves. */
static PyObject *unchanged(PyObject *self, PyObject *args) {
    (void)self;
    PyObject *sequence, *filled_obj, *lists_obj, *extra_obj;
    unsigned long long page;
    int pid, mem_fd, pagemap_fd, error;
    double deadline;
    size_t size = 0;
    uint64_t read_bytes = 0;
    if (!PyArg_ParseTuple(args, "OOOOKiiid", &sequence, &filled_obj, &lists_obj, &extra_obj,
                          &page, &pid, &mem_fd, &pagemap_fd, &deadline))
        return NULL;
    unsigned char *plan =
        plan_of(sequence, filled_obj, lists_obj, extra_obj, page, deadline, &size, &error);
    if (plan == NULL && error) return NULL;
    int same = 0;
    if (plan != NULL) {
        Py_BEGIN_ALLOW_THREADS
        same = plan_same(plan, mem_fd, pagemap_fd, (pid_t)pid, &read_bytes);
        Py_END_ALLOW_THREADS
        PyMem_RawFree(plan);
    }
    return Py_BuildValue("OK", same ? Py_True : Py_False, (unsigned long long)read_bytes);
}

/* plan(segments, filled, lists, extra, page, deadline) -> bytes or None
 * The first half of ``unchanged``, from the copies alone (no target is read): its reads and
 * comparisons, to be made by same() in a stop; None where ``unchanged`` would be False before
 * reading. Valid while the copies and their flags are not changed, for lists with these
 * heads. */
static PyObject *plan(PyObject *self, PyObject *args) {
    (void)self;
    PyObject *sequence, *filled_obj, *lists_obj, *extra_obj;
    unsigned long long page;
    double deadline;
    int error;
    size_t size = 0;
    if (!PyArg_ParseTuple(args, "OOOOKd", &sequence, &filled_obj, &lists_obj, &extra_obj, &page,
                          &deadline))
        return NULL;
    unsigned char *made =
        plan_of(sequence, filled_obj, lists_obj, extra_obj, page, deadline, &size, &error);
    if (made == NULL) {
        if (error) return NULL;
        Py_RETURN_NONE;
    }
    PyObject *result = PyBytes_FromStringAndSize((const char *)made, (Py_ssize_t)size);
    PyMem_RawFree(made);
    return result;
}

/* same(plan, pid, mem_fd, pagemap_fd) -> (same, read)
 * The second half of ``unchanged``, in a stop: the reads and comparisons of a plan() made
 * over copies that have not changed since. */
static PyObject *same(PyObject *self, PyObject *args) {
    (void)self;
    Py_buffer made;
    int pid, mem_fd, pagemap_fd, result = 0;
    uint64_t read_bytes = 0;
    if (!PyArg_ParseTuple(args, "y*iii", &made, &pid, &mem_fd, &pagemap_fd)) return NULL;
    PlanHead head;
    int valid = (size_t)made.len >= sizeof head;
    if (valid) {
        memcpy(&head, made.buf, sizeof head);
        valid = head.page > 0 && head.total <= UNCHANGED_MAX_READ_BYTES &&
                head.nspans <= (uint64_t)made.len && head.ncmps <= (uint64_t)made.len &&
                (uint64_t)made.len == sizeof head + (2 * head.nspans + 2 * head.ncmps) * 8 +
                                          head.nexpected;
    }
    if (valid) {
        /* (Every span within a page, their bytes the total; every comparison within them.) */
        const uint64_t *spans = (const uint64_t *)((const unsigned char *)made.buf + sizeof head);
        uint64_t total = 0;
        for (uint64_t i = 0; i < head.nspans && valid; i++) {
            valid = spans[2 * i] < spans[2 * i + 1] &&
                    spans[2 * i + 1] - 1 - (spans[2 * i] / head.page * head.page) < head.page;
            total += spans[2 * i + 1] - spans[2 * i];
        }
        const uint64_t *cmps = spans + 2 * head.nspans;
        uint64_t expected = 0;
        for (uint64_t c = 0; c < head.ncmps && valid; c++) {
            valid = cmps[2 * c] <= total && cmps[2 * c + 1] <= total - cmps[2 * c];
            expected += cmps[2 * c + 1];
        }
        valid = valid && total == head.total && expected == head.nexpected;
    }
    if (!valid) {
        PyBuffer_Release(&made);
        PyErr_SetString(PyExc_ValueError, "not a plan made by plan()");
        return NULL;
    }
    Py_BEGIN_ALLOW_THREADS
    result = plan_same(made.buf, mem_fd, pagemap_fd, (pid_t)pid, &read_bytes);
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&made);
    return Py_BuildValue("OK", result ? Py_True : Py_False, (unsigned long long)read_bytes);
}

/* ---- The relay (memforensics.sources.glibc.bin_relay): one circular free list followed in the
 * held target itself, a stretch per stop, from where the last stretch left it. No copy of the
 * heap is kept: the pages the list leads to are read into ``cache`` (blocks of RELAY_BLOCK_PAGES
 * pages, direct-mapped, forgotten at every call but those that keep it: the later calls of one
 * stop, which follow the arena's lists side by side; a page read in an earlier stop may have
 * changed since), so our memory is the cache's whatever the list's
 * length. Whether a page is in RAM is read from the pagemap as it is needed (a window of
 * RELAY_WINDOW_ENTRIES entries at a time); a page that is not is never read. ---- */

#define RELAY_BLOCK_PAGES 16
#define RELAY_WINDOW_ENTRIES 512
#define RELAY_CLOCK_EVERY 63 /* the clock is looked at every 64 chunks (a chunk may cost a read) */
#define RELAY_CURSOR_FIELDS 12

enum {
    RELAY_DONE = 0,       /* back at the head: the caller checks the bin's bk */
    RELAY_TIME = 1,       /* the deadline passed: the cursor is where the next stretch begins */
    RELAY_MOVED = 2,      /* resumed: the chunk before no longer leads to the cursor's chunk */
    RELAY_NOT_IN_RAM = 3, /* a header lies on a page not in RAM (never read) */
    RELAY_OUTSIDE = 4,    /* the chunk is outside the arena's heaps */
    RELAY_ALIGN = 5,      /* the chunk is not 16-byte aligned */
    RELAY_BK = 6,         /* its bk does not name the chunk before (detail: the bk) */
    RELAY_SIZE = 7,       /* its size does not fit the bin or its heap (detail: the size word) */
    RELAY_FOOT = 8,       /* the next chunk's prev_size is not its size (detail: that word) */
    RELAY_LOOP = 9,       /* the list came back to a chunk it passed (Brent's check) */
    RELAY_LIMIT = 10,     /* more chunks than the heaps can hold */
};

typedef struct {
    uint64_t start, end;
    /* Optional (NULL: every page): one byte per page from start, the pages a block read takes
     * (a scout's pages of the lists: the others are read alone, where a list leads there). */
    const unsigned char *mask;
    uint64_t mask_pages;
} Span;

typedef struct {
    int mem_fd, pagemap_fd;
    uint64_t page;
    const Span *spans;
    Py_ssize_t nspans;
    unsigned char *data;    /* nblocks blocks of RELAY_BLOCK_PAGES pages */
    uint64_t *tags;         /* per block slot: its block number + 1, 0 when empty */
    unsigned char *present; /* per block slot and page: 1 = read from RAM */
    size_t nblocks;
    uint64_t window_tag; /* the pagemap window held: its number + 1, 0 none */
    uint64_t window[RELAY_WINDOW_ENTRIES];
    uint64_t pages_read;
    Pinned pinned; /* pages the held target alone maps: process_vm_readv (_procmem_read.h) */
} Live;

/* Page ``number``'s pagemap entry now (0 where it cannot be read). */
static uint64_t live_entry(Live *l, uint64_t number) {
    uint64_t window = number / RELAY_WINDOW_ENTRIES;
    if (l->window_tag != window + 1) {
        memset(l->window, 0, sizeof l->window);
        pagemap_read(l->pagemap_fd, l->window, RELAY_WINDOW_ENTRIES,
                     window * RELAY_WINDOW_ENTRIES);
        l->window_tag = window + 1;
    }
    return l->window[number % RELAY_WINDOW_ENTRIES];
}

/* The page holding ``address`` as read in this call, or NULL when it is not in RAM. A block is
 * read at its first use, one pread per run of its pages in RAM. */
/* Page ``number`` is one a block read takes: no mask, or its span's mask flags it. */
static int live_wanted(const Live *l, uint64_t number) {
    uint64_t address = number * l->page;
    for (Py_ssize_t i = 0; i < l->nspans; i++) {
        const Span *span = &l->spans[i];
        if (address >= span->start && address < span->end) {
            uint64_t index = (address - span->start) / l->page;
            return span->mask == NULL || (index < span->mask_pages && span->mask[index]);
        }
    }
    return 1;
}

/* Pages [i, j) of the block at page ``first`` read into ``data``, all pinned or all with pread
 * (``pin``); 1 when every byte was read. */
static int live_read(Live *l, unsigned char *data, uint64_t first, size_t i, size_t j, int pin) {
    uint64_t page = l->page;
    l->pages_read += j - i;
    if (!pin) return pread_fill(l->mem_fd, data + i * page, (j - i) * page, (first + i) * page);
    l->pinned.complete = 1;
    pinned_read(&l->pinned, data + i * page, (first + i) * page, (j - i) * page);
    pinned_flush(&l->pinned);
    return l->pinned.complete;
}

enum { PAGE_NOT_IN_RAM = 0, PAGE_READ = 1, PAGE_LATER = 2 };

/* The page holding ``address`` as read in this call, or NULL when it is not in RAM. A block is
 * read at its first use, one read per run of its pages in RAM (and wanted: live_wanted); a page
 * of it left out is read alone when a list leads there. */
static const unsigned char *live_page(Live *l, uint64_t address) {
    uint64_t page = l->page, number = address / page, block = number / RELAY_BLOCK_PAGES;
    uint64_t first = block * RELAY_BLOCK_PAGES;
    size_t slot = (size_t)(block % l->nblocks);
    unsigned char *data = l->data + slot * RELAY_BLOCK_PAGES * page;
    unsigned char *present = l->present + slot * RELAY_BLOCK_PAGES;
    size_t index = (size_t)(number - first);
    if (l->tags[slot] != block + 1) {
        size_t i = 0;
        int pinned_any = 0;
        l->pinned.complete = 1;
        while (i < RELAY_BLOCK_PAGES) {
            uint64_t entry = live_entry(l, first + i);
            if (!(entry & PM_PRESENT) || (i != index && !live_wanted(l, first + i))) {
                present[i] = (entry & PM_PRESENT) ? PAGE_LATER : PAGE_NOT_IN_RAM;
                i++;
                continue;
            }
            /* A run of wanted pages in RAM, all read pinned or all with pread. */
            int pin = l->pinned.pid > 0 && pinnable(entry);
            size_t j = i + 1;
            while (j < RELAY_BLOCK_PAGES) {
                uint64_t next = live_entry(l, first + j);
                if (!(next & PM_PRESENT) || (j != index && !live_wanted(l, first + j)) ||
                    (l->pinned.pid > 0 && pinnable(next)) != pin)
                    break;
                j++;
            }
            if (pin) { /* queued: the block's pinned runs are read in one call, below */
                pinned_read(&l->pinned, data + i * page, (first + i) * page, (j - i) * page);
                memset(present + i, PAGE_READ, j - i);
                l->pages_read += j - i;
                pinned_any = 1;
            } else { /* a run cut short: none of it is trusted */
                memset(present + i, live_read(l, data, first, i, j, 0) ? PAGE_READ : 0, j - i);
            }
            i = j;
        }
        if (pinned_any) {
            pinned_flush(&l->pinned);
            if (!l->pinned.complete) /* (which run fell short is not known: none trusted) */
                for (size_t k = 0; k < RELAY_BLOCK_PAGES; k++)
                    if (present[k] == PAGE_READ) present[k] = PAGE_NOT_IN_RAM;
        }
        l->tags[slot] = block + 1;
    } else if (present[index] == PAGE_LATER) {
        uint64_t entry = live_entry(l, number);
        int pin = l->pinned.pid > 0 && pinnable(entry);
        present[index] = (entry & PM_PRESENT) && live_read(l, data, first, index, index + 1, pin)
                             ? PAGE_READ
                             : PAGE_NOT_IN_RAM;
    }
    return present[index] == PAGE_READ ? data + index * page : NULL;
}

/* The 8-byte word at ``address`` (8-aligned) into *value: 1, or 0 when its page is not in RAM. */
static int live_word(Live *l, uint64_t address, uint64_t *value) {
    const unsigned char *page = live_page(l, address);
    if (page == NULL) return 0;
    memcpy(value, page + address % l->page, sizeof *value);
    return 1;
}

/* Bytes of [from, to) on pages in RAM now. */
static uint64_t live_resident(Live *l, uint64_t from, uint64_t to) {
    uint64_t total = 0, page = l->page;
    while (from < to) {
        uint64_t end = (from / page + 1) * page;
        uint64_t piece = end < to ? end : to;
        if (live_entry(l, from / page) & PM_PRESENT) total += piece - from;
        from = piece;
    }
    return total;
}

static const Span *live_span(const Live *l, uint64_t chunk) {
    for (Py_ssize_t i = 0; i < l->nspans; i++)
        if (chunk >= l->spans[i].start && l->spans[i].end - l->spans[i].start >= 32 &&
            chunk - l->spans[i].start <= l->spans[i].end - l->spans[i].start - 32)
            return &l->spans[i];
    return NULL;
}

/* The cursor: the chunk before, the chunk to read next, the figures so far (follow_list's
 * Tally) and Brent's mark, power and steps. */
typedef struct {
    uint64_t previous, chunk, count, total, resident, trimmable, raw_min, raw_max, raw_total,
        mark, power, steps;
} Cursor;

/* Follow the list of bin ``head`` from the cursor until back at the head or past ``deadline``;
 * the checks are follow_list's, in its order, on words read from the held target now. With
 * ``resume``, the link the cursor was left on is looked at first: the fd of the chunk before
 * must still name the cursor's chunk (else RELAY_MOVED: the list changed between two stops).
 * *detail: the word a failed check read. */
static int relay_follow(Live *l, uint64_t head, uint64_t low, uint64_t high, uint64_t limit,
                        double deadline, uint64_t max_chunks, int resume, Cursor *c,
                        uint64_t *detail) {
    uint64_t page = l->page;
    if (resume) {
        uint64_t fd;
        if (!live_word(l, c->previous + 16, &fd)) return RELAY_NOT_IN_RAM;
        if (fd != c->chunk) {
            *detail = fd;
            return RELAY_MOVED;
        }
    }
    uint64_t walked = 0;
    while (c->chunk != head) {
        if (!(++walked & RELAY_CLOCK_EVERY) && monotonic_seconds() > deadline) return RELAY_TIME;
        if (max_chunks != 0 && walked > max_chunks) return RELAY_TIME;
        uint64_t chunk = c->chunk;
        const Span *span = live_span(l, chunk);
        if (span == NULL) return RELAY_OUTSIDE;
        if (chunk & ALIGN_MASK) return RELAY_ALIGN;
        uint64_t raw, fd, bk;
        if (!live_word(l, chunk + 24, &bk) || !live_word(l, chunk + 8, &raw) ||
            !live_word(l, chunk + 16, &fd))
            return RELAY_NOT_IN_RAM;
        if (bk != c->previous) {
            *detail = bk;
            return RELAY_BK;
        }
        if (c->count + 1 > limit) return RELAY_LIMIT;
        uint64_t size = raw & ~(uint64_t)7;
        if (size < low || size > high || size > span->end - chunk) {
            *detail = raw;
            return RELAY_SIZE;
        }
        uint64_t foot;
        if (chunk + size + 8 <= span->end && live_word(l, chunk + size, &foot) && foot != size) {
            *detail = foot;
            return RELAY_FOOT;
        }
        c->count++;
        c->total += size;
        c->raw_total += raw;
        if (c->count == 1 || raw < c->raw_min) c->raw_min = raw;
        if (raw > c->raw_max) c->raw_max = raw;
        c->resident += live_resident(l, chunk, chunk + size);
        uint64_t first, last;
        mtrim_pages(chunk, size, page, &first, &last);
        for (uint64_t p = first; p < last; p++)
            if (live_entry(l, p) & PM_PRESENT) c->trimmable += page;
        c->previous = chunk;
        c->chunk = fd;
        /* (Back at the head ends the list: Brent's mark starts at the head, so a list of one
         * chunk would otherwise be taken for a loop at its first step.) */
        if (fd != head && fd == c->mark) return RELAY_LOOP;
        if (++c->steps == c->power) {
            c->mark = fd;
            c->power <<= 1;
            c->steps = 0;
        }
    }
    return RELAY_DONE;
}

/* relay(pid, mem_fd, pagemap_fd, spans, head, low, high, page, limit, deadline, cache, resume,
 *       cursor[, keep_cache[, max_chunks]]) -> (status, cursor, detail, pages_read)
 * pid: the target, held still (its pages it alone maps are read with process_vm_readv);
 * 0: every page with pread.
 * spans: ((start, end[, mask]), ...) of the arena's heaps (mask: bytes, one a page, the pages a
 * block read takes; the spans' items are held by the caller until the call returns); cache: a writable buffer of RELAY_BLOCK_PAGES
 * pages per block plus 8 + RELAY_BLOCK_PAGES bytes per block (relay_cache_bytes); cursor and
 * the returned one: RELAY_CURSOR_FIELDS integers (Cursor's fields, in order). keep_cache: the
 * cache holds what an earlier call of this same stop read (the target held still since), and
 * is used as it is; otherwise (the default) it is forgotten first. max_chunks (0: none): the
 * stretch ends as at its deadline (RELAY_TIME) once it has followed that many chunks. */
static PyObject *relay(PyObject *self, PyObject *args) {
    (void)self;
    int pid, mem_fd, pagemap_fd, resume, keep_cache = 0;
    unsigned long long max_chunks = 0;
    PyObject *spans_obj, *cursor_obj;
    unsigned long long head, low, high, page, limit;
    double deadline;
    Py_buffer cache;
    if (!PyArg_ParseTuple(args, "iiiOKKKKKdw*pO|pK", &pid, &mem_fd, &pagemap_fd, &spans_obj, &head,
                          &low, &high, &page, &limit, &deadline, &cache, &resume, &cursor_obj,
                          &keep_cache, &max_chunks))
        return NULL;
    PyObject *result = NULL, *spans_seq = NULL, *cursor_seq = NULL;
    Span *spans = NULL;
    Live live;
    memset(&live, 0, sizeof live);
    size_t per_block = RELAY_BLOCK_PAGES * (size_t)page + sizeof(uint64_t) + RELAY_BLOCK_PAGES;
    if (page == 0 || (page & (page - 1)) || (size_t)cache.len < per_block) {
        PyErr_SetString(PyExc_ValueError, "page must be a power of two, cache one block or more");
        goto done;
    }
    spans_seq = PySequence_Fast(spans_obj, "spans must be a sequence");
    cursor_seq = spans_seq ? PySequence_Fast(cursor_obj, "cursor must be a sequence") : NULL;
    if (cursor_seq == NULL) goto done;
    Py_ssize_t nspans = PySequence_Fast_GET_SIZE(spans_seq);
    if (nspans > MAX_SEGMENTS || PySequence_Fast_GET_SIZE(cursor_seq) != RELAY_CURSOR_FIELDS) {
        PyErr_SetString(PyExc_ValueError, "too many spans, or a cursor of the wrong length");
        goto done;
    }
    spans = PyMem_Malloc(sizeof(Span) * (size_t)(nspans ? nspans : 1));
    if (spans == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    for (Py_ssize_t i = 0; i < nspans; i++) {
        unsigned long long start, end;
        const char *mask = NULL;
        Py_ssize_t mask_pages = 0;
        if (!PyArg_ParseTuple(PySequence_Fast_GET_ITEM(spans_seq, i), "KK|z#", &start, &end,
                              &mask, &mask_pages))
            goto done;
        spans[i] = (Span){start, end, (const unsigned char *)mask, (uint64_t)mask_pages};
    }
    uint64_t fields[RELAY_CURSOR_FIELDS];
    for (Py_ssize_t i = 0; i < RELAY_CURSOR_FIELDS; i++) {
        fields[i] = PyLong_AsUnsignedLongLong(PySequence_Fast_GET_ITEM(cursor_seq, i));
        if (PyErr_Occurred()) goto done;
    }
    Cursor c;
    memcpy(&c, fields, sizeof c);
    live.mem_fd = mem_fd;
    live.pinned.pid = pid;
    live.pinned.fd = mem_fd;
    live.pagemap_fd = pagemap_fd;
    live.page = page;
    live.spans = spans;
    live.nspans = nspans;
    live.nblocks = (size_t)cache.len / per_block;
    live.data = cache.buf;
    live.tags = (uint64_t *)((unsigned char *)cache.buf +
                             live.nblocks * RELAY_BLOCK_PAGES * (size_t)page);
    live.present = (unsigned char *)(live.tags + live.nblocks);
    uint64_t detail = 0;
    int status;
    Py_BEGIN_ALLOW_THREADS
    if (!keep_cache) memset(live.tags, 0, live.nblocks * sizeof(uint64_t));
    status = relay_follow(&live, head, low, high, limit, deadline, max_chunks, resume, &c,
                          &detail);
    Py_END_ALLOW_THREADS
    memcpy(fields, &c, sizeof c);
    result = Py_BuildValue("(i(KKKKKKKKKKKK)KK)", status, fields[0], fields[1], fields[2],
                           fields[3], fields[4], fields[5], fields[6], fields[7], fields[8],
                           fields[9], fields[10], fields[11], detail, live.pages_read);
done:
    PyBuffer_Release(&cache);
    Py_XDECREF(spans_seq);
    Py_XDECREF(cursor_seq);
    PyMem_Free(spans);
    return result;
}

/* ---- nextsize rings ------------------------------------------------------------------- */

#define NEXTSIZE_CHUNK_BYTES 48 /* heap_checks._CHUNK_BYTES: prev_size … bk_nextsize */

/* Where the word at ``address`` (inside ``seg``) lies on a page its copy holds: 1, else 0. */
static int copied(const Seg *seg, uint64_t address, uint64_t page) {
    if (seg->filled == NULL) return 1;
    uint64_t index = (address - seg->start) / page;
    return index < seg->filled_pages && seg->filled[index];
}

enum { RING_FAILS = 0, RING_HOLDS = 1, RING_UNKNOWN = 2 };

/* One large bin's nextsize ring as heap_checks._nextsize checks it, from ``first`` (the bin's
 * fd), at most ``limit`` + 1 links: RING_HOLDS where it passes (or where _nextsize finds
 * nothing to check: first is the head, or not a whole chunk in the copies), RING_FAILS where a
 * check fails, RING_UNKNOWN where a word it needs lies on a page not copied. */
static int ring_holds(const Seg *segs, Py_ssize_t nsegs, uint64_t head, uint64_t first,
                      uint64_t limit, uint64_t page) {
    const Seg *seg = holding(segs, nsegs, first, NEXTSIZE_CHUNK_BYTES);
    if (first == head || seg == NULL) return RING_HOLDS;
    uint64_t chunk = first;
    if (!copied(seg, chunk + 8, page)) return RING_UNKNOWN;
    uint64_t size = word_at(seg->base, (chunk - seg->start + 8) >> 3) & ~(uint64_t)7;
    for (uint64_t step = 0; step <= limit; step++) {
        if (!copied(seg, chunk + 32, page)) return RING_UNKNOWN;
        uint64_t following = word_at(seg->base, (chunk - seg->start + 32) >> 3);
        const Seg *next = holding(segs, nsegs, following, NEXTSIZE_CHUNK_BYTES);
        if (next == NULL || (following & ALIGN_MASK)) return RING_FAILS;
        if (!copied(next, following + 40, page)) return RING_UNKNOWN;
        if (word_at(next->base, (following - next->start + 40) >> 3) != chunk) return RING_FAILS;
        if (following == first) return RING_HOLDS;
        if (!copied(next, following + 8, page)) return RING_UNKNOWN;
        uint64_t next_size = word_at(next->base, (following - next->start + 8) >> 3) & ~(uint64_t)7;
        if (next_size >= size) return RING_FAILS;
        chunk = following;
        seg = next;
        size = next_size;
    }
    return RING_FAILS; /* the ring loops */
}

/* rings(segments, rings, page[, filled]) -> bytes
 * segments and page as for walk_segments; rings: (head, first) of each large bin whose list
 * read back consistently; filled (None: every page copied): one flag string per segment, 1 =
 * the page is copied. One byte per ring: 1 where its nextsize ring passes
 * heap_checks._nextsize's checks, 0 where one fails, 2 where it leads to a word on a page not
 * copied (heap_checks then follows it, names what fails, and copies what it reads). The rings
 * of one stop's walk checked in one call: in Python they are ~500 words a GiB arena, read
 * inside the stop. */
static PyObject *rings(PyObject *self, PyObject *args) {
    (void)self;
    PyObject *sequence, *items, *filled_obj = Py_None;
    unsigned long long page;
    if (!PyArg_ParseTuple(args, "OOK|O", &sequence, &items, &page, &filled_obj)) return NULL;
    PyObject *seq = PySequence_Fast(items, "rings must be a sequence");
    if (seq == NULL) return NULL;
    PyObject *filled_items = NULL;
    Py_buffer *filled = NULL;
    Py_ssize_t nfilled = 0;
    Py_ssize_t count = PySequence_Fast_GET_SIZE(seq);
    uint64_t *pairs = PyMem_RawCalloc(2 * (size_t)count + 1, sizeof(uint64_t));
    PyObject *result = NULL;
    Segments segments = {.segs = NULL, .views = NULL, .held = 0, .items = NULL};
    if (pairs == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    for (Py_ssize_t i = 0; i < count; i++) {
        unsigned long long head, first;
        if (!PyArg_ParseTuple(PySequence_Fast_GET_ITEM(seq, i), "KK", &head, &first)) goto done;
        pairs[2 * i] = head;
        pairs[2 * i + 1] = first;
    }
    if (open_segments(sequence, page, &segments) != 0) goto done;
    if (filled_obj != Py_None) {
        filled_items = PySequence_Fast(filled_obj, "filled must be a sequence");
        if (filled_items == NULL) goto done;
        if (PySequence_Fast_GET_SIZE(filled_items) != segments.nsegs) {
            PyErr_SetString(PyExc_ValueError, "one filled flag string per segment");
            goto done;
        }
        filled = PyMem_RawCalloc((size_t)segments.nsegs + 1, sizeof(Py_buffer));
        if (filled == NULL) {
            PyErr_NoMemory();
            goto done;
        }
        for (; nfilled < segments.nsegs; nfilled++) {
            if (PyObject_GetBuffer(PySequence_Fast_GET_ITEM(filled_items, nfilled),
                                   &filled[nfilled], PyBUF_SIMPLE) < 0)
                goto done;
            segments.segs[nfilled].filled = filled[nfilled].buf;
            segments.segs[nfilled].filled_pages = (uint64_t)filled[nfilled].len;
        }
    }
    result = PyBytes_FromStringAndSize(NULL, count);
    if (result == NULL) goto done;
    unsigned char *out = (unsigned char *)PyBytes_AS_STRING(result);
    uint64_t limit = chunk_limit(segments.segs, segments.nsegs);
    Py_BEGIN_ALLOW_THREADS
    for (Py_ssize_t i = 0; i < count; i++)
        out[i] = (unsigned char)ring_holds(segments.segs, segments.nsegs, pairs[2 * i],
                                           pairs[2 * i + 1], limit, page);
    Py_END_ALLOW_THREADS
done:
    for (Py_ssize_t i = 0; i < nfilled; i++) PyBuffer_Release(&filled[i]);
    PyMem_RawFree(filled);
    Py_XDECREF(filled_items);
    close_segments(&segments);
    PyMem_RawFree(pairs);
    Py_DECREF(seq);
    return result;
}

/* ---- page flags ------------------------------------------------------------------------ */

/* both(first, second) -> bytes: heapcopy.both's twin, each byte the bitwise AND of the two
 * strings' bytes at its place, as long as the shorter (in a stop, a GiB arena's 16 heaps'
 * flags of 16,384 pages each are ANDed: as Python integers, ~60 us a heap). */
static PyObject *both(PyObject *self, PyObject *args) {
    (void)self;
    Py_buffer first, second;
    if (!PyArg_ParseTuple(args, "y*y*", &first, &second)) return NULL;
    Py_ssize_t length = first.len < second.len ? first.len : second.len;
    PyObject *result = PyBytes_FromStringAndSize(NULL, length);
    if (result != NULL) {
        unsigned char *out = (unsigned char *)PyBytes_AS_STRING(result);
        const unsigned char *a = first.buf, *b = second.buf;
        for (Py_ssize_t i = 0; i < length; i++) out[i] = a[i] & b[i];
    }
    PyBuffer_Release(&first);
    PyBuffer_Release(&second);
    return result;
}

static PyMethodDef methods[] = {
    {"walk_segments", walk_segments, METH_VARARGS,
     "Follow one free list through copies of an arena's heaps: (count, total, resident, "
     "trimmable, raw_min, raw_max, raw_total), None or False."},
    {"walk_fastbin", walk_fastbin, METH_VARARGS,
     "Follow one fastbin through copies of an arena's heaps: (count, total, resident, 0, "
     "raw_min, raw_max, raw_total), "
     "None or False."},
    {"relay", relay, METH_VARARGS,
     "Follow one free list in the held target from a cursor, until its head or a deadline: "
     "(status, cursor, detail, pages_read)."},
    {"unchanged", unchanged, METH_VARARGS,
     "Whether a scouted copy holds what the held target holds at every word the walk of its "
     "lists reads: (same, bytes_read)."},
    {"plan", plan, METH_VARARGS,
     "unchanged's reads and comparisons planned from the copies alone (bytes), or None."},
    {"same", same, METH_VARARGS,
     "unchanged's reads and comparisons of a plan, in a stop: (same, bytes_read)."},
    {"copy", copy_pages, METH_VARARGS,
     "Copy a target's readable pages into a buffer: True when every readable byte was read."},
    {"rings", rings, METH_VARARGS,
     "Whether each large bin's nextsize ring passes heap_checks' checks: one byte per ring "
     "(1 passes, 0 fails, 2 leads to a page not copied)."},
    {"both", both, METH_VARARGS,
     "Each byte the bitwise AND of two byte strings' bytes at its place (as long as the "
     "shorter)."},
    {"copy_each", copy_each, METH_VARARGS,
     "copy with zero_holes 0 over several buffers, their pages split between two threads as "
     "one: True when every readable byte was read."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_chunkwalk", NULL, -1, methods};

PyMODINIT_FUNC PyInit__chunkwalk(void) {
    PyObject *created = PyModule_Create(&module);
    if (created == NULL) return NULL;
    if (PyModule_AddIntConstant(created, "CLOCK_EVERY_CHUNKS", CLOCK_EVERY_CHUNKS) < 0 ||
        PyModule_AddIntConstant(created, "TALLY_FIELDS", TALLY_FIELDS) < 0 ||
        PyModule_AddIntConstant(created, "RELAY_BLOCK_PAGES", RELAY_BLOCK_PAGES) < 0) {
        Py_DECREF(created);
        return NULL;
    }
    return created;
}
