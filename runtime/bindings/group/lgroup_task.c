/*
 * lgroup_task.c -- sending work to groups and loops from Lua: execute,
 * submit, after_iteration and the three schedules, their functions and
 * arguments transferred to the target loop's state (or kept, for the
 * caller's own loop), their results transferred back as futures.
 *
 * Threads: the sender's (any state's) packs the task; the target loop's
 * thread runs it (lua_task, sched_fire) and completes its promise, whose
 * listeners run where they were added. A loop that sends a task elsewhere
 * is owed its outcome (owed_to) until it has run.
 */

/***
@module netrun
*/
#include <errno.h>
#include <stdlib.h>

#include "lgroup.h"
#include "lmain.h"

/* ---- sending work -------------------------------------------------------- */

static lnr_state_t *state_of_loop(nr_loop_t *l) { return nr_loop_data(l); }

lnr_state_t *lnr_current_state(void) {
  nr_loop_t *l = nr_loop_current();
  return l ? state_of_loop(l) : NULL;
}

/* Runs a packed (fn, args...) on its loop; completes the blob's promise
 * (user) with the first result, or fails it with the error. */
static int lua_task(void *arg) {
  lnr_blob_t *b = arg;
  nr_promise_t *p = b->user;
  lnr_state_t *S = lnr_current_state();
  if (S == NULL || S->closing) {
    if (p)
      nr_promise_set_failure(p, NR_EREJECTED, "the loop's Lua state is gone");
  } else {
    lua_State *L = S->L;
    int top = lua_gettop(L);
    LNR_STACK_BEGIN(L);
    int rc = lnr_run_packed(L, b, p ? 1 : 0);
    if (rc != LUA_OK) {
      if (p)
        nr_promise_set_failure(p, NR_EHANDLER, lua_tostring(L, -1));
      else
        nr_log(NR_LOG_ERROR, "a task failed: %s", lua_tostring(L, -1));
    } else if (p) {
      lnr_blob_t *r = NULL;
      /* an own-loop submit's result is kept too (its caller is here) */
      if (lnr_try_pack(L, -1, b->kept != 0, &r))   /* may not transfer */
        nr_promise_set_success(p, r, lnr_blob_free_fn);
      else
        nr_promise_set_failure(p, NR_EHANDLER, lua_tostring(L, -1));
    }
    LNR_STACK_END(L, rc != LUA_OK || p ? 1 : 0);    /* error, or result */
    lua_settop(L, top);
  }
  if (p)
    nr_promise_release(p);
  if (b->owed != NULL)        /* after the listeners' tasks were queued */
    nr_loop_unhold(b->owed);
  lnr_blob_free(b);
  return 0;
}

static int try_pack_p(lua_State *L) {
  lnr_blob_t **out = lua_touserdata(L, 2);
  *out = lua_toboolean(L, 3) ? lnr_pack_result(L, 1)
                             : lnr_pack(L, 1, 1, "result");
  return 0;
}

int lnr_try_pack(lua_State *L, int idx, bool keep, lnr_blob_t **out) {
  idx = lua_absindex(L, idx);
  int t = lua_type(L, idx);
  if (t == LUA_TNIL || t == LUA_TBOOLEAN || t == LUA_TNUMBER ||
      t == LUA_TSTRING) {
    *out = lnr_pack(L, idx, 1, "result");   /* cannot fail: no pcall */
    return 1;
  }
  lua_pushcfunction(L, try_pack_p);
  lua_pushvalue(L, idx);
  lua_pushlightuserdata(L, out);
  lua_pushboolean(L, keep);
  if (lua_pcall(L, 3, 0, 0) != LUA_OK)
    return 0;                    /* the message is on the stack */
  return 1;
}

/* Raise the error of a task the loop refused (NR_EFULL or NR_EREJECTED). */
static int reject(lua_State *L, nr_loop_t *loop, int rc) {
  lnr_group_t *g = lnr_group_of_loop(loop);
  if (rc == NR_EFULL && g != NULL)
    return luaL_error(L, "%s: task queue full (max_pending_tasks = %I): "
                      "task rejected", nr_loop_name(loop),
                      (lua_Integer)g->max_pending);
  return luaL_error(L, "%s: loop is shut down: task rejected",
                    nr_loop_name(loop));
}

/* A loop that sends a task elsewhere is owed its outcome (a future's
 * listeners, what the task queues back to it): a graceful shutdown of
 * the loop waits for it, and it keeps the loop alive (nr_loop_hold). The
 * main thread is not a loop that shuts down, and a task it sends keeps
 * the process alive by itself -- unless it goes to a daemon group, which
 * keeps nothing alive: then the main thread is owed it too. */
