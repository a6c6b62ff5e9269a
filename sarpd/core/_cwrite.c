/* The write path's records in C: the Python face of sarp's C segment codec
 * (sarpd/core/csrc/segment.c, the twin of segment.py and delta.py).
 *
 * encode_segment packs a segment value byte for byte as segment.encode_segment does
 * (the layout is segment.py's module docstring: a 48-byte header, ids, first holders,
 * format 2's holder table; CRC-32 of bytes [0, 40) then [44, end), zlib's CRC).
 * parse_segment checks a value as segment.decode_segment does and returns its header
 * fields, or an int (the failed check, CHECKS names them) so that the caller raises the
 * reference's own error. block_keys builds the block locator keys (b"B" + 16-byte
 * id); filters is the twin of routing.filters_at(routing.fingerprints(ids), offsets)
 * for register. drop_windows is WriteTxn.drop's loop over a removal's windows'
 * segments; add_holders and refill_blocks are the other window loops.
 * Arrays are C-contiguous uint64 buffers (ids of shape (n, 2)); the argument checks
 * are csrc/sarp.h's.
 *
 * seg_ops, delta and apply_delta drive the segment library on values, so that
 * tests/core/test_csegment.py can hold it to the reference: seg_ops decodes a value
 * into a Seg, runs a list of holder operations on it and returns each one's result
 * with the value after it; delta is delta.encode_delta of two values' segments;
 * apply_delta is delta.apply_delta, encoded, or the int of the check a record fails. */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

#include "sarp.h"
#include "segment.h"

#define LOCATOR_KEY 17  /* b"B" + 16-byte id */

/* encode_segment(seg_id, window, presence, ns_tag, ids, meta, xmeta, xmask) -> bytes */
static PyObject *encode_segment(PyObject *Py_UNUSED(self), PyObject *const *args,
                                Py_ssize_t nargs) {
    if (nargs != 8) {
        PyErr_Format(PyExc_TypeError, "encode_segment takes 8 arguments (seg_id, window, "
                     "presence, ns_tag, ids, meta, xmeta, xmask), got %zd", nargs);
        return NULL;
    }
    uint64_t seg_id, window, presence, tag;
    if (sarp_get_uint64_arg(args[0], "seg_id", &seg_id) < 0 ||
        sarp_get_uint64_arg(args[1], "window", &window) < 0 ||
        sarp_get_uint64_arg(args[2], "presence", &presence) < 0 ||
        sarp_get_uint64_arg(args[3], "ns_tag", &tag) < 0)
        return NULL;
    Py_buffer ids, meta, xmeta, xmask;
    if (sarp_get_ids(args[4], "ids", &ids) < 0) return NULL;
    PyObject *out = NULL;
    if (sarp_get_u64s(args[5], "meta", &meta) < 0) goto free_ids;
    if (sarp_get_u64s(args[6], "xmeta", &xmeta) < 0) goto free_meta;
    if (sarp_get_u64s(args[7], "xmask", &xmask) < 0) goto free_xmeta;
    Py_ssize_t n = ids.shape[0], h = xmeta.len / 8;
    if (n < 1 || n > SEG_MAX_BLOCKS) {
        PyErr_Format(PyExc_ValueError, "ids: %zd blocks, a segment holds 1..%d", n,
                     SEG_MAX_BLOCKS);
        goto done;
    }
    if (meta.len / 8 != n) {
        PyErr_Format(PyExc_ValueError, "meta: %zd values for %zd blocks", meta.len / 8, n);
        goto done;
    }
    if (xmask.len / 8 != h) {
        PyErr_Format(PyExc_ValueError, "xmask: %zd entries, xmeta has %zd", xmask.len / 8, h);
        goto done;
    }
    if (h > 0xFFFFFFFFLL) {
        PyErr_Format(PyExc_ValueError, "xmeta: %zd holder entries, at most 2**32 - 1", h);
        goto done;
    }
    out = PyBytes_FromStringAndSize(NULL, (Py_ssize_t)seg_value_size((unsigned)n, (size_t)h));
    if (out == NULL) goto done;
    unsigned char *p = (unsigned char *)PyBytes_AS_STRING(out);
    Py_BEGIN_ALLOW_THREADS
    /* n and h fit (checked above): it cannot fail */
    seg_encode_parts(p, seg_id, window, presence, tag, (unsigned)n, ids.buf, meta.buf,
                     (size_t)h, xmeta.buf, xmask.buf);
    Py_END_ALLOW_THREADS
done:
    PyBuffer_Release(&xmask);
free_xmeta:
    PyBuffer_Release(&xmeta);
free_meta:
    PyBuffer_Release(&meta);
free_ids:
    PyBuffer_Release(&ids);
    return out;
}

/* parse_segment(value) -> (fmt, n, seg_id, window, presence, ns_tag, h), or the int
 * of the first check the value fails (the caller raises the reference's error). */
static PyObject *parse_segment(PyObject *Py_UNUSED(self), PyObject *arg) {
    Py_buffer v;
    if (PyObject_GetBuffer(arg, &v, PyBUF_SIMPLE) < 0) {
        PyErr_Format(PyExc_TypeError, "value must be bytes, got %.100s", Py_TYPE(arg)->tp_name);
        return NULL;
    }
    const unsigned char *p = (const unsigned char *)v.buf;
    int code;
    code = seg_check(p, (size_t)v.len);  /* ~1 us: a GIL hand-over costs more */
    PyObject *out;
    if (code != SEG_OK)
        out = PyLong_FromLong(code);
    else
        out = Py_BuildValue("(iiKKKKk)", (int)p[4], (int)p[5],
                            (unsigned long long)sarp_get_le64(p + 8),
                            (unsigned long long)sarp_get_le64(p + 16),
                            (unsigned long long)sarp_get_le64(p + 24),
                            (unsigned long long)sarp_get_le64(p + 32),
                            (unsigned long)sarp_get_le32(p + 44));
    PyBuffer_Release(&v);
    return out;
}

