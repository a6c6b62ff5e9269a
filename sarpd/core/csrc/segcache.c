/* The decoded-segment cache in C (layout: segcache.h; reference and semantics:
 * sarpd/core/segcache.py). */

#include "segcache.h"

#include <stdlib.h>
#include <string.h>

#include "sarp.h"
#include "segment.h"

#define SC_GOLDEN 0x9E3779B97F4A7C15ULL
#define SC_MAX_ENTRIES (INT32_MAX / 4)
#define SC_GIL_FREE_BYTES (64 * 1024)  /* put_values checks this much without the GIL */

static inline size_t sc_slot(uint64_t sid, size_t mask) {
    uint64_t h = sid * SC_GOLDEN;
    return (size_t)(h ^ (h >> 29)) & mask;
}

/* The entry index held under sid, or -1. */
static int32_t sc_find(const SegCache *c, uint64_t sid) {
    if (c->slots == NULL) return -1;
    for (size_t s = sc_slot(sid, c->mask); c->slots[s]; s = (s + 1) & c->mask)
        if (c->e[c->slots[s] - 1].sid == sid) return c->slots[s] - 1;
    return -1;
}

static void sc_unlink(SegCache *c, int32_t i) {
    SCEntry *x = &c->e[i];
    if (x->prev >= 0) c->e[x->prev].next = x->next; else c->oldest = x->next;
    if (x->next >= 0) c->e[x->next].prev = x->prev; else c->newest = x->prev;
    x->prev = x->next = -1;
}

static void sc_link_newest(SegCache *c, int32_t i) {
    SCEntry *x = &c->e[i];
    x->prev = c->newest;
    x->next = -1;
    if (c->newest >= 0) c->e[c->newest].next = i; else c->oldest = i;
    c->newest = i;
}

static void sc_touch(SegCache *c, int32_t i) {
    if (c->newest == i) return;
    sc_unlink(c, i);
    sc_link_newest(c, i);
}

/* Room for one more held entry: the table at most half full, an entry to take.
 * 0, or -1 with MemoryError. */
static int sc_reserve(SegCache *c) {
    if (c->held >= SC_MAX_ENTRIES) {
        PyErr_NoMemory();
        return -1;
    }
    if (c->slots == NULL || (size_t)(c->held + 1) * 2 > c->mask + 1) {
        size_t size = c->slots == NULL ? 64 : (c->mask + 1) * 2;
        int32_t *slots = calloc(size, sizeof *slots);
        if (slots == NULL) {
            PyErr_NoMemory();
            return -1;
        }
        for (int32_t i = c->oldest; i >= 0; i = c->e[i].next) {
            size_t s = sc_slot(c->e[i].sid, size - 1);
            while (slots[s]) s = (s + 1) & (size - 1);
            slots[s] = i + 1;
        }
        free(c->slots);
        c->slots = slots;
        c->mask = size - 1;
    }
    if (c->free_head < 0 && c->used == c->room) {
        int32_t room = c->room ? 2 * c->room : 64;
        SCEntry *e = realloc(c->e, (size_t)room * sizeof *e);
        if (e == NULL) {
            PyErr_NoMemory();
            return -1;
        }
        c->e = e;
        c->room = room;
    }
    return 0;
}

/* Hold `seg` (a new reference taken) under sid, not held yet, at the recent end
 * (sc_reserve done). */
static void sc_insert(SegCache *c, uint64_t sid, PyObject *seg) {
    int32_t i;
    if (c->free_head >= 0) {
        i = c->free_head;
        c->free_head = c->e[i].next;
    } else {
        i = c->used++;
    }
    c->e[i].sid = sid;
    c->e[i].seg = Py_NewRef(seg);
    sc_link_newest(c, i);
    size_t s = sc_slot(sid, c->mask);
    while (c->slots[s]) s = (s + 1) & c->mask;
    c->slots[s] = i + 1;
    c->held++;
}

/* Forget entry i: out of the table (backward shift) and the order, onto the free
 * chain. Returns its segment (the reference, for the caller to drop). */
