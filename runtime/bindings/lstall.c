/*
 * lstall.c -- the Lua side of the stall watchdog (runtime/stall.c,
 * DESIGN.md §8.4): the group options stall_threshold and stall_timeout,
 * and the hook that describes or interrupts a stuck Lua call.
 *
 * A lua_State is never read from the watchdog's thread. The watchdog only
 * leaves a request in the state's context and sets a count hook on the
 * state with lua_sethook -- the one Lua call made to be called
 * asynchronously (lua.c calls it from a signal handler): it stores the hook
 * and marks the running frames. The loop thread then runs the hook at its
 * next Lua instruction: it removes the hook, and if the request is for the
 * run still going on (its mark), logs the traceback of the code running
 * there, or raises "stalled for N s", which the handler's protected call
 * routes to exception_caught (or a task's error log). A stall in C code
 * gets no hook call in time, and the watchdog describes it instead.
 *
 * Known limit: the hook is set on the state's main thread; code stuck
 * inside a coroutine is described by the watchdog, without a traceback.
 */
#include <stdio.h>

#include "lnr.h"

static void stall_hook(lua_State *L, lua_Debug *ar) {
  (void)ar;
  lua_sethook(L, NULL, 0, 0);            /* first: a new request sets it again */
  lnr_state_t *S = lnr_state(L);
  if (S == NULL || S->loop == NULL)
    return;
  unsigned req = atomic_exchange(&S->stall_req, 0);
  uint64_t mark = atomic_load(&S->stall_mark);
  if (req == 0 || nr_loop_stall_mark(S->loop) != mark)
    return;                              /* that run is over */
  double busy = (double)atomic_load(&S->stall_busy) / 1e9;
  if ((req & NR_STALL_REPORT) && nr_loop_stall_claim(S->loop, mark)) {
    luaL_traceback(L, L, NULL, 0);
    nr_log(NR_LOG_WARN, "%s: stalled: one run has lasted %.1f s, in Lua:\n%s",
           nr_loop_name(S->loop), busy, lua_tostring(L, -1));
    lua_pop(L, 1);
  }
  if (req & NR_STALL_INTERRUPT) {
    char msg[64];                  /* lua_pushfstring has no %.1f */
    snprintf(msg, sizeof msg, "stalled for %.1f s", busy);
    luaL_where(L, 0);                    /* the code that was stuck */
    lua_pushstring(L, msg);
    lua_concat(L, 2);
    lua_error(L);
  }
}

/* On the watchdog thread, while the loop runs (see nr_stall_fn). */
static bool on_stall(nr_loop_t *loop, int what, uint64_t busy_ns, uint64_t mark,
                     void *ud) {
  (void)ud;
  lnr_state_t *S = nr_loop_data(loop);
  if (S == NULL || S->L == NULL)
    return false;
  atomic_store(&S->stall_busy, busy_ns);
  atomic_store(&S->stall_mark, mark);
  atomic_fetch_or(&S->stall_req, (unsigned)what);
  lua_sethook(S->L, stall_hook, LUA_MASKCOUNT, 1);
  return true;
}

static uint64_t opt_seconds(lua_State *L, int t, const char *key,
                            const char *what, double dflt) {
  double s = dflt;
  if (t != 0 && lua_getfield(L, t, key) != LUA_TNIL) {
    if (!lua_isnumber(L, -1))
      luaL_error(L, "%s: %s must be a number of seconds, got %s", what, key,
                 luaL_typename(L, -1));
    s = lnr_checkseconds(L, -1, what);
  }
  if (t != 0)
    lua_pop(L, 1);
  return lnr_ns(s);
}

void lnr_stall_options(lua_State *L, int t, const char *what, bool executor,
                       nr_group_opts_t *o) {
  /* Executor groups exist to run blocking work: not watched by default. */
  o->stall_threshold = opt_seconds(L, t, "stall_threshold", what,
                                   executor ? 0 : 1);
  o->stall_timeout = opt_seconds(L, t, "stall_timeout", what, 0);
  /* A run is reported before, or as, it is interrupted. */
  if (o->stall_timeout &&
      (!o->stall_threshold || o->stall_timeout < o->stall_threshold))
    o->stall_threshold = o->stall_timeout;
  o->on_stall = on_stall;
}
