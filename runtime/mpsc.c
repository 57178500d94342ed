/*
 * mpsc.c -- lock-free multi-producer single-consumer task queue.
 *
 * Dmitry Vyukov's intrusive MPSC list: a producer publishes a node with one
 * atomic exchange of `head` and then links the previous head to it, so
 * producers never wait on each other or on the consumer. The consumer owns
 * `tail`. Between a producer's exchange and its link the list is briefly
 * cut; the consumer then sees "not empty but nothing to pop" and retries on
 * its next pass instead of spinning (the producer is about to finish).
 */
#include "internal.h"

void nr__mpsc_init(nr_mpsc_t *q) {
  atomic_store_explicit(&q->stub.next, NULL, memory_order_relaxed);
  atomic_store_explicit(&q->head, &q->stub, memory_order_relaxed);
  q->tail = &q->stub;
}

void nr__mpsc_push(nr_mpsc_t *q, nr_task_t *t) {
  atomic_store_explicit(&t->next, NULL, memory_order_relaxed);
  /* seq_cst: the loop's wakeup protocol needs this store ordered before the
   * producer's later read of next_wakeup. */
  nr_task_t *prev = atomic_exchange(&q->head, t);
  atomic_store_explicit(&prev->next, t, memory_order_release);
}

nr_task_t *nr__mpsc_pop(nr_mpsc_t *q) {
  nr_task_t *tail = q->tail;
  nr_task_t *next = atomic_load_explicit(&tail->next, memory_order_acquire);
  if (tail == &q->stub) {
    if (next == NULL)
      return NULL;                      /* empty, or a push in progress */
    q->tail = next;                     /* skip the stub */
    tail = next;
    next = atomic_load_explicit(&tail->next, memory_order_acquire);
  }
  if (next != NULL) {
    q->tail = next;
    return tail;
  }
  if (tail != atomic_load_explicit(&q->head, memory_order_acquire))
    return NULL;                        /* a producer is linking: retry */
  nr__mpsc_push(q, &q->stub);           /* tail is the last node: re-add stub */
  next = atomic_load_explicit(&tail->next, memory_order_acquire);
  if (next != NULL) {
    q->tail = next;
    return tail;
  }
  return NULL;
}

bool nr__mpsc_empty(nr_mpsc_t *q) {
  return q->tail == &q->stub &&
         atomic_load_explicit(&q->stub.next, memory_order_acquire) == NULL &&
         atomic_load(&q->head) == &q->stub;
}
