/*
 * transfer.c -- moving Lua values between states (DESIGN.md §3).
 *
 * A value is packed in the source state (on its thread) into a blob, and
 * unpacked in the destination state (on its thread); no state is ever
 * touched by two threads. The blob is a byte string of tagged values:
 *
 *  - nil, booleans, integers, floats and strings are copied;
 *  - tables are copied deeply; each table or function gets an id on first
 *    sight and later sightings become references, so shared references and
 *    cycles survive; a metatable travels by name if it is a module
 *    table, and is copied like any table otherwise (objects keep their
 *    class's methods);
 *  - Lua functions travel as their prototype (bytecode, interned once per
 *    process) plus their upvalues, packed recursively. An upvalue holding the
 *    source's globals is rebound to the destination's. The destination
 *    caches one closure per prototype, so a function whose only upvalue is
 *    _ENV costs no load at all the second time. Both ends are bounded: a
 *    prototype lives while a function of the source or a blob refers to
 *    it (reference counted), and each destination keeps at most
 *    FCACHE_SLOTS closures (clock eviction), so a program that sends ever
 *    new functions (made by load, say) keeps its memory flat. Closures of one blob that
 *    share an upvalue in the source share its copy in the destination: the
 *    second sighting of an upvalue is sent as a join (T_UPJOIN);
 *  - values reachable from package.loaded (modules, their fields, C
 *    functions of _G, a module's light userdata such as cjson's null)
 *    travel by name and are resolved with require;
 *  - netrun handles travel by reference count; native handler
 *    configurations as their bytes; a userdata whose metatable has
 *    __netrun_copy (an HTTP request) as the plain value that returns;
 *  - anything else raises "cannot transfer <type> (<path>)".
 *
 * Only bytecode produced here is ever loaded, in mode "b", unstripped so
 * tracebacks keep their line numbers. Upvalues are copied, not shared,
 * between blobs: a function sent in two submits gets two copies.
 *
 * Packing and the prototype registry are here; unpacking is unpack.c's,
 * and transfer.h holds what both share (the tags, a prototype).
 */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "transfer.h"



#define MAX_DEPTH 200

/* ---- the process-wide prototype registry -------------------------------- */



#define PROTO_BUCKETS 1024
static proto_t *protos[PROTO_BUCKETS];
static pthread_mutex_t proto_lock = PTHREAD_MUTEX_INITIALIZER;

static uint64_t hash_bytes(const char *s, size_t n) {
  uint64_t h = 1469598103934665603ull;              /* FNV-1a */
  for (size_t i = 0; i < n; i++)
    h = (h ^ (unsigned char)s[i]) * 1099511628211ull;
  return h;
}

static _Atomic uint64_t proto_ids = 1;     /* 0: an empty cache slot */

/* A reference to a live prototype (its holder has one already). */
static void proto_retain(proto_t *p) { atomic_fetch_add(&p->refs, 1); }

/* Take a reference unless the prototype is being freed (refs reached 0:
 * its releaser is about to unlink it, and nobody may revive it). */
static bool proto_try_retain(proto_t *p) {
  int r = atomic_load(&p->refs);
  while (r > 0)
    if (atomic_compare_exchange_weak(&p->refs, &r, r + 1))
      return true;
  return false;
}

static void proto_release(proto_t *p) {
  if (atomic_fetch_sub(&p->refs, 1) != 1)
    return;
  pthread_mutex_lock(&proto_lock);
  for (proto_t **pp = &protos[p->hash % PROTO_BUCKETS]; *pp; pp = &(*pp)->next)
    if (*pp == p) {
      *pp = p->next;
      break;
    }
  pthread_mutex_unlock(&proto_lock);
  free(p);
}

