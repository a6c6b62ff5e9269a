/* Chained 128-bit block ids: the C twin of the reference in sarpd/core/ids.py.
 *
 *     id[-1] = parent                                   (16 bytes)
 *     id[i]  = XXH3-128(id[i-1] + tokens[bt i : bt i + bt] as uint32 LE)
 *
 * Each id is the digest's canonical (big-endian) 16 bytes, as Python's
 * xxhash.xxh3_128_digest returns it; read as two little-endian uint64 it is the (n, 2)
 * id form of sarpd.model. Linked against the system's libxxhash (Debian:
 * libxxhash-dev), never a copy of its source.
 *
 * chain_ids(parent, tokens, block_tokens) -> bytearray of 16 n bytes
 * chain_ids_flat(parents, tokens, offsets, block_tokens)
 *     -> (bytearray of 16 N bytes, bytearray of m + 1 native int64 id offsets)
 *     sequence j is tokens[offsets[j] : offsets[j + 1]] chained after parents[16 j :
 *     16 j + 16]; its ids are rows id_offsets[j] : id_offsets[j + 1] of the result.
 *
 * msgpack_u32(raw) -> bytes of 4 n, or None
 *     raw: ONE msgpack value (a message's field, e.g. an event's token_ids as
 *     msgspec.Raw); an array of n ints in [0, 2**32) in any msgpack int encoding ->
 *     their uint32 little-endian bytes; None for anything else (another type, an
 *     element that is not such an int, bytes past the value or missing). Reference:
 *     sarpd.events.schema `_ref_token_bytes` (msgspec's list[int], then array.array).
 *
 * Argument errors are TypeError / ValueError naming the argument, with the same text
 * as the reference's (tests compare them; the array checks are csrc/sarp.h's). The GIL
 * is released around the hashing loop when it is long enough to pay for it. */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>
#include <xxhash.h>

#include "sarp.h"

#define MAX_BLOCK_TOKENS ((Py_ssize_t)1 << 30) /* 4 GiB of tokens per block */
#define STACK_TOKENS 256                       /* blocks up to this size hash from the stack */
#define NOGIL_BLOCKS 64                        /* release the GIL from this many blocks */

static int get_tokens(PyObject *obj, Py_buffer *view) {
    return sarp_get_array(obj, "tokens", "uint32", 4, 'I', 'L', view);
}

/* Contiguous bytes of any format (ids: 16 bytes each). */
static int get_bytes(PyObject *obj, const char *name, const char *what, Py_buffer *view) {
    if (sarp_get_view(obj, name, what, view) < 0) return -1;
    if (!PyBuffer_IsContiguous(view, 'C')) {
        PyErr_Format(PyExc_ValueError, "%s must be C-contiguous", name);
        PyBuffer_Release(view);
        return -1;
    }
    return 0;
}

static Py_ssize_t get_block_tokens(PyObject *obj) {
    PyObject *i = PyNumber_Index(obj);
    if (i == NULL) {
        if (PyErr_ExceptionMatches(PyExc_TypeError)) {
            PyErr_Clear();
            PyErr_Format(PyExc_TypeError, "block_tokens must be an int, got %.100s",
                         Py_TYPE(obj)->tp_name);
        }
        return -1;
    }
    int overflow = 0;
    long long v = PyLong_AsLongLongAndOverflow(i, &overflow);
    if (v == -1 && PyErr_Occurred()) { Py_DECREF(i); return -1; }
    if (overflow || v < 1 || v > MAX_BLOCK_TOKENS) {
        PyErr_Format(PyExc_ValueError, "block_tokens must be in [1, %zd], got %S",
                     MAX_BLOCK_TOKENS, i);
        Py_DECREF(i);
        return -1;
    }
    Py_DECREF(i);
    return (Py_ssize_t)v;
}

/* Hash n blocks of bt tokens after `parent` into out (16 n bytes); buf holds
 * 16 + 4 bt bytes. Touches no Python object: runs without the GIL. */
static void chain(const unsigned char *parent, const uint32_t *tokens, Py_ssize_t n,
                  Py_ssize_t bt, unsigned char *buf, unsigned char *out) {
    size_t step = 4 * (size_t)bt;
    memcpy(buf, parent, 16);
    for (Py_ssize_t i = 0; i < n; i++) {
#if PY_LITTLE_ENDIAN
        memcpy(buf + 16, tokens + i * bt, step);
#else
        for (Py_ssize_t k = 0; k < bt; k++) {
            uint32_t t = tokens[i * bt + k];
            unsigned char *p = buf + 16 + 4 * k;
            p[0] = (unsigned char)t; p[1] = (unsigned char)(t >> 8);
            p[2] = (unsigned char)(t >> 16); p[3] = (unsigned char)(t >> 24);
        }
#endif
        XXH128_hash_t h = XXH3_128bits(buf, 16 + step);
        XXH128_canonicalFromHash((XXH128_canonical_t *)buf, h);  /* the next parent */
        memcpy(out + 16 * i, buf, 16);
    }
}

