/* The block map in plain C (blockmap.h): the twin of sarpd/core/blockmap.py's BlockMap,
 * whose module docstring says what the map is for; this comment says how it is laid
 * out, and where it follows the reference step by step so that both give the same
 * answers, evict the same entries at the same moment and list the same entries.
 *
 * Young generation (`young_t`): an insertion-ordered open-addressing hash table, as
 * CPython's compact dict is: the entries in insertion order in parallel arrays (ids as
 * lo, hi pairs; heads; positions; a dead flag), and an index table of 32-bit entry
 * numbers (a power of two slots, linear probing from a mix of the id; EMPTY, DUMMY:
 * a deleted entry's slot, reused by a later insert). An assignment to a held id
 * updates its entry in place (a dict keeps the key's place); a new id is appended
 * (a hit refreshed from a frozen generation goes to the end, as a dict re-insert does);
 * a deletion leaves a dead entry and a DUMMY slot; when the entry arrays are full
 * the table is rebuilt without the dead ones, with room for half as many again. At
 * most two thirds of the slots are used, so a probe always ends on an EMPTY one.
 * Memory: 29 bytes an entry plus 4 bytes a slot (~35 B for each entry it has room
 * for, ~40-70 B a live one): far less than the YOUNG_ENTRY_BYTES (160) the map
 * *accounts* a young entry at, which is the Python dict's measured cost; the
 * accounting is kept so that this map and the reference evict at the same moment.
 *
 * Frozen generations (`gen_t`, oldest first in `gens`): one allocation each, entries
 * sorted by mix = lo ^ hi * 0x9E3779B97F4A7C15 (unique within a generation), as
 * arrays: key (each row's mix and hi side by side: the hi a search compares is on the
 * cache line of the mix it found), head, filter, pos (u32), alive (a byte), and a
 * bucket index: for the top `bits` bits of a mix (a power of two buckets, at most a
 * quarter as many as entries), the first row with that prefix; lo is mix ^ hi * C, so
 * it is not stored. Found by a binary search on mix within its bucket (ids are hashes:
 * a few rows, one or two cache lines, instead of ~16 dependent loads over the whole
 * generation; skewed mixes only widen the range), then hi. `live` counts the alive
 * entries; an emptied generation stays in the list (and in the bytes and the
 * `generations` count) until the reference would drop it: at the next eviction check
 * or frozen lookup. Freezing sorts (mix, index) pairs with a stable LSD radix sort; of
 * entries with one mix the last is kept, and the others with another id than the kept
 * one go to the young generation, in mix order (_append's collision rule: 2**-64 a pair
 * by chance).
 *
 * The filter of a generation, built with it: a Bloom filter blocked by word over its
 * mixes, a 64-bit word for each FILTER_ENTRIES (4) entries (16 bits an entry); an
 * entry sets FILTER_K (5) bits in one word, word and bits from a hash of its mix (~0.4 %
 * false positives; a dead row's bits stay, the search finds it dead). Lookups and
 * discards take their batch through each generation's filter first (one word an id,
 * branch-free, so the batch's loads overlap) and search only the ids it lets through:
 * an id costs a filter word per generation and one search where it is held, not a
 * search per generation (most ids asked are in one generation or none). A discard still
 * tries every generation, as the reference drops every copy held.
 *
 * Memory of a frozen entry: key 16, head 8, filter 2, pos 4, alive 1 and at most 1 of
 * bucket index: at most 32 bytes (plus a hundred or so a generation), within the 33 the
 * map accounts (BM_FROZEN_ENTRY_BYTES, the reference's FROZEN_ENTRY_BYTES, unchanged).
 *
 * Every step allocates before it changes anything (a gen, a spill, room in the young
 * table), so a failed allocation (BM_NOMEM) leaves the map consistent. */
#include "blockmap.h"

#include <stdlib.h>
#include <string.h>

#define NONE SIZE_MAX
#define SLOT_EMPTY UINT32_MAX
#define SLOT_DUMMY (UINT32_MAX - 1u)
#define MIN_SLOTS ((size_t)8)
#define MAX_SLOTS ((size_t)1 << 31)  /* entry numbers stay below SLOT_DUMMY */
#define YOUNG_ENTRY_MEM (2 * sizeof(uint64_t) + sizeof(uint64_t) + sizeof(uint32_t) + 1)
#define GEN_ENTRY_MEM (3 * sizeof(uint64_t) + sizeof(uint32_t) + 1)  /* key, head, pos, alive */
#define MAX_BUCKET_BITS 30
#define FILTER_ENTRIES 4    /* a filter word (64 bits) for every 4 entries: 16 bits one */
#define FILTER_ENTRY_MEM 2  /* 64 / 8 / FILTER_ENTRIES: its bytes an entry */
#define FILTER_K 5          /* bits set in the word by an entry */
#define DISCARD_CHUNK 256   /* ids a discard takes through the generations at a time */

/* -- the young generation --------------------------------------------------------- */