/* The one live proto_t for these bytes, with a reference for the caller. */
static proto_t *intern_proto(const char *s, size_t n) {
  uint64_t h = hash_bytes(s, n);
  proto_t **bucket = &protos[h % PROTO_BUCKETS];
  pthread_mutex_lock(&proto_lock);
  for (proto_t *p = *bucket; p; p = p->next)
    if (p->hash == h && p->len == n && memcmp(p->data, s, n) == 0 &&
        proto_try_retain(p)) {
      pthread_mutex_unlock(&proto_lock);
      return p;
    }
  proto_t *p = malloc(sizeof *p + n);
  if (p) {
    atomic_init(&p->refs, 1);
    p->id = atomic_fetch_add(&proto_ids, 1);
    p->hash = h;
    p->len = n;
    memcpy(p->data, s, n);
    p->next = *bucket;
    *bucket = p;
  }
  pthread_mutex_unlock(&proto_lock);
  return p;
}

/* ---- blobs ------------------------------------------------------------------- */

lnr_blob_t *lnr_transfer_blob_new(void) {
  lnr_blob_t *b = malloc(sizeof *b);
  if (b == NULL)
    return NULL;
  memset(b, 0, offsetof(lnr_blob_t, small));
  b->buf = b->small;
  b->cap = sizeof b->small;
  return b;
}

/* A blob's prototypes are kept among its handles, under a kind of their
 * own. */
#define PROTO_KIND (-1)

/* A result's kept values let go on their own loop (the blob was freed on
 * another thread). */
typedef struct unref_s {
  const lnr_state_t *home;
  int ref;
} unref_t;

static int unref_task(void *arg) {
  unref_t *u = arg;
  lnr_state_t *S = lnr_current_state();
  if (S != NULL && S == u->home && !S->closing)
    luaL_unref(S->L, LUA_REGISTRYINDEX, u->ref);
  free(u);
  return 0;
}

static void unref_kept(lnr_blob_t *b) {
  lnr_state_t *S = lnr_current_state();
  if (S != NULL && S == b->home) {
    if (!S->closing)             /* a closing state lets go of everything */
      luaL_unref(S->L, LUA_REGISTRYINDEX, b->kept);
  } else if (b->home_loop != NULL) {
    unref_t *u = malloc(sizeof *u);
    if (u != NULL) {
      *u = (unref_t){b->home, b->kept};
      if (nr_loop_execute(b->home_loop, unref_task, u) < 0)
        free(u);                 /* shut down: its state goes whole */
    }
  }
  if (b->home_loop != NULL)
    lnr_handle_release(LNR_LOOP, b->home_loop);
}

void lnr_blob_free(lnr_blob_t *b) {
  if (b == NULL)
    return;
  if (b->kept)                   /* a task's: on its loop; a result's: any */
    unref_kept(b);
  for (int i = 0; i < b->nhandles; i++)
    if (b->handles[i].kind == PROTO_KIND)
      proto_release(b->handles[i].ptr);
    else
      lnr_handle_release(b->handles[i].kind, b->handles[i].ptr);
  free(b->handles);
  if (b->buf != b->small)
    free(b->buf);
  free(b);
}

void lnr_blob_free_fn(void *b) { lnr_blob_free(b); }

/* ---- packing ---------------------------------------------------------------- */

/* Where the packer is, for error messages: formatted only on failure. */
typedef struct step_s {
  const char *fmt;     /* "field '%s'", "element %lld", "upvalue '%s'", ... */
  const char *s;       /* a Lua string kept alive by the value being packed */
  long long i;
} step_t;

typedef struct packer_s {
  lua_State *L;
  lnr_blob_t *b;
  int seen;            /* stack index: value -> id, upvalue id -> where;
                          0 until needed */
  int nextid;
  int depth;
  bool map_fresh;      /* the module map was rebuilt during this pack */
  bool map_checked;    /* package.loaded was counted during this pack */
  const char *what;    /* the caller's name for the values */
  int nvalues, index;  /* which of them is being packed */
  bool first_is_fn;
  step_t path[MAX_DEPTH + 2];
} packer_t;

static void grow(packer_t *k, size_t need) {
  lnr_blob_t *b = k->b;
  if (b->len + need <= b->cap)
    return;
  size_t cap = b->cap * 2;
  while (cap < b->len + need)
    cap *= 2;
  char *nb = b->buf == b->small ? malloc(cap) : realloc(b->buf, cap);
  if (nb == NULL)
    luaL_error(k->L, "out of memory transferring a value");
  if (b->buf == b->small)
    memcpy(nb, b->small, b->len);
  b->buf = nb;
  b->cap = cap;
}

