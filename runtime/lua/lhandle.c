/*
 * lhandle.c -- netrun handles in Lua: thread-safe reference-counted C
 * objects (groups, loops, channels, futures, dicts, channel groups) seen
 * through one proxy userdata per state. The proxy holds a reference; its
 * __gc/__close drops it. Proxies are cached per state in a weak table, so a
 * handle that comes back (in a transfer, as ctx.channel) is the same value.
 */
#include <string.h>

#include "lnr.h"

const char *const lnr_kind_names[] = {
    "?", "netrun.group", "netrun.loop", "netrun.channel", "netrun.future",
    "netrun.dict", "netrun.channel_group"};

typedef struct proxy_s {
  int kind;
  void *ptr;
} proxy_t;

/* Retain/release per kind; defined next to each kind. */
void lnr_group_retain(lnr_group_t *g);
void lnr_group_release(lnr_group_t *g);
void lnr_chgroup_retain(void *cg);
void lnr_chgroup_release(void *cg);

void lnr_handle_retain(int kind, void *ptr) {
  switch (kind) {
  case LNR_GROUP: lnr_group_retain(ptr); break;
  case LNR_LOOP: {
    lnr_group_t *g = lnr_group_of_loop(ptr);
    if (g)
      lnr_group_retain(g);
    break;
  }
  case LNR_CHANNEL: nr_channel_retain(ptr); break;
  case LNR_FUTURE: nr_promise_retain(ptr); break;
  case LNR_CHGROUP: lnr_chgroup_retain(ptr); break;
  default: break;                       /* dicts live as long as the process */
  }
}

void lnr_handle_release(int kind, void *ptr) {
  switch (kind) {
  case LNR_GROUP: lnr_group_release(ptr); break;
  case LNR_LOOP: {
    lnr_group_t *g = lnr_group_of_loop(ptr);
    if (g)
      lnr_group_release(g);
    break;
  }
  case LNR_CHANNEL: nr_channel_release(ptr); break;
  case LNR_FUTURE: nr_promise_release(ptr); break;
  case LNR_CHGROUP: lnr_chgroup_release(ptr); break;
  default: break;
  }
}

static const char CACHE_KEY = 0;

static int proxy_gc(lua_State *L) {
  proxy_t *p = lua_touserdata(L, 1);
  if (p && p->ptr) {
    lnr_handle_release(p->kind, p->ptr);
    p->ptr = NULL;
  }
  return 0;
}

void lnr_push_handle(lua_State *L, int kind, void *ptr) {
  if (ptr == NULL) {
    lua_pushnil(L);
    return;
  }
  if (lua_rawgetp(L, LUA_REGISTRYINDEX, &CACHE_KEY) != LUA_TTABLE) {
    lua_pop(L, 1);
    lua_newtable(L);
    lua_newtable(L);
    lua_pushliteral(L, "v");
    lua_setfield(L, -2, "__mode");
    lua_setmetatable(L, -2);
    lua_pushvalue(L, -1);
    lua_rawsetp(L, LUA_REGISTRYINDEX, &CACHE_KEY);
  }
  if (lua_rawgetp(L, -1, ptr) == LUA_TUSERDATA) {
    proxy_t *p = lua_touserdata(L, -1);
    if (p->kind == kind && p->ptr == ptr) {
      lua_remove(L, -2);
      return;
    }
  }
  lua_pop(L, 1);
  proxy_t *p = lua_newuserdatauv(L, sizeof *p, 1);
  p->kind = kind;
  p->ptr = ptr;
  lnr_handle_retain(kind, ptr);
  luaL_setmetatable(L, lnr_kind_names[kind]);
  lua_pushvalue(L, -1);
  lua_rawsetp(L, -3, ptr);
  lua_remove(L, -2);
}

/* A proxy that takes over the caller's reference, without the cache. */
void lnr_push_new_handle(lua_State *L, int kind, void *ptr) {
  proxy_t *p = lua_newuserdatauv(L, sizeof *p, 1);
  p->kind = kind;
  p->ptr = ptr;
  luaL_setmetatable(L, lnr_kind_names[kind]);
}

int lnr_handle_kind(lua_State *L, int idx) {
  proxy_t *p = lua_touserdata(L, idx);
  if (p == NULL || lua_type(L, idx) != LUA_TUSERDATA || !lua_getmetatable(L, idx))
    return 0;
  lua_getfield(L, -1, "__netrun_kind");
  int kind = (int)lua_tointeger(L, -1);
  lua_pop(L, 2);
  return kind > 0 && kind < LNR_NKINDS && p->kind == kind ? kind : 0;
}

void *lnr_to_handle(lua_State *L, int idx, int kind) {
  proxy_t *p = luaL_testudata(L, idx, lnr_kind_names[kind]);
  return p ? p->ptr : NULL;
}

void *lnr_check_handle(lua_State *L, int idx, int kind) {
  proxy_t *p = luaL_checkudata(L, idx, lnr_kind_names[kind]);
  if (p->ptr == NULL)
    luaL_error(L, "%s: used after it was released", lnr_kind_names[kind]);
  return p->ptr;
}

/* Called by each kind's opener after lnr_new_class. */
void lnr_handle_class(lua_State *L, int kind) {
  luaL_getmetatable(L, lnr_kind_names[kind]);
  lua_pushinteger(L, kind);
  lua_setfield(L, -2, "__netrun_kind");
  lua_pushcfunction(L, proxy_gc);
  lua_setfield(L, -2, "__gc");
  lua_pushcfunction(L, proxy_gc);
  lua_setfield(L, -2, "__close");
  lua_pop(L, 1);
}
