/* Segments in plain C (API and contract: segment.h): sarp's one C codec of segment
 * values and delta records, and the holder operations of segment.Segment.
 *
 * Segment value (segment.py's docstring; little-endian):
 *   [0, 4) "SRPS" | 4 format (1; 2 with a holder table) | 5 n | [6, 8) 0 | 8 seg id |
 *   16 window | 24 presence | 32 ns tag | 40 CRC-32 of [0, 40) + [44, end) | 44 h (u32) |
 *   48 ids (16 n) | meta (8 n) | xmeta (8 h) | xmask (8 h)
 * Delta record (delta.py's docstring):
 *   [0, 4) "SRPD" | 4 format 1 | 5 n0 | 6 n1 | 7 flags (bit 0: table follows) |
 *   8 presence | 16 meta mask | 24 CRC-32 of [0, 24) + [28, end) | 28 h (u32) |
 *   32 appended ids (16 a) | their first holders (8 a) | new first holders of the meta
 *   mask's blocks, ascending (8 m) | xmeta (8 h) | xmask (8 h)
 *
 * Every operation mirrors the reference's steps (the comments name them), so that its
 * answers and the table it leaves are the reference's, also on tables the reference
 * would accept but never writes (an apply_delta installs a record's table unchecked):
 * only add_holder's insertion point assumes an ascending table (np.searchsorted does
 * too). No undefined behaviour: shifts stay below 64, buffers from Python may be
 * unaligned (memcpy), an empty table is NULL and never passed to memcpy. */
#include "segment.h"

#include <stdlib.h>
#include <string.h>

#include "sarp.h"

#if defined(__BYTE_ORDER__) && defined(__ORDER_LITTLE_ENDIAN__) && \
    __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
#define SEG_LE 1  /* native uint64 arrays are the values' byte order */
#else
#define SEG_LE 0
#endif

/* -- bits -------------------------------------------------------------------------- */

static uint64_t low_bits(unsigned k) {  /* bits [0, k) */
    return k >= 64 ? ~(uint64_t)0 : ((uint64_t)1 << k) - 1;
}

static unsigned popcount64(uint64_t x) {
#if defined(__GNUC__)
    return (unsigned)__builtin_popcountll(x);
#else
    unsigned c = 0;
    for (; x; x &= x - 1) c++;
    return c;
#endif
}

static unsigned ctz64(uint64_t x) {  /* x != 0 */
#if defined(__GNUC__)
    return (unsigned)__builtin_ctzll(x);
#else
    unsigned c = 0;
    for (; !(x & 1); x >>= 1) c++;
    return c;
#endif
}

/* count native uint64 from src (any alignment) to dst, little-endian */
static void put_words(unsigned char *dst, const void *src, size_t count) {
    if (count == 0) return;
#if SEG_LE
    memcpy(dst, src, 8 * count);
#else
    const unsigned char *p = (const unsigned char *)src;
    for (size_t j = 0; j < count; j++) sarp_put_le64(dst + 8 * j, sarp_load_u64(p + 8 * j));
#endif
}

/* -- life -------------------------------------------------------------------------- */

void seg_init(Seg *s) {
    memset(s, 0, sizeof *s);
    s->xmeta = s->xmask = NULL;
}

void seg_free(Seg *s) {
    free(s->xmeta);
    free(s->xmask);
    seg_init(s);
}

int seg_reserve(Seg *s, size_t cap) {
    if (cap <= s->cap) return SEG_OK;
    size_t want = s->cap < 4 ? 4 : s->cap;
    while (want < cap) want = want > SIZE_MAX / 2 ? cap : 2 * want;
    if (want > SIZE_MAX / sizeof(uint64_t)) return SEG_NOMEM;
    /* each array is grown alone: when the second fails, the first is merely roomier
     * than cap says, and s is unchanged */
    uint64_t *xm = realloc(s->xmeta, want * sizeof(uint64_t));
    if (xm == NULL) return SEG_NOMEM;
    s->xmeta = xm;
    uint64_t *xk = realloc(s->xmask, want * sizeof(uint64_t));
    if (xk == NULL) return SEG_NOMEM;
    s->xmask = xk;
    s->cap = want;
    return SEG_OK;
}