static void put(packer_t *k, const void *p, size_t n) {
  grow(k, n);
  memcpy(k->b->buf + k->b->len, p, n);
  k->b->len += n;
}

static void put_byte(packer_t *k, int c) {
  unsigned char u = (unsigned char)c;
  put(k, &u, 1);
}

static void put_size(packer_t *k, size_t n) {       /* varint */
  do {
    put_byte(k, (int)((n & 0x7f) | (n > 0x7f ? 0x80 : 0)));
    n >>= 7;
  } while (n);
}

static void put_str(packer_t *k, const char *s, size_t n) {
  put_size(k, n);
  put(k, s, n);
}

/* A native handler's configuration (netrun.codec.line {...} and the like:
 * a userdata whose metatable has __netrun_native) is plain bytes, so it is
 * copied: its class name, its builder and its bytes. */
static bool pack_native(packer_t *k, int idx) {
  lua_State *L = k->L;
  int t = luaL_getmetafield(L, idx, "__netrun_native");   /* pushes if found */
  if (t != LUA_TLIGHTUSERDATA) {
    if (t != LUA_TNIL)
      lua_pop(L, 1);
    return false;
  }
  void *builder = lua_touserdata(L, -1);
  lua_pop(L, 1);
  t = luaL_getmetafield(L, idx, "__name");
  if (t != LUA_TSTRING) {
    if (t != LUA_TNIL)
      lua_pop(L, 1);
    return false;
  }
  size_t n;
  const char *name = lua_tolstring(L, -1, &n);
  put_byte(k, T_NATIVE);
  put_str(k, name, n);
  put(k, &builder, sizeof builder);
  lua_pop(L, 1);
  put_str(k, lua_touserdata(L, idx), lua_rawlen(L, idx));
  return true;
}

static void add_handle(packer_t *k, int kind, void *ptr) {
  lnr_blob_t *b = k->b;
  if (b->nhandles == b->hcap) {
    int cap = b->hcap ? b->hcap * 2 : 4;
    void *h = realloc(b->handles, (size_t)cap * sizeof *b->handles);
    if (h == NULL)
      luaL_error(k->L, "out of memory transferring a value");
    b->handles = h;
    b->hcap = cap;
  }
  if (kind == PROTO_KIND)
    proto_retain(ptr);
  else
    lnr_handle_retain(kind, ptr);
  b->handles[b->nhandles].kind = kind;
  b->handles[b->nhandles++].ptr = ptr;
}

static void push_top_name(packer_t *k) {
  lua_State *L = k->L;
  if (k->nvalues == 1 && !(k->index == 0 && k->first_is_fn && !strchr(k->what, ' ')))
    lua_pushstring(L, k->what);
  else if (k->index == 0 && k->first_is_fn)
    lua_pushfstring(L, "the function given to %s", k->what);
  else
    lua_pushfstring(L, "argument %d of %s", k->index, k->what);
}

static void fail(packer_t *k, const char *type) {
  lua_State *L = k->L;
  luaL_Buffer buf;
  luaL_buffinit(L, &buf);
  lua_pushfstring(L, "cannot transfer %s (", type);
  luaL_addvalue(&buf);
  for (int i = k->depth; i >= 1; i--) {
    step_t *st = &k->path[i];
    if (st->s)
      lua_pushfstring(L, st->fmt, st->s);
    else
      lua_pushfstring(L, st->fmt, (lua_Integer)st->i);
    luaL_addvalue(&buf);
    luaL_addstring(&buf, " of ");
  }
  push_top_name(k);
  luaL_addvalue(&buf);
  luaL_addstring(&buf, ")");
  /* A task sent to another loop: the usual mistake is a closure over ctx
   * or another loop-local value. */
  static const char *const tasks[] = {"execute", "submit", "schedule",
                                      "after_iteration", NULL};
  for (int i = 0; tasks[i]; i++)
    if (strcmp(k->what, tasks[i]) == 0)
      luaL_addstring(&buf, ": it cannot be copied to another loop; schedule "
                     "on ctx:loop() to keep it, or pass plain values");
  luaL_pushresult(&buf);
  lua_error(L);
}

