/*
 * lhandlers.c -- Lua constructors for native handlers:
 *   netrun.handler.idle_state { reader = 30, writer = 0, all = 0 }
 *   netrun.handler.logging { level = "debug" }
 *   netrun.codec.resp { max_bulk = 1 << 20, max_args = 1024, max_inline = 65536,
 *                      max_request = 64 << 20 }
 * and the converters that turn their messages into Lua values: an idle
 * event becomes { idle = "reader" | "writer" | "all", first = bool }, a
 * RESP request an array of strings.
 *
 * A constructor returns a small userdata holding the configuration; the
 * per-channel C state is made each time it is added to a pipeline (the
 * __netrun_native hook), so one value may serve many channels of its
 * state. Being plain bytes, it is copied when it crosses states (as an
 * upvalue of `init`, say).
 */

/***
@module netrun
*/
#include <pthread.h>
#include <string.h>

#include "codec/resp.h"
#include "handler/handler.h"
#include "lnr.h"

#define IDLE_MT "netrun.handler.idle_state"
#define LOGGING_MT "netrun.handler.logging"
#define RESP_MT "netrun.codec.resp"

typedef struct idle_cfg_s { uint64_t t[3]; } idle_cfg_t;
typedef struct logging_cfg_s { int level; } logging_cfg_t;
typedef struct resp_cfg_s { nr_resp_limits_t lim; } resp_cfg_t;

/* ---- messages ----------------------------------------------------------- */

static void push_idle(lua_State *L, void *msg) {
  nr_idle_event_t *e = msg;
  lua_createtable(L, 0, 2);
  lua_pushstring(L, nr_idle_state_name(e->state));
  lua_setfield(L, -2, "idle");
  lua_pushboolean(L, e->first);
  lua_setfield(L, -2, "first");
}

static void push_resp(lua_State *L, void *msg) {
  nr_resp_cmd_t *c = msg;
  lua_createtable(L, (int)c->argc, 0);
  for (size_t i = 0; i < c->argc; i++) {
    lua_pushlstring(L, c->argv[i].data, c->argv[i].len);
    lua_rawseti(L, -2, (lua_Integer)i + 1);
  }
}

/* The converter table is process-wide: fill it once, from the first state
 * (the main one, before any loop thread runs). */
static pthread_once_t once = PTHREAD_ONCE_INIT;
static void register_msgs(void) {
  lnr_register_msg(NR_MSG_IDLE, push_idle);
  lnr_register_msg(NR_MSG_RESP, push_resp);
}

static void *new_native(lua_State *L, size_t size, const char *mt,
                        lnr_native_fn make) {
  void *u = lua_newuserdatauv(L, size, 0);
  if (luaL_newmetatable(L, mt)) {
    lua_pushlightuserdata(L, (void *)(uintptr_t)make);
    lua_setfield(L, -2, "__netrun_native");
  }
  lua_setmetatable(L, -2);
  return u;
}

static void *check_state(lua_State *L, void *state, const char *what) {
  if (state == NULL)
    luaL_error(L, "%s: out of memory", what);
  return state;
}

/* ---- idle_state ------------------------------------------------------------ */

static const nr_handler_t *make_idle(lua_State *L, int idx, void **state) {
  idle_cfg_t *c = luaL_checkudata(L, idx, IDLE_MT);
  *state = check_state(L, nr_idle_new(c->t[0], c->t[1], c->t[2]),
                       "idle_state");
  return &nr_idle_handler;
}

/***
Handlers: `netrun.handler`.
Native handlers; like codecs, a constructor returns a configuration that
makes a fresh handler each time it is added to a pipeline.
@section handler
*/

/***
Fires a user event `{ idle = "reader" | "writer" | "all", first = bool }`
when the channel has read nothing (reader), written nothing (writer), or
neither (all) for that long (Netty's IdleStateHandler).
@function handler.idle_state
@tparam[opt] table opts
@number[opt=0] opts.reader seconds without a read (0: not watched)
@number[opt=0] opts.writer seconds without a write
@number[opt=0] opts.all seconds without either
@return a handler configuration
@usage ch:pipeline():add_last("idle", netrun.handler.idle_state { reader = 30 })
*/

