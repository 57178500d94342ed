/*
 * ldict.c -- netrun.shared.dict: named dictionaries shared by every state
 * of the process (OpenResty's ngx.shared.DICT). A dict is a C hash table
 * under one mutex, with an LRU list for eviction at capacity and lazy
 * expiry of TTLs. Values are copies: nil, booleans, numbers (integers stay
 * integers) and strings. Also netrun.core.log, the logger's entry point.
 */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "lnr.h"

enum { V_BOOL, V_INT, V_FLT, V_STR };

typedef struct entry_s {
  struct entry_s *hnext;           /* hash chain */
  struct entry_s *prev, *next;     /* LRU: head is the most recent */
  uint64_t hash, expires;          /* expires: 0 = never */
  int type;
  union {
    int b;
    lua_Integer i;
    lua_Number n;
    struct {
      char *s;
      size_t len;
    } s;
  } v;
  size_t klen;
  char key[];
} entry_t;

typedef struct dict_s {
  struct dict_s *next;
  pthread_mutex_t lock;
  entry_t **buckets;
  size_t nbuckets, n, capacity;
  entry_t *head, *tail;
  char name[];
} dict_t;

static pthread_mutex_t dicts_lock = PTHREAD_MUTEX_INITIALIZER;
static dict_t *dicts;

static uint64_t hash(const char *s, size_t n) {
  uint64_t h = 1469598103934665603ull;
  for (size_t i = 0; i < n; i++)
    h = (h ^ (unsigned char)s[i]) * 1099511628211ull;
  return h;
}

static void lru_unlink(dict_t *d, entry_t *e) {
  if (e->prev) e->prev->next = e->next; else d->head = e->next;
  if (e->next) e->next->prev = e->prev; else d->tail = e->prev;
  e->prev = e->next = NULL;
}

static void lru_front(dict_t *d, entry_t *e) {
  e->prev = NULL;
  e->next = d->head;
  if (d->head) d->head->prev = e;
  d->head = e;
  if (d->tail == NULL) d->tail = e;
}

static void free_value(entry_t *e) {
  if (e->type == V_STR)
    free(e->v.s.s);
}

static void remove_entry(dict_t *d, entry_t *e) {
  entry_t **pp = &d->buckets[e->hash % d->nbuckets];
  while (*pp != e)
    pp = &(*pp)->hnext;
  *pp = e->hnext;
  lru_unlink(d, e);
  free_value(e);
  free(e);
  d->n--;
}

/* The live entry for a key (expired ones are dropped on sight). */
static entry_t *find(dict_t *d, const char *k, size_t n, uint64_t h) {
  for (entry_t *e = d->buckets[h % d->nbuckets]; e; e = e->hnext)
    if (e->hash == h && e->klen == n && memcmp(e->key, k, n) == 0) {
      if (e->expires && e->expires <= nr_now()) {
        remove_entry(d, e);
        return NULL;
      }
      return e;
    }
  return NULL;
}

static dict_t *check(lua_State *L) {
  return lnr_check_handle(L, 1, LNR_DICT);
}

/* Read the value at idx into a detached entry value. */
static void read_value(lua_State *L, int idx, entry_t *tmp) {
  switch (lua_type(L, idx)) {
  case LUA_TBOOLEAN: tmp->type = V_BOOL; tmp->v.b = lua_toboolean(L, idx); break;
  case LUA_TNUMBER:
    if (lua_isinteger(L, idx)) {
      tmp->type = V_INT;
      tmp->v.i = lua_tointeger(L, idx);
    } else {
      tmp->type = V_FLT;
      tmp->v.n = lua_tonumber(L, idx);
    }
    break;
  case LUA_TSTRING: {
    size_t n;
    const char *s = lua_tolstring(L, idx, &n);
    tmp->type = V_STR;
    tmp->v.s.s = malloc(n + 1);
    if (tmp->v.s.s == NULL)
      luaL_error(L, "out of memory");
    memcpy(tmp->v.s.s, s, n);
    tmp->v.s.len = n;
    break;
  }
  default:
    luaL_error(L, "shared dict values must be strings, numbers or booleans, "
               "not %s", luaL_typename(L, idx));
  }
}

static void push_value(lua_State *L, const entry_t *e) {
  switch (e->type) {
  case V_BOOL: lua_pushboolean(L, e->v.b); break;
  case V_INT: lua_pushinteger(L, e->v.i); break;
  case V_FLT: lua_pushnumber(L, e->v.n); break;
  default: lua_pushlstring(L, e->v.s.s, e->v.s.len);
  }
}

static uint64_t opt_ttl(lua_State *L, int idx) {
  if (lua_isnoneornil(L, idx))
    return 0;
  double s = lnr_checkseconds(L, idx, "shared dict ttl");
  return s > 0 ? nr_now() + lnr_ns(s) : 0;
}

