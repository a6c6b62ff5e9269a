/* The routing directory in plain C: the twin of sarpd/core/directory.py's Directory
 * (no Python.h: the Python type is sarpd/core/_cdir.c, and a native write core may own
 * a dir_t directly).
 *
 * Routing key -> posting list of (seg, filter) entries, with the reference's
 * observable behaviour: the same posting lists in the same order (the base slice of
 * the key, then its delta rows in insertion order), the same counts, probes, merges
 * (stable: a key's base entries, then its delta rows in insertion order; dead entries,
 * seg 0, dropped), the same version, merge count and flat arrays (dir_order: a stable
 * by-key order of the delta rows). The layout is directory.c's top comment.
 *
 * Arrays are `dir_vec`s: reference-counted uint64 arrays, either owned (allocated here)
 * or wrapping memory the caller lends (dir_vec_wrap: a snapshot's mapped body, taken
 * over without a copy; `release` is called at the last unref). The directory never
 * resizes or frees a vec it has handed out while someone else holds a reference to
 * it: it replaces a vec (delta growth, merge, load) and drops its own reference, so a
 * caller that took one (dir_vec_ref) may read it for as long as it holds it. Values
 * in a vec may still change in place where the reference's arrays would (set_filter
 * on the base or the delta, drop marking seg 0).
 *
 * Not thread-safe: one thread at a time (the Python type locks around every call);
 * refcounts are atomic, so a vec may be released from any thread. Functions that
 * return int return DIR_OK, or DIR_NOMEM when an allocation failed or a size would
 * overflow: the directory is then unchanged (every allocation precedes any change). */
#ifndef SARP_DIRECTORY_H
#define SARP_DIRECTORY_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

