/* Optional accelerator for memforensics.sources.glibc.glibc_walk.ArenaWalker.scout: which pages
 * of an arena's heaps its circular free lists lie on, learnt from the running target before the
 * stop that copies those pages alone.
 *
 * The lists (the bins' circular lists, and the fastbins, followed both as stored and as
 * safe-linked: the wrong way leaves the heaps at once) are followed side by side: each
 * advances through the pages already copied until it needs one that is not (a chunk's 32-byte
 * header, 48 bytes in a large bin, or the word after a binned chunk where glibc repeats its
 * size), then the pages every list needs are read together (a pread of /proc/PID/mem each; in
 * a stop, by two threads in a big round, and the pages the held target alone maps through
 * process_vm_readv: _procmem_read.h). So the rounds are as many as the longest chain of pages
 * one list leads through, not one per chunk. Each page read is copied into the caller's
 * buffer of its heap and flagged in the caller's ``filled`` (1); what the buffer holds
 * elsewhere is left alone.
 *
 * Nothing is checked here beyond what keeps the reads inside the heaps: a list is followed
 * until it returns to its head, leaves the heaps, is misaligned, names a size that does not fit
 * its heap, reaches a page not in RAM (never read: that would fault a swapped page back into
 * the target), or has more chunks than its heaps can hold. The stop's walk checks every list
 * over the copy made then, and follows those that moved since from the target.
 *
 * Everything read is hostile input: no allocation is sized by a value read from the target
 * (the requests are bounded by the number of lists, the pages by the caller's max_pages). */
#define _GNU_SOURCE
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <errno.h>
#include <pthread.h>
#include <stdint.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "_procmem_read.h"

#define ALIGN_MASK 15
#define MINSIZE 32
#define HEADER_BYTES 32
/* A large bin's chunk: its fd_nextsize and bk_nextsize too, which the stop's checks of the
 * bin's nextsize ring read (heap_checks._nextsize); a chunk in a page's last 32 bytes has them
 * on the next page. */
#define LARGE_HEADER_BYTES 48
#define FIRST_LARGE_BIN 64
#define MAX_SEGMENTS 4096
#define SPLIT_MIN_WANTS 16 /* a round of at least this many pages may be read by two threads */

typedef struct {
    unsigned char *base;
    uint64_t start, length, pages, page_bytes;
    const unsigned char *readable; /* pagemap: 1 = in RAM (may be read) */
    uint64_t known;                /* entries of readable */
    /* 1 = copied; 2 = asked for in this round; 3 = found not in RAM as it was to be read
     * (pagemap_fd only; 0 again before the scout returns). A fresh scout's (its pages copied
     * earlier are read again once, where a list needs them; 1 again before it returns): 4 =
     * copied earlier, not read again yet; 5 = one of those asked for in this round; 6 = one
     * of those found not in RAM (not read: it keeps its earlier copy and flag) */
    unsigned char *filled;
    int pagemap_fd; /* >= 0: whether a page is in RAM is read as it is to be read, not readable */
    /* Optional (NULL: not kept): per page, the lowest and highest bin whose list needed it
     * (lo starts at 255, hi at 0): a stop may then copy the pages of some bins alone. */
    unsigned char *lo, *hi;
} Seg;

enum { NOT_COPIED = 0, COPIED = 1, ASKED = 2, NOT_IN_RAM = 3, STALE = 4, ASKED_STALE = 5,
       STALE_GONE = 6 };

/* What a list is: a bin's circular list (ends back at its head), or a fastbin (ends at NULL;
 * its fd pointers stored as they are, or safe-linked as glibc >= 2.32 stores them). */
enum { CIRCULAR = 0, FASTBIN = 1, FASTBIN_SAFE_LINKED = 2 };

