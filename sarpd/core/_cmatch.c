/* The match kernel: the C twin of the router's query half (sarpd/core/router.py:
 * deepest, plan_at, _first; sarpd/core/routing.py: fingerprints, filters, agreement,
 * strongest), of the index's verification rounds (sarpd/core/index.py: _verify_round,
 * _exact_rounds; the rounds' plans: csrc/rounds.c) and of its answers (holders:
 * csrc/holders.c). `match` runs a whole batch in one call; `route`, `verify` and
 * `assemble` are its stages, callable alone (the write path routes with `route`; the
 * tests hold each stage to its reference).
 *
 * match(qids, qlens, bkeys, bsegs, bfilts, dkeys, dsegs, dfilts, dorder, sb, gap, cap,
 *       read, indexed, ks, exact[, kfilter[, cache[, with_spans]]])
 *   the first twelve as for route; read(list of seg ids) -> dict seg id -> Segment,
 *   the kernel's view of its stored value (what SegmentCache.put_values returns), or
 *   None (missing: the store's multi-get, Store.read_views), called once for every
 *   first round and once per extra round, for the segments `cache` (a SegmentCache,
 *   csrc/segcache.c, or None) does not hold: those it holds are taken from it in C
 *   (into the call's table, no Python object made), each moved to its recent end as
 *   the store's fetch would; indexed(bytes: 16-byte ids) -> a truth
 *   value per id (may a segment hold the block? False settles its window: no locator),
 *   or None (no block locators); ks (Q,) int64 and with_spans as for assemble; exact:
 *   run the bound-and-verify rounds.
 *   -> (res, meta, tops, hspans, rounds): assemble's answers and the extra rounds read.
 *
 * route(qids, qlens, bkeys, bsegs, bfilts, dkeys, dsegs, dfilts, dorder, sb, gap, cap)
 *   qids    (N, 2) uint64: every query of the batch, concatenated
 *   qlens   (Q,) int64: their lengths (summing to N)
 *   b*      (nb,) uint64: the directory's base (keys sorted ascending)
 *   d*      (nd,) uint64: its delta in insertion order; dorder (nd,) int64 a stable
 *           argsort of dkeys (rows of one key ascending: insertion order)
 *   -> (rows: bytes, first: bytes)
 *   rows: ROW_FIELDS int64 per routed window, queries in order, windows from 0 up to
 *     the first without a routing hit:
 *       q, w, offset (the deepest routing point present), length (the query's
 *       blocks in the window), first_start, first_count (its slice of `first`),
 *       weakest (agreement of the weakest first-round candidate; 16 when every
 *       candidate is in it), first_bound (plan.WindowPlan.first_bound),
 *       base_lo, base_hi (the posting list's base slice), delta_lo, delta_hi (its
 *       slice of dorder)
 *   first: uint64 segment ids, each window's first round strongest first (every
 *     candidate in posting order when there are at most `cap`).
 *
 * verify(qids, qstarts, rows, first, segs, sb)
 *   rows/first as route gave them (rows as an (R, ROW_FIELDS) int64 array); qstarts
 *   (Q,) int64: where each query starts in qids; segs: dict seg id -> decoded
 *   Segment (`window`, `presence`, `ids` attributes), the batch's reads; sb: blocks
 *   per window.
 *   -> (best: bytes, best_sid: bytes), int64 / uint64 per row: the longest verified
 *   run (ids equal AND present, from the window start) of the window's first round
 *   and the first candidate that has it (0: none).
 *
 * assemble(rows, spans, best, sids, segs, ks[, with_spans])
 *   rows (R, ROW_FIELDS) int64; spans (Q, 2) int64: each query's rows [lo, hi);
 *   best/sids per row (after any bound-and-verify rounds); segs as for verify; ks
 *   (Q,) int64: the holders each query asks for (0: none); with_spans (Q,) int64:
 *   nonzero where a query asks for its spans, or None (as not given: none asks).
 *   -> (res: bytes, meta: bytearray, tops: bytearray, hspans: bytearray): per query
 *   RES_FIELDS (6) int64: blocks matched (its windows from 0 through the first short
 *   one), meta_start, top_start, ntop, span_start, nspans; its metas (one per matched
 *   block: the holder with the longest run from block 0, csrc/holders.c,
 *   holders.match_holders' answer) are meta[meta_start : + blocks], its top holders
 *   tops[top_start : + ntop], (uint64 holder, int64 run) pairs, longest first, and its
 *   spans hspans[span_start : + nspans], (uint64 holder, int64 start, int64 blocks)
 *   triples, every holder's maximal runs inside the matched blocks by holder then
 *   start (holders.spans' answer; nspans 0 where not asked).
 *
 * merge_order(keys, old_order, old_keys)
 *   keys (n,) uint64: the delta's keys in insertion order; old_order (n0,) int64 a
 *   stable argsort of keys[:n0] and old_keys (n0,) uint64 those keys in that order
 *   (n0 <= n) -> (order: bytes, sorted: bytes): a stable argsort of all n keys
 *   (int64) and the keys in that order (uint64). The rows n0.. are sorted alone and
 *   merged in, each after the old rows with keys <= its own (directory.py's
 *   _Delta.order, whose reference it is).
 *
 * Bit-for-bit the reference's answers: fingerprint (((lo ^ hi) * golden) >> 32) %
 * 15 + 1, 0 past the window's end; a filter's byte j holds the fingerprints of blocks
 * point + 2j + 1 (high nibble) and + 2j + 2; the ranking orders (agreement << 56 | seg)
 * descending. The GIL is released around route's loop and merge_order's, and around the
 * computing part of verify and assemble (their segments read first, once each): for
 * route, verify and assemble only past `gil_free_min` of work. */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "directory.h"  /* its key filter's hash (inline: no directory.c here) */
#include "holders.h"
#include "rounds.h"
#include "sarp.h"
#include "segcache.h"
#include "segment.h"  /* a stored value's layout and checks (segcache_view) */

#define ROW_FIELDS 12
enum { R_Q, R_W, R_OFF, R_LEN, R_FSTART, R_FCOUNT, R_WEAK, R_FBOUND, R_BLO, R_BHI, R_DLO, R_DHI };
#define RES_FIELDS 6  /* a query's answer (module docstring: assemble) */
enum { RES_BLOCKS, RES_META, RES_TOP, RES_NTOP, RES_SPANS, RES_NSPANS };
_Static_assert(sizeof(HSpan) == 3 * sizeof(uint64_t), "hspans rows are three words");

#define GOLDEN SARP_MIX

/* Work below which a call keeps the GIL: block ids compared (verify), metas copied
 * (assemble), blocks of the windows routed (route). Releasing the GIL hands it to a
 * waiting thread, and getting it back waits for that thread's next release (or its
 * switch interval), far longer than a few microseconds of work: short releases make
 * threads slower, not faster. The tests set it (_set_gil_free_min: 0 always releases). */
static Py_ssize_t gil_free_min = 4096;

/* -- buffers (csrc/sarp.h's checks) ------------------------------------------------ */

/* `obj` as a C-contiguous buffer of 8-byte integers (unsigned, or signed with `sign`)
 * with `ndim` dimensions (the second of size `width` when 2). */
static int get_buf(PyObject *obj, const char *name, int sign, int ndim, Py_ssize_t width,
                   Py_buffer *view) {
    return sarp_get_words(obj, name, sign, ndim, width, 0, view);
}

/* A segment's arrays: any strides (a working copy may be a view); read with at(). */
static int get_strided(PyObject *obj, const char *name, int ndim, Py_ssize_t width,
                       Py_buffer *view) {
    return sarp_get_words(obj, name, 0, ndim, width, 1, view);
}

#define at sarp_word_at
#define load_u64 sarp_load_u64

static Py_ssize_t rows_of(const Py_buffer *v) { return v->ndim ? v->shape[0] : 0; }

/* -- routing arithmetic (routing.py) ------------------------------------------------ */

#define fingerprint sarp_fingerprint_at

/* The filter of the point at `offset` of a window of `len` blocks at `qw`. */
static uint64_t filter_at(const uint64_t *qw, Py_ssize_t len, Py_ssize_t offset) {
    uint64_t out = 0;
    for (int j = 0; j < 8; j++) {
        Py_ssize_t a = offset + 2 * j + 1, b = a + 1;
        unsigned hi = a < len ? fingerprint(qw + 2 * a) : 0;
        unsigned lo = b < len ? fingerprint(qw + 2 * b) : 0;
        out |= (uint64_t)((hi << 4) | lo) << (8 * j);
    }
    return out;
}

#define agreement rd_agreement  /* csrc/rounds.c: routing.agreement */

/* -- the directory (directory.py) ------------------------------------------------- */

typedef struct {
    const uint64_t *bkeys, *bsegs, *bfilts, *dkeys, *dsegs, *dfilts;
    const int64_t *dorder;
    Py_ssize_t nb, nd;
    const uint64_t *kf;  /* the key filter (csrc/directory.h), nkf words; 0: none */
    Py_ssize_t nkf;
} Dir;

static Py_ssize_t base_lower(const Dir *d, uint64_t key) {
    Py_ssize_t lo = 0, hi = d->nb;
    while (lo < hi) {
        Py_ssize_t mid = lo + (hi - lo) / 2;
        if (d->bkeys[mid] < key) lo = mid + 1; else hi = mid;
    }
    return lo;
}

static Py_ssize_t base_upper(const Dir *d, uint64_t key, Py_ssize_t lo) {
    Py_ssize_t hi = d->nb;
    while (lo < hi) {
        Py_ssize_t mid = lo + (hi - lo) / 2;
        if (d->bkeys[mid] <= key) lo = mid + 1; else hi = mid;
    }
    return lo;
}

static Py_ssize_t delta_lower(const Dir *d, uint64_t key) {
    Py_ssize_t lo = 0, hi = d->nd;
    while (lo < hi) {
        Py_ssize_t mid = lo + (hi - lo) / 2;
        if (d->dkeys[d->dorder[mid]] < key) lo = mid + 1; else hi = mid;
    }
    return lo;
}

static Py_ssize_t delta_upper(const Dir *d, uint64_t key, Py_ssize_t lo) {
    Py_ssize_t hi = d->nd;
    while (lo < hi) {
        Py_ssize_t mid = lo + (hi - lo) / 2;
        if (d->dkeys[d->dorder[mid]] <= key) lo = mid + 1; else hi = mid;
    }
    return lo;
}

/* Whether `key` has entries in the base or the delta; its lower bounds in both. */
static int find_key(const Dir *d, uint64_t key, Py_ssize_t *blo, Py_ssize_t *dlo) {
    if (d->nkf && !dir_kf_may_have(d->kf, (size_t)d->nkf, key)) return 0;  /* held nowhere */
    Py_ssize_t b = *blo = base_lower(d, key);
    Py_ssize_t r = *dlo = delta_lower(d, key);
    return (b < d->nb && d->bkeys[b] == key) || (r < d->nd && d->dkeys[d->dorder[r]] == key);
}

/* -- growable output --------------------------------------------------------------- */

typedef struct { uint64_t *v; Py_ssize_t n, cap; } Vec;

static int vec_reserve(Vec *a, Py_ssize_t extra) {
    if (a->n + extra <= a->cap) return 0;
    Py_ssize_t cap = a->cap ? a->cap : 64;
    while (cap < a->n + extra) cap *= 2;
    uint64_t *v = realloc(a->v, (size_t)cap * sizeof *v);
    if (v == NULL) return -1;
    a->v = v;
    a->cap = cap;
    return 0;
}

/* -- route ---------------------------------------------------------------------------- */

typedef struct { uint64_t score; Py_ssize_t at; } Ranked;
typedef struct { Ranked *v; Py_ssize_t cap; } Scratch;

static int desc(const void *a, const void *b) {
    uint64_t x = ((const Ranked *)a)->score, y = ((const Ranked *)b)->score;
    return x < y ? 1 : (x > y ? -1 : 0);
}