typedef struct {
    unsigned char *mem;  /* one allocation: ids | heads | slots | pos | dead */
    uint64_t *ids;       /* 2 * cap: lo, hi, in insertion order (dead ones too) */
    uint64_t *heads;     /* cap */
    uint32_t *slots;     /* nslots: SLOT_EMPTY, SLOT_DUMMY or an entry number */
    uint32_t *pos;       /* cap */
    uint8_t *dead;       /* cap */
    size_t used;         /* entries written, dead ones included */
    size_t live;
    size_t cap;          /* usable(nslots) */
    size_t nslots;       /* 0 or a power of two */
} young_t;

static size_t usable(size_t nslots) { return nslots - nslots / 3; }

static inline size_t young_hash(uint64_t lo, uint64_t hi) {
    uint64_t h = bm_mix(lo, hi);
    h ^= h >> 33;
    h *= 0xFF51AFD7ED558CCDull;
    h ^= h >> 33;
    return (size_t)h;
}

/* The entry holding (lo, hi), or NONE; *slot: its slot, else where to insert it. */
static size_t young_probe(const young_t *y, uint64_t lo, uint64_t hi, size_t *slot) {
    *slot = NONE;
    if (!y->nslots) return NONE;
    size_t mask = y->nslots - 1, i = young_hash(lo, hi) & mask, avail = NONE;
    for (;;) {
        uint32_t s = y->slots[i];
        if (s == SLOT_EMPTY) {
            *slot = avail != NONE ? avail : i;
            return NONE;
        }
        if (s == SLOT_DUMMY) {
            if (avail == NONE) avail = i;
        } else if (y->ids[2 * (size_t)s] == lo && y->ids[2 * (size_t)s + 1] == hi) {
            *slot = i;
            return s;
        }
        i = (i + 1) & mask;
    }
}

static void slot_place(young_t *y, size_t e) {
    size_t mask = y->nslots - 1, i = young_hash(y->ids[2 * e], y->ids[2 * e + 1]) & mask;
    while (y->slots[i] != SLOT_EMPTY) i = (i + 1) & mask;
    y->slots[i] = (uint32_t)e;
}

/* The index table rebuilt from the entries (no dead ones). */
static void young_reindex(young_t *y) {
    memset(y->slots, 0xFF, y->nslots * sizeof(uint32_t));
    for (size_t e = 0; e < y->used; e++) slot_place(y, e);
}

/* A table with room for `need` live entries and half as many again, the live ones
 * copied in order; the old one is kept when the allocation fails. */
static int young_resize(young_t *y, size_t need) {
    if (need > usable(MAX_SLOTS)) return BM_NOMEM;
    size_t want = need + need / 2 + MIN_SLOTS, nslots = MIN_SLOTS;
    while (usable(nslots) < want && nslots < MAX_SLOTS) nslots <<= 1;
    size_t cap = usable(nslots);
    if (cap < need) return BM_NOMEM;
    /* cap < 2**31 and nslots <= 2**31: the sizes below fit a 64-bit size_t; on a
     * 32-bit one, check */
    if (cap > (SIZE_MAX - nslots * sizeof(uint32_t)) / YOUNG_ENTRY_MEM) return BM_NOMEM;
    unsigned char *mem = malloc(cap * YOUNG_ENTRY_MEM + nslots * sizeof(uint32_t));
    if (mem == NULL) return BM_NOMEM;
    young_t t;
    t.mem = mem;
    t.ids = (uint64_t *)mem;
    t.heads = t.ids + 2 * cap;
    t.slots = (uint32_t *)(t.heads + cap);
    t.pos = t.slots + nslots;
    t.dead = (uint8_t *)(t.pos + cap);
    t.cap = cap;
    t.nslots = nslots;
    t.used = 0;
    for (size_t e = 0; e < y->used; e++) {
        if (y->dead[e]) continue;
        t.ids[2 * t.used] = y->ids[2 * e];
        t.ids[2 * t.used + 1] = y->ids[2 * e + 1];
        t.heads[t.used] = y->heads[e];
        t.pos[t.used] = y->pos[e];
        t.dead[t.used] = 0;
        t.used++;
    }
    t.live = t.used;
    young_reindex(&t);
    free(y->mem);
    *y = t;
    return BM_OK;
}

/* Room for `k` more new ids without a rebuild. */
static int young_reserve(young_t *y, size_t k) {
    if (y->cap - y->used >= k) return BM_OK;
    if (k > SIZE_MAX - y->live) return BM_NOMEM;
    return young_resize(y, y->live + k);
}

/* young[(lo, hi)] = (head, pos), where the id is held or there is room (reserved). */
static void young_put(young_t *y, uint64_t lo, uint64_t hi, uint64_t head, uint32_t pos) {
    size_t slot, e = young_probe(y, lo, hi, &slot);
    if (e == NONE) {
        e = y->used++;
        y->ids[2 * e] = lo;
        y->ids[2 * e + 1] = hi;
        y->dead[e] = 0;
        y->slots[slot] = (uint32_t)e;
        y->live++;
    }
    y->heads[e] = head;
    y->pos[e] = pos;
}