/* Store (key, value) under the lock; evicts the least recently used entry
 * when full. `add` fails if the key exists. Returns 0, or -EEXIST. */
static int store(dict_t *d, const char *k, size_t n, entry_t *val,
                 uint64_t expires, bool add) {
  uint64_t h = hash(k, n);
  entry_t *e = find(d, k, n, h);
  if (e && add)
    return -EEXIST;
  if (e) {
    free_value(e);
    e->type = val->type;
    e->v = val->v;
    e->expires = expires;
    lru_unlink(d, e);
    lru_front(d, e);
    return 0;
  }
  if (d->n >= d->capacity && d->tail)
    remove_entry(d, d->tail);
  e = malloc(sizeof *e + n);
  if (e == NULL)
    return -ENOMEM;
  memcpy(e->key, k, n);
  e->klen = n;
  e->hash = h;
  e->type = val->type;
  e->v = val->v;
  e->expires = expires;
  e->hnext = d->buckets[h % d->nbuckets];
  d->buckets[h % d->nbuckets] = e;
  lru_front(d, e);
  d->n++;
  return 0;
}

static int set_or_add(lua_State *L, bool add) {
  dict_t *d = check(L);
  size_t n;
  const char *k = luaL_checklstring(L, 2, &n);
  uint64_t expires = opt_ttl(L, 4);
  if (lua_isnoneornil(L, 3)) {
    if (add)
      return luaL_error(L, "shared dict add: value is nil");
    pthread_mutex_lock(&d->lock);
    entry_t *e = find(d, k, n, hash(k, n));
    if (e)
      remove_entry(d, e);
    pthread_mutex_unlock(&d->lock);
    lua_pushboolean(L, 1);
    return 1;
  }
  entry_t val = {0};
  read_value(L, 3, &val);
  pthread_mutex_lock(&d->lock);
  int rc = store(d, k, n, &val, expires, add);
  pthread_mutex_unlock(&d->lock);
  if (rc < 0) {
    free_value(&val);
    lua_pushnil(L);
    lua_pushstring(L, rc == -EEXIST ? "exists" : "no memory");
    return 2;
  }
  lua_pushboolean(L, 1);
  return 1;
}

static int d_set(lua_State *L) { return set_or_add(L, false); }
static int d_add(lua_State *L) { return set_or_add(L, true); }

static int d_get(lua_State *L) {
  dict_t *d = check(L);
  size_t n;
  const char *k = luaL_checklstring(L, 2, &n);
  pthread_mutex_lock(&d->lock);
  entry_t *e = find(d, k, n, hash(k, n));
  if (e) {
    lru_unlink(d, e);
    lru_front(d, e);
    /* Copy out under the lock; strings are pushed after (one copy). */
    if (e->type == V_STR) {
      char small[256], *buf = e->v.s.len <= sizeof small ? small : malloc(e->v.s.len);
      size_t len = e->v.s.len;
      if (buf)
        memcpy(buf, e->v.s.s, len);
      pthread_mutex_unlock(&d->lock);
      if (buf == NULL)
        return luaL_error(L, "out of memory");
      lua_pushlstring(L, buf, len);
      if (buf != small)
        free(buf);
      return 1;
    }
    entry_t copy = *e;
    pthread_mutex_unlock(&d->lock);
    push_value(L, &copy);
    return 1;
  }
  pthread_mutex_unlock(&d->lock);
  lua_pushnil(L);
  return 1;
}

static int d_incr(lua_State *L) {
  dict_t *d = check(L);
  size_t n;
  const char *k = luaL_checklstring(L, 2, &n);
  luaL_checknumber(L, 3);
  bool has_init = !lua_isnoneornil(L, 4);
  if (has_init)
    luaL_checknumber(L, 4);
  pthread_mutex_lock(&d->lock);
  entry_t *e = find(d, k, n, hash(k, n));
  if (e == NULL && !has_init) {
    pthread_mutex_unlock(&d->lock);
    lua_pushnil(L);
    lua_pushliteral(L, "not found");
    return 2;
  }
  if (e && e->type != V_INT && e->type != V_FLT) {
    pthread_mutex_unlock(&d->lock);
    lua_pushnil(L);
    lua_pushliteral(L, "not a number");
    return 2;
  }
  entry_t val = {0};
  bool ints = lua_isinteger(L, 3) && (e ? e->type == V_INT : lua_isinteger(L, 4));
  if (ints) {
    lua_Integer base = e ? e->v.i : lua_tointeger(L, 4);
    val.type = V_INT;
    val.v.i = (lua_Integer)((lua_Unsigned)base + (lua_Unsigned)lua_tointeger(L, 3));
  } else {
    lua_Number base = e ? (e->type == V_INT ? (lua_Number)e->v.i : e->v.n)
                        : lua_tonumber(L, 4);
    val.type = V_FLT;
    val.v.n = base + lua_tonumber(L, 3);
  }
  int rc = store(d, k, n, &val, e ? e->expires : 0, false);
  pthread_mutex_unlock(&d->lock);
  if (rc < 0)
    return luaL_error(L, "shared dict incr: out of memory");
  push_value(L, &val);
  return 1;
}