static PyObject *block_key(const unsigned char *id16) {
    PyObject *k = PyBytes_FromStringAndSize(NULL, LOCATOR_KEY);
    if (k == NULL) return NULL;
    char *s = PyBytes_AS_STRING(k);
    s[0] = 'B';
    memcpy(s + 1, id16, 16);
    return k;
}

/* block_keys(ids) -> list of b"B" + 16-byte id */
static PyObject *block_keys(PyObject *Py_UNUSED(self), PyObject *arg) {
    Py_buffer ids;
    if (sarp_get_ids(arg, "ids", &ids) < 0) return NULL;
    Py_ssize_t n = ids.shape[0];
    PyObject *out = PyList_New(n);
    if (out != NULL) {
        const unsigned char *p = (const unsigned char *)ids.buf;
        for (Py_ssize_t i = 0; i < n; i++) {
            PyObject *k = block_key(p + 16 * i);
            if (k == NULL) { Py_CLEAR(out); break; }
            PyList_SET_ITEM(out, i, k);
        }
    }
    PyBuffer_Release(&ids);
    return out;
}

/* A block's 4-bit fingerprint (routing.fingerprints): 1..15, 0 past the end. */
static unsigned fingerprint(const unsigned char *ids, Py_ssize_t n, Py_ssize_t i) {
    if (i >= n) return 0;
    return sarp_fingerprint_at(ids + 16 * i);
}

/* filters(ids, offsets) -> list of the 64-bit filters of points at `offsets` of a
 * segment with these ids (routing.filters_at of routing.fingerprints): byte j holds
 * the fingerprints of blocks offset + 2j + 1 (high nibble) and offset + 2j + 2. */
static PyObject *filters(PyObject *Py_UNUSED(self), PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 2) {
        PyErr_Format(PyExc_TypeError, "filters takes 2 arguments (ids, offsets), got %zd", nargs);
        return NULL;
    }
    PyObject *offs = PySequence_Fast(args[1], "offsets must be a sequence of ints");
    if (offs == NULL) return NULL;
    Py_buffer ids;
    if (sarp_get_ids(args[0], "ids", &ids) < 0) { Py_DECREF(offs); return NULL; }
    Py_ssize_t m = PySequence_Fast_GET_SIZE(offs), n = ids.shape[0];
    const unsigned char *p = (const unsigned char *)ids.buf;
    PyObject *out = PyList_New(m);
    for (Py_ssize_t k = 0; out != NULL && k < m; k++) {
        Py_ssize_t o = PyLong_AsSsize_t(PySequence_Fast_GET_ITEM(offs, k));
        if (o == -1 && PyErr_Occurred()) { Py_CLEAR(out); break; }
        if (o < 0 || o > SEG_MAX_BLOCKS) {
            PyErr_Format(PyExc_ValueError, "offsets[%zd] is %zd, not in 0..%d", k, o,
                         SEG_MAX_BLOCKS);
            Py_CLEAR(out);
            break;
        }
        uint64_t f = 0;
        for (int j = 0; j < 8; j++) {
            unsigned hi = fingerprint(p, n, o + 2 * j + 1), lo = fingerprint(p, n, o + 2 * j + 2);
            f |= (uint64_t)((hi << 4) | lo) << (8 * j);
        }
        PyObject *v = PyLong_FromUnsignedLongLong(f);
        if (v == NULL) { Py_CLEAR(out); break; }
        PyList_SET_ITEM(out, k, v);
    }
    PyBuffer_Release(&ids);
    Py_DECREF(offs);
    return out;
}

/* -- the segment library driven from Python (tests/core/test_csegment.py) ----------- */

/* Decode the segment value `obj` into s: 0, or -1 with an error naming `name` (a value
 * that fails a check: ValueError naming the check). */
static int decode_arg(PyObject *obj, const char *name, Seg *s) {
    Py_buffer v;
    if (PyObject_GetBuffer(obj, &v, PyBUF_SIMPLE) < 0) {
        PyErr_Format(PyExc_TypeError, "%s must be bytes, got %.100s", name, Py_TYPE(obj)->tp_name);
        return -1;
    }
    int code = seg_decode(s, (const unsigned char *)v.buf, (size_t)v.len);
    PyBuffer_Release(&v);
    if (code == SEG_NOMEM) {
        PyErr_NoMemory();
        return -1;
    }
    if (code != SEG_OK) {
        PyErr_Format(PyExc_ValueError, "%s: the segment value fails check %d", name, code);
        return -1;
    }
    return 0;
}

static PyObject *encode_seg(const Seg *s) {
    PyObject *out = PyBytes_FromStringAndSize(NULL, (Py_ssize_t)seg_value_size(s->n, s->h));
    if (out == NULL) return NULL;
    int code = seg_encode(s, (unsigned char *)PyBytes_AS_STRING(out));
    if (code != SEG_OK) {
        Py_DECREF(out);
        PyErr_Format(PyExc_ValueError, "segment %llu cannot be encoded (code %d)",
                     (unsigned long long)s->seg_id, code);
        return NULL;
    }
    return out;
}

static PyObject *u64_list(const uint64_t *a, size_t n) {
    PyObject *out = PyList_New((Py_ssize_t)n);
    for (size_t j = 0; out != NULL && j < n; j++) {
        PyObject *v = PyLong_FromUnsignedLongLong(a[j]);
        if (v == NULL) Py_CLEAR(out);
        else PyList_SET_ITEM(out, (Py_ssize_t)j, v);
    }
    return out;
}

/* The operations of seg_ops: name, arguments after the name, the largest block
 * argument (BLOCK: n - 1, RUN: n, HEAD: 64, ANY: any block number). */
