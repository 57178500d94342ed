/*
 * lfuture.c -- futures and coroutines in Lua: netrun.promise(), the future
 * methods, sync() (which refuses to block an event loop's thread, but
 * blocks an executor group's), netrun.spawn() with await() and
 * netrun.sleep().
 *
 * A future's value is a blob: each state that reads it gets its own copy,
 * but for a future that never left the state that made it (LOCAL: a
 * promise or a spawn's, lhandle.c) and an own-loop submit's, whose value
 * is also kept there: read there, it is the value itself (a table set on
 * a loop and awaited on that loop is the same table).
 * Listeners stay in the state that added them and run on its thread.
 * A spawned coroutine is kept in the registry while it lives; await() adds
 * a listener that resumes it on its own loop.
 */

/***
@module netrun
*/
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "lnr.h"

static nr_promise_t *check(lua_State *L, int idx) {
  return lnr_check_handle(L, idx, LNR_FUTURE);
}

/* A future proxy for a promise; the caller's reference moves to it. Not
 * cached: most futures are made once and dropped (a write's, a submit's),
 * and a promise that comes back through a transfer gets a proxy of its
 * own. */
void lnr_push_promise(lua_State *L, nr_promise_t *p) {
  lnr_push_new_handle(L, LNR_FUTURE, p);
}

/* Once a scheduled future is done its timer has no more to do: cancelled,
 * or a periodic task that raised (which, as in Netty, stops repeating). A
 * one-shot timer that ran is past cancelling, which is harmless. */
static void cancel_timer_on_cancel(nr_promise_t *p, void *arg) {
  (void)p;
  nr_timer_t *t = arg;
  nr_timer_cancel(t);
  nr_timer_release(t);
}

void lnr_push_scheduled(lua_State *L, nr_promise_t *p, nr_timer_t *t) {
  nr_promise_add_listener(p, NULL, cancel_timer_on_cancel, t);
  lnr_push_promise(L, p);
}

/* The loop whose state is L (the main loop for the main state). */
static nr_loop_t *home(lua_State *L) {
  lnr_state_t *S = lnr_state(L);
  return S ? S->loop : NULL;
}

/* ---- completion ------------------------------------------------------------- */

/* The void promise (netrun.void_promise(), Netty's voidPromise): passed
 * where a write or close takes a promise, it asks for no future, and is
 * what the call returns. Setting it does nothing; it cannot be listened to
 * or waited on, since it never completes. */
static nr_promise_t *check_not_void(lua_State *L, int idx, const char *what) {
  nr_promise_t *p = check(L, idx);
  if (nr_promise_is_void(p))
    luaL_error(L, "%s: a void promise never completes (pass a promise of "
               "your own, or none, to get a future)", what);
  return p;
}

/***
The void promise (Netty's voidPromise): `ctx:write(msg, VOID)` or
`ctx:close(VOID)` makes no future and returns it; a failure goes to
`exception_caught`. It never completes: `add_listener`, `sync` and `await`
on it raise; setting it does nothing.
@function void_promise
@treturn future
@usage local VOID = netrun.void_promise()
function H:channel_read(ctx, msg) ctx:write(msg, VOID) end
*/

static int l_void_promise(lua_State *L) {
  lnr_push_handle(L, LNR_FUTURE, nr_promise_void());
  return 1;
}

/***
A future (Netty's Future and Promise in one handle): the outcome of an
operation that completes later -- a write, a connect, a submitted task, a
`promise()` set by hand. Handles may cross states; a value read in another
state is a copy. Listeners run on the thread and in the state that added
them.
@type future
*/

/***
Whether this is the void promise (`void_promise`).
@function future:is_void
@treturn bool
*/

static int l_is_void(lua_State *L) {
  lua_pushboolean(L, nr_promise_is_void(check(L, 1)));
  return 1;
}

