/* The routing directory in plain C (directory.h): the twin of sarpd/core/directory.py's
 * Directory, whose module docstring says what the directory is for; this comment says
 * how it is laid out, and where it follows the reference step by step.
 *
 * Base: three parallel vecs (keys sorted, segs, filts) of `bn` entries; a key's
 * entries are the slice [lower_bound, upper_bound) of keys. The slice bounds of
 * recently asked keys are kept in a small direct-mapped cache (`rc`: the reference's
 * `_rcache`), allocated on first use once the base is big enough for a binary search
 * to miss the caches; a generation stamp empties it when the base changes. The
 * counts `entries` and `keys_count` need of the base (seg-0 entries, distinct live
 * keys) are computed on first use after a change (the reference scans every call).
 *
 * Delta: three vecs in insertion order (capacity 64, doubled by replacing the vecs
 * when full, as the reference's concatenation does: a view of the old ones keeps
 * seeing what it saw), `next` (each row's next row of the same key, NONE at the
 * end), and an open-addressing table (power-of-two slots, at most half used, linear
 * probing from a mix of the key) of key -> (first row, last row, rows): a posting
 * list's delta part is that chain, in insertion order. Rows never move or go away
 * until a merge replaces the whole delta (with a new one of capacity 64).
 *
 * Order (dir_order, the match kernel's `dorder`): a stable argsort of the delta keys
 * for the first `on` rows, with those keys in that order (`okeys`); the rows appended
 * since are sorted by (key, row) and merged in after the equal old keys (the
 * reference's _Delta.order, O(rows) a call), into a new vec.
 *
 * Merge (the reference's _merge): the delta rows in that stable order, seg 0 skipped,
 * merged into the base with the base's entries first among equal keys (searchsorted
 * 'right'), the base's seg-0 entries dropped only after a drop marked some (as the
 * reference's `_base_dead`); into new vecs of bn + dn entries (an upper bound: what
 * the dead leave is unused), then a new empty delta. `merges` counts merges that
 * folded a delta in; `version` grows at every merge, add, found set_filter.
 *
 * Key filter (dir_keyfilter; the layout and hash are directory.h's): built on demand
 * from the base and the delta keys, sized for the entries then held, a quarter more and
 * 64 (12 bits each: ~1 % false positives); dir_add sets its key's bits, and drops the
 * filter (to be rebuilt at the next dir_keyfilter: O(entries) once per quarter grown)
 * once more entries were added than it had room for. A merge keeps it (what a merge
 * drops stays a harmless superset); a load drops it.
 *
 * Every operation allocates all it needs (new vecs, a grown table, the order, a new
 * delta) before it changes anything, so DIR_NOMEM leaves the directory as it was. */
#include "directory.h"

#include <stdlib.h>
#include <string.h>
#include <time.h>

#define NONE SIZE_MAX
#define DELTA_CAP0 ((size_t)64)  /* the reference's _Delta capacity */
#define RC_SLOTS ((size_t)4096)
#define RC_MIN_BASE ((size_t)1 << 14)  /* smaller bases: a binary search is cheap */
#define MAX_ITEMS (SIZE_MAX / 4 / sizeof(uint64_t))  /* any vec, any table: sizes fit */

/* -- vecs ------------------------------------------------------------------------------ */

dir_vec *dir_vec_new(size_t len) {
    if (len > MAX_ITEMS) return NULL;
    dir_vec *v = malloc(sizeof *v + (len ? len : 1) * sizeof(uint64_t));
    if (v == NULL) return NULL;
    v->refs = 1;
    v->len = v->cap = len;
    v->data = (uint64_t *)(v + 1);
    v->release = NULL;
    v->ctx = NULL;
    return v;
}

dir_vec *dir_vec_wrap(uint64_t *data, size_t len, void (*release)(void *ctx), void *ctx) {
    dir_vec *v = malloc(sizeof *v);
    if (v == NULL) {
        if (release != NULL) release(ctx);
        return NULL;
    }
    v->refs = 1;
    v->len = v->cap = len;
    v->data = data;
    v->release = release;
    v->ctx = ctx;
    return v;
}

void dir_vec_ref(dir_vec *v) { __atomic_fetch_add(&v->refs, 1, __ATOMIC_RELAXED); }

