/*
 * test_executor.c -- executor states, submission, timers, tail tasks,
 * groups and the chooser.
 */
#include <pthread.h>

#include "test.h"

static nr_loop_t *new_loop(const char *name) {
  nr_loop_opts_t o = {.name = name};
  nr_loop_t *l = nr_loop_new(&o);
  CHECK(l != NULL);
  return l;
}

static void finish(nr_loop_t *l) {
  AWAIT_OK(nr_loop_shutdown_gracefully(l, 0, NR_SEC(5)));
  CHECK_EQ(nr_loop_state(l), NR_TERMINATED);
  nr_loop_free(l);
}

static int set_flag(void *arg) {
  atomic_store((_Atomic int *)arg, 1);
  return 0;
}

typedef struct probe_s {
  nr_loop_t *l;
  _Atomic int in_thread, state, current_ok;
  nr_promise_t *done;
} probe_t;

static int probe(void *arg) {
  probe_t *p = arg;
  atomic_store(&p->in_thread, nr_loop_in_thread(p->l));
  atomic_store(&p->state, nr_loop_state(p->l));
  atomic_store(&p->current_ok, nr_loop_current() == p->l);
  nr_promise_set_success(p->done, NULL, NULL);
  return 0;
}

static _Atomic int exit_state = -1;
static void on_exit_hook(nr_loop_t *l, void *ud) {
  (void)ud;
  atomic_store(&exit_state, nr_loop_state(l));
}

TEST(lazy_start_and_every_state) {
  nr_loop_opts_t o = {.name = "states", .on_exit = on_exit_hook};
  nr_loop_t *l = nr_loop_new(&o);
  CHECK_EQ(nr_loop_state(l), NR_NOT_STARTED);
  CHECK(!nr_loop_in_thread(l));
  CHECK(nr_loop_current() == NULL);
  probe_t p = {.l = l, .done = nr_promise_new()};
  CHECK_EQ(nr_loop_execute(l, probe, &p), 0);         /* starts the thread */
  AWAIT_OK(p.done);
  CHECK_EQ(atomic_load(&p.in_thread), 1);
  CHECK_EQ(atomic_load(&p.current_ok), 1);
  CHECK_EQ(atomic_load(&p.state), NR_STARTED);
  nr_promise_release(p.done);

  /* A task submitted while shutting down (quiet period) still runs. */
  nr_promise_t *term = nr_loop_shutdown_gracefully(l, NR_MS(300), NR_SEC(5));
  CHECK(nr_loop_is_shutting_down(l));
  probe_t q = {.l = l, .done = nr_promise_new()};
  CHECK_EQ(nr_loop_execute(l, probe, &q), 0);
  AWAIT_OK(q.done);
  CHECK_EQ(atomic_load(&q.state), NR_SHUTTING_DOWN);
  nr_promise_release(q.done);
  AWAIT_OK(term);
  CHECK_EQ(atomic_load(&exit_state), NR_SHUTDOWN);   /* on_exit before the end */
  CHECK_EQ(nr_loop_state(l), NR_TERMINATED);
  CHECK(nr_loop_is_terminated(l) && nr_loop_is_shutdown(l));
  _Atomic int flag = 0;
  CHECK_EQ(nr_loop_execute(l, set_flag, &flag), NR_EREJECTED);
  CHECK(nr_loop_schedule(l, 0, 0, set_flag, NULL, &flag) == NULL);
  CHECK_EQ(errno, ESHUTDOWN);
  nr_loop_free(l);
  CHECK_EQ(atomic_load(&flag), 0);
}

static int failing(void *arg) {
  (void)arg;
  return -EIO;
}

