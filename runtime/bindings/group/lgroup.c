/*
 * lgroup.c -- groups, executor groups and loops in Lua: creation (each loop
 * with its own state), the chooser, graceful shutdown, stats,
 * netrun.current(); execute/submit/schedule with values transferred are
 * lgroup_task.c's.
 *
 * Lifetime: a group is reference counted by its proxies, by blobs carrying
 * it, and by the list of live groups, which lets go once the group has
 * terminated. The last release frees it -- on the main thread, since freeing
 * joins the loop threads.
 *
 * How long the process lives (netrun.run) and shutting every group down
 * are lrun.c's; what both share, lgroup.h's.
 */

/***
@module netrun
*/
#include <limits.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "lgroup.h"
#include "lmain.h"

pthread_mutex_t lnr_live_lock = PTHREAD_MUTEX_INITIALIZER;
lnr_group_t *lnr_live;
static lnr_group_t *default_boss, *default_workers;

/* A simulation's hosts are machines of their own: each has its own
 * default groups, by its namespace (nr_sim_namespace), under lnr_live_lock. */
typedef struct sim_defaults_s {
  struct sim_defaults_s *next;
  lnr_group_t *boss, *workers;
  char ns[];
} sim_defaults_t;
static sim_defaults_t *sim_defaults;

/* The slot of the caller's default boss or workers group (lnr_live_lock). */
static lnr_group_t **default_slot(bool boss) {
  char ns[128];
  if (nr_sim_namespace(ns, sizeof ns) == 0)
    return boss ? &default_boss : &default_workers;
  sim_defaults_t *d = sim_defaults;
  while (d && strcmp(d->ns, ns) != 0)
    d = d->next;
  if (d == NULL && (d = calloc(1, sizeof *d + strlen(ns) + 1)) != NULL) {
    strcpy(d->ns, ns);
    d->next = sim_defaults;
    sim_defaults = d;
  }
  return d == NULL ? NULL : boss ? &d->boss : &d->workers;
}

nr_group_t *lnr_group_core(lnr_group_t *g) { return g->g; }

lnr_group_t *lnr_group_of_loop(nr_loop_t *l) {
  nr_group_t *g = l ? nr_loop_group(l) : NULL;
  return g ? nr_group_data(g) : NULL;
}

/* Executor groups exist to run blocking work, so their threads may wait
 * for a future; an event loop's thread may not. */
bool lnr_loop_may_block(nr_loop_t *l) {
  lnr_group_t *g = lnr_group_of_loop(l);
  return g != NULL && g->executor;
}

void lnr_group_retain(lnr_group_t *g) { atomic_fetch_add(&g->refs, 1); }

static void group_free(lnr_group_t *g) {
  nr_group_free(g->g);               /* joins threads: all terminated */
  lnr_paths_free(g->paths);
  free(g);
}

static int group_free_task(void *arg) {
  group_free(arg);
  return 0;
}

void lnr_group_release(lnr_group_t *g) {
  if (atomic_fetch_sub(&g->refs, 1) != 1)
    return;
  nr_loop_t *cur = nr_loop_current();
  if (cur == NULL || cur == lnr_main_loop()) {
    group_free(g);
  } else if (lnr_main_loop() == NULL ||
             nr_loop_execute(lnr_main_loop(), group_free_task, g) < 0) {
    /* The main thread is gone: the process is ending, let it go. */
  }
}

/* A terminated group leaves the live list, dropping the list's reference. */
void lnr_group_unlist(lnr_group_t *g) {
  pthread_mutex_lock(&lnr_live_lock);
  bool listed = g->listed;
  for (lnr_group_t **pp = &lnr_live; listed && *pp; pp = &(*pp)->next)
    if (*pp == g) {
      *pp = g->next;
      break;
    }
  g->listed = false;
  if (default_boss == g)
    default_boss = NULL;
  if (default_workers == g)
    default_workers = NULL;
  for (sim_defaults_t *d = sim_defaults; d; d = d->next) {
    if (d->boss == g)
      d->boss = NULL;
    if (d->workers == g)
      d->workers = NULL;
  }
  pthread_mutex_unlock(&lnr_live_lock);
  if (listed)
    lnr_group_release(g);
}