typedef struct {
    uint64_t head, chunk, count, previous;
    /* Brent's cycle check: a list read from pages copied at different moments (the target
     * runs) can close a loop that misses its head; followed until ``limit`` chunks, such a
     * loop through copied pages alone spins for as many steps as the heaps hold chunks (1.6
     * GiB of heaps: 50 million, a second) without reading anything. ``mark`` is a chunk
     * passed, seen again within 2 x (the loop's start + its length) steps. */
    uint64_t mark, power, steps;
    int kind, done, inconsistent;
    int bin; /* the bin the list is (0..127, 0: a fastbin), tagged on its pages; -1: none */
    /* The pages the list waited for (its headers' first pages, each counted once in a row),
     * and of those the ones next to the one before in the same segment: a list in address
     * order (either way: chunks freed in address order lie on the unsorted bin in reverse)
     * walks page after page. */
    uint64_t waited, in_order, last_index;
    const void *last_seg;
} List;

typedef struct {
    Seg *seg;
    uint64_t index;
    int pin; /* read pinned (read_wants decides) */
} Want;

static double monotonic_seconds(void) {
    struct timespec now;
    clock_gettime(CLOCK_MONOTONIC, &now);
    return (double)now.tv_sec + (double)now.tv_nsec * 1e-9;
}

static uint64_t word_at(const unsigned char *base, uint64_t offset) {
    uint64_t value;
    memcpy(&value, base + offset, sizeof value);
    return value;
}

static Seg *find_seg(Seg *segs, Py_ssize_t count, uint64_t address) {
    Py_ssize_t low = 0, high = count;
    while (low < high) {
        Py_ssize_t middle = (low + high) / 2;
        if (segs[middle].start <= address)
            low = middle + 1;
        else
            high = middle;
    }
    if (low == 0) return NULL;
    Seg *seg = &segs[low - 1];
    return seg->length >= HEADER_BYTES && address - seg->start <= seg->length - HEADER_BYTES ? seg
                                                                                         : NULL;
}

/* Page ``index`` may be asked for: in RAM per the caller's flags; with a pagemap fd, whether
 * it is in RAM is read by the reader as it is about to read it (entry_now). */
static int readable(const Seg *seg, uint64_t index) {
    if (index >= seg->pages) return 0;
    if (seg->pagemap_fd >= 0)
        return seg->filled[index] != NOT_IN_RAM && seg->filled[index] != STALE_GONE;
    return index < seg->known && seg->readable[index];
}

/* The pagemap entry of page ``index`` of ``seg`` now, 0 where it cannot be read (one entry
 * read: the pages a list leads to lie anywhere in the heap, so a wider window is seldom used
 * again). */
static uint64_t entry_now(const Seg *seg, uint64_t index) {
    uint64_t entry = 0;
    size_t got = pagemap_read(seg->pagemap_fd, &entry, 1, seg->start / seg->page_bytes + index);
    return got ? entry : 0;
}

/* Page ``index`` of ``seg`` is needed by the list of bin ``bin``: 1 when it is there to read
 * now, 0 when it was asked for (queued in wants, at most max_wants), -1 when it can never be
 * read (not in RAM). The page's bin tags (where kept) take the bin in. */
static int need(Seg *seg, uint64_t index, int bin, Want *wants, size_t *nwants,
                size_t max_wants) {
    if (seg->lo != NULL && bin >= 0 && index < seg->pages) {
        if (seg->lo[index] > bin) seg->lo[index] = (unsigned char)bin;
        if (seg->hi[index] < bin) seg->hi[index] = (unsigned char)bin;
    }
    if (index < seg->pages && seg->filled[index] == COPIED) return 1; /* nothing to ask */
    if (!readable(seg, index)) return -1;
    unsigned char *flag = &seg->filled[index];
    if ((*flag == NOT_COPIED || *flag == STALE) && *nwants < max_wants) {
        *flag = *flag == STALE ? ASKED_STALE : ASKED;
        wants[(*nwants)++] = (Want){seg, index, 0};
    }
    return 0;
}