/* young[(lo, hi)] = (head, pos), growing the table if need be. */
static int young_set(young_t *y, uint64_t lo, uint64_t hi, uint64_t head, uint32_t pos) {
    if (y->used == y->cap) {
        size_t slot;
        if (young_probe(y, lo, hi, &slot) == NONE) {
            int rc = young_resize(y, y->live + 1);
            if (rc != BM_OK) return rc;
        }
    }
    young_put(y, lo, hi, head, pos);
    return BM_OK;
}

static size_t young_find(const young_t *y, uint64_t lo, uint64_t hi) {
    size_t slot;
    return young_probe(y, lo, hi, &slot);
}

/* young.pop((lo, hi), None) is not None */
static int young_pop(young_t *y, uint64_t lo, uint64_t hi) {
    size_t slot, e = young_probe(y, lo, hi, &slot);
    if (e == NONE) return 0;
    y->dead[e] = 1;
    y->slots[slot] = SLOT_DUMMY;
    y->live--;
    return 1;
}

/* Empty, keeping its memory (a young generation refills to the same size). */
static void young_clear(young_t *y) {
    if (y->nslots) memset(y->slots, 0xFF, y->nslots * sizeof(uint32_t));
    y->used = y->live = 0;
}

/* The dead entries dropped in place (the live ones keep their order). */
static void young_compact(young_t *y) {
    if (y->used == y->live) return;
    size_t w = 0;
    for (size_t e = 0; e < y->used; e++) {
        if (y->dead[e]) continue;
        y->ids[2 * w] = y->ids[2 * e];
        y->ids[2 * w + 1] = y->ids[2 * e + 1];
        y->heads[w] = y->heads[e];
        y->pos[w] = y->pos[e];
        y->dead[w] = 0;
        w++;
    }
    y->used = w;
    young_reindex(y);
}

static void young_release(young_t *y) {
    free(y->mem);
    memset(y, 0, sizeof *y);
}

/* -- frozen generations ----------------------------------------------------------- */

typedef struct {
    size_t n;          /* entries (distinct mixes) */
    size_t live;       /* of which alive */
    unsigned bits;     /* bucket index bits (0: none, one range) */
    uint32_t nwords;   /* filter words (0: no filter, every id may be held) */
    uint64_t *key;     /* 2n: each row's mix and hi, side by side; mixes ascending */
    uint64_t *head;
    uint64_t *filter;  /* nwords */
    uint32_t *pos;
    uint32_t *bucket;  /* 2**bits + 1: bucket b's rows are [bucket[b], bucket[b + 1]) */
    uint8_t *alive;
} gen_t;

static gen_t *gen_new(size_t n) {
    unsigned bits = 0;
    if (n <= UINT32_MAX)
        while (bits < MAX_BUCKET_BITS && ((size_t)4 << bits) <= n) bits++;
    size_t nb = ((size_t)1 << bits) + 1;
    size_t nwords = n / FILTER_ENTRIES + 1;
    if (nwords > UINT32_MAX) nwords = 0;  /* filter_word's multiply takes 32 bits */
    size_t fixed = sizeof(gen_t) + sizeof(uint64_t) + nb * sizeof(uint32_t);
    if (n > (SIZE_MAX - fixed) / (GEN_ENTRY_MEM + FILTER_ENTRY_MEM)) return NULL;
    /* sizeof(gen_t) is 8-aligned: the u64 arrays first, then u32, then bytes */
    gen_t *g = malloc(sizeof(gen_t) + n * GEN_ENTRY_MEM + nwords * sizeof(uint64_t) +
                      nb * sizeof(uint32_t));
    if (g == NULL) return NULL;
    g->n = g->live = n;
    g->bits = bits;
    g->nwords = (uint32_t)nwords;
    g->key = (uint64_t *)(void *)(g + 1);
    g->head = g->key + 2 * n;
    g->filter = g->head + n;
    g->pos = (uint32_t *)(void *)(g->filter + nwords);
    g->bucket = g->pos + n;
    g->alive = (uint8_t *)(g->bucket + nb);
    return g;
}

static inline uint64_t gen_mix(const gen_t *g, size_t r) { return g->key[2 * r]; }
static inline uint64_t gen_hi(const gen_t *g, size_t r) { return g->key[2 * r + 1]; }

static inline size_t bucket_of(const gen_t *g, uint64_t mix) {
    return g->bits ? (size_t)(mix >> (64 - g->bits)) : 0;
}

/* The bucket index of a generation whose mixes are in place. */
static void gen_index(gen_t *g) {
    size_t nb = (size_t)1 << g->bits, r = 0;
    for (size_t b = 0; b < nb; b++) {
        while (r < g->n && bucket_of(g, gen_mix(g, r)) < b) r++;
        g->bucket[b] = (uint32_t)r;
    }
    g->bucket[nb] = (uint32_t)g->n;
}

/* -- the filter: a Bloom filter blocked by word, over a generation's mixes ----------- */

/* The filter's hash of a mix (murmur3's finalizer: every bit of the mix in every bit;
 * an id's, computed once for all the generations it is looked for in). */