static void enter(packer_t *k, const char *fmt, const char *s, long long i) {
  if (k->depth >= MAX_DEPTH)
    fail(k, "a value nested this deeply");
  step_t *st = &k->path[++k->depth];
  st->fmt = fmt;
  st->s = s;
  st->i = i;
}

/* The module map: value -> "module" or "module.field", in the registry. */
static const char MODMAP_KEY = 0;

/* package.loaded's version: bumped by a __newindex on package.loaded,
 * which require's store of a new module goes through. */
static const char LOADED_VERSION = 0;

static int loaded_newindex(lua_State *L) {
  lua_rawset(L, 1);
  lua_rawgetp(L, LUA_REGISTRYINDEX, &LOADED_VERSION);
  lua_Integer v = lua_tointeger(L, -1) + 1;
  lua_pushinteger(L, v);
  lua_rawsetp(L, LUA_REGISTRYINDEX, &LOADED_VERSION);
  return 0;
}

static lua_Integer loaded_version(lua_State *L) {
  lua_rawgetp(L, LUA_REGISTRYINDEX, &LOADED_VERSION);
  lua_Integer v = lua_tointeger(L, -1);
  lua_pop(L, 1);
  return v;
}

/* Watch package.loaded for new modules (once per state; leaves a
 * metatable someone else set alone and falls back to counting). */
static void watch_loaded(lua_State *L) {
  luaL_getsubtable(L, LUA_REGISTRYINDEX, LUA_LOADED_TABLE);
  if (!lua_getmetatable(L, -1)) {
    lua_newtable(L);
    lua_pushcfunction(L, loaded_newindex);
    lua_setfield(L, -2, "__newindex");
    lua_setmetatable(L, -2);
    lua_pushinteger(L, 1);
    lua_rawsetp(L, LUA_REGISTRYINDEX, &LOADED_VERSION);
  } else {
    lua_pop(L, 1);
  }
  lua_pop(L, 1);
}

static lua_Integer count_loaded(lua_State *L) {
  lua_Integer v = loaded_version(L);
  if (v > 0)
    return -v;                  /* watched: the version is enough */
  lua_Integer n = 0;
  luaL_getsubtable(L, LUA_REGISTRYINDEX, LUA_LOADED_TABLE);
  lua_pushnil(L);
  while (lua_next(L, -2)) {
    lua_pop(L, 1);
    n++;
  }
  lua_pop(L, 1);
  return n;
}

static void map_value(lua_State *L, int map, int vidx, const char *name) {
  lua_pushvalue(L, vidx);
  if (lua_rawget(L, map) == LUA_TNIL) {
    lua_pushvalue(L, vidx);
    lua_pushstring(L, name);
    lua_rawset(L, map);
  }
  lua_pop(L, 1);
}

/* Two passes: modules themselves first, so a module that is also a field
 * of another travels under its own name. Fields are "module\1field". */
static void build_modmap(lua_State *L) {
  lua_newtable(L);
  int map = lua_gettop(L);
  luaL_getsubtable(L, LUA_REGISTRYINDEX, LUA_LOADED_TABLE);
  int loaded = lua_gettop(L);
  for (int pass = 0; pass < 2; pass++) {
    lua_pushnil(L);
    while (lua_next(L, loaded)) {          /* name, module */
      if (lua_type(L, -2) != LUA_TSTRING ||
          !(lua_istable(L, -1) || lua_isfunction(L, -1))) {
        lua_pop(L, 1);
        continue;
      }
      const char *mod = lua_tostring(L, -2);
      bool is_g = strcmp(mod, "_G") == 0;
      if (pass == 0 && !is_g)
        map_value(L, map, lua_gettop(L), mod);
      if (pass == 1 && lua_istable(L, -1)) {
        int t = lua_gettop(L);
        lua_pushnil(L);
        while (lua_next(L, t)) {           /* field, value */
          int v = lua_gettop(L);
          /* A module's light userdata (cjson's null) is a constant the
           * destination has too, under the same name. */
          bool wanted = is_g ? lua_iscfunction(L, v)
                             : (lua_istable(L, v) || lua_isfunction(L, v) ||
                                lua_islightuserdata(L, v));
          if (wanted && lua_type(L, -2) == LUA_TSTRING) {
            char full[256];
            snprintf(full, sizeof full, "%s\1%s", mod, lua_tostring(L, -2));
            map_value(L, map, v, full);
          }
          lua_pop(L, 1);
        }
      }
      lua_pop(L, 1);
    }
  }
  lua_pop(L, 1);                          /* loaded */
  lua_pushinteger(L, count_loaded(L));
  lua_setfield(L, map, "\1count");
  lua_rawsetp(L, LUA_REGISTRYINDEX, &MODMAP_KEY);
}

