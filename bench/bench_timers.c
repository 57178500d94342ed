/*
 * bench_timers.c -- one million timers scheduled and fired on one loop.
 * A task on the loop schedules N one-shot timers with pseudo-random delays
 * in [0, spread) and the clock stops when the last has fired.
 *
 * Usage: bench_timers [N, default 1000000] [spread ms, default 50]
 */
#include <stdio.h>
#include <stdlib.h>

#include "netrun.h"

typedef struct st_s {
  nr_loop_t *loop;
  long n, fired;
  uint64_t spread, t0, t_scheduled, t_end;
  nr_promise_t *done;
  nr_timer_t **handles;
} st_t;

static int fire(void *arg) {
  st_t *s = arg;
  if (++s->fired == s->n) {
    s->t_end = nr_now();
    nr_promise_set_success(s->done, NULL, NULL);
  }
  return 0;
}

static int schedule_all(void *arg) {
  st_t *s = arg;
  uint64_t x = 88172645463325252ull;               /* xorshift64 */
  s->t0 = nr_now();
  for (long i = 0; i < s->n; i++) {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    s->handles[i] = nr_loop_schedule(s->loop, s->spread ? x % s->spread : 0, 0,
                                     fire, NULL, s);
  }
  s->t_scheduled = nr_now();
  return 0;
}

int main(int argc, char **argv) {
  st_t s = {.n = argc > 1 ? atol(argv[1]) : 1000000,
            .spread = NR_MS(argc > 2 ? atol(argv[2]) : 50)};
  nr_group_t *g = nr_group_new(&(nr_group_opts_t){.name = "timers", .threads = 1});
  s.loop = nr_group_next(g);
  s.handles = malloc(sizeof *s.handles * (size_t)s.n);
  /* Round 1 runs on fresh memory (page faults included); later rounds
   * reuse what malloc got back from the previous one. */
  for (int round = 1; round <= 3; round++) {
    s.fired = 0;
    s.done = nr_promise_new();
    nr_loop_execute(s.loop, schedule_all, &s);
    nr_promise_wait(s.done, UINT64_MAX);
    printf("round %d: %ld timers (delays 0-%llu ms): scheduled in %.3f s, "
           "all fired %.3f s after the first was scheduled\n",
           round, s.n, (unsigned long long)(s.spread / 1000000),
           (double)(s.t_scheduled - s.t0) / 1e9,
           (double)(s.t_end - s.t0) / 1e9);
    for (long i = 0; i < s.n; i++)
      nr_timer_release(s.handles[i]);
    nr_promise_release(s.done);
  }
  nr_promise_wait(nr_group_shutdown_gracefully(g, 0, NR_SEC(5)), UINT64_MAX);
  nr_group_free(g);
  free(s.handles);
  return 0;
}