static inline uint64_t filter_hash(uint64_t mix) {
    mix ^= mix >> 33;
    mix *= 0xFF51AFD7ED558CCDull;
    mix ^= mix >> 33;
    mix *= 0xC4CEB9FE1A85EC53ull;
    return mix ^ (mix >> 33);
}

/* The word of hash h: its high 32 bits scaled to [0, nwords) (a multiply, no modulo). */
static inline size_t filter_word(const gen_t *g, uint64_t h) {
    return (size_t)(((h >> 32) * g->nwords) >> 32);
}

/* Its FILTER_K bits in that word: 6 bits of the low half each. */
static inline uint64_t filter_mask(uint64_t h) {
    uint64_t m = 0;
    for (int i = 0; i < FILTER_K; i++) m |= (uint64_t)1 << ((h >> (6 * i)) & 63);
    return m;
}

/* The filter of a generation whose mixes are in place. */
static void filter_build(gen_t *g) {
    memset(g->filter, 0, (size_t)g->nwords * sizeof(uint64_t));
    if (!g->nwords) return;
    for (size_t r = 0; r < g->n; r++) {
        uint64_t h = filter_hash(gen_mix(g, r));
        g->filter[filter_word(g, h)] |= filter_mask(h);
    }
}

static inline uint64_t gen_lo(const gen_t *g, size_t r) { return gen_mix(g, r) ^ (gen_hi(g, r) * BM_MIX); }

/* The row of (mix, hi) (alive or not), or NONE: in mix's bucket, a branch-free binary
 * search for the last mix <= the query's (whose hi is beside it). */
static inline size_t gen_find(const gen_t *g, uint64_t mix, uint64_t hi) {
    size_t first = 0, n = g->n;
    if (g->bits) {
        size_t k = bucket_of(g, mix);
        first = g->bucket[k];
        n = g->bucket[k + 1] - first;
    }
    if (!n) return NONE;
    const uint64_t *b = g->key + 2 * first;
    while (n > 1) {
        size_t half = n / 2;
        b = b[2 * half] <= mix ? b + 2 * half : b;
        n -= half;
    }
    return b[0] == mix && b[1] == hi ? (size_t)(b - g->key) / 2 : NONE;
}

/* Queries for the frozen generations, k of them: each one's mix, hi and filter hash;
 * a search's results in cand (which queries passed the filter) and rows (their rows). */
typedef struct {
    uint64_t *mix, *hi, *hash, *mask;
    size_t *cand, *rows;
} probe_t;

/* Query t of p set to (lo, hi). */
static inline void probe_set(probe_t *p, size_t t, uint64_t lo, uint64_t hi) {
    p->mix[t] = bm_mix(lo, hi);
    p->hi[t] = hi;
    p->hash[t] = filter_hash(p->mix[t]);
    p->mask[t] = filter_mask(p->hash[t]);
}

/* g searched for p's first k queries: the ones its filter lets through go to p->cand
 * (in order; the others g provably does not hold), their rows (alive or not) or NONE
 * to p->rows; returns how many passed. The filter pass is branch-free, so that the
 * cache misses of many queries overlap. */
static size_t gen_search(const gen_t *g, size_t k, const probe_t *p) {
    size_t nc = 0, *cand = p->cand;
    for (size_t t = 0; t < k; t++) {
        uint64_t m = p->mask[t];
        cand[nc] = t;
        nc += !g->nwords || (g->filter[filter_word(g, p->hash[t])] & m) == m;
    }
    for (size_t c = 0; c < nc; c++) p->rows[c] = gen_find(g, p->mix[cand[c]], p->hi[cand[c]]);
    return nc;
}

typedef struct {
    uint64_t key;
    size_t idx;
} pair_t;

/* Stable sort by key: insertion sort when short, else LSD radix, a byte a pass (the
 * passes whose byte is the same in every key skipped). tmp: n more pairs. */
static void sort_pairs(pair_t *a, pair_t *tmp, size_t n) {
    if (n < 32) {
        for (size_t i = 1; i < n; i++) {
            pair_t x = a[i];
            size_t j = i;
            for (; j > 0 && a[j - 1].key > x.key; j--) a[j] = a[j - 1];
            a[j] = x;
        }
        return;
    }
    static const int DIGITS = 8;
    size_t count[8][256];
    memset(count, 0, sizeof count);
    for (size_t i = 0; i < n; i++)
        for (int d = 0; d < DIGITS; d++) count[d][(a[i].key >> (8 * d)) & 0xFF]++;
    pair_t *src = a, *dst = tmp;
    for (int d = 0; d < DIGITS; d++) {
        size_t *c = count[d];
        if (c[(a[0].key >> (8 * d)) & 0xFF] == n) continue;
        size_t at = 0;
        for (int b = 0; b < 256; b++) {
            size_t k = c[b];
            c[b] = at;
            at += k;
        }
        for (size_t i = 0; i < n; i++) dst[c[(src[i].key >> (8 * d)) & 0xFF]++] = src[i];
        pair_t *t = src;
        src = dst;
        dst = t;
    }
    if (src != a) memcpy(a, src, n * sizeof *a);
}

