/*
 * test_heap.c -- the timer heap (runtime/heap.c), without loops: order by
 * deadline with ties first-in first-out, and removal from anywhere.
 */
#include "internal.h"
#include "test.h"

#define SEQ(t) ((uint64_t)(uintptr_t)(t)->arg)

static nr_timer_t *mk(uint64_t deadline, uint64_t seq) {
  nr_timer_t *t = calloc(1, sizeof *t);
  t->deadline = deadline;
  t->arg = (void *)(uintptr_t)seq;
  t->idx = NR_NOT_IN_HEAP;
  return t;
}

TEST(heap_orders_by_deadline_then_fifo) {
  nr_heap_t h = {0};
  enum { N = 20000 };
  nr_timer_t **v = malloc(N * sizeof *v);
  srand(42);
  for (int i = 0; i < N; i++) {
    v[i] = mk((uint64_t)(rand() % 500), (uint64_t)i);  /* many ties */
    CHECK_EQ(nr__heap_push(&h, v[i], (uint64_t)i), 0);
  }
  uint64_t last_d = 0, last_s = 0;
  for (int i = 0; i < N; i++) {
    nr_timer_t *t = nr__heap_pop(&h);
    CHECK(t != NULL);
    CHECK(t->deadline > last_d || (t->deadline == last_d && (i == 0 || SEQ(t) > last_s)));
    last_d = t->deadline;
    last_s = SEQ(t);
    CHECK_EQ(t->idx, NR_NOT_IN_HEAP);
  }
  CHECK(nr__heap_pop(&h) == NULL);
  for (int i = 0; i < N; i++)
    free(v[i]);
  free(v);
  nr__heap_free(&h);
}

TEST(heap_cancel_anywhere) {
  nr_heap_t h = {0};
  enum { N = 5000 };
  nr_timer_t *v[N];
  for (int i = 0; i < N; i++) {
    v[i] = mk((uint64_t)((i * 7919) % N), (uint64_t)i);
    nr__heap_push(&h, v[i], (uint64_t)i);
  }
  for (int i = 0; i < N; i += 3) {        /* remove a third, from anywhere */
    nr__heap_remove(&h, v[i]);
    CHECK_EQ(v[i]->idx, NR_NOT_IN_HEAP);
    nr__heap_remove(&h, v[i]);            /* twice is harmless */
  }
  CHECK_EQ(h.n, N - (N + 2) / 3);
  uint64_t last = 0;
  int n = 0;
  for (nr_timer_t *t; (t = nr__heap_pop(&h)) != NULL; n++) {
    CHECK_GE(t->deadline, last);
    CHECK_NE(SEQ(t) % 3, 0);
    last = t->deadline;
  }
  CHECK_EQ(n, N - (N + 2) / 3);
  for (int i = 0; i < N; i++)
    free(v[i]);
  nr__heap_free(&h);
}