static int complete(lua_State *L, bool success, bool try) {
  nr_promise_t *p = check(L, 1);
  int rc;
  if (nr_promise_is_void(p)) {
    if (try)
      lua_pushboolean(L, 0);
    else
      lua_settop(L, 1);
    return 1;
  }
  if (success) {
    lua_settop(L, 2);
    lnr_blob_t *b = lnr_future_is_local(L, 1) ? lnr_keep_result(L, 2)
                                              : lnr_pack(L, 2, 1, "result");
    rc = nr_promise_set_success(p, b, lnr_blob_free_fn);
  } else {
    const char *msg = luaL_tolstring(L, 2, NULL);
    rc = nr_promise_set_failure(p, NR_EHANDLER, msg);
  }
  if (try) {
    lua_pushboolean(L, rc == 0);
    return 1;
  }
  if (rc != 0)
    return luaL_error(L, "promise already completed");
  lua_settop(L, 1);
  return 1;
}

/***
Complete the promise with a value; raises if it is already complete.
@function future:set_success
@param[opt] v the value (copied when read in another state)
@treturn future itself
*/
/***
Fail the promise; raises if it is already complete.
@function future:set_failure
@param err the cause (turned into a string)
@treturn future itself
*/
/***
Complete the promise with a value unless it is complete.
@function future:try_success
@param[opt] v the value
@treturn bool whether this call completed it
*/
/***
Fail the promise unless it is complete.
@function future:try_failure
@param err the cause
@treturn bool whether this call completed it
*/

static int l_set_success(lua_State *L) { return complete(L, true, false); }
static int l_set_failure(lua_State *L) { return complete(L, false, false); }
static int l_try_success(lua_State *L) { return complete(L, true, true); }
static int l_try_failure(lua_State *L) { return complete(L, false, true); }

/*** @section end */

/***
A new promise, bound to the current loop (or the main thread); complete it
with `set_success` / `set_failure`.
@function promise
@treturn future
*/

static int l_promise(lua_State *L) {
  lnr_push_promise(L, nr_promise_new());
  lnr_future_mark_local(L, -1);
  return 1;
}

/* ---- queries ------------------------------------------------------------------ */

/* Run the main thread's queued work, without waiting, when called on the
 * main thread; nothing elsewhere (a loop runs its own). */
static void run_main_work(void) {
  nr_loop_t *m = lnr_main_loop();
  if (m != NULL && nr_loop_current() == m)
    while (nr_loop_has_pending_tasks(m) && nr_loop_run_once(m, 0) > 0)
      ;
}

/* The future at 1 for a query. The main thread is not a loop: the
 * listeners it added (netrun.all's among them) run only when it runs its
 * queued work, so a query of a pending future runs that work first -- a
 * script polling `while not f:is_done() do ... end` sees f complete. One
 * atomic load when nothing is queued. */
static nr_promise_t *check_polled(lua_State *L) {
  nr_promise_t *p = check(L, 1);
  if (!nr_promise_is_done(p))
    run_main_work();
  return p;
}

/***
@type future
*/

/***
Whether the future is complete (succeeded, failed or cancelled). On the
main thread a query first runs the main thread's queued work, so a loop
polling `is_done` sees it complete.
@function future:is_done
@treturn bool
*/

static int l_is_done(lua_State *L) {
  lua_pushboolean(L, nr_promise_is_done(check_polled(L)));
  return 1;
}
/***
Whether the future succeeded.
@function future:is_success
@treturn bool
*/

static int l_is_success(lua_State *L) {
  lua_pushboolean(L, nr_promise_is_success(check_polled(L)));
  return 1;
}
/***
Whether the future was cancelled.
@function future:is_cancelled
@treturn bool
*/

static int l_is_cancelled(lua_State *L) {
  lua_pushboolean(L, nr_promise_is_cancelled(check_polled(L)));
  return 1;
}

/***
The cause of a failed future.
@function future:cause
@treturn string|nil the error message, nil unless the future failed
*/

static int l_cause(lua_State *L) {
  nr_promise_t *p = check_polled(L);
  if (nr_promise_is_done(p) && !nr_promise_is_success(p))
    lua_pushstring(L, nr_promise_message(p));
  else
    lua_pushnil(L);
  return 1;
}