/* Advance one list through the pages copied; stop at the first page it needs (asked for). */
static void advance(List *list, Seg *segs, Py_ssize_t nsegs, uint64_t limit, uint64_t page,
                    Want *wants, size_t *nwants, size_t max_wants) {
    while (!list->done) {
        uint64_t chunk = list->chunk;
        Seg *seg = (chunk & ALIGN_MASK) ? NULL : find_seg(segs, nsegs, chunk);
        if (seg == NULL) {
            list->done = 1;
            return;
        }
        uint64_t offset = chunk - seg->start;
        uint64_t header = list->kind == CIRCULAR && list->bin >= FIRST_LARGE_BIN &&
                                  seg->length - offset >= LARGE_HEADER_BYTES
                              ? LARGE_HEADER_BYTES
                              : HEADER_BYTES;
        uint64_t first = offset / page, last = (offset + header - 1) / page;
        int here = need(seg, first, list->bin, wants, nwants, max_wants);
        if (last != first && here >= 0) {
            int other = need(seg, last, list->bin, wants, nwants, max_wants);
            here = other < 0 ? -1 : (here && other);
        }
        if (here <= 0) {
            list->done = here < 0;
            if (here == 0 && !(list->last_seg == seg && list->last_index == first)) {
                list->waited++;
                list->in_order += list->last_seg == seg &&
                                  (first == list->last_index + 1 || first + 1 == list->last_index);
                list->last_seg = seg;
                list->last_index = first;
            }
            return;
        }
        uint64_t size = word_at(seg->base, offset + 8) & ~(uint64_t)7;
        if (size < MINSIZE || size > seg->length - offset) {
            list->done = 1;
            return;
        }
        uint64_t foot = offset + size;
        if (list->kind == CIRCULAR && foot + 8 <= seg->length) {
            int at = need(seg, foot / page, list->bin, wants, nwants, max_wants);
            if (at == 0) return;
        }
        /* glibc's own check of a bin's list (bk of each chunk names the one before): noted,
         * not acted on (the target runs: a list caught moving fails it too). */
        if (list->kind == CIRCULAR && word_at(seg->base, offset + 24) != list->previous)
            list->inconsistent = 1;
        uint64_t next = word_at(seg->base, offset + 16);
        if (list->kind == FASTBIN_SAFE_LINKED) next ^= (chunk + 16) >> 12;
        if (++list->count > limit || next == list->head || next == 0) {
            list->done = 1;
            return;
        }
        if (next == list->mark) { /* a loop that misses the head: the stop's walk decides */
            list->done = 1;
            if (list->kind == CIRCULAR) list->inconsistent = 1;
            return;
        }
        if (++list->steps == list->power) {
            list->mark = next;
            list->power <<= 1;
            list->steps = 0;
        }
        list->previous = chunk;
        list->chunk = next;
    }
}

/* Read the pages asked for into their buffers, flagged COPIED (a page that cannot be read, one
 * unmapped meanwhile, is zeros), or NOT_IN_RAM and not read where the segment's pagemap says
 * so now: the pages read. held_pid (0: none): every thread of the target is held still, so
 * the pages whose pagemap entry, read now, says the target alone maps them are read pinned in
 * one process_vm_readv (_procmem_read.h); the others with pread. Each buffer page is faulted
 * in before the read (a write of its own byte back, its bytes unchanged): a page first written
 * inside the read's copy to user space costs its fault several times what a plain write fault
 * does, and a list followed page by page (in a stop, one that moved since the scout) pays it
 * once a page. */
static size_t read_wants(int fd, pid_t held_pid, Want *wants, size_t nwants, uint64_t page) {
    size_t kept = 0;
    for (size_t i = 0; i < nwants; i++) {
        Seg *seg = wants[i].seg;
        uint64_t entry = seg->pagemap_fd >= 0 ? entry_now(seg, wants[i].index) : 0;
        if (seg->pagemap_fd >= 0 && !(entry & PM_PRESENT)) {
            unsigned char *flag = &seg->filled[wants[i].index];
            *flag = *flag == ASKED_STALE ? STALE_GONE : NOT_IN_RAM;
            continue;
        }
        wants[i].pin = held_pid > 0 && pinnable(entry);
        wants[kept++] = wants[i];
    }
    nwants = kept;
    for (size_t i = 0; i < nwants; i++)
        __atomic_fetch_or(wants[i].seg->base + wants[i].index * page, 0, __ATOMIC_RELAXED);
    Pinned pinned = {.pid = held_pid, .fd = fd, .complete = 1};
    for (size_t i = 0; i < nwants; i++) {
        Seg *seg = wants[i].seg;
        uint64_t index = wants[i].index;
        uint64_t length = (index + 1) * page <= seg->length ? page : seg->length - index * page;
        unsigned char *buf = seg->base + index * page;
        if (wants[i].pin)
            pinned_read(&pinned, buf, seg->start + index * page, length);
        else
            pread_fill(fd, buf, length, seg->start + index * page);
        seg->filled[index] = COPIED;
    }
    pinned_flush(&pinned);
    return nwants;
}