void dir_vec_unref(dir_vec *v) {
    if (v == NULL || __atomic_sub_fetch(&v->refs, 1, __ATOMIC_ACQ_REL) != 0) return;
    if (v->release != NULL) v->release(v->ctx);
    free(v);
}

/* Three new vecs of `len` items, or none (NOMEM). */
static int vecs3_new(size_t len, dir_vec **a, dir_vec **b, dir_vec **c) {
    *a = dir_vec_new(len);
    *b = dir_vec_new(len);
    *c = dir_vec_new(len);
    if (*a != NULL && *b != NULL && *c != NULL) return DIR_OK;
    dir_vec_unref(*a);
    dir_vec_unref(*b);
    dir_vec_unref(*c);
    return DIR_NOMEM;
}

/* -- the delta ------------------------------------------------------------------------- */

typedef struct {
    uint64_t key;
    size_t first, last, rows;  /* rows 0: an empty slot */
} slot_t;

typedef struct {
    dir_vec *keys, *segs, *filts;  /* capacity: keys->len */
    size_t n;
    size_t *next;  /* capacity */
    slot_t *slots;
    size_t nslots, nkeys;  /* nslots a power of two, nkeys <= nslots / 2 */
} delta_t;

static inline size_t key_hash(uint64_t key) {
    key ^= key >> 33;
    key *= 0xFF51AFD7ED558CCDull;
    key ^= key >> 33;
    return (size_t)key;
}

/* The slot of `key`, or the empty slot where it would go. */
static slot_t *slot_of(const delta_t *t, uint64_t key) {
    size_t mask = t->nslots - 1, i = key_hash(key) & mask;
    while (t->slots[i].rows && t->slots[i].key != key) i = (i + 1) & mask;
    return &t->slots[i];
}

static void delta_release(delta_t *t) {
    dir_vec_unref(t->keys);
    dir_vec_unref(t->segs);
    dir_vec_unref(t->filts);
    free(t->next);
    free(t->slots);
    memset(t, 0, sizeof *t);
}

/* A new empty delta of capacity DELTA_CAP0, or NOMEM. */
static int delta_new(delta_t *t) {
    memset(t, 0, sizeof *t);
    int rc = vecs3_new(DELTA_CAP0, &t->keys, &t->segs, &t->filts);
    t->next = malloc(DELTA_CAP0 * sizeof(size_t));
    t->nslots = 2 * DELTA_CAP0;
    t->slots = calloc(t->nslots, sizeof(slot_t));
    if (rc != DIR_OK || t->next == NULL || t->slots == NULL) {
        if (rc != DIR_OK) t->keys = t->segs = t->filts = NULL;
        delta_release(t);
        return DIR_NOMEM;
    }
    return DIR_OK;
}

/* The rows (vecs and `next`) grown to twice the capacity, into *g; changes nothing. */
static int delta_grow_rows(const delta_t *t, delta_t *g) {
    size_t cap = t->keys->len;
    if (cap > MAX_ITEMS / 2) return DIR_NOMEM;
    if (vecs3_new(2 * cap, &g->keys, &g->segs, &g->filts) != DIR_OK) return DIR_NOMEM;
    g->next = malloc(2 * cap * sizeof(size_t));
    if (g->next == NULL) {
        dir_vec_unref(g->keys);
        dir_vec_unref(g->segs);
        dir_vec_unref(g->filts);
        return DIR_NOMEM;
    }
    memcpy(g->keys->data, t->keys->data, t->n * sizeof(uint64_t));
    memcpy(g->segs->data, t->segs->data, t->n * sizeof(uint64_t));
    memcpy(g->filts->data, t->filts->data, t->n * sizeof(uint64_t));
    memcpy(g->next, t->next, t->n * sizeof(size_t));
    return DIR_OK;
}

/* A table of twice the slots holding the same keys, or NULL. */
static slot_t *delta_grow_slots(const delta_t *t) {
    if (t->nslots > MAX_ITEMS / 4) return NULL;
    size_t nslots = 2 * t->nslots, mask = nslots - 1;
    slot_t *slots = calloc(nslots, sizeof(slot_t));
    if (slots == NULL) return NULL;
    for (size_t s = 0; s < t->nslots; s++) {
        if (!t->slots[s].rows) continue;
        size_t i = key_hash(t->slots[s].key) & mask;
        while (slots[i].rows) i = (i + 1) & mask;
        slots[i] = t->slots[s];
    }
    return slots;
}