static int unlist_task(void *arg) {
  lnr_group_unlist(arg);
  lnr_group_release(arg);                    /* the task's own reference */
  return 0;
}

/* On the last loop to terminate: leave the list on the main thread. */
static void on_terminated(nr_promise_t *p, void *arg) {
  (void)p;
  lnr_group_retain(arg);
  if (lnr_main_loop() == NULL ||
      nr_loop_execute(lnr_main_loop(), unlist_task, arg) < 0)
    unlist_task(arg);
}

/* A loop takes at most this many queued tasks by default; execute and
 * submit past it raise (Netty's RejectedExecutionException). A second of
 * work at the rate a loop runs small Lua tasks, and about 200 MiB of the
 * smallest ones: a producer that far ahead has lost its consumer, and
 * memory, not the queue, would be the first thing to give. */
#define MAX_PENDING_TASKS 1000000

/* A loop state's Lua memory is bounded by default (lstate.c, "the memory
 * limit"): past 512 MiB a state is almost surely leaking -- per-connection
 * state of 100,000 connections at 1 KiB each is 100 MiB, and bigger data
 * belongs in a shared dict, outside the states -- and a "not enough
 * memory" error in the handler that asked is better than the kernel's
 * OOM killer taking the whole process. At least 1 MiB: an empty state
 * takes a few hundred KiB. */
#define LUA_MEMORY_LIMIT ((size_t)512 << 20)
#define LUA_MEMORY_MIN ((lua_Integer)1 << 20)

static lnr_group_t *group_new(lua_State *L, const char *name, int threads,
                              int io_ratio, bool executor,
                              size_t max_pending, size_t mem_limit,
                              const lnr_opts_t *opts) {
  nr_group_opts_t stall = {0};                /* may raise: before calloc */
  lnr_stall_options(opts, executor, &stall);
  lnr_group_t *g = calloc(1, sizeof *g);
  if (g == NULL)
    luaL_error(L, "netrun.group: out of memory");
  g->paths = lnr_paths_new(L);
  lnr_paths_set_memory_limit(g->paths, mem_limit);
  g->executor = executor;
  g->max_pending = max_pending;
  nr_group_opts_t o = {.name = name, .threads = threads,
                       .io_ratio = executor ? 100 : io_ratio,
                       .max_pending = max_pending,
                       .on_start = lnr_loop_started,
                       .on_exit = lnr_loop_exiting, .ud = g->paths,
                       .stall_threshold = stall.stall_threshold,
                       .stall_timeout = stall.stall_timeout,
                       .on_stall = stall.on_stall};
  g->g = nr_group_new(&o);
  if (g->g == NULL) {
    int err = errno;
    lnr_paths_free(g->paths);
    free(g);
    luaL_error(L, "netrun.group: cannot create the group: %s", strerror(err));
    return NULL;
  }
  nr_group_set_data(g->g, g);
  atomic_init(&g->refs, 1);                  /* the live list's */
  pthread_mutex_lock(&lnr_live_lock);
  g->listed = true;
  g->next = lnr_live;
  lnr_live = g;
  pthread_mutex_unlock(&lnr_live_lock);
  nr_promise_add_listener(nr_group_termination_future(g->g), NULL,
                          on_terminated, g);
  return g;
}

/* The options netrun.group and netrun.executor_group know: a key not
 * listed raises (lnr_opts_open), so a new option is added here too.
 * stall_threshold and stall_timeout are read by the stall detector. */
static const char *const group_keys[] = {
    "threads", "name", "io_ratio", "daemon", "stall_threshold",
    "stall_timeout", "max_pending_tasks", "lua_memory_limit", NULL};