/***
The value of a succeeded future (a copy where it came from another state;
a channel for a server's or a connect's future).
@function future:result
@return the value, nil unless the future succeeded
*/

/* Push the result of a successful future: a copy of a Lua value, a channel
 * (servers and connects complete in the C core), a lookup's addresses, or
 * nil. */
static int l_result(lua_State *L) {
  nr_promise_t *p = check_polled(L);
  void (*kind)(void *) = nr_promise_value_free_fn(p);
  if (!nr_promise_is_success(p) || kind == NULL)
    lua_pushnil(L);
  else if (kind == lnr_blob_free_fn)
    lnr_unpack(L, nr_promise_value(p));
  else if (kind == (void (*)(void *))nr_channel_release)
    lnr_push_handle(L, LNR_CHANNEL, nr_promise_value(p));
  else if (kind == nr_addrs_free)
    lnr_push_addrs(L, nr_promise_value(p));
  else
    lua_pushnil(L);
  return 1;
}

/***
Cancel the future (a scheduled task's: the task does not run, or repeats
no more).
@function future:cancel
@treturn bool whether this call cancelled it
*/

static int l_cancel(lua_State *L) {
  lua_pushboolean(L, nr_promise_cancel(check(L, 1)) == 0);
  return 1;
}

/* ---- listeners ------------------------------------------------------------- */

typedef struct listener_s {
  lnr_state_t *S;
  int fn_ref;       /* the Lua listener, in S's registry */
  int fut_ref;      /* the future proxy, kept so the listener sees it */
} listener_t;

static void run_listener(nr_promise_t *p, void *arg) {
  (void)p;
  listener_t *l = arg;
  lnr_state_t *S = lnr_current_state();
  if (S != l->S || S->closing) {
    free(l);                 /* the state is gone; its refs went with it */
    return;
  }
  lua_State *L = S->L;
  LNR_STACK_BEGIN(L);
  lua_rawgeti(L, LUA_REGISTRYINDEX, l->fn_ref);
  lua_rawgeti(L, LUA_REGISTRYINDEX, l->fut_ref);
  luaL_unref(L, LUA_REGISTRYINDEX, l->fn_ref);
  luaL_unref(L, LUA_REGISTRYINDEX, l->fut_ref);
  if (lnr_pcall(L, 1, 0) != LUA_OK)
    lnr_log_error(L, "a future listener failed");
  LNR_STACK_END(L, 0);
  free(l);
}

/***
Call `fn(f)` once the future is complete (at once, from the loop's queue,
if it is). The listener runs on the thread and in the state that added it;
an error it raises is logged.
@function future:add_listener
@tparam function fn the listener
@treturn future itself
*/

static int l_add_listener(lua_State *L) {
  nr_promise_t *p = check_not_void(L, 1, "add_listener");
  luaL_checktype(L, 2, LUA_TFUNCTION);
  listener_t *l = malloc(sizeof *l);
  if (l == NULL)
    return luaL_error(L, "out of memory");
  l->S = lnr_state(L);
  lua_pushvalue(L, 2);
  l->fn_ref = luaL_ref(L, LUA_REGISTRYINDEX);
  lua_pushvalue(L, 1);
  l->fut_ref = luaL_ref(L, LUA_REGISTRYINDEX);
  /* Freed uncompleted only once this state closed (fut_ref keeps the
   * future until then): its refs went with the state. */
  nr_promise_add_listener_owning(p, home(L), run_listener, l);
  lua_settop(L, 1);
  return 1;
}

/* ---- waiting ----------------------------------------------------------------- */

static int finish_wait(lua_State *L, nr_promise_t *p) {
  if (nr_promise_is_success(p)) {
    lua_settop(L, 1);
    return l_result(L);
  }
  return luaL_error(L, "%s", nr_promise_message(p));
}

