/* The routing directory as a Python type: sarpd.core._cdir.Directory, the twin of
 * sarpd.core.directory.Directory (the same constructor, methods, attributes and
 * answers) over the plain C directory of csrc/directory.c, whose top comment is the
 * layout (a native write core may own a dir_t directly, without this type).
 *
 *   Directory(delta_max_entries=65536)
 *   d.probe(keys) -> bool array;  d.posting(key) -> (segs, filts);  d.flat()
 *   d.count(key), d.has(key, seg), d.add(key, seg, filt), d.set_filter(key, seg, filt),
 *   d.drop(key, seg), d.needs_merge(), d.merge(), d.to_arrays(), d.load_arrays(arrays),
 *   d.clear(), d.iter_entries();  d.entries, d.keys_count, d.nbytes, d.version,
 *   d.merges, d.merge_s_max, d.merge_s_total, d.delta_max_entries (settable)
 *
 * Arrays handed out are read-only numpy arrays over the directory's vecs (`_Vec`
 * objects exporting one vec each: a reference to it, so a vec outlives every view of
 * it) exactly where the reference hands out views of its own arrays: the base's
 * arrays (flat, to_arrays) and slices of them (a posting list with no delta rows), a
 * delta row (a posting list of one delta row and no base entries), the delta's rows
 * (flat). Their contents change in place where the reference's would (set_filter,
 * drop), and stop changing where the reference replaces its arrays (delta growth,
 * merge, load): the C directory replaces its vecs at the same moments. Other posting
 * lists are new arrays, as the reference's concatenations are. One numpy array per
 * vec is kept (created on first use: posting slices it), and dropped as soon as its
 * vec is replaced (so a merged-away base is not held by a cache).
 *
 * load_arrays takes the arrays over without a copy when they are writable,
 * C-contiguous, aligned uint64 arrays (as np.require(a, np.uint64, ("C", "W")) would
 * keep them: a snapshot's mapped body), holding their buffers until the base is
 * replaced; read-only ones are copied. Anything else (another dtype, not 1-D, not
 * contiguous, lengths that differ) is a TypeError or ValueError naming the field.
 * Keys and segs are ints in [0, 2**64) (OverflowError naming the argument).
 *
 * Threads: every call runs with the GIL held, except a merge of many entries (merge,
 * drop, to_arrays, iter_entries, load_arrays), which releases it while the directory
 * is marked busy; a call from another thread meanwhile waits for it. No Python code
 * runs while the C directory is in the middle of a change: the base vecs a call may
 * replace are held until it returns (a taken-over buffer's release, which may run
 * Python code, happens then), and results are built from vecs this code holds. */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <pythread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "directory.h"
#include "sarp.h"

#define HEAVY_MERGE ((size_t)1 << 18)  /* entries: a merge this big lets other threads run */

/* -- numpy and the reference's result types, from C ------------------------------- */

static PyObject *np_empty, *np_frombuffer, *dt_u64, *dt_i64, *dt_bool;
static PyObject *empty_u64;  /* a read-only empty uint64 array: every empty posting */
static PyObject *ref_module;  /* sarpd.core.directory: FlatDirectory, DirectoryArrays */

static PyObject *vec_object(dir_vec *v, int sign);

static int need_numpy(void) {
    if (np_empty != NULL) return 0;
    PyObject *np = PyImport_ImportModule("numpy");
    if (np == NULL) return -1;
    PyObject *dtype = PyObject_GetAttrString(np, "dtype");
    PyObject *got[5] = {
        PyObject_GetAttrString(np, "empty"), PyObject_GetAttrString(np, "frombuffer"),
        dtype ? PyObject_CallFunction(dtype, "s", "uint64") : NULL,
        dtype ? PyObject_CallFunction(dtype, "s", "int64") : NULL,
        dtype ? PyObject_CallFunction(dtype, "s", "bool") : NULL,
    };
    Py_DECREF(np);
    Py_XDECREF(dtype);
    int ok = 1;
    for (int i = 0; i < 5; i++) ok &= got[i] != NULL;
    if (!ok || np_empty != NULL) {  /* failed, or another thread got here first */
        for (int i = 0; i < 5; i++) Py_XDECREF(got[i]);
        return ok ? 0 : -1;
    }
    np_empty = got[0];  /* kept for the life of the process, as the module is */
    np_frombuffer = got[1];
    dt_u64 = got[2];
    dt_i64 = got[3];
    dt_bool = got[4];
    dir_vec *none = dir_vec_new(0);
    PyObject *holder = none ? vec_object(none, 0) : PyErr_NoMemory();
    if (none != NULL) dir_vec_unref(none);
    if (holder == NULL) return -1;
    PyObject *args[2] = {holder, dt_u64};
    empty_u64 = PyObject_Vectorcall(np_frombuffer, args, 2, NULL);
    Py_DECREF(holder);
    return empty_u64 == NULL ? -1 : 0;
}