enum { OP_ADD, OP_DROP, OP_PRESENT_RUN, OP_IS_PRESENT, OP_HAS_AT, OP_HOLDERS_OF, OP_HOLDS,
       OP_KEEP_HEAD, OP_HOLDINGS, OP_COPY, N_OPS };
enum { BLOCK, RUN, HEAD, ANY };
static const struct { const char *name; int nargs, limit; } OPS[N_OPS] = {
    [OP_ADD] = {"add", 2, BLOCK},          [OP_DROP] = {"drop", 2, BLOCK},
    [OP_PRESENT_RUN] = {"present_run", 1, RUN}, [OP_IS_PRESENT] = {"is_present", 1, ANY},
    [OP_HAS_AT] = {"has_at", 3, ANY},      [OP_HOLDERS_OF] = {"holders_of", 1, BLOCK},
    [OP_HOLDS] = {"holds", 2, BLOCK},      [OP_KEEP_HEAD] = {"keep_head", 1, HEAD},
    [OP_HOLDINGS] = {"holdings", 0, ANY},  [OP_COPY] = {"copy", 0, ANY},
};

/* Run ops[k] = op on s: its result (a new reference), or NULL with an error. */
static PyObject *run_op(Seg *s, PyObject *op, Py_ssize_t k) {
    const char *name = NULL;
    if (PyTuple_Check(op) && PyTuple_GET_SIZE(op) >= 1 && PyUnicode_Check(PyTuple_GET_ITEM(op, 0)))
        name = PyUnicode_AsUTF8(PyTuple_GET_ITEM(op, 0));
    else
        PyErr_Format(PyExc_TypeError, "ops[%zd] must be a tuple (name, *args), got %R", k, op);
    if (name == NULL) return NULL;
    int which = 0;
    while (which < N_OPS && strcmp(OPS[which].name, name) != 0) which++;
    if (which == N_OPS || PyTuple_GET_SIZE(op) != 1 + OPS[which].nargs) {
        PyErr_Format(PyExc_ValueError, "ops[%zd]: %R is not an operation (add, drop, "
                     "present_run, is_present, has_at, holders_of, holds, keep_head, "
                     "holdings, copy) with its arguments", k, op);
        return NULL;
    }
    unsigned i = 0;
    if (OPS[which].nargs) {
        Py_ssize_t got = PyLong_AsSsize_t(PyTuple_GET_ITEM(op, 1));
        if (got == -1 && PyErr_Occurred()) return NULL;
        int lim = OPS[which].limit;
        Py_ssize_t top = lim == BLOCK ? (Py_ssize_t)s->n - 1 : lim == RUN ? (Py_ssize_t)s->n
                         : lim == HEAD ? SEG_MAX_BLOCKS : 0x7FFFFFFF;
        if (got < 0 || got > top) {
            PyErr_Format(PyExc_ValueError, "ops[%zd]: block %zd not in 0..%zd", k, got, top);
            return NULL;
        }
        i = (unsigned)got;
    }
    uint64_t x = 0, y = 0;  /* the holder; has_at's id */
    int every = which == OP_DROP && PyTuple_GET_ITEM(op, 2) == Py_None;
    if (OPS[which].nargs >= 2 && !every &&
        sarp_get_uint64_arg(PyTuple_GET_ITEM(op, 2), which == OP_HAS_AT ? "lo" : "holder",
                            &x) < 0)
        return NULL;
    if (which == OP_HAS_AT && sarp_get_uint64_arg(PyTuple_GET_ITEM(op, 3), "hi", &y) < 0)
        return NULL;
    PyObject *out = NULL;
    uint64_t *buf = NULL;
    switch (which) {
    case OP_ADD: {
        int r = seg_add_holder(s, i, x);
        if (r == SEG_NOMEM) return PyErr_NoMemory();
        return PyBool_FromLong(r);
    }
    case OP_DROP:
        return PyBool_FromLong(every ? seg_drop_all(s, i) : seg_drop_holder(s, i, x));
    case OP_PRESENT_RUN:
        return PyLong_FromUnsignedLong(seg_present_run(s, i));
    case OP_IS_PRESENT:
        return PyBool_FromLong(seg_is_present(s, i));
    case OP_HAS_AT:
        return PyBool_FromLong(seg_has_at(s, i, x, y));
    case OP_HOLDS:
        return PyBool_FromLong(seg_holds(s, i, x));
    case OP_HOLDINGS:
        return PyLong_FromUnsignedLongLong(seg_holdings(s));
    case OP_HOLDERS_OF:
        buf = PyMem_Malloc((1 + s->h) * sizeof(uint64_t));
        if (buf == NULL) return PyErr_NoMemory();
        out = u64_list(buf, seg_holders_of(s, i, buf));
        PyMem_Free(buf);
        return out;
    case OP_KEEP_HEAD: {
        buf = PyMem_Malloc((2 * s->h + 1) * sizeof(uint64_t));
        if (buf == NULL) return PyErr_NoMemory();
        size_t kept = seg_keep_head(s, i, buf, buf + s->h);
        PyObject *xm = u64_list(buf, kept), *xk = u64_list(buf + s->h, kept);
        if (xm != NULL && xk != NULL) out = PyTuple_Pack(2, xm, xk);
        Py_XDECREF(xm);
        Py_XDECREF(xk);
        PyMem_Free(buf);
        return out;
    }
    default: {  /* OP_COPY: carry on with a deep copy (Segment.writable), the old one freed */
        Seg c;
        seg_init(&c);
        if (seg_copy(&c, s) != SEG_OK) return PyErr_NoMemory();
        seg_free(s);
        *s = c;
        Py_RETURN_NONE;
    }
    }
}

