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
 * A count hook belongs to one thread (lua_State), and Lua code runs on the
 * state's main thread or inside a coroutine: the stream functions and
 * netrun.spawn, after an await, a coroutine.wrap in a handler. So the
 * watchdog hooks both the main thread and the coroutine running now
 * (lnr_state_t.running), which every resume of the bindings publishes
 * (lnr_resume: netrun.spawn's, and the coroutine library's, replaced in
 * loop states). Whichever runs Lua code takes the hook; the other runs it
 * later, when the request is gone, and does nothing. The traceback is then
 * the coroutine's own, and the interrupt ends the coroutine with the error
 * (which its resumer sees: a spawn's future, a wrap's caller).
 *
 * A coroutine resumed by C code other than the bindings' (a C module
 * calling lua_resume) is not known: a stall there is described by the
 * watchdog, as one in C.
 */
#include <sched.h>
#include <stdio.h>

#include "lnr.h"

/* A state's part: the watchdog's request, NR_STALL_* bits, the mark of
 * the run it is about and how long that had lasted. Written by the
 * watchdog's thread, read by the hook on the state's own. */
typedef struct stall_part_s {
  _Atomic unsigned req;
  _Atomic uint64_t mark, busy;
} stall_part_t;

extern lnr_module_t lnr_stall_module;

static stall_part_t *stall_part(lnr_state_t *S) {
  return lnr_part(S, &lnr_stall_module);
}

