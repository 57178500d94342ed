/*
 * lhandle.c -- netrun handles in Lua: thread-safe reference-counted C
 * objects (groups, loops, channels, futures, dicts, channel groups, TLS
 * configs, upstreams' shared state) seen
 * through one proxy userdata per state. The proxy holds a reference; its
 * __gc/__close drops it. Proxies are cached per state in a weak table, so a
 * handle that comes back (in a transfer, as ctx.channel) is the same value.
 */
#include <assert.h>
#include <string.h>

#include "lnr.h"

const char *const lnr_kind_names[] = {
    "?", "netrun.group", "netrun.loop", "netrun.channel", "netrun.future",
    "netrun.dict", "netrun.channel_group", "netrun.tls",
    "netrun.upstream_state", "netrun.metric"};

typedef struct proxy_s {
  const char *tag;            /* &CLASS_KEYS[kind]: proves the userdata is ours */
  int kind;
  void *ptr;
  uint64_t mark;              /* lazy write futures: the write's mark;
                                 a future: LOCAL (lnr_future_mark_local) */
} proxy_t;

#define LOCAL 1

void lnr_handle_retain(int kind, void *ptr) {
  switch (kind) {
  case LNR_GROUP: lnr_group_retain(ptr); break;
  case LNR_LOOP: {                      /* its group, else itself (a main */
    lnr_group_t *g = lnr_group_of_loop(ptr);  /* loop: a simulation's ends) */
    if (g)
      lnr_group_retain(g);
    else
      nr_loop_retain(ptr);
    break;
  }
  case LNR_CHANNEL: nr_channel_retain(ptr); break;
  case LNR_FUTURE: nr_promise_retain(ptr); break;
  case LNR_CHGROUP: lnr_chgroup_retain(ptr); break;
  case LNR_TLS: lnr_tls_retain(ptr); break;
  case LNR_UPSTREAM: lnr_upstream_retain(ptr); break;
  default: break;               /* dicts, metrics live as long as the process */
  }
}

void lnr_handle_release(int kind, void *ptr) {
  switch (kind) {
  case LNR_GROUP: lnr_group_release(ptr); break;
  case LNR_LOOP: {
    lnr_group_t *g = lnr_group_of_loop(ptr);
    if (g)
      lnr_group_release(g);
    else
      nr_loop_release(ptr);
    break;
  }
  case LNR_CHANNEL: nr_channel_release(ptr); break;
  case LNR_FUTURE: nr_promise_release(ptr); break;
  case LNR_CHGROUP: lnr_chgroup_release(ptr); break;
  case LNR_TLS: lnr_tls_release(ptr); break;
  case LNR_UPSTREAM: lnr_upstream_release(ptr); break;
  default: break;
  }
}

static const char CACHE_KEY = 0;

/* Each kind's metatable is also kept under a pointer key, so making a
 * proxy costs no string hashing (luaL_setmetatable looks the name up). And
 * a proxy carries the address of its kind's key: checking a handle (on
 * every method call) reads the userdata instead of the registry. Only C
 * code could forge such a tag, and netrun's C code does not. */
static const char CLASS_KEYS[LNR_NKINDS];

static void push_class(lua_State *L, int kind) {
  if (kind == LNR_CHANNEL)               /* one per connection: a slot */
    lnr_push_keyed(L, &lnr_state(L)->slots[LNR_KEYED_CHANNEL_MT],
                   &CLASS_KEYS[kind]);
  else
    lua_rawgetp(L, LUA_REGISTRYINDEX, &CLASS_KEYS[kind]);
}

/*
 * Lazy write futures. Most writes' futures are never looked at, yet each
 * would cost a promise, a proxy with a finalizer and their collection. A
 * write that goes straight to the head of a stream channel (ctx:write of a
 * string with no outbound handler in between) gets instead a proxy of the
 * LAZY class: no promise, no __gc; it holds the channel (kept alive by the
 * ctx in its user value) and the write's mark. The first time it is used
 * as a future it becomes one in place: a promise watching that mark
 * (nr_channel_watch_write), and the future class with its finalizer. It
 * lives in the channel's loop state, so that happens on the channel's loop.
 */
static const char LAZY_TAG = 0, LAZY_CLASS = 0;