static int spill_reserve(bm_spill *s, size_t n) {
    if (n <= s->cap) return BM_OK;
    if (n > SIZE_MAX / (2 * sizeof(uint64_t))) return BM_NOMEM;
    uint64_t *ids = malloc(n * 2 * sizeof(uint64_t));
    uint64_t *heads = malloc(n * sizeof(uint64_t));
    uint32_t *pos = malloc(n * sizeof(uint32_t));
    if (ids == NULL || heads == NULL || pos == NULL) {
        free(ids);
        free(heads);
        free(pos);
        return BM_NOMEM;
    }
    bm_spill_free(s);  /* n was reset by the caller: nothing to keep */
    s->ids = ids;
    s->heads = heads;
    s->pos = pos;
    s->cap = n;
    return BM_OK;
}

void bm_spill_free(bm_spill *s) {
    free(s->ids);
    free(s->heads);
    free(s->pos);
    s->ids = s->heads = NULL;
    s->pos = NULL;
    s->n = s->cap = 0;
}

static void spill_push(bm_spill *s, uint64_t lo, uint64_t hi, uint64_t head, uint32_t pos) {
    s->ids[2 * s->n] = lo;
    s->ids[2 * s->n + 1] = hi;
    s->heads[s->n] = head;
    s->pos[s->n] = pos;
    s->n++;
}

/* _append's first half: n >= 1 entries (oldest first) -> a new generation, sorted by
 * mix, the last of each mix kept; *coll (emptied first): the others with another id
 * than the kept one, in mix order, for the young generation. Changes no map. */
static int build_gen(size_t n, const uint64_t *ids, const uint64_t *heads, const uint32_t *pos,
                     gen_t **out, bm_spill *coll) {
    coll->n = 0;
    if (n > SIZE_MAX / (2 * sizeof(pair_t))) return BM_NOMEM;
    pair_t *pairs = malloc(2 * n * sizeof(pair_t));
    if (pairs == NULL) return BM_NOMEM;
    for (size_t i = 0; i < n; i++) {
        pairs[i].key = bm_mix(ids[2 * i], ids[2 * i + 1]);
        pairs[i].idx = i;
    }
    sort_pairs(pairs, pairs + n, n);
    size_t groups = 0, others = 0;
    for (size_t i = 0, j; i < n; i = j + 1) {
        for (j = i; j + 1 < n && pairs[j + 1].key == pairs[i].key; j++) {}
        groups++;
        uint64_t last_hi = ids[2 * pairs[j].idx + 1];
        for (size_t k = i; k < j; k++) others += ids[2 * pairs[k].idx + 1] != last_hi;
    }
    gen_t *g = gen_new(groups);
    if (g == NULL || spill_reserve(coll, others) != BM_OK) {
        free(g);
        free(pairs);
        return BM_NOMEM;
    }
    size_t row = 0;
    for (size_t i = 0, j; i < n; i = j + 1) {
        for (j = i; j + 1 < n && pairs[j + 1].key == pairs[i].key; j++) {}
        size_t last = pairs[j].idx;
        for (size_t k = i; k < j; k++) {  /* same mix: same hi means same lo */
            size_t e = pairs[k].idx;
            if (ids[2 * e + 1] != ids[2 * last + 1])
                spill_push(coll, ids[2 * e], ids[2 * e + 1], heads[e], pos[e]);
        }
        g->key[2 * row] = pairs[i].key;
        g->key[2 * row + 1] = ids[2 * last + 1];
        g->head[row] = heads[last];
        g->pos[row] = pos[last];
        g->alive[row] = 1;
        row++;
    }
    gen_index(g);
    filter_build(g);
    free(pairs);
    *out = g;
    return BM_OK;
}

/* -- the map ------------------------------------------------------------------------ */

struct bm_map {
    uint64_t budget;
    uint64_t generation;
    young_t young;
    gen_t **gens;  /* oldest first */
    size_t ngens, gens_cap;
    size_t frozen_live;     /* sum of gens' live */
    uint64_t frozen_bytes;  /* sum of gens' n * BM_FROZEN_ENTRY_BYTES */
    uint64_t hits, misses, spilled, discarded;
};

uint64_t bm_generation_for(uint64_t budget_bytes) {
    uint64_t g = budget_bytes / (4 * (uint64_t)BM_YOUNG_ENTRY_BYTES);
    return g < 1 ? 1 : g > BM_MAX_GENERATION ? BM_MAX_GENERATION : g;
}

bm_map *bm_new(uint64_t budget_bytes, uint64_t generation) {
    if (generation < 1) return NULL;
    bm_map *m = calloc(1, sizeof *m);
    if (m == NULL) return NULL;
    m->budget = budget_bytes;
    m->generation = generation;
    return m;
}

static void gens_free_all(bm_map *m) {
    for (size_t i = 0; i < m->ngens; i++) free(m->gens[i]);
    m->ngens = 0;
    m->frozen_live = 0;
    m->frozen_bytes = 0;
}