static inline uint64_t seg_at(const Dir *d, const int64_t *row, Py_ssize_t i) {
    Py_ssize_t nbase = row[R_BHI] - row[R_BLO];
    return i < nbase ? d->bsegs[row[R_BLO] + i] : d->dsegs[d->dorder[row[R_DLO] + i - nbase]];
}

static inline uint64_t filt_at(const Dir *d, const int64_t *row, Py_ssize_t i) {
    Py_ssize_t nbase = row[R_BHI] - row[R_BLO];
    return i < nbase ? d->bfilts[row[R_BLO] + i] : d->dfilts[d->dorder[row[R_DLO] + i - nbase]];
}

/* The first round of one routed window (its row filled but for the first-round
 * fields): every candidate in posting order, or past `cap` the top `cap` by score
 * (agreement << 56 | seg, as routing.strongest), strongest first. Equal scores are
 * the same seg id (ids below 2**56), so the order is the reference's. -1: no memory. */
static int first_round(const Dir *d, const uint64_t *qw, int64_t *row, Py_ssize_t cap,
                       Vec *first, Scratch *s) {
    Py_ssize_t count = (row[R_BHI] - row[R_BLO]) + (row[R_DHI] - row[R_DLO]);
    Py_ssize_t take = count <= cap ? count : cap;
    row[R_FSTART] = first->n;
    row[R_FCOUNT] = take;
    row[R_WEAK] = 16;
    row[R_FBOUND] = 0;
    if (vec_reserve(first, take) < 0) return -1;
    if (count <= cap) {  /* every candidate is read: posting order, no ranking */
        for (Py_ssize_t i = 0; i < count; i++) first->v[first->n++] = seg_at(d, row, i);
        return 0;
    }
    Py_ssize_t need = cap <= 32 ? cap : count;
    if (need > s->cap) {
        Ranked *v = realloc(s->v, (size_t)need * sizeof *v);
        if (v == NULL) return -1;
        s->v = v;
        s->cap = need;
    }
    uint64_t qfilt = filter_at(qw, row[R_LEN], row[R_OFF]);
    Ranked *top = s->v;
    if (cap <= 32) {  /* the top `cap` by insertion */
        Py_ssize_t n = 0;
        for (Py_ssize_t i = 0; i < count; i++) {
            uint64_t x = ((uint64_t)agreement(filt_at(d, row, i), qfilt) << 56) | seg_at(d, row, i);
            if (n == cap && x <= top[n - 1].score) continue;
            Py_ssize_t j = n < cap ? n++ : cap - 1;
            while (j > 0 && top[j - 1].score < x) { top[j] = top[j - 1]; j--; }
            top[j] = (Ranked){x, i};
        }
    } else {
        for (Py_ssize_t i = 0; i < count; i++)
            top[i] = (Ranked){((uint64_t)agreement(filt_at(d, row, i), qfilt) << 56)
                              | seg_at(d, row, i), i};
        qsort(top, (size_t)count, sizeof *top, desc);
    }
    for (Py_ssize_t i = 0; i < take; i++) first->v[first->n++] = seg_at(d, row, top[i].at);
    int weakest = agreement(filt_at(d, row, top[take - 1].at), qfilt);
    Py_ssize_t reach = row[R_OFF] + 1 + weakest;
    row[R_WEAK] = weakest;
    row[R_FBOUND] = weakest >= 16 || reach > row[R_LEN] ? row[R_LEN] : reach;
    return 0;
}

typedef struct {
    const uint64_t *qids;
    const int64_t *qlens;
    Py_ssize_t nq, sb, gap, cap;
} Batch;

/* Every routed window of the batch; -1 when out of memory. */
static int route_all(const Dir *d, const Batch *b, int64_t *rows, Py_ssize_t *nrows,
                     Vec *first) {
    Scratch s = {NULL, 0};
    Py_ssize_t start = 0, r = 0;
    int rc = 0;
    for (Py_ssize_t q = 0; q < b->nq && rc == 0; q++) {
        Py_ssize_t len = b->qlens[q];
        const uint64_t *qi = b->qids + 2 * start;
        for (Py_ssize_t w = 0; w * b->sb < len; w++) {
            Py_ssize_t ws = w * b->sb, we = ws + b->sb < len ? ws + b->sb : len;
            Py_ssize_t p = ((we - 1) / b->gap) * b->gap, hit = -1;  /* lattice positions */
            Py_ssize_t blo = 0, dlo = 0;
            uint64_t key = 0;
            for (; p >= ws; p -= b->gap) {  /* the deepest indexed point, and the lower */
                key = load_u64(qi + 2 * p);  /* bounds of its key the row keeps */
                if (find_key(d, key, &blo, &dlo)) { hit = p; break; }
            }
            if (hit < 0) break;  /* windows are contiguous from 0 */
            int64_t *row = rows + ROW_FIELDS * r;
            row[R_Q] = q;
            row[R_W] = w;
            row[R_OFF] = hit - ws;
            row[R_LEN] = we - ws;
            row[R_BLO] = blo;
            row[R_BHI] = base_upper(d, key, blo);
            row[R_DLO] = dlo;
            row[R_DHI] = delta_upper(d, key, dlo);
            if (first_round(d, qi + 2 * ws, row, b->cap, first, &s) < 0) { rc = -1; break; }
            r++;
        }
        start += len;
    }
    free(s.v);
    *nrows = r;
    return rc;
}

enum { A_QIDS, A_QLENS, A_BKEYS, A_BSEGS, A_BFILTS, A_DKEYS, A_DSEGS, A_DFILTS, A_DORDER, NBUF,
       A_KF = NBUF };  /* the key filter: an optional argument after the others */
static const char *const ROUTE_NAMES[NBUF] = {"qids", "qlens", "bkeys", "bsegs", "bfilts",
                                              "dkeys", "dsegs", "dfilts", "dorder"};

static void release_all(Py_buffer *v, int n) {
    for (int i = 0; i < n; i++) PyBuffer_Release(&v[i]);  /* a zeroed one: nothing */
}

/* Checks every argument of route (`kf`: the optional key filter, NULL when not
 * given; a 1-D uint64 array of fewer than 2**32 words, or empty: none); on error an
 * exception and -1 (buffers released). */
static int route_args(PyObject *const *args, PyObject *kf, Py_buffer *v, Dir *d, Batch *b) {
    int i;
    v[A_KF] = (Py_buffer){0};
    if (kf != NULL && kf != Py_None) {
        if (get_buf(kf, "kfilter", 0, 1, 0, &v[A_KF]) < 0) return -1;
        Py_ssize_t n = rows_of(&v[A_KF]);
        if ((uint64_t)n >= ((uint64_t)1 << 32)) {
            PyErr_Format(PyExc_ValueError, "kfilter must have fewer than 2**32 words, got %zd",
                         n);
            PyBuffer_Release(&v[A_KF]);
            return -1;
        }
    }
    for (i = 0; i < NBUF; i++) {
        int sign = i == A_QLENS || i == A_DORDER;
        if (get_buf(args[i], ROUTE_NAMES[i], sign, i == A_QIDS ? 2 : 1, 2, &v[i]) < 0) {
            release_all(v, i);
            PyBuffer_Release(&v[A_KF]);
            return -1;
        }
    }
    Py_ssize_t sb = PyLong_AsSsize_t(args[NBUF]), gap = PyLong_AsSsize_t(args[NBUF + 1]);
    Py_ssize_t cap = PyLong_AsSsize_t(args[NBUF + 2]);
    if (PyErr_Occurred()) goto fail;
    if (sb < 1 || sb > 64 || gap < 1 || cap < 1) {
        PyErr_Format(PyExc_ValueError, "sb must be in 1..64, gap and cap >= 1; got sb %zd, "
                     "gap %zd, cap %zd", sb, gap, cap);
        goto fail;
    }
    Py_ssize_t nb = rows_of(&v[A_BKEYS]), nd = rows_of(&v[A_DKEYS]);
    if (rows_of(&v[A_BSEGS]) != nb || rows_of(&v[A_BFILTS]) != nb) {
        PyErr_Format(PyExc_ValueError, "bkeys, bsegs and bfilts must have one length, got "
                     "%zd, %zd, %zd", nb, rows_of(&v[A_BSEGS]), rows_of(&v[A_BFILTS]));
        goto fail;
    }
    if (rows_of(&v[A_DSEGS]) != nd || rows_of(&v[A_DFILTS]) != nd
            || rows_of(&v[A_DORDER]) != nd) {
        PyErr_Format(PyExc_ValueError, "dkeys, dsegs, dfilts and dorder must have one length, "
                     "got %zd, %zd, %zd, %zd", nd, rows_of(&v[A_DSEGS]),
                     rows_of(&v[A_DFILTS]), rows_of(&v[A_DORDER]));
        goto fail;
    }
    const int64_t *order = v[A_DORDER].buf, *lens = v[A_QLENS].buf;
    uint64_t bad = 0;  /* one branch-free pass (the compiler vectorises it), then the culprit */
    for (Py_ssize_t k = 0; k < nd; k++) bad |= (uint64_t)order[k] >= (uint64_t)nd;
    for (Py_ssize_t k = 0; bad && k < nd; k++) {
        if (order[k] < 0 || order[k] >= nd) {
            PyErr_Format(PyExc_ValueError, "dorder[%zd] = %lld is not a row of the delta "
                         "(0..%zd)", k, (long long)order[k], nd - 1);
            goto fail;
        }
    }
    Py_ssize_t nq = rows_of(&v[A_QLENS]), total = 0;
    for (Py_ssize_t k = 0; k < nq; k++) {
        if (lens[k] < 0 || lens[k] > PY_SSIZE_T_MAX / 4 - total) {
            PyErr_Format(PyExc_ValueError, "qlens[%zd] = %lld is negative or too large", k,
                         (long long)lens[k]);
            goto fail;
        }
        total += lens[k];
    }
    if (total != rows_of(&v[A_QIDS])) {
        PyErr_Format(PyExc_ValueError, "qlens sum to %zd, qids has %zd rows", total,
                     rows_of(&v[A_QIDS]));
        goto fail;
    }
    *d = (Dir){v[A_BKEYS].buf, v[A_BSEGS].buf, v[A_BFILTS].buf, v[A_DKEYS].buf,
               v[A_DSEGS].buf, v[A_DFILTS].buf, order, nb, nd, v[A_KF].buf, rows_of(&v[A_KF])};
    *b = (Batch){v[A_QIDS].buf, lens, nq, sb, gap, cap};
    return 0;
fail:
    release_all(v, NBUF + 1);
    return -1;
}

static PyObject *route(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != NBUF + 3 && nargs != NBUF + 4) {
        PyErr_Format(PyExc_TypeError, "route takes %d or %d arguments (qids, qlens, bkeys, "
                     "bsegs, bfilts, dkeys, dsegs, dfilts, dorder, sb, gap, cap[, kfilter]), "
                     "got %zd", NBUF + 3, NBUF + 4, nargs);
        return NULL;
    }
    Py_buffer v[NBUF + 1];
    Dir d;
    Batch b;
    if (route_args(args, nargs > NBUF + 3 ? args[NBUF + 3] : NULL, v, &d, &b) < 0) return NULL;
    Py_ssize_t maxrows = 0;
    for (Py_ssize_t q = 0; q < b.nq; q++) maxrows += (b.qlens[q] + b.sb - 1) / b.sb;
    int64_t *rows = malloc((size_t)(maxrows ? maxrows : 1) * ROW_FIELDS * sizeof *rows);
    Vec first = {NULL, 0, 0};
    Py_ssize_t nrows = 0;
    PyObject *out = NULL;
    int rc = -1;
    if (rows != NULL && maxrows * b.sb >= gil_free_min) {
        Py_BEGIN_ALLOW_THREADS
        rc = route_all(&d, &b, rows, &nrows, &first);
        Py_END_ALLOW_THREADS
    } else if (rows != NULL) {
        rc = route_all(&d, &b, rows, &nrows, &first);
    }
    if (rc < 0) {
        PyErr_NoMemory();
    } else {
        out = Py_BuildValue("(y#y#)", (const char *)rows,
                            (Py_ssize_t)(nrows * ROW_FIELDS * sizeof *rows),
                            (const char *)(first.v ? first.v : (uint64_t *)rows),
                            (Py_ssize_t)(first.n * sizeof *first.v));
    }
    free(rows);
    free(first.v);
    release_all(v, NBUF + 1);
    return out;
}