static void materialize(lua_State *L, int idx, proxy_t *p) {
  idx = lua_absindex(L, idx);
  nr_promise_t *prom = nr_promise_new();
  if (prom == NULL)
    luaL_error(L, "out of memory");
  if (nr_channel_watch_write(p->ptr, p->mark, prom) < 0) {
    nr_promise_release(prom);
    luaL_error(L, "out of memory");
  }
  p->tag = &CLASS_KEYS[LNR_FUTURE];
  p->ptr = prom;                              /* the proxy's reference */
  p->mark = 0;                                /* not LOCAL */
  lua_pushnil(L);
  lua_setiuservalue(L, idx, 1);               /* let go of the ctx */
  push_class(L, LNR_FUTURE);
  lua_setmetatable(L, idx);                   /* now with its finalizer */
}

/* The proxy at idx if it is a userdata of class `kind`, else NULL. */
static proxy_t *test_proxy(lua_State *L, int idx, int kind) {
  /* lua_touserdata is NULL for anything but a userdata, and a light one
   * has length 0: a full userdata of a proxy's size whose tag is a class
   * key is a proxy (only C code could forge one), with no metatable
   * lookup (every dict call makes one). */
  proxy_t *p = lua_touserdata(L, idx);
  if (p == NULL || lua_rawlen(L, idx) != sizeof(proxy_t))
    return NULL;
  if (p->tag == &CLASS_KEYS[kind])
    return p;
  if (kind == LNR_FUTURE && p->tag == &LAZY_TAG) {
    materialize(L, idx, p);
    return p;
  }
  return NULL;
}

void lnr_push_lazy_write(lua_State *L, nr_channel_t *ch, uint64_t mark,
                         int keep, int lazy_mt) {
  keep = lua_absindex(L, keep);
  lazy_mt = lua_absindex(L, lazy_mt);
  proxy_t *p = lua_newuserdatauv(L, sizeof *p, 1);
  p->tag = &LAZY_TAG;
  p->kind = LNR_FUTURE;
  p->ptr = ch;
  p->mark = mark;
  lua_pushvalue(L, keep);
  lua_setiuservalue(L, -2, 1);
  lua_pushvalue(L, lazy_mt);
  lua_setmetatable(L, -2);
}

void lnr_push_lazy_class(lua_State *L) {
  lua_rawgetp(L, LUA_REGISTRYINDEX, &LAZY_CLASS);
}

/* The lazy class: the future class's methods and names, no finalizer. */
static void make_lazy_class(lua_State *L) {
  push_class(L, LNR_FUTURE);
  lua_newtable(L);
  static const char *const fields[] = {"__index", "__tostring", "__name",
                                       "__netrun_kind"};
  for (size_t i = 0; i < sizeof fields / sizeof fields[0]; i++) {
    lua_getfield(L, -2, fields[i]);
    lua_setfield(L, -2, fields[i]);
  }
  lua_rawsetp(L, LUA_REGISTRYINDEX, &LAZY_CLASS);
  lua_pop(L, 1);
}

static proxy_t *new_proxy(lua_State *L, int kind, void *ptr) {
  proxy_t *p = lua_newuserdatauv(L, sizeof *p, 1);
  p->tag = &CLASS_KEYS[kind];
  p->kind = kind;
  p->ptr = ptr;
  p->mark = 0;    /* a userdata's memory is not cleared: it may be a LOCAL
                     future's that was collected */
  return p;
}

static int proxy_gc(lua_State *L) {
  proxy_t *p = lua_touserdata(L, 1);
  if (p && p->ptr) {
    lnr_handle_release(p->kind, p->ptr);
    p->ptr = NULL;
  }
  return 0;
}

/* A new proxy of ptr (retaining it), entered in the cache on top of the
 * stack, which it replaces. */
static void push_cached(lua_State *L, int kind, void *ptr) {
  new_proxy(L, kind, ptr);
  lnr_handle_retain(kind, ptr);
  push_class(L, kind);
  lua_setmetatable(L, -2);
  lua_pushvalue(L, -1);
  lua_rawsetp(L, -3, ptr);
  lua_remove(L, -2);
}

/* A channel that was just made has no proxy here yet: a proxy retains its
 * channel, so no proxy of an earlier channel at that address survives it
 * (and a collected proxy leaves the weak cache before its __gc releases
 * the channel). So its first proxy (made for init, once per connection)
 * is entered in the cache without looking it up first. */
