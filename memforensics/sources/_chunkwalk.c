/* Optional accelerator for memforensics.sources.glibc_walk: the hot loop of the residency
 * walk (one glibc free list followed through a private copy of a heap) in C. Same checks
 * and result as glibc_walk.walk_copy_py; the package works
 * without it (pip install on a machine with no compiler builds none and uses the Python
 * loop). Reads only the caller's buffer: nothing here touches the target process. */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

static uint64_t word_at(const unsigned char *base, uint64_t slot) {
    uint64_t value;
    memcpy(&value, base + slot * 8, sizeof value);
    return value;
}

/* Bytes of [from, to) on present pages; present[i] is page i of the copy (0 or 1). */
static uint64_t resident_span(const unsigned char *present, uint64_t pages, uint64_t start,
                              uint64_t from, uint64_t to, uint64_t page) {
    uint64_t total = 0;
    while (from < to) {
        uint64_t index = (from - start) / page;
        uint64_t page_end = start + (index + 1) * page;
        uint64_t piece_end = page_end < to ? page_end : to;
        if (index < pages && present[index]) total += piece_end - from;
        from = piece_end;
    }
    return total;
}

/* walk(buffer, start, head, fd, bk, low, high, page, present=None)
 * -> (count, total, resident, trimmable), or None when the list does not read back
 * consistently. present: one byte per page of the copy (1 = in RAM); None = all resident. */
static PyObject *walk(PyObject *self, PyObject *args) {
    (void)self;
    PyObject *source, *present_source = Py_None;
    unsigned long long start, head, fd, bk, low, high, page;
    if (!PyArg_ParseTuple(args, "OKKKKKKK|O", &source, &start, &head, &fd, &bk, &low, &high,
                          &page, &present_source))
        return NULL;
    if (page == 0 || start % page) {
        PyErr_SetString(PyExc_ValueError, "page must be positive and divide start");
        return NULL;
    }
    Py_buffer view, present_view;
    int has_present = present_source != Py_None;
    if (PyObject_GetBuffer(source, &view, PyBUF_SIMPLE) < 0) return NULL;
    if (has_present && PyObject_GetBuffer(present_source, &present_view, PyBUF_SIMPLE) < 0) {
        PyBuffer_Release(&view);
        return NULL;
    }
    const unsigned char *base = view.buf;
    const unsigned char *present = has_present ? present_view.buf : NULL;
    uint64_t pages = has_present ? (uint64_t)present_view.len : 0;
    uint64_t length = (uint64_t)view.len;
    uint64_t count = 0, total = 0, resident = 0, trimmable = 0;
    uint64_t previous = head, chunk = fd;
    int consistent = length >= 32;
    uint64_t last_slot = consistent ? (length - 32) >> 3 : 0, end_slot = length >> 3;
    uint64_t min_trim = page + 48, align_in = 48 + page - 1, limit = length / 32 + 1;
    while (consistent && chunk != head) {
        uint64_t slot = (chunk - start) >> 3;
        if (chunk < start || slot > last_slot || word_at(base, slot + 3) != previous ||
            ++count > limit) {
            consistent = 0;
            break;
        }
        uint64_t size = word_at(base, slot + 1) & ~(uint64_t)7;
        if (size < low || size > high || slot + (size >> 3) > end_slot) {
            consistent = 0;
            break;
        }
        total += size;
        if (present == NULL) {
            resident += size;
            if (size >= min_trim) {
                uint64_t first = (chunk + align_in) / page, last = (chunk + size) / page;
                if (last > first) trimmable += (last - first) * page;
            }
        } else {
            resident += resident_span(present, pages, start, chunk, chunk + size, page);
            uint64_t first = (chunk + align_in) / page, last = (chunk + size) / page;
            for (uint64_t p = first; p < last; p++) {
                uint64_t index = p - start / page;
                if (index < pages && present[index]) trimmable += page;
            }
        }
        previous = chunk;
        chunk = word_at(base, slot + 2);
    }
    PyBuffer_Release(&view);
    if (has_present) PyBuffer_Release(&present_view);
    if (!consistent || bk != previous) Py_RETURN_NONE;
    return Py_BuildValue("KKKK", count, total, resident, trimmable);
}

static PyMethodDef methods[] = {
    {"walk", walk, METH_VARARGS,
     "Follow one free list through a heap copy: (count, total, resident, trimmable) or None."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_chunkwalk", NULL, -1, methods};

PyMODINIT_FUNC PyInit__chunkwalk(void) { return PyModule_Create(&module); }