/* lua_memory_limit: 0 (none) or at least LUA_MEMORY_MIN bytes. */
static size_t opt_memory(const lnr_opts_t *o) {
  static const char k[] = "lua_memory_limit";
  size_t mem = LUA_MEMORY_LIMIT;
  if (o->t && lua_getfield(o->L, o->t, k) != LUA_TNIL) {
    mem = lnr_optv_size(o, k, -1, 0, LNR_OPT_SIZE_MAX);
    if (mem != 0 && mem < (size_t)LUA_MEMORY_MIN)
      lnr_opt_bad(o, k, -1, "0 (none) or a size of at least 1048576 bytes");
  }
  if (o->t)
    lua_pop(o->L, 1);
  return mem;
}

static int new_group(lua_State *L, bool executor) {
  lnr_opts_t o;
  lnr_opts_open(&o, L, 1, executor ? "netrun.executor_group" : "netrun.group",
                group_keys, false);
  /* threads = 0: NETRUN_THREADS (`netrun -t N`), else the core's choice */
  int threads = (int)lnr_opt_integer(&o, "threads", 0, 0, 1024);
  int ratio = (int)lnr_opt_integer(&o, "io_ratio", 50, 1, 100);
  const char *name = lnr_opt_string(&o, "name", executor ? "executor"
                                                         : "worker", NULL);
  if (threads == 0) {
    lua_getglobal(L, "NETRUN_THREADS");
    threads = lua_isinteger(L, -1) ? (int)lua_tointeger(L, -1) : 0;
    lua_pop(L, 1);
  }
  lua_Integer max_pending = lnr_opt_integer(&o, "max_pending_tasks",
                                            MAX_PENDING_TASKS, 1,
                                            LUA_MAXINTEGER);
  size_t mem = opt_memory(&o);
  bool daemon = lnr_opt_boolean(&o, "daemon", false);
  lnr_group_t *g = group_new(L, name, threads, ratio, executor,
                             (size_t)max_pending, mem, &o);
  g->daemon = daemon;
  lnr_push_handle(L, LNR_GROUP, g);
  return 1;
}

/***
Make a group of event loops (Netty's NioEventLoopGroup): `threads` loops,
each a thread with its own epoll selector and its own Lua state, started
on its first task. A channel registered with a loop stays on it for life.
@function group
@tparam[opt] table opts the options; an unknown key raises
@int[opt] opts.threads how many loops (1..1024; default: the number of CPUs, or `netrun -t N`)
@string[opt="worker"] opts.name the loops are named name-1, name-2, ...
@int[opt=50] opts.io_ratio percent of a turn given to I/O rather than tasks (1..100; 100: run every task each turn)
@bool[opt=false] opts.daemon a daemon group keeps no process alive (`netrun.run`)
@number[opt=1] opts.stall_threshold seconds a task or handler call may run before the stall detector logs it (0: off)
@number[opt] opts.stall_timeout seconds after which a stuck Lua call is interrupted with "stalled for N s" (default: off)
@int[opt=1000000] opts.max_pending_tasks tasks queued on one loop before `execute` and `submit` raise
@int[opt=536870912] opts.lua_memory_limit bytes of Lua memory per loop state (0: none; at least 1 MiB)
@treturn group the group
@usage local workers = netrun.group { threads = 4, name = "worker" }
*/
/***
Make a group of executors: task threads with no selector, for blocking work
(`pipeline:add_last(group, name, h)` runs a handler there). Their threads may
block in `future:sync`. Options as `group` (`io_ratio` aside; stalls are
not watched by default); the default name is "executor".
@function executor_group
@tparam[opt] table opts the options, as `group`'s
@treturn group the group
*/

static int l_group(lua_State *L) { return new_group(L, false); }
static int l_executor_group(lua_State *L) { return new_group(L, true); }