/* -- the directory --------------------------------------------------------------------- */

typedef struct {
    uint64_t key;
    uint32_t gen;  /* valid when dir_t.rc_gen */
    size_t lo, hi;
} rc_t;

struct dir_t {
    dir_vec *bkeys, *bsegs, *bfilts;
    size_t bn;
    int base_dead;  /* a drop marked base entries (merged at once) */
    int stats_ok;   /* bzeros and blive are the base's */
    size_t bzeros, blive;
    delta_t dl;
    dir_vec *order;  /* dir_order of the first `on` rows, or NULL */
    uint64_t *okeys;
    size_t on;
    rc_t *rc;
    uint32_t rc_gen;
    int64_t delta_max;
    uint64_t version, merges;
    double ms_max, ms_total;
    dir_vec *kf;          /* the key filter, or NULL: none built */
    size_t kf_room;       /* keys it may take before it is rebuilt */
};

dir_t *dir_new(int64_t delta_max_entries) {
    dir_t *d = calloc(1, sizeof *d);
    if (d == NULL) return NULL;
    if (vecs3_new(0, &d->bkeys, &d->bsegs, &d->bfilts) != DIR_OK || delta_new(&d->dl) != DIR_OK) {
        dir_vec_unref(d->bkeys);  /* vecs3_new: all or none */
        dir_vec_unref(d->bsegs);
        dir_vec_unref(d->bfilts);
        free(d);
        return NULL;
    }
    d->rc_gen = 1;
    d->delta_max = delta_max_entries;
    return d;
}

static void order_reset(dir_t *d) {
    dir_vec_unref(d->order);
    free(d->okeys);
    d->order = NULL;
    d->okeys = NULL;
    d->on = 0;
}

void dir_free(dir_t *d) {
    if (d == NULL) return;
    dir_vec_unref(d->bkeys);
    dir_vec_unref(d->bsegs);
    dir_vec_unref(d->bfilts);
    delta_release(&d->dl);
    order_reset(d);
    dir_vec_unref(d->kf);
    free(d->rc);
    free(d);
}

int64_t dir_delta_max(const dir_t *d) { return d->delta_max; }
void dir_set_delta_max(dir_t *d, int64_t delta_max_entries) { d->delta_max = delta_max_entries; }
uint64_t dir_version(const dir_t *d) { return d->version; }
uint64_t dir_merges(const dir_t *d) { return d->merges; }
double dir_merge_s_max(const dir_t *d) { return d->ms_max; }
double dir_merge_s_total(const dir_t *d) { return d->ms_total; }

int dir_needs_merge(const dir_t *d) {
    return d->delta_max < 0 || (uint64_t)d->dl.n > (uint64_t)d->delta_max;
}

/* The base changed: its cached ranges and counts are stale. */
static void base_changed(dir_t *d) {
    d->stats_ok = 0;
    if (++d->rc_gen == 0) {  /* wrapped: clear the stamps */
        if (d->rc != NULL) memset(d->rc, 0, RC_SLOTS * sizeof(rc_t));
        d->rc_gen = 1;
    }
}

/* -- reading ----------------------------------------------------------------------------- */

/* The first i with keys[i] >= key (upper: > key). */
static size_t bound(const uint64_t *keys, size_t n, uint64_t key, int upper) {
    size_t lo = 0;
    while (n > 0) {
        size_t half = n / 2;
        uint64_t k = keys[lo + half];
        if (k < key || (upper && k == key)) {
            lo += half + 1;
            n -= half + 1;
        } else {
            n = half;
        }
    }
    return lo;
}