static PyObject *sc_remove(SegCache *c, int32_t i) {
    size_t s = sc_slot(c->e[i].sid, c->mask);
    while (c->slots[s] != i + 1) s = (s + 1) & c->mask;
    for (size_t j = (s + 1) & c->mask; c->slots[j]; j = (j + 1) & c->mask) {
        size_t home = sc_slot(c->e[c->slots[j] - 1].sid, c->mask);
        /* the entry at j may move to s when s lies cyclically in [home, j) */
        int moves = s <= j ? (home <= s || home > j) : (home <= s && home > j);
        if (moves) {
            c->slots[s] = c->slots[j];
            s = j;
        }
    }
    c->slots[s] = 0;
    sc_unlink(c, i);
    PyObject *seg = c->e[i].seg;
    c->e[i].seg = NULL;
    c->e[i].next = c->free_head;
    c->free_head = i;
    c->held--;
    return seg;
}

int segcache_trace(SegCache *c, PyObject *key) {
    return c->trace == NULL ? 0 : PyList_Append(c->trace, key);
}

PyObject *segcache_hit(SegCache *c, uint64_t sid) {
    int32_t i = sc_find(c, sid);
    if (i < 0) return NULL;
    sc_touch(c, i);
    return c->e[i].seg;
}

/* The Segment of `obj`, the entry of sid: a raw entry's view made a Segment by the
 * decoder (the view kept on it as its `_cview`), which then takes the view's place in
 * the entry if it still holds it (the decoder may run any Python code). A new
 * reference, or NULL with an exception. */
static PyObject *sc_segment(SegCache *c, uint64_t sid, PyObject *obj) {
    PyObject *raw = segcache_view_value(obj);
    if (raw == NULL) return Py_NewRef(obj);
    if (c->decoder == NULL) {
        PyErr_Format(PyExc_RuntimeError, "segment cache: segment %llu is held as a stored "
                     "value and the cache has no decoder", (unsigned long long)sid);
        return NULL;
    }
    Py_INCREF(obj);
    PyObject *decoder = Py_NewRef(c->decoder);
    PyObject *seg = PyObject_CallFunction(decoder, "KO", (unsigned long long)sid, raw);
    Py_DECREF(decoder);
    if (seg != NULL && PyObject_SetAttrString(seg, "_cview", obj) < 0) {
        if (PyErr_ExceptionMatches(PyExc_AttributeError)
                || PyErr_ExceptionMatches(PyExc_TypeError)) {
            PyErr_Clear();  /* no slot for it: the kernel reads the Segment */
        } else {
            Py_CLEAR(seg);
        }
    }
    if (seg != NULL) {
        int32_t i = sc_find(c, sid);
        if (i >= 0 && c->e[i].seg == obj) {
            c->e[i].seg = Py_NewRef(seg);
            Py_DECREF(obj);  /* the entry's (ours is still held) */
        }
    }
    Py_DECREF(obj);
    return seg;
}

/* A segment id argument: 0, or -1 with an exception naming it. */
static int sid_of(PyObject *o, uint64_t *sid) {
    if (!PyLong_Check(o)) {
        PyErr_Format(PyExc_TypeError, "segment id must be an int, got %.100s",
                     Py_TYPE(o)->tp_name);
        return -1;
    }
    *sid = PyLong_AsUnsignedLongLong(o);
    if (*sid == (uint64_t)-1 && PyErr_Occurred()) {
        PyErr_Format(PyExc_OverflowError, "segment id %R is not in 0..2**64-1", o);
        return -1;
    }
    return 0;
}

/* -- the Python type ------------------------------------------------------------------ */

static int capacity_of(PyObject *v, Py_ssize_t *out) {
    Py_ssize_t n = PyLong_AsSsize_t(v);
    if (n == -1 && PyErr_Occurred()) return -1;
    if (n < 0) {
        PyErr_Format(PyExc_ValueError, "segment cache capacity must be >= 0, got %zd", n);
        return -1;
    }
    *out = n;
    return 0;
}