/* Push the module name of the value at idx, or nothing and return false.
 * On a miss the map is rebuilt once per pack if modules were loaded. */
static bool module_name(packer_t *k, int idx, bool must) {
  lua_State *L = k->L;
  for (int pass = 0; pass < 2; pass++) {
    if (lua_rawgetp(L, LUA_REGISTRYINDEX, &MODMAP_KEY) != LUA_TTABLE) {
      lua_pop(L, 1);
      build_modmap(L);
      k->map_fresh = true;
      lua_rawgetp(L, LUA_REGISTRYINDEX, &MODMAP_KEY);
    }
    lua_pushvalue(L, idx);
    if (lua_rawget(L, -2) == LUA_TSTRING) {
      lua_remove(L, -2);
      return true;
    }
    lua_pop(L, 1);
    bool stale = false;
    if (!k->map_fresh && (must || !k->map_checked)) {
      lua_getfield(L, -1, "\1count");
      stale = must || lua_tointeger(L, -1) != count_loaded(L);
      lua_pop(L, 1);
      k->map_checked = true;
    }
    lua_pop(L, 1);
    if (!stale)
      return false;
    build_modmap(L);
    k->map_fresh = true;
  }
  return false;
}

static void pack_value(packer_t *k, int idx);

/* Returns true (and writes a reference) if the value was packed before. */
static bool seen_before(packer_t *k, int idx) {
  lua_State *L = k->L;
  if (k->seen == 0) {
    lua_newtable(L);
    k->seen = lua_gettop(L);
  }
  lua_pushvalue(L, idx);
  if (lua_rawget(L, k->seen) == LUA_TNUMBER) {
    put_byte(k, T_REF);
    put_size(k, (size_t)lua_tointeger(L, -1));
    lua_pop(L, 1);
    return true;
  }
  lua_pop(L, 1);
  lua_pushvalue(L, idx);
  lua_pushinteger(L, k->nextid++);
  lua_rawset(L, k->seen);
  return false;
}

static bool is_globals(lua_State *L, int idx) {
  idx = lua_absindex(L, idx);
  lua_rawgeti(L, LUA_REGISTRYINDEX, LUA_RIDX_GLOBALS);
  bool g = lua_rawequal(L, idx, -1);
  lua_pop(L, 1);
  return g;
}

/* A table's metatable travels by name if it is a module; any other
 * (a class table: Base.__index = Base) is copied after the table's
 * fields, like any value, so that an object copied to a loop -- a handler
 * made with setmetatable({}, Base) -- keeps its methods. */
static void pack_table(packer_t *k, int idx) {
  lua_State *L = k->L;
  if (seen_before(k, idx))
    return;
  int mt = 0;
  if (lua_getmetatable(L, idx)) {
    /* netrun's own table objects (a ctx) belong to their loop */
    lua_pushliteral(L, "__name");
    if (lua_rawget(L, -2) == LUA_TSTRING &&
        strncmp(lua_tostring(L, -1), "netrun.", 7) == 0)
      fail(k, lua_pushfstring(L, "a %s", lua_tostring(L, -1)));
    lua_pop(L, 1);
    if (module_name(k, lua_gettop(L), false)) {
      size_t n;
      const char *name = lua_tolstring(L, -1, &n);
      put_byte(k, T_TABLE_MT);
      put_str(k, name, n);
      lua_pop(L, 2);
    } else {
      mt = lua_gettop(L);
      put_byte(k, T_TABLE_META);
    }
  } else {
    put_byte(k, T_TABLE);
  }
  lua_pushnil(L);
  while (lua_next(L, idx)) {
    int v = lua_gettop(L), key = v - 1;
    enter(k, "a key%s", "", 0);
    pack_value(k, key);
    k->depth--;
    if (lua_type(L, key) == LUA_TSTRING)
      enter(k, "field '%s'", lua_tostring(L, key), 0);
    else if (lua_isinteger(L, key))
      enter(k, "element %I", NULL, (long long)lua_tointeger(L, key));
    else
      enter(k, "a field%s", "", 0);
    pack_value(k, v);
    k->depth--;
    lua_pop(L, 1);
  }
  put_byte(k, T_END);
  if (mt) {
    enter(k, "the metatable%s", "", 0);
    pack_value(k, mt);
    k->depth--;
    lua_pop(L, 1);
  }
}