static int l_idle_state(lua_State *L) {
  static const char *const keys[] = {"reader", "writer", "all", NULL};
  lnr_opts_t t;
  lnr_opts_open(&t, L, 1, "netrun.handler.idle_state", keys, false);
  idle_cfg_t cfg = {{0}};
  for (int k = 0; k < 3; k++)                 /* seconds; 0: not watched */
    cfg.t[k] = lnr_opt_seconds(&t, keys[k], 0);
  *(idle_cfg_t *)new_native(L, sizeof cfg, IDLE_MT, make_idle) = cfg;
  return 1;
}

/* ---- logging ------------------------------------------------------------------ */

static const nr_handler_t *make_logging(lua_State *L, int idx, void **state) {
  logging_cfg_t *c = luaL_checkudata(L, idx, LOGGING_MT);
  *state = check_state(L, nr_logging_new(c->level), "logging");
  return &nr_logging_handler;
}

/***
Logs every event that passes through it, in both directions, and passes
it on (Netty's LoggingHandler).
@function handler.logging
@tparam[opt] table opts
@string[opt="debug"] opts.level "debug", "info", "warn" or "error"
@return a handler configuration
*/

static int l_logging(lua_State *L) {
  static const char *const keys[] = {"level", NULL};
  static const char *const levels[] = {"debug", "info", "warn", "error", NULL};
  lnr_opts_t t;
  lnr_opts_open(&t, L, 1, "netrun.handler.logging", keys, false);
  logging_cfg_t cfg = {lnr_opt_enum(&t, "level", NR_LOG_DEBUG, levels)};
  *(logging_cfg_t *)new_native(L, sizeof cfg, LOGGING_MT, make_logging) = cfg;
  return 1;
}

/* ---- resp ------------------------------------------------------------------------- */

static const nr_handler_t *make_resp(lua_State *L, int idx, void **state) {
  resp_cfg_t *c = luaL_checkudata(L, idx, RESP_MT);
  *state = check_state(L, nr_resp_new(&c->lim), "resp");
  return &nr_resp_handler;
}

/***
Codecs: `netrun.codec`.
@section codec
*/

/***
RESP (Redis protocol) requests in, each an array of strings (inline
commands too); replies out as written. Past a limit: `-ERR Protocol
error: ...`, then close.
@function codec.resp
@tparam[opt] table opts
@int[opt=1048576] opts.max_bulk the largest bulk string
@int[opt=1024] opts.max_args the most arguments of one command
@int[opt=65536] opts.max_inline the longest inline command
@int[opt=67108864] opts.max_request the largest request, headers and data
@return a codec configuration
*/

static int l_resp(lua_State *L) {
  static const char *const keys[] = {"max_bulk", "max_args", "max_inline",
                                     "max_request", NULL};
  lnr_opts_t t;
  lnr_opts_open(&t, L, 1, "netrun.codec.resp", keys, false);
  nr_resp_limits_t lim = {NR_RESP_MAX_BULK, NR_RESP_MAX_ARGS,
                          NR_RESP_MAX_INLINE, NR_RESP_MAX_REQUEST};
  resp_cfg_t cfg = {{
      lnr_opt_size(&t, "max_bulk", lim.max_bulk, 1, LNR_OPT_SIZE_MAX),
      (size_t)lnr_opt_integer(&t, "max_args", (lua_Integer)lim.max_args, 1,
                              LUA_MAXINTEGER),
      lnr_opt_size(&t, "max_inline", lim.max_inline, 1, LNR_OPT_SIZE_MAX),
      lnr_opt_size(&t, "max_request", lim.max_request, 1, LNR_OPT_SIZE_MAX)}};
  *(resp_cfg_t *)new_native(L, sizeof cfg, RESP_MT, make_resp) = cfg;
  return 1;
}

static void open_handlers(lua_State *L) {
  pthread_once(&once, register_msgs);
  luaL_getsubtable(L, -1, "handler");
  lua_pushcfunction(L, l_idle_state);
  lua_setfield(L, -2, "idle_state");
  lua_pushcfunction(L, l_logging);
  lua_setfield(L, -2, "logging");
  lua_pop(L, 1);
  luaL_getsubtable(L, -1, "codec");
  lua_pushcfunction(L, l_resp);
  lua_setfield(L, -2, "resp");
  lua_pop(L, 1);
}

lnr_module_t lnr_handlers_module = {.name = "handlers", .open = open_handlers};