/* Scratch for one block's input: the stack's for small blocks, else the heap's. */
typedef struct {
    unsigned char small[16 + 4 * STACK_TOKENS];
    unsigned char *buf;
} scratch;

static int scratch_init(scratch *s, Py_ssize_t bt) {
    s->buf = s->small;
    if (bt > STACK_TOKENS) {
        s->buf = PyMem_RawMalloc(16 + 4 * (size_t)bt);
        if (s->buf == NULL) { PyErr_NoMemory(); return -1; }
    }
    return 0;
}

static void scratch_free(scratch *s) {
    if (s->buf != s->small) PyMem_RawFree(s->buf);
}

static PyObject *chain_ids(PyObject *Py_UNUSED(self), PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 3) {
        PyErr_Format(PyExc_TypeError,
                     "chain_ids takes 3 arguments (parent, tokens, block_tokens), got %zd", nargs);
        return NULL;
    }
    Py_buffer p, t;
    PyObject *out = NULL;
    Py_ssize_t bt = get_block_tokens(args[2]);
    if (bt < 0) return NULL;
    if (get_bytes(args[0], "parent", "a 16-byte id (bytes)", &p) < 0) return NULL;
    if (p.len != 16) {
        PyErr_Format(PyExc_ValueError, "parent must be 16 bytes, got %zd", p.len);
        PyBuffer_Release(&p);
        return NULL;
    }
    if (get_tokens(args[1], &t) < 0) { PyBuffer_Release(&p); return NULL; }
    Py_ssize_t n = t.shape[0] / bt;
    scratch s;
    out = PyByteArray_FromStringAndSize(NULL, 16 * n);
    if (out != NULL && n > 0) {
        if (scratch_init(&s, bt) < 0) {
            Py_CLEAR(out);
        } else {
            unsigned char *o = (unsigned char *)PyByteArray_AS_STRING(out);
            if (n >= NOGIL_BLOCKS) {
                Py_BEGIN_ALLOW_THREADS
                chain(p.buf, t.buf, n, bt, s.buf, o);
                Py_END_ALLOW_THREADS
            } else {
                chain(p.buf, t.buf, n, bt, s.buf, o);
            }
            scratch_free(&s);
        }
    }
    PyBuffer_Release(&p);
    PyBuffer_Release(&t);
    return out;
}

/* Check offsets (non-decreasing within [0, n_tokens]) and write each sequence's first
 * id row into ioff (m + 1 entries); returns the total number of ids, or -1. */
static Py_ssize_t id_offsets(const int64_t *off, Py_ssize_t m, Py_ssize_t n_tokens,
                             Py_ssize_t bt, int64_t *ioff) {
    int64_t total = 0, prev = 0;
    for (Py_ssize_t j = 0; j <= m; j++) {
        int64_t v = off[j];
        if (v < prev || v > n_tokens) {
            PyErr_Format(PyExc_ValueError,
                         "offsets[%zd] = %lld: offsets must be non-decreasing within [0, %zd] "
                         "(len(tokens))", j, (long long)v, n_tokens);
            return -1;
        }
        if (j > 0) total += (v - prev) / bt;
        ioff[j] = total;
        prev = v;
    }
    return (Py_ssize_t)total;
}

/* Hash every sequence of the batch (no Python object touched: runs without the GIL). */
static void chain_many(const unsigned char *parents, const uint32_t *tokens, const int64_t *off,
                       const int64_t *ioff, Py_ssize_t m, Py_ssize_t bt, unsigned char *buf,
                       unsigned char *out) {
    for (Py_ssize_t j = 0; j < m; j++)
        chain(parents + 16 * j, tokens + off[j], ioff[j + 1] - ioff[j], bt, buf,
              out + 16 * ioff[j]);
}

/* The batch's result for buffers already checked: (ids, id_offsets), or NULL. */
static PyObject *hash_batch(const Py_buffer *p, const Py_buffer *t, const Py_buffer *o,
                            Py_ssize_t m, Py_ssize_t bt) {
    PyObject *ioffs = PyByteArray_FromStringAndSize(NULL, 8 * (m + 1));
    if (ioffs == NULL) return NULL;
    int64_t *ioff = (int64_t *)PyByteArray_AS_STRING(ioffs);
    Py_ssize_t total = id_offsets(o->buf, m, t->shape[0], bt, ioff);
    PyObject *ids = total < 0 ? NULL : PyByteArray_FromStringAndSize(NULL, 16 * total);
    scratch s;
    if (ids != NULL && total > 0 && scratch_init(&s, bt) == 0) {
        unsigned char *dst = (unsigned char *)PyByteArray_AS_STRING(ids);
        if (total >= NOGIL_BLOCKS) {
            Py_BEGIN_ALLOW_THREADS
            chain_many(p->buf, t->buf, o->buf, ioff, m, bt, s.buf, dst);
            Py_END_ALLOW_THREADS
        } else {
            chain_many(p->buf, t->buf, o->buf, ioff, m, bt, s.buf, dst);
        }
        scratch_free(&s);
    } else if (ids != NULL && total > 0) {
        Py_CLEAR(ids);  /* no memory for the scratch */
    }
    PyObject *out = ids == NULL ? NULL : PyTuple_Pack(2, ids, ioffs);
    Py_XDECREF(ids);
    Py_DECREF(ioffs);
    return out;
}