static void base_range(dir_t *d, uint64_t key, size_t *lo, size_t *hi) {
    const uint64_t *keys = d->bkeys->data;
    rc_t *e = NULL;
    if (d->bn >= RC_MIN_BASE) {
        if (d->rc == NULL) d->rc = calloc(RC_SLOTS, sizeof(rc_t));  /* NULL: no cache */
        if (d->rc != NULL) {
            e = &d->rc[key_hash(key) & (RC_SLOTS - 1)];
            if (e->gen == d->rc_gen && e->key == key) {
                *lo = e->lo;
                *hi = e->hi;
                return;
            }
        }
    }
    *lo = bound(keys, d->bn, key, 0);
    *hi = *lo + bound(keys + *lo, d->bn - *lo, key, 1);
    if (e != NULL) {
        e->key = key;
        e->gen = d->rc_gen;
        e->lo = *lo;
        e->hi = *hi;
    }
}

void dir_where_is(dir_t *d, uint64_t key, dir_where *w) {
    base_range(d, key, &w->lo, &w->hi);
    w->rows = 0;
    w->first = NONE;
    if (d->dl.nkeys) {
        const slot_t *s = slot_of(&d->dl, key);
        w->rows = s->rows;
        w->first = s->rows ? s->first : NONE;
    }
}

size_t dir_next_row(const dir_t *d, size_t row) { return d->dl.next[row]; }

void dir_posting(const dir_t *d, const dir_where *w, uint64_t *segs, uint64_t *filts) {
    size_t nb = w->hi - w->lo;
    memcpy(segs, d->bsegs->data + w->lo, nb * sizeof(uint64_t));
    memcpy(filts, d->bfilts->data + w->lo, nb * sizeof(uint64_t));
    size_t r = w->first;
    for (size_t i = 0; i < w->rows; i++, r = d->dl.next[r]) {
        segs[nb + i] = d->dl.segs->data[r];
        filts[nb + i] = d->dl.filts->data[r];
    }
}

enum { FIND, SET_FILTER, KILL };
#define IN_BASE 1
#define IN_DELTA 2

/* Every (key, seg) entry of `w` (the base slice's, then the delta rows'): found
 * (FIND), its filter set to `filt` (SET_FILTER) or its seg marked dead (KILL).
 * Returns where there were some: IN_BASE | IN_DELTA. */
static int each_entry(dir_t *d, const dir_where *w, uint64_t seg, int what, uint64_t filt) {
    int where = 0;
    uint64_t *bs = d->bsegs->data, *ds = d->dl.segs->data;
    for (size_t i = w->lo; i < w->hi; i++) {
        if (bs[i] != seg) continue;
        where |= IN_BASE;
        if (what == SET_FILTER) d->bfilts->data[i] = filt;
        if (what == KILL) bs[i] = DIR_DEAD;
    }
    size_t r = w->first;
    for (size_t k = 0; k < w->rows; k++, r = d->dl.next[r]) {
        if (ds[r] != seg) continue;
        where |= IN_DELTA;
        if (what == SET_FILTER) d->dl.filts->data[r] = filt;
        if (what == KILL) ds[r] = DIR_DEAD;
    }
    return where;
}

size_t dir_count(dir_t *d, uint64_t key) {
    dir_where w;
    dir_where_is(d, key, &w);
    return w.hi - w.lo + w.rows;
}

int dir_has(dir_t *d, uint64_t key, uint64_t seg) {
    dir_where w;
    dir_where_is(d, key, &w);
    return each_entry(d, &w, seg, FIND, 0) != 0;
}

void dir_probe(const dir_t *d, size_t n, const uint64_t *keys, uint8_t *hit) {
    const uint64_t *bk = d->bkeys->data;
    for (size_t i = 0; i < n; i++) {
        uint64_t key = keys[i];
        if (d->dl.nkeys && slot_of(&d->dl, key)->rows) {
            hit[i] = 1;
            continue;
        }
        size_t at = bound(bk, d->bn, key, 0);
        hit[i] = at < d->bn && bk[at] == key;
    }
}

void dir_base(const dir_t *d, dir_part *out) {
    out->keys = d->bkeys;
    out->segs = d->bsegs;
    out->filts = d->bfilts;
    out->n = d->bn;
}

void dir_delta(const dir_t *d, dir_part *out) {
    out->keys = d->dl.keys;
    out->segs = d->dl.segs;
    out->filts = d->dl.filts;
    out->n = d->dl.n;
}

typedef struct {
    uint64_t key;
    size_t row;
} pair_t;