static nr_loop_t *owed_to(nr_loop_t *target) {
  nr_loop_t *from = nr_loop_current();
  if (from == NULL || from == target)
    return NULL;
  if (from != lnr_main_loop())
    return from;
  lnr_group_t *g = lnr_group_of_loop(target);
  return g != NULL && g->daemon ? from : NULL;
}

void lnr_send_task(lua_State *L, nr_loop_t *loop, lnr_blob_t *b,
                   nr_promise_t *p) {
  b->user = p ? nr_promise_retain(p) : NULL;
  b->task.fn = lua_task;
  b->task.arg = b;
  b->owed = owed_to(loop);
  if (b->owed != NULL)
    nr_loop_hold(b->owed);
  int rc = nr_loop_execute_task(loop, &b->task);
  if (rc < 0) {
    if (p)
      nr_promise_release(p);
    if (b->owed != NULL)
      nr_loop_unhold(b->owed);
    lnr_blob_free(b);
    reject(L, loop, rc);
  }
}

/* Loop of a group or loop handle at idx 1: next() for groups. */
static nr_loop_t *target_loop(lua_State *L) {
  lnr_group_t *g = lnr_to_handle(L, 1, LNR_GROUP);
  if (g)
    return nr_group_next(g->g);
  return lnr_check_handle(L, 1, LNR_LOOP);
}

/* A task for the caller's own loop, given as that loop (ctx:loop(),
 * netrun.current()), crosses nothing (DESIGN.md §3): its function runs as
 * the same closure and may capture ctx. Any other is copied -- a group's
 * next() included, so that a task does not change meaning with the loop
 * it happens to land on. */
static lnr_blob_t *pack_task(lua_State *L, int from, int n, const char *what) {
  nr_loop_t *loop = lnr_to_handle(L, 1, LNR_LOOP);
  lnr_state_t *S = lnr_state(L);
  if (loop && S && !S->main && S->loop == loop && nr_loop_in_thread(loop))
    return lnr_keep(L, from, n);
  return lnr_pack(L, from, n, what);
}

/***
A group of event loops or executors, made by `group` or `executor_group`.
`#g` is its number of loops. Work sent to a group goes to `g:next()`;
functions and arguments are copied into the loop's state (as the `netrun` module says of values).
@type group
*/

/***
Run `fn(...)` on the next loop. `fn` and its arguments are copied to that
loop's state; an error it raises is logged. Past `max_pending_tasks`
queued, raises (Netty's RejectedExecutionException); after shutdown, raises.
@function group:execute
@tparam function fn the task
@param ... its arguments
*/

int lnr_l_execute(lua_State *L) {
  nr_loop_t *loop = target_loop(L);
  luaL_checktype(L, 2, LUA_TFUNCTION);
  lnr_blob_t *b = pack_task(L, 2, lua_gettop(L) - 1, "execute");
  lnr_send_task(L, loop, b, NULL);
  return 0;
}

/***
Run `fn(...)` on the next loop; a future of its first result (copied
back), failed by its error.
@function group:submit
@tparam function fn the task
@param ... its arguments
@treturn future of fn's first result
*/

int lnr_l_submit(lua_State *L) {
  nr_loop_t *loop = target_loop(L);
  luaL_checktype(L, 2, LUA_TFUNCTION);
  lnr_blob_t *b = pack_task(L, 2, lua_gettop(L) - 1, "submit");
  nr_promise_t *p = nr_promise_new();
  lnr_push_promise(L, p);                    /* takes the reference */
  lnr_send_task(L, loop, b, p);
  return 1;
}

/* after_iteration: a tail task, run after the loop's current iteration. */
static int tail_task(void *arg) {
  return lua_task(arg);
}

int lnr_l_after_iteration(lua_State *L) {
  nr_loop_t *loop = lnr_check_handle(L, 1, LNR_LOOP);
  luaL_checktype(L, 2, LUA_TFUNCTION);
  lnr_blob_t *b = pack_task(L, 2, lua_gettop(L) - 1, "after_iteration");
  b->user = NULL;
  int rc = nr_loop_after_iteration(loop, tail_task, b);
  if (rc < 0) {
    lnr_blob_free(b);
    return reject(L, loop, rc);
  }
  return 0;
}

/* ---- scheduling --------------------------------------------------------------- */

typedef struct sched_s {
  lnr_blob_t *b;
  nr_promise_t *p;
  bool periodic;
} sched_t;