static int d_delete(lua_State *L) {
  lua_settop(L, 2);
  lua_pushnil(L);
  return set_or_add(L, false);
}

static int d_keys(lua_State *L) {
  dict_t *d = check(L);
  lua_Integer max = luaL_optinteger(L, 2, 1024);
  lua_newtable(L);
  lua_Integer i = 0;
  uint64_t now = nr_now();
  pthread_mutex_lock(&d->lock);
  for (entry_t *e = d->head; e && (max <= 0 || i < max); e = e->next)
    if (e->expires == 0 || e->expires > now) {
      lua_pushlstring(L, e->key, e->klen);
      lua_rawseti(L, -2, ++i);
    }
  pthread_mutex_unlock(&d->lock);
  return 1;
}

static void clear(dict_t *d) {
  while (d->head)
    remove_entry(d, d->head);
}

static int d_flush_all(lua_State *L) {
  dict_t *d = check(L);
  pthread_mutex_lock(&d->lock);
  clear(d);
  pthread_mutex_unlock(&d->lock);
  return 0;
}

static int d_len(lua_State *L) {
  dict_t *d = check(L);
  pthread_mutex_lock(&d->lock);
  lua_pushinteger(L, (lua_Integer)d->n);
  pthread_mutex_unlock(&d->lock);
  return 1;
}

static int d_tostring(lua_State *L) {
  dict_t *d = check(L);
  lua_pushfstring(L, "netrun.dict(%s)", d->name);
  return 1;
}

/* netrun.shared.dict(name [, { capacity = N }]): the same dict for the same
 * name, from any state. */
static int l_dict(lua_State *L) {
  const char *name = luaL_checkstring(L, 1);
  lua_Integer cap = 10000;
  if (lua_istable(L, 2)) {
    lua_getfield(L, 2, "capacity");
    cap = luaL_optinteger(L, -1, 10000);
    lua_pop(L, 1);
  }
  if (cap < 1)
    return luaL_error(L, "netrun.shared.dict: capacity must be >= 1");
  pthread_mutex_lock(&dicts_lock);
  dict_t *d = dicts;
  while (d && strcmp(d->name, name) != 0)
    d = d->next;
  if (d == NULL) {
    size_t nb = 64;
    while (nb < (size_t)cap)
      nb *= 2;
    d = calloc(1, sizeof *d + strlen(name) + 1);
    if (d)
      d->buckets = calloc(nb, sizeof *d->buckets);
    if (d == NULL || d->buckets == NULL) {
      pthread_mutex_unlock(&dicts_lock);
      free(d);
      return luaL_error(L, "out of memory");
    }
    strcpy(d->name, name);
    d->nbuckets = nb;
    d->capacity = (size_t)cap;
    pthread_mutex_init(&d->lock, NULL);
    d->next = dicts;
    dicts = d;
  }
  pthread_mutex_unlock(&dicts_lock);
  lnr_push_handle(L, LNR_DICT, d);
  return 1;
}

void lnr_free_dicts(void) {
  pthread_mutex_lock(&dicts_lock);
  for (dict_t *d = dicts, *n; d; d = n) {
    n = d->next;
    clear(d);
    free(d->buckets);
    pthread_mutex_destroy(&d->lock);
    free(d);
  }
  dicts = NULL;
  pthread_mutex_unlock(&dicts_lock);
}

/* core.log(level, message) and core.log_level(). */
static int l_log(lua_State *L) {
  int level = (int)luaL_checkinteger(L, 1);
  nr_log(level, "%s", luaL_checkstring(L, 2));
  return 0;
}

static int l_log_level(lua_State *L) {
  if (lua_isinteger(L, 1))
    nr_log_set_level((int)lua_tointeger(L, 1));
  lua_pushinteger(L, nr_log_level());
  return 1;
}

void lnr_open_dict(lua_State *L) {
  static const luaL_Reg methods[] = {
      {"get", d_get}, {"set", d_set}, {"add", d_add}, {"incr", d_incr},
      {"delete", d_delete}, {"keys", d_keys}, {"flush_all", d_flush_all},
      {NULL, NULL}};
  static const luaL_Reg meta[] = {{"__len", d_len}, {"__tostring", d_tostring},
                                  {NULL, NULL}};
  lnr_new_class(L, lnr_kind_names[LNR_DICT], methods, meta);
  lnr_handle_class(L, LNR_DICT);
  static const luaL_Reg funcs[] = {{"dict", l_dict}, {"log", l_log},
                                   {"log_level", l_log_level}, {NULL, NULL}};
  luaL_setfuncs(L, funcs, 0);
}
