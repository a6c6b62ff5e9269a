/* The block map as a Python type: sarpd.core._cmap.BlockMap, the twin of
 * sarpd.core.blockmap.BlockMap (the same constructor, methods, answers, spills,
 * snapshot arrays, stats and byte accounting) over the plain C map of
 * csrc/blockmap.c, whose top comment is the layout (a native write core may own a
 * bm_map directly, without this type).
 *
 *   BlockMap(budget_bytes, generation=65536)   ValueError as the reference's
 *   len(m), m.nbytes, m.budget_bytes, m.generation (settable), m.stats()
 *   m.lookup(ids) -> (heads uint64, pos int64: -1 a miss); m.peek(ids): the same, no move
 *   m.add(ids, heads, pos), m.add_bulk(ids, heads, pos) -> Spill | None
 *   m.discard(ids), m.clear()
 *   m.to_arrays() -> MapArrays;  m.load_arrays(arrays) -> Spill | None
 *   block_map_generation(budget_bytes), YOUNG_ENTRY_BYTES, FROZEN_ENTRY_BYTES
 *
 * Arguments: ids an (n, 2) uint64 array, any strides (read in place when C-contiguous
 * and aligned, else copied here); heads and pos 1-D arrays of any integer dtype and
 * strides, or sequences of ints, n each; heads in [0, 2**64), positions in [0, 2**32).
 * Anything else is a TypeError or ValueError naming the argument, raised before the
 * map changes (the reference checks lengths as it goes and would keep an out-of-range
 * position's high bits in the head). Results: numpy arrays made by numpy.empty (called
 * from here: no numpy headers at build time) and the reference's own Spill and
 * MapArrays (sarpd.core.blockmap, imported at call time).
 *
 * Threads: each map has a lock, held around every use of its bm_map. The C work runs
 * without the GIL when it is big enough for that to pay (WORK_NOGIL entries touched,
 * as estimated from the batch and the map: a freeze, an eviction, a long batch); a
 * small batch keeps it (releasing and re-taking the GIL costs more than a few hundred
 * entries, and re-taking it can wait for another thread's switch interval). No Python
 * code runs while the lock is held (arguments are converted before, results built
 * after), so nothing can re-enter a map and deadlock on its lock. */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <pythread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "blockmap.h"
#include "sarp.h"

#define WORK_NOGIL 4096

/* -- numpy and the reference's result types, from C ------------------------------- */

static PyObject *np_empty, *dt_u64, *dt_i64, *dt_u32;

static int need_numpy(void) {
    if (np_empty != NULL) return 0;
    PyObject *np = PyImport_ImportModule("numpy");
    if (np == NULL) return -1;
    PyObject *empty = PyObject_GetAttrString(np, "empty");
    PyObject *dtype = PyObject_GetAttrString(np, "dtype");
    Py_DECREF(np);
    PyObject *u64 = dtype ? PyObject_CallFunction(dtype, "s", "uint64") : NULL;
    PyObject *i64 = dtype ? PyObject_CallFunction(dtype, "s", "int64") : NULL;
    PyObject *u32 = dtype ? PyObject_CallFunction(dtype, "s", "uint32") : NULL;
    Py_XDECREF(dtype);
    if (empty == NULL || u64 == NULL || i64 == NULL || u32 == NULL) {
        Py_XDECREF(empty);
        Py_XDECREF(u64);
        Py_XDECREF(i64);
        Py_XDECREF(u32);
        return -1;
    }
    if (np_empty != NULL) {  /* another thread got here during the import */
        Py_DECREF(empty);
        Py_DECREF(u64);
        Py_DECREF(i64);
        Py_DECREF(u32);
        return 0;
    }
    np_empty = empty;  /* kept for the life of the process, as the module is */
    dt_u64 = u64;
    dt_i64 = i64;
    dt_u32 = u32;
    return 0;
}

/* numpy.empty(n) or ((n, 2)) of dtype `dt`, and its writable buffer in *view. */
static PyObject *new_array(Py_ssize_t n, int pairs, PyObject *dt, Py_buffer *view) {
    PyObject *shape = pairs ? Py_BuildValue("(nn)", n, (Py_ssize_t)2) : PyLong_FromSsize_t(n);
    if (shape == NULL) return NULL;
    PyObject *args[2] = {shape, dt};
    PyObject *arr = PyObject_Vectorcall(np_empty, args, 2, NULL);
    Py_DECREF(shape);
    if (arr == NULL) return NULL;
    if (PyObject_GetBuffer(arr, view, PyBUF_WRITABLE | PyBUF_C_CONTIGUOUS) < 0) {
        Py_DECREF(arr);
        return NULL;
    }
    return arr;
}

