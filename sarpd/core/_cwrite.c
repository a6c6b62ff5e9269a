/* The write path's records in C: the twin of the codecs in segment.py.
 *
 * encode_segment packs a segment value byte for byte as segment.encode_segment does
 * (the layout is segment.py's module docstring: a 48-byte header, ids, first holders,
 * format 2's holder table; CRC-32 of bytes [0, 40) then [44, end), zlib's CRC).
 * parse_segment checks a value as segment.decode_segment does and returns its header
 * fields, or an int (the failed check) so that the caller raises the reference's own
 * error. block_keys and put_locators build the block locator records
 * (b"B" + 16-byte id -> u64 head key + u32 position, little-endian); filters is
 * the twin of routing.filters_at(routing.fingerprints(ids), offsets) for register.
 * Arrays are C-contiguous uint64 buffers (ids of shape (n, 2)). */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

#define HEADER 48
#define MAX_BLOCKS 64
#define LOCATOR_KEY 17  /* b"B" + 16-byte id */
#define LOCATOR_VALUE 12  /* u64 head key + u32 position */

/* CRC-32 (zlib's polynomial), slicing by 8: crc_table[k][b] is the CRC of byte b
 * followed by k zero bytes, so eight table lookups consume eight input bytes. */
static uint32_t crc_table[8][256];

static void crc_init(void) {
    for (uint32_t i = 0; i < 256; i++) {
        uint32_t c = i;
        for (int k = 0; k < 8; k++) c = (c & 1) ? 0xEDB88320u ^ (c >> 1) : c >> 1;
        crc_table[0][i] = c;
    }
    for (uint32_t i = 0; i < 256; i++)
        for (int k = 1; k < 8; k++)
            crc_table[k][i] = (crc_table[k - 1][i] >> 8) ^ crc_table[0][crc_table[k - 1][i] & 0xFF];
}

/* zlib.crc32(buf, crc) */
static uint32_t crc32_update(uint32_t crc, const unsigned char *p, size_t n) {
    crc = ~crc;
    while (n >= 8) {
        uint32_t lo = crc ^ ((uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16
                             | (uint32_t)p[3] << 24);
        uint32_t hi = (uint32_t)p[4] | (uint32_t)p[5] << 8 | (uint32_t)p[6] << 16
                      | (uint32_t)p[7] << 24;
        crc = crc_table[7][lo & 0xFF] ^ crc_table[6][(lo >> 8) & 0xFF]
              ^ crc_table[5][(lo >> 16) & 0xFF] ^ crc_table[4][lo >> 24]
              ^ crc_table[3][hi & 0xFF] ^ crc_table[2][(hi >> 8) & 0xFF]
              ^ crc_table[1][(hi >> 16) & 0xFF] ^ crc_table[0][hi >> 24];
        p += 8;
        n -= 8;
    }
    while (n--) crc = crc_table[0][(crc ^ *p++) & 0xFF] ^ (crc >> 8);
    return ~crc;
}

static void put_u64(unsigned char *p, uint64_t v) {
    for (int i = 0; i < 8; i++) p[i] = (unsigned char)(v >> (8 * i));
}

static void put_u32(unsigned char *p, uint32_t v) {
    for (int i = 0; i < 4; i++) p[i] = (unsigned char)(v >> (8 * i));
}

static uint64_t get_u64(const unsigned char *p) {
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--) v = (v << 8) | p[i];
    return v;
}