typedef struct dumpbuf_s {
  char *p;
  size_t len, cap;
} dumpbuf_t;

static int dump_writer(lua_State *L, const void *p, size_t sz, void *ud) {
  (void)L;
  dumpbuf_t *d = ud;
  if (d->len + sz > d->cap) {
    size_t cap = d->cap ? d->cap * 2 : 1024;
    while (cap < d->len + sz)
      cap *= 2;
    char *np = realloc(d->p, cap);
    if (np == NULL)
      return 1;
    d->p = np;
    d->cap = cap;
  }
  memcpy(d->p + d->len, p, sz);
  d->len += sz;
  return 0;
}

/* function -> a userdata holding a reference to its proto_t, weak keys:
 * once the function is collected, the userdata's __gc lets the proto go. */
static const char FCACHE_SRC = 0, PROTO_REF_MT = 0;

static int proto_ref_gc(lua_State *L) {
  proto_t **pp = lua_touserdata(L, 1);
  if (*pp != NULL)
    proto_release(*pp);
  *pp = NULL;
  return 0;
}

static void push_proto_ref_mt(lua_State *L) {
  if (lua_rawgetp(L, LUA_REGISTRYINDEX, &PROTO_REF_MT) == LUA_TTABLE)
    return;
  lua_pop(L, 1);
  lua_newtable(L);
  lua_pushcfunction(L, proto_ref_gc);
  lua_setfield(L, -2, "__gc");
  lua_pushvalue(L, -1);
  lua_rawsetp(L, LUA_REGISTRYINDEX, &PROTO_REF_MT);
}

static proto_t *proto_of(packer_t *k, int idx) {
  lua_State *L = k->L;
  lnr_push_weak(L, &FCACHE_SRC, "k");
  lua_pushvalue(L, idx);
  proto_t *p = lua_rawget(L, -2) == LUA_TUSERDATA
                   ? *(proto_t **)lua_touserdata(L, -1) : NULL;
  lua_pop(L, 1);
  if (p == NULL) {
    proto_t **ref = lua_newuserdatauv(L, sizeof *ref, 0);   /* closed first */
    *ref = NULL;
    push_proto_ref_mt(L);
    lua_setmetatable(L, -2);
    dumpbuf_t d = {0};
    lua_pushvalue(L, idx);
    int rc = lua_dump(L, dump_writer, &d, 0);   /* unstripped: line info */
    lua_pop(L, 1);
    p = rc == 0 && d.len > 0 ? intern_proto(d.p, d.len) : NULL;
    free(d.p);
    if (p == NULL)
      luaL_error(L, "out of memory transferring a function");
    *ref = p;                                    /* the cache's reference */
    lua_pushvalue(L, idx);
    lua_insert(L, -2);
    lua_rawset(L, -3);                           /* cache[fn] = ref */
  }
  lua_pop(L, 1);
  add_handle(k, PROTO_KIND, p);                  /* the blob's reference */
  return p;
}

/* Upvalue i of the function fid (at idx), whose value is on top: the first
 * sighting of the upvalue in this blob is packed and remembered in the seen
 * table under its lua_upvalueid (a light userdata, so it cannot clash with
 * the tables and functions kept there) as fid << 8 | i; a later sighting,
 * through another closure, is sent as a join to that one.
 *
 * Only upvalues that are not rebound to the globals get here, so a join
 * only ever names two closures that have such an upvalue: neither is ever
 * taken from the destination's closure cache (which holds only closures
 * whose upvalues are all globals), both are made for this blob, and no
 * cached closure is ever re-joined. The globals themselves are rebound, not
 * joined: every function of a chunk shares its _ENV, and joining it would
 * reach into the cached closures. */