/* seg_ops(value, ops) -> [(result, value after it), ...], or the int of the first check
 * the value fails: decode value, run the holder operations ops in turn (tuples: ("add",
 * i, holder), ("drop", i, holder or None), ("present_run", start), ("is_present", i),
 * ("has_at", i, lo, hi), ("holders_of", i), ("holds", i, holder), ("keep_head", run) ->
 * (xmeta, xmask) lists, ("holdings",), ("copy",)) and encode the segment after each. */
static PyObject *seg_ops(PyObject *Py_UNUSED(self), PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 2) {
        PyErr_Format(PyExc_TypeError, "seg_ops takes 2 arguments (value, ops), got %zd", nargs);
        return NULL;
    }
    PyObject *ops = PySequence_Fast(args[1], "ops must be a sequence of tuples");
    if (ops == NULL) return NULL;
    Py_buffer v;
    if (PyObject_GetBuffer(args[0], &v, PyBUF_SIMPLE) < 0) {
        PyErr_Format(PyExc_TypeError, "value must be bytes, got %.100s",
                     Py_TYPE(args[0])->tp_name);
        Py_DECREF(ops);
        return NULL;
    }
    Seg s;
    seg_init(&s);
    int code = seg_decode(&s, (const unsigned char *)v.buf, (size_t)v.len);
    PyBuffer_Release(&v);
    PyObject *out = NULL;
    if (code == SEG_NOMEM) {
        PyErr_NoMemory();
    } else if (code != SEG_OK) {
        out = PyLong_FromLong(code);
    } else {
        Py_ssize_t m = PySequence_Fast_GET_SIZE(ops);
        out = PyList_New(m);
        for (Py_ssize_t k = 0; out != NULL && k < m; k++) {
            PyObject *r = run_op(&s, PySequence_Fast_GET_ITEM(ops, k), k);
            PyObject *val = r == NULL ? NULL : encode_seg(&s);
            PyObject *pair = val == NULL ? NULL : PyTuple_Pack(2, r, val);
            Py_XDECREF(r);
            Py_XDECREF(val);
            if (pair == NULL) Py_CLEAR(out);
            else PyList_SET_ITEM(out, k, pair);
        }
    }
    seg_free(&s);
    Py_DECREF(ops);
    return out;
}

/* The delta record that turns b into a (seg_encode_delta), as bytes; NULL with the
 * reference's ValueError when a is shorter or moved. */
static PyObject *delta_bytes(const Seg *b, const Seg *a) {
    size_t size = 0;
    int code = seg_encode_delta(b, a, NULL, &size);
    if (code == SEG_DELTA_MOVED) {
        PyErr_Format(PyExc_ValueError, "segment %llu: a delta cannot shrink it or move it",
                     (unsigned long long)a->seg_id);
        return NULL;
    }
    if (code != SEG_OK) {
        PyErr_Format(PyExc_OverflowError, "segment %llu: its delta does not fit a record",
                     (unsigned long long)a->seg_id);
        return NULL;
    }
    PyObject *out = PyBytes_FromStringAndSize(NULL, (Py_ssize_t)size);
    if (out != NULL) seg_encode_delta(b, a, (unsigned char *)PyBytes_AS_STRING(out), &size);
    return out;
}

/* delta(before, after) -> bytes: delta.encode_delta of two segment values' segments
 * (ValueError: the reference's, when after is shorter or moved). */
static PyObject *delta(PyObject *Py_UNUSED(self), PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 2) {
        PyErr_Format(PyExc_TypeError, "delta takes 2 arguments (before, after), got %zd", nargs);
        return NULL;
    }
    Seg b, a;
    seg_init(&b);
    seg_init(&a);
    PyObject *out = NULL;
    if (decode_arg(args[0], "before", &b) == 0 && decode_arg(args[1], "after", &a) == 0)
        out = delta_bytes(&b, &a);
    seg_free(&b);
    seg_free(&a);
    return out;
}

/* apply_delta(value, record) -> bytes: the value of the segment of `value` with the delta
 * record applied (delta.apply_delta), or the int of the first check the record fails. */
static PyObject *apply_delta(PyObject *Py_UNUSED(self), PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 2) {
        PyErr_Format(PyExc_TypeError, "apply_delta takes 2 arguments (value, record), got %zd",
                     nargs);
        return NULL;
    }
    Seg s;
    seg_init(&s);
    PyObject *out = NULL;
    Py_buffer r;
    if (decode_arg(args[0], "value", &s) < 0) goto done;
    if (PyObject_GetBuffer(args[1], &r, PyBUF_SIMPLE) < 0) {
        PyErr_Format(PyExc_TypeError, "record must be bytes, got %.100s",
                     Py_TYPE(args[1])->tp_name);
        goto done;
    }
    int code = seg_apply_delta(&s, (const unsigned char *)r.buf, (size_t)r.len);
    PyBuffer_Release(&r);
    if (code == SEG_NOMEM) PyErr_NoMemory();
    else out = code == SEG_OK ? encode_seg(&s) : PyLong_FromLong(code);
done:
    seg_free(&s);
    return out;
}

/* -- drop: WriteTxn.drop over one window's segments --------------------------------- */

static PyObject *S_PRESENCE, *S_IDS, *S_META, *S_XMETA, *S_XMASK, *S_SEG_ID, *S_WINDOW,
    *S_NS_TAG;

/* A 1-D or (n, 2) array attribute of 8-byte words (uint64, or int64 as the tests'
 * segments may have), any strides; -1 with an exception. */
static int get_words_attr(PyObject *obj, PyObject *attr, const char *name, int ndim,
                          Py_buffer *view) {
    PyObject *a = PyObject_GetAttr(obj, attr);
    if (a == NULL) return -1;
    int bad = sarp_get_words(a, name, 0, ndim, 2, 1, view);
    if (bad) {
        PyErr_Clear();
        bad = sarp_get_words(a, name, 1, ndim, 2, 1, view);
    }
    Py_DECREF(a);
    return bad;
}

