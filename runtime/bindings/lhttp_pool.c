/*
 * lhttp_pool.c -- netrun.http's connection pool on its usual path, in C.
 *
 * The pool is netrun.http's (lua/netrun/http.lua): its tables, its rules.
 * What is here walks the same tables for the two steps every request
 * takes when nothing unusual happens, where the Lua path made a dozen
 * function calls and ~300 bytecodes per request (a proxy's every request
 * takes both):
 *
 *   request(client, opts, cb) -- client:request with a callback: checks
 *       the options (lnr_http_check_request, raising as it does), then, if
 *       the request is a plain one (no redirects, TLS config, limit or
 *       timeout of its own; a URL already parsed; a pool with an idle
 *       connection), makes its request table as request_with does, takes
 *       the idle connection and writes the request on it: true. Anything
 *       else: false, having changed nothing but dropped dead connections
 *       off the idle list, and the Lua path runs (and checks again).
 *   channel_read(conn, ctx, res) -- Conn.channel_read: a keep-alive
 *       response to a request with a callback, on a connection that goes
 *       back to an idle list nobody waits on: the connection is put back
 *       and the callback runs (an error in it is logged). Anything else:
 *       the Lua channel_read.
 *
 * Both are made by core.http.lane { Client, pools, urls, watch, slow_read,
 * traceback } (http.lua's own tables and functions, as upvalues), once per
 * state. Loop thread only (http.lua calls them there).
 */
#include <math.h>
#include <stdbool.h>

#include "lnr.h"

enum { UP_CLIENT = 1, UP_POOLS, UP_URLS, UP_WATCH, UP_SLOW_READ, UP_TRACEBACK,
       UP_KEYS };

/* The field names read and written, as strings made once (upvalues from
 * UP_KEYS on): fields are read raw, by a string already interned. (No
 * field read here is behind a metatable: a connection's and the client's
 * methods are not read.) */
#define KEYS(X)                                                              \
  X(REQ, "req") X(POOL, "pool") X(DEAD, "dead") X(WHEAD, "whead")            \
  X(WTAIL, "wtail") X(SWEEPING, "sweeping") X(NIDLE, "nidle")                \
  X(IDLE, "idle") X(SINCE, "since") X(ID, "id") X(TIMEOUT, "timeout")        \
  X(FOLLOW, "follow") X(DTIMER, "dtimer") X(DAT, "dat") X(REUSED, "reused")  \
  X(CTX, "ctx") X(KEEP_ALIVE, "keep_alive") X(HOST, "host")
#define KEY_ENUM(e, s) K_##e,
enum { KEYS(KEY_ENUM) K_N };
#define KEY_NAME(e, s) s,
static const char *const key_names[] = {KEYS(KEY_NAME)};
#define NUPS (UP_KEYS - 1 + K_N)

/* A request table's slots (http.lua's POOL .. OPTS). */
enum { R_POOL = 1, R_METHOD, R_PATH, R_HEADERS, R_BODY, R_FORWARD, R_HOST,
       R_URL, R_PROMISE, R_CB, R_TIMEOUT, R_DEADLINE, R_PDEADLINE, R_CONN,
       R_DONE, R_RETRIED, R_TIMER, R_TLS, R_FOLLOW, R_OPTS };

/* A parsed URL's slots (http.lua's parsed). */
enum { U_SCHEME = 1, U_HOST, U_PORT, U_TARGET, U_HOSTHDR, U_KEY };

static double now(void) { return (double)nr_now() / 1e9; }

/* Push t[k] (t at an absolute index, k a K_*), raw: its type. (The
 * upvalues are the C closure's own: these run only in lane_request and
 * lane_read.) */
static int get(lua_State *L, int t, int k) {
  lua_pushvalue(L, lua_upvalueindex(UP_KEYS + k));
  return lua_rawget(L, t);
}

/* t[k] = the value on top (popped), raw. */
static void set(lua_State *L, int t, int k) {
  lua_pushvalue(L, lua_upvalueindex(UP_KEYS + k));
  lua_insert(L, -2);
  lua_rawset(L, t);
}