/* Blocking on an executor group's thread: the core refuses to wait on any
 * loop thread, so wait on a condition signalled by a listener that runs on
 * the completing thread. The listener touches the waiter only under its
 * lock, so the waiter may leave as soon as it sees `done`. */
typedef struct waiter_s {
  pthread_mutex_t lock;
  pthread_cond_t cond;
  bool done;
} waiter_t;

static void wake_waiter(nr_promise_t *p, void *arg) {
  (void)p;
  waiter_t *w = arg;
  pthread_mutex_lock(&w->lock);
  w->done = true;
  pthread_cond_signal(&w->cond);
  pthread_mutex_unlock(&w->lock);
}

static void wait_blocking(nr_promise_t *p) {
  waiter_t w = {.done = false};
  pthread_mutex_init(&w.lock, NULL);
  pthread_cond_init(&w.cond, NULL);
  nr_promise_add_listener(p, NULL, wake_waiter, &w);
  pthread_mutex_lock(&w.lock);
  while (!w.done)
    pthread_cond_wait(&w.cond, &w.lock);
  pthread_mutex_unlock(&w.lock);
  pthread_cond_destroy(&w.cond);
  pthread_mutex_destroy(&w.lock);
}

/***
Block until the future is complete; its result, or raise its cause. On an
event loop's thread it raises "blocking operation on an event loop" instead
of deadlocking (an executor group's threads may block); the main thread
runs its queued work while it waits.
@function future:sync
@return the result
*/

static int l_sync(lua_State *L) {
  nr_promise_t *p = check_not_void(L, 1, "sync");
  nr_loop_t *cur = nr_loop_current();
  if (!nr_promise_is_done(p)) {
    if (cur != NULL && cur != lnr_main_loop()) {
      if (!lnr_loop_may_block(cur))
        return luaL_error(L, "blocking operation on an event loop (%s): use "
                          "add_listener, or await inside netrun.spawn",
                          nr_loop_name(cur));
      wait_blocking(p);
      return finish_wait(L, p);
    }
    int rc = nr_promise_wait(p, UINT64_MAX);
    if (rc != 0)
      return luaL_error(L, "sync: %s", nr_strerror(rc));
  }
  /* The main thread runs its queued work whenever it waits, even when the
   * future was already done: a listener it added runs before sync returns
   * once the listener was queued. */
  if (cur != NULL && cur == lnr_main_loop())
    while (nr_loop_has_pending_tasks(cur) && nr_loop_run_once(cur, 0) > 0)
      ;                          /* no select (a syscall) when nothing waits */
  return finish_wait(L, p);
}

/* ---- coroutines -------------------------------------------------------------- */

static const char SPAWNED = 0;   /* registry: coroutine -> its promise */

static void step(lua_State *L, lua_State *co, int nargs);

static bool is_spawned(lua_State *L, lua_State *co) {
  lua_rawgetp(L, LUA_REGISTRYINDEX, &SPAWNED);
  lua_pushthread(co);
  lua_xmove(co, L, 1);
  bool yes = lua_rawget(L, -2) != LUA_TNIL;
  lua_pop(L, 2);
  return yes;
}

typedef struct resume_s {
  lnr_state_t *S;
  int co_ref;
} resume_t;

static int resume_task(void *arg);

/* Resume a coroutine parked in await/sleep/yield, on its own loop. */
static void resume_later(nr_promise_t *p, void *arg) {
  (void)p;
  resume_t *r = arg;
  lnr_state_t *S = lnr_current_state();
  if (S != r->S || S->closing) {
    free(r);
    return;
  }
  lua_State *L = S->L;
  lua_rawgeti(L, LUA_REGISTRYINDEX, r->co_ref);
  lua_State *co = lua_tothread(L, -1);
  if (lua_status(co) != LUA_YIELD) {
    /* The future completed between await's check and its listener: the
     * listener runs inline, in park_on, before the coroutine yields.
     * Resume it from a task, which runs after the yield. */
    lua_pop(L, 1);
    if (nr_loop_execute(S->loop, resume_task, r) == 0)
      return;
    luaL_unref(L, LUA_REGISTRYINDEX, r->co_ref);
    free(r);
    return;
  }
  luaL_unref(L, LUA_REGISTRYINDEX, r->co_ref);
  free(r);
  lua_pop(L, 1);                       /* still anchored in SPAWNED */
  step(L, co, 0);
}

