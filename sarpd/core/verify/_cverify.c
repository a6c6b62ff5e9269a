/* First-mismatch verification of 128-bit block ids: the C twin of _numpy.py.
 *
 * An id array is a C-contiguous uint64 buffer of shape (n, 2) (col 0 low, col 1
 * high). first_mismatch returns the first row where two arrays differ, or
 * min(n_cand, n_query) when every compared row agrees. The AVX2 path (picked at
 * import when the CPU has it) compares 2 ids per 256-bit op with unaligned loads;
 * the plain C path does one id at a time. first_mismatch_many takes every pair's
 * buffers first, then compares them without the GIL (past gil_free_min ids). */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

#if defined(__GNUC__) && (defined(__x86_64__) || defined(__i386__))
#define SARP_X86 1
#include <immintrin.h>
#endif

#include "sarp.h"

typedef Py_ssize_t (*mismatch_fn)(const uint64_t *, const uint64_t *, Py_ssize_t);

static Py_ssize_t scalar_from(const uint64_t *a, const uint64_t *b, Py_ssize_t i,
                              Py_ssize_t n) {
    for (; i < n; i++) {
        uint64_t x[2], y[2];  /* memcpy: the buffers may be unaligned */
        memcpy(x, a + 2 * i, sizeof x);
        memcpy(y, b + 2 * i, sizeof y);
        if ((x[0] ^ y[0]) | (x[1] ^ y[1])) return i;
    }
    return n;
}

static Py_ssize_t mismatch_scalar(const uint64_t *a, const uint64_t *b, Py_ssize_t n) {
    return scalar_from(a, b, 0, n);
}

#ifdef SARP_X86
__attribute__((target("avx2")))
static Py_ssize_t mismatch_avx2(const uint64_t *a, const uint64_t *b, Py_ssize_t n) {
    Py_ssize_t i = 0;
    for (; i + 2 <= n; i += 2) {  /* 2 ids = 4 uint64 lanes per op */
        __m256i va = _mm256_loadu_si256((const __m256i *)(a + 2 * i));
        __m256i vb = _mm256_loadu_si256((const __m256i *)(b + 2 * i));
        int eq = _mm256_movemask_pd(_mm256_castsi256_pd(_mm256_cmpeq_epi64(va, vb)));
        if (eq != 0xF) return i + (__builtin_ctz(~eq & 0xF) >> 1);
    }
    return scalar_from(a, b, i, n);  /* odd tail */
}
#endif

static mismatch_fn mismatch = mismatch_scalar;
static int have_avx2 = 0;

/* `obj` as a C-contiguous (n, 2) uint64 buffer (csrc/sarp.h's check); on error an
 * exception naming `name`, and -1. */
static int get_ids(PyObject *obj, const char *name, Py_buffer *view) {
    return sarp_get_ids_as(obj, name, "uint64 array of shape (n, 2)", view);
}

/* First mismatch of one pair, or -1 with an exception set. */
static Py_ssize_t pair(PyObject *cand, PyObject *query) {
    Py_buffer a, b;
    if (get_ids(cand, "cand", &a) < 0) return -1;
    if (get_ids(query, "query", &b) < 0) { PyBuffer_Release(&a); return -1; }
    Py_ssize_t n = a.shape[0] < b.shape[0] ? a.shape[0] : b.shape[0];
    Py_ssize_t r = mismatch((const uint64_t *)a.buf, (const uint64_t *)b.buf, n);
    PyBuffer_Release(&a);
    PyBuffer_Release(&b);
    return r;
}

static PyObject *first_mismatch(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 2) {
        PyErr_Format(PyExc_TypeError, "first_mismatch takes 2 arguments (cand, query), got %zd",
                     nargs);
        return NULL;
    }
    Py_ssize_t r = pair(args[0], args[1]);
    return r < 0 ? NULL : PyLong_FromSsize_t(r);
}

/* Ids compared below which first_mismatch_many keeps the GIL: releasing it hands it
 * to a waiting thread, and getting it back waits for that thread's next release
 * (_set_gil_free_min, a test hook: 0 releases it always). */
static Py_ssize_t gil_free_min = 4096;

