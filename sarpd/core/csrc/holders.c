/* holders.c: a match's holders (holders.h; the reference is sarpd/core/holders.py).
 *
 * Per window of length L > 0 its table: every holder of blocks [0, L) (the first
 * holders, grouped by value, and the holder table's entries) with the mask of the
 * present blocks it holds there, holders ascending, empty masks dropped (`table`).
 * Runs: the holders of block 0 (window 0's entries with bit 0), each followed window
 * by window while it holds the whole window (`runs`). A block's meta: among its
 * window's holders, the first holding it in the order (longest run, smaller meta)
 * (`block_meta`). Top: holders with runs > 0 in that order, the first k (`top`).
 * Spans: every entry's maximal runs of set bits, at its window's offset in the match
 * (the lengths of the tables before it), sorted by (holder, start); two runs of one
 * holder that touch can only meet at a window boundary (within a window they are
 * apart), so joining touching neighbours is the reference's rule (`spans`).
 * Tables are built in one scratch buffer: at most L + h entries a window.
 */
#include "holders.h"

#include <stdlib.h>
#include <string.h>

typedef struct {
    uint64_t holder;
    uint64_t mask;
} Entry;

typedef struct {
    Entry *e;  /* ascending by holder, masks != 0 */
    ptrdiff_t n;
    int length;
} Table;

static int by_holder(const void *a, const void *b) {
    uint64_t x = ((const Entry *)a)->holder, y = ((const Entry *)b)->holder;
    return (x > y) - (x < y);
}

static int by_run_then_holder(const void *a, const void *b) {
    const HRun *x = a, *y = b;
    if (x->run != y->run) return x->run > y->run ? -1 : 1;  /* longest first */
    return (x->holder > y->holder) - (x->holder < y->holder);
}

/* Window w's table into `out` (room for length + h entries); its entry count. */
static ptrdiff_t build_table(const HWindow *w, Entry *out) {
    int L = w->length;
    uint64_t limit = L >= 64 ? ~0ull : (1ull << L) - 1;
    ptrdiff_t n = 0;
    for (int i = 0; i < L; i++) {  /* a run of blocks with one first holder: one entry */
        uint64_t holder = w->meta[i * w->meta_step];
        if (n && out[n - 1].holder == holder) {
            out[n - 1].mask |= 1ull << i;
            continue;
        }
        out[n].holder = holder;
        out[n++].mask = 1ull << i;
    }
    for (ptrdiff_t j = 0; j < w->h; j++) {
        out[n].holder = w->xmeta[j];
        out[n++].mask = w->xmask[j] & limit;
    }
    qsort(out, (size_t)n, sizeof *out, by_holder);
    uint64_t present = w->presence & limit;
    ptrdiff_t m = 0;
    for (ptrdiff_t i = 0; i < n;) {
        uint64_t holder = out[i].holder, mask = 0;
        for (; i < n && out[i].holder == holder; i++) mask |= out[i].mask;
        mask &= present;
        if (mask) {
            out[m].holder = holder;
            out[m++].mask = mask;
        }
    }
    return m;
}

static int trailing_ones(uint64_t mask) {
    return mask == ~0ull ? 64 : __builtin_ctzll(~mask);
}

/* The entry of `holder` in t, or NULL. */
static const Entry *find(const Table *t, uint64_t holder) {
    ptrdiff_t lo = 0, hi = t->n;
    while (lo < hi) {
        ptrdiff_t mid = lo + (hi - lo) / 2;
        if (t->e[mid].holder < holder) lo = mid + 1;
        else hi = mid;
    }
    return lo < t->n && t->e[lo].holder == holder ? &t->e[lo] : NULL;
}

/* The run of `holder` (0 when it holds no run): runs[] is ascending by holder. */
static int64_t run_of(const HRun *runs, ptrdiff_t n, uint64_t holder) {
    ptrdiff_t lo = 0, hi = n;
    while (lo < hi) {
        ptrdiff_t mid = lo + (hi - lo) / 2;
        if (runs[mid].holder < holder) lo = mid + 1;
        else hi = mid;
    }
    return lo < n && runs[lo].holder == holder ? runs[lo].run : 0;
}