lnr_group_t *lnr_default_group(lua_State *L, bool boss) {
  pthread_mutex_lock(&lnr_live_lock);
  lnr_group_t **slot = default_slot(boss);
  lnr_group_t *g = slot ? *slot : NULL;
  pthread_mutex_unlock(&lnr_live_lock);
  if (g)
    return g;
  int threads = 0;
  if (boss) {
    threads = 1;
  } else {
    lua_getglobal(L, "NETRUN_THREADS");
    threads = lua_isinteger(L, -1) ? (int)lua_tointeger(L, -1) : 0;
    lua_pop(L, 1);
  }
  g = group_new(L, boss ? "boss" : "worker", threads, 50, false,
                MAX_PENDING_TASKS, LUA_MEMORY_LIMIT, NULL);
  pthread_mutex_lock(&lnr_live_lock);
  slot = default_slot(boss);
  if (slot == NULL) {                           /* out of memory: unkept */
    pthread_mutex_unlock(&lnr_live_lock);
    return g;
  }
  if (*slot == NULL) {
    *slot = g;
  } else {                                      /* raced: keep the first */
    pthread_mutex_unlock(&lnr_live_lock);
    nr_group_shutdown_gracefully(g->g, 0, 0);
    return *slot;
  }
  pthread_mutex_unlock(&lnr_live_lock);
  return g;
}

/***
@type group
*/

/* ---- shutdown and state --------------------------------------------------------- */

static double secs(lua_State *L, int idx) {
  return lnr_checkseconds(L, idx, "shutdown_gracefully");
}

/***
Shut the group down gracefully: each loop cancels its
scheduled tasks, closes its channels (flushing what they accepted), runs
what is queued and terminates once no task ran for `quiet` seconds, or
after `timeout`. Tasks submitted after the shutdown raise.
@function group:shutdown_gracefully
@number[opt=2] quiet the quiet period, seconds
@number[opt=15] timeout the most it may take, seconds
@treturn future the termination future
*/

static int l_shutdown(lua_State *L) {
  double quiet = luaL_opt(L, secs, 2, 2.0);
  double timeout = luaL_opt(L, secs, 3, 15.0);
  nr_promise_t *p;
  lnr_group_t *g = lnr_to_handle(L, 1, LNR_GROUP);
  if (g)
    p = nr_group_shutdown_gracefully(g->g, lnr_ns(quiet), lnr_ns(timeout));
  else
    p = nr_loop_shutdown_gracefully(lnr_check_handle(L, 1, LNR_LOOP),
                                    lnr_ns(quiet), lnr_ns(timeout));
  lnr_push_promise(L, nr_promise_retain(p));
  return 1;
}

/***
The future that completes once every loop of the group has terminated.
@function group:termination_future
@treturn future
*/

static int l_termination(lua_State *L) {
  lnr_group_t *g = lnr_to_handle(L, 1, LNR_GROUP);
  nr_promise_t *p = g ? nr_group_termination_future(g->g)
                      : nr_loop_termination_future(lnr_check_handle(L, 1, LNR_LOOP));
  lnr_push_promise(L, nr_promise_retain(p));
  return 1;
}

#define PRED(fname, gfn, lfn)                                              \
  static int fname(lua_State *L) {                                         \
    lnr_group_t *g = lnr_to_handle(L, 1, LNR_GROUP);                       \
    lua_pushboolean(L, g ? gfn(g->g) : lfn(lnr_check_handle(L, 1, LNR_LOOP))); \
    return 1;                                                              \
  }
/***
Whether a graceful shutdown has begun.
@function group:is_shutting_down
@treturn bool
*/
/***
Whether the group is shut down (no task is accepted any more).
@function group:is_shutdown
@treturn bool
*/
/***
Whether every loop has terminated.
@function group:is_terminated
@treturn bool
*/