#ifdef __cplusplus
extern "C" {
#endif

#define DIR_OK 0
#define DIR_NOMEM (-1)
#define DIR_EINVAL (-2)  /* dir_load: vecs of different lengths */
#define DIR_DEAD 0u  /* seg id 0: a dead entry (never assigned) */

typedef struct dir_vec {
    size_t refs;     /* atomic: dir_vec_ref / dir_vec_unref */
    size_t len;      /* items visible (a delta vec: its capacity; rows in use: dir_delta) */
    size_t cap;      /* items allocated (owned vecs; wrapped: len) */
    uint64_t *data;
    void (*release)(void *ctx);  /* wrapped memory: called at the last unref, else NULL */
    void *ctx;
} dir_vec;

/* A new owned vec of `len` items (uninitialised), one reference; NULL: no memory. */
dir_vec *dir_vec_new(size_t len);
/* A vec over the caller's `data` (len items), one reference; release(ctx) at the last
 * unref (also when this call fails: NULL, no memory). */
dir_vec *dir_vec_wrap(uint64_t *data, size_t len, void (*release)(void *ctx), void *ctx);
void dir_vec_ref(dir_vec *v);
void dir_vec_unref(dir_vec *v);  /* NULL: nothing */

typedef struct dir_t dir_t;  /* opaque */

/* Where a key's posting list is: the base slice [lo, hi), then `rows` delta rows from
 * `first` (each next one by dir_next_row) in insertion order. */
typedef struct dir_where {
    size_t lo, hi, rows, first;
} dir_where;

/* Three parallel vecs and the rows in use (borrowed: dir_vec_ref to keep them). */
typedef struct dir_part {
    dir_vec *keys, *segs, *filts;
    size_t n;
} dir_part;

/* The key filter: a blocked Bloom filter over every key the directory holds (and
 * perhaps keys it held before: a superset), so that a reader skips the binary
 * searches of a key in neither part. One 64-bit word per key, four bits set in it
 * (dir_kf_bits); the word is the key hash's high half scaled to the number of words
 * (fewer than 2**32; about 12 bits a key). A word's bits are only ever set in place,
 * so a reader's vec stays a superset of what the directory held when it took it. */
static inline uint64_t dir_kf_hash(uint64_t key) {  /* splitmix64's finaliser */
    key ^= key >> 30;
    key *= 0xbf58476d1ce4e5b9ULL;
    key ^= key >> 27;
    key *= 0x94d049bb133111ebULL;
    return key ^ (key >> 31);
}

static inline uint64_t dir_kf_bits(uint64_t h) {
    return (1ULL << (h & 63)) | (1ULL << ((h >> 6) & 63)) | (1ULL << ((h >> 12) & 63))
           | (1ULL << ((h >> 18) & 63));
}

/* The word of hash `h` in a filter of `nwords` words (0 < nwords < 2**32). */
static inline size_t dir_kf_word(uint64_t h, size_t nwords) {
    return (size_t)(((h >> 32) * (uint64_t)nwords) >> 32);
}

/* Whether `key` may be in a filter of `nwords` words (0 < nwords < 2**32); a word is
 * read at any alignment (a filter handed in from Python may be unaligned). */
static inline int dir_kf_may_have(const uint64_t *words, size_t nwords, uint64_t key) {
    uint64_t h = dir_kf_hash(key), bits = dir_kf_bits(h), w;
    memcpy(&w, words + dir_kf_word(h, nwords), sizeof w);
    return (w & bits) == bits;
}

dir_t *dir_new(int64_t delta_max_entries);  /* NULL: no memory */
void dir_free(dir_t *d);                    /* NULL: nothing */

int64_t dir_delta_max(const dir_t *d);
void dir_set_delta_max(dir_t *d, int64_t delta_max_entries);
uint64_t dir_version(const dir_t *d);  /* bumped by every change a posting reader sees */
uint64_t dir_merges(const dir_t *d);   /* merges that folded a delta in */
double dir_merge_s_max(const dir_t *d);
double dir_merge_s_total(const dir_t *d);

/* -- reading ------------------------------------------------------------------------ */
void dir_where_is(dir_t *d, uint64_t key, dir_where *w);  /* may fill a range cache */
size_t dir_next_row(const dir_t *d, size_t row);
/* The posting list of `w` into segs, filts (w->hi - w->lo + w->rows items each). */
void dir_posting(const dir_t *d, const dir_where *w, uint64_t *segs, uint64_t *filts);
size_t dir_count(dir_t *d, uint64_t key);
int dir_has(dir_t *d, uint64_t key, uint64_t seg);
/* hit[i] = 1 if keys[i] is in the base or the delta, else 0. */
void dir_probe(const dir_t *d, size_t n, const uint64_t *keys, uint8_t *hit);

/* The key filter (borrowed: dir_vec_ref to keep it), built when the directory has
 * none (after a load, or once more keys were added than it was sized for); NULL when
 * out of memory (then any key may be there). */
dir_vec *dir_keyfilter(dir_t *d);
dir_vec *dir_keyfilter_now(const dir_t *d);  /* the filter as it is: NULL when none is built */
void dir_base(const dir_t *d, dir_part *out);   /* the sorted base */
void dir_delta(const dir_t *d, dir_part *out);  /* the delta, insertion order */
/* *order (borrowed, len = the delta's rows, int64 values): a stable argsort of the
 * delta's keys, kept across appends (the rows added since are sorted and merged in). */
int dir_order(dir_t *d, dir_vec **order);
/* The order as dir_order last computed it, if it is still the delta's (else NULL). */
dir_vec *dir_order_now(const dir_t *d);

size_t dir_entries(dir_t *d);     /* live base entries (seg != 0) + delta rows */
size_t dir_keys_count(dir_t *d);  /* distinct live base keys + distinct delta keys */
size_t dir_nbytes(const dir_t *d);  /* the memory held (vecs, tables, caches) */
int dir_needs_merge(const dir_t *d);

/* -- writing ------------------------------------------------------------------------ */
int dir_add(dir_t *d, uint64_t key, uint64_t seg, uint64_t filt);
/* Set the filter of every (key, seg) entry; *found: whether there was one. */
void dir_set_filter(dir_t *d, uint64_t key, uint64_t seg, uint64_t filt, int *found);
/* Mark every (key, seg) entry dead and merge; *found: whether there was one (if not,
 * nothing changes). */
int dir_drop(dir_t *d, uint64_t key, uint64_t seg, int *found);
/* Fold the delta into a new base, dead entries dropped; timed; version + 1. */
int dir_merge(dir_t *d);
/* Make (keys, segs, filts) (n items each, keys sorted) the base: the directory takes a
 * reference to each (on success only), empties the delta and merges. */
int dir_load(dir_t *d, dir_vec *keys, dir_vec *segs, dir_vec *filts);
int dir_clear(dir_t *d);  /* dir_load of an empty base */
/* An upper bound of the entries a merge would read now (for a caller that lets other
 * threads run during long calls). */
size_t dir_merge_work(const dir_t *d);

#ifdef __cplusplus
}
#endif

#endif
