/*
 * lhttp_lane.c -- the fast paths of netrun.http's client (lhttp_pool.c):
 * the lane, client:request(opts, cb) made without Lua between the call
 * and the pool, and the forwarder, a proxy's requests with their options
 * set once. They take the pool's structures through lhttp_pool.h.
 * Loop thread only, on the state that owns the pool.
 */
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "lhttp_pool.h"

/* ---- the lane: client:request(opts, cb) without Lua ---------------------------------- */

enum { UP_CLIENT = 1, UP_POOLS, UP_URLS, UP_SLOW, UP_POOL_MT, UP_KEYS };
/* The client fields read, as strings made once (upvalues from UP_KEYS). */
enum { K_ID, K_TIMEOUT, K_FOLLOW, K_N };

/* A parsed URL's slots (http.lua's parsed). */
enum { U_SCHEME = 1, U_HOST, U_PORT, U_TARGET, U_HOSTHDR, U_KEY };

static int get(lua_State *L, int t, int k) {
  lua_pushvalue(L, lua_upvalueindex(UP_KEYS + k));
  return lua_rawget(L, t);
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

static int lane_request(lua_State *L) {
  lua_settop(L, 3);
  if (!lua_getmetatable(L, 1) ||
      !lua_rawequal(L, -1, lua_upvalueindex(UP_CLIENT)))
    goto slow;                           /* (http.lua says what is wrong) */
  const int o = 4;                       /* the options' slots */
  lua_settop(L, o + LNR_HOPT_N - 1);
  if (lnr_http_check_request(L, 2, o)) {  /* "2.5": the slow path's numbers */
    lnr_http_converted(L, 2, o);
    lua_replace(L, 2);
    goto slow;
  }
  nr_loop_t *loop = nr_loop_current();
  if (lua_type(L, 3) != LUA_TFUNCTION || loop == NULL ||
      loop == lnr_main_loop() || !lua_isnil(L, o + LNR_HOPT_TLS) || !lua_isnil(L, o + LNR_HOPT_FOLLOW) ||
      !lua_isnil(L, o + LNR_HOPT_MAX_BODY) || !lua_isnil(L, o + LNR_HOPT_STREAM) ||
      !lua_isnil(L, o + LNR_HOPT_UPSTREAM) ||    /* (upstream.lua picks) */
      lua_type(L, o + LNR_HOPT_URL) != LUA_TSTRING)
    goto slow;
  if (get(L, 1, K_FOLLOW) != LUA_TNIL)
    goto slow;
  get(L, 1, K_TIMEOUT);
  double timeout = lua_tonumber(L, -1);
  if (!lua_isnil(L, o + LNR_HOPT_TIMEOUT) &&
      lua_tonumber(L, o + LNR_HOPT_TIMEOUT) != timeout)
    goto slow;
  lua_pushvalue(L, o + LNR_HOPT_URL);
  if (lua_rawget(L, lua_upvalueindex(UP_URLS)) != LUA_TTABLE)
    goto slow;                           /* not parsed yet */
  const int url = lua_gettop(L);
  if (lua_rawgeti(L, url, U_SCHEME) != LUA_TSTRING)
    goto slow;                           /* a bad URL */
  bool fwd = !lua_isnil(L, o + LNR_HOPT_FORWARD);
  if (fwd) {                             /* a forwarded request's URL names */
    size_t n;                            /* only the origin */
    lua_rawgeti(L, url, U_TARGET);
    const char *t = lua_tolstring(L, -1, &n);
    if (n != 1 || t[0] != '/')
      goto slow;
  } else if (!lua_isnil(L, o + LNR_HOPT_HEADERS) ||
             (!lua_isnil(L, o + LNR_HOPT_METHOD) &&
              !plain_method(L, o + LNR_HOPT_METHOD))) {
    goto slow;                           /* headers merged with Host there */
  }
  get(L, 1, K_ID);
  if (lua_rawget(L, lua_upvalueindex(UP_POOLS)) != LUA_TTABLE)
    goto slow;
  lua_rawgeti(L, url, U_KEY);
  lua_rawget(L, -2);
  hpool_t *P = lua_touserdata(L, -1);
  if (P == NULL || !lua_getmetatable(L, -1) ||
      !lua_rawequal(L, -1, lua_upvalueindex(UP_POOL_MT)) || P->S == NULL ||
      stale(L, P))
    goto slow;
  lua_pop(L, 1);
  const int pidx = lua_gettop(L);
  hreq_t *q = lnr_pool_new_req(L, P, true, timeout);
  const int u = lua_gettop(L);
  lua_pushvalue(L, 3);
  lua_setiuservalue(L, u, UV_TARGET);
  if (fwd) {
    lua_pushvalue(L, o + LNR_HOPT_FORWARD);
    lua_setiuservalue(L, u, UV_FORWARD);
    lua_pushvalue(L, o + LNR_HOPT_HEADERS);
    lua_setiuservalue(L, u, UV_HEADERS);
    lua_rawgeti(L, url, U_HOSTHDR);
    lua_setiuservalue(L, u, UV_HOST);
  } else {
    if (lua_isnil(L, o + LNR_HOPT_METHOD))
      lua_pushliteral(L, "GET");
    else
      lua_pushvalue(L, o + LNR_HOPT_METHOD);
    lua_setiuservalue(L, u, UV_METHOD);
    lua_rawgeti(L, url, U_TARGET);
    lua_setiuservalue(L, u, UV_PATH);
    lua_createtable(L, 0, 1);
    lua_rawgeti(L, url, U_HOSTHDR);
    lua_setfield(L, -2, "host");
    lua_setiuservalue(L, u, UV_HEADERS);
    lua_pushvalue(L, o + LNR_HOPT_BODY);
    lua_setiuservalue(L, u, UV_BODY);
  }
  lua_pushvalue(L, o + LNR_HOPT_URL);
  lua_setiuservalue(L, u, UV_URL);
  lnr_pool_send_req(L, P, pidx, q);
  return 0;
slow:                                    /* http.lua's, with what was given */
  lua_settop(L, 3);
  lua_pushvalue(L, lua_upvalueindex(UP_SLOW));
  lua_insert(L, 1);
  lua_call(L, 3, LUA_MULTRET);
  return lua_gettop(L);
}

/* ---- a forwarder: a proxy's requests with their options set once -------------- */

enum { F_CLIENT = 1, F_POOLS, F_KEY, F_HOST, F_HEADERS, F_URL, F_SLOW, F_BUFFER,
       F_POOL_MT, F_ID, F_TIMEOUT, F_N = F_TIMEOUT };

/* A stream forwarder's pool when none was found: `slow` makes it. */
static hpool_t *made_pool(lua_State *L) {
  lua_settop(L, 4);                      /* (the pool at 5) */
  lua_pushvalue(L, lua_upvalueindex(F_SLOW));
  lua_call(L, 0, 1);
  hpool_t *P = lua_touserdata(L, 5);
  if (P == NULL || !lua_getmetatable(L, 5) ||
      !lua_rawequal(L, -1, lua_upvalueindex(F_POOL_MT)) || P->S == NULL)
    luaL_error(L, "netrun.http forwarder: no pool for the backend");
  lua_settop(L, 5);
  return P;
}

/* forward(req, callback): client:request({ url, forward = req, headers },
 * callback) with the options checked when the forwarder was made. A
 * stream forwarder's forward(req, callback, ctx) streams the exchange
 * (lhttp_xfer.c). */
static int forward_call(lua_State *L) {
  lua_Integer buffer = lua_tointeger(L, lua_upvalueindex(F_BUFFER));
  const int nargs = buffer > 0 ? 3 : 2, pidx = nargs + 2;
  lua_settop(L, nargs);
  if (!lnr_http_is_request(L, 1))
    return luaL_error(L, "netrun.http forwarder: forward(req, callback): req "
                      "must be a request of netrun.codec.http_server, got %s",
                      luaL_typename(L, 1));
  if (lua_type(L, 2) != LUA_TFUNCTION)
    return luaL_error(L, "netrun.http forwarder: the callback must be a "
                      "function, got %s", luaL_typename(L, 2));
  nr_loop_t *loop = nr_loop_current();
  if (loop == NULL || loop == lnr_main_loop())
    return luaL_error(L, "netrun.http forwarder: call it on a loop");
  lua_pushvalue(L, lua_upvalueindex(F_ID));
  lua_rawget(L, lua_upvalueindex(F_CLIENT));
  hpool_t *P = NULL;
  if (lua_rawget(L, lua_upvalueindex(F_POOLS)) == LUA_TTABLE) {
    lua_pushvalue(L, lua_upvalueindex(F_KEY));
    lua_rawget(L, -2);
    P = lua_touserdata(L, -1);
    if (P && (!lua_getmetatable(L, -1) ||
              !lua_rawequal(L, -1, lua_upvalueindex(F_POOL_MT)) || P->S == NULL ||
              stale(L, P)))
      P = NULL;
    lua_settop(L, pidx);                 /* the pool at pidx */
  }
  if (P == NULL && buffer > 0)
    P = made_pool(L);
  if (P == NULL) {                       /* no pool yet: http.lua makes it */
    lua_settop(L, 2);
    lua_pushvalue(L, lua_upvalueindex(F_SLOW));
    lua_insert(L, 1);
    lua_call(L, 2, 0);
    return 0;
  }
  lua_pushvalue(L, lua_upvalueindex(F_TIMEOUT));
  lua_rawget(L, lua_upvalueindex(F_CLIENT));
  double timeout = lua_tonumber(L, -1);
  lua_pop(L, 1);
  hxfer_t *x = NULL;
  if (buffer > 0) {
    x = lnr_xfer_new(L, 1, 3, (size_t)buffer);
    lua_pushvalue(L, lua_upvalueindex(F_HEADERS));
    lnr_xfer_push_headers(L, x, 1, pidx + 1);
    lua_replace(L, pidx + 1);            /* the head's fields */
  }
  hreq_t *q = lnr_pool_new_req(L, P, true, timeout);
  if (x != NULL)
    lnr_xfer_bind(x, q);
  const int u = lua_gettop(L);
  static const struct { int uv, from; } set[] = {
      {UV_TARGET, 2}, {UV_FORWARD, 1}, {UV_HEADERS, -F_HEADERS},
      {UV_HOST, -F_HOST}, {UV_URL, -F_URL}};
  for (size_t i = 0; i < sizeof set / sizeof set[0]; i++) {
    lua_pushvalue(L, set[i].from > 0 ? set[i].from
                                     : lua_upvalueindex(-set[i].from));
    lua_setiuservalue(L, u, set[i].uv);
  }
  if (x != NULL) {
    lua_pushvalue(L, pidx + 1);
    lua_setiuservalue(L, u, UV_HEADERS);
  }
  lnr_pool_send_req(L, P, pidx, q);
  return 0;
}

/* core.http.forwarder(client, pools, key, host, headers, url, slow
 * [, buffer]): buffer > 0 makes a stream forwarder, whose slow() returns
 * the pool */
int lnr_http_forwarder(lua_State *L) {
  luaL_checktype(L, 1, LUA_TTABLE);
  luaL_checktype(L, 2, LUA_TTABLE);
  luaL_checkstring(L, 3);
  luaL_checkstring(L, 4);
  luaL_checkstring(L, 6);
  luaL_checktype(L, 7, LUA_TFUNCTION);
  lua_Integer buffer = luaL_optinteger(L, 8, 0);
  lua_settop(L, 7);
  lua_pushinteger(L, buffer < 0 ? 0 : buffer > INT_MAX ? INT_MAX : buffer);
  luaL_getmetatable(L, POOL_CLASS);
  lua_pushliteral(L, "id");
  lua_pushliteral(L, "timeout");
  lua_pushcclosure(L, forward_call, F_N);
  return 1;
}

/* core.http.lane { Client, pools, urls, slow } --> request */
int lnr_http_lane(lua_State *L) {
  static const char *const ups[] = {"Client", "pools", "urls", "slow"};
  static const char *const keys[] = {[K_ID] = "id", [K_TIMEOUT] = "timeout",
                                     [K_FOLLOW] = "follow"};
  luaL_checktype(L, 1, LUA_TTABLE);
  lua_settop(L, 1);
  for (int i = 0; i < UP_POOL_MT - 1; i++)
    if (lua_getfield(L, 1, ups[i]) == LUA_TNIL)
      return luaL_error(L, "core.http.lane: %s missing", ups[i]);
  luaL_getmetatable(L, POOL_CLASS);
  for (int i = 0; i < K_N; i++)
    lua_pushstring(L, keys[i]);
  lua_pushcclosure(L, lane_request, UP_KEYS - 1 + K_N);
  return 1;
}
