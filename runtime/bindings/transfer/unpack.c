/*
 * unpack.c -- the unpacking half of transfer.c: a blob's values made in
 * the destination state, on its thread (tables, functions from their
 * interned bytecode through the state's closure cache, modules by name,
 * handles by reference). transfer.c's header states the format and its
 * invariants; transfer.h what both halves share.
 */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "transfer.h"

/* ---- unpacking ----------------------------------------------------------- */

typedef struct unpacker_s {
  lua_State *L;
  const lnr_blob_t *b;
  size_t pos;
  int refs;                              /* stack index: id -> value */
  int nextid;
} unpacker_t;

/* The destination's closures of functions whose upvalues are all the
 * globals, by prototype id: a set-associative table of FCACHE_WAYS ways,
 * each set evicting with its own clock hand (a hit marks its slot used;
 * the hand passes used slots once, clearing the mark, and evicts the
 * first unused one). The closures are in the userdata's user value, a
 * table indexed by slot + 1: an evicted closure is simply replaced, and
 * collected once nothing else holds it. */
#define FCACHE_WAYS 4
#define FCACHE_SETS 256
#define FCACHE_SLOTS (FCACHE_WAYS * FCACHE_SETS)

typedef struct fcache_s {
  uint64_t id[FCACHE_SLOTS];
  bool used[FCACHE_SLOTS];
  uint8_t hand[FCACHE_SETS];
} fcache_t;

static const char FCACHE_DST = 0;

/* Push the state's cache table (the user value) and return the cache. */
static fcache_t *fcache(lua_State *L) {
  fcache_t *c;
  if (lua_rawgetp(L, LUA_REGISTRYINDEX, &FCACHE_DST) == LUA_TUSERDATA) {
    c = lua_touserdata(L, -1);
  } else {
    lua_pop(L, 1);
    c = lua_newuserdatauv(L, sizeof *c, 1);
    memset(c, 0, sizeof *c);
    lua_createtable(L, FCACHE_SLOTS, 0);
    lua_setiuservalue(L, -2, 1);
    lua_pushvalue(L, -1);
    lua_rawsetp(L, LUA_REGISTRYINDEX, &FCACHE_DST);
  }
  lua_getiuservalue(L, -1, 1);
  lua_remove(L, -2);
  return c;
}

/* The slot holding id, or -1. */
static int fcache_find(fcache_t *c, uint64_t id) {
  int base = (int)(id % FCACHE_SETS) * FCACHE_WAYS;
  for (int i = base; i < base + FCACHE_WAYS; i++)
    if (c->id[i] == id) {
      c->used[i] = true;
      return i;
    }
  return -1;
}

/* A slot for id: an empty one of its set, else the clock's victim. */
static int fcache_slot(fcache_t *c, uint64_t id) {
  int set = (int)(id % FCACHE_SETS), base = set * FCACHE_WAYS;
  for (int i = base; i < base + FCACHE_WAYS; i++)
    if (c->id[i] == 0)
      return i;
  for (;;) {
    int i = base + c->hand[set];
    c->hand[set] = (uint8_t)((c->hand[set] + 1) % FCACHE_WAYS);
    if (!c->used[i])
      return i;
    c->used[i] = false;
  }
}

static int get_byte(unpacker_t *u) {
  if (u->pos >= u->b->len)
    luaL_error(u->L, "corrupt transfer blob");
  return (unsigned char)u->b->buf[u->pos++];
}

static void get(unpacker_t *u, void *p, size_t n) {
  if (u->pos + n > u->b->len)
    luaL_error(u->L, "corrupt transfer blob");
  memcpy(p, u->b->buf + u->pos, n);
  u->pos += n;
}

static size_t get_size(unpacker_t *u) {
  size_t n = 0;
  for (int shift = 0;; shift += 7) {
    int c = get_byte(u);
    n |= (size_t)(c & 0x7f) << shift;
    if (!(c & 0x80))
      return n;
  }
}

static const char *get_str(unpacker_t *u, size_t *n) {
  *n = get_size(u);
  if (u->pos + *n > u->b->len)
    luaL_error(u->L, "corrupt transfer blob");
  const char *s = u->b->buf + u->pos;
  u->pos += *n;
  return s;
}