void bm_free(bm_map *m) {
    if (m == NULL) return;
    gens_free_all(m);
    free(m->gens);
    young_release(&m->young);
    free(m);
}

size_t bm_len(const bm_map *m) { return m->young.live + m->frozen_live; }
size_t bm_young_len(const bm_map *m) { return m->young.live; }
size_t bm_generations(const bm_map *m) { return m->ngens; }
uint64_t bm_budget(const bm_map *m) { return m->budget; }
uint64_t bm_generation(const bm_map *m) { return m->generation; }
void bm_set_budget(bm_map *m, uint64_t budget_bytes) { m->budget = budget_bytes; }

int bm_set_generation(bm_map *m, uint64_t generation) {
    if (generation < 1) return BM_EINVAL;
    m->generation = generation;
    return BM_OK;
}

uint64_t bm_nbytes(const bm_map *m) {
    return (uint64_t)m->young.live * BM_YOUNG_ENTRY_BYTES + m->frozen_bytes;
}

void bm_get_stats(const bm_map *m, bm_stats *out) {
    out->entries = bm_len(m);
    out->bytes = bm_nbytes(m);
    out->budget_bytes = m->budget;
    out->generations = m->ngens;
    out->hits = m->hits;
    out->misses = m->misses;
    out->spilled = m->spilled;
    out->discarded = m->discarded;
}

static int gens_reserve(bm_map *m, size_t k) {
    if (m->gens_cap - m->ngens >= k) return BM_OK;
    size_t cap = m->gens_cap ? m->gens_cap : 8;
    while (cap - m->ngens < k) {
        if (cap > SIZE_MAX / 2 / sizeof(gen_t *)) return BM_NOMEM;
        cap *= 2;
    }
    gen_t **gens = realloc(m->gens, cap * sizeof *gens);
    if (gens == NULL) return BM_NOMEM;
    m->gens = gens;
    m->gens_cap = cap;
    return BM_OK;
}

static void gens_push(bm_map *m, gen_t *g) {  /* room reserved */
    m->gens[m->ngens++] = g;
    m->frozen_live += g->live;
    m->frozen_bytes += (uint64_t)g->n * BM_FROZEN_ENTRY_BYTES;
}

/* self.gens = [g for g in self.gens if g.live] */
static void gens_filter(bm_map *m) {
    size_t w = 0;
    for (size_t i = 0; i < m->ngens; i++) {
        gen_t *g = m->gens[i];
        if (g->live) {
            m->gens[w++] = g;
        } else {
            m->frozen_bytes -= (uint64_t)g->n * BM_FROZEN_ENTRY_BYTES;
            free(g);
        }
    }
    m->ngens = w;
}

/* _freeze: the young generation -> the newest frozen one (its colliders young again). */
static int freeze(bm_map *m) {
    young_t *y = &m->young;
    if (!y->live) return BM_OK;
    young_compact(y);
    gen_t *g;
    bm_spill coll = BM_SPILL_INIT;
    int rc = build_gen(y->live, y->ids, y->heads, y->pos, &g, &coll);
    if (rc != BM_OK) return rc;
    if (gens_reserve(m, 1) != BM_OK) {
        free(g);
        bm_spill_free(&coll);
        return BM_NOMEM;
    }
    young_clear(y);  /* keeps room for more entries than there are colliders */
    for (size_t i = 0; i < coll.n; i++)
        young_put(y, coll.ids[2 * i], coll.ids[2 * i + 1], coll.heads[i], coll.pos[i]);
    gens_push(m, g);
    bm_spill_free(&coll);
    return BM_OK;
}

/* _append of caller entries (add_bulk's chunks). */
static int append(bm_map *m, size_t n, const uint64_t *ids, const uint64_t *heads,
                  const uint32_t *pos) {
    gen_t *g;
    bm_spill coll = BM_SPILL_INIT;
    int rc = build_gen(n, ids, heads, pos, &g, &coll);
    if (rc != BM_OK) return rc;
    if (gens_reserve(m, 1) != BM_OK || young_reserve(&m->young, coll.n) != BM_OK) {
        free(g);
        bm_spill_free(&coll);
        return BM_NOMEM;
    }
    for (size_t i = 0; i < coll.n; i++)
        young_put(&m->young, coll.ids[2 * i], coll.ids[2 * i + 1], coll.heads[i], coll.pos[i]);
    gens_push(m, g);
    bm_spill_free(&coll);
    return BM_OK;
}

/* _evict: the oldest generations dropped while over budget; their alive entries that
 * no young entry shadows go to *spill (oldest generation first, each in mix order). */