int seg_set_table(Seg *s, size_t h, const uint64_t *xmeta, const uint64_t *xmask) {
    if (seg_reserve(s, h) != SEG_OK) return SEG_NOMEM;
    if (h) {
        memmove(s->xmeta, xmeta, h * sizeof(uint64_t));
        memmove(s->xmask, xmask, h * sizeof(uint64_t));
    }
    s->h = h;
    return SEG_OK;
}

int seg_copy(Seg *dst, const Seg *src) {
    if (dst == src) return SEG_OK;
    if (seg_reserve(dst, src->h) != SEG_OK) return SEG_NOMEM;
    uint64_t *xm = dst->xmeta, *xk = dst->xmask;
    size_t cap = dst->cap;
    *dst = *src;
    dst->xmeta = xm;
    dst->xmask = xk;
    dst->cap = cap;
    if (src->h) {
        memcpy(xm, src->xmeta, src->h * sizeof(uint64_t));
        memcpy(xk, src->xmask, src->h * sizeof(uint64_t));
    }
    return SEG_OK;
}

/* -- values ------------------------------------------------------------------------ */

size_t seg_value_size(unsigned n, size_t h) {
    return SEG_HEADER + 24 * (size_t)n + 16 * h;
}

int seg_encode_parts(unsigned char *out, uint64_t seg_id, uint64_t window, uint64_t presence,
                     uint64_t ns_tag, unsigned n, const void *ids, const void *meta, size_t h,
                     const void *xmeta, const void *xmask) {
    if (n < 1 || n > SEG_MAX_BLOCKS) return SEG_BLOCKS;
    if (h > 0xFFFFFFFFu) return SEG_HOLDERS;
    size_t size = seg_value_size(n, h);
    memcpy(out, "SRPS", 4);
    out[4] = h ? 2 : 1;
    out[5] = (unsigned char)n;
    out[6] = out[7] = 0;
    sarp_put_le64(out + 8, seg_id);
    sarp_put_le64(out + 16, window);
    sarp_put_le64(out + 24, presence & low_bits(n));
    sarp_put_le64(out + 32, ns_tag);
    sarp_put_le32(out + 44, (uint32_t)h);
    unsigned char *body = out + SEG_HEADER;
    put_words(body, ids, 2 * (size_t)n);
    put_words(body + 16 * (size_t)n, meta, n);
    if (h) {
        put_words(body + 24 * (size_t)n, xmeta, h);
        put_words(body + 24 * (size_t)n + 8 * h, xmask, h);
    }
    sarp_put_le32(out + 40, sarp_crc32(sarp_crc32(0, out, 40), out + 44, size - 44));
    return SEG_OK;
}

int seg_encode(const Seg *s, unsigned char *out) {
    return seg_encode_parts(out, s->seg_id, s->window, s->presence, s->ns_tag, s->n, s->ids,
                            s->meta, s->h, s->xmeta, s->xmask);
}

int seg_check(const unsigned char *p, size_t len) {
    if (len < SEG_HEADER) return SEG_SHORT;
    if (memcmp(p, "SRPS", 4) != 0) return SEG_MAGIC;
    unsigned fmt = p[4], n = p[5];
    uint64_t h = sarp_get_le32(p + 44);
    if (fmt != 1 && fmt != 2) return SEG_FORMAT;
    if (fmt == 1 && h) return SEG_FORMAT1_TABLE;
    if (n < 1 || n > SEG_MAX_BLOCKS || (uint64_t)len != SEG_HEADER + 24 * (uint64_t)n + 16 * h)
        return SEG_SIZE;
    if (sarp_crc32(sarp_crc32(0, p, 40), p + 44, len - 44) != sarp_get_le32(p + 40))
        return SEG_CHECKSUM;
    /* the reference: any mask 0, any mask & ~presence, xmeta not strictly ascending */
    uint64_t presence = sarp_get_le64(p + 24);
    const unsigned char *xm = p + SEG_HEADER + 24 * n, *xk = xm + 8 * h;
    for (uint64_t j = 0; j < h; j++) {
        uint64_t mask = sarp_get_le64(xk + 8 * j);
        if (mask == 0 || (mask & ~presence)) return SEG_TABLE;
        if (j && sarp_get_le64(xm + 8 * j) <= sarp_get_le64(xm + 8 * (j - 1))) return SEG_TABLE;
    }
    return SEG_OK;
}