static void remember(unpacker_t *u) {    /* value on top gets the next id */
  lua_State *L = u->L;
  if (u->refs == 0) {
    lua_newtable(L);
    lua_insert(L, -2);
    u->refs = lua_gettop(L) - 1;
    /* refs now sits below the value; values pushed later stay above it. */
  }
  lua_pushvalue(L, -1);
  lua_rawseti(L, u->refs, u->nextid++);
}

static void require_module(lua_State *L, const char *name, size_t n) {
  lua_getglobal(L, "require");
  lua_pushlstring(L, name, n);
  lua_call(L, 1, 1);
}

/* Resolve "mod" or "mod\1field" in this state (_G's fields: the globals). */
static void push_module(lua_State *L, const char *name, size_t n) {
  const char *sep = memchr(name, '\1', n);
  if (sep == NULL) {
    require_module(L, name, n);
    return;
  }
  if (sep - name == 2 && memcmp(name, "_G", 2) == 0)
    lua_rawgeti(L, LUA_REGISTRYINDEX, LUA_RIDX_GLOBALS);
  else
    require_module(L, name, (size_t)(sep - name));
  lua_pushlstring(L, sep + 1, n - (size_t)(sep - name) - 1);
  lua_gettable(L, -2);
  lua_remove(L, -2);
}

static void unpack_value(unpacker_t *u);

/* A table; with_mt: 1, a module metatable named before the fields; 2, a
 * metatable value after them (set last, so that no __newindex sees the
 * fields arrive). */
static void unpack_table(unpacker_t *u, int with_mt) {
  lua_State *L = u->L;
  size_t n = 0;
  const char *mt = with_mt == 1 ? get_str(u, &n) : NULL;
  lua_newtable(L);
  remember(u);
  int t = lua_gettop(L);
  if (mt) {
    push_module(L, mt, n);
    lua_setmetatable(L, t);
  }
  for (;;) {
    if (u->pos < u->b->len && u->b->buf[u->pos] == T_END) {
      u->pos++;
      break;
    }
    unpack_value(u);
    unpack_value(u);
    if (lua_isnil(L, -2)) {
      lua_pop(L, 2);
      continue;
    }
    lua_rawset(L, t);
  }
  if (with_mt == 2) {
    unpack_value(u);
    if (!lua_istable(L, -1))
      luaL_error(L, "corrupt transfer blob");
    lua_setmetatable(L, t);
  }
}

/* Make upvalue i of the closure at f the very upvalue j of the closure
 * with the given id, made earlier in this blob (see pack_upvalue). The
 * earlier closure's upvalue may not hold its value yet (the join can come
 * from inside that value); it is one cell, so it will. */
static bool has_upvalue(lua_State *L, int f, int n) {
  if (lua_getupvalue(L, f, n) == NULL)
    return false;
  lua_pop(L, 1);
  return true;
}

static void join_upvalue(unpacker_t *u, int f, int i) {
  lua_State *L = u->L;
  size_t id = get_size(u);
  int j = get_byte(u);
  /* lua_upvaluejoin does not check its indices: a bad blob must not reach it */
  if (u->refs == 0 || lua_rawgeti(L, u->refs, (lua_Integer)id) != LUA_TFUNCTION ||
      lua_iscfunction(L, -1) || !has_upvalue(L, -1, j) || !has_upvalue(L, f, i))
    luaL_error(L, "corrupt transfer blob");
  lua_upvaluejoin(L, f, i, -1, j);
  lua_pop(L, 1);                          /* the earlier closure */
}