static int resume_task(void *arg) {
  resume_later(NULL, arg);
  return 0;
}

static resume_t *parking(lua_State *L, lua_State *co) {
  resume_t *r = malloc(sizeof *r);
  if (r == NULL)
    luaL_error(L, "out of memory");
  r->S = lnr_state(L);
  lua_pushthread(co);
  if (co != L)
    lua_xmove(co, L, 1);
  r->co_ref = luaL_ref(L, LUA_REGISTRYINDEX);
  return r;
}

static void finish_spawn(lua_State *L, lua_State *co, bool ok) {
  lua_rawgetp(L, LUA_REGISTRYINDEX, &SPAWNED);
  lua_pushthread(co);
  lua_xmove(co, L, 1);
  lua_pushvalue(L, -1);
  lua_rawget(L, -3);
  nr_promise_t *p = lnr_to_handle(L, -1, LNR_FUTURE);
  bool local = p != NULL && lnr_future_is_local(L, -1);
  lua_pop(L, 1);
  lua_pushnil(L);
  lua_rawset(L, -3);                   /* forget the coroutine */
  lua_pop(L, 1);
  if (p == NULL)
    return;
  if (ok) {
    lnr_blob_t *b = NULL;
    lua_settop(co, lua_gettop(co) > 0 ? 1 : 0);
    if (lua_gettop(co) == 0)
      lua_pushnil(co);
    if (lnr_try_pack(co, -1, local, &b))
      nr_promise_set_success(p, b, lnr_blob_free_fn);
    else
      nr_promise_set_failure(p, NR_EHANDLER, lua_tostring(co, -1));
  } else {
    const char *msg = lua_tostring(co, -1);
    luaL_traceback(L, co, msg ? msg : "(error object is not a string)", 0);
    nr_promise_set_failure(p, NR_EHANDLER, lua_tostring(L, -1));
    nr_log(NR_LOG_DEBUG, "a spawned coroutine failed: %s", lua_tostring(L, -1));
    lua_pop(L, 1);
  }
}

/* The marker await/sleep yield with, so step() knows a listener will
 * resume the coroutine. Any other yield is a cooperative one. */
static const char PARKED = 0;

static void step(lua_State *L, lua_State *co, int nargs) {
  int nres = 0;
  lnr_state_t *S = lnr_state(L);
  if (S)
    S->resuming++;                      /* the memory limit applies */
  int st = lnr_resume(S, co, L, nargs, &nres);
  if (S)
    S->resuming--;
  if (st == LUA_YIELD) {
    bool parked = nres == 1 && lua_touserdata(co, -1) == &PARKED;
    lua_pop(co, nres);
    if (!parked) {                      /* coroutine.yield(): run again soon */
      resume_t *r = parking(L, co);
      if (nr_loop_execute(home(L), resume_task, r) < 0) {
        luaL_unref(L, LUA_REGISTRYINDEX, r->co_ref);
        free(r);
      }
    }
    return;
  }
  finish_spawn(L, co, st == LUA_OK);
}

/*** @section end */

/***
Run `fn(...)` as a coroutine on the current loop (or the main thread).
Inside it `future:await` and `sleep` suspend the coroutine, not the loop.
@function spawn
@tparam function fn the coroutine's body
@param ... its arguments
@treturn future of fn's first result, failed by its error
@usage netrun.spawn(function()
  local ch = netrun.connect { host = "127.0.0.1", port = 7000 }:await()
end)
*/