static void pack_upvalue(packer_t *k, int idx, int fid, int i) {
  lua_State *L = k->L;
  int v = lua_gettop(L);
  lua_pushlightuserdata(L, lua_upvalueid(L, idx, i));
  if (lua_rawget(L, k->seen) == LUA_TNUMBER) {
    lua_Integer where = lua_tointeger(L, -1);
    put_byte(k, T_UPJOIN);
    put_size(k, (size_t)(where >> 8));
    put_byte(k, (int)(where & 0xff));
    lua_pop(L, 1);
    return;
  }
  lua_pop(L, 1);
  lua_pushlightuserdata(L, lua_upvalueid(L, idx, i));
  lua_pushinteger(L, (lua_Integer)fid << 8 | i);
  lua_rawset(L, k->seen);
  pack_value(k, v);
}

/* The upvalue count, a flag saying whether all upvalues are the globals
 * (the destination caches such closures), and the upvalues by index. */
static void pack_upvalues(packer_t *k, int idx, int fid) {
  lua_State *L = k->L;
  lua_Debug ar;
  lua_pushvalue(L, idx);
  lua_getinfo(L, ">u", &ar);
  put_byte(k, ar.nups);
  size_t flag_at = k->b->len;
  put_byte(k, 1);                       /* patched: all upvalues are globals */
  bool all_globals = true;
  for (int i = 1; i <= ar.nups; i++) {
    const char *name = lua_getupvalue(L, idx, i);
    /* _ENV, or any upvalue holding the source's globals, binds to the
     * destination's globals (a sandboxed _ENV included). */
    if ((name && strcmp(name, "_ENV") == 0) || is_globals(L, -1)) {
      put_byte(k, T_GLOBALS);
    } else {
      all_globals = false;
      enter(k, "upvalue '%s'", name && *name ? name : "?", 0);
      pack_upvalue(k, idx, fid, i);
      k->depth--;
    }
    lua_pop(L, 1);
  }
  k->b->buf[flag_at] = all_globals;
}

static void pack_function(packer_t *k, int idx) {
  lua_State *L = k->L;
  if (module_name(k, idx, lua_iscfunction(L, idx))) {
    put_byte(k, T_MODULE);
    size_t n;
    const char *s = lua_tolstring(L, -1, &n);
    put_str(k, s, n);
    lua_pop(L, 1);
    return;
  }
  if (lua_iscfunction(L, idx))
    fail(k, "C function");
  if (seen_before(k, idx))
    return;
  int fid = k->nextid - 1;               /* the id seen_before just gave */
  proto_t *p = proto_of(k, idx);
  put_byte(k, T_FUNC);
  put(k, &p, sizeof p);
  pack_upvalues(k, idx, fid);
}