static int sc_init(SegCache *c, PyObject *args, PyObject *kwds) {
    static char *kw[] = {"capacity", NULL};
    PyObject *cap;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "O:SegmentCache", kw, &cap)) return -1;
    if (c->e != NULL || c->slots != NULL) {
        PyErr_SetString(PyExc_RuntimeError, "SegmentCache is already initialised");
        return -1;
    }
    c->oldest = c->newest = c->free_head = -1;
    return capacity_of(cap, &c->capacity);
}

static PyObject *sc_new(PyTypeObject *type, PyObject *args, PyObject *kwds) {
    SegCache *c = (SegCache *)type->tp_alloc(type, 0);
    if (c != NULL) c->oldest = c->newest = c->free_head = -1;
    return (PyObject *)c;
}

/* Drop every segment (the structure emptied first). */
static void sc_empty(SegCache *c) {
    SCEntry *e = c->e;
    int32_t first = c->oldest;
    c->e = NULL;
    free(c->slots);
    c->slots = NULL;
    c->mask = 0;
    c->used = c->room = c->held = 0;
    c->oldest = c->newest = c->free_head = -1;
    for (int32_t i = first; i >= 0;) {
        int32_t next = e[i].next;
        Py_DECREF(e[i].seg);
        i = next;
    }
    free(e);
}

static void sc_dealloc(SegCache *c) {
    Py_CLEAR(c->trace);
    Py_CLEAR(c->decoder);
    sc_empty(c);
    Py_TYPE(c)->tp_free((PyObject *)c);
}

static Py_ssize_t sc_len(SegCache *c) { return c->held; }

/* The entry held under `key` (any object: one that is no u64 int holds nothing), or -1. */
static int32_t sc_find_key(const SegCache *c, PyObject *key) {
    if (!PyLong_Check(key)) return -1;
    uint64_t sid = PyLong_AsUnsignedLongLong(key);
    if (sid == (uint64_t)-1 && PyErr_Occurred()) {
        PyErr_Clear();  /* no such id is held */
        return -1;
    }
    return sc_find(c, sid);
}

static int sc_contains(SegCache *c, PyObject *key) { return sc_find_key(c, key) >= 0; }

static PyObject *sc_get(SegCache *c, PyObject *key) {
    int32_t i = sc_find_key(c, key);
    return i < 0 ? Py_NewRef(Py_None) : sc_segment(c, c->e[i].sid, c->e[i].seg);
}

static PyObject *sc_hits(SegCache *c, PyObject *sids) {
    PyObject *seq = PySequence_Fast(sids, "hits takes a sequence of segment ids");
    if (seq == NULL) return NULL;
    PyObject *got = PyDict_New(), *missing = PyList_New(0), *out = NULL;
    if (got == NULL || missing == NULL) goto done;
    for (Py_ssize_t k = 0; k < PySequence_Fast_GET_SIZE(seq); k++) {
        PyObject *key = PySequence_Fast_GET_ITEM(seq, k);
        uint64_t sid;
        if (sid_of(key, &sid) < 0) goto done;
        PyObject *held = segcache_hit(c, sid);
        if (held == NULL) {
            if (PyList_Append(missing, key) < 0) goto done;
            continue;
        }
        PyObject *seg = sc_segment(c, sid, held);  /* a reference: the insertion may run code */
        if (seg == NULL) goto done;
        int bad = PyDict_SetItem(got, key, seg) < 0 || segcache_trace(c, key) < 0;
        Py_DECREF(seg);
        if (bad) goto done;
    }
    out = PyTuple_Pack(2, got, missing);
done:
    Py_DECREF(seq);
    Py_XDECREF(got);
    Py_XDECREF(missing);
    return out;
}

/* Hold seg under sid at the recent end; 0, or -1 with an exception. */
static int sc_put(SegCache *c, uint64_t sid, PyObject *seg) {
    int32_t i = sc_find(c, sid);
    if (i >= 0) {
        PyObject *old = c->e[i].seg;
        c->e[i].seg = Py_NewRef(seg);
        sc_touch(c, i);
        Py_DECREF(old);
        return 0;
    }
    if (sc_reserve(c) < 0) return -1;
    sc_insert(c, sid, seg);
    return 0;
}