/* sarpd.core.directory.<name>(*args) */
static PyObject *make_result(const char *name, PyObject *const *args, Py_ssize_t n) {
    if (ref_module == NULL && (ref_module = PyImport_ImportModule("sarpd.core.directory")) == NULL)
        return NULL;
    PyObject *cls = PyObject_GetAttrString(ref_module, name);
    if (cls == NULL) return NULL;
    PyObject *out = PyObject_Vectorcall(cls, args, (size_t)n, NULL);
    Py_DECREF(cls);
    return out;
}

/* numpy.empty(n, dtype) and its writable buffer in *view. */
static PyObject *new_array(Py_ssize_t n, PyObject *dt, Py_buffer *view) {
    PyObject *len = PyLong_FromSsize_t(n);
    if (len == NULL) return NULL;
    PyObject *args[2] = {len, dt};
    PyObject *arr = PyObject_Vectorcall(np_empty, args, 2, NULL);
    Py_DECREF(len);
    if (arr != NULL && PyObject_GetBuffer(arr, view, PyBUF_WRITABLE | PyBUF_C_CONTIGUOUS) < 0)
        Py_CLEAR(arr);
    return arr;
}

/* -- _Vec: one vec's items as a read-only buffer (what a numpy view is made over) ---- */

typedef struct {
    PyObject_HEAD
    dir_vec *vec;  /* a reference */
    int sign;      /* int64 items (the order), else uint64 */
    Py_ssize_t shape, stride;
} VecObject;

static void vec_dealloc(VecObject *self) {
    dir_vec_unref(self->vec);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static int vec_getbuffer(VecObject *self, Py_buffer *view, int flags) {
    if (flags & PyBUF_WRITABLE) {
        PyErr_SetString(PyExc_BufferError, "the directory's arrays are read-only");
        view->obj = NULL;
        return -1;
    }
    static char fmt_u[] = "Q", fmt_s[] = "q";
    view->buf = self->vec->data;
    view->obj = Py_NewRef(self);
    view->len = self->shape * (Py_ssize_t)sizeof(uint64_t);
    view->readonly = 1;
    view->itemsize = sizeof(uint64_t);
    view->format = (flags & PyBUF_FORMAT) ? (self->sign ? fmt_s : fmt_u) : NULL;
    view->ndim = 1;
    view->shape = (flags & PyBUF_ND) ? &self->shape : NULL;
    view->strides = (flags & PyBUF_STRIDES) == PyBUF_STRIDES ? &self->stride : NULL;
    view->suboffsets = NULL;
    view->internal = NULL;
    return 0;
}

static PyBufferProcs vec_as_buffer = {.bf_getbuffer = (getbufferproc)vec_getbuffer};

static PyTypeObject VecType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "sarpd.core._cdir._Vec",
    .tp_basicsize = sizeof(VecObject),
    .tp_dealloc = (destructor)vec_dealloc,
    .tp_as_buffer = &vec_as_buffer,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "A directory array's memory (read-only), kept while a view of it lives.",
};

static PyObject *vec_object(dir_vec *v, int sign) {
    VecObject *self = PyObject_New(VecObject, &VecType);
    if (self == NULL) return NULL;
    dir_vec_ref(v);
    self->vec = v;
    self->sign = sign;
    self->shape = (Py_ssize_t)v->len;
    self->stride = sizeof(uint64_t);
    return (PyObject *)self;
}

/* A taken-over buffer: released (with the GIL) when its vec goes. */
static void buffer_release(void *ctx) {
    PyGILState_STATE g = PyGILState_Ensure();
    PyBuffer_Release((Py_buffer *)ctx);
    PyGILState_Release(g);
    free(ctx);
}

/* -- the type ----------------------------------------------------------------------- */

enum { C_BKEYS, C_BSEGS, C_BFILTS, C_DKEYS, C_DSEGS, C_DFILTS, C_ORDER, C_KF, NCACHE };

typedef struct {
    PyObject_HEAD
    dir_t *dir;
    PyThread_type_lock lock;  /* held while busy */
    int busy;                 /* a merge runs without the GIL */
    unsigned long owner;      /* the thread running it */
    PyObject *cache[NCACHE];  /* a numpy array over each vec in use (or NULL) */
    dir_vec *cached[NCACHE];  /* the vec each was made over (held by it) */
    PyObject *flat;           /* the last flat() answer (or NULL), while its version is */
    uint64_t flat_version;    /* the directory's: the same arrays, the same contents */
} DirObject;

/* Wait until no merge runs (another thread's); -1 (RuntimeError) from that merge's
 * own thread. */
