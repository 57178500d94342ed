/*
 * heap.c -- the scheduled-task min-heap of one loop (loop thread only).
 *
 * A 4-ary heap: half the depth of a binary one, and a node's children share
 * one or two cache lines. Keys (deadline, sequence) live inline in the array
 * so sifting compares without touching the timers; equal deadlines fire in
 * scheduling order. Each timer knows its index, which makes cancellation
 * O(log n); only the entries that move write their timer.
 */
#include <stdlib.h>

#include "internal.h"

static inline bool less(const nr_heap_entry_t *a, const nr_heap_entry_t *b) {
  return a->deadline < b->deadline ||
         (a->deadline == b->deadline && a->seq < b->seq);
}

static inline void place(nr_heap_t *h, size_t i, nr_heap_entry_t e) {
  h->v[i] = e;
  e.timer->idx = (uint32_t)i;
}

#define ARITY 4

static void sift_up(nr_heap_t *h, size_t i) {
  nr_heap_entry_t e = h->v[i];
  while (i > 0) {
    size_t parent = (i - 1) / ARITY;
    if (!less(&e, &h->v[parent]))
      break;
    place(h, i, h->v[parent]);
    i = parent;
  }
  place(h, i, e);
}

static void sift_down(nr_heap_t *h, size_t i) {
  nr_heap_entry_t e = h->v[i];
  for (;;) {
    size_t first = ARITY * i + 1, best = first;
    if (first >= h->n)
      break;
    size_t end = first + ARITY < h->n ? first + ARITY : h->n;
    for (size_t c = first + 1; c < end; c++)
      if (less(&h->v[c], &h->v[best]))
        best = c;
    if (!less(&h->v[best], &e))
      break;
    place(h, i, h->v[best]);
    i = best;
  }
  place(h, i, e);
}

int nr__heap_push(nr_heap_t *h, nr_timer_t *t, uint64_t seq) {
  if (h->n == h->cap) {
    if (h->cap >= NR_NOT_IN_HEAP / 2)
      return -ENOMEM;
    size_t cap = h->cap ? h->cap * 2 : 64;
    nr_heap_entry_t *v = realloc(h->v, cap * sizeof *v);
    if (v == NULL)
      return -ENOMEM;
    h->v = v;
    h->cap = cap;
  }
  h->v[h->n] = (nr_heap_entry_t){t->deadline, seq, t};
  t->idx = (uint32_t)h->n++;
  sift_up(h, t->idx);
  return 0;
}

nr_timer_t *nr__heap_peek(const nr_heap_t *h) {
  return h->n ? h->v[0].timer : NULL;
}

nr_timer_t *nr__heap_pop(nr_heap_t *h) {
  if (h->n == 0)
    return NULL;
  nr_timer_t *t = h->v[0].timer;
  nr__heap_remove(h, t);
  return t;
}

void nr__heap_remove(nr_heap_t *h, nr_timer_t *t) {
  size_t i = t->idx;
  if (t->idx == NR_NOT_IN_HEAP)
    return;
  t->idx = NR_NOT_IN_HEAP;
  if (--h->n == i)
    return;                     /* it was the last entry */
  place(h, i, h->v[h->n]);
  /* The moved entry may belong above or below its new slot. */
  if (i > 0 && less(&h->v[i], &h->v[(i - 1) / ARITY]))
    sift_up(h, i);
  else
    sift_down(h, i);
}

void nr__heap_free(nr_heap_t *h) {
  free(h->v);
  h->v = NULL;
  h->n = h->cap = 0;
}