static PyObject *sc_put_many(SegCache *c, PyObject *segs) {
    PyObject *items = PyMapping_Items(segs);
    if (items == NULL) {
        if (PyErr_ExceptionMatches(PyExc_AttributeError)) {
            PyErr_Clear();
            PyErr_Format(PyExc_TypeError, "put_many takes a mapping of seg id -> Segment, got "
                         "%.100s", Py_TYPE(segs)->tp_name);
        }
        return NULL;
    }
    int rc = 0;
    for (Py_ssize_t k = 0; rc == 0 && k < PyList_GET_SIZE(items); k++) {
        PyObject *item = PyList_GET_ITEM(items, k);
        uint64_t sid;
        if (!PyTuple_Check(item) || PyTuple_GET_SIZE(item) != 2) {
            PyErr_SetString(PyExc_TypeError, "put_many takes a mapping of seg id -> Segment");
            rc = -1;
        } else if (PyTuple_GET_ITEM(item, 1) == Py_None) {
            PyErr_Format(PyExc_ValueError, "put_many: segment %R is None (only decoded "
                         "segments are cached)", PyTuple_GET_ITEM(item, 0));
            rc = -1;
        } else {
            rc = sid_of(PyTuple_GET_ITEM(item, 0), &sid) < 0
                 || sc_put(c, sid, PyTuple_GET_ITEM(item, 1)) < 0 ? -1 : 0;
        }
    }
    Py_DECREF(items);
    while (rc == 0 && c->held > c->capacity) Py_DECREF(sc_remove(c, c->oldest));
    if (rc < 0) return NULL;
    Py_RETURN_NONE;
}

/* Does value (len bytes at p) pass every check of decode_segment for segment sid? Only
 * a little-endian build reads values in place (the kernel reads words natively). */
static int sc_value_ok(uint64_t sid, const unsigned char *p, size_t len) {
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
    return p != NULL && seg_check(p, len) == SEG_OK && sarp_get_le64(p + 8) == sid;
#else
    (void)sid, (void)p, (void)len;
    return 0;
#endif
}

static PyObject *sc_put_values(SegCache *c, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 2) {
        PyErr_Format(PyExc_TypeError, "put_values takes 2 arguments (sids, values), got %zd",
                     nargs);
        return NULL;
    }
    if (c->decoder == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "put_values: the segment cache has no decoder");
        return NULL;
    }
    PyObject *keys = PySequence_Tuple(args[0]), *vals = NULL, *out = NULL;
    uint64_t *sids = NULL;
    const unsigned char **ps = NULL;
    size_t *lens = NULL;
    if (keys == NULL || (vals = PySequence_Tuple(args[1])) == NULL) goto done;
    Py_ssize_t n = PyTuple_GET_SIZE(keys);
    if (PyTuple_GET_SIZE(vals) != n) {
        PyErr_Format(PyExc_ValueError, "put_values: %zd segment ids and %zd values", n,
                     PyTuple_GET_SIZE(vals));
        goto done;
    }
    size_t room = (size_t)(n ? n : 1), total = 0;
    sids = malloc(room * sizeof *sids);
    ps = malloc(room * sizeof *ps);
    lens = malloc(room * sizeof *lens);
    if (sids == NULL || ps == NULL || lens == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    for (Py_ssize_t k = 0; k < n; k++) {
        PyObject *v = PyTuple_GET_ITEM(vals, k);
        if (sid_of(PyTuple_GET_ITEM(keys, k), &sids[k]) < 0) goto done;
        int bytes = PyBytes_CheckExact(v);  /* another kind: not held (the caller decodes) */
        ps[k] = bytes ? (const unsigned char *)PyBytes_AS_STRING(v) : NULL;
        lens[k] = bytes ? (size_t)PyBytes_GET_SIZE(v) : 0;
        total += lens[k];
    }
    if (total >= SC_GIL_FREE_BYTES) {  /* the tuple holds the values meanwhile */
        Py_BEGIN_ALLOW_THREADS
        for (Py_ssize_t k = 0; k < n; k++)
            if (!sc_value_ok(sids[k], ps[k], lens[k])) ps[k] = NULL;
        Py_END_ALLOW_THREADS
    } else {
        for (Py_ssize_t k = 0; k < n; k++)
            if (!sc_value_ok(sids[k], ps[k], lens[k])) ps[k] = NULL;
    }
    if ((out = PyDict_New()) == NULL) goto done;
    for (Py_ssize_t k = 0; k < n; k++) {
        if (ps[k] == NULL) continue;
        PyObject *view = segcache_view(PyTuple_GET_ITEM(vals, k));
        int bad = view == NULL || sc_put(c, sids[k], view) < 0
                  || PyDict_SetItem(out, PyTuple_GET_ITEM(keys, k), view) < 0;
        Py_XDECREF(view);
        if (bad) {
            Py_CLEAR(out);
            break;
        }
    }
    while (c->held > c->capacity) Py_DECREF(sc_remove(c, c->oldest));
done:
    free(sids);
    free(ps);
    free(lens);
    Py_XDECREF(keys);
    Py_XDECREF(vals);
    return out;
}