static int pair_cmp(const void *a, const void *b) {
    const pair_t *x = a, *y = b;
    if (x->key != y->key) return x->key < y->key ? -1 : 1;
    return x->row < y->row ? -1 : x->row > y->row;
}

int dir_order(dir_t *d, dir_vec **order) {
    size_t n = d->dl.n, on = d->on, m = n - on;
    if (d->order != NULL && on == n) {
        *order = d->order;
        return DIR_OK;
    }
    dir_vec *o = dir_vec_new(n);
    uint64_t *okeys = malloc((n ? n : 1) * sizeof(uint64_t));
    pair_t *add = malloc((m ? m : 1) * sizeof(pair_t));
    if (o == NULL || okeys == NULL || add == NULL) {
        dir_vec_unref(o);
        free(okeys);
        free(add);
        return DIR_NOMEM;
    }
    const uint64_t *keys = d->dl.keys->data;
    for (size_t i = 0; i < m; i++) {
        add[i].key = keys[on + i];
        add[i].row = on + i;
    }
    qsort(add, m, sizeof *add, pair_cmp);  /* (key, row): stable by key */
    const uint64_t *old = on ? d->order->data : NULL;
    size_t i = 0, j = 0, w = 0;
    while (i < on || j < m) {  /* a new row goes after the old rows of keys <= its own */
        if (j == m || (i < on && d->okeys[i] <= add[j].key)) {
            o->data[w] = old[i];
            okeys[w++] = d->okeys[i++];
        } else {
            o->data[w] = (uint64_t)add[j].row;
            okeys[w++] = add[j++].key;
        }
    }
    free(add);
    order_reset(d);
    d->order = o;
    d->okeys = okeys;
    d->on = n;
    *order = o;
    return DIR_OK;
}

dir_vec *dir_order_now(const dir_t *d) { return d->on == d->dl.n ? d->order : NULL; }

/* The base's seg-0 entries and distinct live keys (the reference's
 * count_nonzero(diff(live keys)) + 1: adjacent changes, as for an unsorted base). */
static void base_stats(dir_t *d) {
    if (d->stats_ok) return;
    const uint64_t *keys = d->bkeys->data, *segs = d->bsegs->data;
    size_t zeros = 0, live = 0;
    uint64_t prev = 0;
    for (size_t i = 0; i < d->bn; i++) {
        if (segs[i] == DIR_DEAD) {
            zeros++;
            continue;
        }
        live += !live || keys[i] != prev;
        prev = keys[i];
    }
    d->bzeros = zeros;
    d->blive = live;
    d->stats_ok = 1;
}

size_t dir_entries(dir_t *d) {
    base_stats(d);
    return d->bn - d->bzeros + d->dl.n;
}

size_t dir_keys_count(dir_t *d) {
    base_stats(d);
    return d->blive + d->dl.nkeys;
}

size_t dir_nbytes(const dir_t *d) {
    size_t vecs = d->bkeys->cap + d->bsegs->cap + d->bfilts->cap + 3 * d->dl.keys->len;
    size_t n = sizeof *d + 6 * sizeof(dir_vec) + vecs * sizeof(uint64_t);
    n += d->dl.keys->len * sizeof(size_t) + d->dl.nslots * sizeof(slot_t);
    if (d->order != NULL) n += sizeof(dir_vec) + 2 * d->on * sizeof(uint64_t);
    if (d->rc != NULL) n += RC_SLOTS * sizeof(rc_t);
    if (d->kf != NULL) n += sizeof(dir_vec) + d->kf->len * sizeof(uint64_t);
    return n;
}

static void kf_set(dir_vec *kf, uint64_t key) {
    uint64_t h = dir_kf_hash(key);
    kf->data[dir_kf_word(h, kf->len)] |= dir_kf_bits(h);
}

dir_vec *dir_keyfilter_now(const dir_t *d) { return d->kf; }