/* sarpd.core.blockmap.<name>(ids, heads, pos); steals the three references. */
static PyObject *make_result(const char *name, PyObject *ids, PyObject *heads, PyObject *pos) {
    PyObject *out = NULL, *mod = PyImport_ImportModule("sarpd.core.blockmap");
    if (mod != NULL) {
        PyObject *cls = PyObject_GetAttrString(mod, name);
        if (cls != NULL) out = PyObject_CallFunctionObjArgs(cls, ids, heads, pos, NULL);
        Py_XDECREF(cls);
        Py_DECREF(mod);
    }
    Py_DECREF(ids);
    Py_DECREF(heads);
    Py_DECREF(pos);
    return out;
}

/* A Spill of what the call evicted, or None. */
static PyObject *spill_result(const bm_spill *sp) {
    if (sp->n == 0) Py_RETURN_NONE;
    if (need_numpy() < 0) return NULL;
    Py_ssize_t n = (Py_ssize_t)sp->n;
    Py_buffer iv, hv, pv;
    PyObject *ids = new_array(n, 1, dt_u64, &iv);
    if (ids == NULL) return NULL;
    PyObject *heads = new_array(n, 0, dt_u64, &hv);
    if (heads == NULL) {
        PyBuffer_Release(&iv);
        Py_DECREF(ids);
        return NULL;
    }
    PyObject *pos = new_array(n, 0, dt_u32, &pv);
    if (pos == NULL) {
        PyBuffer_Release(&iv);
        PyBuffer_Release(&hv);
        Py_DECREF(ids);
        Py_DECREF(heads);
        return NULL;
    }
    memcpy(iv.buf, sp->ids, sp->n * 2 * sizeof(uint64_t));
    memcpy(hv.buf, sp->heads, sp->n * sizeof(uint64_t));
    memcpy(pv.buf, sp->pos, sp->n * sizeof(uint32_t));
    PyBuffer_Release(&iv);
    PyBuffer_Release(&hv);
    PyBuffer_Release(&pv);
    return make_result("Spill", ids, heads, pos);
}

/* -- arguments ---------------------------------------------------------------------- */

static const uint64_t NO_ENTRIES[2];  /* what an empty argument points at */

typedef struct {
    Py_buffer view;
    int held;          /* view to release */
    void *copy;        /* a converted copy (malloc), or NULL */
    const void *data;  /* what the C map reads */
    Py_ssize_t n;
} arg_t;

static void arg_release(arg_t *a) {
    if (a->held) PyBuffer_Release(&a->view);
    a->held = 0;
    free(a->copy);
    a->copy = NULL;
}

/* The element size of an integer buffer format (native byte order), or 0. */
static int int_format(const Py_buffer *v, int *is_signed) {
    const char *f = v->format ? v->format : "B";
    if (*f == '@' || *f == '=' || (PY_LITTLE_ENDIAN && *f == '<')) f++;
    if (f[0] == '\0' || f[1] != '\0' || strchr("bBhHiIlLqQnN", f[0]) == NULL) return 0;
    *is_signed = f[0] >= 'a';
    Py_ssize_t s = v->itemsize;
    return s == 1 || s == 2 || s == 4 || s == 8 ? (int)s : 0;
}

static int aligned(const void *p, size_t to) { return ((uintptr_t)p & (to - 1)) == 0; }

static void shape_error(const char *name, const Py_buffer *v, const char *want) {
    if (v->ndim == 1)
        PyErr_Format(PyExc_ValueError, "%s must have shape %s, got (%zd,)", name, want, v->shape[0]);
    else if (v->ndim == 2)
        PyErr_Format(PyExc_ValueError, "%s must have shape %s, got (%zd, %zd)", name, want,
                     v->shape[0], v->shape[1]);
    else
        PyErr_Format(PyExc_ValueError, "%s must have shape %s, got %d dimensions", name, want,
                     v->ndim);
}