static PyObject *chain_ids_flat(PyObject *Py_UNUSED(self), PyObject *const *args,
                                Py_ssize_t nargs) {
    if (nargs != 4) {
        PyErr_Format(PyExc_TypeError,
                     "chain_ids_flat takes 4 arguments (parents, tokens, offsets, block_tokens), "
                     "got %zd", nargs);
        return NULL;
    }
    Py_buffer p, t, o;
    PyObject *out = NULL;
    Py_ssize_t bt = get_block_tokens(args[3]);
    if (bt < 0) return NULL;
    if (sarp_get_i64_1d(args[2], "offsets", &o) < 0) return NULL;
    Py_ssize_t m = o.shape[0] - 1;
    if (m < 0) {
        PyErr_SetString(PyExc_ValueError,
                        "offsets must hold one entry more than there are sequences, got 0 entries");
        PyBuffer_Release(&o);
        return NULL;
    }
    if (get_bytes(args[0], "parents", "16 bytes per sequence (bytes)", &p) < 0) {
        PyBuffer_Release(&o);
        return NULL;
    }
    if (p.len != 16 * m) {
        PyErr_Format(PyExc_ValueError,
                     "parents must be 16 bytes per sequence (%zd sequences: %zd bytes), got %zd",
                     m, 16 * m, p.len);
    } else if (get_tokens(args[1], &t) == 0) {
        out = hash_batch(&p, &t, &o, m, bt);
        PyBuffer_Release(&t);
    }
    PyBuffer_Release(&p);
    PyBuffer_Release(&o);
    return out;
}

/* block_hashes(tokens, block_tokens, seed): XXH3-64 of each whole block alone (not
 * chained), with `seed` (a uint64): the indexer API's per-block hashes (reference:
 * sarpd.indexer.hashing `_ref_local_hashes`), 8 native bytes each. */
static PyObject *block_hashes(PyObject *Py_UNUSED(self), PyObject *const *args,
                              Py_ssize_t nargs) {
    if (nargs != 3) {
        PyErr_Format(PyExc_TypeError,
                     "block_hashes takes 3 arguments (tokens, block_tokens, seed), got %zd",
                     nargs);
        return NULL;
    }
    Py_ssize_t bt = get_block_tokens(args[1]);
    if (bt < 0) return NULL;
    if (!PyLong_Check(args[2])) {
        PyErr_Format(PyExc_TypeError, "seed must be an int, got %.100s",
                     Py_TYPE(args[2])->tp_name);
        return NULL;
    }
    unsigned long long seed = PyLong_AsUnsignedLongLong(args[2]);
    if (seed == (unsigned long long)-1 && PyErr_Occurred()) {
        PyErr_Clear();
        PyErr_Format(PyExc_ValueError, "seed must be in [0, 2**64), got %S", args[2]);
        return NULL;
    }
    Py_buffer t;
    if (get_tokens(args[0], &t) < 0) return NULL;
    Py_ssize_t n = t.shape[0] / bt;
    PyObject *out = PyByteArray_FromStringAndSize(NULL, 8 * n);
    if (out != NULL) {
        uint64_t *o = (uint64_t *)PyByteArray_AS_STRING(out);
        const uint32_t *tok = t.buf;
        for (Py_ssize_t i = 0; i < n; i++)
            o[i] = XXH3_64bits_withSeed(tok + i * bt, 4 * (size_t)bt, (XXH64_hash_t)seed);
    }
    PyBuffer_Release(&t);
    return out;
}

/* One msgpack int at *p (end: one past the buffer) in [0, 2**32): 0 and *out set and
 * *p advanced, or -1 (not such an int, or truncated). */