/* The pages asked for in a round that is not read: as they were before it. */
static void unask(Want *wants, size_t nwants) {
    for (size_t i = 0; i < nwants; i++) {
        unsigned char *flag = &wants[i].seg->filled[wants[i].index];
        *flag = *flag == ASKED_STALE ? COPIED : NOT_COPIED;
    }
}

typedef struct {
    int fd;
    pid_t held_pid;
    Want *wants;
    size_t nwants, read;
    uint64_t page;
} Reads;

/* The second reader of one scout call: started at its first big round and kept until the
 * call ends, each later round handed over under ``lock`` (a thread started a round cost ~40
 * us here, and a busy arena's stop follows its moved lists in ~20 rounds). ``job`` belongs to
 * the helper from ``busy`` set until ``busy`` is cleared. */
typedef struct {
    pthread_t thread;
    pthread_mutex_t lock;
    pthread_cond_t changed;
    int running, busy, quit;
    Reads job;
} Helper;

static void *helper_loop(void *arg) {
    Helper *helper = arg;
    pthread_mutex_lock(&helper->lock);
    for (;;) {
        while (!helper->busy && !helper->quit) pthread_cond_wait(&helper->changed, &helper->lock);
        if (helper->quit) break;
        pthread_mutex_unlock(&helper->lock);
        Reads *job = &helper->job;
        job->read = read_wants(job->fd, job->held_pid, job->wants, job->nwants, job->page);
        pthread_mutex_lock(&helper->lock);
        helper->busy = 0;
        pthread_cond_broadcast(&helper->changed);
    }
    pthread_mutex_unlock(&helper->lock);
    return NULL;
}

/* The helper running (started now where it is not yet): 0 where a thread cannot be had. */
static int helper_ready(Helper *helper) {
    if (helper->running) return 1;
    if (pthread_mutex_init(&helper->lock, NULL) != 0) return 0;
    if (pthread_cond_init(&helper->changed, NULL) != 0) {
        pthread_mutex_destroy(&helper->lock);
        return 0;
    }
    helper->busy = helper->quit = 0;
    if (pthread_create(&helper->thread, NULL, helper_loop, helper) != 0) {
        pthread_cond_destroy(&helper->changed);
        pthread_mutex_destroy(&helper->lock);
        return 0;
    }
    helper->running = 1;
    return 1;
}

/* The helper ended and joined (nothing where it never started). */
static void helper_end(Helper *helper) {
    if (!helper->running) return;
    pthread_mutex_lock(&helper->lock);
    helper->quit = 1;
    pthread_cond_broadcast(&helper->changed);
    pthread_mutex_unlock(&helper->lock);
    pthread_join(helper->thread, NULL);
    pthread_cond_destroy(&helper->changed);
    pthread_mutex_destroy(&helper->lock);
    helper->running = 0;
}

/* read_wants, its second half read by the helper when threads >= 2 and the round is big: a
 * remote page costs the kernel microseconds to look up and map whatever the bytes read, so
 * two readers read a round in about 0.6 of one's time. The wants name distinct pages (need()
 * asks for a page once a round), so the two halves fill distinct bytes and flags. */
static size_t read_round(Helper *helper, int fd, pid_t held_pid, Want *wants, size_t nwants,
                         uint64_t page, int threads) {
    size_t half = nwants / 2;
    if (threads < 2 || nwants < SPLIT_MIN_WANTS || !helper_ready(helper))
        return read_wants(fd, held_pid, wants, nwants, page);
    pthread_mutex_lock(&helper->lock);
    helper->job = (Reads){.fd = fd, .held_pid = held_pid, .wants = wants + half,
                          .nwants = nwants - half, .page = page};
    helper->busy = 1;
    pthread_cond_broadcast(&helper->changed);
    pthread_mutex_unlock(&helper->lock);
    size_t read = read_wants(fd, held_pid, wants, half, page);
    pthread_mutex_lock(&helper->lock);
    while (helper->busy) pthread_cond_wait(&helper->changed, &helper->lock);
    read += helper->job.read;
    pthread_mutex_unlock(&helper->lock);
    return read;
}

