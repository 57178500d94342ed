/*
 * test_mpsc.c -- the lock-free task queue, without loops (the timer heap
 * is test_heap.c).
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
