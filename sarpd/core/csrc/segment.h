/* Segments in plain C: the twin of sarpd/core/segment.py (the value layout, its checks
 * and the `Segment` class's holder operations) and of sarpd/core/delta.py (delta
 * records), for the native write core (no Python.h: the Python functions that drive it
 * are sarpd/core/_cwrite.c's, and tests/core/test_csegment.py holds them to the
 * reference). The layouts are segment.py's and delta.py's module docstrings; the code
 * is segment.c.
 *
 * A Seg is a decoded segment that the caller owns and edits (the reference's writable
 * copy): its header fields, its 1..64 blocks (ids, first holders) inline, and its
 * holder table on the heap (xmeta ascending and distinct, xmask non-zero, as a checked
 * value has them), grown as holders are added. Its fields are public: a caller may set
 * them (append blocks, set presence bits) as the writer does the reference's; the
 * table is changed through the functions (seg_set_table, the holder operations).
 *
 * Answer for answer the reference's: the same return values, the same table, and
 * seg_encode / seg_encode_delta write the reference's bytes. `presence` keeps the bits
 * a value had past its blocks (a value encoded here never has any: encoding masks
 * them, as the reference does; the reference counts them in holdings, and so does
 * seg_holdings). Block arguments are < n unless said otherwise (the reference raises
 * IndexError past the end; here a block past the end is an absent one).
 *
 * Functions that return int return SEG_OK (0) or a SEG_* code: a failed check (the
 * caller raises the reference's error for it), or SEG_NOMEM, after which the Seg is
 * unchanged and usable. The functions are not thread-safe for one Seg; distinct Segs
 * may be used from any threads at once. */
#ifndef SARP_SEGMENT_H
#define SARP_SEGMENT_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define SEG_MAX_BLOCKS 64
#define SEG_HEADER 48        /* a segment value's header (segment.HEADER) */
#define SEG_DELTA_HEADER 32  /* a delta record's header (delta.HEAD) */

enum {
    SEG_OK = 0,
    /* a segment value's checks, in the order of segment._decode_segment (which raises
     * FormatVersionError for SEG_FORMAT, CorruptData for the others) */
    SEG_SHORT = 1,          /* shorter than its header */
    SEG_MAGIC = 2,          /* not b"SRPS" */
    SEG_FORMAT = 3,         /* format not 1 or 2 */
    SEG_FORMAT1_TABLE = 4,  /* format 1 with holder entries */
    SEG_SIZE = 5,           /* nblocks not in 1..64, or its size not 48 + 24 n + 16 h */
    SEG_CHECKSUM = 6,
    SEG_TABLE = 7,          /* holder table not ascending, an empty mask, an absent block */
    /* a delta record's checks, in the order of delta.apply_delta (CorruptData) */
    SEG_DELTA_SHORT = 8,     /* shorter than its header */
    SEG_DELTA_MAGIC = 9,     /* not b"SRPD" of format 1 */
    SEG_DELTA_CHECKSUM = 10,
    SEG_DELTA_FIT = 11,      /* n0 is not the segment's, shrinks, bits past n0 / n1, size */
    SEG_DELTA_BLOCKS = 12,   /* fits, but grows past 64 blocks: the reference's result is
                              * no segment (encode_segment refuses it) */
    /* what cannot be encoded */
    SEG_DELTA_MOVED = 13,    /* encode_delta's ValueError: shrunk, or window / ns tag moved */
    SEG_BLOCKS = 14,         /* nblocks not in 1..64 (encode_segment's CorruptData) */
    SEG_HOLDERS = 15,        /* more than 2**32 - 1 holder entries (no u32 h holds them) */
    SEG_NOMEM = -1,
};

typedef struct Seg {
    uint64_t seg_id, window;
    uint64_t presence;   /* bit i set <=> block i is indexed */
    uint64_t ns_tag;
    unsigned n;          /* blocks, 1..SEG_MAX_BLOCKS (0: an empty Seg, nothing decoded) */
    uint64_t ids[SEG_MAX_BLOCKS][2];  /* (lo, hi) */
    uint64_t meta[SEG_MAX_BLOCKS];    /* each block's first holder */
    size_t h, cap;       /* holder table entries; allocated entries of each array */
    uint64_t *xmeta;     /* h: the other holders, ascending (NULL while cap is 0) */
    uint64_t *xmask;     /* h: bit i set <=> that holder holds block i */
} Seg;

/* -- life ------------------------------------------------------------------------ */

void seg_init(Seg *s);                 /* an empty Seg (no table, nothing allocated) */
void seg_free(Seg *s);                 /* frees the table; s is then empty (seg_init) */
int seg_reserve(Seg *s, size_t cap);   /* room for cap table entries */
/* Segment.writable: dst (initialised; its old contents dropped) becomes a deep copy of
 * src (on SEG_NOMEM dst is unchanged). */
int seg_copy(Seg *dst, const Seg *src);
/* Set the holder table to h entries copied from xmeta / xmask (as given: the caller
 * keeps them ascending and distinct, as segment.py's invariants say). */
int seg_set_table(Seg *s, size_t h, const uint64_t *xmeta, const uint64_t *xmask);

/* -- values (segment.encode_segment, decode_segment) ------------------------------- */

/* The size of the value of n blocks and h holder entries: 48 + 24 n + 16 h. */
size_t seg_value_size(unsigned n, size_t h);