static int wait_idle(DirObject *self) {
    while (self->busy) {
        if (self->owner == PyThread_get_thread_ident()) {
            PyErr_SetString(PyExc_RuntimeError, "Directory used during its own merge");
            return -1;
        }
        Py_BEGIN_ALLOW_THREADS
        PyThread_acquire_lock(self->lock, WAIT_LOCK);
        PyThread_release_lock(self->lock);
        Py_END_ALLOW_THREADS
    }
    return 0;
}

#define IDLE_OR(fail)                                     \
    do {                                                  \
        if (self->busy && wait_idle(self) < 0) return fail; \
    } while (0)

/* The numpy array over all of `v` (kept in cache slot `slot`): a new reference. */
static PyObject *vec_array(DirObject *self, int slot, dir_vec *v) {
    if (self->cached[slot] == v && self->cache[slot] != NULL) return Py_NewRef(self->cache[slot]);
    PyObject *holder = vec_object(v, slot == C_ORDER);
    if (holder == NULL) return NULL;
    PyObject *args[2] = {holder, slot == C_ORDER ? dt_i64 : dt_u64};
    PyObject *arr = PyObject_Vectorcall(np_frombuffer, args, 2, NULL);
    Py_DECREF(holder);
    if (arr == NULL) return NULL;
    self->cached[slot] = v;
    Py_XSETREF(self->cache[slot], Py_NewRef(arr));
    return arr;
}

/* Arrays over vecs the directory no longer uses, dropped (not held by a cache). */
static void drop_stale(DirObject *self) {
    dir_part b, dl;
    dir_base(self->dir, &b);
    dir_delta(self->dir, &dl);
    dir_vec *now[NCACHE] = {b.keys, b.segs, b.filts, dl.keys, dl.segs, dl.filts,
                            dir_order_now(self->dir), dir_keyfilter_now(self->dir)};
    PyObject *gone[NCACHE + 1];
    int ngone = 0;
    if (self->flat != NULL && self->flat_version != dir_version(self->dir)) {
        gone[ngone++] = self->flat;  /* it holds what the directory no longer uses */
        self->flat = NULL;
    }
    for (int i = 0; i < NCACHE; i++) {
        if (self->cache[i] != NULL && self->cached[i] != now[i]) {
            gone[ngone++] = self->cache[i];
            self->cache[i] = NULL;
            self->cached[i] = NULL;
        }
    }
    for (int i = 0; i < ngone; i++) Py_DECREF(gone[i]);  /* the state is consistent first */
}

/* A Python int argument in [0, 2**64) (anything with __index__: numpy's too). */
static int get_u64(PyObject *obj, const char *name, uint64_t *out) {
    if (PyLong_CheckExact(obj)) return sarp_get_uint64_arg(obj, name, out);
    PyObject *v = PyNumber_Index(obj);
    if (v == NULL) {
        PyErr_Format(PyExc_TypeError, "%s must be an int, got %.100s", name, Py_TYPE(obj)->tp_name);
        return -1;
    }
    int rc = sarp_get_uint64_arg(v, name, out);
    Py_DECREF(v);
    return rc;
}

/* The uint64 arguments (key, seg, filt)[:count] of a method. */
static int get_ids(const char *fname, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames,
                   Py_ssize_t count, uint64_t *out) {
    static const char *const names[] = {"key", "seg", "filt"};
    PyObject *o[3];
    if (kwnames == NULL && nargs == count) {
        for (Py_ssize_t i = 0; i < count; i++) o[i] = args[i];
    } else if (sarp_parse_args(fname, args, nargs, kwnames, names, count, o) < 0) {
        return -1;
    }
    for (Py_ssize_t i = 0; i < count; i++)
        if (get_u64(o[i], names[i], &out[i]) < 0) return -1;
    return 0;
}

#define IDS(fname, count, v)                                                 \
    uint64_t v[3];                                                           \
    if (get_ids(fname, args, nargs, kwnames, count, v) < 0) return NULL;     \
    IDLE_OR(NULL)

#define FASTCALL PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames

/* -- creation ------------------------------------------------------------------------ */

static PyObject *d_new(PyTypeObject *type, PyObject *args, PyObject *kwds) {
    static char *kwlist[] = {"delta_max_entries", NULL};
    PyObject *o = NULL;
    long long dme = 65536;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "|O:Directory", kwlist, &o)) return NULL;
    if (o != NULL) {
        PyObject *v = PyNumber_Index(o);
        if (v == NULL) {
            PyErr_Format(PyExc_TypeError, "delta_max_entries must be an int, got %.100s",
                         Py_TYPE(o)->tp_name);
            return NULL;
        }
        dme = PyLong_AsLongLong(v);
        Py_DECREF(v);
        if (dme == -1 && PyErr_Occurred()) {
            PyErr_Format(PyExc_OverflowError, "delta_max_entries must be in [-2**63, 2**63)");
            return NULL;
        }
    }
    if (need_numpy() < 0) return NULL;
    DirObject *self = (DirObject *)type->tp_alloc(type, 0);
    if (self == NULL) return NULL;
    self->lock = PyThread_allocate_lock();
    self->dir = dir_new(dme);
    if (self->lock == NULL || self->dir == NULL) {
        Py_DECREF(self);
        return PyErr_NoMemory();
    }
    return (PyObject *)self;
}