/* Every holder of block 0 and its run (ascending by holder) into `runs`; the count. */
static ptrdiff_t holder_runs(const Table *tabs, int nt, HRun *runs, uint64_t *masks,
                             unsigned char *alive) {
    if (nt == 0) return 0;
    ptrdiff_t n = 0;
    for (ptrdiff_t i = 0; i < tabs[0].n; i++) {
        if (tabs[0].e[i].mask & 1) {
            runs[n].holder = tabs[0].e[i].holder;
            runs[n].run = 0;
            masks[n] = tabs[0].e[i].mask;
            alive[n++] = 1;
        }
    }
    ptrdiff_t left = n;
    for (int t = 0; t < nt && left; t++) {
        if (t && tabs[t].n == 0) break;
        for (ptrdiff_t i = 0; i < n; i++) {
            if (!alive[i]) continue;
            if (t) {
                const Entry *e = find(&tabs[t], runs[i].holder);
                if (e == NULL) {
                    alive[i] = 0;
                    left--;
                    continue;
                }
                masks[i] = e->mask;
            }
            int run = trailing_ones(masks[i]);
            if (run > tabs[t].length) run = tabs[t].length;
            runs[i].run += run;
            if (run != tabs[t].length) {
                alive[i] = 0;
                left--;
            }
        }
    }
    return n;
}

/* Each block of table t: its holder first in (longest run, smaller meta) order. */
static void block_meta(const Table *t, const HRun *runs, ptrdiff_t nr, HRun *order,
                       uint64_t *out) {
    for (ptrdiff_t i = 0; i < t->n; i++) {
        order[i].holder = t->e[i].holder;
        order[i].run = run_of(runs, nr, t->e[i].holder);
    }
    qsort(order, (size_t)t->n, sizeof *order, by_run_then_holder);
    for (int b = 0; b < t->length; b++) {
        out[b] = t->n ? order[0].holder : 0;  /* none holds it: the first, as argmax */
        for (ptrdiff_t i = 0; i < t->n; i++) {
            const Entry *e = find(t, order[i].holder);
            if (e->mask >> b & 1) {
                out[b] = order[i].holder;
                break;
            }
        }
    }
}

int64_t holders_top_bound(const HWindow *w, int nw, int64_t k) {
    for (int i = 0; i < nw; i++) {
        if (w[i].length > 0) {
            int64_t most = (int64_t)w[i].length + (int64_t)w[i].h;
            return k < most ? k : most;
        }
    }
    return 0;
}

static void single(const HWindow *w, int nw, int64_t k, uint64_t *meta_out, HRun *top_out,
                   int64_t *ntop) {
    int64_t total = 0;
    for (int i = 0; i < nw; i++)
        for (int b = 0; b < w[i].length; b++) meta_out[total++] = w[i].meta[b * w[i].meta_step];
    *ntop = 0;
    if (k > 0 && total > 0) {
        int64_t run = 1;
        while (run < total && meta_out[run] == meta_out[0]) run++;
        top_out[0].holder = meta_out[0];
        top_out[0].run = run;
        *ntop = 1;
    }
}

/* A match's tables and the work space of its holders' answers (one allocation each). */
typedef struct {
    Table *tabs;
    int nt;
    Entry *ent;
    HRun *runs, *order;
    uint64_t *masks;
    unsigned char *alive;
} Scratch;

static void scratch_free(Scratch *s) {
    free(s->tabs);
    free(s->ent);
    free(s->runs);
    free(s->order);
    free(s->masks);
    free(s->alive);
}

/* The tables of the windows with matched blocks, in order. 0, or -1 (out of memory). */
static int scratch_tables(Scratch *s, const HWindow *w, int nw) {
    ptrdiff_t room = 0;
    for (int i = 0; i < nw; i++)
        if (w[i].length > 0) room += w[i].length + w[i].h;
    size_t r = (size_t)(room ? room : 1);
    s->tabs = malloc(sizeof *s->tabs * (size_t)(nw ? nw : 1));
    s->ent = malloc(sizeof *s->ent * r);
    s->runs = malloc(sizeof *s->runs * r);
    s->order = malloc(sizeof *s->order * r);
    s->masks = malloc(sizeof *s->masks * r);
    s->alive = malloc(r);
    if (!s->tabs || !s->ent || !s->runs || !s->order || !s->masks || !s->alive) return -1;
    ptrdiff_t used = 0;
    for (int i = 0; i < nw; i++) {
        if (w[i].length <= 0) continue;
        s->tabs[s->nt].e = s->ent + used;
        s->tabs[s->nt].n = build_table(&w[i], s->ent + used);
        s->tabs[s->nt].length = w[i].length;
        used += w[i].length + w[i].h;
        s->nt++;
    }
    return 0;
}

