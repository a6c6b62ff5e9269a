/* The block map in plain C: the twin of sarpd/core/blockmap.py's BlockMap (no Python.h:
 * the Python type is sarpd/core/_cmap.c, and a native write core may own a map directly).
 *
 * Block id (lo, hi: two uint64) -> (head key: uint64, position: uint32) of recently
 * stored blocks, an approximate LRU in generations within a byte budget, with the
 * reference's observable behaviour: the same answers, the same entries evicted (the
 * same spill, in the same order), the same live entries in the same order
 * (bm_export), the same counters and the same byte accounting (young entries counted
 * at BM_YOUNG_ENTRY_BYTES, frozen ones at BM_FROZEN_ENTRY_BYTES, so that both evict
 * at the same moment). The layout is blockmap.c's top comment.
 *
 * Ids are arrays of n (lo, hi) pairs (2n uint64: an (n, 2) C-contiguous IdArray);
 * heads and positions are n-arrays. The functions are not thread-safe: a map is used
 * by one thread at a time (the Python type serialises its calls). Functions that
 * return int return BM_OK, or BM_NOMEM when an allocation failed (or the young
 * generation would outgrow its 32-bit index): the map is then still consistent (a
 * batch may be partly applied, as a Python exception midway would leave the
 * reference) and usable. */
#ifndef SARP_BLOCKMAP_H
#define SARP_BLOCKMAP_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define BM_YOUNG_ENTRY_BYTES 160u  /* blockmap.YOUNG_ENTRY_BYTES (the accounting) */
#define BM_FROZEN_ENTRY_BYTES 33u  /* blockmap.FROZEN_ENTRY_BYTES */
#define BM_MIX 0x9E3779B97F4A7C15ull  /* mix(lo, hi) = lo ^ hi * BM_MIX (mod 2**64) */
#define BM_MAX_GENERATION 65536u  /* block_map_generation's cap */

#define BM_OK 0
#define BM_NOMEM (-1)
#define BM_EINVAL (-2)  /* bm_set_generation(m, 0) */

typedef struct bm_map bm_map;  /* opaque */

/* Entries a call evicted (the spill: their locator records must be written), in the
 * reference's order. A call that may spill sets n (0: nothing, the reference's None)
 * and grows the arrays as needed; reuse one across calls, bm_spill_free at the end. */
typedef struct bm_spill {
    size_t n, cap;
    uint64_t *ids;    /* 2n: lo, hi */
    uint64_t *heads;  /* n */
    uint32_t *pos;    /* n */
} bm_spill;

#define BM_SPILL_INIT {0, 0, NULL, NULL, NULL}

/* BlockMap.stats() */
typedef struct bm_stats {
    uint64_t entries, bytes, budget_bytes, generations, hits, misses, spilled, discarded;
} bm_stats;

static inline uint64_t bm_mix(uint64_t lo, uint64_t hi) { return lo ^ (hi * BM_MIX); }

/* block_map_generation: the young generation's size for a budget, 1..65,536. */
uint64_t bm_generation_for(uint64_t budget_bytes);

/* A new empty map (generation >= 1), or NULL (generation 0, or no memory). */
bm_map *bm_new(uint64_t budget_bytes, uint64_t generation);
void bm_free(bm_map *m);  /* NULL: nothing */

size_t bm_len(const bm_map *m);        /* live entries (len(map)) */
size_t bm_young_len(const bm_map *m);  /* of which in the young generation */
size_t bm_generations(const bm_map *m);
uint64_t bm_nbytes(const bm_map *m);   /* the accounted bytes (BlockMap.nbytes) */
uint64_t bm_budget(const bm_map *m);
uint64_t bm_generation(const bm_map *m);
void bm_set_budget(bm_map *m, uint64_t budget_bytes);       /* from the next call on */
int bm_set_generation(bm_map *m, uint64_t generation);      /* 0: BM_EINVAL */
void bm_get_stats(const bm_map *m, bm_stats *out);

/* heads[i], pos[i] of ids[i]; pos -1 (head 0): not held. A hit in a frozen generation
 * moves to the young one (newest generation's entry first); hits and misses counted. */
int bm_lookup(bm_map *m, size_t n, const uint64_t *ids, uint64_t *heads, int64_t *pos);

/* bm_lookup's answers, the map unchanged but its counters (no hit moves: a removal's
 * lookup, whose blocks are leaving). */
int bm_peek(bm_map *m, size_t n, const uint64_t *ids, uint64_t *heads, int64_t *pos);

/* Hold these blocks (a later entry for a block wins) into the young generation,
 * freezing it whenever it reaches the generation size; then evict what the budget
 * cannot hold into *spill. */
int bm_add(bm_map *m, size_t n, const uint64_t *ids, const uint64_t *heads,
           const uint32_t *pos, bm_spill *spill);

/* BlockMap.add_bulk: the young generation frozen, then these entries frozen straight
 * into generations of `generation` entries each (oldest first); then the eviction. */
int bm_add_bulk(bm_map *m, size_t n, const uint64_t *ids, const uint64_t *heads,
                const uint32_t *pos, bm_spill *spill);

/* Forget these blocks (every copy held); returns how many entries were dropped. */
size_t bm_discard(bm_map *m, size_t n, const uint64_t *ids);

/* Drop every entry (the counters stay). */
void bm_clear(bm_map *m);

/* The live entries, oldest first (BlockMap.to_arrays): bm_len(m) rows written. */
size_t bm_export(const bm_map *m, uint64_t *ids, uint64_t *heads, uint32_t *pos);

/* BlockMap.load_arrays: bm_clear, then bm_add_bulk. */
int bm_load(bm_map *m, size_t n, const uint64_t *ids, const uint64_t *heads,
            const uint32_t *pos, bm_spill *spill);

void bm_spill_free(bm_spill *s);

#ifdef __cplusplus
}
#endif

#endif