static void d_dealloc(DirObject *self) {
    for (int i = 0; i < NCACHE; i++) Py_CLEAR(self->cache[i]);
    Py_CLEAR(self->flat);
    dir_free(self->dir);
    if (self->lock != NULL) PyThread_free_lock(self->lock);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

/* -- reading --------------------------------------------------------------------------- */

static PyObject *d_probe(DirObject *self, FASTCALL) {
    static const char *const names[] = {"keys"};
    PyObject *o[1];
    if (sarp_parse_args("probe", args, nargs, kwnames, names, 1, o) < 0) return NULL;
    Py_buffer kv, hv;
    if (sarp_get_u64_1d(o[0], "keys", &kv) < 0) return NULL;
    Py_ssize_t n = kv.shape[0];
    const uint64_t *keys = kv.buf;
    uint64_t *copy = NULL;
    if (((uintptr_t)kv.buf & (sizeof(uint64_t) - 1)) && n) {  /* read aligned */
        if ((copy = malloc((size_t)n * sizeof(uint64_t))) == NULL) {
            PyBuffer_Release(&kv);
            return PyErr_NoMemory();
        }
        memcpy(copy, kv.buf, (size_t)n * sizeof(uint64_t));
        keys = copy;
    }
    PyObject *hit = new_array(n, dt_bool, &hv);
    if (hit != NULL && self->busy && wait_idle(self) < 0) {
        PyBuffer_Release(&hv);
        Py_CLEAR(hit);
    }
    if (hit != NULL) {
        dir_probe(self->dir, (size_t)n, keys, hv.buf);
        PyBuffer_Release(&hv);
    }
    free(copy);
    PyBuffer_Release(&kv);
    return hit;
}

/* A posting list that is a view: the base slice (no delta rows) or one delta row. */
static PyObject *posting_view(DirObject *self, const dir_where *w) {
    dir_part p;
    int base = !w->rows;
    if (base)
        dir_base(self->dir, &p);
    else
        dir_delta(self->dir, &p);
    Py_ssize_t lo = (Py_ssize_t)(base ? w->lo : w->first), hi = base ? (Py_ssize_t)w->hi : lo + 1;
    dir_vec *segs = p.segs, *filts = p.filts;
    dir_vec_ref(segs);  /* alive across the Python calls below */
    dir_vec_ref(filts);
    PyObject *sa = vec_array(self, base ? C_BSEGS : C_DSEGS, segs), *s = NULL, *f = NULL;
    if (sa != NULL) s = PySequence_GetSlice(sa, lo, hi);
    Py_XDECREF(sa);
    PyObject *fa = s != NULL ? vec_array(self, base ? C_BFILTS : C_DFILTS, filts) : NULL;
    if (fa != NULL) f = PySequence_GetSlice(fa, lo, hi);
    Py_XDECREF(fa);
    dir_vec_unref(segs);
    dir_vec_unref(filts);
    if (f == NULL) {
        Py_XDECREF(s);
        return NULL;
    }
    PyObject *out = PyTuple_New(2);
    if (out == NULL) {
        Py_DECREF(s);
        Py_DECREF(f);
        return NULL;
    }
    PyTuple_SET_ITEM(out, 0, s);
    PyTuple_SET_ITEM(out, 1, f);
    return out;
}

/* A posting list of the base slice and delta rows, or of several rows: new arrays. */
static PyObject *posting_copy(DirObject *self, uint64_t key, size_t n) {
    for (;;) {  /* the arrays first, then the list of the size they have */
        Py_buffer sv, fv;
        PyObject *s = new_array((Py_ssize_t)n, dt_u64, &sv);
        if (s == NULL) return NULL;
        PyObject *f = new_array((Py_ssize_t)n, dt_u64, &fv);
        if (f == NULL) {
            PyBuffer_Release(&sv);
            Py_DECREF(s);
            return NULL;
        }
        int ok = !self->busy || wait_idle(self) == 0;
        dir_where w;
        size_t now = n;
        if (ok) {
            dir_where_is(self->dir, key, &w);
            now = w.hi - w.lo + w.rows;
            if (now == n) dir_posting(self->dir, &w, sv.buf, fv.buf);
        }
        PyBuffer_Release(&sv);
        PyBuffer_Release(&fv);
        if (ok && now == n) return Py_BuildValue("(NN)", s, f);
        Py_DECREF(s);
        Py_DECREF(f);
        if (!ok) return NULL;
        n = now;
    }
}

static PyObject *d_posting(DirObject *self, FASTCALL) {
    IDS("posting", 1, v);
    dir_where w;
    dir_where_is(self->dir, v[0], &w);
    size_t nb = w.hi - w.lo;
    if (!w.rows && !nb) return PyTuple_Pack(2, empty_u64, empty_u64);
    if (!w.rows || (w.rows == 1 && !nb)) return posting_view(self, &w);
    return posting_copy(self, v[0], nb + w.rows);
}

static PyObject *d_count(DirObject *self, FASTCALL) {
    IDS("count", 1, v);
    return PyLong_FromSize_t(dir_count(self->dir, v[0]));
}

static PyObject *d_has(DirObject *self, FASTCALL) {
    IDS("has", 2, v);
    return PyBool_FromLong(dir_has(self->dir, v[0], v[1]));
}

static PyObject *d_needs_merge(DirObject *self, PyObject *unused) {
    (void)unused;
    IDLE_OR(NULL);
    return PyBool_FromLong(dir_needs_merge(self->dir));
}

/* The base's three arrays (views), held across their creation. */
static int base_arrays(DirObject *self, PyObject **out) {
    dir_part b;
    dir_base(self->dir, &b);
    dir_vec *v[3] = {b.keys, b.segs, b.filts};
    for (int i = 0; i < 3; i++) dir_vec_ref(v[i]);
    int ok = 1;
    for (int i = 0; i < 3; i++) {
        out[i] = ok ? vec_array(self, C_BKEYS + i, v[i]) : NULL;
        ok &= out[i] != NULL;
    }
    for (int i = 0; i < 3; i++) dir_vec_unref(v[i]);
    if (!ok)
        for (int i = 0; i < 3; i++) Py_CLEAR(out[i]);
    return ok ? 0 : -1;
}

static PyObject *d_flat(DirObject *self, PyObject *unused) {
    (void)unused;
    IDLE_OR(NULL);
    if (self->flat != NULL && self->flat_version == dir_version(self->dir))
        return Py_NewRef(self->flat);  /* unchanged since: the same answer */
    dir_vec *order;
    if (dir_order(self->dir, &order) != DIR_OK) return PyErr_NoMemory();
    dir_part dl;
    dir_delta(self->dir, &dl);
    dir_vec *v[4] = {dl.keys, dl.segs, dl.filts, order};
    for (int i = 0; i < 4; i++) dir_vec_ref(v[i]);
    PyObject *out[NCACHE] = {NULL};
    int ok = base_arrays(self, out) == 0;
    for (int i = 0; i < 4 && ok; i++) {
        PyObject *whole = vec_array(self, C_DKEYS + i, v[i]);
        out[C_DKEYS + i] = whole && i < 3 ? PySequence_GetSlice(whole, 0, (Py_ssize_t)dl.n) : whole;
        if (i < 3) Py_XDECREF(whole);
        ok = out[C_DKEYS + i] != NULL;
    }
    for (int i = 0; i < 4; i++) dir_vec_unref(v[i]);
    dir_vec *kf = ok ? dir_keyfilter(self->dir) : NULL;  /* NULL: no memory, no filter */
    if (ok) {
        out[C_KF] = kf != NULL ? vec_array(self, C_KF, kf) : Py_NewRef(empty_u64);
        ok = out[C_KF] != NULL;
    }
    PyObject *res = ok ? make_result("FlatDirectory", out, NCACHE) : NULL;
    for (int i = 0; i < NCACHE; i++) Py_XDECREF(out[i]);
    if (res != NULL) {
        Py_XSETREF(self->flat, Py_NewRef(res));
        self->flat_version = dir_version(self->dir);
    }
    return res;
}

/* -- writing --------------------------------------------------------------------------- */

static PyObject *d_add(DirObject *self, FASTCALL) {
    IDS("add", 3, v);
    if (dir_add(self->dir, v[0], v[1], v[2]) != DIR_OK) return PyErr_NoMemory();
    drop_stale(self);  /* the delta's vecs, when it grew */
    Py_RETURN_NONE;
}

static PyObject *d_set_filter(DirObject *self, FASTCALL) {
    IDS("set_filter", 3, v);
    int found;
    dir_set_filter(self->dir, v[0], v[1], v[2], &found);
    return PyBool_FromLong(found);
}

enum { OP_MERGE, OP_DROP, OP_LOAD, OP_CLEAR };

typedef struct {
    int what;
    uint64_t key, seg;      /* OP_DROP */
    int found;              /* OP_DROP's answer */
    dir_vec *vecs[3];       /* OP_LOAD */
} op_t;

static int run_op(dir_t *d, op_t *op) {
    switch (op->what) {
    case OP_DROP: return dir_drop(d, op->key, op->seg, &op->found);
    case OP_LOAD: return dir_load(d, op->vecs[0], op->vecs[1], op->vecs[2]);
    case OP_CLEAR: return dir_clear(d);
    default: return dir_merge(d);
    }
}

/* A change that may replace the base, the directory idle: a big merge runs without
 * the GIL (busy); the old base is held until the directory is consistent and the
 * caches dropped (its release may run Python code). -1: MemoryError set. */
static int change(DirObject *self, op_t *op) {
    dir_part b;
    dir_base(self->dir, &b);
    dir_vec *old[3] = {b.keys, b.segs, b.filts};
    for (int i = 0; i < 3; i++) dir_vec_ref(old[i]);
    int rc;
    if ((op->what == OP_MERGE || op->what == OP_DROP) && dir_merge_work(self->dir) >= HEAVY_MERGE) {
        if (!PyThread_acquire_lock(self->lock, NOWAIT_LOCK)) {  /* a waiter has it briefly */
            Py_BEGIN_ALLOW_THREADS
            PyThread_acquire_lock(self->lock, WAIT_LOCK);
            Py_END_ALLOW_THREADS
        }
        self->busy = 1;
        self->owner = PyThread_get_thread_ident();
        Py_BEGIN_ALLOW_THREADS
        rc = run_op(self->dir, op);
        Py_END_ALLOW_THREADS
        self->busy = 0;
        self->owner = 0;
        PyThread_release_lock(self->lock);
    } else {
        rc = run_op(self->dir, op);
    }
    drop_stale(self);
    for (int i = 0; i < 3; i++) dir_vec_unref(old[i]);
    if (rc == DIR_OK) return 0;
    PyErr_NoMemory();
    return -1;
}

static PyObject *d_drop(DirObject *self, FASTCALL) {
    IDS("drop", 2, v);
    op_t op = {.what = OP_DROP, .key = v[0], .seg = v[1]};
    if (change(self, &op) < 0) return NULL;
    return PyBool_FromLong(op.found);
}

static PyObject *d_merge(DirObject *self, PyObject *unused) {
    (void)unused;
    IDLE_OR(NULL);
    op_t op = {.what = OP_MERGE};
    if (change(self, &op) < 0) return NULL;
    Py_RETURN_NONE;
}

static PyObject *d_to_arrays(DirObject *self, PyObject *unused) {
    (void)unused;
    IDLE_OR(NULL);
    op_t op = {.what = OP_MERGE};
    PyObject *out[3];
    if (change(self, &op) < 0 || base_arrays(self, out) < 0) return NULL;
    PyObject *res = make_result("DirectoryArrays", out, 3);
    for (int i = 0; i < 3; i++) Py_DECREF(out[i]);
    return res;
}

/* arrays.<field> as a vec: the caller's buffer taken over when it is writable,
 * C-contiguous and aligned uint64, else copied; a 1-D C-contiguous uint64 array in
 * any case (TypeError, ValueError naming the field). */
static dir_vec *take_field(PyObject *arrays, const char *field, const char *name) {
    PyObject *obj = PyObject_GetAttrString(arrays, field);
    if (obj == NULL) {
        if (PyErr_ExceptionMatches(PyExc_AttributeError)) {
            PyErr_Clear();
            PyErr_Format(PyExc_TypeError, "arrays must have keys, segs and filts (a "
                         "DirectoryArrays), got %.100s", Py_TYPE(arrays)->tp_name);
        }
        return NULL;
    }
    Py_buffer *view = malloc(sizeof *view);
    if (view == NULL) {
        Py_DECREF(obj);
        return (dir_vec *)PyErr_NoMemory();
    }
    dir_vec *v = NULL;
    if (sarp_get_u64_1d(obj, name, view) < 0) {
        free(view);
    } else if (!view->readonly && ((uintptr_t)view->buf & (sizeof(uint64_t) - 1)) == 0 &&
               view->shape[0] > 0) {
        Py_buffer w;  /* to write into it: ask for it as writable */
        if (PyObject_GetBuffer(obj, &w, PyBUF_WRITABLE | PyBUF_C_CONTIGUOUS | PyBUF_FORMAT) == 0) {
            PyBuffer_Release(view);
            *view = w;
            v = dir_vec_wrap(view->buf, (size_t)view->shape[0], buffer_release, view);
            if (v == NULL) PyErr_NoMemory();  /* the buffer was released */
        } else {
            PyErr_Clear();
        }
    }
    if (v == NULL && !PyErr_Occurred()) {  /* read-only, unaligned or empty: a copy */
        size_t n = (size_t)view->shape[0];
        if ((v = dir_vec_new(n)) == NULL)
            PyErr_NoMemory();
        else if (n)
            memcpy(v->data, view->buf, n * sizeof(uint64_t));
        PyBuffer_Release(view);
        free(view);
    }
    Py_DECREF(obj);
    return v;
}

static PyObject *d_load_arrays(DirObject *self, FASTCALL) {
    static const char *const names[] = {"arrays"};
    static const char *const fields[] = {"keys", "segs", "filts"};
    static const char *const full[] = {"arrays.keys", "arrays.segs", "arrays.filts"};
    PyObject *o[1];
    if (sarp_parse_args("load_arrays", args, nargs, kwnames, names, 1, o) < 0) return NULL;
    op_t op = {.what = OP_LOAD};
    int ok = 1;
    for (int i = 0; i < 3; i++) {
        op.vecs[i] = ok ? take_field(o[0], fields[i], full[i]) : NULL;
        ok &= op.vecs[i] != NULL;
    }
    if (ok && (op.vecs[1]->len != op.vecs[0]->len || op.vecs[2]->len != op.vecs[0]->len)) {
        PyErr_Format(PyExc_ValueError, "arrays.keys, segs and filts must have one length, "
                     "got %zu, %zu and %zu", op.vecs[0]->len, op.vecs[1]->len, op.vecs[2]->len);
        ok = 0;
    }
    ok = ok && (!self->busy || wait_idle(self) == 0) && change(self, &op) == 0;
    for (int i = 0; i < 3; i++) dir_vec_unref(op.vecs[i]);  /* the directory holds them */
    if (!ok) return NULL;
    Py_RETURN_NONE;
}

static PyObject *d_clear(DirObject *self, PyObject *unused) {
    (void)unused;
    IDLE_OR(NULL);
    op_t op = {.what = OP_CLEAR};
    if (change(self, &op) < 0) return NULL;
    Py_RETURN_NONE;
}

static PyObject *d_iter_entries(DirObject *self, PyObject *unused) {
    (void)unused;
    IDLE_OR(NULL);
    op_t op = {.what = OP_MERGE};
    if (change(self, &op) < 0) return NULL;
    dir_part b;
    dir_base(self->dir, &b);
    dir_vec *v[3] = {b.keys, b.segs, b.filts};
    for (int i = 0; i < 3; i++) dir_vec_ref(v[i]);  /* read after Python calls */
    size_t live = 0;
    for (size_t i = 0; i < b.n; i++) live += b.segs->data[i] != DIR_DEAD;
    PyObject *out = PyList_New((Py_ssize_t)live);
    for (size_t i = 0, w = 0; out != NULL && i < b.n; i++) {
        if (b.segs->data[i] == DIR_DEAD) continue;
        PyObject *t = Py_BuildValue("(KKK)", (unsigned long long)b.keys->data[i],
                                    (unsigned long long)b.segs->data[i],
                                    (unsigned long long)b.filts->data[i]);
        if (t == NULL) Py_CLEAR(out);
        else PyList_SET_ITEM(out, (Py_ssize_t)w++, t);
    }
    for (int i = 0; i < 3; i++) dir_vec_unref(v[i]);
    return out;
}

/* -- attributes -------------------------------------------------------------------------- */

#define GETTER(name, expr)                                           \
    static PyObject *get_##name(DirObject *self, void *closure) {    \
        (void)closure;                                               \
        IDLE_OR(NULL);                                               \
        return expr;                                                 \
    }