static void stall_hook(lua_State *L, lua_Debug *ar) {
  (void)ar;
  lua_sethook(L, NULL, 0, 0);            /* first: a new request sets it again */
  lnr_state_t *S = lnr_state(L);
  if (S == NULL || S->loop == NULL)
    return;
  stall_part_t *P = stall_part(S);
  unsigned req = atomic_exchange(&P->req, 0);
  uint64_t mark = atomic_load(&P->mark);
  if (req == 0 || nr_loop_stall_mark(S->loop) != mark)
    return;                              /* that run is over */
  double busy = (double)atomic_load(&P->busy) / 1e9;
  if ((req & NR_STALL_REPORT) && nr_loop_stall_claim(S->loop, mark)) {
    luaL_traceback(L, L, NULL, 0);
    nr_log(NR_LOG_WARN, "%s: stalled: one run has lasted %.1f s, in Lua%s:\n%s",
           nr_loop_name(S->loop), busy, L == S->L ? "" : " (a coroutine)",
           lua_tostring(L, -1));
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
  stall_part_t *P = stall_part(S);
  atomic_store(&P->busy, busy_ns);
  atomic_store(&P->mark, mark);
  atomic_fetch_or(&P->req, (unsigned)what);
  lua_sethook(S->L, stall_hook, LUA_MASKCOUNT, 1);
  while (atomic_exchange_explicit(&S->run_lock, true, memory_order_acquire))
    sched_yield();                       /* held for a store at most */
  lua_State *co = atomic_load_explicit(&S->running, memory_order_relaxed);
  if (co != NULL)
    lua_sethook(co, stall_hook, LUA_MASKCOUNT, 1);
  atomic_store_explicit(&S->run_lock, false, memory_order_release);
  return true;
}

/* ---- the running coroutine ------------------------------------------------ */

/* Entering needs no lock (lnr_run_enter): a watchdog that still reads the
 * resumer hooks a thread that lives at least until this resume returns.
 * Leaving does: the watchdog may be hooking the coroutine left. */
void lnr_run_lock_wait(lnr_state_t *S) {
  while (atomic_exchange_explicit(&S->run_lock, true, memory_order_acquire))
    sched_yield();                       /* held for two lua_sethook calls */
}

/* lua_resetthread(co) -- it runs co's pending to-be-closed variables --
 * with co published as lnr_resume does. */
static int reset_thread(lnr_state_t *S, lua_State *co) {
  lua_State *prev = lnr_run_enter(S, co);
  int st = lua_resetthread(co);
  lnr_run_leave(S, prev);
  return st;
}

/* The coroutine library's resume, wrap and close, as Lua 5.4's behave (the
 * same results and messages), but resuming through lnr_resume. */
static lua_State *check_co(lua_State *L) {
  lua_State *co = lua_tothread(L, 1);
  luaL_argexpected(L, co != NULL, 1, "thread");
  return co;
}

/* Resume co with the top narg values of L; the number of results moved to
 * L, or -1 with the error on L's top. */
static int resume_co(lnr_state_t *S, lua_State *L, lua_State *co, int narg) {
  if (!lua_checkstack(co, narg)) {
    lua_pushliteral(L, "too many arguments to resume");
    return -1;
  }
  lua_xmove(L, co, narg);
  int nres;
  int st = lnr_resume(S, co, L, narg, &nres);
  if (st != LUA_OK && st != LUA_YIELD) {
    lua_xmove(co, L, 1);                 /* the error */
    return -1;
  }
  if (!lua_checkstack(L, nres + 1)) {
    lua_pop(co, nres);
    lua_pushliteral(L, "too many results to resume");
    return -1;
  }
  lua_xmove(co, L, nres);
  return nres;
}

static int co_resume(lua_State *L) {
  lua_State *co = check_co(L);
  int n = resume_co(lnr_loop_state(L), L, co, lua_gettop(L) - 1);
  lua_pushboolean(L, n >= 0);
  lua_insert(L, n >= 0 ? -(n + 1) : -2);
  return n >= 0 ? n + 1 : 2;
}

static int co_wrapped(lua_State *L) {
  lnr_state_t *S = lnr_loop_state(L);
  lua_State *co = lua_tothread(L, lua_upvalueindex(1));
  int n = resume_co(S, L, co, lua_gettop(L));
  if (n >= 0)
    return n;
  int st = lua_status(co);
  if (st != LUA_OK && st != LUA_YIELD) {  /* it died: close what it holds */
    st = reset_thread(S, co);
    lua_xmove(co, L, 1);
  }
  if (st != LUA_ERRMEM && lua_type(L, -1) == LUA_TSTRING) {
    luaL_where(L, 1);                    /* where the wrapper was called */
    lua_insert(L, -2);
    lua_concat(L, 2);
  }
  return lua_error(L);
}

static int co_wrap(lua_State *L) {
  luaL_checktype(L, 1, LUA_TFUNCTION);
  lua_State *co = lua_newthread(L);
  lua_pushvalue(L, 1);
  lua_xmove(L, co, 1);
  lua_pushcclosure(L, co_wrapped, 1);
  return 1;
}

/* A coroutine that may be closed: suspended (or not started) or dead. */
static const char *unclosable(lua_State *L, lua_State *co) {
  if (co == L)
    return "running";
  lua_Debug ar;
  if (lua_status(co) == LUA_OK && lua_getstack(co, 0, &ar))
    return "normal";                     /* it resumed another */
  return NULL;
}

static int co_close(lua_State *L) {
  lua_State *co = check_co(L);
  const char *st = unclosable(L, co);
  if (st != NULL)
    return luaL_error(L, "cannot close a %s coroutine", st);
  if (reset_thread(lnr_loop_state(L), co) == LUA_OK) {
    lua_pushboolean(L, 1);
    return 1;
  }
  lua_pushboolean(L, 0);
  lua_xmove(co, L, 1);
  return 2;
}

/* After luaL_openlibs in a loop state: coroutine.resume, wrap and close
 * that run their coroutine through lnr_resume, so that a stall inside one
 * is hooked there. */
static void open_coroutines(lua_State *L) {
  static const luaL_Reg fns[] = {{"resume", co_resume}, {"wrap", co_wrap},
                                 {"close", co_close}, {NULL, NULL}};
  luaL_getsubtable(L, LUA_REGISTRYINDEX, LUA_LOADED_TABLE);
  if (lua_getfield(L, -1, LUA_COLIBNAME) == LUA_TTABLE)
    luaL_setfuncs(L, fns, 0);
  lua_pop(L, 2);
}

void lnr_stall_options(const lnr_opts_t *t, bool executor,
                       nr_group_opts_t *o) {
  /* Executor groups exist to run blocking work: not watched by default. */
  uint64_t threshold = executor ? 0 : NR_SEC(1);
  o->stall_threshold = t ? lnr_opt_seconds(t, "stall_threshold", threshold)
                         : threshold;
  o->stall_timeout = t ? lnr_opt_seconds(t, "stall_timeout", 0) : 0;
  /* A run is reported before, or as, it is interrupted. */
  if (o->stall_timeout &&
      (!o->stall_threshold || o->stall_timeout < o->stall_threshold))
    o->stall_threshold = o->stall_timeout;
  o->on_stall = on_stall;
}

lnr_module_t lnr_stall_module = {
    .name = "stall", .libs = open_coroutines, .part_size = sizeof(stall_part_t)};