/* -- the batch's segments, read once a call ----------------------------------------------- */

/* A call looks each segment up once (a batch names a hot segment in many rows) into a
 * SegView of its table: `match` reads the batch's segments straight into it (read_into),
 * verify and assemble alone from their `segs` dict. A view's CView is what is kept on
 * the segment (read from its Python object the first time a call needed each part), or
 * the segment cache's raw entry itself: a stored value's view, every part read, which
 * never changes. The rows are computed from the views and the calls' own copies of the
 * checked rows with the GIL released (when there is enough work to be worth a
 * hand-over: gil_free_min), taken back only where a Segment's view must be read from
 * Python (candidate_ready, copy_window_ready say so); the Python results are built
 * after. A view holds the segment and its CView, which holds a buffer of each array it
 * read (a raw one: the value), so the arrays outlive the call whatever Python does
 * meanwhile. */


static PyObject *S_WINDOW, *S_PRESENCE, *S_IDS, *S_META, *S_XMETA, *S_XMASK, *S_CVIEW;

/* What the kernel reads of a segment, kept ON the segment (its `_cview` slot) from the
 * first call that reads it for as long as the segment lives: a segment the store
 * hands out never changes (the writer edits copies, WriteTxn.mutable; a delta makes a
 * new Segment), so later calls take its fields and its arrays' buffers from here, not
 * from six attribute reads and four buffer exports a call. Each part is read the first
 * time a call needs it, in the reference's order and with the errors a fresh read
 * gives; a part that failed is read again next time. An object without the slot (a
 * test's stand-in) gets a view for the call only. */
enum { CV_INTS = 1, CV_IDS = 2, CV_TAIL = 4 };

typedef struct {
    PyObject_HEAD
    int parts;            /* CV_*: the parts read (and the buffers held) */
    long long window;
    int far;              /* its window is past int64: no row's (the reference skips it) */
    uint64_t presence;    /* read with the window unless far */
    Py_ssize_t present;   /* with the ids: the run of present blocks from 0 */
    Py_buffer ids, meta, xmeta, xmask;
    /* a view of a stored value (segcache_view: the segment cache's raw entries): the
     * value (bytes) its buffers point into, which it holds instead of exports; NULL for
     * a view read from a Segment */
    PyObject *raw;
    Py_ssize_t dims[5], steps[5];  /* the buffers' shapes and strides (raw views) */
} CView;

static void cview_dealloc(CView *v) {
    if (v->raw != NULL) {
        Py_DECREF(v->raw);
    } else {
        if (v->parts & CV_IDS) PyBuffer_Release(&v->ids);
        if (v->parts & CV_TAIL) {
            PyBuffer_Release(&v->meta);
            PyBuffer_Release(&v->xmeta);
            PyBuffer_Release(&v->xmask);
        }
    }
    PyObject_Free(v);
}

static PyTypeObject CViewType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "sarpd.core._cmatch.SegmentView",
    .tp_basicsize = sizeof(CView),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_dealloc = (destructor)cview_dealloc,
    .tp_doc = "What the match kernel read of a segment (kept on it: Segment._cview).",
};

/* A raw view's buffer over n words at p (ndim 1 or 2: (n, 2)), readonly, no exporter. */
static void raw_buffer(CView *cv, Py_buffer *b, const unsigned char *p, Py_ssize_t n, int ndim,
                       int dim) {
    memset(b, 0, sizeof *b);
    b->buf = (void *)p;
    b->itemsize = 8;
    b->len = n * 8 * (ndim == 2 ? 2 : 1);
    b->readonly = 1;
    b->ndim = ndim;
    b->shape = cv->dims + dim;
    b->strides = cv->steps + dim;
    cv->dims[dim] = n;
    cv->steps[dim] = ndim == 2 ? 16 : 8;
    if (ndim == 2) {
        cv->dims[dim + 1] = 2;
        cv->steps[dim + 1] = 8;
    }
}

PyObject *segcache_view(PyObject *value) {
    const unsigned char *p = (const unsigned char *)PyBytes_AS_STRING(value);
    CView *cv = PyObject_New(CView, &CViewType);
    if (cv == NULL) return NULL;
    Py_ssize_t n = p[5], h = (Py_ssize_t)sarp_get_le32(p + 44);
    uint64_t window = sarp_get_le64(p + 16);
    cv->parts = CV_INTS | CV_IDS | CV_TAIL;
    cv->far = window > (uint64_t)INT64_MAX;
    cv->window = cv->far ? 0 : (long long)window;
    cv->presence = sarp_get_le64(p + 24);
    Py_ssize_t present = 0;
    while (present < n && ((cv->presence >> present) & 1u)) present++;
    cv->present = present;
    cv->raw = Py_NewRef(value);
    raw_buffer(cv, &cv->ids, p + SEG_HEADER, n, 2, 0);
    raw_buffer(cv, &cv->meta, p + SEG_HEADER + 16 * n, n, 1, 2);
    raw_buffer(cv, &cv->xmeta, p + SEG_HEADER + 24 * n, h, 1, 3);
    raw_buffer(cv, &cv->xmask, p + SEG_HEADER + 24 * n + 8 * h, h, 1, 4);
    return (PyObject *)cv;
}

PyObject *segcache_view_value(PyObject *o) {
    return Py_IS_TYPE(o, &CViewType) ? ((CView *)o)->raw : NULL;
}

/* The view of `seg` (a new reference), attached to it where it has the slot; NULL with
 * an exception. A view itself (a raw entry of the segment cache) is its own view. */
static CView *cview_of(PyObject *seg) {
    if (Py_IS_TYPE(seg, &CViewType)) return (CView *)Py_NewRef(seg);
    PyObject *v = PyObject_GetAttr(seg, S_CVIEW);
    if (v != NULL && Py_IS_TYPE(v, &CViewType)) return (CView *)v;
    int slot = v != NULL;
    Py_XDECREF(v);
    if (!slot) {  /* no slot, or a stand-in whose __getattr__ refuses the name */
        if (!PyErr_ExceptionMatches(PyExc_Exception)) return NULL;
        PyErr_Clear();
    }
    CView *cv = PyObject_New(CView, &CViewType);
    if (cv == NULL) return NULL;
    cv->parts = 0;
    cv->window = 0;
    cv->far = 0;
    cv->presence = 0;
    cv->present = 0;
    cv->raw = NULL;
    if (slot && PyObject_SetAttr(seg, S_CVIEW, (PyObject *)cv) < 0) {
        if (!PyErr_ExceptionMatches(PyExc_AttributeError)
                && !PyErr_ExceptionMatches(PyExc_TypeError)) {
            Py_DECREF(cv);
            return NULL;
        }
        PyErr_Clear();  /* read-only slot: a view for this call only */
    }
    return cv;
}

typedef struct {
    uint64_t sid;
    PyObject *seg;        /* a reference; NULL: not in segs */
    CView *cv;            /* a reference: the segment's view, once a part was read */
    long long window;
    int far;              /* its window is past int64: no row's (the reference skips it) */
    uint64_t presence;
    Py_ssize_t present;   /* its run of present blocks from 0 (Segment.present_run) */
    int have_ints;        /* window, far and presence read */
    int have_ids;
    Py_buffer ids;        /* while have_ids: a copy of cv->ids (the view holds the export) */
} SegView;

#define VIEW_CHUNK 64  /* views live in chunks: a view never moves (its buffers) */

typedef struct {
    SegView **chunks;
    Py_ssize_t n, nchunks;
    Py_ssize_t expect;    /* views the call expects (the first table's size), or 0 */
    int32_t *slots;       /* open addressing by sid: 1 + the view's index, 0 empty */
    size_t mask;
} SegTable;

static inline SegView *view_at(const SegTable *t, Py_ssize_t i) {
    return &t->chunks[i / VIEW_CHUNK][i % VIEW_CHUNK];
}

static inline size_t slot_of(uint64_t sid, size_t mask) {
    return (size_t)((sid * GOLDEN) >> 32) & mask;
}

static void table_free(SegTable *t) {
    for (Py_ssize_t i = 0; i < t->n; i++) {
        SegView *e = view_at(t, i);
        Py_XDECREF(e->cv);
        Py_XDECREF(e->seg);
    }
    for (Py_ssize_t c = 0; c < t->nchunks; c++) free(t->chunks[c]);
    free(t->chunks);
    free(t->slots);
    memset(t, 0, sizeof *t);
}

/* The index of the view of `sid`, or -1 when it has none yet. */
static Py_ssize_t table_find(const SegTable *t, uint64_t sid) {
    if (t->slots != NULL) {
        for (size_t s = slot_of(sid, t->mask); t->slots[s]; s = (s + 1) & t->mask)
            if (view_at(t, t->slots[s] - 1)->sid == sid) return t->slots[s] - 1;
    }
    return -1;
}

/* A new view of `sid` (not in the table yet) holding `seg` (borrowed: a reference is
 * taken; NULL or None: missing or corrupt, as absent): its index, or -1 with
 * MemoryError. */
static Py_ssize_t table_add(SegTable *t, uint64_t sid, PyObject *seg) {
    if (t->n >= INT32_MAX - 1) {
        PyErr_NoMemory();
        return -1;
    }
    if ((size_t)(t->n + 1) * 2 > t->mask + 1 || t->slots == NULL) {  /* grow: half full */
        size_t size = t->slots == NULL ? 64 : (t->mask + 1) * 2;
        while (t->slots == NULL && size < 2 * (size_t)t->expect) size *= 2;
        int32_t *slots = calloc(size, sizeof *slots);
        if (slots == NULL) {
            PyErr_NoMemory();
            return -1;
        }
        for (Py_ssize_t i = 0; i < t->n; i++) {
            size_t s = slot_of(view_at(t, i)->sid, size - 1);
            while (slots[s]) s = (s + 1) & (size - 1);
            slots[s] = (int32_t)(i + 1);
        }
        free(t->slots);
        t->slots = slots;
        t->mask = size - 1;
    }
    if (t->n == t->nchunks * VIEW_CHUNK) {
        SegView **chunks = realloc(t->chunks, (size_t)(t->nchunks + 1) * sizeof *chunks);
        if (chunks == NULL) {
            PyErr_NoMemory();
            return -1;
        }
        t->chunks = chunks;
        if ((chunks[t->nchunks] = malloc(VIEW_CHUNK * sizeof(SegView))) == NULL) {
            PyErr_NoMemory();
            return -1;
        }
        t->nchunks++;
    }
    if (seg == Py_None) seg = NULL;  /* missing or corrupt, as absent */
    Py_ssize_t i = t->n++;
    SegView *e = view_at(t, i);
    memset(e, 0, sizeof *e);
    e->sid = sid;
    e->seg = seg;
    Py_XINCREF(seg);
    if (seg != NULL && Py_IS_TYPE(seg, &CViewType))  /* a raw entry: its own view, read */
        e->cv = (CView *)Py_NewRef(seg);
    size_t s = slot_of(sid, t->mask);
    while (t->slots[s]) s = (s + 1) & t->mask;
    t->slots[s] = (int32_t)(i + 1);
    return i;
}

/* The view of `sid`, made (from segs, a dict: verify's and assemble's argument) the
 * first time: its index, or -1 with an exception. */