static void unpack_function(unpacker_t *u) {
  lua_State *L = u->L;
  proto_t *p;
  get(u, &p, sizeof p);
  int nups = get_byte(u);
  bool all_globals = get_byte(u);
  fcache_t *c = fcache(L);
  int cache = lua_gettop(L);
  int slot = all_globals ? fcache_find(c, p->id) : -1;
  if (slot >= 0 && lua_rawgeti(L, cache, slot + 1) == LUA_TFUNCTION) {
    lua_remove(L, cache);
    remember(u);
    u->pos += (size_t)nups;               /* the T_GLOBALS markers */
    return;
  }
  if (slot >= 0)
    lua_pop(L, 1);
  if (luaL_loadbufferx(L, p->data, p->len, "=transfer", "b") != LUA_OK)
    lua_error(L);
  int f = lua_gettop(L);
  if (all_globals) {                      /* cache the shared closure */
    slot = slot >= 0 ? slot : fcache_slot(c, p->id);
    c->id[slot] = p->id;
    c->used[slot] = false;
    lua_pushvalue(L, f);
    lua_rawseti(L, cache, slot + 1);
  }
  lua_remove(L, cache);
  f--;
  remember(u);                            /* before upvalues: recursion */
  f = lua_gettop(L);
  for (int i = 1; i <= nups; i++) {
    if (u->pos < u->b->len && u->b->buf[u->pos] == T_UPJOIN) {
      u->pos++;
      join_upvalue(u, f, i);
      continue;
    }
    unpack_value(u);
    if (lua_setupvalue(L, f, i) == NULL)
      lua_pop(L, 1);
  }
}

/* The class is made on first use in each state; a state that has not made
 * it yet gets it with the builder alone, which is all a pipeline needs. */
static void unpack_native(unpacker_t *u) {
  lua_State *L = u->L;
  size_t nl, n;
  const char *name = get_str(u, &nl);
  lua_pushlstring(L, name, nl);
  void *builder;
  get(u, &builder, sizeof builder);
  const char *bytes = get_str(u, &n);
  memcpy(lua_newuserdatauv(L, n, 0), bytes, n);
  if (luaL_newmetatable(L, lua_tostring(L, -2))) {
    lua_pushlightuserdata(L, builder);
    lua_setfield(L, -2, "__netrun_native");
  }
  lua_setmetatable(L, -2);
  lua_remove(L, -2);                            /* the name */
}

static void unpack_value(unpacker_t *u) {
  lua_State *L = u->L;
  luaL_checkstack(L, 8, "transferring a value");
  int tag = get_byte(u);
  switch (tag) {
  case T_NIL: lua_pushnil(L); break;
  case T_FALSE: lua_pushboolean(L, 0); break;
  case T_TRUE: lua_pushboolean(L, 1); break;
  case T_INT: {
    lua_Integer i;
    get(u, &i, sizeof i);
    lua_pushinteger(L, i);
    break;
  }
  case T_FLT: {
    lua_Number d;
    get(u, &d, sizeof d);
    lua_pushnumber(L, d);
    break;
  }
  case T_STR: {
    size_t n;
    const char *s = get_str(u, &n);
    lua_pushlstring(L, s, n);
    break;
  }
  case T_TABLE: unpack_table(u, 0); break;
  case T_TABLE_MT: unpack_table(u, 1); break;
  case T_TABLE_META: unpack_table(u, 2); break;
  case T_REF: {
    size_t id = get_size(u);
    if (u->refs == 0)
      luaL_error(L, "corrupt transfer blob");
    lua_rawgeti(L, u->refs, (lua_Integer)id);
    break;
  }
  case T_FUNC: unpack_function(u); break;
  case T_GLOBALS: lua_rawgeti(L, LUA_REGISTRYINDEX, LUA_RIDX_GLOBALS); break;
  case T_MODULE: {
    size_t n;
    const char *s = get_str(u, &n);
    push_module(L, s, n);
    break;
  }
  case T_HANDLE: {
    int kind = get_byte(u);
    void *ptr;
    get(u, &ptr, sizeof ptr);
    lnr_push_handle(L, kind, ptr);
    break;
  }
  case T_NATIVE: unpack_native(u); break;
  default:
    luaL_error(L, "corrupt transfer blob (tag %d)", tag);
  }
}

lnr_blob_t *lnr_keep(lua_State *L, int from, int n) {
  from = lua_absindex(L, from);
  lnr_blob_t *b = lnr_transfer_blob_new();
  if (b == NULL)
    luaL_error(L, "out of memory");
  b->nvalues = n;
  lua_createtable(L, n, 0);
  for (int i = 0; i < n; i++) {
    lua_pushvalue(L, from + i);
    lua_rawseti(L, -2, i + 1);
  }
  b->kept = luaL_ref(L, LUA_REGISTRYINDEX);
  b->home = lnr_state(L);
  return b;
}

