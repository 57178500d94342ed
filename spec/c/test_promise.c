/*
 * test_promise.c -- promises: completion once, listeners on the loop they
 * asked for, waits that refuse to block a loop, the main thread's external
 * loop.
 */
#include "test.h"

static void free_str(void *s) { free(s); }

TEST(completes_once) {
  nr_promise_t *p = nr_promise_new();
  CHECK(!nr_promise_is_done(p));
  CHECK_EQ(nr_promise_set_success(p, strdup("v"), free_str), 0);
  CHECK_EQ(nr_promise_set_success(p, strdup("w"), free_str), -EALREADY);
  CHECK_EQ(nr_promise_set_failure(p, -EIO, "no"), -EALREADY);
  CHECK_EQ(nr_promise_cancel(p), -EALREADY);
  CHECK(nr_promise_is_success(p));
  CHECK_STR(nr_promise_value(p), "v");
  CHECK_EQ(nr_promise_code(p), 0);
  nr_promise_release(p);

  nr_promise_t *f = nr_promise_new();
  CHECK_EQ(nr_promise_set_failure(f, -ECONNREFUSED, "127.0.0.1:1: refused"), 0);
  CHECK(nr_promise_is_done(f) && !nr_promise_is_success(f));
  CHECK_EQ(nr_promise_code(f), -ECONNREFUSED);
  CHECK_STR(nr_promise_message(f), "127.0.0.1:1: refused");
  nr_promise_release(f);

  nr_promise_t *c = nr_promise_new();
  CHECK_EQ(nr_promise_cancel(c), 0);
  CHECK(nr_promise_is_cancelled(c));
  CHECK_EQ(nr_promise_code(c), NR_ECANCELLED);
  nr_promise_release(c);
}

typedef struct seen_s {
  nr_loop_t *want;
  _Atomic int calls, on_right_loop;
  nr_promise_t *done;
} seen_t;

static void listener(nr_promise_t *p, void *arg) {
  seen_t *s = arg;
  CHECK(nr_promise_is_done(p));
  atomic_fetch_add(&s->calls, 1);
  if (nr_loop_current() == s->want)
    atomic_fetch_add(&s->on_right_loop, 1);
  if (s->done)
    nr_promise_set_success(s->done, NULL, NULL);
}

static int complete_it(void *arg) {
  nr_promise_set_success(arg, NULL, NULL);
  return 0;
}

TEST(listeners_run_once_on_the_loop_they_asked_for) {
  nr_group_t *g = nr_group_new(&(nr_group_opts_t){.name = "l", .threads = 2});
  nr_loop_t *a = nr_group_loop(g, 0), *b = nr_group_loop(g, 1);
  nr_promise_t *p = nr_promise_new();
  seen_t s = {.want = a, .done = nr_promise_new()};
  CHECK_EQ(nr_promise_add_listener(p, a, listener, &s), 0);
  CHECK_EQ(nr_loop_execute(b, complete_it, p), 0);   /* completed on b */
  AWAIT_OK(s.done);
  CHECK_EQ(atomic_load(&s.calls), 1);
  CHECK_EQ(atomic_load(&s.on_right_loop), 1);
  /* Added after completion: still runs, once, on its loop. */
  seen_t late = {.want = b, .done = nr_promise_new()};
  CHECK_EQ(nr_promise_add_listener(p, b, listener, &late), 0);
  AWAIT_OK(late.done);
  CHECK_EQ(atomic_load(&late.on_right_loop), 1);
  /* With no loop: on the completing thread, here the main one. */
  seen_t here = {.want = NULL};
  nr_promise_t *q = nr_promise_new();
  nr_promise_add_listener(q, NULL, listener, &here);
  nr_promise_set_success(q, NULL, NULL);
  CHECK_EQ(atomic_load(&here.calls), 1);
  CHECK_EQ(atomic_load(&here.on_right_loop), 1);
  SHUTDOWN_GROUP(g);
  CHECK_EQ(atomic_load(&s.calls), 1);
  nr_promise_release(p);
  nr_promise_release(q);
  nr_promise_release(s.done);
  nr_promise_release(late.done);
}

/* A listener asked to run on a loop whose group is shut down and freed
 * before the promise completes: the loop's memory outlives the free while
 * the listener refers to it; the loop refuses the task and the listener
 * runs on the completing thread (ASan: no use after free). */
