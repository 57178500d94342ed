/*
 * bench_execute.c -- cross-thread execute throughput: one producer thread
 * submits C tasks to one loop thread, which runs them. Reports tasks
 * enqueued and run per second for intrusive tasks (no allocation) and for
 * nr_loop_execute (one malloc/free per task).
 *
 * Usage: bench_execute [millions of tasks, default 20]
 */
#include <sched.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>

#include "netrun.h"

#define RING (1 << 20)            /* intrusive tasks in flight at most */

static _Atomic uint64_t done_count;
static uint64_t local_count;      /* loop thread only */

static int work(void *arg) {
  (void)arg;
  /* Publish progress sparsely: the producer only needs it for flow
   * control of the ring. */
  if ((++local_count & 1023) == 0)
    atomic_store_explicit(&done_count, local_count, memory_order_release);
  return 0;
}

static int finish(void *arg) {
  atomic_store(&done_count, local_count);
  nr_promise_set_success(arg, NULL, NULL);
  return 0;
}

static double run(nr_loop_t *l, uint64_t n, bool intrusive) {
  nr_task_t *ring = intrusive ? calloc(RING, sizeof *ring) : NULL;
  local_count = 0;
  atomic_store(&done_count, 0);
  nr_promise_t *p = nr_promise_new();
  uint64_t t0 = nr_now();
  for (uint64_t i = 0; i < n; i++) {
    if (intrusive) {
      /* Reuse a slot only once the loop has run the task that held it. */
      while (i >= RING &&
             atomic_load_explicit(&done_count, memory_order_acquire) + RING - 1024 <= i)
        sched_yield();
      nr_task_t *t = &ring[i & (RING - 1)];
      t->fn = work;
      t->arg = NULL;
      while (nr_loop_execute_task(l, t) != 0)
        ;
    } else {
      while (nr_loop_execute(l, work, NULL) != 0)
        ;
    }
  }
  nr_loop_execute(l, finish, p);
  nr_promise_wait(p, UINT64_MAX);
  double secs = (double)(nr_now() - t0) / 1e9;
  nr_promise_release(p);
  free(ring);
  return (double)n / secs;
}

int main(int argc, char **argv) {
  uint64_t n = (uint64_t)(argc > 1 ? atof(argv[1]) : 20) * 1000000ull;
  nr_group_t *g = nr_group_new(&(nr_group_opts_t){.name = "bench", .threads = 1});
  nr_loop_t *l = nr_group_next(g);
  run(l, n / 10, true);                             /* warm up */
  double a = run(l, n, true);
  double b = run(l, n, false);
  nr_loop_stats_t st;
  nr_loop_stats(l, &st);
  printf("execute intrusive: %.2f M tasks/s\n", a / 1e6);
  printf("execute malloc:    %.2f M tasks/s\n", b / 1e6);
  printf("eventfd writes: %llu for %llu tasks\n",
         (unsigned long long)st.wakeups, (unsigned long long)st.tasks_run);
  nr_promise_wait(nr_group_shutdown_gracefully(g, 0, NR_SEC(5)), UINT64_MAX);
  nr_group_free(g);
  return 0;
}
