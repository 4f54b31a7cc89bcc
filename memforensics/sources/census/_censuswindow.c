/* The census's per-window loops in C (optional: entry/census.py's Python loops are the
 * fallback, and tests/unit/test_census_native.py compares the two on the same bytes).
 * Nothing is allocated from a value read from the target: every loop is bounded by the
 * lengths of the caller's arrays, every read of the window by its length.
 *
 * live_groups(firsts, sizes, states) -> {first word: [count, bytes]}
 *   The live chunks (state 0) of a window grouped by their first data word: a vptr seen
 *   before names a whole group by one look-up.
 *
 * plain_census(window, base, addresses, sizes, states, firsts, words, look_bytes,
 *              heap_starts, heap_ends, cookie_max) -> (kinds, by_size, deferred)
 *   Each live chunk whose first word is among `words` (sorted) classified by its bytes alone,
 *   with analysis.census.classify_bytes' rules: kinds is [[count, bytes]] for zeros, text
 *   and pointers; by_size {chunk size: [count, bytes]} for the unknown ones (the caller
 *   names their size class); deferred the indices of the chunks the caller must look at
 *   itself: a first word in (0, cookie_max) (maybe an array cookie before a vptr) and text
 *   with bytes >= 0x80 (whose UTF-8 only Python judges). A chunk's data is the window's
 *   bytes from its address + 16, at most min(size - 16, look_bytes), cut at the window's
 *   end. heap_starts and heap_ends are the sorted, merged spans of HeapRanges. */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

#define POINTER_WORDS 32
#define TEXT_MIN_CHARS 4
enum { ZEROS, TEXT, POINTERS, UNKNOWN, DEFER };

/* Add count and bytes to the [count, bytes] list under key (created if absent). */
static int add_to(PyObject *dict, PyObject *key, uint64_t count, uint64_t bytes) {
    PyObject *line = PyDict_GetItemWithError(dict, key);
    if (line == NULL) {
        if (PyErr_Occurred()) return -1;
        line = Py_BuildValue("[KK]", (unsigned long long)count, (unsigned long long)bytes);
        if (line == NULL) return -1;
        int failed = PyDict_SetItem(dict, key, line);
        Py_DECREF(line);
        return failed;
    }
    for (int i = 0; i < 2; i++) {
        PyObject *old = PyList_GET_ITEM(line, i);
        PyObject *more = PyLong_FromUnsignedLongLong(i == 0 ? count : bytes);
        if (more == NULL) return -1;
        PyObject *sum = PyNumber_Add(old, more);
        Py_DECREF(more);
        if (sum == NULL) return -1;
        PyList_SetItem(line, i, sum); /* steals sum, releases old */
    }
    return 0;
}

static PyObject *live_groups(PyObject *self, PyObject *args) {
    Py_buffer in_firsts, in_sizes, in_states;
    (void)self;
    if (!PyArg_ParseTuple(args, "y*y*y*", &in_firsts, &in_sizes, &in_states)) return NULL;
    const uint64_t *firsts = in_firsts.buf, *sizes = in_sizes.buf;
    const unsigned char *states = in_states.buf;
    Py_ssize_t count = in_firsts.len / 8;
    if (in_sizes.len / 8 < count) count = in_sizes.len / 8;
    if (in_states.len < count) count = in_states.len;
    PyObject *groups = PyDict_New();
    /* Runs of the same word (a heap of one type lies in runs) are added at once. */
    Py_ssize_t i = 0;
    while (groups != NULL && i < count) {
        if (states[i]) {
            i++;
            continue;
        }
        uint64_t word = firsts[i], run = 0, bytes = 0;
        while (i < count && (states[i] || firsts[i] == word)) {
            if (!states[i]) {
                run++;
                bytes += sizes[i];
            }
            i++;
        }
        PyObject *key = PyLong_FromUnsignedLongLong(word);
        if (key == NULL || add_to(groups, key, run, bytes) < 0) Py_CLEAR(groups);
        Py_XDECREF(key);
    }
    PyBuffer_Release(&in_firsts);
    PyBuffer_Release(&in_sizes);
    PyBuffer_Release(&in_states);
    return groups;
}

/* Whether word is among the n sorted words. */
static int among(uint64_t word, const uint64_t *sorted, Py_ssize_t n) {
    Py_ssize_t low = 0, high = n;
    while (low < high) {
        Py_ssize_t middle = (low + high) / 2;
        if (sorted[middle] < word)
            low = middle + 1;
        else
            high = middle;
    }
    return low < n && sorted[low] == word;
}

static int in_heap(uint64_t address, const uint64_t *starts, const uint64_t *ends, Py_ssize_t n) {
    Py_ssize_t low = 0, high = n; /* the last span starting at or below address */
    while (low < high) {
        Py_ssize_t middle = (low + high) / 2;
        if (starts[middle] <= address)
            low = middle + 1;
        else
            high = middle;
    }
    return low > 0 && address < ends[low - 1];
}

static int is_printable(unsigned char c) {
    return (c >= 0x20 && c != 0x7F) || c == '\t' || c == '\n' || c == '\r';
}