/* A list has waited for more than ``ordered_max`` pages, 9 of 10 next to the one before. */
static int long_in_order(const List *lists, Py_ssize_t nlists, uint64_t ordered_max) {
    for (Py_ssize_t i = 0; i < nlists; i++)
        if (lists[i].waited > ordered_max && lists[i].in_order * 10 >= lists[i].waited * 9)
            return 1;
    return 0;
}

/* scout(fd, segments, lists, page, deadline, max_pages[, pagemap_fd[, threads[, held_pid
 *       [, fresh[, ordered_max]]]]])
 *     -> (status, pages, inconsistent, steps)
 * fd: the target's /proc/PID/mem.
 * segments: sorted, not overlapping (buffer, start, readable, filled[, lo, hi]): a writable
 * buffer as long as the heap, its pagemap's readable flags (one byte per page), a writable
 * bytearray of one flag per page (1 = copied; the caller's earlier reads count) and,
 * optionally, two writable bytearrays of one byte per page (lo at 255, hi at 0 where no list
 * has been there) in which each page needed by a list gets the lowest and highest bin of
 * those lists. lists: (head, first, kind[, bin]) of each list: a bin's circular list (0: head
 * is the bin, first its fd; the word after each chunk is read too, where glibc repeats its
 * size), a fastbin (1: head 0, first the fastbin's pointer), or a fastbin followed as
 * safe-linked (2); bin (0..127, the fastbins 0) is what tags its pages. status: 0 every list
 * followed to its end (or to where it cannot be read), 1 more than max_pages pages would be
 * read, 2 time.monotonic() passed deadline, 3 a list in address order (9 of 10 of the pages it
 * waited for next to the one before) waited for more than ordered_max pages (0: never
 * ends the scout): a relay reads such a list in blocks, and its pages are more than a
 * stop copies. pages: pages read. inconsistent: the bins' lists
 * in which a chunk's bk did not name the chunk before it, or that looped without their head
 * (as far as followed). steps: the chunks the lists advanced by (a loop costs at most twice
 * its start and length, List's mark says why). pagemap_fd (the target's
 * /proc/PID/pagemap; -1: none): the readable flags are older than the scout (a residency
 * read before an earlier scout), so whether each page it would read is in RAM is read from
 * the pagemap now instead (segments page-aligned): a page that left RAM since is never read,
 * and one that came since is. threads: 2 lets a big round's pages be read by two threads
 * (the same bytes; only the time differs). held_pid (0: none): the caller holds every thread
 * of that process, the target, still: with pagemap_fd, the pages it alone maps are read
 * pinned (read_wants). fresh (needs pagemap_fd): the pages flagged copied on entry are read
 * again where a list leads through them (once each), not trusted: a catch-up of lists that
 * moved since those pages were copied; they stay flagged whether read again or not.
 * ordered_max: see status 3. */