static Py_ssize_t table_get(SegTable *t, PyObject *segs, uint64_t sid) {
    Py_ssize_t known = table_find(t, sid);
    if (known >= 0) return known;
    PyObject *key = PyLong_FromUnsignedLongLong(sid);
    if (key == NULL) return -1;
    PyObject *seg = PyDict_GetItemWithError(segs, key);  /* borrowed */
    Py_DECREF(key);
    if (seg == NULL && PyErr_Occurred()) return -1;
    return table_add(t, sid, seg);
}

/* -- verify --------------------------------------------------------------------------- */

/* A segment's window and presence, or -1 with an exception naming the segment. A
 * window past int64 (a u64 field) is no row's: `far` set, its presence not read (the
 * reference compares the window first and skips the candidate). */
static int seg_ints(PyObject *seg, uint64_t sid, long long *window, int *far,
                    uint64_t *presence) {
    PyObject *w = PyObject_GetAttr(seg, S_WINDOW);
    if (w == NULL) return -1;
    *window = PyLong_AsLongLong(w);
    Py_DECREF(w);
    if (*window == -1 && PyErr_Occurred()) {
        if (!PyErr_ExceptionMatches(PyExc_OverflowError)) return -1;
        PyErr_Clear();
        *far = 1;
        return 0;
    }
    PyObject *p = PyObject_GetAttr(seg, S_PRESENCE);
    if (p == NULL) return -1;
    *presence = PyLong_AsUnsignedLongLongMask(p);
    Py_DECREF(p);
    if (PyErr_Occurred()) {
        PyErr_Format(PyExc_TypeError, "segment %llu: presence must be an int",
                     (unsigned long long)sid);
        return -1;
    }
    return 0;
}

/* One candidate of a window `w` (the GIL held): the index of its view with its ids
 * read, -2 when it does not count (missing, another window), -1 with an exception.
 * Read in the order the reference reads them: window and presence once, ids once
 * a window of its own asks. */
/* The view of a table entry's segment (e->seg not NULL), made on first use. */
static CView *entry_view(SegView *e) {
    if (e->cv == NULL) e->cv = cview_of(e->seg);
    return e->cv;
}

/* A view's window and presence (seg_ints, once a segment). */
static int view_ints(CView *cv, PyObject *seg, uint64_t sid) {
    if (!(cv->parts & CV_INTS)) {
        if (seg_ints(seg, sid, &cv->window, &cv->far, &cv->presence) < 0) return -1;
        cv->parts |= CV_INTS;
    }
    return 0;
}

/* A view's ids (a strided (n, 2) uint64 buffer) and its present run, once a segment. */
static int view_ids(CView *cv, PyObject *seg) {
    if (cv->parts & CV_IDS) return 0;
    PyObject *ids = PyObject_GetAttr(seg, S_IDS);
    if (ids == NULL) return -1;
    int bad = get_strided(ids, "segment ids", 2, 2, &cv->ids);
    Py_DECREF(ids);
    if (bad < 0) return -1;
    Py_ssize_t nblocks = cv->ids.shape[0], present = 0;
    while (present < nblocks && present < 64 && ((cv->presence >> present) & 1u)) present++;
    cv->present = present;
    cv->parts |= CV_IDS;
    return 0;
}

/* A view's window and presence, then its ids, taken from its CView (read) into the
 * table entry, once a call. */
static void take_ints(SegView *e) {
    e->window = e->cv->window;
    e->far = e->cv->far;
    e->presence = e->cv->presence;
    e->have_ints = 1;
}

static void take_ids(SegView *e) {
    e->ids = e->cv->ids;
    e->present = e->cv->present;
    e->have_ids = 1;
}

static Py_ssize_t candidate(SegTable *t, PyObject *segs, uint64_t sid, long long w) {
    Py_ssize_t i = table_get(t, segs, sid);
    if (i < 0) return -1;
    SegView *e = view_at(t, i);
    if (e->seg == NULL) return -2;
    if (!e->have_ints) {
        CView *cv = entry_view(e);
        if (cv == NULL || view_ints(cv, e->seg, sid) < 0) {
            Py_CLEAR(e->seg);  /* the view stays, as missing; the call fails anyway */
            return -1;
        }
        take_ints(e);
    }
    if (e->far || e->window != w) return -2;
    if (!e->have_ids) {
        if (view_ids(e->cv, e->seg) < 0) return -1;
        take_ids(e);
    }
    return i;
}

/* `candidate` where it needs no Python (the GIL may be released): the view's index,
 * -2 when it does not count, or -3 when its entry is not read yet (not in the table,
 * or a Segment's whose view this call has not read: `candidate` reads it, the GIL
 * held). Only a raw view is read here: it never changes, where a Segment's view gains
 * parts under the GIL as calls on other threads read them. */
static Py_ssize_t candidate_ready(const SegTable *t, uint64_t sid, long long w) {
    Py_ssize_t i = table_find(t, sid);
    if (i < 0) return -3;
    SegView *e = view_at(t, i);
    if (e->seg == NULL) return -2;
    if (!e->have_ints) {
        if (e->cv == NULL || e->cv->raw == NULL) return -3;
        take_ints(e);
    }
    if (e->far || e->window != w) return -2;
    if (!e->have_ids) {
        if (e->cv->raw == NULL) return -3;
        take_ids(e);
    }
    return i;
}

/* The verified run of a candidate's view against a window (`qw`, `len` blocks): ids
 * equal AND present, from the window start. No Python object is touched. */
static Py_ssize_t view_run(const SegView *e, const uint64_t *qw, Py_ssize_t len) {
    Py_ssize_t n = e->ids.shape[0] < len ? e->ids.shape[0] : len, m = 0;
    if (n > e->present) n = e->present;  /* past it the run ends anyway */
    if (e->ids.strides[0] == 16 && e->ids.strides[1] == 8) {  /* contiguous: as it is decoded */
        const uint64_t *s = e->ids.buf;
        while (m < n && load_u64(s + 2 * m) == load_u64(qw + 2 * m)
               && load_u64(s + 2 * m + 1) == load_u64(qw + 2 * m + 1))
            m++;
        return m;
    }
    while (m < n && at(&e->ids, m, 0) == load_u64(qw + 2 * m)
           && at(&e->ids, m, 1) == load_u64(qw + 2 * m + 1))
        m++;
    return m;
}

/* Checks a row of verify against the batch; 0 when it fits. */
static int row_fits(const int64_t *row, const int64_t *starts, Py_ssize_t nq, Py_ssize_t nid,
                    Py_ssize_t nf, Py_ssize_t sb) {
    int64_t q = row[R_Q], w = row[R_W], len = row[R_LEN];
    int64_t fs = row[R_FSTART], fc = row[R_FCOUNT];
    if (q < 0 || q >= nq || w < 0 || len < 0 || len > sb || fs < 0 || fc < 0 || fs > nf - fc)
        return -1;
    if (starts[q] < 0 || starts[q] > nid || w > (nid - starts[q]) / sb) return -1;
    return starts[q] + w * sb + len <= nid ? 0 : -1;
}

/* The `segs` argument of verify and assemble: a dict of seg id -> Segment (borrowed). */
static PyObject *segs_arg(PyObject *segs) {
    if (!PyDict_Check(segs)) {
        PyErr_Format(PyExc_TypeError, "segs must be a dict of seg id -> Segment, got %.100s",
                     Py_TYPE(segs)->tp_name);
        return NULL;
    }
    return segs;
}

/* A growable array of int64 (the calls' own copies of what they checked). */
typedef struct { int64_t *v; Py_ssize_t n, cap; } IVec;

static int ivec_push(IVec *a, int64_t x) {
    if (a->n == a->cap) {
        Py_ssize_t cap = a->cap ? 2 * a->cap : 256;
        int64_t *v = realloc(a->v, (size_t)cap * sizeof *v);
        if (v == NULL) {
            PyErr_NoMemory();
            return -1;
        }
        a->v = v;
        a->cap = cap;
    }
    a->v[a->n++] = x;
    return 0;
}

/* Every row's first round verified (rows checked against the batch first): best run
 * and the first candidate with it, per row, into b / bs. Segments are read through
 * the table (the GIL held); the runs are computed from the views, the GIL released
 * past gil_free_min. 0, or -1 with an exception. */
static int verify_rows(SegTable *t, PyObject *segs, const uint64_t *qids, Py_ssize_t nid,
                       const int64_t *starts, Py_ssize_t nq, const int64_t *rows, Py_ssize_t nr,
                       const uint64_t *first, Py_ssize_t nf, Py_ssize_t sb, int64_t *b,
                       uint64_t *bs) {
    for (Py_ssize_t r = 0; r < nr; r++) {
        if (row_fits(rows + ROW_FIELDS * r, starts, nq, nid, nf, sb) < 0) {
            PyErr_Format(PyExc_ValueError, "rows[%zd] does not fit qids (%zd ids), qstarts (%zd "
                         "queries) and first (%zd ids) with sb %zd", r, nid, nq, nf, sb);
            return -1;
        }
    }
    /* Each row's candidates are looked up and run in turn, the GIL released (past
     * gil_free_min) and taken back only for a view whose segment must be read from
     * Python (`candidate`). */
    PyThreadState *ts = nf * sb >= gil_free_min ? PyEval_SaveThread() : NULL;
    for (Py_ssize_t r = 0; r < nr; r++) {
        const int64_t *row = rows + ROW_FIELDS * r;
        const uint64_t *qw = qids + 2 * (starts[row[R_Q]] + row[R_W] * sb);
        b[r] = 0;
        bs[r] = 0;
        for (int64_t k = row[R_FSTART]; k < row[R_FSTART] + row[R_FCOUNT]; k++) {
            Py_ssize_t i = candidate_ready(t, first[k], row[R_W]);
            if (i == -3) {
                if (ts != NULL) PyEval_RestoreThread(ts);
                i = candidate(t, segs, first[k], row[R_W]);
                if (i == -1) return -1;
                if (ts != NULL) ts = PyEval_SaveThread();
            }
            if (i < 0) continue;
            const SegView *e = view_at(t, i);
            Py_ssize_t run = view_run(e, qw, row[R_LEN]);
            if (run > b[r]) { b[r] = run; bs[r] = e->sid; }  /* the first of equal runs */
        }
    }
    if (ts != NULL) PyEval_RestoreThread(ts);
    return 0;
}

static PyObject *verify(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 6) {
        PyErr_Format(PyExc_TypeError, "verify takes 6 arguments (qids, qstarts, rows, first, "
                     "segs, sb), got %zd", nargs);
        return NULL;
    }
    PyObject *segs = segs_arg(args[4]);
    if (segs == NULL) return NULL;
    Py_ssize_t sb = PyLong_AsSsize_t(args[5]);
    if (sb == -1 && PyErr_Occurred()) return NULL;
    if (sb < 1 || sb > 64) {
        PyErr_Format(PyExc_ValueError, "sb must be in 1..64, got %zd", sb);
        return NULL;
    }
    Py_buffer v[4];
    static const char *const names[4] = {"qids", "qstarts", "rows", "first"};
    static const int sign[4] = {0, 1, 1, 0}, ndim[4] = {2, 1, 2, 1};
    static const Py_ssize_t width[4] = {2, 0, ROW_FIELDS, 0};
    for (int i = 0; i < 4; i++) {
        if (get_buf(args[i], names[i], sign[i], ndim[i], width[i], &v[i]) < 0) {
            release_all(v, i);
            return NULL;
        }
    }
    Py_ssize_t nr = v[2].shape[0];
    PyObject *best = PyBytes_FromStringAndSize(NULL, nr * (Py_ssize_t)sizeof(int64_t));
    PyObject *sids = PyBytes_FromStringAndSize(NULL, nr * (Py_ssize_t)sizeof(uint64_t));
    PyObject *out = NULL;
    SegTable t = {0};
    if (best != NULL && sids != NULL
            && verify_rows(&t, segs, v[0].buf, v[0].shape[0], v[1].buf, v[1].shape[0], v[2].buf,
                           nr, v[3].buf, v[3].shape[0], sb, (int64_t *)PyBytes_AS_STRING(best),
                           (uint64_t *)PyBytes_AS_STRING(sids)) == 0)
        out = PyTuple_Pack(2, best, sids);
    Py_XDECREF(best);
    Py_XDECREF(sids);
    table_free(&t);
    release_all(v, 4);
    return out;
}