dir_vec *dir_keyfilter(dir_t *d) {
    if (d->kf != NULL) return d->kf;
    size_t held = d->bn + d->dl.n;
    size_t keys = held + held / 4 + 64, words = keys / 64 * 12 + (keys % 64 * 12 + 63) / 64;
    if (held > MAX_ITEMS / 2 || words >= ((size_t)1 << 32)) return NULL;
    dir_vec *kf = dir_vec_new(words);
    if (kf == NULL) return NULL;
    memset(kf->data, 0, words * sizeof(uint64_t));
    for (size_t i = 0; i < d->bn; i++) kf_set(kf, d->bkeys->data[i]);
    for (size_t r = 0; r < d->dl.n; r++) kf_set(kf, d->dl.keys->data[r]);
    d->kf = kf;
    d->kf_room = keys - held;
    return kf;
}

/* -- writing ------------------------------------------------------------------------------- */

int dir_add(dir_t *d, uint64_t key, uint64_t seg, uint64_t filt) {
    delta_t *t = &d->dl, g = {0};
    slot_t *s = slot_of(t, key), *slots = NULL;
    int grow_rows = t->n == t->keys->len, grow_slots = !s->rows && 2 * (t->nkeys + 1) > t->nslots;
    if (grow_rows && delta_grow_rows(t, &g) != DIR_OK) return DIR_NOMEM;
    if (grow_slots && (slots = delta_grow_slots(t)) == NULL) {
        if (grow_rows) {
            g.n = 0;
            delta_release(&g);
        }
        return DIR_NOMEM;
    }
    if (grow_rows) {  /* new vecs: views of the old ones keep what they saw */
        dir_vec_unref(t->keys);
        dir_vec_unref(t->segs);
        dir_vec_unref(t->filts);
        free(t->next);
        t->keys = g.keys;
        t->segs = g.segs;
        t->filts = g.filts;
        t->next = g.next;
    }
    if (grow_slots) {
        free(t->slots);
        t->slots = slots;
        t->nslots *= 2;
        s = slot_of(t, key);
    }
    size_t r = t->n++;
    t->keys->data[r] = key;
    t->segs->data[r] = seg;
    t->filts->data[r] = filt;
    t->next[r] = NONE;
    if (s->rows) {
        t->next[s->last] = r;
        s->last = r;
        s->rows++;
    } else {
        s->key = key;
        s->first = s->last = r;
        s->rows = 1;
        t->nkeys++;
    }
    if (d->kf != NULL && d->kf_room > 0) {
        d->kf_room--;
        kf_set(d->kf, key);
    } else if (d->kf != NULL) {  /* full: rebuilt, for what is held then, when asked */
        dir_vec_unref(d->kf);
        d->kf = NULL;
    }
    d->version++;
    return DIR_OK;
}

void dir_set_filter(dir_t *d, uint64_t key, uint64_t seg, uint64_t filt, int *found) {
    dir_where w;
    dir_where_is(d, key, &w);
    *found = each_entry(d, &w, seg, SET_FILTER, filt) != 0;
    d->version += (uint64_t)*found;
}

/* A merge's new vecs and delta, allocated before anything changes. */
typedef struct {
    int rebuild;  /* new base vecs (else: nothing to fold) */
    dir_vec *keys, *segs, *filts;
    delta_t dl;   /* the new empty delta (when the delta has rows) */
    const uint64_t *rows;  /* the delta rows in stable key order */
} plan_t;