static PyObject *sc_items(SegCache *c, PyObject *unused) {
    PyObject *out = PyList_New(0);
    if (out == NULL) return NULL;
    /* the order is walked into a list of ids first: building tuples may run Python code */
    Py_ssize_t n = c->held, k = 0;
    uint64_t *sids = malloc((size_t)(n ? n : 1) * sizeof *sids);
    if (sids == NULL) {
        Py_DECREF(out);
        return PyErr_NoMemory();
    }
    for (int32_t i = c->oldest; i >= 0 && k < n; i = c->e[i].next) sids[k++] = c->e[i].sid;
    for (Py_ssize_t j = 0; j < k; j++) {
        int32_t i = sc_find(c, sids[j]);
        if (i < 0) continue;  /* dropped meanwhile */
        PyObject *seg = sc_segment(c, sids[j], c->e[i].seg);
        PyObject *t = seg == NULL ? NULL : Py_BuildValue("(KN)", (unsigned long long)sids[j], seg);
        if (t == NULL || PyList_Append(out, t) < 0) {
            Py_XDECREF(t);
            Py_DECREF(out);
            free(sids);
            return NULL;
        }
        Py_DECREF(t);
    }
    free(sids);
    return out;
}

static PyObject *sc_clear(SegCache *c, PyObject *unused) {
    sc_empty(c);
    Py_RETURN_NONE;
}

/* Check the structure (the tests' audit): the order and the table hold the same
 * entries, each findable under its id. True, or AssertionError naming the fault. */
static PyObject *sc_audit(SegCache *c, PyObject *unused) {
    int32_t count = 0, prev = -1;
    for (int32_t i = c->oldest; i >= 0; prev = i, i = c->e[i].next) {
        if (++count > c->held || c->e[i].prev != prev || c->e[i].seg == NULL
                || sc_find(c, c->e[i].sid) != i) {
            PyErr_Format(PyExc_AssertionError, "segment cache: entry %d is out of place", i);
            return NULL;
        }
    }
    size_t filled = 0;
    for (size_t s = 0; c->slots != NULL && s <= c->mask; s++) filled += c->slots[s] != 0;
    if (count != c->held || prev != c->newest || (int32_t)filled != c->held) {
        PyErr_Format(PyExc_AssertionError, "segment cache: %d in order, %zu in the table, "
                     "%d held", count, filled, c->held);
        return NULL;
    }
    Py_RETURN_TRUE;
}

static PyObject *sc_get_capacity(SegCache *c, void *closure) {
    return PyLong_FromSsize_t(c->capacity);
}

static int sc_set_capacity(SegCache *c, PyObject *v, void *closure) {
    if (v == NULL) {
        PyErr_SetString(PyExc_AttributeError, "capacity cannot be deleted");
        return -1;
    }
    return capacity_of(v, &c->capacity);
}