static PyObject *first_mismatch_many(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 2) {
        PyErr_Format(PyExc_TypeError,
                     "first_mismatch_many takes 2 arguments (cands, queries), got %zd", nargs);
        return NULL;
    }
    PyObject *cs = PySequence_Fast(args[0], "cands must be a sequence of id arrays");
    if (cs == NULL) return NULL;
    PyObject *qs = PySequence_Fast(args[1], "queries must be a sequence of id arrays");
    if (qs == NULL) { Py_DECREF(cs); return NULL; }
    PyObject *out = NULL;
    Py_buffer *views = NULL;  /* cands[i] at 2i, queries[i] at 2i + 1 */
    Py_ssize_t *found = NULL, held = 0, work = 0;
    Py_ssize_t m = PySequence_Fast_GET_SIZE(cs);
    if (PySequence_Fast_GET_SIZE(qs) != m) {
        PyErr_Format(PyExc_ValueError, "cands and queries must have the same length, got %zd and %zd",
                     m, PySequence_Fast_GET_SIZE(qs));
        goto done;
    }
    views = PyMem_Malloc((size_t)(m ? 2 * m : 1) * sizeof *views);
    found = PyMem_Malloc((size_t)(m ? m : 1) * sizeof *found);
    if (views == NULL || found == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    /* the GIL held: every pair's buffers, checked in order */
    for (Py_ssize_t i = 0; i < m; i++) {
        if (get_ids(PySequence_Fast_GET_ITEM(cs, i), "cand", &views[held]) < 0) goto done;
        held++;
        if (get_ids(PySequence_Fast_GET_ITEM(qs, i), "query", &views[held]) < 0) goto done;
        held++;
        work += views[held - 2].shape[0] < views[held - 1].shape[0]
                ? views[held - 2].shape[0] : views[held - 1].shape[0];
    }
    mismatch_fn fn = mismatch;  /* read once: the test hook may switch it meanwhile */
    PyThreadState *ts = work >= gil_free_min ? PyEval_SaveThread() : NULL;
    for (Py_ssize_t i = 0; i < m; i++) {  /* no Python object from here */
        const Py_buffer *a = &views[2 * i], *b = &views[2 * i + 1];
        Py_ssize_t n = a->shape[0] < b->shape[0] ? a->shape[0] : b->shape[0];
        found[i] = fn((const uint64_t *)a->buf, (const uint64_t *)b->buf, n);
    }
    if (ts != NULL) PyEval_RestoreThread(ts);
    out = PyList_New(m);
    if (out == NULL) goto done;
    for (Py_ssize_t i = 0; i < m; i++) {
        PyObject *v = PyLong_FromSsize_t(found[i]);
        if (v == NULL) { Py_CLEAR(out); goto done; }
        PyList_SET_ITEM(out, i, v);
    }
done:
    for (Py_ssize_t i = 0; i < held; i++) PyBuffer_Release(&views[i]);
    PyMem_Free(views);
    PyMem_Free(found);
    Py_DECREF(cs);
    Py_DECREF(qs);
    return out;
}

/* Test hook: use the AVX2 path (when the CPU has it) or force plain C; returns the
 * previous setting. */
static PyObject *set_simd(PyObject *self, PyObject *arg) {
    int on = PyObject_IsTrue(arg);
    if (on < 0) return NULL;
    int was = mismatch != mismatch_scalar;
#ifdef SARP_X86
    mismatch = (on && have_avx2) ? mismatch_avx2 : mismatch_scalar;
#endif
    return PyBool_FromLong(was);
}

/* Test hook: the ids compared below which first_mismatch_many keeps the GIL; returns
 * the previous setting. */
static PyObject *set_gil_free_min(PyObject *self, PyObject *arg) {
    Py_ssize_t n = PyLong_AsSsize_t(arg);
    if (n == -1 && PyErr_Occurred()) return NULL;
    Py_ssize_t was = gil_free_min;
    gil_free_min = n;
    return PyLong_FromSsize_t(was);
}

static PyMethodDef methods[] = {
    {"first_mismatch", (PyCFunction)(void (*)(void))first_mismatch, METH_FASTCALL,
     "Index of the first row where cand and query differ; min(len) if none."},
    {"first_mismatch_many", (PyCFunction)(void (*)(void))first_mismatch_many, METH_FASTCALL,
     "first_mismatch of each (candidate, query) pair, in one call."},
    {"_set_simd", set_simd, METH_O, "Use AVX2 if available (True) or plain C (False)."},
    {"_set_gil_free_min", set_gil_free_min, METH_O,
     "Ids below which first_mismatch_many keeps the GIL (0: always release); the old value."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "sarpd.core.verify._cverify",
                                    "C/AVX2 first-mismatch verification.", -1, methods};

PyMODINIT_FUNC PyInit__cverify(void) {
#ifdef SARP_X86
    __builtin_cpu_init();
    have_avx2 = __builtin_cpu_supports("avx2") != 0;
    if (have_avx2) mismatch = mismatch_avx2;
#endif
    PyObject *mod = PyModule_Create(&module);
    if (mod == NULL) return NULL;
    if (PyModule_AddObjectRef(mod, "HAVE_AVX2", have_avx2 ? Py_True : Py_False) < 0) {
        Py_DECREF(mod);
        return NULL;
    }
    return mod;
}