static int merge_prepare(dir_t *d, int will_drop, plan_t *p) {
    memset(p, 0, sizeof *p);
    size_t dn = d->dl.n;
    if (!will_drop && !d->base_dead && !dn) return DIR_OK;
    if (d->bn > MAX_ITEMS - dn) return DIR_NOMEM;
    dir_vec *order = NULL;
    if (dn && dir_order(d, &order) != DIR_OK) return DIR_NOMEM;
    if (vecs3_new(d->bn + dn, &p->keys, &p->segs, &p->filts) != DIR_OK) return DIR_NOMEM;
    if (dn && delta_new(&p->dl) != DIR_OK) {
        dir_vec_unref(p->keys);
        dir_vec_unref(p->segs);
        dir_vec_unref(p->filts);
        return DIR_NOMEM;
    }
    p->rows = order != NULL ? order->data : NULL;
    p->rebuild = 1;
    return DIR_OK;
}

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* The merge itself, once prepared: cannot fail. */
static void merge_commit(dir_t *d, plan_t *p) {
    d->version++;
    if (!p->rebuild) return;
    const uint64_t *bk = d->bkeys->data, *bs = d->bsegs->data, *bf = d->bfilts->data;
    const uint64_t *dk = d->dl.keys->data, *ds = d->dl.segs->data, *df = d->dl.filts->data;
    uint64_t *ok = p->keys->data, *os = p->segs->data, *of = p->filts->data;
    size_t i = 0, j = 0, w = 0, bn = d->bn, dn = d->dl.n;
    int skip_dead = d->base_dead;
    for (;;) {
        while (i < bn && skip_dead && bs[i] == DIR_DEAD) i++;
        while (j < dn && ds[p->rows[j]] == DIR_DEAD) j++;
        if (i == bn && j == dn) break;
        if (j == dn || (i < bn && bk[i] <= dk[p->rows[j]])) {
            ok[w] = bk[i];
            os[w] = bs[i];
            of[w++] = bf[i++];
        } else {
            size_t r = (size_t)p->rows[j++];
            ok[w] = dk[r];
            os[w] = ds[r];
            of[w++] = df[r];
        }
    }
    p->keys->len = p->segs->len = p->filts->len = w;
    dir_vec_unref(d->bkeys);
    dir_vec_unref(d->bsegs);
    dir_vec_unref(d->bfilts);
    d->bkeys = p->keys;
    d->bsegs = p->segs;
    d->bfilts = p->filts;
    d->bn = w;
    d->base_dead = 0;
    base_changed(d);
    if (dn) {
        delta_release(&d->dl);
        d->dl = p->dl;
        order_reset(d);
        d->merges++;
    }
}

/* A prepared merge, timed (the reference's merge()). */
static void merge_timed(dir_t *d, plan_t *p, double t0) {
    merge_commit(d, p);
    double took = now_s() - t0;
    d->ms_total += took;
    if (took > d->ms_max) d->ms_max = took;
}

int dir_merge(dir_t *d) {
    double t0 = now_s();
    plan_t p;
    if (merge_prepare(d, 0, &p) != DIR_OK) return DIR_NOMEM;
    merge_timed(d, &p, t0);
    return DIR_OK;
}

size_t dir_merge_work(const dir_t *d) { return d->bn + d->dl.n; }

int dir_drop(dir_t *d, uint64_t key, uint64_t seg, int *found) {
    dir_where w;
    dir_where_is(d, key, &w);
    int where = each_entry(d, &w, seg, FIND, 0);
    *found = where != 0;
    if (!where) return DIR_OK;
    double t0 = now_s();
    plan_t p;
    if (merge_prepare(d, 1, &p) != DIR_OK) return DIR_NOMEM;
    each_entry(d, &w, seg, KILL, 0);
    d->base_dead |= (where & IN_BASE) != 0;
    merge_timed(d, &p, t0);
    return DIR_OK;
}

int dir_load(dir_t *d, dir_vec *keys, dir_vec *segs, dir_vec *filts) {
    if (segs->len != keys->len || filts->len != keys->len) return DIR_EINVAL;
    double t0 = now_s();
    delta_t dl;
    if (delta_new(&dl) != DIR_OK) return DIR_NOMEM;
    dir_vec_ref(keys);
    dir_vec_ref(segs);
    dir_vec_ref(filts);
    dir_vec_unref(d->bkeys);
    dir_vec_unref(d->bsegs);
    dir_vec_unref(d->bfilts);
    d->bkeys = keys;
    d->bsegs = segs;
    d->bfilts = filts;
    d->bn = keys->len;
    d->base_dead = 0;
    base_changed(d);
    delta_release(&d->dl);
    d->dl = dl;
    order_reset(d);
    dir_vec_unref(d->kf);
    d->kf = NULL;
    plan_t p;
    merge_prepare(d, 0, &p);  /* nothing to fold: allocates nothing */
    merge_timed(d, &p, t0);
    return DIR_OK;
}

int dir_clear(dir_t *d) {
    dir_vec *k, *s, *f;
    if (vecs3_new(0, &k, &s, &f) != DIR_OK) return DIR_NOMEM;
    int rc = dir_load(d, k, s, f);
    dir_vec_unref(k);
    dir_vec_unref(s);
    dir_vec_unref(f);
    return rc;
}
