/* Bound-and-verify rounds of one query window in plain C: the twin of
 * sarpd/core/plan.py's WindowPlan (its docstring says what the rounds are for), used by
 * the match kernel's one-call batch (sarpd/core/_cmatch.c: match).
 *
 * A plan starts from its window's routed row (the first round already verified: `best`
 * and `best_sid` hold its answer). `rd_open` is WindowPlan.open; `rd_more` is
 * WindowPlan.more: the first time it needs them it takes the posting list (segs,
 * filts: every candidate under the point, in posting order) and the first round, keeps
 * the candidates that are not in the first round with their bounds
 * (routing.bounds: from the agreement of their filter with the query's), and from then
 * on hands out, per call, the strongest untaken candidates whose bound exceeds the
 * floor (score bound << 56 | seg, descending), at most `chunk` of them; `chunk` then
 * doubles. None left: the plan is settled. Candidates with one seg id are the same
 * candidate (equal scores), so which copy is taken does not change any answer.
 * No Python.h: plain data in, plain data out. */
#ifndef SARP_ROUNDS_H
#define SARP_ROUNDS_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct {
    int64_t length;       /* the query's blocks in the window */
    int64_t offset;       /* the routing point the candidates are listed under */
    int64_t first_bound;  /* the weakest first-round bound (0: every candidate read) */
    int64_t count;        /* the candidates under the point */
    int64_t nfirst;       /* the first round's size */
    int64_t best;         /* the longest verified run so far */
    uint64_t best_sid;    /* the candidate that has it (0: none) */
    int64_t chunk;        /* the next round's size (doubles each round) */
    int64_t checked_at;   /* the run at which the next block was looked up (-1: never) */
    int settled;          /* no unread candidate can beat `best` */
    int built;            /* rest, bound and taken hold the unread candidates */
    int64_t nrest;
    uint64_t *rest;       /* candidates not in the first round, in posting order */
    int64_t *bound;       /* their bounds */
    uint8_t *taken;       /* handed out already */
} rd_plan;

/* A plan fresh from its first round (nothing allocated). */
void rd_init(rd_plan *p, int64_t length, int64_t offset, int64_t first_bound, int64_t count,
             int64_t nfirst, int64_t best, uint64_t best_sid, int64_t chunk);

/* WindowPlan.open: may an unread candidate still beat `floor`? */
int rd_open(const rd_plan *p, int64_t floor);

/* WindowPlan.offer: the first of equal runs is kept. */
void rd_offer(rd_plan *p, uint64_t sid, int64_t run);

/* Whether rd_more needs the posting list (it has not taken it yet). */
int rd_needs_posting(const rd_plan *p);

/* Take the posting list (n candidates: segs, filts in posting order), the first round
 * (first, nfirst ids) and the query's filter at the point: the unread candidates and
 * their bounds. 0, or -1 when out of memory (nothing changed). */
int rd_take_posting(rd_plan *p, const uint64_t *segs, const uint64_t *filts, int64_t n,
                    const uint64_t *first, int64_t nfirst, uint64_t qfilt);

/* WindowPlan.more(floor): writes the next round's seg ids to out (room for p->nrest
 * ids) and returns how many (0: none, the plan is then settled), or -1 when out of
 * memory. The posting list must have been taken when rd_open(p, floor). */
int64_t rd_more(rd_plan *p, int64_t floor, uint64_t *out);

void rd_free(rd_plan *p);

/* routing.agreement / bounds of one candidate. */
int rd_agreement(uint64_t filt, uint64_t qfilt);
int64_t rd_bound(uint64_t filt, uint64_t qfilt, int64_t offset, int64_t length);

#ifdef __cplusplus
}
#endif

#endif