int seg_decode(Seg *s, const unsigned char *p, size_t len) {
    int code = seg_check(p, len);
    if (code != SEG_OK) return code;
    unsigned n = p[5];
    size_t h = sarp_get_le32(p + 44);
    if (seg_reserve(s, h) != SEG_OK) return SEG_NOMEM;
    s->seg_id = sarp_get_le64(p + 8);
    s->window = sarp_get_le64(p + 16);
    s->presence = sarp_get_le64(p + 24);  /* as the value has it (bits past n too) */
    s->ns_tag = sarp_get_le64(p + 32);
    s->n = n;
    const unsigned char *b = p + SEG_HEADER;
    for (unsigned i = 0; i < n; i++) {
        s->ids[i][0] = sarp_get_le64(b + 16 * i);
        s->ids[i][1] = sarp_get_le64(b + 16 * i + 8);
        s->meta[i] = sarp_get_le64(b + 16 * n + 8 * i);
    }
    const unsigned char *xm = b + 24 * n, *xk = xm + 8 * h;
    for (size_t j = 0; j < h; j++) {
        s->xmeta[j] = sarp_get_le64(xm + 8 * j);
        s->xmask[j] = sarp_get_le64(xk + 8 * j);
    }
    s->h = h;
    return SEG_OK;
}

/* -- holders ----------------------------------------------------------------------- */

unsigned seg_present_run(const Seg *s, unsigned start) {
    if (start >= s->n) return 0;
    unsigned k = s->n - start;
    /* absent = ~(presence >> start) & ((1 << (n - start)) - 1) */
    uint64_t absent = ~(s->presence >> start) & low_bits(k);
    return absent ? ctz64(absent) : k;
}

int seg_is_present(const Seg *s, unsigned i) {
    return i < 64 && ((s->presence >> i) & 1);
}

int seg_has_at(const Seg *s, unsigned i, uint64_t lo, uint64_t hi) {
    return i < s->n && s->ids[i][0] == lo && s->ids[i][1] == hi;
}

/* present block of the Seg (past the end: absent) */
static int present(const Seg *s, unsigned i) {
    return i < s->n && ((s->presence >> i) & 1);
}

size_t seg_holders_of(const Seg *s, unsigned i, uint64_t *out) {
    if (!present(s, i)) return 0;
    size_t k = 0;
    out[k++] = s->meta[i];
    uint64_t bit = (uint64_t)1 << i;
    for (size_t j = 0; j < s->h; j++)
        if (s->xmask[j] & bit) out[k++] = s->xmeta[j];
    return k;
}

int seg_holds(const Seg *s, unsigned i, uint64_t holder) {
    if (!present(s, i)) return 0;
    if (s->meta[i] == holder) return 1;
    uint64_t bit = (uint64_t)1 << i;
    for (size_t j = 0; j < s->h; j++)
        if ((s->xmask[j] & bit) && s->xmeta[j] == holder) return 1;
    return 0;
}

int seg_add_holder(Seg *s, unsigned i, uint64_t holder) {
    if (!present(s, i) || seg_holds(s, i, holder)) return 0;
    uint64_t bit = (uint64_t)1 << i;
    size_t lo = 0, hi = s->h;  /* np.searchsorted(xmeta, holder): the first >= holder */
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (s->xmeta[mid] < holder) lo = mid + 1;
        else hi = mid;
    }
    if (lo < s->h && s->xmeta[lo] == holder) {
        s->xmask[lo] |= bit;
        return 1;
    }
    if (s->h == SIZE_MAX || seg_reserve(s, s->h + 1) != SEG_OK) return SEG_NOMEM;
    size_t tail = (s->h - lo) * sizeof(uint64_t);
    memmove(s->xmeta + lo + 1, s->xmeta + lo, tail);
    memmove(s->xmask + lo + 1, s->xmask + lo, tail);
    s->xmeta[lo] = holder;
    s->xmask[lo] = bit;
    s->h++;
    return 1;
}

/* Segment._compact: drop the entries without a block, in order */
static void compact(Seg *s) {
    size_t k = 0;
    for (size_t j = 0; j < s->h; j++) {
        if (!s->xmask[j]) continue;
        s->xmeta[k] = s->xmeta[j];
        s->xmask[k] = s->xmask[j];
        k++;
    }
    s->h = k;
}