static int evict(bm_map *m, bm_spill *spill) {
    spill->n = 0;
    gens_filter(m);
    if (bm_nbytes(m) <= m->budget) return BM_OK;
    if (!m->ngens) {  /* all young: freeze first, so that something can go */
        int rc = freeze(m);
        if (rc != BM_OK) return rc;
    }
    uint64_t nb = bm_nbytes(m);
    size_t k = 0, most = 0;
    for (; k < m->ngens && nb > m->budget; k++) {
        nb -= (uint64_t)m->gens[k]->n * BM_FROZEN_ENTRY_BYTES;
        most += m->gens[k]->live;
    }
    if (!k) return BM_OK;
    if (spill_reserve(spill, most) != BM_OK) return BM_NOMEM;
    const young_t *y = &m->young;
    for (size_t j = 0; j < k; j++) {
        const gen_t *g = m->gens[j];
        for (size_t r = 0; r < g->n; r++) {
            if (!g->alive[r]) continue;
            uint64_t lo = gen_lo(g, r), hi = gen_hi(g, r);
            if (y->live && young_find(y, lo, hi) != NONE) continue;  /* shadowed */
            spill_push(spill, lo, hi, g->head[r], g->pos[r]);
        }
    }
    for (size_t j = 0; j < k; j++) {
        m->frozen_live -= m->gens[j]->live;
        m->frozen_bytes -= (uint64_t)m->gens[j]->n * BM_FROZEN_ENTRY_BYTES;
        free(m->gens[j]);
    }
    memmove(m->gens, m->gens + k, (m->ngens - k) * sizeof *m->gens);
    m->ngens -= k;
    m->spilled += spill->n;
    return BM_OK;
}

/* The queries of todo (and p's) that are not NONE, in order; returns how many. */
static size_t todo_compact(size_t *todo, probe_t *p, size_t ntodo) {
    size_t keep = 0;
    for (size_t t = 0; t < ntodo; t++) {
        if (todo[t] == NONE) continue;
        todo[keep] = todo[t];
        p->mix[keep] = p->mix[t];
        p->hi[keep] = p->hi[t];
        p->hash[keep] = p->hash[t];
        p->mask[keep++] = p->mask[t];
    }
    return keep;
}

/* _lookup_frozen for the queries young missed (pos -1): newest generation first, each
 * query answered by the first generation holding it alive (searched where the filter
 * lets it through); with `refresh`, the hits then move to the young generation in that
 * order (by generation, then query): an id asked twice is answered twice and moved
 * once. */
static int lookup_frozen(bm_map *m, size_t n, const uint64_t *ids, uint64_t *heads,
                         int64_t *pos, size_t nrest, int refresh) {
    size_t each = 4 * sizeof(uint64_t) + 6 * sizeof(size_t);
    if (nrest > SIZE_MAX / each) return BM_NOMEM;
    uint64_t *mem = malloc(nrest * each);
    if (mem == NULL) return BM_NOMEM;
    probe_t p = {mem, mem + nrest, mem + 2 * nrest, mem + 3 * nrest,
                 (size_t *)(void *)(mem + 4 * nrest), NULL};
    p.rows = p.cand + nrest;
    size_t *todo = p.rows + nrest, *hit_q = todo + nrest, *hit_g = hit_q + nrest;
    size_t *hit_r = hit_g + nrest, ntodo = 0, nhit = 0;
    for (size_t i = 0; i < n; i++) {
        if (pos[i] >= 0) continue;
        probe_set(&p, ntodo, ids[2 * i], ids[2 * i + 1]);
        todo[ntodo++] = i;
    }
    for (size_t gi = m->ngens; gi-- > 0 && ntodo;) {
        const gen_t *g = m->gens[gi];
        if (!g->live) continue;
        size_t nc = gen_search(g, ntodo, &p), found = 0;
        for (size_t c = 0; c < nc; c++) {
            size_t t = p.cand[c], q = todo[t], r = p.rows[c];
            if (r == NONE || !g->alive[r]) continue;
            heads[q] = g->head[r];
            pos[q] = (int64_t)g->pos[r];
            todo[t] = NONE;
            found++;
            if (!refresh) continue;
            hit_q[nhit] = q;
            hit_g[nhit] = gi;
            hit_r[nhit] = r;
            nhit++;
        }
        if (found) ntodo = todo_compact(todo, &p, ntodo);
    }
    if (!refresh) {
        free(mem);
        return BM_OK;
    }
    young_t *y = &m->young;
    if (young_reserve(y, nhit) != BM_OK) {
        free(mem);
        return BM_NOMEM;
    }
    for (size_t h = 0; h < nhit; h++) {
        gen_t *g = m->gens[hit_g[h]];
        size_t q = hit_q[h], r = hit_r[h];
        if (g->alive[r]) {
            g->alive[r] = 0;
            g->live--;
            m->frozen_live--;
        }
        young_put(y, ids[2 * q], ids[2 * q + 1], g->head[r], g->pos[r]);
    }
    free(mem);
    gens_filter(m);  /* emptied: nothing to spill */
    return y->live >= m->generation ? freeze(m) : BM_OK;
}

