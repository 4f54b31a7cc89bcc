/* The common case of heap_window.HeapWalk.walk_window in C (optional: the Python loop is the
 * fallback, and the tests compare the two): walk the chunk headers of one window copy from
 * `at`, recording each chunk whose next header lies in the window, with its state, and stop
 * at the first chunk the Python code must look at itself. Nothing is allocated from a value
 * read from the target: the output arrays are the caller's, their capacity bounds the loop.
 *
 * headers(window, base, at, high, last_header, limit, top_at, skip_until,
 *         fast, keys, addresses, sizes, states) -> (at, count, stop)
 *   window       the copy (a buffer of bytes; `base` is its first byte's address)
 *   high         walk headers below this address
 *   last_header  a chunk whose next header lies above this is left to the caller (pending)
 *   limit        the heap's end; top_at the top chunk's address (or -1 as 2**64-1)
 *   skip_until   chunks ending at or below this are walked, not recorded (a walk gone back)
 *   fast         a set of the arena's fastbin chunk addresses, or None
 *   keys         a tuple of tcache keys (a chunk up to 0x410 bytes whose second data word
 *                is one is in a tcache)
 *   addresses, sizes  writable buffers of uint64, states a writable buffer of bytes
 * stop: 0 the window's headers are done (at >= high), 1 a rare chunk at `at` (the top, a
 * fencepost, a header that fails: the caller decides), 2 the chunk at `at` ends past
 * last_header (pending), 3 the output is full. States: 0 LIVE, 1 FREE, 2 FAST, 3 TCACHE,
 * 255 a tcache_perthread_struct candidate (0x250 or 0x290 bytes) the caller checks. */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

#define MAX_KEYS 8

static PyObject *headers(PyObject *self, PyObject *args) {
    Py_buffer window, out_addresses, out_sizes, out_states;
    unsigned long long base, at, high, last_header, limit, top_at, skip_until;
    PyObject *fast, *keys;
    (void)self;
    if (!PyArg_ParseTuple(args, "y*KKKKKKKOOw*w*w*", &window, &base, &at, &high, &last_header,
                          &limit, &top_at, &skip_until, &fast, &keys, &out_addresses,
                          &out_sizes, &out_states))
        return NULL;
    PyObject *result = NULL;
    uint64_t key_values[MAX_KEYS];
    Py_ssize_t key_count = 0;
    if (!PyTuple_Check(keys) || (fast != Py_None && !PyAnySet_Check(fast))) {
        PyErr_SetString(PyExc_TypeError, "keys must be a tuple, fast a set or None");
        goto done;
    }
    key_count = PyTuple_GET_SIZE(keys);
    if (key_count > MAX_KEYS) key_count = MAX_KEYS;
    for (Py_ssize_t i = 0; i < key_count; i++) {
        key_values[i] = PyLong_AsUnsignedLongLongMask(PyTuple_GET_ITEM(keys, i));
    }
    const unsigned char *bytes = window.buf;
    uint64_t length = (uint64_t)window.len;
    uint64_t *addresses = out_addresses.buf;
    uint64_t *sizes = out_sizes.buf;
    unsigned char *states = out_states.buf;
    Py_ssize_t capacity = out_addresses.len / 8;
    if (out_sizes.len / 8 < capacity) capacity = out_sizes.len / 8;
    if (out_states.len < capacity) capacity = out_states.len;
    Py_ssize_t count = 0;
    int stop = 0;
    int has_fast = fast != Py_None && PySet_GET_SIZE(fast) > 0;
    /* Every header read lies inside the window: at + 16 <= base + length. */
    if (length < 64) goto finish;
    if (high > base + length - 15) high = base + length - 15;
    while (at < high) {
        if (count >= capacity) {
            stop = 3;
            break;
        }
        uint64_t offset = at - base;
        uint64_t size;
        memcpy(&size, bytes + offset + 8, 8);
        size &= ~(uint64_t)7;
        uint64_t following = at + size;
        if (size < 32 || (size & 15) || following > limit || following < at || at == top_at) {
            stop = 1;
            break;
        }
        if (following <= skip_until) {
            at = following;
            continue;
        }
        if (following > last_header) {
            stop = 2;
            break;
        }
        uint64_t next_field;
        memcpy(&next_field, bytes + (following - base) + 8, 8);
        unsigned char state = 0;
        if (!(next_field & 1)) {
            state = 1;
        } else {
            if (has_fast) {
                PyObject *boxed = PyLong_FromUnsignedLongLong(at);
                if (boxed == NULL) goto done;
                int found = PySet_Contains(fast, boxed);
                Py_DECREF(boxed);
                if (found < 0) goto done;
                if (found) state = 2;
            }
            if (state == 0 && size <= 0x410 && key_count && offset + 32 <= length) {
                uint64_t second;
                memcpy(&second, bytes + offset + 24, 8);
                for (Py_ssize_t i = 0; i < key_count; i++) {
                    if (second == key_values[i]) {
                        state = 3;
                        break;
                    }
                }
            }
            if (state == 0 && (size == 0x250 || size == 0x290)) state = 255;
        }
        addresses[count] = at;
        sizes[count] = size;
        states[count] = state;
        count++;
        at = following;
    }
finish:
    result = Py_BuildValue("(Kni)", at, count, stop);
done:
    PyBuffer_Release(&window);
    PyBuffer_Release(&out_addresses);
    PyBuffer_Release(&out_sizes);
    PyBuffer_Release(&out_states);
    return result;
}