PRED(l_is_shutting_down, nr_group_is_shutting_down, nr_loop_is_shutting_down)
PRED(l_is_shutdown, nr_group_is_shutdown, nr_loop_is_shutdown)
PRED(l_is_terminated, nr_group_is_terminated, nr_loop_is_terminated)

const char *const lnr_loop_state_names[] = {"not_started", "started", "shutting_down",
                                    "shutdown", "terminated"};

static void push_stats(lua_State *L, nr_loop_t *loop) {
  nr_loop_stats_t st;
  nr_loop_stats(loop, &st);
  lua_createtable(L, 0, 14);
  lua_pushstring(L, st.name);
  lua_setfield(L, -2, "name");
  lua_pushstring(L, lnr_loop_state_names[st.state]);
  lua_setfield(L, -2, "state");
#define F(field)                                                           \
  lua_pushinteger(L, (lua_Integer)st.field);                               \
  lua_setfield(L, -2, #field)
  F(pending_tasks); F(scheduled_tasks); F(channels); F(tasks_run);
  F(io_events); F(wakeups); F(selector_rebuilds); F(iterations);
#undef F
  lua_pushnumber(L, (double)st.io_time_ns / 1e9);
  lua_setfield(L, -2, "io_time");
  lua_pushnumber(L, (double)st.task_time_ns / 1e9);
  lua_setfield(L, -2, "task_time");
  lua_pushinteger(L, (lua_Integer)st.stalls);
  lua_setfield(L, -2, "stalls");
  lua_pushnumber(L, (double)st.max_busy_ns / 1e9);
  lua_setfield(L, -2, "max_busy");
  lua_pushnumber(L, (double)st.lag_ns / 1e9);
  lua_setfield(L, -2, "lag");
  if (loop == lnr_main_loop())
    lua_pushinteger(L, (lua_Integer)lua_gc(L, LUA_GCCOUNT, 0) * 1024);
  else   /* a loop state counts its bytes on its loop; none before it starts
            (its state may come and go meanwhile: not read from here) */
    lua_pushinteger(L, (lua_Integer)atomic_load_explicit(
                           nr_loop_memory(loop), memory_order_relaxed));
  lua_setfield(L, -2, "lua_memory");
}

/***
The stats of every loop, as `loop:stats` gives them.
@function group:stats
@treturn {table,...} one table per loop
*/

static int l_stats(lua_State *L) {
  lnr_group_t *g = lnr_to_handle(L, 1, LNR_GROUP);
  if (g == NULL) {
    push_stats(L, lnr_check_handle(L, 1, LNR_LOOP));
    return 1;
  }
  int n = nr_group_size(g->g);
  lua_createtable(L, n, 0);
  for (int i = 0; i < n; i++) {
    push_stats(L, nr_group_loop(g->g, i));
    lua_rawseti(L, -2, i + 1);
  }
  return 1;
}

/***
The next loop, round robin (a power-of-two mask when the size is one);
a stalled loop is skipped while it stalls.
@function group:next
@treturn loop
*/

static int l_next(lua_State *L) {
  lnr_group_t *g = lnr_check_handle(L, 1, LNR_GROUP);
  lnr_push_handle(L, LNR_LOOP, nr_group_next(g->g));
  return 1;
}

/***
The group's loops, in order.
@function group:loops
@treturn {loop,...}
*/

static int l_loops(lua_State *L) {
  lnr_group_t *g = lnr_check_handle(L, 1, LNR_GROUP);
  int n = nr_group_size(g->g);
  lua_createtable(L, n, 0);
  for (int i = 0; i < n; i++) {
    lnr_push_handle(L, LNR_LOOP, nr_group_loop(g->g, i));
    lua_rawseti(L, -2, i + 1);
  }
  return 1;
}

static int l_len(lua_State *L) {
  lnr_group_t *g = lnr_check_handle(L, 1, LNR_GROUP);
  lua_pushinteger(L, nr_group_size(g->g));
  return 1;
}

static int l_group_tostring(lua_State *L) {
  lnr_group_t *g = lnr_check_handle(L, 1, LNR_GROUP);
  lua_pushfstring(L, "netrun.group(%s, %d loops)", nr_group_name(g->g),
                  nr_group_size(g->g));
  return 1;
}

/***
One loop (or executor) of a group: a thread with its own Lua state. Work
given to a loop runs on it; a function sent to the caller's own loop is not
copied, so it may capture `ctx` and other loop-local values.
@type loop
*/

/***
Run `fn(...)` on this loop; as `group:execute`.
@function loop:execute
@tparam function fn the task
@param ... its arguments
*/
/***
Run `fn(...)` on this loop; as `group:submit`.
@function loop:submit
@tparam function fn the task
@param ... its arguments
@treturn future of fn's first result
*/
/***
Run `fn(...)` on this loop after `delay` seconds; as `group:schedule`.
@function loop:schedule
@number delay seconds
@tparam function fn the task
@param ... its arguments
@treturn future
*/
/***
As `group:schedule_at_fixed_rate`, on this loop.
@function loop:schedule_at_fixed_rate
@number initial seconds
@number period seconds
@tparam function fn the task
@param ... its arguments
@treturn future
*/
/***
As `group:schedule_with_fixed_delay`, on this loop.
@function loop:schedule_with_fixed_delay
@number initial seconds
@number delay seconds
@tparam function fn the task
@param ... its arguments
@treturn future
*/
/***
Queue a tail task: `fn(...)` runs after the loop's current iteration
(Netty's executeAfterEventLoopIteration).
@function loop:after_iteration
@tparam function fn the task
@param ... its arguments
*/
/***
Shut this loop down gracefully; as `group:shutdown_gracefully`.
@function loop:shutdown_gracefully
@number[opt=2] quiet seconds
@number[opt=15] timeout seconds
@treturn future
*/
/***
The future that completes once this loop has terminated.
@function loop:termination_future
@treturn future
*/
/***
Whether this loop is shutting down.
@function loop:is_shutting_down
@treturn bool
*/
/***
Whether this loop is shut down.
@function loop:is_shutdown
@treturn bool
*/
/***
Whether this loop has terminated.
@function loop:is_terminated
@treturn bool
*/
/***
This loop's stats: `name`, `state` ("not_started", "started",
"shutting_down", "shutdown", "terminated"), `pending_tasks`,
`scheduled_tasks`, `channels`, `tasks_run`, `io_events`, `wakeups`,
`selector_rebuilds`, `iterations`, `io_time` and `task_time` (seconds),
`stalls`, `max_busy` (seconds, the longest uninterrupted run), `lag`
(seconds: the longest recent run less the time since it ended -- how
long what the loop handles now may have waited behind it; a 0.5 s stall
reads 0.5 right after and 0 half a second later; `netrun.limit.shed`
reads it) and `lua_memory` (bytes).
@function loop:stats
@treturn table
*/
/***
The loop's name, e.g. "worker-2".
@function loop:name
@treturn string
*/

static int l_loop_name(lua_State *L) {
  lua_pushstring(L, nr_loop_name(lnr_check_handle(L, 1, LNR_LOOP)));
  return 1;
}

/***
Whether the caller runs on this loop's thread.
@function loop:in_event_loop
@treturn bool
*/

static int l_in_event_loop(lua_State *L) {
  lua_pushboolean(L, nr_loop_in_thread(lnr_check_handle(L, 1, LNR_LOOP)));
  return 1;
}

/***
The group this loop belongs to.
@function loop:group
@treturn group
*/

static int l_loop_group(lua_State *L) {
  lnr_push_handle(L, LNR_GROUP,
                  lnr_group_of_loop(lnr_check_handle(L, 1, LNR_LOOP)));
  return 1;
}

static int l_loop_tostring(lua_State *L) {
  nr_loop_t *l = lnr_check_handle(L, 1, LNR_LOOP);
  lua_pushfstring(L, "netrun.loop(%s)", nr_loop_name(l));
  return 1;
}

/*** @section end */

/***
The loop running the caller: nil on the main thread.
@function current
@treturn loop|nil
*/

static int l_current(lua_State *L) {
  nr_loop_t *l = nr_loop_current();
  if (l == NULL || l == lnr_main_loop())
    lua_pushnil(L);
  else
    lnr_push_handle(L, LNR_LOOP, l);
  return 1;
}

/* Every live group, for core.groups() (the REPL's :loops). */
static int l_groups(lua_State *L) {
  lua_newtable(L);
  pthread_mutex_lock(&lnr_live_lock);
  int n = 0;
  lnr_group_t *v[256];
  for (lnr_group_t *g = lnr_live; g && n < 256; g = g->next) {
    lnr_group_retain(g);
    v[n++] = g;
  }
  pthread_mutex_unlock(&lnr_live_lock);
  for (int i = n - 1; i >= 0; i--) {          /* oldest first */
    lnr_push_handle(L, LNR_GROUP, v[i]);
    lua_rawseti(L, -2, n - i);
    lnr_group_release(v[i]);
  }
  return 1;
}

static void open_group(lua_State *L) {
  static const luaL_Reg group_methods[] = {
      {"next", l_next}, {"loops", l_loops}, {"execute", lnr_l_execute},
      {"submit", lnr_l_submit}, {"schedule", lnr_l_schedule},
      {"schedule_at_fixed_rate", lnr_l_fixed_rate},
      {"schedule_with_fixed_delay", lnr_l_fixed_delay},
      {"shutdown_gracefully", l_shutdown},
      {"termination_future", l_termination},
      {"is_shutting_down", l_is_shutting_down}, {"is_shutdown", l_is_shutdown},
      {"is_terminated", l_is_terminated}, {"stats", l_stats}, {NULL, NULL}};
  static const luaL_Reg group_meta[] = {{"__len", l_len},
                                        {"__tostring", l_group_tostring},
                                        {NULL, NULL}};
  static const luaL_Reg loop_methods[] = {
      {"execute", lnr_l_execute}, {"submit", lnr_l_submit}, {"schedule", lnr_l_schedule},
      {"schedule_at_fixed_rate", lnr_l_fixed_rate},
      {"schedule_with_fixed_delay", lnr_l_fixed_delay},
      {"after_iteration", lnr_l_after_iteration},
      {"in_event_loop", l_in_event_loop}, {"name", l_loop_name},
      {"group", l_loop_group}, {"stats", l_stats},
      {"shutdown_gracefully", l_shutdown},
      {"termination_future", l_termination},
      {"is_shutting_down", l_is_shutting_down}, {"is_shutdown", l_is_shutdown},
      {"is_terminated", l_is_terminated}, {NULL, NULL}};
  static const luaL_Reg loop_meta[] = {{"__tostring", l_loop_tostring},
                                       {NULL, NULL}};
  lnr_new_class(L, lnr_kind_names[LNR_GROUP], group_methods, group_meta);
  lnr_handle_class(L, LNR_GROUP);
  lnr_new_class(L, lnr_kind_names[LNR_LOOP], loop_methods, loop_meta);
  lnr_handle_class(L, LNR_LOOP);
  static const luaL_Reg funcs[] = {
      {"group", l_group}, {"executor_group", l_executor_group},
      {"current", l_current}, {"run", lnr_l_run}, {"groups", l_groups},
      {"shutdown_all", lnr_l_shutdown_all},
      {NULL, NULL}};
  luaL_setfuncs(L, funcs, 0);
}

lnr_module_t lnr_group_module = {
    .name = "group", .open = open_group, .teardown = lnr_groups_teardown};