lnr_blob_t *lnr_keep_result(lua_State *L, int idx) {
  idx = lua_absindex(L, idx);
  int t = lua_type(L, idx);
  lnr_state_t *S = lnr_state(L);
  if (S == NULL || S->loop == NULL || (t != LUA_TTABLE &&
      t != LUA_TFUNCTION && t != LUA_TUSERDATA))
    return lnr_pack_result(L, idx);   /* (a copy is the value itself) */
  lnr_blob_t *b = lnr_keep(L, idx, 1);
  b->home_loop = S->loop;             /* (unref_kept: on its loop) */
  lnr_handle_retain(LNR_LOOP, S->loop);
  return b;
}

void lnr_pack_kept(lua_State *L, lnr_blob_t *b) {
  if (!b->kept || b->packed_too || lnr_state(L) != b->home)
    return;
  lua_rawgeti(L, LUA_REGISTRYINDEX, b->kept);
  lua_rawgeti(L, -1, 1);
  lnr_blob_t *c = lnr_pack(L, -1, 1, "result");   /* raises */
  lua_pop(L, 2);
  /* c's bytes and handles become b's (b keeps its kept ref) */
  if (c->buf == c->small) {
    if (c->len <= sizeof b->small) {
      memcpy(b->small, c->small, c->len);
      b->buf = b->small;
      b->cap = sizeof b->small;
    } else {
      b->buf = malloc(c->len);
      if (b->buf == NULL) {
        b->buf = b->small;
        lnr_blob_free(c);
        luaL_error(L, "out of memory transferring a value");
      }
      memcpy(b->buf, c->small, c->len);
      b->cap = c->len;
    }
  } else {
    b->buf = c->buf;
    b->cap = c->cap;
  }
  b->len = c->len;
  b->handles = c->handles;
  b->nhandles = c->nhandles;
  b->hcap = c->hcap;
  b->packed_too = true;
  free(c);                              /* (its parts are b's now) */
}

lnr_blob_t *lnr_pack_result(lua_State *L, int idx) {
  idx = lua_absindex(L, idx);
  lnr_blob_t *b = lnr_pack(L, idx, 1, "result");
  int t = lua_type(L, idx);
  lnr_state_t *S = lnr_state(L);
  if (S == NULL || S->loop == NULL || (t != LUA_TTABLE &&
      t != LUA_TFUNCTION && t != LUA_TUSERDATA))
    return b;                    /* a copy is the value itself */
  lua_createtable(L, 1, 0);
  lua_pushvalue(L, idx);
  lua_rawseti(L, -2, 1);
  b->kept = luaL_ref(L, LUA_REGISTRYINDEX);
  b->home = S;
  b->packed_too = true;
  b->home_loop = S->loop;
  lnr_handle_retain(LNR_LOOP, S->loop);
  return b;
}

static int unpack_kept(lua_State *L, const lnr_blob_t *b) {
  if (lnr_state(L) != b->home)
    luaL_error(L, "a task kept for one loop ran on another");
  luaL_checkstack(L, b->nvalues + 2, "transferring values");
  lua_rawgeti(L, LUA_REGISTRYINDEX, b->kept);
  for (int i = 1; i <= b->nvalues; i++)
    lua_rawgeti(L, -i, i);
  lua_remove(L, -b->nvalues - 1);
  return b->nvalues;
}

int lnr_unpack(lua_State *L, const lnr_blob_t *b) {
  if (b->kept && (!b->packed_too || lnr_state(L) == b->home))
    return unpack_kept(L, b);
  unpacker_t u = {.L = L, .b = b, .nextid = 1};
  int base = lua_gettop(L);
  luaL_checkstack(L, b->nvalues + 8, "transferring values");
  for (int i = 0; i < b->nvalues; i++)
    unpack_value(&u);
  if (u.refs) {
    lua_remove(L, u.refs);
  }
  return lua_gettop(L) - base;
}