/* first_words(window, base, addresses, out) -> None: out[i] = the first data word (at
 * address + 16) of chunk i, 0 where it lies outside the window. */
static PyObject *first_words(PyObject *self, PyObject *args) {
    Py_buffer window, in_addresses, out_words;
    unsigned long long base;
    (void)self;
    if (!PyArg_ParseTuple(args, "y*Ky*w*", &window, &base, &in_addresses, &out_words))
        return NULL;
    const uint64_t *addresses = in_addresses.buf;
    uint64_t *words = out_words.buf;
    Py_ssize_t count = in_addresses.len / 8;
    if (out_words.len / 8 < count) count = out_words.len / 8;
    const unsigned char *bytes = window.buf;
    uint64_t length = (uint64_t)window.len;
    for (Py_ssize_t i = 0; i < count; i++) {
        uint64_t offset = addresses[i] + 16 - base;
        uint64_t word = 0;
        if (addresses[i] + 16 >= base && offset + 8 <= length) memcpy(&word, bytes + offset, 8);
        words[i] = word;
    }
    PyBuffer_Release(&window);
    PyBuffer_Release(&in_addresses);
    PyBuffer_Release(&out_words);
    Py_RETURN_NONE;
}

/* splitmix64's finaliser (list_proof._mixed: the two must agree bit for bit). */
static uint64_t mixed(uint64_t x) {
    x ^= x >> 30;
    x *= 0xBF58476D1CE4E5B9ULL;
    x ^= x >> 27;
    x *= 0x94D049BB133111EBULL;
    return x ^ (x >> 31);
}

/* The stretch of address v (list_proof._Sums.stretch): heaps [starts[i], ends[i]), sorted. */
static int64_t stretch_of(uint64_t v, const uint64_t *starts, const uint64_t *ends,
                          const int64_t *firsts, Py_ssize_t heaps, int shift, int64_t outside) {
    Py_ssize_t low = 0, high = heaps;
    while (low < high) {
        Py_ssize_t middle = (low + high) / 2;
        if (starts[middle] <= v) low = middle + 1; else high = middle;
    }
    if (low == 0 || v >= ends[low - 1]) return outside;
    return firsts[low - 1] + (int64_t)((v - starts[low - 1]) >> shift);
}

/* link_sums(window, base, addresses, states, free_state, starts, ends, firsts, shift,
 *           k0, k1, left, right) -> skipped
 * For each chunk of `addresses` whose state is free_state and whose fd and bk lie in the
 * window copy: left[stretch(at)] += mixed(mixed(at ^ k0) + (fd ^ k1)), right[stretch(bk)] +=
 * mixed(mixed(bk ^ k0) + (at ^ k1)) (mod 2**64; stretches as list_proof._Sums). skipped: the
 * free chunks whose links lie past the copy (the caller reads them). Indexes are bounded by
 * the arrays' lengths, never by a value read from the target. */