static int classify(const unsigned char *data, Py_ssize_t length, const uint64_t *starts,
                    const uint64_t *ends, Py_ssize_t spans) {
    Py_ssize_t nul = -1, i;
    int high_bytes = 0, printable = 1, all_zero = 1;
    for (i = 0; i < length; i++) {
        if (data[i]) {
            all_zero = 0;
            break;
        }
    }
    if (all_zero) return ZEROS;
    for (i = 0; i < length; i++) {
        unsigned char c = data[i];
        if (c == 0) {
            nul = i;
            break;
        }
        if (!is_printable(c)) printable = 0;
        if (c >= 0x80) high_bytes = 1;
    }
    Py_ssize_t text_chars = nul < 0 ? length : nul;
    if (text_chars >= TEXT_MIN_CHARS && printable &&
        (nul < 0 || 2 * (nul + 1) >= length || nul >= 64))
        return high_bytes ? DEFER : TEXT;
    Py_ssize_t words = (length < 8 * POINTER_WORDS ? length : 8 * POINTER_WORDS) / 8;
    int pointers = 0, nonzero = 0;
    for (i = 0; i < words; i++) {
        uint64_t word;
        memcpy(&word, data + 8 * i, 8);
        if (word) {
            nonzero++;
            if (!(word & 7) && spans > 0 && word >= starts[0] && word < ends[spans - 1] &&
                in_heap(word, starts, ends, spans))
                pointers++;
        }
    }
    if (pointers >= 2 && 2 * pointers >= nonzero) return POINTERS;
    return UNKNOWN;
}

typedef struct {
    Py_buffer window, addresses, sizes, states, firsts, words, starts, ends;
} Buffers;

static void release(Buffers *b) {
    PyBuffer_Release(&b->window);
    PyBuffer_Release(&b->addresses);
    PyBuffer_Release(&b->sizes);
    PyBuffer_Release(&b->states);
    PyBuffer_Release(&b->firsts);
    PyBuffer_Release(&b->words);
    PyBuffer_Release(&b->starts);
    PyBuffer_Release(&b->ends);
}

static PyObject *plain_census(PyObject *self, PyObject *args) {
    Buffers b;
    unsigned long long base, look_bytes, cookie_max;
    (void)self;
    memset(&b, 0, sizeof b);
    if (!PyArg_ParseTuple(args, "y*Ky*y*y*y*y*Ky*y*K", &b.window, &base, &b.addresses, &b.sizes,
                          &b.states, &b.firsts, &b.words, &look_bytes, &b.starts, &b.ends,
                          &cookie_max))
        return NULL;
    const uint64_t *addresses = b.addresses.buf, *sizes = b.sizes.buf, *firsts = b.firsts.buf;
    const unsigned char *states = b.states.buf, *bytes = b.window.buf;
    Py_ssize_t count = b.addresses.len / 8;
    if (b.sizes.len / 8 < count) count = b.sizes.len / 8;
    if (b.firsts.len / 8 < count) count = b.firsts.len / 8;
    if (b.states.len < count) count = b.states.len;
    const uint64_t *words = b.words.buf;
    Py_ssize_t word_count = b.words.len / 8;
    Py_ssize_t spans = b.starts.len / 8;
    if (b.ends.len / 8 < spans) spans = b.ends.len / 8;
    uint64_t length = (uint64_t)b.window.len;
    uint64_t kind_count[3] = {0, 0, 0}, kind_bytes[3] = {0, 0, 0};
    PyObject *by_size = PyDict_New(), *deferred = PyList_New(0), *result = NULL;
    if (by_size == NULL || deferred == NULL) goto done;
    for (Py_ssize_t i = 0; i < count; i++) {
        if (states[i] || !among(firsts[i], words, word_count)) continue;
        int kind = DEFER;
        if (!(firsts[i] > 0 && firsts[i] < cookie_max)) {
            uint64_t offset = addresses[i] + 16 - base, visible = 0;
            if (addresses[i] + 16 >= base && offset < length) {
                visible = sizes[i] >= 16 ? sizes[i] - 16 : 0;
                if (visible > look_bytes) visible = look_bytes;
                if (visible > length - offset) visible = length - offset;
            }
            kind = classify(bytes + (visible ? offset : 0), (Py_ssize_t)visible,
                            b.starts.buf, b.ends.buf, spans);
        }
        if (kind < UNKNOWN) {
            kind_count[kind]++;
            kind_bytes[kind] += sizes[i];
        } else if (kind == UNKNOWN) {
            PyObject *size = PyLong_FromUnsignedLongLong(sizes[i]);
            int failed = size == NULL || add_to(by_size, size, 1, sizes[i]) < 0;
            Py_XDECREF(size);
            if (failed) goto done;
        } else {
            PyObject *index = PyLong_FromSsize_t(i);
            int failed = index == NULL || PyList_Append(deferred, index) < 0;
            Py_XDECREF(index);
            if (failed) goto done;
        }
    }
    result = Py_BuildValue("[[KK][KK][KK]]OO", (unsigned long long)kind_count[0],
                           (unsigned long long)kind_bytes[0], (unsigned long long)kind_count[1],
                           (unsigned long long)kind_bytes[1], (unsigned long long)kind_count[2],
                           (unsigned long long)kind_bytes[2], by_size, deferred);
done:
    Py_XDECREF(by_size);
    Py_XDECREF(deferred);
    release(&b);
    return result;
}

static PyMethodDef methods[] = {
    {"live_groups", live_groups, METH_VARARGS,
     "A window's live chunks grouped by first word: {word: [count, bytes]}."},
    {"plain_census", plain_census, METH_VARARGS,
     "The chunks whose first word is in a set, classified by their bytes; see the module."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_censuswindow", NULL, -1, methods};

PyMODINIT_FUNC PyInit__censuswindow(void) { return PyModule_Create(&module); }