/* Segment object `obj` (sarpd.core.segment.Segment) into s (initialised): its presence,
 * blocks and holder table; -1 with an exception. */
static int seg_from_object(PyObject *obj, Seg *s) {
    PyObject *pres = PyObject_GetAttr(obj, S_PRESENCE);
    if (pres == NULL) return -1;
    uint64_t presence;
    int bad = sarp_get_uint64_arg(pres, "segment presence", &presence);
    Py_DECREF(pres);
    if (bad) return -1;
    Py_buffer v[4];
    static const char *const names[4] = {"segment ids", "segment meta", "segment xmeta",
                                         "segment xmask"};
    PyObject *attrs[4] = {S_IDS, S_META, S_XMETA, S_XMASK};
    int got = 0, rc = -1;
    for (; got < 4; got++)
        if (get_words_attr(obj, attrs[got], names[got], got ? 1 : 2, &v[got]) < 0) goto done;
    Py_ssize_t n = v[0].shape[0], h = v[2].shape[0];
    if (n < 1 || n > SEG_MAX_BLOCKS || v[1].shape[0] != n || v[3].shape[0] != h) {
        PyErr_Format(PyExc_ValueError, "segment: %zd ids, %zd metas, %zd + %zd holder "
                     "entries (1..64 blocks, a meta each, xmeta and xmask alike)", n,
                     v[1].shape[0], h, v[3].shape[0]);
        goto done;
    }
    if (seg_reserve(s, (size_t)h) != SEG_OK) {
        PyErr_NoMemory();
        goto done;
    }
    s->presence = presence;
    s->n = (unsigned)n;
    for (Py_ssize_t i = 0; i < n; i++) {
        s->ids[i][0] = sarp_word_at(&v[0], i, 0);
        s->ids[i][1] = sarp_word_at(&v[0], i, 1);
        s->meta[i] = sarp_word_at(&v[1], i, 0);
    }
    for (Py_ssize_t j = 0; j < h; j++) {
        s->xmeta[j] = sarp_word_at(&v[2], j, 0);
        s->xmask[j] = sarp_word_at(&v[3], j, 0);
    }
    s->h = (size_t)h;
    rc = 0;
done:
    for (int i = 0; i < got; i++) PyBuffer_Release(&v[i]);
    return rc;
}

static PyObject *words(const uint64_t *p, size_t n) {  /* a bytearray of n native words */
    return PyByteArray_FromStringAndSize((const char *)p, (Py_ssize_t)(n * sizeof *p));
}

/* (index, presence, meta, xmeta, xmask) of a changed segment */
static PyObject *change_of(Py_ssize_t index, const Seg *s) {
    PyObject *m = words(s->meta, s->n), *x = words(s->xmeta, s->h), *k = words(s->xmask, s->h);
    PyObject *out = NULL;
    if (m != NULL && x != NULL && k != NULL)
        out = Py_BuildValue("(nKOOO)", index, (unsigned long long)s->presence, m, x, k);
    Py_XDECREF(m);
    Py_XDECREF(x);
    Py_XDECREF(k);
    return out;
}

/* Targets [from, to) (one window's) marked where an earlier one of them names the same
 * block (offset and id). */
static void mark_repeats(SegTarget *t, Py_ssize_t from, Py_ssize_t to) {
    for (Py_ssize_t k = from + 1; k < to; k++) {
        SegTarget *x = &t[k];
        for (Py_ssize_t u = from; u < k && !x->repeat; u++) {
            const SegTarget *y = &t[u];
            x->repeat = !y->repeat && y->o == x->o && y->lo == x->lo && y->hi == x->hi;
        }
    }
}

/* The targets of a window kernel into t (PyMem_Malloc'd, *t NULL when there are none:
 * the caller frees it): offsets offs (int64, 0..63), ids (m, 2) and, when metas is not
 * NULL, a meta each (uint64); any strides; none marked a repeat (mark_repeats). The
 * count into *m; -1 with an exception. */