static PyObject *link_sums(PyObject *self, PyObject *args) {
    Py_buffer window, in_addresses, in_states, in_starts, in_ends, in_firsts, out_left, out_right;
    unsigned long long base, k0, k1;
    int free_state, shift;
    (void)self;
    if (!PyArg_ParseTuple(args, "y*Ky*y*iy*y*y*iKKw*w*", &window, &base, &in_addresses,
                          &in_states, &free_state, &in_starts, &in_ends, &in_firsts, &shift,
                          &k0, &k1, &out_left, &out_right))
        return NULL;
    const uint64_t *addresses = in_addresses.buf, *starts = in_starts.buf, *ends = in_ends.buf;
    const unsigned char *states = in_states.buf, *bytes = window.buf;
    const int64_t *firsts = in_firsts.buf;
    uint64_t *left = out_left.buf, *right = out_right.buf;
    Py_ssize_t count = in_addresses.len / 8, heaps = in_starts.len / 8;
    Py_ssize_t sums = out_left.len / 8;
    if (in_states.len < count) count = in_states.len;
    if (in_ends.len / 8 < heaps) heaps = in_ends.len / 8;
    if (in_firsts.len / 8 < heaps) heaps = in_firsts.len / 8;
    if (out_right.len / 8 < sums) sums = out_right.len / 8;
    int64_t outside = (int64_t)sums - 1;
    uint64_t length = (uint64_t)window.len;
    long skipped = 0;
    for (Py_ssize_t i = 0; i < count; i++) {
        if (states[i] != free_state) continue;
        uint64_t at = addresses[i], offset = at - base, fd, bk;
        if (at < base || offset + 32 > length) {
            skipped++;
            continue;
        }
        memcpy(&fd, bytes + offset + 16, 8);
        memcpy(&bk, bytes + offset + 24, 8);
        int64_t here = stretch_of(at, starts, ends, firsts, heaps, shift, outside);
        int64_t back = stretch_of(bk, starts, ends, firsts, heaps, shift, outside);
        if (here < 0 || here > outside) here = outside;
        if (back < 0 || back > outside) back = outside;
        left[here] += mixed(mixed(at ^ k0) + (fd ^ k1));
        right[back] += mixed(mixed(bk ^ k0) + (at ^ k1));
    }
    PyBuffer_Release(&window);
    PyBuffer_Release(&in_addresses);
    PyBuffer_Release(&in_states);
    PyBuffer_Release(&in_starts);
    PyBuffer_Release(&in_ends);
    PyBuffer_Release(&in_firsts);
    PyBuffer_Release(&out_left);
    PyBuffer_Release(&out_right);
    return PyLong_FromLong(skipped);
}

/* chunk_index(at, values, out) -> None: out[i] = the j with at[j] == values[i], -1 where
 * none (list_sweep._count's node lookup). ``at`` is sorted ascending (the sweep's free
 * chunks, walked in address order). A table of buckets over [at[0], at[n-1]], about one
 * chunk a bucket (4 bytes each, ours, sized by n, never by a value read), gives each value
 * the few entries of ``at`` to look at; the values are taken in batches whose table entries,
 * then whose entries of ``at``, are prefetched before they are read (a random lookup in a
 * sorted array of millions is a cache miss at every level otherwise). */
