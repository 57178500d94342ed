/*
 * lhttp_pool_lua.c -- netrun.http's pools as Lua sees them (core.http.pool,
 * P:send, P:connected, P:connect_failed, P:stats, the class and module
 * row), apart from lhttp_pool.c (pools, connections, requests), whose
 * entry points it calls through lhttp_pool.h. Loop thread only.
 */
#include <limits.h>
#include <stdlib.h>

#include "lhttp_pool.h"

/* ---- Lua ------------------------------------------------------------------------------ */

static hpool_t *check_pool(lua_State *L) {
  hpool_t *P = luaL_checkudata(L, 1, POOL_CLASS);
  if (P->S == NULL)
    luaL_error(L, POOL_CLASS ": closed");
  return P;
}

static void hold(lua_State *L, hpool_t *P, int idx) {
  if (P->self_ref == LUA_NOREF) {
    lua_pushvalue(L, idx);
    P->self_ref = luaL_ref(L, LUA_REGISTRYINDEX);
  }
}

/* Send the request userdata on top of the stack (popped) through P (at
 * stack index pidx). */
void lnr_pool_send_req(lua_State *L, hpool_t *P, int pidx, hreq_t *q) {
  q->pool = P;
  if (q->ref == LUA_NOREF)
    q->ref = luaL_ref(L, LUA_REGISTRYINDEX);
  else
    lua_pop(L, 1);                       /* (a spare: anchored) */
  hold(L, P, pidx);
  lnr_pool_enter(P);
  if (q->deadline)
    lnr_pool_deadline_insert(P, q);
  lnr_pool_acquire(L, P, q);
  lnr_pool_leave(L, P);
}

/* Push a new request (a spare of P's if it has one; its uservalues nil). */
hreq_t *lnr_pool_new_req(lua_State *L, hpool_t *P, bool callback,
                         double timeout) {
  hreq_t *q;
  int ref = LUA_NOREF;
  if (P->nspare > 0) {
    q = P->spare[--P->nspare];
    ref = q->ref;
    lua_rawgeti(L, LUA_REGISTRYINDEX, ref);
  } else {
    q = lua_newuserdatauv(L, sizeof *q, UV_N);
  }
  *q = (hreq_t){.callback = callback, .timeout = timeout, .ref = ref};
  if (timeout > 0 && timeout < 1e9)  /* (longer: none, ~31 years) */
    q->deadline = nr_now() + (uint64_t)(timeout * 1e9);
  return q;
}

/* P:send(target, method, path, headers, body, forward, host, url, timeout, tls)
 * --> true; false (nothing done) when the pool takes no more requests:
 * its TLS config changed since it was made (http.lua then makes another). */
static int p_send(lua_State *L) {
  hpool_t *P = check_pool(L);
  if (stale(L, P)) {
    lua_pushboolean(L, 0);
    return 1;
  }
  lua_settop(L, 11);
  double timeout = luaL_optnumber(L, 10, 0);
  hreq_t *q = lnr_pool_new_req(L, P, lua_type(L, 2) == LUA_TFUNCTION, timeout);
  int u = lua_gettop(L);
  static const int from[] = {[UV_TARGET] = 2, [UV_METHOD] = 3, [UV_PATH] = 4,
                             [UV_HEADERS] = 5, [UV_BODY] = 6, [UV_FORWARD] = 7,
                             [UV_HOST] = 8, [UV_URL] = 9, [UV_TLS] = 11};
  for (int i = 1; i <= UV_N; i++) {
    lua_pushvalue(L, from[i]);
    lua_setiuservalue(L, u, i);
  }
  lnr_pool_send_req(L, P, 1, q);
  lua_pushboolean(L, 1);
  return 1;
}

/* P:connected(ch) */
static int p_connected(lua_State *L) {
  hpool_t *P = check_pool(L);
  nr_channel_t *ch = lnr_check_handle(L, 2, LNR_CHANNEL);
  lnr_pool_enter(P);
  P->connecting--;
  nr_ctx_t *ctx = nr_pipeline_context(nr_channel_pipeline(ch), "client");
  hconn_t *c = ctx && nr_ctx_handler(ctx) == &lnr_pool_conn_vt ? nr_ctx_state(ctx) : NULL;
  if (c == NULL || c->pool != P) {   /* gone meanwhile */
    P->total--;
    lnr_pool_lost(L, P);
  } else {
    c->ready = true;
    if (!c->h2)
      P->h1_seen = true;
    if (c->dead || !nr_channel_is_active(ch))
      lnr_pool_conn_gone(L, c);
    else
      lnr_pool_release(L, c);
    lnr_pool_lost(L, P);              /* HTTP/1.1: more connections for the rest */
  }
  lnr_pool_leave(L, P);
  return 0;
}

/* P:connect_failed(message): the first request waiting fails with it. */
static int p_connect_failed(lua_State *L) {
  hpool_t *P = check_pool(L);
  const char *msg = luaL_checkstring(L, 2);
  lnr_pool_enter(P);
  P->connecting--;
  P->total--;
  lnr_pool_fail_first(L, P, msg);
  lnr_pool_lost(L, P);
  lnr_pool_leave(L, P);
  return 0;
}