static PyObject *scout(PyObject *self, PyObject *args) {
    (void)self;
    int fd, pagemap_fd = -1, threads = 1, held_pid = 0, fresh = 0;
    PyObject *seg_items, *list_items;
    unsigned long long page, max_pages, ordered_max = 0;
    double deadline;
    if (!PyArg_ParseTuple(args, "iOOKdK|iiipK", &fd, &seg_items, &list_items, &page, &deadline,
                          &max_pages, &pagemap_fd, &threads, &held_pid, &fresh, &ordered_max))
        return NULL;
    if (fresh && pagemap_fd < 0) {
        PyErr_SetString(PyExc_ValueError, "a fresh scout reads the pagemap as it goes");
        return NULL;
    }
    if (page == 0 || (page & (page - 1))) {
        PyErr_SetString(PyExc_ValueError, "page must be a power of two");
        return NULL;
    }
    PyObject *segs_seq = PySequence_Fast(seg_items, "segments must be a sequence");
    if (segs_seq == NULL) return NULL;
    PyObject *lists_seq = PySequence_Fast(list_items, "lists must be a sequence");
    if (lists_seq == NULL) {
        Py_DECREF(segs_seq);
        return NULL;
    }
    Py_ssize_t nsegs = PySequence_Fast_GET_SIZE(segs_seq);
    Py_ssize_t nlists = PySequence_Fast_GET_SIZE(lists_seq);
    PyObject *result = NULL;
    Seg *segs = NULL;
    List *lists = NULL;
    Want *wants = NULL;
    Py_buffer *views = NULL;
    Py_ssize_t held = 0;
    if (nsegs > MAX_SEGMENTS) {
        PyErr_SetString(PyExc_ValueError, "too many segments");
        goto out;
    }
    segs = PyMem_Calloc((size_t)nsegs + 1, sizeof(Seg));
    lists = PyMem_Calloc((size_t)nlists + 1, sizeof(List));
    /* Each list asks for at most three pages a round (a header across two, and a foot). */
    wants = PyMem_Calloc(3 * (size_t)nlists + 1, sizeof(Want));
    views = PyMem_Calloc(5 * (size_t)nsegs + 1, sizeof(Py_buffer));
    if (!segs || !lists || !wants || !views) {
        PyErr_NoMemory();
        goto out;
    }
    uint64_t limit = 0;
    for (Py_ssize_t i = 0; i < nsegs; i++) {
        PyObject *buffer, *flags, *filled, *lo_tags = NULL, *hi_tags = NULL;
        unsigned long long start;
        if (!PyArg_ParseTuple(PySequence_Fast_GET_ITEM(segs_seq, i), "OKOO|OO", &buffer, &start,
                              &flags, &filled, &lo_tags, &hi_tags))
            goto out;
        if ((lo_tags == NULL) != (hi_tags == NULL)) {
            PyErr_SetString(PyExc_ValueError, "bin tags come as a pair (lo, hi)");
            goto out;
        }
        if (PyObject_GetBuffer(buffer, &views[held], PyBUF_WRITABLE) < 0) goto out;
        Py_buffer *data = &views[held++];
        if (PyObject_GetBuffer(flags, &views[held], PyBUF_SIMPLE) < 0) goto out;
        Py_buffer *can = &views[held++];
        if (PyObject_GetBuffer(filled, &views[held], PyBUF_WRITABLE) < 0) goto out;
        Py_buffer *got = &views[held++];
        uint64_t pages = ((uint64_t)data->len + page - 1) / page;
        if ((uint64_t)got->len < pages) {
            PyErr_SetString(PyExc_ValueError, "filled needs one flag per page");
            goto out;
        }
        if (i > 0 && start < segs[i - 1].start + segs[i - 1].length) {
            PyErr_SetString(PyExc_ValueError, "segments overlap or are not sorted");
            goto out;
        }
        if (pagemap_fd >= 0 && start % page) {
            PyErr_SetString(PyExc_ValueError, "segments must be page-aligned to read the pagemap");
            goto out;
        }
        segs[i] = (Seg){.base = data->buf, .start = start, .length = (uint64_t)data->len,
                        .pages = pages, .page_bytes = page, .readable = can->buf,
                        .known = (uint64_t)can->len, .filled = got->buf,
                        .pagemap_fd = pagemap_fd};
        if (lo_tags != NULL) {
            if (PyObject_GetBuffer(lo_tags, &views[held], PyBUF_WRITABLE) < 0) goto out;
            Py_buffer *lo = &views[held++];
            if (PyObject_GetBuffer(hi_tags, &views[held], PyBUF_WRITABLE) < 0) goto out;
            Py_buffer *hi = &views[held++];
            if ((uint64_t)lo->len < pages || (uint64_t)hi->len < pages) {
                PyErr_SetString(PyExc_ValueError, "bin tags need one byte per page");
                goto out;
            }
            segs[i].lo = lo->buf;
            segs[i].hi = hi->buf;
        }
        limit += (uint64_t)data->len / MINSIZE;
    }
    for (Py_ssize_t i = 0; i < nlists; i++) {
        unsigned long long head, first;
        int kind, bin = -1;
        if (!PyArg_ParseTuple(PySequence_Fast_GET_ITEM(lists_seq, i), "KKi|i", &head, &first,
                              &kind, &bin))
            goto out;
        if (bin > 127) {
            PyErr_SetString(PyExc_ValueError, "a bin is 0..127");
            goto out;
        }
        lists[i] = (List){.head = head, .chunk = first, .previous = head, .mark = first,
                          .power = 1, .kind = kind, .done = first == head || first == 0,
                          .bin = bin};
    }
    for (Py_ssize_t i = 0; fresh && i < nsegs; i++)
        for (uint64_t index = 0; index < segs[i].pages; index++)
            if (segs[i].filled[index] == COPIED) segs[i].filled[index] = STALE;
    int status = 0;
    unsigned long long read_pages = 0;
    Helper helper = {.running = 0};
    Py_BEGIN_ALLOW_THREADS
    for (;;) {
        size_t nwants = 0;
        for (Py_ssize_t i = 0; i < nlists; i++)
            advance(&lists[i], segs, nsegs, limit, page, wants, &nwants, 3 * (size_t)nlists);
        if (nwants == 0) break;
        if (read_pages + nwants > max_pages) {
            status = 1;
            unask(wants, nwants);
            break;
        }
        if (ordered_max && long_in_order(lists, nlists, ordered_max)) {
            status = 3;
            unask(wants, nwants);
            break;
        }
        if (monotonic_seconds() > deadline) {
            status = 2;
            unask(wants, nwants);
            break;
        }
        read_pages += read_round(&helper, fd, held_pid, wants, nwants, page, threads);
    }
    helper_end(&helper);
    for (Py_ssize_t i = 0; pagemap_fd >= 0 && i < nsegs; i++) /* the caller knows 0 and 1 */
        for (uint64_t index = 0; index < segs[i].pages; index++) {
            unsigned char *flag = &segs[i].filled[index];
            if (*flag == NOT_IN_RAM) *flag = NOT_COPIED;
            else if (*flag == STALE || *flag == STALE_GONE) *flag = COPIED;
        }
    Py_END_ALLOW_THREADS
    Py_ssize_t inconsistent = 0;
    unsigned long long steps = 0;
    for (Py_ssize_t i = 0; i < nlists; i++) {
        inconsistent += lists[i].inconsistent;
        steps += lists[i].count;
    }
    result = Py_BuildValue("(iKnK)", status, read_pages, inconsistent, steps);
out:
    for (Py_ssize_t i = 0; i < held; i++) PyBuffer_Release(&views[i]);
    PyMem_Free(views);
    PyMem_Free(wants);
    PyMem_Free(lists);
    PyMem_Free(segs);
    Py_DECREF(lists_seq);
    Py_DECREF(segs_seq);
    return result;
}