/* ids: an (n, 2) uint64 array -> 2n uint64 (lo, hi), in place or copied. */
static int ids_get(PyObject *obj, const char *name, arg_t *a) {
    memset(a, 0, sizeof *a);
    if (PyObject_GetBuffer(obj, &a->view, PyBUF_RECORDS_RO) < 0) {
        PyErr_Clear();
        PyErr_Format(PyExc_TypeError, "%s must be a uint64 array of shape (n, 2), got %.100s",
                     name, Py_TYPE(obj)->tp_name);
        return -1;
    }
    a->held = 1;
    const Py_buffer *v = &a->view;
    int sgn = 0;
    if (int_format(v, &sgn) != 8 || sgn) {
        PyErr_Format(PyExc_TypeError, "%s must have dtype uint64, got buffer format '%s' "
                     "(itemsize %zd)", name, v->format ? v->format : "B", v->itemsize);
        arg_release(a);
        return -1;
    }
    if (v->ndim != 2 || v->shape[1] != 2) {
        shape_error(name, v, "(n, 2)");
        arg_release(a);
        return -1;
    }
    a->n = v->shape[0];
    if (a->n > PY_SSIZE_T_MAX / (Py_ssize_t)(2 * sizeof(uint64_t))) {  /* a broadcast view */
        arg_release(a);
        PyErr_NoMemory();
        return -1;
    }
    if (a->n == 0) {
        a->data = NO_ENTRIES;
    } else if (PyBuffer_IsContiguous(v, 'C') && aligned(v->buf, sizeof(uint64_t))) {
        a->data = v->buf;
    } else {
        uint64_t *c = malloc((size_t)a->n * 2 * sizeof(uint64_t));
        if (c == NULL) {
            arg_release(a);
            PyErr_NoMemory();
            return -1;
        }
        for (Py_ssize_t i = 0; i < a->n; i++)
            for (Py_ssize_t j = 0; j < 2; j++)
                memcpy(&c[2 * i + j], (const char *)v->buf + i * v->strides[0] + j * v->strides[1],
                       sizeof(uint64_t));
        a->copy = c;
        a->data = c;
    }
    return 0;
}

static int out_of_range(const char *name, Py_ssize_t i, int width, PyObject *value,
                        long long sv, unsigned long long uv, int is_signed) {
    const char *bound = width == 4 ? "2**32" : "2**64";
    if (value != NULL)
        PyErr_Format(PyExc_ValueError, "%s[%zd] is %S, not in [0, %s)", name, i, value, bound);
    else if (is_signed)
        PyErr_Format(PyExc_ValueError, "%s[%zd] is %lld, not in [0, %s)", name, i, sv, bound);
    else
        PyErr_Format(PyExc_ValueError, "%s[%zd] is %llu, not in [0, %s)", name, i, uv, bound);
    return -1;
}

/* heads (width 8) or pos (width 4): n ints in [0, 2**(8 * width)), from a 1-D integer
 * array (read in place when it is already that, contiguous and aligned) or a sequence. */
static int col_get(PyObject *obj, const char *name, Py_ssize_t n, int width, arg_t *a) {
    memset(a, 0, sizeof *a);
    a->n = n;  /* ids' n: below PY_SSIZE_T_MAX / 16 */
    uint64_t max = width == 4 ? UINT32_MAX : UINT64_MAX;
    size_t bytes = (size_t)(n ? n : 1) * (size_t)width;
    if (PyObject_CheckBuffer(obj)) {
        if (PyObject_GetBuffer(obj, &a->view, PyBUF_RECORDS_RO) < 0) {
            PyErr_Clear();
            PyErr_Format(PyExc_TypeError, "%s must be an integer array or a sequence of ints, "
                         "got %.100s", name, Py_TYPE(obj)->tp_name);
            return -1;
        }
        a->held = 1;
        const Py_buffer *v = &a->view;
        int sgn = 0, size = int_format(v, &sgn);
        if (!size) {
            PyErr_Format(PyExc_TypeError, "%s must have an integer dtype, got buffer format '%s'",
                         name, v->format ? v->format : "B");
            arg_release(a);
            return -1;
        }
        if (v->ndim != 1) {
            shape_error(name, v, "(n,)");
            arg_release(a);
            return -1;
        }
        if (v->shape[0] != n) {
            PyErr_Format(PyExc_ValueError, "%s has %zd entries, ids %zd", name, v->shape[0], n);
            arg_release(a);
            return -1;
        }
        if (n == 0) {
            a->data = NO_ENTRIES;
            return 0;
        }
        if (!sgn && size == width && PyBuffer_IsContiguous(v, 'C') && aligned(v->buf, (size_t)width)) {
            a->data = v->buf;
            return 0;
        }
        void *c = malloc(bytes);
        if (c == NULL) {
            arg_release(a);
            PyErr_NoMemory();
            return -1;
        }
        a->copy = c;
        for (Py_ssize_t i = 0; i < n; i++) {
            const char *p = (const char *)v->buf + i * v->strides[0];
            long long sv = 0;
            unsigned long long uv = 0;
            if (sgn) {
                if (size == 1) { int8_t x; memcpy(&x, p, 1); sv = x; }
                else if (size == 2) { int16_t x; memcpy(&x, p, 2); sv = x; }
                else if (size == 4) { int32_t x; memcpy(&x, p, 4); sv = x; }
                else { int64_t x; memcpy(&x, p, 8); sv = x; }
                if (sv < 0 || (unsigned long long)sv > max) {
                    arg_release(a);
                    return out_of_range(name, i, width, NULL, sv, 0, 1);
                }
                uv = (unsigned long long)sv;
            } else {
                if (size == 1) { uint8_t x; memcpy(&x, p, 1); uv = x; }
                else if (size == 2) { uint16_t x; memcpy(&x, p, 2); uv = x; }
                else if (size == 4) { uint32_t x; memcpy(&x, p, 4); uv = x; }
                else { uint64_t x; memcpy(&x, p, 8); uv = x; }
                if (uv > max) {
                    arg_release(a);
                    return out_of_range(name, i, width, NULL, 0, uv, 0);
                }
            }
            if (width == 4) ((uint32_t *)c)[i] = (uint32_t)uv;
            else ((uint64_t *)c)[i] = (uint64_t)uv;
        }
        a->data = c;
        return 0;
    }
    if (!PySequence_Check(obj) || PyUnicode_Check(obj)) {
        PyErr_Format(PyExc_TypeError, "%s must be an integer array or a sequence of ints, "
                     "got %.100s", name, Py_TYPE(obj)->tp_name);
        return -1;
    }
    PyObject *seq = PySequence_Fast(obj, "not a sequence");
    if (seq == NULL) return -1;
    Py_ssize_t m = PySequence_Fast_GET_SIZE(seq);
    if (m != n) {
        PyErr_Format(PyExc_ValueError, "%s has %zd entries, ids %zd", name, m, n);
        Py_DECREF(seq);
        return -1;
    }
    void *c = malloc(bytes);
    if (c == NULL) {
        Py_DECREF(seq);
        PyErr_NoMemory();
        return -1;
    }
    a->copy = c;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *item = PySequence_Fast_GET_ITEM(seq, i);
        PyObject *v = PyNumber_Index(item);
        if (v == NULL) {
            PyErr_Format(PyExc_TypeError, "%s[%zd] must be an int, got %.100s", name, i,
                         Py_TYPE(item)->tp_name);
            Py_DECREF(seq);
            arg_release(a);
            return -1;
        }
        unsigned long long uv = PyLong_AsUnsignedLongLong(v);
        if ((uv == (unsigned long long)-1 && PyErr_Occurred()) || uv > max) {
            PyErr_Clear();
            out_of_range(name, i, width, v, 0, 0, 0);
            Py_DECREF(v);
            Py_DECREF(seq);
            arg_release(a);
            return -1;
        }
        Py_DECREF(v);
        if (width == 4) ((uint32_t *)c)[i] = (uint32_t)uv;
        else ((uint64_t *)c)[i] = (uint64_t)uv;
    }
    Py_DECREF(seq);
    a->data = c;
    return 0;
}