void lnr_push_new_channel(lua_State *L, nr_channel_t *ch) {
  lnr_push_weak_keyed(L, &lnr_state(L)->slots[LNR_KEYED_HANDLES], &CACHE_KEY,
                      "v");
#ifndef NDEBUG
  assert(lua_rawgetp(L, -1, ch) == LUA_TNIL);   /* as argued above */
  lua_pop(L, 1);
#endif
  push_cached(L, LNR_CHANNEL, ch);
}

void lnr_push_handle(lua_State *L, int kind, void *ptr) {
  if (ptr == NULL) {
    lua_pushnil(L);
    return;
  }
  lnr_push_weak_keyed(L, &lnr_state(L)->slots[LNR_KEYED_HANDLES], &CACHE_KEY,
                      "v");
  if (lua_rawgetp(L, -1, ptr) == LUA_TUSERDATA) {
    proxy_t *p = lua_touserdata(L, -1);
    if (p->kind == kind && p->ptr == ptr) {
      lua_remove(L, -2);
      return;
    }
  }
  lua_pop(L, 1);
  push_cached(L, kind, ptr);
  if (kind == LNR_FUTURE && nr_promise_is_void(ptr)) {
    lnr_state_t *S = lnr_state(L);       /* anchored: one proxy, one address */
    lua_pushvalue(L, -1);
    lnr_set_ref(L, &S->slots[LNR_SLOT_VOID]);
    S->void_proxy = lua_topointer(L, -1);
  }
}

/* A proxy that takes over the caller's reference, without the cache. */
void lnr_push_new_handle(lua_State *L, int kind, void *ptr) {
  new_proxy(L, kind, ptr);
  push_class(L, kind);
  lua_setmetatable(L, -2);
}

void lnr_push_new_handle_mt(lua_State *L, int kind, void *ptr, int mt) {
  mt = lua_absindex(L, mt);
  new_proxy(L, kind, ptr);
  lua_pushvalue(L, mt);
  lua_setmetatable(L, -2);
}

void lnr_future_mark_local(lua_State *L, int idx) {
  proxy_t *p = test_proxy(L, idx, LNR_FUTURE);
  if (p != NULL)
    p->mark = LOCAL;
}

bool lnr_future_is_local(lua_State *L, int idx) {
  proxy_t *p = test_proxy(L, idx, LNR_FUTURE);
  return p != NULL && p->mark == LOCAL;
}

void lnr_future_escapes(lua_State *L, int idx) {
  proxy_t *p = test_proxy(L, idx, LNR_FUTURE);
  if (p == NULL || p->mark != LOCAL)
    return;
  p->mark = 0;
  nr_promise_t *f = p->ptr;          /* a value kept only here: packed now, */
  if (nr_promise_is_done(f) && nr_promise_is_success(f) &&   /* before any */
      nr_promise_value_free_fn(f) == lnr_blob_free_fn)      /* other state */
    lnr_pack_kept(L, nr_promise_value(f));                  /* can read it */
}

int lnr_handle_kind(lua_State *L, int idx) {
  for (int kind = 1; kind < LNR_NKINDS; kind++)
    if (test_proxy(L, idx, kind))
      return kind;
  return 0;
}

void *lnr_to_handle(lua_State *L, int idx, int kind) {
  proxy_t *p = test_proxy(L, idx, kind);
  return p ? p->ptr : NULL;
}

void *lnr_check_handle(lua_State *L, int idx, int kind) {
  proxy_t *p = test_proxy(L, idx, kind);
  if (p == NULL)
    p = luaL_checkudata(L, idx, lnr_kind_names[kind]);   /* raises */
  if (p->ptr == NULL)
    luaL_error(L, "%s: used after it was released", lnr_kind_names[kind]);
  return p->ptr;
}

/* Called by each kind's opener after lnr_new_class. */
void lnr_handle_class(lua_State *L, int kind) {
  luaL_getmetatable(L, lnr_kind_names[kind]);
  lua_pushvalue(L, -1);
  lua_rawsetp(L, LUA_REGISTRYINDEX, &CLASS_KEYS[kind]);
  if (kind == LNR_FUTURE)
    make_lazy_class(L);
  lua_pushinteger(L, kind);
  lua_setfield(L, -2, "__netrun_kind");
  lua_pushcfunction(L, proxy_gc);
  lua_setfield(L, -2, "__gc");
  lua_pushcfunction(L, proxy_gc);
  lua_setfield(L, -2, "__close");
  lua_pop(L, 1);
}

void lnr_push_class(lua_State *L, int kind) { push_class(L, kind); }