TEST(failing_task_is_logged_and_loop_goes_on) {
  char path[] = "/tmp/nr-log-XXXXXX";
  int fd = mkstemp(path);
  CHECK(fd >= 0);
  int saved = dup(2);
  dup2(fd, 2);
  nr_loop_t *l = new_loop("failer");
  _Atomic int flag = 0;
  CHECK_EQ(nr_loop_execute(l, failing, NULL), 0);
  CHECK_EQ(nr_loop_execute(l, set_flag, &flag), 0);
  finish(l);
  nr_log_flush();                       /* the log thread writes the line */
  dup2(saved, 2);
  CHECK_EQ(atomic_load(&flag), 1);
  char buf[4096] = {0};
  CHECK_GT(pread(fd, buf, sizeof buf - 1, 0), 0);
  CHECK_CONTAINS(buf, "[failer] failer: a task failed: Input/output error");
  close(fd);
  unlink(path);
}

static int block_until(void *arg) {
  _Atomic int *gate = arg;
  while (!atomic_load(gate))
    sched_yield();
  return 0;
}

TEST(pending_bound_rejects_clearly) {
  nr_loop_opts_t o = {.name = "bounded", .max_pending = 8};
  nr_loop_t *l = nr_loop_new(&o);
  _Atomic int gate = 0, flag = 0;
  CHECK_EQ(nr_loop_execute(l, block_until, &gate), 0);
  /* Wait until the blocker has been taken off the queue. */
  nr_loop_stats_t st;
  for (int i = 0; i < 10000; i++) {
    nr_loop_stats(l, &st);
    if (st.pending_tasks == 0)
      break;
    usleep(1000);
  }
  for (int i = 0; i < 8; i++)
    CHECK_EQ(nr_loop_execute(l, set_flag, &flag), 0);
  CHECK_EQ(nr_loop_execute(l, set_flag, &flag), NR_EFULL);
  CHECK_CONTAINS(nr_strerror(NR_EFULL), "too many pending tasks");
  atomic_store(&gate, 1);
  finish(l);
  CHECK_EQ(atomic_load(&flag), 1);
}

/* ---- timers --------------------------------------------------------------- */

typedef struct tick_s {
  _Atomic int fired, cancelled;
  uint64_t first_at;
  nr_promise_t *done;
  int want;
} tick_t;

static int tick(void *arg) {
  tick_t *t = arg;
  if (atomic_fetch_add(&t->fired, 1) == 0)
    t->first_at = nr_now();
  if (atomic_load(&t->fired) == t->want && t->done)
    nr_promise_set_success(t->done, NULL, NULL);
  return 0;
}

static int tick_cancelled(void *arg) {
  tick_t *t = arg;
  atomic_fetch_add(&t->cancelled, 1);
  return 0;
}

TEST(one_shot_timer_fires_after_its_delay) {
  nr_loop_t *l = new_loop("timers");
  tick_t t = {.want = 1, .done = nr_promise_new()};
  uint64_t start = nr_now();
  nr_timer_t *tm = nr_loop_schedule(l, NR_MS(100), 0, tick, tick_cancelled, &t);
  CHECK(tm != NULL);
  AWAIT_OK(t.done);
  CHECK_GE(t.first_at - start, NR_MS(100));
  CHECK_LT(t.first_at - start, NR_MS(1000));
  CHECK_EQ(nr_timer_cancel(tm), -EALREADY);          /* it ran */
  nr_timer_release(tm);
  finish(l);
  CHECK_EQ(atomic_load(&t.fired), 1);
  CHECK_EQ(atomic_load(&t.cancelled), 0);
  nr_promise_release(t.done);
}

TEST(fixed_rate_and_fixed_delay_repeat_until_cancelled) {
  nr_loop_t *l = new_loop("periodic");
  tick_t a = {.want = 5, .done = nr_promise_new()};
  tick_t b = {.want = 5, .done = nr_promise_new()};
  nr_timer_t *ta = nr_loop_schedule(l, NR_MS(10), (int64_t)NR_MS(10), tick,
                                    tick_cancelled, &a);
  nr_timer_t *tb = nr_loop_schedule(l, NR_MS(10), -(int64_t)NR_MS(10), tick,
                                    tick_cancelled, &b);
  AWAIT_OK(a.done);
  AWAIT_OK(b.done);
  CHECK_EQ(nr_timer_cancel(ta), 0);                   /* from another thread */
  CHECK_EQ(nr_timer_cancel(tb), 0);
  CHECK_EQ(nr_timer_cancel(ta), -EALREADY);
  CHECK(nr_timer_is_cancelled(ta));
  finish(l);
  CHECK_EQ(atomic_load(&a.cancelled), 1);            /* told exactly once */
  CHECK_EQ(atomic_load(&b.cancelled), 1);
  CHECK_GE(atomic_load(&a.fired), 5);
  nr_timer_release(ta);
  nr_timer_release(tb);
  nr_promise_release(a.done);
  nr_promise_release(b.done);
}