/* An int argument in [lo, 2**64); on error an exception naming it. */
static int get_u64_value(PyObject *obj, const char *name, uint64_t lo, uint64_t *out) {
    PyObject *v = PyNumber_Index(obj);
    if (v == NULL) {
        PyErr_Format(PyExc_TypeError, "%s must be an int, got %.100s", name, Py_TYPE(obj)->tp_name);
        return -1;
    }
    int overflow = 0;
    long long s = PyLong_AsLongLongAndOverflow(v, &overflow);
    unsigned long long u = 0;
    if (!overflow && s >= 0) {
        u = (unsigned long long)s;
    } else if (overflow > 0) {
        u = PyLong_AsUnsignedLongLong(v);
        if (u == (unsigned long long)-1 && PyErr_Occurred()) {
            PyErr_Clear();
            PyErr_Format(PyExc_ValueError, "%s %S must be below 2**64", name, v);
            Py_DECREF(v);
            return -1;
        }
    }
    if ((overflow < 0 || (!overflow && s < 0)) || u < lo) {
        PyErr_Format(PyExc_ValueError, "%s %S must be >= %llu", name, v, (unsigned long long)lo);
        Py_DECREF(v);
        return -1;
    }
    Py_DECREF(v);
    *out = (uint64_t)u;
    return 0;
}

/* -- the type ----------------------------------------------------------------------- */

typedef struct {
    PyObject_HEAD
    bm_map *map;
    PyThread_type_lock lock;
} MapObject;

static void map_lock(MapObject *self) {
    if (!PyThread_acquire_lock(self->lock, NOWAIT_LOCK)) {
        Py_BEGIN_ALLOW_THREADS
        PyThread_acquire_lock(self->lock, WAIT_LOCK);
        Py_END_ALLOW_THREADS
    }
}

static void map_unlock(MapObject *self) { PyThread_release_lock(self->lock); }

/* `stmt` with the GIL released when `heavy` (the map's lock held by the caller). */
#define RUN(heavy, stmt)                 \
    do {                                 \
        if (heavy) {                     \
            Py_BEGIN_ALLOW_THREADS stmt; \
            Py_END_ALLOW_THREADS         \
        } else {                         \
            stmt;                        \
        }                                \
    } while (0)