GETTER(entries, PyLong_FromSize_t(dir_entries(self->dir)))
GETTER(keys_count, PyLong_FromSize_t(dir_keys_count(self->dir)))
GETTER(nbytes, PyLong_FromSize_t(dir_nbytes(self->dir)))
GETTER(version, PyLong_FromUnsignedLongLong(dir_version(self->dir)))
GETTER(merges, PyLong_FromUnsignedLongLong(dir_merges(self->dir)))
GETTER(merge_s_max, PyFloat_FromDouble(dir_merge_s_max(self->dir)))
GETTER(merge_s_total, PyFloat_FromDouble(dir_merge_s_total(self->dir)))
GETTER(delta_max_entries, PyLong_FromLongLong(dir_delta_max(self->dir)))

static int set_delta_max_entries(DirObject *self, PyObject *value, void *closure) {
    (void)closure;
    if (value == NULL) {
        PyErr_SetString(PyExc_AttributeError, "delta_max_entries cannot be deleted");
        return -1;
    }
    PyObject *v = PyNumber_Index(value);
    if (v == NULL) {
        PyErr_Format(PyExc_TypeError, "delta_max_entries must be an int, got %.100s",
                     Py_TYPE(value)->tp_name);
        return -1;
    }
    long long dme = PyLong_AsLongLong(v);
    Py_DECREF(v);
    if (dme == -1 && PyErr_Occurred()) {
        PyErr_Format(PyExc_OverflowError, "delta_max_entries must be in [-2**63, 2**63)");
        return -1;
    }
    IDLE_OR(-1);
    dir_set_delta_max(self->dir, dme);
    return 0;
}

