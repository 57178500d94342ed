/*
 * module.c -- luaopen_netrun_core: the C half of require "netrun". The Lua
 * half (lua/netrun/init.lua) builds the public module on top of it.
 */
#include "lmain.h"
#include "lnr.h"

/* core.transfer(...): pack and unpack in this state -- what another state
 * would receive. For tests and the curious. */
static int l_transfer(lua_State *L) {
  int n = lua_gettop(L);
  lnr_blob_t *b = lnr_pack(L, 1, n, "argument");
  lua_settop(L, 0);
  int got = lnr_unpack(L, b);
  lnr_blob_free(b);
  return got;
}

/* core.now(): the monotonic clock in seconds. */
static int l_now(lua_State *L) {
  lua_pushnumber(L, (double)nr_now() / 1e9);
  return 1;
}

int luaopen_netrun_core(lua_State *L) {
  lnr_open_state(L);
  lnr_open_transfer(L);
  lua_newtable(L);
  lnr_open_group(L);
  lnr_open_future(L);
  lnr_open_channel(L);
  lnr_open_pipeline(L);
  lnr_open_dict(L);
  lnr_open_console(L);
  lnr_open_dns(L);
  /* Batteries: each fills core.codec / core.handler (see lnr.h). */
  lua_newtable(L);
  lua_setfield(L, -2, "codec");
  lua_newtable(L);
  lua_setfield(L, -2, "handler");
  lnr_open_codec(L);
  lnr_open_http(L);
  lnr_open_http_client(L);
  lnr_open_http_pool(L);
  lnr_open_handlers(L);
  lnr_open_tls(L);
  lnr_open_websocket(L);
  lnr_open_ops(L);
  lnr_open_json(L);
  lnr_open_redis(L);
  lnr_open_sim(L);
  lua_pushcfunction(L, l_now);
  lua_setfield(L, -2, "now");
  lua_pushcfunction(L, l_transfer);
  lua_setfield(L, -2, "transfer");
  lua_pushliteral(L, NR_VERSION);
  lua_setfield(L, -2, "version");
  return 1;
}