static size_t sat_add(size_t a, size_t b) { return a > SIZE_MAX - b ? SIZE_MAX : a + b; }

/* Entries an eviction may touch: all frozen ones, when the batch's bytes may tip the map
 * over its budget. */
static size_t evict_work(const bm_map *m, size_t n, uint64_t bytes_each) {
    uint64_t grow = (uint64_t)n > UINT64_MAX / bytes_each ? UINT64_MAX : (uint64_t)n * bytes_each;
    uint64_t nb = bm_nbytes(m);
    return nb > bm_budget(m) || grow > bm_budget(m) - nb ? bm_len(m) : 0;
}

/* A freeze's entries when the young generation may reach its size. */
static size_t freeze_work(const bm_map *m, size_t n) {
    size_t young = sat_add(bm_young_len(m), n);
    return (uint64_t)young >= bm_generation(m) ? young : 0;
}

static size_t search_work(const bm_map *m, size_t n) {
    size_t per = sat_add(bm_generations(m), 1);
    return n > SIZE_MAX / per ? SIZE_MAX : n * per;
}

static PyObject *map_new(PyTypeObject *type, PyObject *args, PyObject *kwds) {
    static char *kwlist[] = {"budget_bytes", "generation", NULL};
    PyObject *b, *g = NULL;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "O|O:BlockMap", kwlist, &b, &g)) return NULL;
    PyObject *bi = PyNumber_Index(b);
    if (bi == NULL) {
        PyErr_Format(PyExc_TypeError, "budget_bytes must be an int, got %.100s", Py_TYPE(b)->tp_name);
        return NULL;
    }
    PyObject *gi = g != NULL ? PyNumber_Index(g) : PyLong_FromLong(65536);
    if (gi == NULL) {
        PyErr_Format(PyExc_TypeError, "generation must be an int, got %.100s", Py_TYPE(g)->tp_name);
        Py_DECREF(bi);
        return NULL;
    }
    PyObject *zero = PyLong_FromLong(0), *one = PyLong_FromLong(1);
    int bad = zero && one ? PyObject_RichCompareBool(bi, zero, Py_LT) : -1;
    if (bad == 0) bad = PyObject_RichCompareBool(gi, one, Py_LT);
    Py_XDECREF(zero);
    Py_XDECREF(one);
    if (bad > 0)  /* the reference's message */
        PyErr_Format(PyExc_ValueError, "BlockMap: budget_bytes %S and generation %S must be "
                     ">= 0 and >= 1", bi, gi);
    uint64_t budget = 0, generation = 0;
    int rc = bad != 0 ? -1
             : get_u64_value(bi, "budget_bytes", 0, &budget) < 0 ? -1
             : get_u64_value(gi, "generation", 1, &generation);
    Py_DECREF(bi);
    Py_DECREF(gi);
    if (rc < 0) return NULL;
    MapObject *self = (MapObject *)type->tp_alloc(type, 0);
    if (self == NULL) return NULL;
    self->lock = PyThread_allocate_lock();
    self->map = bm_new(budget, generation);
    if (self->lock == NULL || self->map == NULL) {
        Py_DECREF(self);
        return PyErr_NoMemory();
    }
    return (PyObject *)self;
}