static int lookup(bm_map *m, size_t n, const uint64_t *ids, uint64_t *heads, int64_t *pos,
                  int refresh) {
    const young_t *y = &m->young;
    size_t nrest = 0;
    for (size_t i = 0; i < n; i++) {
        size_t e = young_find(y, ids[2 * i], ids[2 * i + 1]);
        if (e != NONE) {
            heads[i] = y->heads[e];
            pos[i] = (int64_t)y->pos[e];
        } else {
            heads[i] = 0;
            pos[i] = -1;
            nrest++;
        }
    }
    if (nrest && m->ngens) {
        int rc = lookup_frozen(m, n, ids, heads, pos, nrest, refresh);
        if (rc != BM_OK) return rc;
    }
    size_t hits = 0;
    for (size_t i = 0; i < n; i++) hits += pos[i] >= 0;
    m->hits += hits;
    m->misses += n - hits;
    return BM_OK;
}

int bm_lookup(bm_map *m, size_t n, const uint64_t *ids, uint64_t *heads, int64_t *pos) {
    return lookup(m, n, ids, heads, pos, 1);
}

int bm_peek(bm_map *m, size_t n, const uint64_t *ids, uint64_t *heads, int64_t *pos) {
    return lookup(m, n, ids, heads, pos, 0);
}

int bm_add(bm_map *m, size_t n, const uint64_t *ids, const uint64_t *heads,
           const uint32_t *pos, bm_spill *spill) {
    spill->n = 0;
    young_t *y = &m->young;
    for (size_t i = 0; i < n; i++) {
        int rc = young_set(y, ids[2 * i], ids[2 * i + 1], heads[i], pos[i]);
        if (rc == BM_OK && y->live >= m->generation) rc = freeze(m);
        if (rc != BM_OK) return rc;
    }
    return evict(m, spill);
}

int bm_add_bulk(bm_map *m, size_t n, const uint64_t *ids, const uint64_t *heads,
                const uint32_t *pos, bm_spill *spill) {
    spill->n = 0;
    int rc = freeze(m);
    if (rc != BM_OK) return rc;
    size_t step = m->generation > SIZE_MAX ? SIZE_MAX : (size_t)m->generation;
    for (size_t i = 0; i < n;) {
        size_t k = n - i < step ? n - i : step;
        rc = append(m, k, ids + 2 * i, heads + i, pos + i);
        if (rc != BM_OK) return rc;
        i += k;
    }
    return evict(m, spill);
}

/* Every alive frozen row of k <= DISCARD_CHUNK ids dropped (searched in the generations
 * whose filter lets the id through); returns how many. */
static size_t discard_frozen(bm_map *m, size_t k, const uint64_t *ids) {
    uint64_t mix[DISCARD_CHUNK], hi[DISCARD_CHUNK], hash[DISCARD_CHUNK], mask[DISCARD_CHUNK];
    size_t cand[DISCARD_CHUNK], rows[DISCARD_CHUNK], dropped = 0;
    probe_t p = {mix, hi, hash, mask, cand, rows};
    for (size_t i = 0; i < k; i++) probe_set(&p, i, ids[2 * i], ids[2 * i + 1]);
    for (size_t gi = 0; gi < m->ngens; gi++) {
        gen_t *g = m->gens[gi];
        if (!g->live) continue;
        size_t nc = gen_search(g, k, &p);
        for (size_t c = 0; c < nc; c++) {
            size_t r = rows[c];
            if (r == NONE || !g->alive[r]) continue;
            g->alive[r] = 0;
            g->live--;
            m->frozen_live--;
            dropped++;
        }
    }
    return dropped;
}

size_t bm_discard(bm_map *m, size_t n, const uint64_t *ids) {
    size_t dropped = 0;
    for (size_t i = 0; i < n; i++) dropped += (size_t)young_pop(&m->young, ids[2 * i], ids[2 * i + 1]);
    for (size_t at = 0; at < n && m->frozen_live; at += DISCARD_CHUNK) {
        size_t k = n - at < DISCARD_CHUNK ? n - at : DISCARD_CHUNK;
        dropped += discard_frozen(m, k, ids + 2 * at);
    }
    m->discarded += dropped;
    return dropped;
}

void bm_clear(bm_map *m) {
    gens_free_all(m);
    young_release(&m->young);
}

size_t bm_export(const bm_map *m, uint64_t *ids, uint64_t *heads, uint32_t *pos) {
    size_t w = 0;
    for (size_t gi = 0; gi < m->ngens; gi++) {
        const gen_t *g = m->gens[gi];
        for (size_t r = 0; r < g->n; r++) {
            if (!g->alive[r]) continue;
            ids[2 * w] = gen_lo(g, r);
            ids[2 * w + 1] = gen_hi(g, r);
            heads[w] = g->head[r];
            pos[w] = g->pos[r];
            w++;
        }
    }
    const young_t *y = &m->young;
    for (size_t e = 0; e < y->used; e++) {
        if (y->dead[e]) continue;
        ids[2 * w] = y->ids[2 * e];
        ids[2 * w + 1] = y->ids[2 * e + 1];
        heads[w] = y->heads[e];
        pos[w] = y->pos[e];
        w++;
    }
    return w;
}

int bm_load(bm_map *m, size_t n, const uint64_t *ids, const uint64_t *heads,
            const uint32_t *pos, bm_spill *spill) {
    bm_clear(m);
    return bm_add_bulk(m, n, ids, heads, pos, spill);
}
