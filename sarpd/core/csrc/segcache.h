/* The decoded-segment cache (sarpd/core/segcache.py is its reference and says what it
 * keeps): segment id -> Segment object, least recently used out first, a Python type of
 * the match kernel's module (`_cmatch.SegmentCache`) that the kernel also reads in C.
 *
 * An entry holds a Segment, or a stored value as the kernel's view of it (a raw entry:
 * below), which Python code never sees.
 *
 * Layout: entries in one array (a freed one is reused), linked oldest -> newest by
 * index; an open-addressing table (linear probing, backward-shift deletion) of 1 + an
 * entry's index by segment id. Each method changes the structure and only then drops
 * a reference, so a deallocation that runs Python code finds it consistent. */

#ifndef SARP_SEGCACHE_H
#define SARP_SEGCACHE_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>

typedef struct {
    uint64_t sid;
    PyObject *seg;        /* a reference; NULL: the entry is free */
    int32_t prev, next;   /* the order's neighbours (-1: none); next chains free ones */
} SCEntry;

typedef struct {
    PyObject_HEAD
    SCEntry *e;
    int32_t used, room;   /* entries made, allocated */
    int32_t held;         /* entries holding a segment */
    int32_t free_head;    /* the first free entry (-1: none) */
    int32_t oldest, newest;
    int32_t *slots;       /* 1 + entry index, 0 empty */
    size_t mask;
    Py_ssize_t capacity;
    PyObject *trace;      /* a list the ids of hits are appended to, or NULL (the
                           * bench's record of what a match read: `trace`) */
    PyObject *decoder;    /* decoder(sid, value) -> Segment, for raw entries, or NULL */
} SegCache;

extern PyTypeObject SegCacheType;

/* The segment held under `sid`, moved to the recent end (a borrowed reference), or
 * NULL when none is held (no exception). A caller that takes it appends the id to
 * c->trace when that is set (segcache_trace). */
PyObject *segcache_hit(SegCache *c, uint64_t sid);

/* Append `key` (a hit's id) to the cache's trace, if it has one: 0, or -1 with an
 * exception. */
int segcache_trace(SegCache *c, PyObject *key);

/* Raw entries (put_values): a stored value that passed decode_segment's checks is held
 * as the match kernel's view of it (its buffers over the value's bytes), which the
 * kernel reads as it is; Python code that asks for it (get, hits, items) gets the
 * Segment the cache's `decoder` makes of the value, which then replaces the view.
 * Defined by the kernel (_cmatch.c), whose type the view is: */
/* The view of a checked stored value (bytes): a new reference, or NULL with an
 * exception. */
PyObject *segcache_view(PyObject *value);
/* The value (borrowed) a raw view holds; NULL when o is not one. */
PyObject *segcache_view_value(PyObject *o);

#endif