TEST(cancel_before_firing_runs_cancel_fn_only) {
  nr_loop_t *l = new_loop("cancel");
  tick_t t = {0};
  nr_timer_t *tm = nr_loop_schedule(l, NR_SEC(10), 0, tick, tick_cancelled, &t);
  CHECK_EQ(nr_timer_cancel(tm), 0);
  finish(l);
  CHECK_EQ(atomic_load(&t.fired), 0);
  CHECK_EQ(atomic_load(&t.cancelled), 1);
  nr_timer_release(tm);
}

/* ---- ordering ------------------------------------------------------------- */

typedef struct order_s {
  nr_loop_t *l;
  char log[16];
  int n;
  nr_promise_t *done;
} order_t;

static int rec_a(void *arg) { order_t *o = arg; o->log[o->n++] = 'A'; return 0; }
static int rec_t(void *arg) {
  order_t *o = arg;
  o->log[o->n++] = 'T';
  nr_promise_set_success(o->done, NULL, NULL);
  return 0;
}
static int rec_first(void *arg) {
  order_t *o = arg;
  o->log[o->n++] = '1';
  nr_loop_after_iteration(o->l, rec_t, o);
  nr_loop_execute(o->l, rec_a, o);
  return 0;
}

TEST(tail_tasks_run_after_the_iteration_tasks) {
  nr_loop_t *l = new_loop("tail");
  order_t o = {.l = l, .done = nr_promise_new()};
  CHECK_EQ(nr_loop_execute(l, rec_first, &o), 0);
  AWAIT_OK(o.done);
  finish(l);
  CHECK_STR(o.log, "1AT");
  nr_promise_release(o.done);
}

typedef struct counter_s {
  long n;                     /* touched only by the loop: serial execution */
} counter_t;

static int incr(void *arg) {
  ((counter_t *)arg)->n++;
  return 0;
}

typedef struct prod_s {
  nr_loop_t *l;
  counter_t *c;
  int n;
} prod_t;

static void *producer(void *arg) {
  prod_t *p = arg;
  for (int i = 0; i < p->n; i++)
    while (nr_loop_execute(p->l, incr, p->c) != 0)
      ;
  return NULL;
}

TEST(many_producers_serial_execution) {
  nr_loop_t *l = new_loop("serial");
  counter_t c = {0};
  pthread_t th[4];
  prod_t p = {l, &c, 50000};
  for (int i = 0; i < 4; i++)
    pthread_create(&th[i], NULL, producer, &p);
  for (int i = 0; i < 4; i++)
    pthread_join(th[i], NULL);
  finish(l);                         /* shutdown runs what was queued */
  CHECK_EQ(c.n, 4 * 50000);
}

/* ---- groups --------------------------------------------------------------- */

static void check_round_robin(int n) {
  nr_group_opts_t o = {.name = "rr", .threads = n};
  nr_group_t *g = nr_group_new(&o);
  CHECK_EQ(nr_group_size(g), n);
  for (int round = 0; round < 3; round++)
    for (int i = 0; i < n; i++)
      CHECK(nr_group_next(g) == nr_group_loop(g, i));
  char want[16];
  snprintf(want, sizeof want, "rr-%d", n);
  CHECK_STR(nr_loop_name(nr_group_loop(g, n - 1)), want);
  CHECK(nr_group_loop(g, n) == NULL);
  SHUTDOWN_GROUP(g);
}

TEST(chooser_round_robin_power_of_two_and_not) {
  check_round_robin(1);
  check_round_robin(4);
  check_round_robin(3);
}