static uint32_t get_u32(const unsigned char *p) {
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

/* Get `obj` as a C-contiguous uint64 buffer; on error set an exception naming `name`
 * and return -1. The number of uint64 items is view->len / 8. */
static int get_u64s(PyObject *obj, const char *name, Py_buffer *view) {
    if (PyObject_GetBuffer(obj, view, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT) < 0) {
        PyObject *type, *value, *tb;
        int no_buffer = PyErr_ExceptionMatches(PyExc_TypeError);
        PyErr_Fetch(&type, &value, &tb);
        if (no_buffer)
            PyErr_Format(PyExc_TypeError, "%s must be a uint64 array, got %.100s", name,
                         Py_TYPE(obj)->tp_name);
        else
            PyErr_Format(PyExc_ValueError, "%s must be a C-contiguous uint64 array (%S)", name,
                         value ? value : Py_None);
        Py_XDECREF(type);
        Py_XDECREF(value);
        Py_XDECREF(tb);
        return -1;
    }
    const char *f = view->format ? view->format : "B";
    if (*f == '@' || *f == '=' || (PY_LITTLE_ENDIAN && *f == '<')) f++;  /* native order */
    if (view->itemsize != 8 || !((f[0] == 'Q' || f[0] == 'L') && f[1] == '\0')) {
        PyErr_Format(PyExc_TypeError,
                     "%s must have dtype uint64, got buffer format '%s' (itemsize %zd)", name,
                     view->format ? view->format : "B", view->itemsize);
        PyBuffer_Release(view);
        return -1;
    }
    return 0;
}

/* An id array: uint64 of shape (n, 2). */
static int get_ids(PyObject *obj, const char *name, Py_buffer *view) {
    if (get_u64s(obj, name, view) < 0) return -1;
    if (view->ndim != 2 || view->shape[1] != 2) {
        PyErr_Format(PyExc_ValueError, "%s must have shape (n, 2), got ndim %d%s", name,
                     view->ndim, view->ndim == 2 ? " with a second dimension other than 2" : "");
        PyBuffer_Release(view);
        return -1;
    }
    return 0;
}

static int get_uint64_arg(PyObject *obj, const char *name, uint64_t *out) {
    if (!PyLong_Check(obj)) {
        PyErr_Format(PyExc_TypeError, "%s must be an int, got %.100s", name, Py_TYPE(obj)->tp_name);
        return -1;
    }
    unsigned long long v = PyLong_AsUnsignedLongLong(obj);
    if (v == (unsigned long long)-1 && PyErr_Occurred()) {
        PyErr_Clear();
        PyErr_Format(PyExc_OverflowError, "%s must be in [0, 2**64), got %R", name, obj);
        return -1;
    }
    *out = (uint64_t)v;
    return 0;
}

/* encode_segment(seg_id, window, presence, ns_tag, ids, meta, xmeta, xmask) -> bytes */
static PyObject *encode_segment(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 8) {
        PyErr_Format(PyExc_TypeError, "encode_segment takes 8 arguments (seg_id, window, "
                     "presence, ns_tag, ids, meta, xmeta, xmask), got %zd", nargs);
        return NULL;
    }
    uint64_t seg_id, window, presence, tag;
    if (get_uint64_arg(args[0], "seg_id", &seg_id) < 0 ||
        get_uint64_arg(args[1], "window", &window) < 0 ||
        get_uint64_arg(args[2], "presence", &presence) < 0 ||
        get_uint64_arg(args[3], "ns_tag", &tag) < 0)
        return NULL;
    Py_buffer ids, meta, xmeta, xmask;
    if (get_ids(args[4], "ids", &ids) < 0) return NULL;
    PyObject *out = NULL;
    if (get_u64s(args[5], "meta", &meta) < 0) goto free_ids;
    if (get_u64s(args[6], "xmeta", &xmeta) < 0) goto free_meta;
    if (get_u64s(args[7], "xmask", &xmask) < 0) goto free_xmeta;
    Py_ssize_t n = ids.shape[0], h = xmeta.len / 8;
    if (n < 1 || n > MAX_BLOCKS) {
        PyErr_Format(PyExc_ValueError, "ids: %zd blocks, a segment holds 1..%d", n, MAX_BLOCKS);
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
    if (n < 64) presence &= ((uint64_t)1 << n) - 1;
    Py_ssize_t size = HEADER + 24 * n + 16 * h;
    out = PyBytes_FromStringAndSize(NULL, size);
    if (out == NULL) goto done;
    unsigned char *p = (unsigned char *)PyBytes_AS_STRING(out);
    memcpy(p, "SRPS", 4);
    p[4] = h ? 2 : 1;
    p[5] = (unsigned char)n;
    p[6] = p[7] = 0;
    put_u64(p + 8, seg_id);
    put_u64(p + 16, window);
    put_u64(p + 24, presence);
    put_u64(p + 32, tag);
    put_u32(p + 44, (uint32_t)h);
    Py_BEGIN_ALLOW_THREADS
    /* native little-endian uint64 is the value's byte order */
    memcpy(p + HEADER, ids.buf, (size_t)(16 * n));
    memcpy(p + HEADER + 16 * n, meta.buf, (size_t)(8 * n));
    if (h) {
        memcpy(p + HEADER + 24 * n, xmeta.buf, (size_t)(8 * h));
        memcpy(p + HEADER + 24 * n + 8 * h, xmask.buf, (size_t)(8 * h));
    }
    uint32_t crc = crc32_update(crc32_update(0, p, 40), p + 44, (size_t)(size - 44));
    put_u32(p + 40, crc);
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

/* The checks of segment.decode_segment, in its order; 0 when the value passes. */
enum { OK = 0, SHORT, MAGIC, FORMAT, FORMAT1_TABLE, SIZE, CHECKSUM, TABLE };

static int check_value(const unsigned char *p, Py_ssize_t len) {
    if (len < HEADER) return SHORT;
    if (memcmp(p, "SRPS", 4) != 0) return MAGIC;
    unsigned fmt = p[4], n = p[5];
    uint64_t h = get_u32(p + 44);
    if (fmt != 1 && fmt != 2) return FORMAT;
    if (fmt == 1 && h) return FORMAT1_TABLE;
    if (n < 1 || n > MAX_BLOCKS || (uint64_t)len != HEADER + 24 * (uint64_t)n + 16 * h)
        return SIZE;
    if (crc32_update(crc32_update(0, p, 40), p + 44, (size_t)(len - 44)) != get_u32(p + 40))
        return CHECKSUM;
    uint64_t presence = get_u64(p + 24);
    const unsigned char *xm = p + HEADER + 24 * n, *xk = xm + 8 * h;
    for (uint64_t j = 0; j < h; j++) {
        uint64_t mask = get_u64(xk + 8 * j);
        if (mask == 0 || (mask & ~presence)) return TABLE;
        if (j && get_u64(xm + 8 * j) <= get_u64(xm + 8 * (j - 1))) return TABLE;
    }
    return OK;
}

/* parse_segment(value) -> (fmt, n, seg_id, window, presence, ns_tag, h), or the int
 * of the first check the value fails (the caller raises the reference's error). */
static PyObject *parse_segment(PyObject *self, PyObject *arg) {
    Py_buffer v;
    if (PyObject_GetBuffer(arg, &v, PyBUF_SIMPLE) < 0) {
        PyErr_Format(PyExc_TypeError, "value must be bytes, got %.100s", Py_TYPE(arg)->tp_name);
        return NULL;
    }
    const unsigned char *p = (const unsigned char *)v.buf;
    int code;
    Py_BEGIN_ALLOW_THREADS
    code = check_value(p, v.len);
    Py_END_ALLOW_THREADS
    PyObject *out;
    if (code != OK)
        out = PyLong_FromLong(code);
    else
        out = Py_BuildValue("(iiKKKKk)", (int)p[4], (int)p[5],
                            (unsigned long long)get_u64(p + 8), (unsigned long long)get_u64(p + 16),
                            (unsigned long long)get_u64(p + 24), (unsigned long long)get_u64(p + 32),
                            (unsigned long)get_u32(p + 44));
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
static PyObject *block_keys(PyObject *self, PyObject *arg) {
    Py_buffer ids;
    if (get_ids(arg, "ids", &ids) < 0) return NULL;
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

/* put_locators(d, ids, head_key, first_pos): d[block key of ids[i]] = locator of
 * (head_key, first_pos + i), in order (a later record of a block wins). */
static PyObject *put_locators(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 4) {
        PyErr_Format(PyExc_TypeError, "put_locators takes 4 arguments (d, ids, head_key, "
                     "first_pos), got %zd", nargs);
        return NULL;
    }
    if (!PyDict_Check(args[0])) {
        PyErr_Format(PyExc_TypeError, "d must be a dict, got %.100s", Py_TYPE(args[0])->tp_name);
        return NULL;
    }
    uint64_t head, first;
    if (get_uint64_arg(args[2], "head_key", &head) < 0 ||
        get_uint64_arg(args[3], "first_pos", &first) < 0)
        return NULL;
    Py_buffer ids;
    if (get_ids(args[1], "ids", &ids) < 0) return NULL;
    Py_ssize_t n = ids.shape[0];
    if (first + (uint64_t)n > 0xFFFFFFFFull + 1) {
        PyErr_Format(PyExc_OverflowError, "first_pos %llu + %zd blocks: a position is a u32",
                     (unsigned long long)first, n);
        PyBuffer_Release(&ids);
        return NULL;
    }
    const unsigned char *p = (const unsigned char *)ids.buf;
    PyObject *ret = Py_None;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *k = block_key(p + 16 * i);
        PyObject *v = PyBytes_FromStringAndSize(NULL, LOCATOR_VALUE);
        int bad = k == NULL || v == NULL;
        if (!bad) {
            unsigned char *s = (unsigned char *)PyBytes_AS_STRING(v);
            put_u64(s, head);
            put_u32(s + 8, (uint32_t)(first + (uint64_t)i));
            bad = PyDict_SetItem(args[0], k, v) < 0;
        }
        Py_XDECREF(k);
        Py_XDECREF(v);
        if (bad) { ret = NULL; break; }
    }
    PyBuffer_Release(&ids);
    Py_XINCREF(ret);
    return ret;
}

/* A block's 4-bit fingerprint (routing.fingerprints): 1..15, 0 past the end. */
static unsigned fingerprint(const unsigned char *ids, Py_ssize_t n, Py_ssize_t i) {
    if (i >= n) return 0;
    uint64_t id[2];
    memcpy(id, ids + 16 * i, sizeof id);
    uint64_t mixed = (id[0] ^ id[1]) * 0x9E3779B97F4A7C15ull;
    return (unsigned)((mixed >> 32) % 15) + 1;
}

/* filters(ids, offsets) -> list of the 64-bit filters of points at `offsets` of a
 * segment with these ids (routing.filters_at of routing.fingerprints): byte j holds
 * the fingerprints of blocks offset + 2j + 1 (high nibble) and offset + 2j + 2. */
static PyObject *filters(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 2) {
        PyErr_Format(PyExc_TypeError, "filters takes 2 arguments (ids, offsets), got %zd", nargs);
        return NULL;
    }
    PyObject *offs = PySequence_Fast(args[1], "offsets must be a sequence of ints");
    if (offs == NULL) return NULL;
    Py_buffer ids;
    if (get_ids(args[0], "ids", &ids) < 0) { Py_DECREF(offs); return NULL; }
    Py_ssize_t m = PySequence_Fast_GET_SIZE(offs), n = ids.shape[0];
    const unsigned char *p = (const unsigned char *)ids.buf;
    PyObject *out = PyList_New(m);
    for (Py_ssize_t k = 0; out != NULL && k < m; k++) {
        Py_ssize_t o = PyLong_AsSsize_t(PySequence_Fast_GET_ITEM(offs, k));
        if (o == -1 && PyErr_Occurred()) { Py_CLEAR(out); break; }
        if (o < 0 || o > MAX_BLOCKS) {
            PyErr_Format(PyExc_ValueError, "offsets[%zd] is %zd, not in 0..%d", k, o, MAX_BLOCKS);
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

static PyMethodDef methods[] = {
    {"filters", (PyCFunction)(void (*)(void))filters, METH_FASTCALL,
     "The routing filters of points at offsets of a segment with these ids."},
    {"encode_segment", (PyCFunction)(void (*)(void))encode_segment, METH_FASTCALL,
     "A segment value (segment.py's layout) from its fields and arrays."},
    {"parse_segment", parse_segment, METH_O,
     "A checked value's header fields, or the int of the first check it fails."},
    {"block_keys", block_keys, METH_O, "The locator keys of ids ((n, 2) uint64)."},
    {"put_locators", (PyCFunction)(void (*)(void))put_locators, METH_FASTCALL,
     "Set the locator records of ids (head key, first position on) into a dict."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "sarpd.core._cwrite",
                                    "C codecs of the write path's records.", -1, methods};

PyMODINIT_FUNC PyInit__cwrite(void) {
#if !PY_LITTLE_ENDIAN
    /* the values are little-endian and the arrays are copied as they are in memory */
    PyErr_SetString(PyExc_ImportError, "sarpd.core._cwrite needs a little-endian host");
    return NULL;
#endif
    crc_init();
    return PyModule_Create(&module);
}