static int sched_fire(void *arg) {
  sched_t *s = arg;
  lnr_state_t *S = lnr_current_state();
  if (S == NULL || S->closing)
    return 0;
  lua_State *L = S->L;
  int top = lua_gettop(L);
  LNR_STACK_BEGIN(L);
  if (lnr_run_packed(L, s->b, 1) != LUA_OK) {
    if (s->periodic)
      nr_log(NR_LOG_ERROR, "a scheduled task failed: %s", lua_tostring(L, -1));
    nr_promise_set_failure(s->p, NR_EHANDLER, lua_tostring(L, -1));
  } else if (!s->periodic) {
    lnr_blob_t *r = NULL;
    if (lnr_try_pack(L, -1, s->b->kept != 0, &r))
      nr_promise_set_success(s->p, r, lnr_blob_free_fn);
    else
      nr_promise_set_failure(s->p, NR_EHANDLER, lua_tostring(L, -1));
  }
  LNR_STACK_END(L, 1);                   /* the result, or the error */
  lua_settop(L, top);
  if (!s->periodic) {
    nr_promise_release(s->p);
    lnr_blob_free(s->b);
    free(s);
  }
  return 0;
}

static int sched_cancelled(void *arg) {
  sched_t *s = arg;
  nr_promise_cancel(s->p);
  nr_promise_release(s->p);
  lnr_blob_free(s->b);
  free(s);
  return 0;
}


static int schedule(lua_State *L, int nargs_before_fn, double delay,
                    int64_t period) {
  nr_loop_t *loop = target_loop(L);
  int fn = 2 + nargs_before_fn;
  luaL_checktype(L, fn, LUA_TFUNCTION);
  sched_t *s = calloc(1, sizeof *s);
  if (s == NULL)
    return luaL_error(L, "out of memory");
  s->b = pack_task(L, fn, lua_gettop(L) - fn + 1, "schedule");
  s->periodic = period != 0;
  s->p = nr_promise_new();
  /* The caller's reference, taken first: a short delay may fire (and
   * free s) on the loop's thread before nr_loop_schedule returns. */
  nr_promise_t *p = nr_promise_retain(s->p);
  nr_timer_t *t = nr_loop_schedule_ref(loop, lnr_ns(delay), period,
                                       sched_fire, sched_cancelled, s);
  if (t == NULL) {                  /* rejected: cancel_fn is not called */
    nr_promise_release(p);
    nr_promise_release(s->p);
    lnr_blob_free(s->b);
    free(s);
    return reject(L, loop, errno == EAGAIN ? NR_EFULL : NR_EREJECTED);
  }
  lnr_push_scheduled(L, p, t);
  return 1;
}

/* The two repeating schedules: `initial` and then `every` seconds (> 0,
 * `every` named as the method's doc names it), its sign the kind of
 * repetition as nr_loop_schedule takes it (+: a fixed rate, from start
 * times; -: a fixed delay, from each run's end). */
static int repeating(lua_State *L, const char *method, const char *every,
                     int sign) {
  double d = lnr_checkseconds(L, 2, method);
  double p = lnr_checkseconds(L, 3, method);
  if (p <= 0)
    return luaL_error(L, "%s: %s must be > 0", method, every);
  return schedule(L, 2, d, sign * (int64_t)lnr_ns(p));
}

/***
Run `fn(...)` once after `delay` seconds, on the next loop.
@function group:schedule
@number delay seconds (0: as soon as possible)
@tparam function fn the task
@param ... its arguments
@treturn future of fn's first result; `cancel()` it to cancel the task
*/

int lnr_l_schedule(lua_State *L) {
  double d = lnr_checkseconds(L, 2, "schedule");
  return schedule(L, 1, d, 0);
}

/***
Run `fn(...)` after `initial` seconds, then every `period` seconds from
its start times (Netty's scheduleAtFixedRate). A run that raises is logged
and stops the repetition.
@function group:schedule_at_fixed_rate
@number initial seconds before the first run
@number period seconds between starts (> 0)
@tparam function fn the task
@param ... its arguments
@treturn future that completes only when cancelled or failed; `cancel()` stops it
*/

int lnr_l_fixed_rate(lua_State *L) {
  return repeating(L, "schedule_at_fixed_rate", "period", 1);
}

/***
Run `fn(...)` after `initial` seconds, then again `delay` seconds after
each run ends (Netty's scheduleWithFixedDelay).
@function group:schedule_with_fixed_delay
@number initial seconds before the first run
@number delay seconds between a run's end and the next start (> 0)
@tparam function fn the task
@param ... its arguments
@treturn future that completes only when cancelled or failed; `cancel()` stops it
*/

int lnr_l_fixed_delay(lua_State *L) {
  return repeating(L, "schedule_with_fixed_delay", "delay", -1);
}