/* -- assemble ------------------------------------------------------------------------ */

/* A matched window's arrays, found while the GIL is held: each a pointer into its
 * segment's own array where that is contiguous words (the buffer its view holds, kept
 * by the call's table: no copy), else copied into the call's arena (`at`: its offset
 * there, pointer NULL, resolved once the arena stops growing). Meta: `length` words;
 * the holder table: h words each. */
typedef struct {
    const uint64_t *p[3];   /* meta, xmeta, xmask */
    Py_ssize_t at[3];
    Py_ssize_t h;
    uint64_t presence;
    int length;
} Copied;

/* Words [0, n) of a 1-D uint64 buffer for a Copied slot: the buffer itself when its
 * words are contiguous, else a copy into the arena. 0, or -1 with MemoryError. */
static int window_words(const Py_buffer *b, Py_ssize_t n, IVec *arena, const uint64_t **p,
                        Py_ssize_t *off) {
    *off = arena->n;  /* (a NULL buffer of no words resolves to the arena too) */
    if (b->strides[0] == (Py_ssize_t)sizeof(uint64_t)) {
        *p = b->buf;
        return 0;
    }
    *p = NULL;
    for (Py_ssize_t k = 0; k < n; k++)
        if (ivec_push(arena, (int64_t)at(b, k, 0)) < 0) return -1;
    return 0;
}

/* Find the first `length` metas and the holder table of a matched segment (the GIL
 * held; `window_words`); -1 with an exception. */
static int copy_window(SegTable *t, PyObject *segs, uint64_t sid, int64_t length, IVec *arena,
                       Copied *out) {
    Py_ssize_t i = table_get(t, segs, sid);
    if (i < 0) return -1;
    SegView *e = view_at(t, i);
    if (e->seg == NULL) {
        PyErr_Format(PyExc_KeyError, "segment %llu was matched but is not in segs",
                     (unsigned long long)sid);
        return -1;
    }
    CView *cv = entry_view(e);
    if (cv == NULL) return -1;
    if ((cv->parts & CV_INTS) && (!cv->far || cv->raw != NULL)) {
        out->presence = cv->presence;
    } else {  /* not read as a candidate's: as the reference reads it */
        PyObject *p = PyObject_GetAttr(e->seg, S_PRESENCE);
        if (p == NULL) return -1;
        out->presence = PyLong_AsUnsignedLongLongMask(p);
        Py_DECREF(p);
        if (PyErr_Occurred()) return -1;
    }
    if (!(cv->parts & CV_TAIL)) {  /* meta and the holder table, once a segment */
        Py_buffer *b[3] = {&cv->meta, &cv->xmeta, &cv->xmask};
        PyObject *names[3] = {S_META, S_XMETA, S_XMASK};
        static const char *const what[3] = {"segment meta", "segment xmeta", "segment xmask"};
        for (int got = 0; got < 3; got++) {
            PyObject *a = PyObject_GetAttr(e->seg, names[got]);
            int bad = a == NULL || get_strided(a, what[got], 1, 0, b[got]) < 0;
            Py_XDECREF(a);
            if (bad) {
                for (int k = 0; k < got; k++) PyBuffer_Release(b[k]);
                return -1;
            }
        }
        cv->parts |= CV_TAIL;
    }
    const Py_buffer *b[3] = {&cv->meta, &cv->xmeta, &cv->xmask};
    if (length < 0 || length > b[0]->shape[0] || length > 64 || b[1]->shape[0] != b[2]->shape[0]) {
        PyErr_Format(PyExc_ValueError, "run %lld of segment %llu is past its %zd blocks (or "
                     "its holder table is uneven)", (long long)length, (unsigned long long)sid,
                     b[0]->shape[0]);
        return -1;
    }
    out->length = (int)length;
    out->h = b[1]->shape[0];
    for (int k = 0; k < 3; k++)
        if (window_words(b[k], k ? out->h : length, arena, &out->p[k], &out->at[k]) < 0)
            return -1;
    return 0;
}

/* copy_window where it needs no Python (the GIL may be released): a raw view's words,
 * in its value. 1 when done; 0 when the window needs copy_window (the GIL held: not
 * in the table yet, a Segment's view, or a run copy_window refuses). */
static int copy_window_ready(const SegTable *t, uint64_t sid, int64_t length, Copied *out) {
    Py_ssize_t i = table_find(t, sid);
    if (i < 0) return 0;
    const SegView *e = view_at(t, i);
    const CView *cv = e->cv;
    if (e->seg == NULL || cv == NULL || cv->raw == NULL || length < 0
            || length > cv->meta.shape[0] || length > 64)
        return 0;
    out->presence = cv->presence;
    out->length = (int)length;
    out->h = cv->xmeta.shape[0];
    const Py_buffer *b[3] = {&cv->meta, &cv->xmeta, &cv->xmask};
    for (int k = 0; k < 3; k++) {  /* a raw view's words are contiguous: no arena */
        out->p[k] = b[k]->buf;
        out->at[k] = 0;
    }
    return 1;
}

/* The matched windows of a batch's queries, found by `find_windows`. */
typedef struct {
    Copied *wins;
    Py_ssize_t n, cap;
    Py_ssize_t *ends;  /* per query: where its windows end in wins */
    IVec arena;        /* the metas and holder tables copied (window_words) */
    Py_ssize_t nmeta, ntops, widest;  /* the answers' sizes; most windows of a query */
} Found;

static void found_free(Found *f) {
    free(f->wins);
    free(f->ends);
    free(f->arena.v);
}

/* Room for one more window in f->wins; 0, or -1 (out of memory, no exception). */
static int found_room(Found *f) {
    if (f->n < f->cap) return 0;
    Py_ssize_t cap = f->cap ? 2 * f->cap : 64;
    Copied *more = realloc(f->wins, (size_t)cap * sizeof *more);
    if (more == NULL) return -1;
    f->wins = more;
    f->cap = cap;
    return 0;
}

/* Each query's windows from 0 through the first short one, the matched segments'
 * metas and tables found (copy_window_ready: a raw view's, without the GIL past
 * gil_free_min; the others with the GIL taken back), into f; its blocks and the starts
 * of its metas and top holders into rs (RES_FIELDS a query). 0, or -1 with an
 * exception. */
static int find_windows(SegTable *t, PyObject *segs, const int64_t *rows, Py_ssize_t nr,
                        const int64_t *spans, Py_ssize_t nq, const int64_t *best,
                        const uint64_t *sids, const int64_t *ks, int64_t *rs, Found *f) {
    PyThreadState *ts = nr * 8 >= gil_free_min ? PyEval_SaveThread() : NULL;
    for (Py_ssize_t q = 0; q < nq; q++) {
        int64_t total = 0;
        Py_ssize_t from = f->n;
        for (Py_ssize_t r = spans[2 * q]; r < spans[2 * q + 1]; r++) {
            int64_t b = best[r], len = rows[ROW_FIELDS * r + R_LEN];
            if (sids[r]) {
                if (found_room(f) < 0) {
                    if (ts != NULL) PyEval_RestoreThread(ts);
                    PyErr_NoMemory();
                    return -1;
                }
                if (!copy_window_ready(t, sids[r], b, &f->wins[f->n])) {
                    if (ts != NULL) PyEval_RestoreThread(ts);
                    if (copy_window(t, segs, sids[r], b, &f->arena, &f->wins[f->n]) < 0)
                        return -1;
                    if (ts != NULL) ts = PyEval_SaveThread();
                }
                f->n++;
            }
            total += b;
            if (b < len) break;
        }
        f->ends[q] = f->n;
        if (f->n - from > f->widest) f->widest = f->n - from;
        int64_t *res = rs + RES_FIELDS * q;
        res[RES_BLOCKS] = total;
        res[RES_META] = f->nmeta;
        res[RES_TOP] = f->ntops;
        f->nmeta += total;
        int64_t k = ks[q] > 0 ? ks[q] : 0, most = 0;
        for (Py_ssize_t w = from; w < f->n && !most; w++)
            if (f->wins[w].length > 0) most = f->wins[w].length + f->wins[w].h;
        f->ntops += k < most ? k : most;
    }
    if (ts != NULL) PyEval_RestoreThread(ts);
    return 0;
}

/* Every query's holders (csrc/holders.c) from its windows in f: metas into m, top
 * holders into tp, spans (the queries `want` names; NULL: none) appended to hs; their
 * counts and the spans' starts into rs. No Python object: the GIL may be released.
 * 0, or -1 when memory ran out. */
static int answer_all(const Found *f, Py_ssize_t nq, const int64_t *ks, const int64_t *want,
                      HWindow *hw, int64_t *rs, uint64_t *m, HRun *tp, HSpans *hs) {
    Py_ssize_t w0 = 0;
    for (Py_ssize_t q = 0; q < nq; q++) {
        int nw = 0;
        for (; w0 < f->ends[q]; w0++, nw++) {
            const Copied *c = &f->wins[w0];
            hw[nw] = (HWindow){c->p[0], 1, c->presence, c->p[1], c->p[2], c->h, c->length};
        }
        int64_t *res = rs + RES_FIELDS * q, ntop = 0;
        res[RES_SPANS] = hs->n;
        if (holders_match(hw, nw, ks[q] > 0 ? ks[q] : 0, m + res[RES_META], tp + res[RES_TOP],
                          &ntop, want != NULL && want[q] ? hs : NULL) < 0)
            return -1;
        res[RES_NTOP] = ntop;
        res[RES_NSPANS] = hs->n - res[RES_SPANS];
    }
    return 0;
}

/* Every query's answer from its rows' runs (module docstring: assemble), the windows
 * read through the table; `want` (NULL: none) the queries that ask for spans:
 * (res, meta, tops, hspans), or NULL with an exception. */
static PyObject *assemble_rows(SegTable *t, PyObject *segs, const int64_t *rows, Py_ssize_t nr,
                               const int64_t *spans, Py_ssize_t nq, const int64_t *best,
                               const uint64_t *sids, const int64_t *ks, const int64_t *want) {
    for (Py_ssize_t q = 0; q < nq; q++) {
        Py_ssize_t lo = spans[2 * q], hi = spans[2 * q + 1];
        if (lo < 0 || hi < lo || hi > nr) {
            PyErr_Format(PyExc_ValueError, "spans[%zd] = (%zd, %zd) is not a slice of the %zd "
                         "rows", q, lo, hi, nr);
            return NULL;
        }
    }
    PyObject *res = NULL, *meta = NULL, *tops = NULL, *held = NULL, *out = NULL;
    Found f = {0};
    HSpans hs = {0};
    HWindow *hw = NULL;
    res = PyBytes_FromStringAndSize(NULL, nq * RES_FIELDS * (Py_ssize_t)sizeof(int64_t));
    f.ends = malloc((size_t)(nq + 1) * sizeof *f.ends);
    if (res == NULL || f.ends == NULL) {
        if (f.ends == NULL) PyErr_NoMemory();
        goto done;
    }
    int64_t *rs = (int64_t *)PyBytes_AS_STRING(res);
    if (find_windows(t, segs, rows, nr, spans, nq, best, sids, ks, rs, &f) < 0) goto done;
    meta = PyByteArray_FromStringAndSize(NULL, f.nmeta * (Py_ssize_t)sizeof(uint64_t));
    tops = PyByteArray_FromStringAndSize(NULL, f.ntops * (Py_ssize_t)sizeof(HRun));
    hw = malloc((size_t)(f.widest ? f.widest : 1) * sizeof *hw);
    if (meta == NULL || tops == NULL || hw == NULL) {
        if (hw == NULL) PyErr_NoMemory();
        goto done;
    }
    const uint64_t *ar = (const uint64_t *)f.arena.v;
    for (Py_ssize_t w = 0; w < f.n; w++)  /* the arena is done: its copies' places */
        for (int k = 0; k < 3; k++)
            if (f.wins[w].p[k] == NULL) f.wins[w].p[k] = ar + f.wins[w].at[k];
    PyThreadState *ts = f.nmeta + f.arena.n >= gil_free_min ? PyEval_SaveThread() : NULL;
    int nomem = answer_all(&f, nq, ks, want, hw, rs, (uint64_t *)PyByteArray_AS_STRING(meta),
                           (HRun *)PyByteArray_AS_STRING(tops), &hs) < 0;
    if (ts != NULL) PyEval_RestoreThread(ts);
    if (nomem) {
        PyErr_NoMemory();
        goto done;
    }
    held = PyByteArray_FromStringAndSize((const char *)hs.v, hs.n * (Py_ssize_t)sizeof(HSpan));
    if (held != NULL) out = PyTuple_Pack(4, res, meta, tops, held);
done:
    Py_XDECREF(res);
    Py_XDECREF(meta);
    Py_XDECREF(tops);
    Py_XDECREF(held);
    found_free(&f);
    free(hs.v);
    free(hw);
    return out;
}