#define FAST(f) (PyCFunction)(void (*)(void))(f), METH_FASTCALL | METH_KEYWORDS

static PyMethodDef d_methods[] = {
    {"probe", FAST(d_probe), "probe($self, /, keys)\n--\n\nFor each key (a 1-D C-contiguous "
     "uint64 array): is it in the directory? A bool array."},
    {"posting", FAST(d_posting), "posting($self, /, key)\n--\n\n(segs, filters) of key: its "
     "base entries, then its delta rows in insertion order."},
    {"flat", (PyCFunction)d_flat, METH_NOARGS, "flat($self, /)\n--\n\nThe base and the delta "
     "as flat read-only arrays (a FlatDirectory: the match kernel's input)."},
    {"count", FAST(d_count), "count($self, /, key)\n--\n\nThe length of key's posting list."},
    {"has", FAST(d_has), "has($self, /, key, seg)\n--\n\nWhether seg is listed under key."},
    {"add", FAST(d_add), "add($self, /, key, seg, filt)\n--\n\nList seg under key (a delta row)."},
    {"set_filter", FAST(d_set_filter), "set_filter($self, /, key, seg, filt)\n--\n\nSet the "
     "filter of every (key, seg) entry; False if there is none."},
    {"drop", FAST(d_drop), "drop($self, /, key, seg)\n--\n\nMark (key, seg) dead and merge. "
     "True if it was there."},
    {"needs_merge", (PyCFunction)d_needs_merge, METH_NOARGS,
     "needs_merge($self, /)\n--\n\nWhether the delta holds more than delta_max_entries rows."},
    {"merge", (PyCFunction)d_merge, METH_NOARGS, "merge($self, /)\n--\n\nFold the delta into "
     "a new sorted base, dropping dead entries (timed)."},
    {"to_arrays", (PyCFunction)d_to_arrays, METH_NOARGS, "to_arrays($self, /)\n--\n\nMerge, "
     "then the base (a DirectoryArrays of read-only arrays)."},
    {"load_arrays", FAST(d_load_arrays), "load_arrays($self, /, arrays)\n--\n\nMake arrays "
     "the base (taken over when writable, contiguous uint64; else copied)."},
    {"clear", (PyCFunction)d_clear, METH_NOARGS, "clear($self, /)\n--\n\nAn empty directory."},
    {"iter_entries", (PyCFunction)d_iter_entries, METH_NOARGS, "iter_entries($self, /)\n--\n\n"
     "Every live entry (key, seg, filt), after a merge (for `check`)."},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef d_getset[] = {
    {"entries", (getter)get_entries, NULL, "Live entries (base and delta).", NULL},
    {"keys_count", (getter)get_keys_count, NULL, "Distinct routing keys.", NULL},
    {"nbytes", (getter)get_nbytes, NULL, "The memory the directory holds.", NULL},
    {"version", (getter)get_version, NULL, "Bumped by every change a posting reader sees.", NULL},
    {"merges", (getter)get_merges, NULL, "Merges that folded a delta in.", NULL},
    {"merge_s_max", (getter)get_merge_s_max, NULL, "The longest merge (s).", NULL},
    {"merge_s_total", (getter)get_merge_s_total, NULL, "All merges (s).", NULL},
    {"delta_max_entries", (getter)get_delta_max_entries, (setter)set_delta_max_entries,
     "The delta is merged past this many rows.", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyTypeObject DirType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "sarpd.core._cdir.Directory",
    .tp_basicsize = sizeof(DirObject),
    .tp_dealloc = (destructor)d_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "Directory(delta_max_entries=65536)\n--\n\nRouting key -> posting list of "
              "(segment, filter), in C (sarpd.core.directory.Directory's twin).",
    .tp_methods = d_methods,
    .tp_getset = d_getset,
    .tp_new = d_new,
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT,
    .m_name = "sarpd.core._cdir",
    .m_doc = "The routing directory in C (sarpd.core.directory's twin).",
    .m_size = -1,
};

PyMODINIT_FUNC PyInit__cdir(void) {
    if (PyType_Ready(&VecType) < 0 || PyType_Ready(&DirType) < 0) return NULL;
    PyObject *m = PyModule_Create(&module);
    if (m == NULL) return NULL;
    if (PyModule_AddType(m, &DirType) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