/* t[k] is neither nil nor false. */
static bool has(lua_State *L, int t, int k) {
  get(L, t, k);
  bool b = lua_toboolean(L, -1);
  lua_pop(L, 1);
  return b;
}

static bool has_i(lua_State *L, int t, int i) {
  lua_rawgeti(L, t, i);
  bool b = lua_toboolean(L, -1);
  lua_pop(L, 1);
  return b;
}

static lua_Integer int_field(lua_State *L, int t, int k) {
  get(L, t, k);
  lua_Integer n = lua_tointeger(L, -1);
  lua_pop(L, 1);
  return n;
}

/* A method the Lua path would send as it is: upper-case letters only. */
static bool plain_method(lua_State *L, int idx) {
  size_t n;
  const char *s = lua_tolstring(L, idx, &n);
  if (n == 0 || n > 16)
    return false;
  for (size_t i = 0; i < n; i++)
    if (s[i] < 'A' || s[i] > 'Z')
      return false;
  return true;
}

/* Take an idle connection of the pool at pool that is not dead: pushed,
 * true; or false, nothing pushed (dead ones met are dropped, as the Lua
 * path drops them). */
static bool take_idle(lua_State *L, int pool) {
  lua_Integer n = int_field(L, pool, K_NIDLE);
  if (n <= 0)
    return false;
  get(L, pool, K_IDLE);
  int idle = lua_gettop(L);
  bool found = false;
  while (n > 0 && !found) {
    lua_rawgeti(L, idle, n);
    lua_pushnil(L);
    lua_rawseti(L, idle, n);
    n--;
    found = lua_type(L, -1) == LUA_TTABLE && !has(L, lua_gettop(L), K_DEAD);
    if (!found)
      lua_pop(L, 1);
  }
  lua_pushinteger(L, n);
  set(L, pool, K_NIDLE);
  if (found)
    lua_replace(L, idle);
  else
    lua_pop(L, 1);
  return found;
}