/* The optional `with_spans` of assemble and match: (nq,) int64, nonzero where a query
 * asks for its spans; None (or not given: obj NULL) for none. *want: its entries, or
 * NULL for none; `view` released by the caller (a zeroed one when none). 0, or -1 with
 * an exception. */
static int with_spans_arg(PyObject *obj, Py_ssize_t nq, Py_buffer *view, const int64_t **want) {
    *view = (Py_buffer){0};
    *want = NULL;
    if (obj == NULL || obj == Py_None) return 0;
    if (get_buf(obj, "with_spans", 1, 1, 0, view) < 0) return -1;
    if (view->shape[0] != nq) {
        PyErr_Format(PyExc_ValueError, "with_spans has %zd entries for %zd queries",
                     view->shape[0], nq);
        PyBuffer_Release(view);
        *view = (Py_buffer){0};
        return -1;
    }
    *want = view->buf;
    return 0;
}

static PyObject *assemble(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 6 && nargs != 7) {
        PyErr_Format(PyExc_TypeError, "assemble takes 6 or 7 arguments (rows, spans, best, "
                     "sids, segs, ks[, with_spans]), got %zd", nargs);
        return NULL;
    }
    PyObject *segs = segs_arg(args[4]);
    if (segs == NULL) return NULL;
    Py_buffer v[5];
    static const char *const names[5] = {"rows", "spans", "best", "sids", "ks"};
    static const int sign[5] = {1, 1, 1, 0, 1}, ndim[5] = {2, 2, 1, 1, 1};
    static const Py_ssize_t width[5] = {ROW_FIELDS, 2, 0, 0, 0};
    PyObject *in[5] = {args[0], args[1], args[2], args[3], args[5]};
    for (int i = 0; i < 5; i++) {
        if (get_buf(in[i], names[i], sign[i], ndim[i], width[i], &v[i]) < 0) {
            release_all(v, i);
            return NULL;
        }
    }
    Py_ssize_t nr = v[0].shape[0], nq = v[1].shape[0];
    PyObject *out = NULL;
    SegTable t = {0};
    Py_buffer ws;
    const int64_t *want;
    if (v[2].shape[0] != nr || v[3].shape[0] != nr || v[4].shape[0] != nq) {
        PyErr_Format(PyExc_ValueError, "best and sids must have one entry per row (%zd), ks "
                     "one per query (%zd); got %zd, %zd and %zd", nr, nq, v[2].shape[0],
                     v[3].shape[0], v[4].shape[0]);
    } else if (with_spans_arg(nargs > 6 ? args[6] : NULL, nq, &ws, &want) == 0) {
        out = assemble_rows(&t, segs, v[0].buf, nr, v[1].buf, nq, v[2].buf, v[3].buf,
                            v[4].buf, want);
        PyBuffer_Release(&ws);
    }
    table_free(&t);
    release_all(v, 5);
    return out;
}

/* -- match: a whole batch in one call ------------------------------------------------ */

/* Read the segments of ids[0..n) the table has no view of yet, each once, into the
 * table: those `cache` holds (NULL: none) taken from it in C (no Python object made),
 * the rest through `read(list of seg ids) -> dict` (their views are added first, as
 * missing, and take what read returned for each). 0, or -1 with an exception. */
static int read_into(PyObject *read, SegCache *cache, SegTable *t, const uint64_t *ids,
                     Py_ssize_t n) {
    IVec miss = {0};  /* the views waiting for read */
    PyObject *want = NULL, *got = NULL;
    int rc = -1;
    for (Py_ssize_t i = 0; i < n; i++) {
        if (table_find(t, ids[i]) >= 0) continue;
        PyObject *seg = cache == NULL ? NULL : segcache_hit(cache, ids[i]);  /* borrowed */
        Py_ssize_t v = table_add(t, ids[i], seg);
        if (v < 0) goto done;
        if (seg == NULL) {
            if (ivec_push(&miss, v) < 0) goto done;
        } else if (cache->trace != NULL) {
            PyObject *sid = PyLong_FromUnsignedLongLong(ids[i]);
            int bad = sid == NULL || segcache_trace(cache, sid) < 0;
            Py_XDECREF(sid);
            if (bad) goto done;
        }
    }
    if (miss.n == 0) {
        rc = 0;
        goto done;
    }
    if ((want = PyList_New(miss.n)) == NULL) goto done;
    for (Py_ssize_t k = 0; k < miss.n; k++) {
        PyObject *sid = PyLong_FromUnsignedLongLong(view_at(t, miss.v[k])->sid);
        if (sid == NULL) goto done;
        PyList_SET_ITEM(want, k, sid);
    }
    got = PyObject_CallOneArg(read, want);
    if (got == NULL) goto done;
    if (!PyDict_Check(got)) {
        PyErr_Format(PyExc_TypeError, "read must return a dict of seg id -> Segment, got "
                     "%.100s", Py_TYPE(got)->tp_name);
        goto done;
    }
    for (Py_ssize_t k = 0; k < miss.n; k++) {
        PyObject *seg = PyDict_GetItemWithError(got, PyList_GET_ITEM(want, k));  /* borrowed */
        if (seg == NULL && PyErr_Occurred()) goto done;
        if (seg != NULL && seg != Py_None) view_at(t, miss.v[k])->seg = Py_NewRef(seg);
    }
    rc = 0;
done:
    if (rc < 0 && !PyErr_Occurred()) PyErr_NoMemory();
    free(miss.v);
    Py_XDECREF(want);
    Py_XDECREF(got);
    return rc;
}

/* What the rounds of a batch work on (the GIL held throughout). */
typedef struct {
    const Dir *d;
    const Batch *b;
    const int64_t *starts, *rows, *spans;
    const uint64_t *first;
    Py_ssize_t nr;
    SegTable *t;
    PyObject *segs, *read, *indexed;
    SegCache *cache;
    rd_plan *plans;
} Rounds;

/* The rows whose window is each query's first short one and still open. */
static int open_rows(const Rounds *x, IVec *open) {
    open->n = 0;
    for (Py_ssize_t q = 0; q < x->b->nq; q++) {
        for (int64_t r = x->spans[2 * q]; r < x->spans[2 * q + 1]; r++) {
            const rd_plan *p = &x->plans[r];
            if (p->best >= p->length) continue;  /* full: the next window counts */
            if (rd_open(p, p->best) && ivec_push(open, r) < 0) return -1;
            break;
        }
    }
    return 0;
}

static const uint64_t *window_ids(const Rounds *x, int64_t r) {
    const int64_t *row = x->rows + ROW_FIELDS * r;
    return x->b->qids + 2 * (x->starts[row[R_Q]] + row[R_W] * x->b->sb);
}

/* Settle the open windows whose next block no segment holds: one `indexed` call
 * (16-byte ids in, one truth value each out) for those not asked at this run yet. */
static int settle_unheld(const Rounds *x, const IVec *open) {
    Py_ssize_t k = 0;
    for (Py_ssize_t i = 0; i < open->n; i++)
        k += x->plans[open->v[i]].checked_at != x->plans[open->v[i]].best;
    if (!k || x->indexed == Py_None) return 0;
    PyObject *raw = PyBytes_FromStringAndSize(NULL, k * 16), *got = NULL, *seq = NULL;
    if (raw == NULL) return -1;
    uint64_t *w = (uint64_t *)PyBytes_AS_STRING(raw);
    for (Py_ssize_t i = 0, j = 0; i < open->n; i++) {
        const rd_plan *p = &x->plans[open->v[i]];
        if (p->checked_at == p->best) continue;
        const uint64_t *next = window_ids(x, open->v[i]) + 2 * p->best;
        w[2 * j] = load_u64(next);
        w[2 * j + 1] = load_u64(next + 1);
        j++;
    }
    int rc = -1;
    got = PyObject_CallOneArg(x->indexed, raw);
    if (got == NULL || (seq = PySequence_Fast(got, "indexed must return a sequence")) == NULL)
        goto done;
    if (PySequence_Fast_GET_SIZE(seq) != k) {
        PyErr_Format(PyExc_ValueError, "indexed returned %zd answers for %zd ids",
                     PySequence_Fast_GET_SIZE(seq), k);
        goto done;
    }
    for (Py_ssize_t i = 0, j = 0; i < open->n; i++) {
        rd_plan *p = &x->plans[open->v[i]];
        if (p->checked_at == p->best) continue;
        int held = PyObject_IsTrue(PySequence_Fast_GET_ITEM(seq, j++));
        if (held < 0) goto done;
        p->checked_at = p->best;
        if (!held) p->settled = 1;
    }
    rc = 0;
done:
    Py_DECREF(raw);
    Py_XDECREF(got);
    Py_XDECREF(seq);
    return rc;
}

/* Give plan r its posting list (the directory's, in posting order) and first round. */
static int take_posting(const Rounds *x, int64_t r) {
    const int64_t *row = x->rows + ROW_FIELDS * r;
    int64_t n = (row[R_BHI] - row[R_BLO]) + (row[R_DHI] - row[R_DLO]);
    uint64_t *segs = malloc((size_t)(n ? n : 1) * 2 * sizeof *segs);
    if (segs == NULL) return -1;
    for (int64_t i = 0; i < n; i++) {
        segs[i] = seg_at(x->d, row, i);
        segs[n + i] = filt_at(x->d, row, i);
    }
    uint64_t qfilt = filter_at(window_ids(x, r), row[R_LEN], row[R_OFF]);
    int rc = rd_take_posting(&x->plans[r], segs, segs + n, n, x->first + row[R_FSTART],
                             row[R_FCOUNT], qfilt);
    free(segs);
    return rc;
}

/* One round: each open plan's next candidates (`todo`: row, then its seg ids, in
 * `cands`), read, verified and offered. *any: whether any plan had a candidate. */