static int l_spawn(lua_State *L) {
  luaL_checktype(L, 1, LUA_TFUNCTION);
  int n = lua_gettop(L);
  lua_State *co = lua_newthread(L);
  nr_promise_t *p = nr_promise_new();
  lnr_push_promise(L, p);               /* result: the future */
  lnr_future_mark_local(L, -1);
  int fut = lua_gettop(L);
  if (lua_rawgetp(L, LUA_REGISTRYINDEX, &SPAWNED) != LUA_TTABLE) {
    lua_pop(L, 1);
    lua_newtable(L);
    lua_pushvalue(L, -1);
    lua_rawsetp(L, LUA_REGISTRYINDEX, &SPAWNED);
  }
  lua_pushvalue(L, n + 1);              /* the coroutine */
  lua_pushvalue(L, fut);
  lua_rawset(L, -3);
  lua_pop(L, 1);
  for (int i = 1; i <= n; i++)
    lua_pushvalue(L, i);
  lua_xmove(L, co, n);                  /* fn and its arguments */
  step(L, co, n - 1);
  lua_pushvalue(L, fut);
  return 1;
}

/* In a spawned coroutine: park until p completes. */
static int await_k(lua_State *L, int status, lua_KContext ctx) {
  (void)status;
  (void)ctx;
  return finish_wait(L, check(L, 1));
}

static int park_on(lua_State *L, nr_promise_t *p) {
  lua_State *main = lnr_state(L)->L;
  resume_t *r = parking(main, L);
  nr_promise_add_listener_owning(p, home(L), resume_later, r);  /* a promise
                         that never completes (netrun.sleep at a shutdown) */
  lua_pushlightuserdata(L, (void *)&PARKED);
  return lua_yieldk(L, 1, 0, await_k);
}

/***
@type future
*/

/***
Inside `spawn`: suspend the coroutine until the future is complete, then
return its result or raise its cause. Outside a spawned coroutine: as `sync`.
@function future:await
@return the result
*/

static int l_await(lua_State *L) {
  nr_promise_t *p = check_not_void(L, 1, "await");
  lua_settop(L, 1);
  if (nr_promise_is_done(p))
    return finish_wait(L, p);
  if (!lua_isyieldable(L) || !is_spawned(lnr_state(L)->L, L))
    return l_sync(L);
  return park_on(L, p);
}

static int complete_task(void *arg) {
  nr_promise_set_success(arg, NULL, NULL);
  nr_promise_release(arg);
  return 0;
}

static int cancel_task(void *arg) {
  nr_promise_release(arg);
  return 0;
}

/*** @section end */

/***
Inside `spawn`: suspend the coroutine for `seconds`; raises outside one.
@function sleep
@number seconds how long
*/

static int l_sleep(lua_State *L) {
  double s = lnr_checkseconds(L, 1, "netrun.sleep");
  lnr_state_t *S = lnr_state(L);
  if (!lua_isyieldable(L) || !is_spawned(S->L, L))
    return luaL_error(L, "netrun.sleep: only inside netrun.spawn");
  nr_promise_t *p = nr_promise_new();
  nr_timer_t *t = nr_loop_schedule_ref(home(L), lnr_ns(s), 0, complete_task,
                                       cancel_task, nr_promise_retain(p));
  if (t == NULL) {
    nr_promise_release(p);
    nr_promise_release(p);
    return luaL_error(L, "netrun.sleep: the loop is shut down");
  }
  nr_timer_release(t);
  lnr_push_promise(L, p);              /* keep it alive while parked */
  lua_replace(L, 1);
  lua_settop(L, 1);
  return park_on(L, check(L, 1));
}

/* core.park() / core.unpark(co, ...): suspend a spawned coroutine until
 * Lua code that tracks it resumes it, with no promise in between (no
 * allocation, no listener, no registry reference): the waits of
 * netrun.redis, which keeps its waiting coroutines in queues of its own
 * and wakes each exactly once. park() returns unpark's extra arguments.
 * unpark resumes co at once, on the caller's thread (as a promise's
 * listener would), and returns true; false if co is not parked by park
 * (parked in await or sleep, running, dead), which it leaves alone. */
