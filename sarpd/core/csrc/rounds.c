/* Bound-and-verify rounds of one query window (rounds.h; reference:
 * sarpd/core/plan.py's WindowPlan, routing.py's agreement and bounds). */
#include "rounds.h"

#include <stdlib.h>
#include <string.h>

void rd_init(rd_plan *p, int64_t length, int64_t offset, int64_t first_bound, int64_t count,
             int64_t nfirst, int64_t best, uint64_t best_sid, int64_t chunk) {
    memset(p, 0, sizeof *p);
    p->length = length;
    p->offset = offset;
    p->first_bound = first_bound;
    p->count = count;
    p->nfirst = nfirst;
    p->best = best;
    p->best_sid = best_sid;
    p->chunk = chunk > 0 ? chunk : 1;
    p->checked_at = -1;
}

int rd_open(const rd_plan *p, int64_t floor) {
    return !p->settled && floor < p->length && p->count > p->nfirst && p->first_bound > floor;
}

void rd_offer(rd_plan *p, uint64_t sid, int64_t run) {
    if (run > p->best) {
        p->best = run;
        p->best_sid = sid;
    }
}

int rd_needs_posting(const rd_plan *p) { return !p->built; }

int rd_agreement(uint64_t filt, uint64_t qfilt) {
    uint64_t x = filt ^ qfilt;
    for (int j = 0; j < 8; j++) {
        unsigned byte = (unsigned)(x >> (8 * j)) & 0xFFu;
        if (byte >> 4) return 2 * j;
        if (byte & 0xFu) return 2 * j + 1;
    }
    return 16;
}

int64_t rd_bound(uint64_t filt, uint64_t qfilt, int64_t offset, int64_t length) {
    int ag = rd_agreement(filt, qfilt);
    int64_t b = ag >= 16 ? length : offset + 1 + ag;
    return b < length ? b : length;
}

static int in_first(uint64_t sid, const uint64_t *first, int64_t nfirst) {
    for (int64_t i = 0; i < nfirst; i++)
        if (first[i] == sid) return 1;
    return 0;
}

int rd_take_posting(rd_plan *p, const uint64_t *segs, const uint64_t *filts, int64_t n,
                    const uint64_t *first, int64_t nfirst, uint64_t qfilt) {
    size_t cap = n > 0 ? (size_t)n : 1;
    uint64_t *rest = malloc(cap * sizeof *rest);
    int64_t *bound = malloc(cap * sizeof *bound);
    uint8_t *taken = calloc(cap, 1);
    if (rest == NULL || bound == NULL || taken == NULL) {
        free(rest);
        free(bound);
        free(taken);
        return -1;
    }
    int64_t m = 0;
    for (int64_t i = 0; i < n; i++) {
        if (in_first(segs[i], first, nfirst)) continue;  /* np.isin(segs, first) */
        rest[m] = segs[i];
        bound[m++] = rd_bound(filts[i], qfilt, p->offset, p->length);
    }
    rd_free(p);
    p->rest = rest;
    p->bound = bound;
    p->taken = taken;
    p->nrest = m;
    p->built = 1;
    return 0;
}

typedef struct { uint64_t score; int64_t at; } Scored;

/* Ranking: a higher score first; equal scores (one seg id) by position. */
static int before(Scored x, Scored y) { return x.score != y.score ? x.score > y.score : x.at < y.at; }

static int by_rank(const void *a, const void *b) {
    Scored x = *(const Scored *)a, y = *(const Scored *)b;
    return before(x, y) ? -1 : before(y, x) ? 1 : 0;
}

/* Sift h[i] down a heap of n whose root is the lowest ranked. */
static void sift_down(Scored *h, int64_t n, int64_t i) {
    for (;;) {
        int64_t l = 2 * i + 1, r = l + 1, m = i;
        if (l < n && before(h[m], h[l])) m = l;
        if (r < n && before(h[m], h[r])) m = r;
        if (m == i) return;
        Scored t = h[i];
        h[i] = h[m];
        h[m] = t;
        i = m;
    }
}

int64_t rd_more(rd_plan *p, int64_t floor, uint64_t *out) {
    if (!rd_open(p, floor)) return 0;
    int64_t n = 0;
    for (int64_t i = 0; i < p->nrest; i++) n += p->bound[i] > floor && !p->taken[i];
    if (!n) {
        p->settled = 1;
        return 0;
    }
    int64_t take = n < p->chunk ? n : p->chunk;
    Scored *h = malloc((size_t)take * sizeof *h);
    if (h == NULL) return -1;
    int64_t k = 0;  /* the `take` best so far, in a heap whose root is the worst of them */
    for (int64_t i = 0; i < p->nrest; i++) {
        if (p->bound[i] <= floor || p->taken[i]) continue;
        Scored x = {((uint64_t)p->bound[i] << 56) | p->rest[i], i};
        if (k < take) {
            h[k++] = x;
            if (k == take)
                for (int64_t j = take / 2 - 1; j >= 0; j--) sift_down(h, take, j);
        } else if (before(x, h[0])) {
            h[0] = x;
            sift_down(h, take, 0);
        }
    }
    qsort(h, (size_t)take, sizeof *h, by_rank);
    for (int64_t i = 0; i < take; i++) {
        p->taken[h[i].at] = 1;
        out[i] = p->rest[h[i].at];
    }
    free(h);
    if (p->chunk <= INT64_MAX / 2) p->chunk *= 2;
    return take;
}

void rd_free(rd_plan *p) {
    free(p->rest);
    free(p->bound);
    free(p->taken);
    p->rest = NULL;
    p->bound = NULL;
    p->taken = NULL;
    p->nrest = 0;
    p->built = 0;
}