static int one_round(const Rounds *x, const IVec *open, int *any) {
    IVec todo = {0};  /* (row, first candidate in cands, count) */
    Vec cands = {NULL, 0, 0};
    int rc = -1;
    *any = 0;
    for (Py_ssize_t i = 0; i < open->n; i++) {
        int64_t r = open->v[i];
        rd_plan *p = &x->plans[r];
        if (!rd_open(p, p->best)) continue;  /* settled by `indexed` */
        if (rd_needs_posting(p) && take_posting(x, r) < 0) goto nomem;
        if (vec_reserve(&cands, p->nrest ? p->nrest : 1) < 0) goto nomem;
        int64_t k = rd_more(p, p->best, cands.v + cands.n);
        if (k < 0) goto nomem;
        if (!k) continue;
        if (ivec_push(&todo, r) < 0 || ivec_push(&todo, cands.n) < 0 || ivec_push(&todo, k) < 0)
            goto done;
        cands.n += k;
    }
    if (!todo.n) {
        rc = 0;
        goto done;
    }
    *any = 1;
    if (read_into(x->read, x->cache, x->t, cands.v, cands.n) < 0) goto done;
    for (Py_ssize_t i = 0; i < todo.n; i += 3) {
        int64_t r = todo.v[i];
        rd_plan *p = &x->plans[r];
        const int64_t *row = x->rows + ROW_FIELDS * r;
        for (int64_t c = todo.v[i + 1]; c < todo.v[i + 1] + todo.v[i + 2]; c++) {
            Py_ssize_t v = candidate(x->t, x->segs, cands.v[c], row[R_W]);
            if (v == -1) goto done;
            if (v >= 0) rd_offer(p, cands.v[c], view_run(view_at(x->t, v), window_ids(x, r),
                                                         row[R_LEN]));
        }
    }
    rc = 0;
    goto done;
nomem:
    PyErr_NoMemory();
done:
    free(todo.v);
    free(cands.v);
    return rc;
}

/* Bound-and-verify (index.py: _exact_rounds) over the batch's plans until no query's
 * first short window is open; the rounds run counted in *nrounds. */
static int run_rounds(const Rounds *x, int64_t *nrounds) {
    IVec open = {0};
    int rc = -1, any = 1;
    while (any) {
        if (open_rows(x, &open) < 0 || settle_unheld(x, &open) < 0
                || one_round(x, &open, &any) < 0)
            goto done;
        *nrounds += any;
    }
    rc = 0;
done:
    free(open.v);
    return rc;
}

/* The rows' spans per query (rows go by query): spans[2q], spans[2q + 1]. */
static void query_spans(const int64_t *rows, Py_ssize_t nr, Py_ssize_t nq, int64_t *spans) {
    Py_ssize_t r = 0;
    for (Py_ssize_t q = 0; q < nq; q++) {
        spans[2 * q] = r;
        while (r < nr && rows[ROW_FIELDS * r + R_Q] == q) r++;
        spans[2 * q + 1] = r;
    }
}

/* Route, read and verify the first rounds, run the rounds, assemble: match's body
 * once its arguments are checked. */
static PyObject *match_batch(const Dir *d, const Batch *b, PyObject *read, SegCache *cache,
                             PyObject *indexed, const int64_t *ks, int exact,
                             const int64_t *want) {
    Py_ssize_t maxrows = 0, nr = 0;
    for (Py_ssize_t q = 0; q < b->nq; q++) maxrows += (b->qlens[q] + b->sb - 1) / b->sb;
    size_t nrow = (size_t)(maxrows ? maxrows : 1);
    int64_t *rows = malloc(nrow * ROW_FIELDS * sizeof *rows), *best = malloc(nrow * sizeof *best);
    int64_t *starts = malloc((size_t)(b->nq + 1) * sizeof *starts);
    int64_t *spans = malloc((size_t)(b->nq + 1) * 2 * sizeof *spans);
    uint64_t *bsid = malloc(nrow * sizeof *bsid);
    rd_plan *plans = NULL;
    Vec first = {NULL, 0, 0};
    SegTable t = {0};
    PyObject *segs = PyDict_New(), *answer = NULL, *out = NULL;
    int64_t nrounds = 0;
    int rc = -1;
    if (rows == NULL || best == NULL || starts == NULL || spans == NULL || bsid == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    if (segs == NULL) goto done;
    if (maxrows * b->sb >= gil_free_min) {
        Py_BEGIN_ALLOW_THREADS
        rc = route_all(d, b, rows, &nr, &first);
        Py_END_ALLOW_THREADS
    } else {
        rc = route_all(d, b, rows, &nr, &first);
    }
    if (rc < 0) {
        PyErr_NoMemory();
        goto done;
    }
    for (Py_ssize_t q = 0, s = 0; q < b->nq; s += b->qlens[q++]) starts[q] = s;
    query_spans(rows, nr, b->nq, spans);
    t.expect = first.n;  /* at most one view each: no rehash while they are read */
    if (read_into(read, cache, &t, first.v, first.n) < 0
            || verify_rows(&t, segs, b->qids, starts[b->nq - 1] + b->qlens[b->nq - 1], starts,
                           b->nq, rows, nr, first.v, first.n, b->sb, best, bsid) < 0)
        goto done;
    if (exact && nr) {
        if ((plans = calloc((size_t)nr, sizeof *plans)) == NULL) {
            PyErr_NoMemory();
            goto done;
        }
        for (Py_ssize_t r = 0; r < nr; r++) {
            const int64_t *row = rows + ROW_FIELDS * r;
            rd_init(&plans[r], row[R_LEN], row[R_OFF], row[R_FBOUND],
                    (row[R_BHI] - row[R_BLO]) + (row[R_DHI] - row[R_DLO]), row[R_FCOUNT],
                    best[r], bsid[r], b->cap);
        }
        Rounds x = {d, b, starts, rows, spans, first.v, nr, &t, segs, read, indexed, cache,
                    plans};
        if (run_rounds(&x, &nrounds) < 0) goto done;
        for (Py_ssize_t r = 0; r < nr; r++) {
            best[r] = plans[r].best;
            bsid[r] = plans[r].best_sid;
        }
    }
    answer = assemble_rows(&t, segs, rows, nr, spans, b->nq, best, bsid, ks, want);
    if (answer != NULL)
        out = Py_BuildValue("(OOOOL)", PyTuple_GET_ITEM(answer, 0), PyTuple_GET_ITEM(answer, 1),
                            PyTuple_GET_ITEM(answer, 2), PyTuple_GET_ITEM(answer, 3),
                            (long long)nrounds);
done:
    if (plans != NULL)
        for (Py_ssize_t r = 0; r < nr; r++) rd_free(&plans[r]);
    free(plans);
    free(rows);
    free(best);
    free(starts);
    free(spans);
    free(bsid);
    free(first.v);
    table_free(&t);
    Py_XDECREF(segs);
    Py_XDECREF(answer);
    return out;
}

static PyObject *match(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs < NBUF + 7 || nargs > NBUF + 10) {
        PyErr_Format(PyExc_TypeError, "match takes %d to %d arguments (qids, qlens, bkeys, "
                     "bsegs, bfilts, dkeys, dsegs, dfilts, dorder, sb, gap, cap, read, indexed, "
                     "ks, exact[, kfilter[, cache[, with_spans]]]), got %zd", NBUF + 7, NBUF + 10,
                     nargs);
        return NULL;
    }
    PyObject *read = args[NBUF + 3], *indexed = args[NBUF + 4];
    if (!PyCallable_Check(read) || (indexed != Py_None && !PyCallable_Check(indexed))) {
        PyErr_SetString(PyExc_TypeError, "read must be callable, indexed callable or None");
        return NULL;
    }
    PyObject *cache = nargs > NBUF + 8 ? args[NBUF + 8] : Py_None;
    if (cache != Py_None && !PyObject_TypeCheck(cache, &SegCacheType)) {
        PyErr_Format(PyExc_TypeError, "cache must be a SegmentCache or None, got %.100s",
                     Py_TYPE(cache)->tp_name);
        return NULL;
    }
    int exact = PyObject_IsTrue(args[NBUF + 6]);
    if (exact < 0) return NULL;
    Py_buffer v[NBUF + 1], ks, ws = {0};  /* ws: zeroed until with_spans is read */
    const int64_t *want;
    Dir d;
    Batch b;
    if (route_args(args, nargs > NBUF + 7 ? args[NBUF + 7] : NULL, v, &d, &b) < 0) return NULL;
    PyObject *out = NULL;
    if (get_buf(args[NBUF + 5], "ks", 1, 1, 0, &ks) == 0) {
        if (ks.shape[0] != b.nq)
            PyErr_Format(PyExc_ValueError, "ks has %zd entries for %zd queries", ks.shape[0],
                         b.nq);
        else if (with_spans_arg(nargs > NBUF + 9 ? args[NBUF + 9] : NULL, b.nq, &ws, &want) == 0)
            out = b.nq ? match_batch(&d, &b, read, cache == Py_None ? NULL : (SegCache *)cache,
                                     indexed, ks.buf, exact, want)
                       : Py_BuildValue("(y#NNNi)", "", (Py_ssize_t)0,
                                       PyByteArray_FromStringAndSize(NULL, 0),
                                       PyByteArray_FromStringAndSize(NULL, 0),
                                       PyByteArray_FromStringAndSize(NULL, 0), 0);
        PyBuffer_Release(&ws);
        PyBuffer_Release(&ks);
    }
    release_all(v, NBUF + 1);
    return out;
}

/* -- the delta's key order (directory.py: _Delta.order) ------------------------------ */

typedef struct { uint64_t key; int64_t row; } KeyRow;

static int by_key_row(const void *a, const void *b) {  /* (key, row): stable by key */
    const KeyRow *x = a, *y = b;
    if (x->key != y->key) return x->key < y->key ? -1 : 1;
    return (x->row > y->row) - (x->row < y->row);
}

static PyObject *merge_order(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 3) {
        PyErr_Format(PyExc_TypeError, "merge_order takes 3 arguments (keys, old_order, "
                     "old_keys), got %zd", nargs);
        return NULL;
    }
    Py_buffer v[3];
    static const char *const names[3] = {"keys", "old_order", "old_keys"};
    static const int sign[3] = {0, 1, 0};
    for (int i = 0; i < 3; i++) {
        if (get_buf(args[i], names[i], sign[i], 1, 0, &v[i]) < 0) {
            release_all(v, i);
            return NULL;
        }
    }
    Py_ssize_t n = v[0].shape[0], n0 = v[1].shape[0];
    const uint64_t *keys = v[0].buf, *old_keys = v[2].buf;
    const int64_t *old = v[1].buf;
    PyObject *order = NULL, *sorted = NULL, *out = NULL;
    KeyRow *fresh = NULL;
    if (v[2].shape[0] != n0 || n0 > n) {
        PyErr_Format(PyExc_ValueError, "old_order and old_keys must have one length, at most "
                     "len(keys) = %zd; got %zd and %zd", n, n0, v[2].shape[0]);
        goto done;
    }
    order = PyBytes_FromStringAndSize(NULL, n * (Py_ssize_t)sizeof(int64_t));
    sorted = PyBytes_FromStringAndSize(NULL, n * (Py_ssize_t)sizeof(uint64_t));
    fresh = malloc((size_t)(n - n0 + 1) * sizeof *fresh);
    if (order == NULL || sorted == NULL || fresh == NULL) {
        if (fresh == NULL) PyErr_NoMemory();
        goto done;
    }
    int64_t *o = (int64_t *)PyBytes_AS_STRING(order);
    uint64_t *k = (uint64_t *)PyBytes_AS_STRING(sorted);
    Py_BEGIN_ALLOW_THREADS
    Py_ssize_t m = n - n0;
    for (Py_ssize_t i = 0; i < m; i++) fresh[i] = (KeyRow){keys[n0 + i], n0 + i};
    qsort(fresh, (size_t)m, sizeof *fresh, by_key_row);
    Py_ssize_t i = 0, j = 0, t = 0;
    while (i < n0 || j < m) {  /* an old row first while its key is <= the new one's */
        if (j == m || (i < n0 && old_keys[i] <= fresh[j].key)) {
            o[t] = old[i];
            k[t++] = old_keys[i++];
        } else {
            o[t] = fresh[j].row;
            k[t++] = fresh[j++].key;
        }
    }
    Py_END_ALLOW_THREADS
    out = PyTuple_Pack(2, order, sorted);