#define INDEX_BATCH 64
static PyObject *chunk_index(PyObject *self, PyObject *args) {
    Py_buffer in_at, in_values, out_index;
    (void)self;
    if (!PyArg_ParseTuple(args, "y*y*w*", &in_at, &in_values, &out_index)) return NULL;
    const uint64_t *at = in_at.buf, *values = in_values.buf;
    int32_t *out = out_index.buf;
    Py_ssize_t n = in_at.len / 8, m = in_values.len / 8;
    if (out_index.len / 4 < m) m = out_index.len / 4;
    PyObject *result = NULL;
    uint32_t *first = NULL;
    if (n == 0 || n > INT32_MAX) {
        for (Py_ssize_t i = 0; i < m; i++) out[i] = -1;
        result = Py_None;
        Py_INCREF(result);
        goto done;
    }
    uint64_t low = at[0], span = at[n - 1] - low;
    int shift = 0;
    while (shift < 63 && (span >> shift) >= (uint64_t)n) shift++;
    uint64_t buckets = (span >> shift) + 1; /* <= n + 1 */
    first = PyMem_Malloc((size_t)(buckets + 1) * sizeof *first);
    if (first == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    Py_BEGIN_ALLOW_THREADS
    /* first[b]: the index of the first chunk at or past bucket b's start. */
    Py_ssize_t j = 0;
    for (uint64_t b = 0; b < buckets; b++) {
        uint64_t start = low + (b << shift);
        while (j < n && at[j] < start) j++;
        first[b] = (uint32_t)j;
    }
    first[buckets] = (uint32_t)n;
    uint64_t bucket_of[INDEX_BATCH];
    for (Py_ssize_t base = 0; base < m; base += INDEX_BATCH) {
        Py_ssize_t count = m - base < INDEX_BATCH ? m - base : INDEX_BATCH;
        for (Py_ssize_t k = 0; k < count; k++) {
            uint64_t v = values[base + k];
            uint64_t b = v >= low && v - low <= span ? (v - low) >> shift : UINT64_MAX;
            bucket_of[k] = b;
            if (b != UINT64_MAX) __builtin_prefetch(&first[b]);
        }
        for (Py_ssize_t k = 0; k < count; k++) {
            if (bucket_of[k] != UINT64_MAX) __builtin_prefetch(&at[first[bucket_of[k]]]);
        }
        for (Py_ssize_t k = 0; k < count; k++) {
            uint64_t b = bucket_of[k], v = values[base + k];
            int32_t found = -1;
            if (b != UINT64_MAX) {
                uint32_t lo = first[b], hi = first[b + 1];
                while (lo < hi) { /* (a bucket holds one chunk or a few: binary all the same) */
                    uint32_t middle = lo + (hi - lo) / 2;
                    if (at[middle] < v) lo = middle + 1; else hi = middle;
                }
                if (lo < (uint32_t)n && at[lo] == v) found = (int32_t)lo;
            }
            out[base + k] = found;
        }
    }
    Py_END_ALLOW_THREADS
    result = Py_None;
    Py_INCREF(result);
done:
    PyMem_Free(first);
    PyBuffer_Release(&in_at);
    PyBuffer_Release(&in_values);
    PyBuffer_Release(&out_index);
    return result;
}

/* list_bins(nexts, n, out) -> None: over the nodes 0 … total-1 (``n`` free chunks, then the
 * bin heads) and each node's fd as a node number (nexts, int32; -1: neither), out[i] (int32,
 * i < n) = the bin (1 + the head's number past n) that following fd from chunk i reaches,
 * 0 where it reaches none (a link to no node, or a loop that misses every head):
 * list_sweep._lists' bins. Our memory: one int32 a node, and a few per walker.
 *
 * Following a list is a chain of cache misses (each fd a random place in millions of
 * nodes), and one list may hold them all. So the lists are cut at up to SPLITTERS chunks
 * spread over the index range, and a walker follows each piece at once, round by round,
 * the next node of each prefetched a round ahead: a walker marks the nodes it passes and
 * stops where it meets a head, a node marked by a walker (its own: a loop), or a link to no
 * node. What each piece leads to is then resolved over the walkers alone, and every marked
 * node given its piece's bin. The chunks no walker passed (lists holding no splitter, and
 * chunks leading into a list from outside it) are followed one by one, each walk stopping
 * at the first node whose bin is known. */
#define SPLITTERS 1024
enum { UNSEEN = -1 };
#define MARK(k) ((int32_t)(-(k) - 2)) /* a node passed by walker k (k >= 0) */
#define MARKER(state) ((Py_ssize_t)(-(state) - 2))
static void follow_pieces(const int32_t *nexts, int32_t *state, Py_ssize_t n, Py_ssize_t total) {
    Py_ssize_t walkers = n < SPLITTERS ? n : SPLITTERS;
    if (walkers == 0) return;
    int32_t cursor[SPLITTERS], leads[SPLITTERS], bins[SPLITTERS];
    Py_ssize_t active[SPLITTERS], live = 0;
    /* leads[k] >= 0: the bin piece k reaches (0: none); <= -2: MARK(j), it runs into piece
     * j. */
    for (Py_ssize_t k = 0; k < walkers; k++) {
        Py_ssize_t start = (Py_ssize_t)((int64_t)k * n / walkers);
        state[start] = MARK(k);
        int32_t next = nexts[start];
        cursor[k] = next;
        leads[k] = 0;
        if (next >= 0 && next < total) {
            __builtin_prefetch(&state[next]);
            __builtin_prefetch(&nexts[next]);
            active[live++] = k;
        }
    }
    while (live > 0) {
        Py_ssize_t still = 0;
        for (Py_ssize_t a = 0; a < live; a++) {
            Py_ssize_t k = active[a];
            int32_t v = cursor[k], seen = state[v];
            if (seen >= 0) {
                leads[k] = seen; /* a head's bin, or a node given its bin */
                continue;
            }
            if (seen != UNSEEN) {
                leads[k] = MARKER(seen) == k ? 0 : seen; /* its own mark: a loop, no head */
                continue;
            }
            state[v] = MARK(k);
            int32_t next = nexts[v];
            if (next < 0 || next >= total) continue; /* a link to no node: 0 */
            cursor[k] = next;
            __builtin_prefetch(&state[next]);
            __builtin_prefetch(&nexts[next]);
            active[still++] = k;
        }
        live = still;
    }
    /* Each piece's bin: follow leads from piece to piece (a cycle of pieces: 0). */
    for (Py_ssize_t k = 0; k < walkers; k++) bins[k] = UNSEEN;
    for (Py_ssize_t k = 0; k < walkers; k++) {
        Py_ssize_t j = k, steps = 0;
        while (leads[j] < 0 && bins[j] == UNSEEN && steps++ <= walkers) j = MARKER(leads[j]);
        int32_t bin = bins[j] != UNSEEN ? bins[j] : leads[j] >= 0 ? leads[j] : 0;
        for (j = k, steps = 0; bins[j] == UNSEEN && steps++ <= walkers;) {
            bins[j] = bin;
            if (leads[j] >= 0) break;
            j = MARKER(leads[j]);
        }
    }
    for (Py_ssize_t v = 0; v < n; v++)
        if (state[v] <= -2) state[v] = bins[MARKER(state[v])];
}

static PyObject *list_bins(PyObject *self, PyObject *args) {
    Py_buffer in_nexts, out_bins;
    Py_ssize_t n;
    (void)self;
    if (!PyArg_ParseTuple(args, "y*nw*", &in_nexts, &n, &out_bins)) return NULL;
    const int32_t *nexts = in_nexts.buf;
    int32_t *out = out_bins.buf;
    Py_ssize_t total = in_nexts.len / 4;
    PyObject *result = NULL;
    int32_t *state = NULL;
    if (n < 0 || n > total || total >= INT32_MAX / 2 || out_bins.len / 4 < n) {
        PyErr_SetString(PyExc_ValueError, "list_bins: n, nexts and out do not agree");
        goto done;
    }
    state = PyMem_Malloc((size_t)(total ? total : 1) * sizeof *state);
    if (state == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    Py_BEGIN_ALLOW_THREADS
    /* state: UNSEEN not followed yet; >= 0 its bin (0: none); MARK(i) passed by a walk. */
    for (Py_ssize_t v = 0; v < total; v++) state[v] = v < n ? UNSEEN : (int32_t)(v - n + 1);
    follow_pieces(nexts, state, n, total);
    /* The rest one by one (walker marks reused: MARK(i) of chunk i's own walk). */
    for (Py_ssize_t i = 0; i < n; i++) {
        if (state[i] != UNSEEN) continue;
        int32_t mark = MARK(i), outcome = 0;
        Py_ssize_t v = i;
        for (;;) {
            int32_t seen = state[v];
            if (seen >= 0) {
                outcome = seen;
                break;
            }
            if (seen == mark) break; /* a loop through no head: 0 */
            state[v] = mark;
            int32_t next = nexts[v];
            if (next < 0 || next >= total) break; /* a link to no node: 0 */
            v = next;
        }
        for (v = i; v >= 0 && v < total && state[v] == mark; v = nexts[v]) state[v] = outcome;
    }
    for (Py_ssize_t i = 0; i < n; i++) out[i] = state[i];
    Py_END_ALLOW_THREADS
    result = Py_None;
    Py_INCREF(result);
done:
    PyMem_Free(state);
    PyBuffer_Release(&in_nexts);
    PyBuffer_Release(&out_bins);
    return result;
}

/* free_columns(window, base, addresses, sizes, states, free_state,
 *              at, raw, fd, bk, foot_ok) -> count
 * The sweep's columns (list_sweep._Free) of each chunk whose state is free_state, in order:
 * its address, its size word as stored (flags and all), fd, bk, and whether the word at
 * address + size (the next chunk's prev_size) repeats its size where the window holds that
 * word (1 where it does not). The five outputs hold at least as many entries as there are
 * such chunks (the caller counts them); ValueError where a chunk's first 32 bytes lie outside
 * the window (the walk emits none such). */
static PyObject *free_columns(PyObject *self, PyObject *args) {
    Py_buffer window, in_addresses, in_sizes, in_states, o_at, o_raw, o_fd, o_bk, o_foot;
    unsigned long long base;
    int free_state;
    (void)self;
    if (!PyArg_ParseTuple(args, "y*Ky*y*y*iw*w*w*w*w*", &window, &base, &in_addresses,
                          &in_sizes, &in_states, &free_state, &o_at, &o_raw, &o_fd, &o_bk,
                          &o_foot))
        return NULL;
    const uint64_t *addresses = in_addresses.buf, *sizes = in_sizes.buf;
    const unsigned char *states = in_states.buf, *bytes = window.buf;
    uint64_t *at = o_at.buf, *raw = o_raw.buf, *fd = o_fd.buf, *bk = o_bk.buf;
    unsigned char *foot = o_foot.buf;
    Py_ssize_t count = in_addresses.len / 8, room = o_at.len / 8;
    if (in_sizes.len / 8 < count) count = in_sizes.len / 8;
    if (in_states.len < count) count = in_states.len;
    if (o_raw.len / 8 < room) room = o_raw.len / 8;
    if (o_fd.len / 8 < room) room = o_fd.len / 8;
    if (o_bk.len / 8 < room) room = o_bk.len / 8;
    if (o_foot.len < room) room = o_foot.len;
    uint64_t usable = (uint64_t)window.len / 8 * 8;
    Py_ssize_t kept = 0;
    const char *error = NULL;
    for (Py_ssize_t i = 0; i < count; i++) {
        if (states[i] != free_state) continue;
        uint64_t address = addresses[i], offset = address - base, size = sizes[i];
        if (kept >= room) {
            error = "free_columns: more free chunks than the outputs hold";
            break;
        }
        if (address < base || offset > usable || usable - offset < 32 || (offset & 7)) {
            error = "free_columns: a free chunk outside the window";
            break;
        }
        at[kept] = address;
        memcpy(&raw[kept], bytes + offset + 8, 8);
        memcpy(&fd[kept], bytes + offset + 16, 8);
        memcpy(&bk[kept], bytes + offset + 24, 8);
        uint64_t foot_offset = offset + (size & ~(uint64_t)7), word;
        foot[kept] = 1;
        if (foot_offset >= offset && foot_offset <= usable - 8) {
            memcpy(&word, bytes + foot_offset, 8);
            foot[kept] = word == size;
        }
        kept++;
    }
    PyBuffer_Release(&window);
    PyBuffer_Release(&in_addresses);
    PyBuffer_Release(&in_sizes);
    PyBuffer_Release(&in_states);
    PyBuffer_Release(&o_at);
    PyBuffer_Release(&o_raw);
    PyBuffer_Release(&o_fd);
    PyBuffer_Release(&o_bk);
    PyBuffer_Release(&o_foot);
    if (error != NULL) {
        PyErr_SetString(PyExc_ValueError, error);
        return NULL;
    }
    return PyLong_FromSsize_t(kept);
}

static PyMethodDef methods[] = {
    {"link_sums", link_sums, METH_VARARGS,
     "A window's free chunks' keyed link sums, per stretch (list_proof); see the function."},
    {"headers", headers, METH_VARARGS,
     "Walk one window's chunk headers: (at, count, stop); see the module."},
    {"chunk_index", chunk_index, METH_VARARGS,
     "Each value's index in a sorted array of chunk addresses (-1: none); see the function."},
    {"list_bins", list_bins, METH_VARARGS,
     "Each free chunk's bin, as following fd from it reaches a head (0: none); see it."},
    {"free_columns", free_columns, METH_VARARGS,
     "A window's free chunks' address, size word, fd, bk and footer check; see it."},
    {"first_words", first_words, METH_VARARGS,
     "Each chunk's first data word out of a window copy (0 outside it)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_heapwindow", NULL, -1, methods};

PyMODINIT_FUNC PyInit__heapwindow(void) { return PyModule_Create(&module); }