/* Metas and top k from the tables (the path of windows with holder tables). */
static void table_answers(Scratch *s, int64_t k, uint64_t *meta_out, HRun *top_out,
                          int64_t *ntop) {
    ptrdiff_t nr = holder_runs(s->tabs, s->nt, s->runs, s->masks, s->alive);
    int64_t at = 0;
    for (int t = 0; t < s->nt; t++) {
        block_meta(&s->tabs[t], s->runs, nr, s->order, meta_out + at);
        at += s->tabs[t].length;
    }
    *ntop = 0;
    if (k > 0) {
        ptrdiff_t m = 0;
        for (ptrdiff_t i = 0; i < nr; i++)
            if (s->runs[i].run > 0) s->order[m++] = s->runs[i];
        qsort(s->order, (size_t)m, sizeof *s->order, by_run_then_holder);
        for (ptrdiff_t i = 0; i < m && i < k; i++) top_out[(*ntop)++] = s->order[i];
    }
}

static int by_holder_then_start(const void *a, const void *b) {
    const HSpan *x = a, *y = b;
    if (x->holder != y->holder) return x->holder > y->holder ? 1 : -1;
    return (x->start > y->start) - (x->start < y->start);
}

static int span_push(HSpans *out, uint64_t holder, int64_t start, int64_t blocks) {
    if (out->n == out->cap) {
        int64_t cap = out->cap ? 2 * out->cap : 64;
        HSpan *v = realloc(out->v, (size_t)cap * sizeof *v);
        if (v == NULL) return -1;
        out->v = v;
        out->cap = cap;
    }
    out->v[out->n++] = (HSpan){holder, start, blocks};
    return 0;
}

/* The tables' spans appended to *out (module comment: spans). 0, or -1 (out of memory). */
static int add_spans(const Table *tabs, int nt, HSpans *out) {
    int64_t from = out->n, off = 0;
    for (int t = 0; t < nt; t++) {
        for (ptrdiff_t i = 0; i < tabs[t].n; i++) {
            uint64_t mask = tabs[t].e[i].mask;
            while (mask) {  /* its runs of set bits, lowest first */
                int a = __builtin_ctzll(mask), n = trailing_ones(mask >> a);
                if (span_push(out, tabs[t].e[i].holder, off + a, n) < 0) return -1;
                mask = a + n >= 64 ? 0 : mask & (~0ull << (a + n));
            }
        }
        off += tabs[t].length;
    }
    if (out->n - from < 2) return 0;  /* (none: out->v may be NULL, which qsort refuses) */
    qsort(out->v + from, (size_t)(out->n - from), sizeof *out->v, by_holder_then_start);
    int64_t m = from;
    for (int64_t i = from; i < out->n; i++) {
        const HSpan *s = &out->v[i];
        if (m > from && out->v[m - 1].holder == s->holder
                && out->v[m - 1].start + out->v[m - 1].blocks == s->start)
            out->v[m - 1].blocks += s->blocks;  /* on across a window boundary */
        else
            out->v[m++] = *s;
    }
    out->n = m;
    return 0;
}

int holders_match(const HWindow *w, int nw, int64_t k, uint64_t *meta_out, HRun *top_out,
                  int64_t *ntop, HSpans *spans) {
    int tables = 0;
    for (int i = 0; i < nw; i++) tables |= w[i].h > 0;
    if (!tables) {
        single(w, nw, k, meta_out, top_out, ntop);
        if (spans == NULL) return 0;
    }
    Scratch s = {0};
    int rc = -1;
    if (scratch_tables(&s, w, nw) < 0) goto done;
    if (tables) table_answers(&s, k, meta_out, top_out, ntop);
    if (spans != NULL && add_spans(s.tabs, s.nt, spans) < 0) goto done;
    rc = 0;
done:
    scratch_free(&s);
    return rc;
}