done:
    Py_XDECREF(order);
    Py_XDECREF(sorted);
    free(fresh);
    release_all(v, 3);
    return out;
}

/* Test hook: the work below which route, verify and assemble keep the GIL; returns the
 * previous setting. */
static PyObject *set_gil_free_min(PyObject *self, PyObject *arg) {
    Py_ssize_t n = PyLong_AsSsize_t(arg);
    if (n == -1 && PyErr_Occurred()) return NULL;
    Py_ssize_t was = gil_free_min;
    gil_free_min = n;
    return PyLong_FromSsize_t(was);
}

/* -- salting (ids.py: salt_ids) ------------------------------------------------------ */

/* out[r] = src[r] ^ (lo, hi) for rows [r0, r1): `out` C-contiguous, `src` any strides
 * (each word read at any alignment, written with memcpy). */
static void xor_rows(const Py_buffer *src, void *out, Py_ssize_t r0, Py_ssize_t r1,
                     uint64_t lo, uint64_t hi) {
    uint64_t *o = out;
    for (Py_ssize_t r = r0; r < r1; r++) {
        uint64_t a = sarp_word_at(src, r, 0) ^ lo, b = sarp_word_at(src, r, 1) ^ hi;
        memcpy(o + 2 * r, &a, sizeof a);
        memcpy(o + 2 * r + 1, &b, sizeof b);
    }
}

/* salt(ids, out, lo, hi): out[i] = ids[i] ^ (lo, hi) for every row; `ids` (n, 2) uint64
 * with any strides, `out` a writable C-contiguous (n, 2) uint64 array (it may be ids). */
static PyObject *salt(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    (void)self;
    if (nargs != 4) {
        PyErr_Format(PyExc_TypeError, "salt takes 4 arguments (ids, out, lo, hi), got %zd",
                     nargs);
        return NULL;
    }
    uint64_t lo, hi;
    if (sarp_get_uint64_arg(args[2], "lo", &lo) < 0 || sarp_get_uint64_arg(args[3], "hi", &hi) < 0)
        return NULL;
    Py_buffer src, dst;
    if (get_strided(args[0], "ids", 2, 2, &src) < 0) return NULL;
    if (get_buf(args[1], "out", 0, 2, 2, &dst) < 0) {
        PyBuffer_Release(&src);
        return NULL;
    }
    PyObject *out = NULL;
    if (dst.readonly || dst.shape[0] != src.shape[0]) {
        PyErr_Format(PyExc_ValueError, "out must be writable with the %zd rows of ids, got %zd%s",
                     src.shape[0], dst.shape[0], dst.readonly ? " (read-only)" : "");
    } else {
        xor_rows(&src, dst.buf, 0, src.shape[0], lo, hi);
        out = Py_NewRef(Py_None);
    }
    PyBuffer_Release(&dst);
    PyBuffer_Release(&src);
    return out;
}

/* salt_runs(ids, out, ends, salts): salt(ids[a:b], out[a:b], *salts[i]) for each run i,
 * [a, b) = [ends[i-1], ends[i]) (from 0): a batch of sequences of several namespaces,
 * concatenated, in one call. `ends` ascending int64 (m,), its last the rows of ids;
 * `salts` (m, 2) uint64. */
static PyObject *salt_runs(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    (void)self;
    if (nargs != 4) {
        PyErr_Format(PyExc_TypeError, "salt_runs takes 4 arguments (ids, out, ends, salts), "
                     "got %zd", nargs);
        return NULL;
    }
    Py_buffer src, dst, ends, salts;
    if (get_strided(args[0], "ids", 2, 2, &src) < 0) return NULL;
    if (get_buf(args[1], "out", 0, 2, 2, &dst) < 0) {
        PyBuffer_Release(&src);
        return NULL;
    }
    if (get_buf(args[2], "ends", 1, 1, 0, &ends) < 0) {
        PyBuffer_Release(&dst);
        PyBuffer_Release(&src);
        return NULL;
    }
    if (get_buf(args[3], "salts", 0, 2, 2, &salts) < 0) {
        PyBuffer_Release(&ends);
        PyBuffer_Release(&dst);
        PyBuffer_Release(&src);
        return NULL;
    }
    PyObject *out = NULL;
    Py_ssize_t n = src.shape[0], m = ends.shape[0];
    const int64_t *e = ends.buf;
    int ok = !dst.readonly && dst.shape[0] == n && salts.shape[0] == m && (m ? e[m - 1] == n : n == 0);
    for (Py_ssize_t i = 0; ok && i < m; i++) ok = e[i] >= (i ? e[i - 1] : 0);
    if (!ok) {
        PyErr_Format(PyExc_ValueError, "salt_runs: out must be writable with the %zd rows of "
                     "ids, salts one row per run, ends ascending to %zd (got out %zd rows, %zd "
                     "salts, %zd ends)", n, n, dst.shape[0], salts.shape[0], m);
    } else {
        const uint64_t *sv = salts.buf;
        for (Py_ssize_t i = 0; i < m; i++)
            xor_rows(&src, dst.buf, i ? e[i - 1] : 0, e[i], load_u64(sv + 2 * i),
                     load_u64(sv + 2 * i + 1));
        out = Py_NewRef(Py_None);
    }
    PyBuffer_Release(&salts);
    PyBuffer_Release(&ends);
    PyBuffer_Release(&dst);
    PyBuffer_Release(&src);
    return out;
}

/* Each of the m sequences' rows salted with its salt, one after another into out. */
static void salt_all(const Py_buffer *src, Py_ssize_t m, void *out, const uint64_t *sv) {
    uint64_t *o = out;
    for (Py_ssize_t i = 0; i < m; i++) {
        xor_rows(&src[i], o, 0, src[i].shape[0], load_u64(sv + 2 * i), load_u64(sv + 2 * i + 1));
        o += 2 * src[i].shape[0];
    }
}

/* salt_into(seqs, out, salts): the rows of every seqs[i] ((n_i, 2) uint64, any strides)
 * salted with salts[i], one after another into `out` (a writable C-contiguous (sum n_i,
 * 2) uint64 array): salt_ids_many's batch without a concatenated copy first. */
static PyObject *salt_into(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    (void)self;
    if (nargs != 3) {
        PyErr_Format(PyExc_TypeError, "salt_into takes 3 arguments (seqs, out, salts), got %zd",
                     nargs);
        return NULL;
    }
    PyObject *seqs = PySequence_Fast(args[0], "salt_into: seqs must be a sequence of arrays");
    if (seqs == NULL) return NULL;
    Py_ssize_t m = PySequence_Fast_GET_SIZE(seqs);
    Py_buffer dst, salts;
    PyObject *out = NULL;
    if (get_buf(args[1], "out", 0, 2, 2, &dst) < 0) goto no_dst;
    if (get_buf(args[2], "salts", 0, 2, 2, &salts) < 0) goto no_salts;
    if (dst.readonly || salts.shape[0] != m) {
        PyErr_Format(PyExc_ValueError, "salt_into: out must be writable and salts have one row "
                     "per sequence (%zd), got %zd%s", m, salts.shape[0],
                     dst.readonly ? " (out read-only)" : "");
        goto done;
    }
    const uint64_t *sv = salts.buf;
    Py_ssize_t at = 0, got = 0;
    /* every sequence's buffer first (the GIL held), then the copies (without it past
     * gil_free_min rows: the buffers keep the arrays' memory) */
    Py_buffer *src = PyMem_Malloc((size_t)(m ? m : 1) * sizeof *src);
    if (src == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    for (; got < m; got++) {
        if (get_strided(PySequence_Fast_GET_ITEM(seqs, got), "ids", 2, 2, &src[got]) < 0)
            goto release;
        if (src[got].shape[0] > dst.shape[0] - at) {
            PyBuffer_Release(&src[got]);
            PyErr_Format(PyExc_ValueError, "salt_into: out has %zd rows, the sequences more",
                         dst.shape[0]);
            goto release;
        }
        at += src[got].shape[0];
    }
    if (at != dst.shape[0]) {
        PyErr_Format(PyExc_ValueError, "salt_into: out has %zd rows, the sequences %zd",
                     dst.shape[0], at);
        goto release;
    }
    if (at >= gil_free_min) {
        Py_BEGIN_ALLOW_THREADS
        salt_all(src, m, dst.buf, sv);
        Py_END_ALLOW_THREADS
    } else {
        salt_all(src, m, dst.buf, sv);
    }
    out = Py_NewRef(Py_None);
release:
    for (Py_ssize_t i = 0; i < got; i++) PyBuffer_Release(&src[i]);
    PyMem_Free(src);
done:
    PyBuffer_Release(&salts);
no_salts:
    PyBuffer_Release(&dst);
no_dst:
    Py_DECREF(seqs);
    return out;
}

static PyMethodDef methods[] = {
    {"route", (PyCFunction)(void (*)(void))route, METH_FASTCALL,
     "Every routed window of a batch and its first round (module docstring)."},
    {"verify", (PyCFunction)(void (*)(void))verify, METH_FASTCALL,
     "The first round's verified run of every routed window (module docstring)."},
    {"assemble", (PyCFunction)(void (*)(void))assemble, METH_FASTCALL,
     "Every query's blocks, metas, top holders and spans from its windows' runs (module "
     "docstring)."},
    {"match", (PyCFunction)(void (*)(void))match, METH_FASTCALL,
     "A whole batch: route, read, verify, bound-and-verify rounds, answers (module "
     "docstring)."},
    {"salt", (PyCFunction)(void (*)(void))salt, METH_FASTCALL,
     "salt(ids, out, lo, hi, /)\n--\n\nout = ids ^ (lo, hi), row by row (sarpd.core.ids.salt_ids)."},
    {"salt_runs", (PyCFunction)(void (*)(void))salt_runs, METH_FASTCALL,
     "salt_runs(ids, out, ends, salts, /)\n--\n\nsalt of each run [ends[i-1], ends[i]) of "
     "ids with salts[i] (sarpd.core.ids.salt_ids_many)."},
    {"salt_into", (PyCFunction)(void (*)(void))salt_into, METH_FASTCALL,
     "salt_into(seqs, out, salts, /)\n--\n\nThe rows of each seqs[i] salted with salts[i], "
     "one after another into out (sarpd.core.ids.salt_ids_many)."},
    {"merge_order", (PyCFunction)(void (*)(void))merge_order, METH_FASTCALL,
     "The delta's stable key order with its appended rows merged in (module docstring)."},
    {"_set_gil_free_min", set_gil_free_min, METH_O,
     "Work below which route, verify and assemble keep the GIL (0: always release); the "
     "old value."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "sarpd.core._cmatch",
                                    "The match kernel: routing and verification of a batch.",
                                    -1, methods};

PyMODINIT_FUNC PyInit__cmatch(void) {
    S_WINDOW = PyUnicode_InternFromString("window");
    S_PRESENCE = PyUnicode_InternFromString("presence");
    S_IDS = PyUnicode_InternFromString("ids");
    S_META = PyUnicode_InternFromString("meta");
    S_XMETA = PyUnicode_InternFromString("xmeta");
    S_XMASK = PyUnicode_InternFromString("xmask");
    S_CVIEW = PyUnicode_InternFromString("_cview");
    if (S_WINDOW == NULL || S_PRESENCE == NULL || S_IDS == NULL || S_META == NULL
            || S_XMETA == NULL || S_XMASK == NULL || S_CVIEW == NULL
            || PyType_Ready(&CViewType) < 0 || PyType_Ready(&SegCacheType) < 0)
        return NULL;
    PyObject *mod = PyModule_Create(&module);
    if (mod == NULL) return NULL;
    if (PyModule_AddIntConstant(mod, "ROW_FIELDS", ROW_FIELDS) < 0
            || PyModule_AddObjectRef(mod, "SegmentCache", (PyObject *)&SegCacheType) < 0) {
        Py_DECREF(mod);
        return NULL;
    }
    return mod;
}