/* Segment.drop_holder(i, None if every else holder) */
static int drop(Seg *s, unsigned i, int every, uint64_t holder) {
    if (!present(s, i)) return 0;
    uint64_t bit = (uint64_t)1 << i;
    if (s->h == 0) {  /* one holder a block: no table to edit */
        if (!every && s->meta[i] != holder) return 0;
        s->presence &= ~bit;
        return 1;
    }
    size_t first = s->h;  /* the first entry that holds block i (held's first) */
    for (size_t j = 0; j < s->h && first == s->h; j++)
        if (s->xmask[j] & bit) first = j;
    if (every || (s->meta[i] == holder && first == s->h)) {
        for (size_t j = 0; j < s->h; j++) s->xmask[j] &= ~bit;
        s->presence &= ~bit;
    } else if (s->meta[i] == holder) {  /* the smallest other holder becomes the first */
        s->meta[i] = s->xmeta[first];
        s->xmask[first] &= ~bit;
    } else {
        for (size_t j = 0; j < s->h; j++)
            if ((s->xmask[j] & bit) && s->xmeta[j] == holder) s->xmask[j] &= ~bit;
    }
    compact(s);
    return !((s->presence >> i) & 1);
}

int seg_drop_holder(Seg *s, unsigned i, uint64_t holder) { return drop(s, i, 0, holder); }

int seg_drop_all(Seg *s, unsigned i) { return drop(s, i, 1, 0); }

size_t seg_keep_head(const Seg *s, unsigned run, uint64_t *xmeta, uint64_t *xmask) {
    uint64_t head = low_bits(run);
    size_t k = 0;
    for (size_t j = 0; j < s->h; j++) {
        uint64_t m = s->xmask[j] & head;
        if (!m) continue;
        xmeta[k] = s->xmeta[j];
        xmask[k] = m;
        k++;
    }
    return k;
}

uint64_t seg_holdings(const Seg *s) {
    uint64_t total = popcount64(s->presence);
    for (size_t j = 0; j < s->h; j++) total += popcount64(s->xmask[j]);
    return total;
}

/* -- a window's targets ------------------------------------------------------------ */

/* How many holders present block i has: its first holder and the table's. */
static int64_t holders_count(const Seg *s, unsigned i) {
    int64_t k = 1;
    for (size_t j = 0; j < s->h; j++) k += (int64_t)(s->xmask[j] >> i & 1);
    return k;
}

int seg_drop_targets(Seg *s, const SegTarget *t, size_t m, int every, uint64_t holder,
                     int64_t *taken, unsigned char *gone) {
    int changed = 0;
    for (size_t k = 0; k < m; k++) {
        unsigned o = t[k].o;
        if (t[k].repeat || !present(s, o) || !seg_has_at(s, o, t[k].lo, t[k].hi)) continue;
        if (!every && !seg_holds(s, o, holder)) continue;
        if (taken[k] < 0) taken[k] = every ? holders_count(s, o) : 1;
        if (drop(s, o, every, holder)) gone[k] = 1;
        changed = 1;
    }
    return changed;
}

int seg_add_targets(Seg *s, const SegTarget *t, size_t m, unsigned char *hit) {
    int changed = 0;
    for (size_t k = 0; k < m; k++) {
        unsigned o = t[k].o;  /* is_present, not holds, has_at: add_holder adds */
        if (!present(s, o) || seg_holds(s, o, t[k].meta) || !seg_has_at(s, o, t[k].lo, t[k].hi))
            continue;
        int got = seg_add_holder(s, o, t[k].meta);
        if (got == SEG_NOMEM) return SEG_NOMEM;
        hit[k] = 1;
        changed = 1;
    }
    return changed;
}

int seg_refill_targets(Seg *s, const SegTarget *t, size_t m, unsigned char *hit) {
    int changed = 0;
    for (size_t k = 0; k < m; k++) {
        unsigned o = t[k].o;
        if (seg_is_present(s, o) || !seg_has_at(s, o, t[k].lo, t[k].hi)) continue;
        s->presence |= (uint64_t)1 << o;
        s->meta[o] = t[k].meta;
        hit[k] = 1;
        changed = 1;
    }
    return changed;
}

/* -- delta records ------------------------------------------------------------------- */

static int same_table(const Seg *a, const Seg *b) {  /* np.array_equal of both arrays */
    return a->h == b->h && (a->h == 0 || (memcmp(a->xmeta, b->xmeta, a->h * 8) == 0 &&
                                          memcmp(a->xmask, b->xmask, a->h * 8) == 0));
}