static const char PARKED_BY_PARK = 0;  /* registry: coroutine -> true */

static int park_k(lua_State *L, int status, lua_KContext ctx) {
  (void)status;
  (void)ctx;
  return lua_gettop(L);                /* what unpark passed */
}

static void parked_mark(lua_State *L, lua_State *co, bool on) {
  if (lua_rawgetp(L, LUA_REGISTRYINDEX, &PARKED_BY_PARK) != LUA_TTABLE) {
    lua_pop(L, 1);
    lua_newtable(L);
    lua_pushvalue(L, -1);
    lua_rawsetp(L, LUA_REGISTRYINDEX, &PARKED_BY_PARK);
  }
  lua_pushthread(co);
  if (co != L)
    lua_xmove(co, L, 1);
  if (on)
    lua_pushboolean(L, 1);
  else
    lua_pushnil(L);
  lua_rawset(L, -3);
  lua_pop(L, 1);
}

static int l_park(lua_State *L) {
  lnr_state_t *S = lnr_state(L);
  if (!lua_isyieldable(L) || S == NULL || !is_spawned(S->L, L))
    return luaL_error(L, "netrun: park: only inside netrun.spawn");
  parked_mark(L, L, true);
  lua_settop(L, 0);
  lua_pushlightuserdata(L, (void *)&PARKED);
  return lua_yieldk(L, 1, 0, park_k);
}

static int l_unpark(lua_State *L) {
  lua_State *co = lua_tothread(L, 1);
  luaL_argexpected(L, co != NULL, 1, "coroutine");
  lua_rawgetp(L, LUA_REGISTRYINDEX, &PARKED_BY_PARK);
  lua_pushvalue(L, 1);
  bool parked = lua_istable(L, -2) && lua_rawget(L, -2) == LUA_TBOOLEAN;
  lua_pop(L, 2);
  if (!parked || lua_status(co) != LUA_YIELD) {
    lua_pushboolean(L, 0);
    return 1;
  }
  parked_mark(L, co, false);
  int n = lua_gettop(L) - 1;
  lua_xmove(L, co, n);
  step(L, co, n);
  lua_settop(L, 0);
  lua_pushboolean(L, 1);
  return 1;
}

static int l_tostring(lua_State *L) {
  nr_promise_t *p = check(L, 1);
  const char *st = nr_promise_is_void(p)       ? "void"
                   : !nr_promise_is_done(p)    ? "pending"
                   : nr_promise_is_success(p)  ? "success"
                   : nr_promise_is_cancelled(p) ? "cancelled"
                                               : "failure";
  lua_pushfstring(L, "netrun.future(%s)", st);
  return 1;
}

static void open_future(lua_State *L) {
  static const luaL_Reg methods[] = {
      {"set_success", l_set_success}, {"set_failure", l_set_failure},
      {"try_success", l_try_success}, {"try_failure", l_try_failure},
      {"is_done", l_is_done}, {"is_success", l_is_success},
      {"is_cancelled", l_is_cancelled}, {"cause", l_cause},
      {"result", l_result}, {"cancel", l_cancel},
      {"add_listener", l_add_listener}, {"sync", l_sync}, {"await", l_await},
      {"is_void", l_is_void}, {NULL, NULL}};
  static const luaL_Reg meta[] = {{"__tostring", l_tostring}, {NULL, NULL}};
  lnr_new_class(L, lnr_kind_names[LNR_FUTURE], methods, meta);
  lnr_handle_class(L, LNR_FUTURE);
  static const luaL_Reg funcs[] = {{"promise", l_promise},
                                   {"spawn", l_spawn},
                                   {"sleep", l_sleep},
                                   {"void_promise", l_void_promise},
                                   {"park", l_park},
                                   {"unpark", l_unpark},
                                   {NULL, NULL}};
  luaL_setfuncs(L, funcs, 0);
}

lnr_module_t lnr_future_module = {.name = "future", .open = open_future};