static void pack_value(packer_t *k, int idx) {
  lua_State *L = k->L;
  luaL_checkstack(L, 8, "transferring a value");
  switch (lua_type(L, idx)) {
  case LUA_TNIL: put_byte(k, T_NIL); break;
  case LUA_TBOOLEAN: put_byte(k, lua_toboolean(L, idx) ? T_TRUE : T_FALSE); break;
  case LUA_TNUMBER:
    if (lua_isinteger(L, idx)) {
      lua_Integer i = lua_tointeger(L, idx);
      put_byte(k, T_INT);
      put(k, &i, sizeof i);
    } else {
      lua_Number d = lua_tonumber(L, idx);
      put_byte(k, T_FLT);
      put(k, &d, sizeof d);
    }
    break;
  case LUA_TSTRING: {
    size_t n;
    const char *s = lua_tolstring(L, idx, &n);
    put_byte(k, T_STR);
    put_str(k, s, n);
    break;
  }
  case LUA_TTABLE:
    if (is_globals(L, idx)) {
      put_byte(k, T_GLOBALS);
    } else if (module_name(k, idx, false)) {
      size_t n;
      const char *s = lua_tolstring(L, -1, &n);
      put_byte(k, T_MODULE);
      put_str(k, s, n);
      lua_pop(L, 1);
    } else {
      pack_table(k, idx);
    }
    break;
  case LUA_TFUNCTION: pack_function(k, idx); break;
  case LUA_TUSERDATA: {
    int kind = lnr_handle_kind(L, idx);
    if (kind == 0 && pack_native(k, idx))
      break;
    if (kind == 0 && luaL_getmetafield(L, idx, "__netrun_copy") != LUA_TNIL) {
      lua_pushvalue(L, idx);
      lua_call(L, 1, 1);
      pack_value(k, lua_gettop(L));
      lua_pop(L, 1);
      break;
    }
    if (kind == 0)
      fail(k, "userdata");
    void *ptr = lnr_to_handle(L, idx, kind);
    if (kind == LNR_FUTURE)
      lnr_future_escapes(L, idx);  /* its value may be read elsewhere now */
    put_byte(k, T_HANDLE);
    put_byte(k, kind);
    put(k, &ptr, sizeof ptr);
    add_handle(k, kind, ptr);
    break;
  }
  case LUA_TLIGHTUSERDATA:
    if (module_name(k, idx, false)) {
      size_t n;
      const char *s = lua_tolstring(L, -1, &n);
      put_byte(k, T_MODULE);
      put_str(k, s, n);
      lua_pop(L, 1);
      break;
    }
    fail(k, "light userdata");
    break;
  default:
    fail(k, luaL_typename(L, idx));
  }
}

/* Packing runs protected so a failure frees the half-built blob. The
 * values come as arguments 2.. (a protected call has its own stack); the
 * packer lives on the caller's C stack. */
static int pack_protected(lua_State *L) {
  packer_t *k = lua_touserdata(L, 1);
  k->first_is_fn = lua_isfunction(L, 2);
  for (int i = 0; i < k->nvalues; i++) {
    k->depth = 0;
    k->index = i;
    pack_value(k, 2 + i);
  }
  return 0;
}

lnr_blob_t *lnr_pack(lua_State *L, int from, int n, const char *what) {
  from = lua_absindex(L, from);
  lnr_blob_t *b = lnr_transfer_blob_new();
  if (b == NULL)
    luaL_error(L, "out of memory transferring a value");
  b->nvalues = n;
  packer_t k;
  memset(&k, 0, offsetof(packer_t, path));
  k.L = L;
  k.b = b;
  k.nextid = 1;                          /* as the unpacker counts */
  k.what = what;
  k.nvalues = n;
  /* Fast path: strings, numbers, booleans and nil cannot fail. */
  bool simple = true;
  for (int i = 0; i < n && simple; i++) {
    int t = lua_type(L, from + i);
    simple = t == LUA_TNIL || t == LUA_TBOOLEAN || t == LUA_TNUMBER ||
             t == LUA_TSTRING;
  }
  if (simple) {
    for (int i = 0; i < n; i++)
      pack_value(&k, from + i);
    return b;
  }
  luaL_checkstack(L, n + 4, "transferring values");
  lua_pushcfunction(L, pack_protected);
  lua_pushlightuserdata(L, &k);
  for (int i = 0; i < n; i++)
    lua_pushvalue(L, from + i);
  if (lua_pcall(L, n + 1, 0, 0) != LUA_OK) {
    lnr_blob_free(b);
    lua_error(L);
  }
  return b;
}

/* ---- the module ----------------------------------------------------------- */

/* A hot reload: forget this state's map of module values, so that what
 * crosses next resolves the modules as they are now. */
static void forget_modules(lua_State *L) {
  lua_pushnil(L);
  lua_rawsetp(L, LUA_REGISTRYINDEX, &MODMAP_KEY);
}

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

static void open_transfer(lua_State *L) {
  watch_loaded(L);
  lua_pushcfunction(L, l_transfer);
  lua_setfield(L, -2, "transfer");
}

lnr_module_t lnr_transfer_module = {
    .name = "transfer", .open = open_transfer, .reload = forget_modules};
