/* holders.h: who holds how much of a match (protocol 2), in C.
 *
 * The twin of sarpd/core/holders.py's `match_holders`, answer for answer: a match is a
 * list of windows (a verified segment's first holders, presence and holder table, and
 * how many of its blocks matched); the answer is one meta word per matched block (its
 * holder with the longest run from block 0, ties: the smaller meta) and the k holders
 * with the longest runs (longest first, ties by smaller meta, runs of 0 left out). A
 * match whose segments have no holder table answers its first holders directly. On
 * request, its spans too (`spans`): every holder's maximal runs inside the matched
 * blocks, by holder then start.
 * Plain C (no Python.h): the match kernel (_cmatch.c) calls it inside `assemble`.
 */
#ifndef SARP_HOLDERS_H
#define SARP_HOLDERS_H

#include <stddef.h>
#include <stdint.h>

typedef struct {
    const uint64_t *meta;   /* first holder of each block: meta[i * meta_step], i < length */
    ptrdiff_t meta_step;    /* elements between two blocks' metas (a strided view) */
    uint64_t presence;      /* bit i: block i is present */
    const uint64_t *xmeta;  /* the holder table: h metas, ascending, distinct */
    const uint64_t *xmask;  /* ... and the blocks each holds (bit i: block i) */
    ptrdiff_t h;
    int length;             /* matched blocks of this window, 0..64 */
} HWindow;

typedef struct {
    uint64_t holder;
    int64_t run;
} HRun;

/* A holder's maximal run inside a match: blocks [start, start + blocks) of its matched
 * prefix (the windows back to back). Three words: the match kernel hands them out as
 * they are. */
typedef struct {
    uint64_t holder;
    int64_t start, blocks;
} HSpan;

/* A growing list of spans (v malloc'd, NULL while empty: the caller frees it). */
typedef struct {
    HSpan *v;
    int64_t n, cap;
} HSpans;

/* The answer of a match of windows w[0..nw): meta_out gets one word per matched block
 * (the sum of the lengths); with k > 0, top_out gets at most k (holder, run) pairs and
 * *ntop their count (top_out must hold min(k, 64 * nw + the tables' entries) pairs:
 * `holders_top_bound`). With `spans` (NULL: not asked), the match's spans are appended
 * to it, by holder then start, a run that reaches a window's end and goes on at the
 * next window's block 0 one span (holders.py's `spans`). Returns 0, or -1 when memory
 * ran out. */
int holders_match(const HWindow *w, int nw, int64_t k, uint64_t *meta_out, HRun *top_out,
                  int64_t *ntop, HSpans *spans);

/* The most pairs `holders_match` can write to top_out for these windows and k. */
int64_t holders_top_bound(const HWindow *w, int nw, int64_t k);

#endif