static int read_u32(const uint8_t **p, const uint8_t *end, uint32_t *out) {
    const uint8_t *q = *p;
    if (q >= end) return -1;
    uint8_t b = *q++;
    uint64_t v;
    int width;
    if (b <= 0x7f) { *out = b; *p = q; return 0; }
    switch (b) {
    case 0xcc: case 0xd0: width = 1; break;
    case 0xcd: case 0xd1: width = 2; break;
    case 0xce: case 0xd2: width = 4; break;
    case 0xcf: case 0xd3: width = 8; break;
    default: return -1; /* negative fixint, nil, bool, float, str, bin, array, map, ext */
    }
    if (end - q < width) return -1;
    v = 0;
    for (int i = 0; i < width; i++) v = v << 8 | q[i];
    if (b >= 0xd0 && (q[0] & 0x80)) return -1; /* a signed encoding of a negative int */
    if (v > 0xffffffffu) return -1;
    *out = (uint32_t)v;
    *p = q + width;
    return 0;
}

static PyObject *msgpack_u32(PyObject *Py_UNUSED(self), PyObject *const *args,
                             Py_ssize_t nargs) {
    if (nargs != 1) {
        PyErr_Format(PyExc_TypeError, "msgpack_u32 takes 1 argument (raw), got %zd", nargs);
        return NULL;
    }
    Py_buffer raw;
    if (PyObject_GetBuffer(args[0], &raw, PyBUF_SIMPLE) < 0) {
        PyErr_Clear();
        PyErr_Format(PyExc_TypeError, "raw must be a bytes-like object, got %.100s",
                     Py_TYPE(args[0])->tp_name);
        return NULL;
    }
    const uint8_t *p = raw.buf, *end = p + raw.len;
    Py_ssize_t n = -1;
    if (p < end) {
        uint8_t b = *p++;
        if (b >= 0x90 && b <= 0x9f) {
            n = b & 0x0f;
        } else if (b == 0xdc && end - p >= 2) {
            n = (Py_ssize_t)p[0] << 8 | p[1];
            p += 2;
        } else if (b == 0xdd && end - p >= 4) {
            n = (Py_ssize_t)((uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 |
                             (uint32_t)p[2] << 8 | p[3]);
            p += 4;
        }
    }
    PyObject *out = NULL;
    if (n >= 0 && n <= end - p) { /* every element takes a byte at least */
        out = PyBytes_FromStringAndSize(NULL, 4 * n);
        if (out == NULL) { PyBuffer_Release(&raw); return NULL; }
        uint8_t *o = (uint8_t *)PyBytes_AS_STRING(out);
        for (Py_ssize_t i = 0; i < n; i++) {
            uint32_t v;
            if (read_u32(&p, end, &v) < 0) { Py_CLEAR(out); break; }
            o[4 * i] = (uint8_t)v;
            o[4 * i + 1] = (uint8_t)(v >> 8);
            o[4 * i + 2] = (uint8_t)(v >> 16);
            o[4 * i + 3] = (uint8_t)(v >> 24);
        }
        if (out != NULL && p != end) Py_CLEAR(out); /* bytes past the array */
    }
    PyBuffer_Release(&raw);
    if (out == NULL) Py_RETURN_NONE;
    return out;
}

static PyMethodDef methods[] = {
    {"msgpack_u32", (PyCFunction)(void (*)(void))msgpack_u32, METH_FASTCALL,
     "msgpack_u32(raw): one msgpack array of ints in [0, 2**32) as uint32 LE bytes; None "
     "for any other value."},
    {"block_hashes", (PyCFunction)(void (*)(void))block_hashes, METH_FASTCALL,
     "block_hashes(tokens, block_tokens, seed): XXH3-64 of each whole block of tokens "
     "alone, with seed, as one bytearray of native uint64."},
    {"chain_ids", (PyCFunction)(void (*)(void))chain_ids, METH_FASTCALL,
     "chain_ids(parent, tokens, block_tokens): the 16-byte ids of the whole blocks of "
     "tokens chained after parent, as one bytearray."},
    {"chain_ids_flat", (PyCFunction)(void (*)(void))chain_ids_flat, METH_FASTCALL,
     "chain_ids_flat(parents, tokens, offsets, block_tokens): chain_ids of every sequence "
     "tokens[offsets[j]:offsets[j + 1]] after parents[16 j:16 j + 16], as (ids, id_offsets) "
     "bytearrays (16 bytes per id; m + 1 native int64)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "sarpd.core._chash",
                                    "Chained XXH3-128 block ids (libxxhash).", -1, methods,
                                    NULL, NULL, NULL, NULL};

PyMODINIT_FUNC PyInit__chash(void) {
    PyObject *mod = PyModule_Create(&module);
    if (mod == NULL) return NULL;
    if (PyModule_AddIntConstant(mod, "XXHASH_VERSION", (long)XXH_versionNumber()) < 0 ||
        PyModule_AddIntConstant(mod, "MAX_BLOCK_TOKENS", (long)MAX_BLOCK_TOKENS) < 0) {
        Py_DECREF(mod);
        return NULL;
    }
    return mod;
}