static void map_dealloc(MapObject *self) {
    bm_free(self->map);
    if (self->lock != NULL) PyThread_free_lock(self->lock);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static Py_ssize_t map_len(MapObject *self) {
    map_lock(self);
    size_t n = bm_len(self->map);
    map_unlock(self);
    return (Py_ssize_t)n;
}

static PyObject *get_nbytes(MapObject *self, void *closure) {
    (void)closure;
    map_lock(self);
    uint64_t v = bm_nbytes(self->map);
    map_unlock(self);
    return PyLong_FromUnsignedLongLong(v);
}

static PyObject *get_budget(MapObject *self, void *closure) {
    (void)closure;
    map_lock(self);
    uint64_t v = bm_budget(self->map);
    map_unlock(self);
    return PyLong_FromUnsignedLongLong(v);
}

static int set_budget(MapObject *self, PyObject *value, void *closure) {
    (void)closure;
    uint64_t v;
    if (value == NULL) {
        PyErr_SetString(PyExc_AttributeError, "budget_bytes cannot be deleted");
        return -1;
    }
    if (get_u64_value(value, "budget_bytes", 0, &v) < 0) return -1;
    map_lock(self);
    bm_set_budget(self->map, v);
    map_unlock(self);
    return 0;
}

static PyObject *get_generation(MapObject *self, void *closure) {
    (void)closure;
    map_lock(self);
    uint64_t v = bm_generation(self->map);
    map_unlock(self);
    return PyLong_FromUnsignedLongLong(v);
}

static int set_generation(MapObject *self, PyObject *value, void *closure) {
    (void)closure;
    uint64_t v;
    if (value == NULL) {
        PyErr_SetString(PyExc_AttributeError, "generation cannot be deleted");
        return -1;
    }
    if (get_u64_value(value, "generation", 1, &v) < 0) return -1;
    map_lock(self);
    bm_set_generation(self->map, v);  /* v >= 1: accepted */
    map_unlock(self);
    return 0;
}

static PyObject *map_stats(MapObject *self, PyObject *unused) {
    (void)unused;
    bm_stats s;
    map_lock(self);
    bm_get_stats(self->map, &s);
    map_unlock(self);
    return Py_BuildValue("{sKsKsKsKsKsKsKsK}", "entries", (unsigned long long)s.entries,
                         "bytes", (unsigned long long)s.bytes,
                         "budget_bytes", (unsigned long long)s.budget_bytes,
                         "generations", (unsigned long long)s.generations,
                         "hits", (unsigned long long)s.hits,
                         "misses", (unsigned long long)s.misses,
                         "spilled", (unsigned long long)s.spilled,
                         "discarded", (unsigned long long)s.discarded);
}

/* lookup / peek: bm_lookup or bm_peek. */
static PyObject *map_find(MapObject *self, const char *fname, int refresh,
                          PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames) {
    static const char *const names[] = {"ids"};
    PyObject *o[1];
    arg_t ids;
    if (sarp_parse_args(fname, args, nargs, kwnames, names, 1, o) < 0) return NULL;
    if (need_numpy() < 0 || ids_get(o[0], "ids", &ids) < 0) return NULL;
    Py_buffer hv, pv;
    PyObject *heads = new_array(ids.n, 0, dt_u64, &hv);
    PyObject *pos = heads ? new_array(ids.n, 0, dt_i64, &pv) : NULL;
    if (pos == NULL) {
        if (heads != NULL) {
            PyBuffer_Release(&hv);
            Py_DECREF(heads);
        }
        arg_release(&ids);
        return NULL;
    }
    size_t n = (size_t)ids.n;
    int rc;
    map_lock(self);
    bm_map *m = self->map;
    int heavy = sat_add(search_work(m, n), refresh ? freeze_work(m, n) : 0) >= WORK_NOGIL;
    RUN(heavy, rc = (refresh ? bm_lookup : bm_peek)(m, n, ids.data, hv.buf, pv.buf));
    map_unlock(self);
    PyBuffer_Release(&hv);
    PyBuffer_Release(&pv);
    arg_release(&ids);
    if (rc != BM_OK) {
        Py_DECREF(heads);
        Py_DECREF(pos);
        return PyErr_NoMemory();
    }
    return Py_BuildValue("(NN)", heads, pos);
}

static PyObject *map_lookup(MapObject *self, PyObject *const *args, Py_ssize_t nargs,
                            PyObject *kwnames) {
    return map_find(self, "lookup", 1, args, nargs, kwnames);
}

static PyObject *map_peek(MapObject *self, PyObject *const *args, Py_ssize_t nargs,
                          PyObject *kwnames) {
    return map_find(self, "peek", 0, args, nargs, kwnames);
}

enum { ADD, ADD_BULK, LOAD };

/* add, add_bulk and load_arrays once their arguments are converted. */
static PyObject *run_add(MapObject *self, int what, arg_t *ids, arg_t *heads, arg_t *pos) {
    size_t n = (size_t)ids->n;
    bm_spill sp = BM_SPILL_INIT;
    int rc;
    map_lock(self);
    bm_map *m = self->map;
    size_t work = what == ADD
        ? sat_add(sat_add(n, freeze_work(m, n)), evict_work(m, n, BM_YOUNG_ENTRY_BYTES))
        : sat_add(sat_add(n, bm_young_len(m)), evict_work(m, n, BM_FROZEN_ENTRY_BYTES));
    int heavy = work >= WORK_NOGIL;
    if (what == ADD)
        RUN(heavy, rc = bm_add(m, n, ids->data, heads->data, pos->data, &sp));
    else if (what == ADD_BULK)
        RUN(heavy, rc = bm_add_bulk(m, n, ids->data, heads->data, pos->data, &sp));
    else
        RUN(heavy, rc = bm_load(m, n, ids->data, heads->data, pos->data, &sp));
    map_unlock(self);
    arg_release(ids);
    arg_release(heads);
    arg_release(pos);
    PyObject *out = rc == BM_OK ? spill_result(&sp) : PyErr_NoMemory();
    bm_spill_free(&sp);
    return out;
}

static int get_entries(PyObject *const *o, const char *const *names, arg_t *ids, arg_t *heads,
                       arg_t *pos) {
    if (ids_get(o[0], names[0], ids) < 0) return -1;
    if (col_get(o[1], names[1], ids->n, 8, heads) < 0) {
        arg_release(ids);
        return -1;
    }
    if (col_get(o[2], names[2], ids->n, 4, pos) < 0) {
        arg_release(ids);
        arg_release(heads);
        return -1;
    }
    return 0;
}

static PyObject *add_entries(MapObject *self, int what, const char *fname, PyObject *const *args,
                             Py_ssize_t nargs, PyObject *kwnames) {
    static const char *const names[] = {"ids", "heads", "pos"};
    PyObject *o[3];
    arg_t ids, heads, pos;
    if (sarp_parse_args(fname, args, nargs, kwnames, names, 3, o) < 0 ||
        get_entries(o, names, &ids, &heads, &pos) < 0)
        return NULL;
    return run_add(self, what, &ids, &heads, &pos);
}

static PyObject *map_add(MapObject *self, PyObject *const *args, Py_ssize_t nargs,
                         PyObject *kwnames) {
    return add_entries(self, ADD, "add", args, nargs, kwnames);
}

static PyObject *map_add_bulk(MapObject *self, PyObject *const *args, Py_ssize_t nargs,
                              PyObject *kwnames) {
    return add_entries(self, ADD_BULK, "add_bulk", args, nargs, kwnames);
}

static PyObject *map_load_arrays(MapObject *self, PyObject *const *args, Py_ssize_t nargs,
                                 PyObject *kwnames) {
    static const char *const names[] = {"arrays"};
    static const char *const fields[] = {"arrays.ids", "arrays.heads", "arrays.pos"};
    PyObject *o[1];
    if (sarp_parse_args("load_arrays", args, nargs, kwnames, names, 1, o) < 0) return NULL;
    PyObject *f[3] = {PyObject_GetAttrString(o[0], "ids"), NULL, NULL};
    if (f[0] != NULL) f[1] = PyObject_GetAttrString(o[0], "heads");
    if (f[1] != NULL) f[2] = PyObject_GetAttrString(o[0], "pos");
    arg_t ids, heads, pos;
    int ok = f[2] != NULL;
    if (!ok && PyErr_ExceptionMatches(PyExc_AttributeError)) {
        PyErr_Clear();
        PyErr_Format(PyExc_TypeError, "arrays must have ids, heads and pos (a MapArrays), "
                     "got %.100s", Py_TYPE(o[0])->tp_name);
    }
    if (ok) ok = get_entries(f, fields, &ids, &heads, &pos) == 0;
    for (int i = 0; i < 3; i++) Py_XDECREF(f[i]);  /* the buffers keep what they read */
    return ok ? run_add(self, LOAD, &ids, &heads, &pos) : NULL;
}

static PyObject *map_discard(MapObject *self, PyObject *const *args, Py_ssize_t nargs,
                             PyObject *kwnames) {
    static const char *const names[] = {"ids"};
    PyObject *o[1];
    arg_t ids;
    if (sarp_parse_args("discard", args, nargs, kwnames, names, 1, o) < 0 ||
        ids_get(o[0], "ids", &ids) < 0)
        return NULL;
    size_t n = (size_t)ids.n;
    map_lock(self);
    bm_map *m = self->map;
    RUN(search_work(m, n) >= WORK_NOGIL, bm_discard(m, n, ids.data));
    map_unlock(self);
    arg_release(&ids);
    Py_RETURN_NONE;
}

static PyObject *map_clear(MapObject *self, PyObject *unused) {
    (void)unused;
    map_lock(self);
    bm_clear(self->map);
    map_unlock(self);
    Py_RETURN_NONE;
}

static PyObject *map_to_arrays(MapObject *self, PyObject *unused) {
    (void)unused;
    if (need_numpy() < 0) return NULL;
    for (;;) {  /* arrays of the size the map has once they exist (another thread...) */
        map_lock(self);
        size_t n = bm_len(self->map);
        map_unlock(self);
        Py_buffer iv, hv, pv;
        PyObject *ids = new_array((Py_ssize_t)n, 1, dt_u64, &iv);
        if (ids == NULL) return NULL;
        PyObject *heads = new_array((Py_ssize_t)n, 0, dt_u64, &hv);
        PyObject *pos = heads ? new_array((Py_ssize_t)n, 0, dt_u32, &pv) : NULL;
        if (pos == NULL) {
            if (heads != NULL) {
                PyBuffer_Release(&hv);
                Py_DECREF(heads);
            }
            PyBuffer_Release(&iv);
            Py_DECREF(ids);
            return NULL;
        }
        map_lock(self);
        bm_map *m = self->map;
        int same = bm_len(m) == n;
        if (same) RUN(n >= WORK_NOGIL, bm_export(m, iv.buf, hv.buf, pv.buf));
        map_unlock(self);
        PyBuffer_Release(&iv);
        PyBuffer_Release(&hv);
        PyBuffer_Release(&pv);
        if (same) return make_result("MapArrays", ids, heads, pos);
        Py_DECREF(ids);
        Py_DECREF(heads);
        Py_DECREF(pos);
    }
}

static PyMethodDef map_methods[] = {
    {"stats", (PyCFunction)map_stats, METH_NOARGS,
     "stats($self, /)\n--\n\nentries, bytes, budget_bytes, generations, hits, misses, spilled, discarded."},
    {"lookup", (PyCFunction)(void (*)(void))map_lookup, METH_FASTCALL | METH_KEYWORDS,
     "lookup($self, /, ids)\n--\n\n(head keys uint64, positions int64) of ids ((n, 2) uint64); position -1: not held "
     "here. A hit in a frozen generation moves to the young one."},
    {"peek", (PyCFunction)(void (*)(void))map_peek, METH_FASTCALL | METH_KEYWORDS,
     "peek($self, /, ids)\n--\n\nlookup's answers, no hit moved (a removal's lookup: its blocks are leaving)."},
    {"add", (PyCFunction)(void (*)(void))map_add, METH_FASTCALL | METH_KEYWORDS,
     "add($self, /, ids, heads, pos)\n--\n\nHold these blocks (a later entry for a block wins); returns the Spill of what had to "
     "go to keep within the budget, or None."},
    {"add_bulk", (PyCFunction)(void (*)(void))map_add_bulk, METH_FASTCALL | METH_KEYWORDS,
     "add_bulk($self, /, ids, heads, pos)\n--\n\nadd of many blocks at once, frozen in generations straight from the arrays."},
    {"discard", (PyCFunction)(void (*)(void))map_discard, METH_FASTCALL | METH_KEYWORDS,
     "discard($self, /, ids)\n--\n\nForget these blocks (no segment holds them any more)."},
    {"clear", (PyCFunction)map_clear, METH_NOARGS,
     "clear($self, /)\n--\n\nDrop every entry (the counts stay)."},
    {"to_arrays", (PyCFunction)map_to_arrays, METH_NOARGS,
     "to_arrays($self, /)\n--\n\nThe live entries, oldest first (a MapArrays)."},
    {"load_arrays", (PyCFunction)(void (*)(void))map_load_arrays, METH_FASTCALL | METH_KEYWORDS,
     "load_arrays($self, /, arrays)\n--\n\nStart from a snapshot's entries (oldest first); returns the Spill of what the budget "
     "cannot hold, or None."},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef map_getset[] = {
    {"nbytes", (getter)get_nbytes, NULL, "The accounted bytes (young entries at 160, frozen at 33).",
     NULL},
    {"budget_bytes", (getter)get_budget, (setter)set_budget, "The byte budget.", NULL},
    {"generation", (getter)get_generation, (setter)set_generation,
     "The young generation's size (entries).", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PySequenceMethods map_as_sequence = {
    .sq_length = (lenfunc)map_len,
};

static PyTypeObject MapType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "sarpd.core._cmap.BlockMap",
    .tp_basicsize = sizeof(MapObject),
    .tp_dealloc = (destructor)map_dealloc,
    .tp_as_sequence = &map_as_sequence,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "BlockMap(budget_bytes, generation=65536)\n--\n\nBlock id -> (head key, position) of "
              "recently stored blocks, in C (sarpd.core.blockmap.BlockMap's twin).",
    .tp_methods = map_methods,
    .tp_getset = map_getset,
    .tp_new = map_new,
};

static PyObject *generation_for(PyObject *self, PyObject *arg) {
    (void)self;
    uint64_t budget;
    if (get_u64_value(arg, "budget_bytes", 0, &budget) < 0) return NULL;
    return PyLong_FromUnsignedLongLong(bm_generation_for(budget));
}

static PyMethodDef methods[] = {
    {"block_map_generation", generation_for, METH_O,
     "block_map_generation($module, budget_bytes, /)\n--\n\nThe young generation's size for a budget: at most a quarter of it, <= 65,536."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT,
    .m_name = "sarpd.core._cmap",
    .m_doc = "The block map in C (sarpd.core.blockmap's twin).",
    .m_size = -1,
    .m_methods = methods,
};

PyMODINIT_FUNC PyInit__cmap(void) {
    if (PyType_Ready(&MapType) < 0) return NULL;
    PyObject *m = PyModule_Create(&module);
    if (m == NULL) return NULL;
    if (PyModule_AddType(m, &MapType) < 0 ||
        PyModule_AddIntConstant(m, "YOUNG_ENTRY_BYTES", BM_YOUNG_ENTRY_BYTES) < 0 ||
        PyModule_AddIntConstant(m, "FROZEN_ENTRY_BYTES", BM_FROZEN_ENTRY_BYTES) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