int seg_encode_delta(const Seg *before, const Seg *after, unsigned char *out, size_t *size) {
    unsigned n0 = before->n, n1 = after->n;
    if (n1 < n0 || after->window != before->window || after->ns_tag != before->ns_tag)
        return SEG_DELTA_MOVED;
    uint64_t meta_mask = 0;  /* blocks < n0 whose first holder changed */
    for (unsigned i = 0; i < n0; i++)
        if (before->meta[i] != after->meta[i]) meta_mask |= (uint64_t)1 << i;
    int table = !same_table(before, after);
    size_t h = table ? after->h : 0, a = n1 - n0, m = popcount64(meta_mask);
    if (h > 0xFFFFFFFFu) return SEG_HOLDERS;
    *size = SEG_DELTA_HEADER + 24 * a + 8 * m + 16 * h;
    if (out == NULL) return SEG_OK;
    memcpy(out, "SRPD", 4);
    out[4] = 1;
    out[5] = (unsigned char)n0;
    out[6] = (unsigned char)n1;
    out[7] = (unsigned char)table;
    sarp_put_le64(out + 8, after->presence);
    sarp_put_le64(out + 16, meta_mask);
    sarp_put_le32(out + 28, (uint32_t)h);
    unsigned char *p = out + SEG_DELTA_HEADER;
    for (unsigned i = n0; i < n1; i++, p += 16) {
        sarp_put_le64(p, after->ids[i][0]);
        sarp_put_le64(p + 8, after->ids[i][1]);
    }
    for (unsigned i = n0; i < n1; i++, p += 8) sarp_put_le64(p, after->meta[i]);
    for (uint64_t mm = meta_mask; mm; mm &= mm - 1, p += 8)
        sarp_put_le64(p, after->meta[ctz64(mm)]);
    if (h) {
        put_words(p, after->xmeta, h);
        put_words(p + 8 * h, after->xmask, h);
    }
    sarp_put_le32(out + 24, sarp_crc32(sarp_crc32(0, out, 24), out + 28, *size - 28));
    return SEG_OK;
}

int seg_apply_delta(Seg *s, const unsigned char *rec, size_t len) {
    if (len < SEG_DELTA_HEADER) return SEG_DELTA_SHORT;
    if (memcmp(rec, "SRPD", 4) != 0 || rec[4] != 1) return SEG_DELTA_MAGIC;
    if (sarp_crc32(sarp_crc32(0, rec, 24), rec + 28, len - 28) != sarp_get_le32(rec + 24))
        return SEG_DELTA_CHECKSUM;
    unsigned n0 = rec[5], n1 = rec[6], flags = rec[7];
    uint64_t presence = sarp_get_le64(rec + 8), meta_mask = sarp_get_le64(rec + 16);
    uint64_t h = sarp_get_le32(rec + 28), m = popcount64(meta_mask);
    /* n0 != nblocks or a < 0 or meta_mask >> n0 or presence >> n1 or the size differs
     * or a table without its flag (a shift by 64 or more leaves 0) */
    if (n0 != s->n || n1 < n0 || (n0 < 64 && meta_mask >> n0) || (n1 < 64 && presence >> n1) ||
        (uint64_t)len != SEG_DELTA_HEADER + 24 * (uint64_t)(n1 - n0) + 8 * m + 16 * h ||
        (h && !(flags & 1)))
        return SEG_DELTA_FIT;
    if (n1 > SEG_MAX_BLOCKS) return SEG_DELTA_BLOCKS;
    if ((flags & 1) && seg_reserve(s, (size_t)h) != SEG_OK) return SEG_NOMEM;
    const unsigned char *p = rec + SEG_DELTA_HEADER;
    for (unsigned i = n0; i < n1; i++, p += 16) {
        s->ids[i][0] = sarp_get_le64(p);
        s->ids[i][1] = sarp_get_le64(p + 8);
    }
    for (unsigned i = n0; i < n1; i++, p += 8) s->meta[i] = sarp_get_le64(p);
    for (uint64_t mm = meta_mask; mm; mm &= mm - 1, p += 8) s->meta[ctz64(mm)] = sarp_get_le64(p);
    if (flags & 1) {
        for (size_t j = 0; j < h; j++) {
            s->xmeta[j] = sarp_get_le64(p + 8 * j);
            s->xmask[j] = sarp_get_le64(p + 8 * (h + j));
        }
        s->h = (size_t)h;
    }
    s->n = n1;
    s->presence = presence;
    return SEG_OK;
}