static int lane_request(lua_State *L) {
  lua_settop(L, 3);
  nr_loop_t *loop = nr_loop_current();
  if (lua_type(L, 3) != LUA_TFUNCTION || loop == NULL ||
      loop == lnr_main_loop() || !lua_getmetatable(L, 1) ||
      !lua_rawequal(L, -1, lua_upvalueindex(UP_CLIENT)))
    goto slow;                           /* (the Lua path says what is wrong) */
  const int o = 4;                       /* the options' slots */
  lua_settop(L, o + LNR_HOPT_N - 1);
  lnr_http_check_request(L, 2, o);
  if (!lua_isnil(L, o + LNR_HOPT_TLS) || !lua_isnil(L, o + LNR_HOPT_FOLLOW) ||
      !lua_isnil(L, o + LNR_HOPT_MAX_BODY) ||
      lua_type(L, o + LNR_HOPT_URL) != LUA_TSTRING || has(L, 1, K_FOLLOW))
    goto slow;
  get(L, 1, K_TIMEOUT);
  double timeout = lua_tonumber(L, -1);
  lua_pop(L, 1);
  if (!lua_isnil(L, o + LNR_HOPT_TIMEOUT) &&
      lua_tonumber(L, o + LNR_HOPT_TIMEOUT) != timeout)
    goto slow;
  lua_pushvalue(L, o + LNR_HOPT_URL);
  if (lua_rawget(L, lua_upvalueindex(UP_URLS)) != LUA_TTABLE)
    goto slow;                           /* not parsed yet */
  const int u = lua_gettop(L);
  if (lua_rawgeti(L, u, U_SCHEME) != LUA_TSTRING)
    goto slow;                           /* a bad URL */
  bool fwd = !lua_isnil(L, o + LNR_HOPT_FORWARD);
  if (fwd) {                             /* a forwarded request's URL names */
    size_t n;                            /* only the origin */
    lua_rawgeti(L, u, U_TARGET);
    const char *t = lua_tolstring(L, -1, &n);
    if (n != 1 || t[0] != '/')
      goto slow;
  } else if (!lua_isnil(L, o + LNR_HOPT_HEADERS) ||
             (!lua_isnil(L, o + LNR_HOPT_METHOD) &&
              !plain_method(L, o + LNR_HOPT_METHOD))) {
    goto slow;                           /* headers merged with Host there */
  }
  /* its pool, with an idle connection */
  get(L, 1, K_ID);
  if (lua_rawget(L, lua_upvalueindex(UP_POOLS)) != LUA_TTABLE)
    goto slow;
  lua_rawgeti(L, u, U_KEY);
  if (lua_rawget(L, -2) != LUA_TTABLE)
    goto slow;
  const int pool = lua_gettop(L);
  if (!take_idle(L, pool))
    goto slow;
  const int conn = lua_gettop(L);
  /* the request table, as request_with makes it */
  lua_createtable(L, R_OPTS, 0);
  const int req = lua_gettop(L);
  lua_pushvalue(L, pool);
  lua_rawseti(L, req, R_POOL);
  if (fwd) {
    lua_pushvalue(L, o + LNR_HOPT_FORWARD);
    lua_rawseti(L, req, R_FORWARD);
    lua_pushboolean(L, 0);
    lua_rawseti(L, req, R_METHOD);
    if (!lua_isnil(L, o + LNR_HOPT_HEADERS)) {
      lua_pushvalue(L, o + LNR_HOPT_HEADERS);
      lua_rawseti(L, req, R_HEADERS);
    }
    lua_rawgeti(L, u, U_HOSTHDR);
    lua_rawseti(L, req, R_HOST);
  } else {
    if (lua_isnil(L, o + LNR_HOPT_METHOD))
      lua_pushliteral(L, "GET");
    else
      lua_pushvalue(L, o + LNR_HOPT_METHOD);
    lua_rawseti(L, req, R_METHOD);
    lua_rawgeti(L, u, U_TARGET);
    lua_rawseti(L, req, R_PATH);
    lua_createtable(L, 0, 1);
    lua_rawgeti(L, u, U_HOSTHDR);
    set(L, lua_gettop(L) - 1, K_HOST);
    lua_rawseti(L, req, R_HEADERS);
    if (!lua_isnil(L, o + LNR_HOPT_BODY)) {
      lua_pushvalue(L, o + LNR_HOPT_BODY);
      lua_rawseti(L, req, R_BODY);
    }
  }
  lua_pushvalue(L, o + LNR_HOPT_URL);
  lua_rawseti(L, req, R_URL);
  lua_pushvalue(L, 3);
  lua_rawseti(L, req, R_CB);
  lua_pushnumber(L, timeout);
  lua_rawseti(L, req, R_TIMEOUT);
  double deadline = timeout > 0 ? now() + timeout : HUGE_VAL;
  lua_pushnumber(L, deadline);
  lua_rawseti(L, req, R_DEADLINE);
  if (timeout > 0) {                     /* watched by the pool's timer */
    lua_pushboolean(L, 1);
    lua_rawseti(L, req, R_PDEADLINE);
    bool armed = has(L, pool, K_DTIMER);
    if (armed) {
      get(L, pool, K_DAT);
      armed = lua_tonumber(L, -1) <= deadline;
      lua_pop(L, 1);
    }
    if (!armed) {                        /* (watch arms it) */
      lua_pushvalue(L, lua_upvalueindex(UP_WATCH));
      lua_pushvalue(L, pool);
      lua_pushvalue(L, req);
      lua_call(L, 2, 0);
    }
  }
  /* start: sent on the connection, as ctx:write_and_flush(req, VOID) */
  lua_pushvalue(L, req);
  set(L, conn, K_REQ);
  lua_pushboolean(L, 1);
  set(L, conn, K_REUSED);
  lua_pushvalue(L, conn);
  lua_rawseti(L, req, R_CONN);
  get(L, conn, K_CTX);
  nr_ctx_t *ctx = lnr_check_ctx(L, -1);
  lnr_msgbuf_t m;
  nr_ctx_write(ctx, lnr_to_msg(L, req, nr_ctx_channel(ctx), &m), NULL);
  lnr_msg_done(&m);                      /* (a failure went to exception_caught) */
  nr_ctx_flush(ctx);
  lua_pushboolean(L, 1);
  return 1;
slow:
  lua_pushboolean(L, 0);
  return 1;
}

