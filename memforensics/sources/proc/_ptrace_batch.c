/* One ptrace request made on many threads in a loop, for ptrace_hold.ThreadHold.

   A hold of a process of a thousand threads makes three requests per thread (PTRACE_SEIZE,
   PTRACE_INTERRUPT, PTRACE_DETACH); made one Python call at a time, the interpreter's share
   of each is about as long as the kernel's. Here the loop runs without the GIL and only
   the errno of each request comes back: which threads failed, and why, is decided in Python
   exactly as for a single request. Nothing but the request itself is made: no wait, no
   retry, no request on a thread the caller did not name. Like any ptrace request, these
   are taken by the kernel from the tracer thread only: the caller's thread must be it.
*/
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <errno.h>
#include <stdlib.h>
#include <sys/ptrace.h>
#include <sys/types.h>

/* each(request, tids, data) -> bytes: the errno of ptrace(request, tid, 0, data[i]) for
   each tid, one byte each (0: done). ``data`` is a sequence as long as ``tids``, or an int
   for all of them. */
static PyObject *each(PyObject *Py_UNUSED(self), PyObject *args) {
    long request;
    PyObject *tids_arg, *data_arg;
    if (!PyArg_ParseTuple(args, "lOO", &request, &tids_arg, &data_arg)) return NULL;
    PyObject *tids = PySequence_Fast(tids_arg, "tids must be a sequence");
    if (tids == NULL) return NULL;
    Py_ssize_t count = PySequence_Fast_GET_SIZE(tids);
    PyObject *datas = NULL;
    long same_data = 0;
    if (PyLong_Check(data_arg)) {
        same_data = PyLong_AsLong(data_arg);
        if (same_data == -1 && PyErr_Occurred()) goto fail_tids;
    } else {
        datas = PySequence_Fast(data_arg, "data must be an int or a sequence");
        if (datas == NULL) goto fail_tids;
        if (PySequence_Fast_GET_SIZE(datas) != count) {
            PyErr_SetString(PyExc_ValueError, "data and tids differ in length");
            goto fail_datas;
        }
    }
    pid_t *ids = malloc(sizeof(pid_t) * (size_t)(count ? count : 1));
    long *values = malloc(sizeof(long) * (size_t)(count ? count : 1));
    PyObject *result = PyBytes_FromStringAndSize(NULL, count);
    if (ids == NULL || values == NULL || result == NULL) {
        PyErr_NoMemory();
        goto fail_buffers;
    }
    for (Py_ssize_t i = 0; i < count; i++) {
        long tid = PyLong_AsLong(PySequence_Fast_GET_ITEM(tids, i));
        if (tid == -1 && PyErr_Occurred()) goto fail_buffers;
        if (tid <= 0) {
            PyErr_SetString(PyExc_ValueError, "a thread id must be positive");
            goto fail_buffers;
        }
        ids[i] = (pid_t)tid;
        if (datas != NULL) {
            values[i] = PyLong_AsLong(PySequence_Fast_GET_ITEM(datas, i));
            if (values[i] == -1 && PyErr_Occurred()) goto fail_buffers;
        } else {
            values[i] = same_data;
        }
    }
    char *errors = PyBytes_AS_STRING(result);
    Py_BEGIN_ALLOW_THREADS
    for (Py_ssize_t i = 0; i < count; i++) {
        long done = ptrace((enum __ptrace_request)request, ids[i], NULL, (void *)values[i]);
        int err = done == -1 ? errno : 0;
        errors[i] = (char)(err > 255 ? 255 : err);
    }
    Py_END_ALLOW_THREADS
    free(ids);
    free(values);
    Py_XDECREF(datas);
    Py_DECREF(tids);
    return result;

fail_buffers:
    Py_XDECREF(result);
    free(ids);
    free(values);
fail_datas:
    Py_XDECREF(datas);
fail_tids:
    Py_DECREF(tids);
    return NULL;
}

static PyMethodDef methods[] = {
    {"each", each, METH_VARARGS,
     "each(request, tids, data) -> bytes: the errno of each thread's ptrace request (0: done)"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_ptrace_batch", "One ptrace request on many threads.", -1, methods,
};

PyMODINIT_FUNC PyInit__ptrace_batch(void) { return PyModule_Create(&module); }