static int p_stats(lua_State *L) {
  hpool_t *P = check_pool(L);
  lua_createtable(L, 0, 3);
  lua_pushinteger(L, P->nidle);
  lua_setfield(L, -2, "idle");
  lua_pushinteger(L, P->total);
  lua_setfield(L, -2, "total");
  lua_pushinteger(L, P->nwait);
  lua_setfield(L, -2, "waiting");
  return 1;
}

/* The state closes: connections left are detached (their handlers free
 * themselves), timers dropped. */
static int p_gc(lua_State *L) {
  hpool_t *P = luaL_checkudata(L, 1, POOL_CLASS);
  lnr_pool_drop_timer(&P->dtimer);
  lnr_pool_drop_timer(&P->sweeper);
  if (P->tls != NULL)
    nr_tls_config_release(P->tls);
  P->tls = NULL;
  for (hconn_t *c = P->all, *n; c; c = n) {
    n = c->anext;
    c->pool = NULL;
    c->req = NULL;
    c->flight = NULL;
    c->nflight = 0;
    c->anext = c->aprev = c->inext = c->iprev = NULL;
    c->idle = false;
  }
  P->all = P->idle = P->h2c = NULL;
  P->S = NULL;
  return 0;
}

static int p_tostring(lua_State *L) {
  hpool_t *P = luaL_checkudata(L, 1, POOL_CLASS);
  lua_pushfstring(L, POOL_CLASS " (%d connections, %d idle, %d waiting)",
                  P->total, P->nidle, P->nwait);
  return 1;
}

static int ref_function(lua_State *L, const char *k) {
  if (lua_getfield(L, 1, k) != LUA_TFUNCTION)
    luaL_error(L, "core.http.pool: %s must be a function", k);
  return luaL_ref(L, LUA_REGISTRYINDEX);
}

/* core.http.pool { max, keepalive, max_waiting, connect, empty, tls } */
static int l_pool(lua_State *L) {
  luaL_checktype(L, 1, LUA_TTABLE);
  lnr_state_t *S = lnr_state(L);
  nr_loop_t *loop = nr_loop_current();
  if (S == NULL || loop == NULL || loop == lnr_main_loop())
    return luaL_error(L, "core.http.pool: on a loop only");
  lua_getfield(L, 1, "max");
  lua_getfield(L, 1, "keepalive");
  lua_getfield(L, 1, "max_waiting");
  lua_getfield(L, 1, "h2");
  lua_Integer max = luaL_checkinteger(L, -4);
  double keepalive = luaL_checknumber(L, -3);
  lua_Integer max_wait = luaL_optinteger(L, -2, 1024);
  bool maybe_h2 = lua_toboolean(L, -1);
  lua_pop(L, 4);
  hpool_t *P = lua_newuserdatauv(L, sizeof *P, 0);
  *P = (hpool_t){.S = S, .loop = loop, .self_ref = LUA_NOREF,
                 .connect_ref = LUA_NOREF, .empty_ref = LUA_NOREF,
                 .max = max < 1 ? 1 : max > 1 << 20 ? 1 << 20 : (int)max,
                 .keepalive = keepalive < 1e9 ? (uint64_t)(keepalive * 1e9)
                                              : (uint64_t)1e18,   /* (~31 years) */
                 .max_wait = max_wait < 0 ? 0 : max_wait > INT_MAX ? INT_MAX
                                                                   : (int)max_wait,
                 .maybe_h2 = maybe_h2};
  luaL_setmetatable(L, POOL_CLASS);
  P->connect_ref = ref_function(L, "connect");
  P->empty_ref = ref_function(L, "empty");
  if (lua_getfield(L, 1, "tls") != LUA_TNIL) {
    P->tls = nr_tls_config_retain(lnr_check_handle(L, -1, LNR_TLS));
    P->tls_gen = nr_tls_config_generation(P->tls);
    nr_tls_config_identity(P->tls, P->tls_id);  /* (after the generation) */
  }
  lua_pop(L, 1);
  return 1;
}

static void open_http_pool(lua_State *L) {
  static const luaL_Reg methods[] = {
      {"send", p_send}, {"connected", p_connected},
      {"connect_failed", p_connect_failed}, {"stats", p_stats}, {NULL, NULL}};
  lnr_native_class(L, POOL_CLASS, lnr_pool_make_conn, p_tostring);
  luaL_getmetatable(L, POOL_CLASS);
  luaL_newlib(L, methods);
  lua_setfield(L, -2, "__index");
  lua_pushcfunction(L, p_gc);
  lua_setfield(L, -2, "__gc");
  lua_pop(L, 1);
  lua_getfield(L, -1, "http");                 /* made by the http row, before */
  lua_pushcfunction(L, l_pool);
  lua_setfield(L, -2, "pool");
  lua_pushcfunction(L, lnr_http_lane);
  lua_setfield(L, -2, "lane");
  lua_pushcfunction(L, lnr_http_forwarder);
  lua_setfield(L, -2, "forwarder");
  lua_pop(L, 1);
}

lnr_module_t lnr_http_pool_module = {.name = "http_pool", .open = open_http_pool};
