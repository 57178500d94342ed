/*
 * module.c -- the module table and luaopen_netrun_core, the C half of
 * require "netrun" (the Lua half, lua/netrun/init.lua, builds the public
 * module on top of it).
 *
 * Every feature of the bindings is one row of the table, and its file
 * defines the row's lnr_module_t (lnr.h says what each field means). The
 * kernel walks the table -- to open netrun.core, to lay out and close a
 * state's parts, for a hot reload and for the process's teardown -- and
 * names no feature anywhere else. Adding one is a row here and a file
 * (docs/architecture.md, "Adding a module").
 *
 * Threads: the walks run on the thread of the state they are given; the
 * layout is computed once, before the first state is made.
 */

/***
@module netrun
*/
#include <pthread.h>
#include <stdalign.h>
#include <stddef.h>

#include "lmain.h"
#include "lnr.h"

/* The table, in the order the modules open (a later row may use what an
 * earlier one put in netrun.core) and are torn down (groups first: every
 * loop stops before anything it may use is freed). */
#define MODULES(X)                                                          \
  X(transfer)      /* transfer/: values between states; core.transfer */    \
  X(group)         /* group/: groups and loops; stops them at teardown */   \
  X(future)        /* lfuture.c: futures, spawn, sleep */                   \
  X(channel_handle)/* channel/lchannel_handle.c: netrun.channel */          \
  X(channel)       /* channel/lchannel.c: servers, clients, UDP */          \
  X(chgroup)       /* channel/lchgroup.c: netrun.channel_group */           \
  X(pipeline)      /* pipeline/: pipelines, Lua handlers, ctx */            \
  X(dict)          /* ldict.c: netrun.shared.dict, core.log */              \
  X(console)       /* console.c: the REPL's half in C */                    \
  X(dns)           /* ldns.c: lookups; stops the resolver at teardown */    \
  X(codec)         /* lcodec.c: frame codecs, the embedded channel */       \
  X(http)          /* http/lhttp*.c: the HTTP server codec, requests */     \
  X(http_client)   /* http/lhttp_client.c: the HTTP client codec */         \
  X(http_pool)     /* http/lhttp_pool.c, lhttp_lane.c: netrun.http */       \
  X(upstream)      /* http/lupstream.c: netrun.http.upstream's state */     \
  X(handlers)      /* lhandlers.c: idle_state, logging, resp */             \
  X(tls)           /* ltls.c: TLS configs and handlers */                   \
  X(websocket)     /* lws.c: the WebSocket codec */                         \
  X(ops)           /* lops.c: reload, metrics, the terminal */              \
  X(json)          /* json/: core.json */                                   \
  X(redis)         /* lredis.c: core.redis */                               \
  X(stall)         /* lstall.c: the stall watchdog's hook, coroutines */    \
  X(spawn)         /* lspawn.c: os.execute and io.popen in loop states */   \
  X(print)         /* lprint.c: print writing whole lines in loop states */ \
  X(nats)          /* lnats.c: core.nats, the wire under netrun.nats */     \
  X(sim)           /* lsim.c: netrun.sim's worlds (lua/netrun/sim.lua) */  \
  X(metrics)       /* lmetrics.c: netrun.metrics' user families */          \
  X(access_log)    /* laccess.c: netrun.handler.access_log */          \
  X(limit)         /* llimit.c: core.loop_lag for netrun.limit.shed */ \
  X(static)        /* lstatic.c: netrun.handler.static (handler/static*.c) */

#define DECLARE(name) extern lnr_module_t lnr_##name##_module;
MODULES(DECLARE)
#define ROW(name) &lnr_##name##_module,
static lnr_module_t *const modules[] = {MODULES(ROW)};
#define NMODULES (sizeof modules / sizeof modules[0])

/* ---- a state's parts ---------------------------------------------------- */

static pthread_once_t layout_once = PTHREAD_ONCE_INIT;
static size_t state_size;

#define PART_ALIGN alignof(max_align_t)

static size_t aligned(size_t n) { return (n + PART_ALIGN - 1) & ~(PART_ALIGN - 1); }

/* Each part after the kernel's fields, in table order. */
static void lay_out(void) {
  size_t at = aligned(sizeof(lnr_state_t));
  for (size_t i = 0; i < NMODULES; i++) {
    modules[i]->part_offset = at;
    at += aligned(modules[i]->part_size);
  }
  state_size = at;
}

size_t lnr_state_size(void) {
  pthread_once(&layout_once, lay_out);
  return state_size;
}

void lnr_modules_close(lnr_state_t *S) {
  for (size_t i = 0; i < NMODULES; i++)
    if (modules[i]->close != NULL)
      modules[i]->close(S, lnr_part(S, modules[i]));
}

/* ---- hooks -------------------------------------------------------------- */

void lnr_modules_libs(lua_State *L) {
  for (size_t i = 0; i < NMODULES; i++)
    if (modules[i]->libs != NULL)
      modules[i]->libs(L);
}

void lnr_modules_reload(lua_State *L) {
  for (size_t i = 0; i < NMODULES; i++)
    if (modules[i]->reload != NULL)
      modules[i]->reload(L);
}

bool lnr_modules_teardown(lua_State *L) {
  for (size_t i = 0; i < NMODULES; i++)
    if (modules[i]->teardown != NULL && !modules[i]->teardown(L))
      return false;
  return true;
}

/* ---- netrun.core -------------------------------------------------------- */

/***
The monotonic clock, in seconds (for measuring intervals, not dates).
@function now
@treturn number
*/

/* core.now(): the monotonic clock in seconds. */
static int l_now(lua_State *L) {
  lua_pushnumber(L, (double)nr_now() / 1e9);
  return 1;
}

int luaopen_netrun_core(lua_State *L) {
  lnr_state_size();                   /* the layout, before any state */
  lnr_open_state(L);
  lua_newtable(L);
  lnr_open_opts(L);                   /* the kernel's option readers */
  for (size_t i = 0; i < NMODULES; i++)
    if (modules[i]->open != NULL)
      modules[i]->open(L);
  lua_pushcfunction(L, l_now);
  lua_setfield(L, -2, "now");
  lua_pushliteral(L, NR_VERSION);
  lua_setfield(L, -2, "version");
  return 1;
}
