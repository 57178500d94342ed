/*
 * test_mpsc.c -- the lock-free task queue and the timer heap, without loops.
 */
#include <pthread.h>

#include "internal.h"
#include "test.h"

#define PRODUCERS 4
#define PER_PRODUCER 200000

typedef struct item_s {
  nr_task_t task;
  int producer, seq;
} item_t;

static nr_mpsc_t q;
static item_t *items;

static void *produce(void *arg) {
  int p = (int)(intptr_t)arg;
  for (int i = 0; i < PER_PRODUCER; i++) {
    item_t *it = &items[p * PER_PRODUCER + i];
    it->producer = p;
    it->seq = i;
    nr__mpsc_push(&q, &it->task);
  }
  return NULL;
}

/* Every item arrives exactly once, each producer's in its own order. */
TEST(multi_producer_stress) {
  items = calloc(PRODUCERS * PER_PRODUCER, sizeof *items);
  nr__mpsc_init(&q);
  CHECK(nr__mpsc_empty(&q));
  pthread_t th[PRODUCERS];
  for (int i = 0; i < PRODUCERS; i++)
    pthread_create(&th[i], NULL, produce, (void *)(intptr_t)i);
  int next[PRODUCERS] = {0}, got = 0;
  uint64_t deadline = nr_now() + NR_SEC(20);
  while (got < PRODUCERS * PER_PRODUCER && nr_now() < deadline) {
    item_t *it = (item_t *)nr__mpsc_pop(&q);
    if (it == NULL)
      continue;
    CHECK_EQ(it->seq, next[it->producer]);
    next[it->producer]++;
    got++;
  }
  for (int i = 0; i < PRODUCERS; i++)
    pthread_join(th[i], NULL);
  CHECK_EQ(got, PRODUCERS * PER_PRODUCER);
  CHECK(nr__mpsc_pop(&q) == NULL);
  CHECK(nr__mpsc_empty(&q));
  free(items);
}

TEST(single_item_and_reuse) {
  nr__mpsc_init(&q);
  item_t a = {0}, b = {0};
  nr__mpsc_push(&q, &a.task);
  CHECK(!nr__mpsc_empty(&q));
  CHECK(nr__mpsc_pop(&q) == &a.task);
  CHECK(nr__mpsc_empty(&q));
  nr__mpsc_push(&q, &b.task);
  nr__mpsc_push(&q, &a.task);
  CHECK(nr__mpsc_pop(&q) == &b.task);
  CHECK(nr__mpsc_pop(&q) == &a.task);
  CHECK(nr__mpsc_pop(&q) == NULL);
}

/* ---- heap ----------------------------------------------------------------- */

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