static int get_targets(PyObject *offs_arg, PyObject *ids_arg, PyObject *metas_arg,
                       SegTarget **t, Py_ssize_t *m) {
    Py_buffer offs, ids, metas;
    int rc = -1, got_metas = 0;
    *t = NULL;
    if (sarp_get_words(offs_arg, "offs", 1, 1, 0, 1, &offs) < 0) return -1;
    if (sarp_get_words(ids_arg, "ids", 0, 2, 2, 1, &ids) < 0) goto free_offs;
    if (metas_arg != NULL) {
        if (sarp_get_words(metas_arg, "metas", 0, 1, 0, 1, &metas) < 0) goto free_ids;
        got_metas = 1;
    }
    *m = offs.shape[0];
    if (ids.shape[0] != *m || (got_metas && metas.shape[0] != *m)) {
        PyErr_Format(PyExc_ValueError, "ids%s must have one row per offset (%zd), got %zd%s",
                     got_metas ? " and metas" : "", *m, ids.shape[0],
                     got_metas && metas.shape[0] != *m ? " and a different count of metas" : "");
        goto done;
    }
    if (*m == 0) {
        rc = 0;
        goto done;
    }
    if ((size_t)*m > PY_SSIZE_T_MAX / sizeof **t || (*t = PyMem_Malloc(sizeof **t * (size_t)*m)) == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    for (Py_ssize_t k = 0; k < *m; k++) {
        int64_t o = (int64_t)sarp_word_at(&offs, k, 0);
        if (o < 0 || o >= SEG_MAX_BLOCKS) {
            PyErr_Format(PyExc_ValueError, "offs[%zd] is %lld, not in 0..%d", k, (long long)o,
                         SEG_MAX_BLOCKS - 1);
            PyMem_Free(*t);
            *t = NULL;
            goto done;
        }
        SegTarget *x = &(*t)[k];
        x->o = (unsigned)o;
        x->lo = sarp_word_at(&ids, k, 0);
        x->hi = sarp_word_at(&ids, k, 1);
        x->meta = got_metas ? sarp_word_at(&metas, k, 0) : 0;
        x->repeat = 0;
    }
    rc = 0;
done:
    if (got_metas) PyBuffer_Release(&metas);
free_ids:
    PyBuffer_Release(&ids);
free_offs:
    PyBuffer_Release(&offs);
    return rc;
}

/* One segment's step of a window kernel: 1 when s changed, 0 when not, SEG_NOMEM. */
typedef int (*WindowStep)(Seg *s, const SegTarget *t, size_t m, void *ctx);

/* Run `step` on segments [k0, k1) of segs (a PySequence_Fast of Segment, the walk's
 * order) in turn, on targets t[0..m): the changes (change_of, by index in segs) of those
 * it changed appended to `changed`; -1 with an exception. */
static int over_segments(PyObject *segs, Py_ssize_t k0, Py_ssize_t k1, const SegTarget *t,
                         Py_ssize_t m, WindowStep step, void *ctx, PyObject *changed) {
    Seg s;
    seg_init(&s);
    int rc = 0;
    for (Py_ssize_t k = k0; rc == 0 && k < k1; k++) {
        if (k >= PySequence_Fast_GET_SIZE(segs)) {  /* a list shrunk by an attribute read */
            PyErr_SetString(PyExc_RuntimeError, "segs changed size while it was read");
            rc = -1;
            break;
        }
        PyObject *obj = PySequence_Fast_GET_ITEM(segs, k);
        Py_INCREF(obj);  /* its attribute reads may run Python code */
        int bad = seg_from_object(obj, &s);
        Py_DECREF(obj);
        int got = bad ? 0 : step(&s, t, (size_t)m, ctx);
        if (got == SEG_NOMEM) PyErr_NoMemory();
        PyObject *c = bad || got <= 0 ? NULL : change_of(k, &s);
        if (bad || got == SEG_NOMEM || (got > 0 && (c == NULL || PyList_Append(changed, c) < 0)))
            rc = -1;
        Py_XDECREF(c);
    }
    seg_free(&s);
    return rc;
}

/* over_segments over every segment of segs_arg: the list of changes; NULL with an
 * exception. */
static PyObject *over_window(PyObject *segs_arg, const SegTarget *t, Py_ssize_t m,
                             WindowStep step, void *ctx) {
    PyObject *segs = PySequence_Fast(segs_arg, "segs must be a sequence of segments");
    if (segs == NULL) return NULL;
    PyObject *changed = PyList_New(0);
    if (changed != NULL &&
        over_segments(segs, 0, PySequence_Fast_GET_SIZE(segs), t, m, step, ctx, changed) < 0)
        Py_CLEAR(changed);
    Py_DECREF(segs);
    return changed;
}

typedef struct {  /* drop_windows' step: seg_drop_targets' arguments */
    int every;
    uint64_t holder;
    int64_t *taken;
    unsigned char *gone;
} DropCtx;

static int drop_step(Seg *s, const SegTarget *t, size_t m, void *ctx) {
    DropCtx *d = ctx;
    return seg_drop_targets(s, t, m, d->every, d->holder, d->taken, d->gone);
}

/* Window g's part of a flat sequence: ends[g - 1] (0 for g = 0) .. ends[g]. */
static int get_ends(PyObject *arg, const char *name, Py_ssize_t total, Py_buffer *view) {
    if (sarp_get_words(arg, name, 1, 1, 0, 1, view) < 0) return -1;
    int64_t at = 0;
    for (Py_ssize_t g = 0; g < view->shape[0]; g++) {
        int64_t e = (int64_t)sarp_word_at(view, g, 0);
        if (e < at || e > total) {
            PyErr_Format(PyExc_ValueError, "%s[%zd] is %lld: ends must ascend from 0 to %zd",
                         name, g, (long long)e, total);
            PyBuffer_Release(view);
            return -1;
        }
        at = e;
    }
    if (at != total) {
        PyErr_Format(PyExc_ValueError, "%s ends at %lld, not at its sequence's length %zd", name,
                     (long long)at, total);
        PyBuffer_Release(view);
        return -1;
    }
    return 0;
}

/* drop_windows(segs, seg_ends, offs, ids, tgt_ends, holder) -> (changed, taken, gone):
 * WriteTxn.drop over the windows of a removal, in one call. Window g's segments (a
 * sequence of Segment, each window's in the walk's order) are segs[seg_ends[g - 1]:
 * seg_ends[g]] and its targets offs/ids[tgt_ends[g - 1]:tgt_ends[g]] (int64 ends,
 * ascending from 0, the last the length): blocks by offset in the window (offs, int64)
 * and id (ids, (m, 2) uint64); a block named twice in a window counts once. holder: a
 * meta word, or None for every holder. changed: (index in segs, presence, meta, xmeta,
 * xmask) of each segment that changed (new arrays as bytearrays of uint64: the caller
 * installs them on its writable copy); taken: int64 bytes, per target the holdings
 * taken off (0: none, or a repeat); gone: per target 1 when the block is absent where
 * it was dropped. */
static PyObject *drop_windows(PyObject *Py_UNUSED(self), PyObject *const *args,
                              Py_ssize_t nargs) {
    if (nargs != 6) {
        PyErr_Format(PyExc_TypeError, "drop_windows takes 6 arguments (segs, seg_ends, offs, "
                     "ids, tgt_ends, holder), got %zd", nargs);
        return NULL;
    }
    DropCtx d = {args[5] == Py_None, 0, NULL, NULL};
    if (!d.every && sarp_get_uint64_arg(args[5], "holder", &d.holder) < 0) return NULL;
    SegTarget *t;
    Py_ssize_t m;
    if (get_targets(args[2], args[3], NULL, &t, &m) < 0) return NULL;
    PyObject *segs = PySequence_Fast(args[0], "segs must be a sequence of segments");
    if (segs == NULL) {
        PyMem_Free(t);
        return NULL;
    }
    Py_ssize_t ns = PySequence_Fast_GET_SIZE(segs), nw = 0;
    Py_buffer se, te;
    int have_ends = 0;
    PyObject *changed = NULL, *out = NULL, *taken_b = NULL, *gone_b = NULL;
    if (get_ends(args[1], "seg_ends", ns, &se) < 0) goto done;
    if (get_ends(args[4], "tgt_ends", m, &te) < 0) {
        PyBuffer_Release(&se);
        goto done;
    }
    have_ends = 1;
    nw = se.shape[0];
    if (te.shape[0] != nw) {
        PyErr_Format(PyExc_ValueError, "seg_ends has %zd windows, tgt_ends %zd", nw,
                     te.shape[0]);
        goto done;
    }
    taken_b = PyBytes_FromStringAndSize(NULL, m * (Py_ssize_t)sizeof(int64_t));
    gone_b = PyBytes_FromStringAndSize(NULL, m);
    changed = PyList_New(0);
    if (taken_b == NULL || gone_b == NULL || changed == NULL) goto done;
    int64_t *taken = (int64_t *)PyBytes_AS_STRING(taken_b);
    unsigned char *gone = (unsigned char *)PyBytes_AS_STRING(gone_b);
    for (Py_ssize_t k = 0; k < m; k++) {
        taken[k] = -1;
        gone[k] = 0;
    }
    Py_ssize_t k0 = 0, t0 = 0;
    for (Py_ssize_t g = 0; g < nw; g++) {
        Py_ssize_t k1 = (Py_ssize_t)sarp_word_at(&se, g, 0);
        Py_ssize_t t1 = (Py_ssize_t)sarp_word_at(&te, g, 0);
        mark_repeats(t, t0, t1);
        d.taken = taken + t0;
        d.gone = gone + t0;
        if (over_segments(segs, k0, k1, t + t0, t1 - t0, drop_step, &d, changed) < 0) {
            Py_CLEAR(changed);
            goto done;
        }
        k0 = k1;
        t0 = t1;
    }
    for (Py_ssize_t k = 0; k < m; k++)
        if (taken[k] < 0) taken[k] = 0;
    out = PyTuple_Pack(3, changed, taken_b, gone_b);
done:
    if (have_ends) {
        PyBuffer_Release(&se);
        PyBuffer_Release(&te);
    }
    PyMem_Free(t);
    Py_DECREF(segs);
    Py_XDECREF(changed);
    Py_XDECREF(taken_b);
    Py_XDECREF(gone_b);
    return out;
}

static int add_step(Seg *s, const SegTarget *t, size_t m, void *ctx) {
    return seg_add_targets(s, t, m, ctx);
}

static int refill_step(Seg *s, const SegTarget *t, size_t m, void *ctx) {
    return seg_refill_targets(s, t, m, ctx);
}

/* add_holders / refill_blocks (segs, offs, ids, metas) -> (changed, hit): step over the
 * segments of one window (segs, offs and ids as one window of drop_windows', a meta per
 * target): changed as drop_windows gives it, hit: per target 1 where it changed a
 * segment. */
static PyObject *hit_kernel(const char *name, WindowStep step, PyObject *const *args,
                            Py_ssize_t nargs) {
    if (nargs != 4) {
        PyErr_Format(PyExc_TypeError, "%s takes 4 arguments (segs, offs, ids, metas), got %zd",
                     name, nargs);
        return NULL;
    }
    SegTarget *t;
    Py_ssize_t m;
    if (get_targets(args[1], args[2], args[3], &t, &m) < 0) return NULL;
    PyObject *changed = NULL, *out = NULL;
    PyObject *hit_b = PyBytes_FromStringAndSize(NULL, m);
    if (hit_b != NULL) {
        memset(PyBytes_AS_STRING(hit_b), 0, (size_t)m);
        changed = over_window(args[0], t, m, step, PyBytes_AS_STRING(hit_b));
    }
    if (changed != NULL) out = PyTuple_Pack(2, changed, hit_b);
    PyMem_Free(t);
    Py_XDECREF(changed);
    Py_XDECREF(hit_b);
    return out;
}

/* add_holders(segs, offs, ids, metas): WriteTxn.add_holders over one window's segments. */
static PyObject *add_holders(PyObject *Py_UNUSED(self), PyObject *const *args, Py_ssize_t nargs) {
    return hit_kernel("add_holders", add_step, args, nargs);
}

/* refill_blocks(segs, offs, ids, metas): WriteTxn.refill over one window's segments. */
static PyObject *refill_blocks(PyObject *Py_UNUSED(self), PyObject *const *args,
                               Py_ssize_t nargs) {
    return hit_kernel("refill_blocks", refill_step, args, nargs);
}

/* The header fields of Segment `obj` into s (seg_from_object reads the rest); -1 with
 * an exception. */
static int head_from_object(PyObject *obj, Seg *s) {
    PyObject *const attrs[3] = {S_SEG_ID, S_WINDOW, S_NS_TAG};
    static const char *const names[3] = {"segment seg_id", "segment window", "segment ns_tag"};
    uint64_t *const dst[3] = {&s->seg_id, &s->window, &s->ns_tag};
    for (int j = 0; j < 3; j++) {
        PyObject *v = PyObject_GetAttr(obj, attrs[j]);
        if (v == NULL) return -1;
        int bad = sarp_get_uint64_arg(v, names[j], dst[j]);
        Py_DECREF(v);
        if (bad) return -1;
    }
    return 0;
}

/* encode_delta(before, after) -> bytes: delta.encode_delta of two Segment objects (the
 * same segment before and after a change); ValueError, as the reference's, when after
 * is shorter or has another window or ns tag. */
static PyObject *encode_delta(PyObject *Py_UNUSED(self), PyObject *const *args,
                              Py_ssize_t nargs) {
    if (nargs != 2) {
        PyErr_Format(PyExc_TypeError, "encode_delta takes 2 arguments (before, after), got %zd",
                     nargs);
        return NULL;
    }
    Seg b, a;
    seg_init(&b);
    seg_init(&a);
    int bad = 0;
    for (int j = 0; j < 2 && !bad; j++) {
        PyObject *obj = args[j];
        Py_INCREF(obj);  /* its attribute reads may run Python code */
        bad = head_from_object(obj, j ? &a : &b) < 0 || seg_from_object(obj, j ? &a : &b) < 0;
        Py_DECREF(obj);
    }
    PyObject *out = bad ? NULL : delta_bytes(&b, &a);
    seg_free(&b);
    seg_free(&a);
    return out;
}

/* CHECKS: the failure codes of segment.h by name (what parse_segment, seg_ops and
 * apply_delta return). */
static int add_checks(PyObject *mod) {
    static const struct { const char *name; int code; } checks[] = {
        {"short", SEG_SHORT}, {"magic", SEG_MAGIC}, {"format", SEG_FORMAT},
        {"format1_table", SEG_FORMAT1_TABLE}, {"size", SEG_SIZE}, {"checksum", SEG_CHECKSUM},
        {"table", SEG_TABLE}, {"delta_short", SEG_DELTA_SHORT}, {"delta_magic", SEG_DELTA_MAGIC},
        {"delta_checksum", SEG_DELTA_CHECKSUM}, {"delta_fit", SEG_DELTA_FIT},
        {"delta_blocks", SEG_DELTA_BLOCKS}, {"delta_moved", SEG_DELTA_MOVED},
        {"blocks", SEG_BLOCKS}, {"holders", SEG_HOLDERS}, {"nomem", SEG_NOMEM},
    };
    PyObject *d = PyDict_New();
    if (d == NULL) return -1;
    for (size_t j = 0; j < sizeof checks / sizeof checks[0]; j++) {
        PyObject *v = PyLong_FromLong(checks[j].code);
        int bad = v == NULL || PyDict_SetItemString(d, checks[j].name, v) < 0;
        Py_XDECREF(v);
        if (bad) {
            Py_DECREF(d);
            return -1;
        }
    }
    if (PyModule_AddObject(mod, "CHECKS", d) < 0) {
        Py_DECREF(d);
        return -1;
    }
    return 0;
}

static PyMethodDef methods[] = {
    {"filters", (PyCFunction)(void (*)(void))filters, METH_FASTCALL,
     "The routing filters of points at offsets of a segment with these ids."},
    {"encode_segment", (PyCFunction)(void (*)(void))encode_segment, METH_FASTCALL,
     "A segment value (segment.py's layout) from its fields and arrays."},
    {"parse_segment", parse_segment, METH_O,
     "A checked value's header fields, or the int of the first check it fails."},
    {"block_keys", block_keys, METH_O, "The locator keys of ids ((n, 2) uint64)."},
    {"seg_ops", (PyCFunction)(void (*)(void))seg_ops, METH_FASTCALL,
     "Run holder operations on a decoded segment value (the C segment library)."},
    {"delta", (PyCFunction)(void (*)(void))delta, METH_FASTCALL,
     "The delta record that turns one segment value's segment into another's."},
    {"encode_delta", (PyCFunction)(void (*)(void))encode_delta, METH_FASTCALL,
     "The delta record that turns one Segment into another (delta.encode_delta)."},
    {"apply_delta", (PyCFunction)(void (*)(void))apply_delta, METH_FASTCALL,
     "A segment value with a delta record applied, or the int of the failed check."},
    {"drop_windows", (PyCFunction)(void (*)(void))drop_windows, METH_FASTCALL,
     "WriteTxn.drop over a removal's windows: the changed segments, holdings, blocks gone."},
    {"add_holders", (PyCFunction)(void (*)(void))add_holders, METH_FASTCALL,
     "WriteTxn.add_holders over one window's segments: the changed ones, targets added."},
    {"refill_blocks", (PyCFunction)(void (*)(void))refill_blocks, METH_FASTCALL,
     "WriteTxn.refill over one window's segments: the changed ones, targets refilled."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "sarpd.core._cwrite",
                                    "C codecs of the write path's records.", -1, methods,
                                    NULL, NULL, NULL, NULL};

PyMODINIT_FUNC PyInit__cwrite(void) {
#if !PY_LITTLE_ENDIAN
    /* the values are little-endian and the arrays are copied as they are in memory */
    PyErr_SetString(PyExc_ImportError, "sarpd.core._cwrite needs a little-endian host");
    return NULL;
#endif
    S_PRESENCE = PyUnicode_InternFromString("presence");
    S_IDS = PyUnicode_InternFromString("ids");
    S_META = PyUnicode_InternFromString("meta");
    S_XMETA = PyUnicode_InternFromString("xmeta");
    S_XMASK = PyUnicode_InternFromString("xmask");
    S_SEG_ID = PyUnicode_InternFromString("seg_id");
    S_WINDOW = PyUnicode_InternFromString("window");
    S_NS_TAG = PyUnicode_InternFromString("ns_tag");
    if (!S_PRESENCE || !S_IDS || !S_META || !S_XMETA || !S_XMASK || !S_SEG_ID || !S_WINDOW ||
        !S_NS_TAG)
        return NULL;
    PyObject *mod = PyModule_Create(&module);
    if (mod != NULL && add_checks(mod) < 0) Py_CLEAR(mod);
    return mod;
}