/* zero(buffer, flags, page) -> None: zeros on every page of buffer whose flag (one byte per
 * page) is not 0: a scouted copy made ready for another stop's pages (the Python loop over
 * runs of pages is its fallback). */
static PyObject *zero(PyObject *self, PyObject *args) {
    (void)self;
    Py_buffer data, flags;
    unsigned long long page;
    if (!PyArg_ParseTuple(args, "w*y*K", &data, &flags, &page)) return NULL;
    if (page == 0) {
        PyBuffer_Release(&data);
        PyBuffer_Release(&flags);
        PyErr_SetString(PyExc_ValueError, "page must be positive");
        return NULL;
    }
    unsigned char *base = data.buf;
    const unsigned char *flag = flags.buf;
    uint64_t length = (uint64_t)data.len;
    Py_BEGIN_ALLOW_THREADS
    for (Py_ssize_t i = 0; i < flags.len && (uint64_t)i * page < length; i++) {
        if (!flag[i]) continue;
        uint64_t from = (uint64_t)i * page, to = from + page < length ? from + page : length;
        memset(base + from, 0, to - from);
    }
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&data);
    PyBuffer_Release(&flags);
    Py_RETURN_NONE;
}

static PyMethodDef methods[] = {
    {"zero", zero, METH_VARARGS, "Zeros on the pages of a buffer flagged in a byte string."},
    {"scout", scout, METH_VARARGS,
     "Learn the pages an arena's circular free lists lie on, copying them: "
     "(status, pages read, lists failing glibc's bk check)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_listscout", NULL, -1, methods};

PyMODINIT_FUNC PyInit__listscout(void) { return PyModule_Create(&module); }