static int lane_read(lua_State *L) {
  lua_settop(L, 3);
  const int req = 4, pool = 5, cb = 6;
  if (get(L, 1, K_REQ) != LUA_TTABLE)
    goto slow;
  int t = lua_type(L, 3);                /* a raw response is kept alive */
  if (t == LUA_TTABLE ? !has(L, 3, K_KEEP_ALIVE) : t != LUA_TUSERDATA)
    goto slow;
  if (get(L, 1, K_POOL) != LUA_TTABLE || has(L, 1, K_DEAD) ||
      int_field(L, pool, K_WHEAD) <= int_field(L, pool, K_WTAIL) ||
      !has(L, pool, K_SWEEPING) || has_i(L, req, R_DONE) ||
      has_i(L, req, R_FOLLOW) || has_i(L, req, R_TIMER) ||
      lua_rawgeti(L, req, R_CB) != LUA_TFUNCTION)
    goto slow;
  /* release: back to the idle list */
  lua_pushnil(L);
  set(L, 1, K_REQ);
  lua_pushnumber(L, now());
  set(L, 1, K_SINCE);
  lua_Integer n = int_field(L, pool, K_NIDLE) + 1;
  get(L, pool, K_IDLE);
  lua_pushvalue(L, 1);
  lua_rawseti(L, -2, n);
  lua_pop(L, 1);
  lua_pushinteger(L, n);
  set(L, pool, K_NIDLE);
  /* settle */
  lua_pushboolean(L, 1);
  lua_rawseti(L, req, R_DONE);
  lua_pushvalue(L, lua_upvalueindex(UP_TRACEBACK));
  lua_pushvalue(L, cb);
  lua_pushvalue(L, 3);
  if (lua_pcall(L, 1, 0, cb + 1) != LUA_OK)
    nr_log(NR_LOG_ERROR, "netrun.http: a request's callback failed: %s",
           lua_tostring(L, -1) ? lua_tostring(L, -1) : "(an error object)");
  return 0;
slow:
  lua_settop(L, 3);
  lua_pushvalue(L, lua_upvalueindex(UP_SLOW_READ));
  lua_insert(L, 1);
  lua_call(L, 3, 0);
  return 0;
}

/* core.http.lane { Client, pools, urls, watch, slow_read, traceback }
 *   --> request, channel_read */
static int l_lane(lua_State *L) {
  static const char *const ups[] = {"Client", "pools", "urls", "watch",
                                    "slow_read", "traceback"};
  luaL_checktype(L, 1, LUA_TTABLE);
  lua_settop(L, 1);
  for (int i = 0; i < UP_KEYS - 1; i++)
    if (lua_getfield(L, 1, ups[i]) == LUA_TNIL)
      return luaL_error(L, "core.http.lane: %s missing", ups[i]);
  for (int i = 0; i < K_N; i++)
    lua_pushstring(L, key_names[i]);
  for (int i = 0; i < NUPS; i++)
    lua_pushvalue(L, 2 + i);
  lua_pushcclosure(L, lane_request, NUPS);
  lua_insert(L, 2);
  lua_pushcclosure(L, lane_read, NUPS);
  return 2;
}

void lnr_open_http_pool(lua_State *L) {
  lua_getfield(L, -1, "http");                 /* made by lnr_open_http */
  lua_pushcfunction(L, l_lane);
  lua_setfield(L, -2, "lane");
  lua_pop(L, 1);
}