TEST(listener_on_a_loop_freed_before_completion) {
  nr_group_t *g = nr_group_new(&(nr_group_opts_t){.name = "gone", .threads = 1});
  nr_loop_t *a = nr_group_loop(g, 0);
  nr_promise_t *started = nr_promise_new();
  CHECK_EQ(nr_loop_execute(a, complete_it, started), 0);  /* its thread runs */
  AWAIT_OK(started);
  nr_promise_release(started);
  nr_promise_t *p = nr_promise_new();
  seen_t s = {.want = NULL};
  CHECK_EQ(nr_promise_add_listener(p, a, listener, &s), 0);
  SHUTDOWN_GROUP(g);                       /* a is freed here */
  nr_promise_set_success(p, NULL, NULL);   /* the listener's loop is gone */
  CHECK_EQ(atomic_load(&s.calls), 1);
  nr_promise_release(p);
}

static void free_arg(nr_promise_t *p, void *arg) {
  (void)p;
  free(arg);
}

/* An owning listener's arg: freed by the listener once it runs, or with
 * the promise when that is released without completing (ASan: no leak,
 * no double free). */
TEST(owning_listener_arg_freed_either_way) {
  nr_promise_t *never = nr_promise_new();
  CHECK_EQ(nr_promise_add_listener_owning(never, NULL, free_arg, malloc(16)), 0);
  nr_promise_release(never);
  nr_promise_t *done = nr_promise_new();
  CHECK_EQ(nr_promise_add_listener_owning(done, NULL, free_arg, malloc(16)), 0);
  nr_promise_set_success(done, NULL, NULL);
  nr_promise_release(done);
}

typedef struct blk_s {
  nr_promise_t *pending, *result;
} blk_t;

static int try_block(void *arg) {
  blk_t *b = arg;
  int rc = nr_promise_wait(b->pending, NR_SEC(5));
  nr_promise_set_success(b->result, (void *)(intptr_t)rc, NULL);
  return 0;
}

TEST(wait_on_a_loop_thread_refuses_instead_of_deadlocking) {
  nr_group_t *g = nr_group_new(&(nr_group_opts_t){.name = "w", .threads = 1});
  blk_t b = {nr_promise_new(), nr_promise_new()};
  uint64_t t0 = nr_now();
  nr_loop_execute(nr_group_next(g), try_block, &b);
  AWAIT_OK(b.result);
  CHECK_EQ((intptr_t)nr_promise_value(b.result), NR_EDEADLOCK);
  CHECK_LT(nr_now() - t0, NR_SEC(1));
  CHECK_STR(nr_strerror(NR_EDEADLOCK), "blocking operation on an event loop");
  SHUTDOWN_GROUP(g);
  nr_promise_release(b.pending);
  nr_promise_release(b.result);
}

TEST(wait_times_out) {
  nr_promise_t *p = nr_promise_new();
  uint64_t t0 = nr_now();
  CHECK_EQ(nr_promise_wait(p, NR_MS(50)), NR_ETIMEDOUT);
  CHECK_GE(nr_now() - t0, NR_MS(50));
  nr_promise_release(p);
}

/* The main thread owns an external loop: listeners sent to it run while it
 * waits, so a reply routed through it cannot deadlock. */
typedef struct relay_s {
  nr_loop_t *main;
  nr_promise_t *inner, *outer;
  _Atomic int ran_on_main;
} relay_t;

static void relay(nr_promise_t *p, void *arg) {
  (void)p;
  relay_t *r = arg;
  atomic_store(&r->ran_on_main, nr_loop_current() == r->main);
  nr_promise_set_success(r->outer, NULL, NULL);
}

static int start_relay(void *arg) {
  relay_t *r = arg;
  nr_promise_add_listener(r->inner, r->main, relay, r);
  nr_promise_set_success(r->inner, NULL, NULL);
  return 0;
}

TEST(external_loop_runs_its_tasks_while_waiting) {
  nr_loop_t *m = nr_loop_new(&(nr_loop_opts_t){.name = "main", .external = true});
  CHECK(nr_loop_current() == m);
  nr_group_t *g = nr_group_new(&(nr_group_opts_t){.name = "x", .threads = 1});
  relay_t r = {.main = m, .inner = nr_promise_new(), .outer = nr_promise_new()};
  nr_loop_execute(nr_group_next(g), start_relay, &r);
  AWAIT_OK(r.outer);
  CHECK_EQ(atomic_load(&r.ran_on_main), 1);
  SHUTDOWN_GROUP(g);
  nr_loop_free(m);
  CHECK(nr_loop_current() == NULL);
  nr_promise_release(r.inner);
  nr_promise_release(r.outer);
}