/* Write the value of these fields and arrays (native uint64, any alignment: ids 2n,
 * meta n, xmeta and xmask h each; NULL when their count is 0) into out
 * (seg_value_size(n, h) bytes), byte for byte segment._encode_segment's: format 1
 * without a table, 2 with; presence masked to the n blocks. SEG_BLOCKS / SEG_HOLDERS
 * when n or h do not fit a value (nothing written). Touches nothing else: may run
 * without the GIL. */
int seg_encode_parts(unsigned char *out, uint64_t seg_id, uint64_t window, uint64_t presence,
                     uint64_t ns_tag, unsigned n, const void *ids, const void *meta, size_t h,
                     const void *xmeta, const void *xmask);
/* s's value into out (seg_value_size(s->n, s->h) bytes). */
int seg_encode(const Seg *s, unsigned char *out);

/* Every check of segment._decode_segment but the key's (the caller's), in its order:
 * SEG_OK or the first failed (SEG_SHORT .. SEG_TABLE). */
int seg_check(const unsigned char *p, size_t len);
/* Check a value and decode it into s (initialised; its table's memory is reused):
 * seg_check's code, or SEG_NOMEM; s is unchanged unless SEG_OK. */
int seg_decode(Seg *s, const unsigned char *p, size_t len);

/* -- holders (the Segment class) ----------------------------------------------------- */

/* present_run(start): the length of the run of present blocks from start (0..n). */
unsigned seg_present_run(const Seg *s, unsigned start);
/* is_present(i): presence bit i, for any i (0 from 64 on). */
int seg_is_present(const Seg *s, unsigned i);
/* has_at(i, [lo, hi]): block i exists (any i) and has this id. */
int seg_has_at(const Seg *s, unsigned i, uint64_t lo, uint64_t hi);
/* holders_of(i) into out (room for 1 + s->h): first holder first, then the table's in
 * its order; returns how many (0: block i is absent). */
size_t seg_holders_of(const Seg *s, unsigned i, uint64_t *out);
/* holds(i, holder) */
int seg_holds(const Seg *s, unsigned i, uint64_t holder);
/* add_holder(i, holder): 1 when holder now holds present block i, 0 when it already
 * did or the block is absent, SEG_NOMEM (nothing changed). */
int seg_add_holder(Seg *s, unsigned i, uint64_t holder);
/* drop_holder(i, holder): takes holder off block i (the smallest other holder becomes
 * the first when it was the first); 1 when the block became absent (no holder left),
 * else 0. The table is compacted (entries left without a block removed). */
int seg_drop_holder(Seg *s, unsigned i, uint64_t holder);
/* drop_holder(i, None): takes every holder off block i; 1 when it was present. */
int seg_drop_all(Seg *s, unsigned i);
/* keep_head(run): the table restricted to blocks [0, run) (run <= 64), entries left
 * with no block dropped, into xmeta / xmask (room for s->h each); returns how many. */
size_t seg_keep_head(const Seg *s, unsigned run, uint64_t *xmeta, uint64_t *xmask);
/* holdings(): block-holder pairs (presence bits plus table mask bits). */
uint64_t seg_holdings(const Seg *s);

/* -- a window's targets (the writer's loops over the segments of one window) --------- */

/* A target block of a window: its offset (< SEG_MAX_BLOCKS), its id, a holder (the meta
 * that add / refill give it; unused by drop), and whether an earlier target names the
 * same block (offset and id: drop counts a block once). */
typedef struct SegTarget {
    uint64_t lo, hi, meta;
    unsigned o;
    int repeat;
} SegTarget;

/* WriteTxn.drop's inner loop on one segment: in target order, each target not a repeat
 * whose block is present here with its id (and, unless every, held by holder) loses
 * holder (every: every holder); taken[t] (-1: not yet) is set where target t is first
 * dropped (its holders then when every, else 1) and gone[t] = 1 where the block became
 * absent. 1 when s changed, else 0. */
int seg_drop_targets(Seg *s, const SegTarget *t, size_t m, int every, uint64_t holder,
                     int64_t *taken, unsigned char *gone);
/* WriteTxn.add_holders' inner loop: in target order, a block present here with the
 * target's id that its meta does not hold gains it as a holder; hit[t] = 1 where it
 * did. 1 when s changed, 0 when not, SEG_NOMEM (s partly changed: drop it). */
int seg_add_targets(Seg *s, const SegTarget *t, size_t m, unsigned char *hit);
/* WriteTxn.refill's inner loop: in target order, a block absent here with the target's
 * id becomes present, the target's meta its one holder; hit[t] = 1 where it did. 1 when
 * s changed, else 0. */
int seg_refill_targets(Seg *s, const SegTarget *t, size_t m, unsigned char *hit);

/* -- delta records (sarpd/core/delta.py) --------------------------------------------- */

/* delta.encode_delta(before, after): the record that turns before into after (the same
 * segment grown, or with presence, first holders or holder table changed), written
 * into out, byte for byte the reference's; its size into *size. out NULL: the size
 * only. SEG_DELTA_MOVED when after is shorter or has another window or ns tag (the
 * reference's ValueError), SEG_HOLDERS when its table does not fit a record. */
int seg_encode_delta(const Seg *before, const Seg *after, unsigned char *out, size_t *size);
/* delta.apply_delta: s with the record rec applied in place, after every check of the
 * reference (SEG_DELTA_SHORT .. SEG_DELTA_FIT; then SEG_DELTA_BLOCKS) or SEG_NOMEM, in
 * which cases s is unchanged. Like the reference it does not check the table it
 * installs. */
int seg_apply_delta(Seg *s, const unsigned char *rec, size_t len);

#ifdef __cplusplus
}
#endif

#endif /* SARP_SEGMENT_H */