static PyMethodDef sc_methods[] = {
    {"get", (PyCFunction)sc_get, METH_O,
     "get(sid, /)\n--\n\nThe segment, its place in the order unchanged (None: not held)."},
    {"hits", (PyCFunction)sc_hits, METH_O,
     "hits(sids, /)\n--\n\n(the held ones, each moved to the recent end in the order asked; "
     "the others, in order)."},
    {"put_many", (PyCFunction)sc_put_many, METH_O,
     "put_many(segs, /)\n--\n\nEach segment at the recent end in order, then the oldest "
     "dropped while more than capacity are held."},
    {"put_values", (PyCFunction)(void (*)(void))sc_put_values, METH_FASTCALL,
     "put_values(sids, values, /)\n--\n\nEach value (a stored segment, bytes) that passes "
     "every check of decode_segment for its id held at the recent end in order, as a raw "
     "entry (made a Segment by `decoder` when Python code asks for it); then the oldest "
     "dropped while more than capacity are held. Returns the held ones: seg id -> the match "
     "kernel's view of each (what `match`'s read may return). The others (None, not bytes, "
     "failing a check) are left to the caller."},
    {"items", (PyCFunction)sc_items, METH_NOARGS,
     "items()\n--\n\nEvery held segment, least recently used first."},
    {"clear", (PyCFunction)sc_clear, METH_NOARGS, "clear()\n--\n\nDrop every segment."},
    {"_audit", (PyCFunction)sc_audit, METH_NOARGS,
     "_audit()\n--\n\nCheck the structure (tests): True, or AssertionError."},
    {NULL, NULL, 0, NULL},
};

/* An optional attribute (trace, decoder): None when unset. */
static PyObject *get_slot(PyObject *slot) { return Py_NewRef(slot == NULL ? Py_None : slot); }

/* Set an optional attribute's slot to v (None or a deletion: unset) when `fits(v)`;
 * else TypeError: "`what` must be ... or None, got <type>". */
static int set_slot(PyObject **slot, PyObject *v, int (*fits)(PyObject *), const char *what) {
    if (v != NULL && v != Py_None && !fits(v)) {
        PyErr_Format(PyExc_TypeError, "%s or None, got %.100s", what, Py_TYPE(v)->tp_name);
        return -1;
    }
    PyObject *old = *slot;
    *slot = v == NULL || v == Py_None ? NULL : Py_NewRef(v);
    Py_XDECREF(old);
    return 0;
}

static int is_list(PyObject *v) { return PyList_CheckExact(v); }

static PyObject *sc_get_trace(SegCache *c, void *closure) { return get_slot(c->trace); }

static int sc_set_trace(SegCache *c, PyObject *v, void *closure) {
    return set_slot(&c->trace, v, is_list, "trace must be a list");
}

static PyObject *sc_get_decoder(SegCache *c, void *closure) { return get_slot(c->decoder); }

static int sc_set_decoder(SegCache *c, PyObject *v, void *closure) {
    return set_slot(&c->decoder, v, PyCallable_Check, "decoder must be callable");
}

static PyGetSetDef sc_getset[] = {
    {"decoder", (getter)sc_get_decoder, (setter)sc_set_decoder,
     "decoder(sid, value) -> Segment: makes a raw entry (put_values) a Segment when Python "
     "code asks for it; None: none (a raw entry asked for is a RuntimeError).", NULL},
    {"capacity", (getter)sc_get_capacity, (setter)sc_set_capacity,
     "Segments held at most after a put_many.", NULL},
    {"trace", (getter)sc_get_trace, (setter)sc_set_trace,
     "A list the id of every hit is appended to (hits() and the match kernel's), or None.",
     NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PySequenceMethods sc_as_sequence = {
    .sq_length = (lenfunc)sc_len,
    .sq_contains = (objobjproc)sc_contains,
};

PyTypeObject SegCacheType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "sarpd.core._cmatch.SegmentCache",
    .tp_basicsize = sizeof(SegCache),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_new = sc_new,
    .tp_init = (initproc)sc_init,
    .tp_dealloc = (destructor)sc_dealloc,
    .tp_as_sequence = &sc_as_sequence,
    .tp_methods = sc_methods,
    .tp_getset = sc_getset,
    .tp_doc = "SegmentCache(capacity)\n--\n\nThe decoded-segment cache (reference: "
              "sarpd.core.segcache.SegmentCache).",
};
