/*
 * ldict.c -- netrun.shared.dict: named dictionaries shared by every state
 * of the process (OpenResty's ngx.shared.DICT). A dict is a C hash table
 * under one mutex, with an LRU list for eviction and lazy expiry of TTLs.
 * Values are copies: nil, booleans, numbers (integers stay integers) and
 * strings. Also netrun.core.log, the logger's entry point.
 *
 * Invariants:
 * - No Lua call that may allocate or raise runs with a dict's lock held: a
 *   Lua allocation may run a __gc finalizer that uses the same dict (the
 *   mutex is not recursive), and a raise would leave the mutex locked. What
 *   a method returns is copied to C memory or to Lua memory allocated
 *   before the lock, and pushed after the unlock.
 * - Two limits hold after every store: at most `capacity` entries and at
 *   most `memory` bytes (keys, values and each entry's header). `set`,
 *   `add` and `incr` make room by evicting least recently used entries;
 *   `safe_set` and `safe_add` fail with "no memory" instead.
 * - Keys are hashed with a keyed hash (SipHash-1-3 as specified by Aumasson
 *   and Bernstein) under a random key per dict, so keys an attacker picks
 *   do not collide on purpose; the bucket array doubles when entries
 *   outnumber buckets, so chains stay short as the dict fills.
 */

/***
@module netrun
*/

/***
A shared dict (OpenResty's ngx.shared.DICT), made by `shared.dict`:
a hash table shared by every state of the process, under one mutex, with
LRU eviction and expiry. Values are copies: nil, booleans, numbers
(integers stay integers) and strings. Keys are strings. `#d` is its
number of entries.
@type dict
*/
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "lnr.h"

enum { V_BOOL, V_INT, V_FLT, V_STR };
enum { ST_ADD = 1, ST_SAFE = 2 };      /* store() modes */

#define DEFAULT_CAPACITY 10000
#define DEFAULT_MEMORY ((lua_Integer)64 << 20)
#define MIN_BUCKETS 16

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
  size_t bytes, memory;            /* accounted bytes and their limit */
  uint64_t evictions;
  uint64_t k0, k1;                 /* the hash key */
  entry_t *head, *tail;
  char name[];
} dict_t;

static pthread_mutex_t dicts_lock = PTHREAD_MUTEX_INITIALIZER;
static dict_t *dicts;

/* ---- the keyed hash ---------------------------------------------------------- */

#define ROTL(x, b) (((x) << (b)) | ((x) >> (64 - (b))))

static inline void sip_round(uint64_t v[4]) {
  v[0] += v[1]; v[1] = ROTL(v[1], 13); v[1] ^= v[0]; v[0] = ROTL(v[0], 32);
  v[2] += v[3]; v[3] = ROTL(v[3], 16); v[3] ^= v[2];
  v[0] += v[3]; v[3] = ROTL(v[3], 21); v[3] ^= v[0];
  v[2] += v[1]; v[1] = ROTL(v[1], 17); v[1] ^= v[2]; v[2] = ROTL(v[2], 32);
}

/* n (<= 8) bytes at p as a little-endian word. A whole word is one load
 * (memcpy: no alignment or aliasing assumed), taken only when n == 8, so
 * it never reads past the key; only a key's last, partial word goes byte
 * by byte. */
static inline uint64_t load_le64(const unsigned char *p, size_t n) {
  uint64_t w = 0;
  if (n == 8) {
    memcpy(&w, p, 8);
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__
    w = __builtin_bswap64(w);
#endif
    return w;
  }
  for (size_t i = 0; i < n; i++)
    w |= (uint64_t)p[i] << (8 * i);
  return w;
}

/* One compression round per 8-byte word, three to finish (SipHash-1-3):
 * the variant chosen for hash tables, where keys are short and the secret
 * only has to keep collisions unpredictable. */
static uint64_t hash(const dict_t *d, const char *s, size_t n) {
  const unsigned char *p = (const unsigned char *)s;
  uint64_t v[4] = {d->k0 ^ 0x736f6d6570736575ull, d->k1 ^ 0x646f72616e646f6dull,
                   d->k0 ^ 0x6c7967656e657261ull, d->k1 ^ 0x7465646279746573ull};
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    uint64_t m = load_le64(p + i, 8);
    v[3] ^= m;
    sip_round(v);
    v[0] ^= m;
  }
  uint64_t last = ((uint64_t)n << 56) | load_le64(p + i, n - i);
  v[3] ^= last;
  sip_round(v);
  v[0] ^= last;
  v[2] ^= 0xff;
  sip_round(v);
  sip_round(v);
  sip_round(v);
  return v[0] ^ v[1] ^ v[2] ^ v[3];
}

/* A fresh random key per dict (a simulation's are its seed's). */
static void seed(dict_t *d) {
  uint64_t k[2];
  nr_random_bytes(k, sizeof k);
  d->k0 = k[0];
  d->k1 = k[1];
}

/* ---- the table (lock held) --------------------------------------------------- */

static size_t value_bytes(int type, size_t slen) {
  return type == V_STR ? slen : 0;
}

static size_t entry_bytes(const entry_t *e) {
  return sizeof *e + e->klen + value_bytes(e->type, e->v.s.len);
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
  entry_t **pp = &d->buckets[e->hash & (d->nbuckets - 1)];
  while (*pp != e)
    pp = &(*pp)->hnext;
  *pp = e->hnext;
  lru_unlink(d, e);
  d->bytes -= entry_bytes(e);
  free_value(e);
  free(e);
  d->n--;
}

/* Double the bucket array once entries outnumber buckets. A failed
 * allocation keeps the old array: longer chains, nothing lost. */
static void maybe_grow(dict_t *d) {
  if (d->n <= d->nbuckets)
    return;
  size_t nb = d->nbuckets * 2;
  entry_t **b = calloc(nb, sizeof *b);
  if (b == NULL)
    return;
  for (size_t i = 0; i < d->nbuckets; i++)
    for (entry_t *e = d->buckets[i], *next; e; e = next) {
      next = e->hnext;
      e->hnext = b[e->hash & (nb - 1)];
      b[e->hash & (nb - 1)] = e;
    }
  free(d->buckets);
  d->buckets = b;
  d->nbuckets = nb;
}

/* The live entry for a key (expired ones are dropped on sight). */
static entry_t *find(dict_t *d, const char *k, size_t n, uint64_t h) {
  for (entry_t *e = d->buckets[h & (d->nbuckets - 1)]; e; e = e->hnext)
    if (e->hash == h && e->klen == n && memcmp(e->key, k, n) == 0) {
      if (e->expires && e->expires <= nr_now()) {
        remove_entry(d, e);
        return NULL;
      }
      return e;
    }
  return NULL;
}

/* Evict from the LRU tail (never `keep`) until an entry costing `need`
 * bytes fits beside the others; `adds` when it is a new entry. Returns 0,
 * or -ENOMEM in safe mode when something would have to go. */
static int make_room(dict_t *d, entry_t *keep, size_t need, bool adds,
                     bool safe) {
  size_t old = keep ? entry_bytes(keep) : 0;
  while (d->bytes - old + need > d->memory || (adds && d->n >= d->capacity)) {
    entry_t *victim = d->tail == keep ? keep->prev : d->tail;
    if (victim == NULL || safe)
      return -ENOMEM;
    remove_entry(d, victim);
    d->evictions++;
  }
  return 0;
}

/* Store (key, value). A string value in val is borrowed (the caller's
 * Lua string): the dict copies it, into the old value's buffer when the
 * key holds a string of the same length (an overwrite then allocates and
 * frees nothing, and the accounting is unchanged), else into a new one.
 * Returns 0, -EEXIST (ST_ADD and the key is live) or -ENOMEM. */
static int store(dict_t *d, const char *k, size_t n, const entry_t *val,
                 uint64_t expires, int mode) {
  uint64_t h = hash(d, k, n);
  entry_t *e = find(d, k, n, h);
  if (e && (mode & ST_ADD))
    return -EEXIST;
  size_t need = sizeof *e + n + value_bytes(val->type, val->v.s.len);
  if (need > d->memory)
    return -ENOMEM;
  bool in_place = val->type == V_STR && e && e->type == V_STR &&
                  e->v.s.len == val->v.s.len;
  char *copy = NULL;
  if (val->type == V_STR && !in_place &&
      (copy = malloc(val->v.s.len + 1)) == NULL)   /* + 1: never malloc(0) */
    return -ENOMEM;
  if (make_room(d, e, need, e == NULL, mode & ST_SAFE) < 0) {
    free(copy);
    return -ENOMEM;
  }
  if (e == NULL) {
    e = malloc(sizeof *e + n);
    if (e == NULL) {
      free(copy);
      return -ENOMEM;
    }
    memcpy(e->key, k, n);
    e->klen = n;
    e->hash = h;
    e->hnext = d->buckets[h & (d->nbuckets - 1)];
    d->buckets[h & (d->nbuckets - 1)] = e;
    d->n++;
  } else {
    d->bytes -= entry_bytes(e);
    if (!in_place)
      free_value(e);
    if (e != d->head)
      lru_unlink(d, e);
  }
  if (in_place) {
    memcpy(e->v.s.s, val->v.s.s, val->v.s.len);
  } else {
    e->type = val->type;
    e->v = val->v;
    if (copy) {
      memcpy(copy, val->v.s.s, val->v.s.len);
      e->v.s.s = copy;
    }
  }
  e->expires = expires;
  d->bytes += entry_bytes(e);
  if (e != d->head)
    lru_front(d, e);
  maybe_grow(d);
  return 0;
}

static void clear(dict_t *d) {
  while (d->head)
    remove_entry(d, d->head);
}

/* ---- methods ----------------------------------------------------------------- */

static dict_t *check(lua_State *L) {
  return lnr_check_handle(L, 1, LNR_DICT);
}

/* Read the value at idx into a detached entry value (before the lock: it
 * may raise); a string is borrowed, not copied (see store). */
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
  case LUA_TSTRING: {     /* borrowed: anchored at idx; store() copies it */
    size_t n;
    tmp->type = V_STR;
    tmp->v.s.s = (char *)lua_tolstring(L, idx, &n);
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

static int push_status(lua_State *L, int rc) {
  if (rc == 0) {
    lua_pushboolean(L, 1);
    return 1;
  }
  lua_pushnil(L);
  lua_pushstring(L, rc == -EEXIST ? "exists" : "no memory");
  return 2;
}

static int store_value(lua_State *L, int mode) {
  dict_t *d = check(L);
  size_t n;
  const char *k = luaL_checklstring(L, 2, &n);
  uint64_t expires = opt_ttl(L, 4);
  if (lua_isnoneornil(L, 3)) {
    if (mode & ST_ADD)
      return luaL_error(L, "shared dict add: value is nil");
    pthread_mutex_lock(&d->lock);
    entry_t *e = find(d, k, n, hash(d, k, n));
    if (e)
      remove_entry(d, e);
    pthread_mutex_unlock(&d->lock);
    return push_status(L, 0);
  }
  entry_t val = {0};
  read_value(L, 3, &val);
  pthread_mutex_lock(&d->lock);
  int rc = store(d, k, n, &val, expires, mode);
  pthread_mutex_unlock(&d->lock);
  return push_status(L, rc);
}

/***
Store a value (nil deletes); makes room by evicting the least recently
used entries when at `capacity` or `memory`.
@function dict:set
@string k the key
@param v the value: nil, boolean, number or string
@number[opt] ttl seconds it lives (default: forever)
@treturn[1] bool true
@treturn[2] nil
@treturn[2] string "no memory" when even eviction cannot make room
*/
/***
Store a value only if the key is absent.
@function dict:add
@string k the key
@param v the value (nil raises)
@number[opt] ttl seconds
@treturn[1] bool true
@treturn[2] nil
@treturn[2] string "exists" (or "no memory")
*/
/***
As `set`, but fail with "no memory" instead of evicting.
@function dict:safe_set
@string k the key
@param v the value
@number[opt] ttl seconds
@treturn[1] bool true
@treturn[2] nil
@treturn[2] string "no memory"
*/
/***
As `add`, but fail with "no memory" instead of evicting.
@function dict:safe_add
@string k the key
@param v the value
@number[opt] ttl seconds
@treturn[1] bool true
@treturn[2] nil
@treturn[2] string "exists" or "no memory"
*/

static int d_set(lua_State *L) { return store_value(L, 0); }
static int d_add(lua_State *L) { return store_value(L, ST_ADD); }
static int d_safe_set(lua_State *L) { return store_value(L, ST_SAFE); }
static int d_safe_add(lua_State *L) { return store_value(L, ST_ADD | ST_SAFE); }

/* Copy the live value of k into *out (a string into buf when it fits in
 * cap bytes). Returns 1 found, 0 absent, or -(length) of a string that
 * did not fit. Takes the lock. */
static ssize_t copy_out(dict_t *d, const char *k, size_t n, entry_t *out,
                        char *buf, size_t cap) {
  ssize_t rc = 0;
  pthread_mutex_lock(&d->lock);
  entry_t *e = find(d, k, n, hash(d, k, n));
  if (e) {
    if (e != d->head) {
      lru_unlink(d, e);
      lru_front(d, e);
    }
    *out = *e;
    rc = 1;
    if (e->type == V_STR && e->v.s.len > cap)
      rc = -(ssize_t)e->v.s.len;
    else if (e->type == V_STR) {
      memcpy(buf, e->v.s.s, e->v.s.len);
      out->v.s.s = buf;
    }
  }
  pthread_mutex_unlock(&d->lock);
  return rc;
}

/***
The value of a key.
@function dict:get
@string k the key
@return the value, or nil (absent or expired)
*/

/* A string too long for the stack buffer is copied into a Lua userdata
 * made before the lock (so a raise loses nothing), sized by a first look;
 * the value may grow in between, hence the loop. */
static int d_get(lua_State *L) {
  dict_t *d = check(L);
  size_t n;
  const char *k = luaL_checklstring(L, 2, &n);
  char small[256], *buf = small;
  size_t cap = sizeof small;
  entry_t v;
  ssize_t rc;
  while ((rc = copy_out(d, k, n, &v, buf, cap)) < 0) {
    cap = (size_t)-rc;
    lua_settop(L, 2);
    buf = lua_newuserdatauv(L, cap, 0);
  }
  if (rc == 0)
    lua_pushnil(L);
  else
    push_value(L, &v);
  return 1;
}

/***
Add to a number, atomically; integers stay integers. The key keeps its TTL.
@function dict:incr
@string k the key
@number by the increment
@number[opt] init the value to start from when the key is absent (else that fails)
@treturn[1] number the new value
@treturn[2] nil
@treturn[2] string "not found", "not a number" or "no memory"
*/

static int d_incr(lua_State *L) {
  dict_t *d = check(L);
  size_t n;
  const char *k = luaL_checklstring(L, 2, &n);
  luaL_checknumber(L, 3);
  bool has_init = !lua_isnoneornil(L, 4);
  if (has_init)
    luaL_checknumber(L, 4);
  bool int_by = lua_isinteger(L, 3), int_init = lua_isinteger(L, 4);
  lua_Integer iby = lua_tointeger(L, 3), iinit = lua_tointeger(L, 4);
  lua_Number fby = lua_tonumber(L, 3), finit = lua_tonumber(L, 4);
  entry_t val = {0};
  int rc = 0;
  pthread_mutex_lock(&d->lock);
  entry_t *e = find(d, k, n, hash(d, k, n));
  if (e == NULL && !has_init)
    rc = 1;
  else if (e && e->type != V_INT && e->type != V_FLT)
    rc = 2;
  else {
    if (int_by && (e ? e->type == V_INT : int_init)) {
      lua_Integer base = e ? e->v.i : iinit;
      val.type = V_INT;
      val.v.i = (lua_Integer)((lua_Unsigned)base + (lua_Unsigned)iby);
    } else {
      lua_Number base = e ? (e->type == V_INT ? (lua_Number)e->v.i : e->v.n)
                          : finit;
      val.type = V_FLT;
      val.v.n = base + fby;
    }
    rc = store(d, k, n, &val, e ? e->expires : 0, 0);
  }
  pthread_mutex_unlock(&d->lock);
  if (rc == 0) {
    push_value(L, &val);
    return 1;
  }
  lua_pushnil(L);
  lua_pushstring(L, rc == 1 ? "not found" : rc == 2 ? "not a number"
                                                    : "no memory");
  return 2;
}

/***
Delete a key.
@function dict:delete
@string k the key
@treturn bool true
*/

static int d_delete(lua_State *L) {
  lua_settop(L, 2);
  lua_pushnil(L);
  return store_value(L, 0);
}

/* Key records (length, then bytes) of up to max live keys, most recent
 * first, into buf of cap bytes, stopping at the first that does not fit.
 * Returns the bytes all of them need; *used, the bytes written. Takes the
 * lock. */
static size_t copy_keys(dict_t *d, lua_Integer max, char *buf, size_t cap,
                        size_t *used) {
  size_t need = 0;
  lua_Integer i = 0;
  uint64_t now = nr_now();
  *used = 0;
  pthread_mutex_lock(&d->lock);
  for (entry_t *e = d->head; e && (max <= 0 || i < max); e = e->next) {
    if (e->expires && e->expires <= now)
      continue;
    size_t rec = sizeof e->klen + e->klen;
    if (need == *used && need + rec <= cap) {
      memcpy(buf + need, &e->klen, sizeof e->klen);
      memcpy(buf + need + sizeof e->klen, e->key, e->klen);
      *used += rec;
    }
    need += rec;
    i++;
  }
  pthread_mutex_unlock(&d->lock);
  return need;
}

/***
The live keys, most recently used first.
@function dict:keys
@int[opt=1024] max at most this many (0: all)
@treturn {string,...}
*/

/* keys([max = 1024]): sized by a first pass, copied into a userdata made
 * with no lock held, then turned into strings. Keys that grow the list in
 * between (a finalizer run by the allocation may set some) cost another
 * pass; after four, the keys that did fit are returned. */
static int d_keys(lua_State *L) {
  dict_t *d = check(L);
  lua_Integer max = luaL_optinteger(L, 2, 1024);
  size_t used, cap = 0, need = copy_keys(d, max, NULL, 0, &used);
  char *buf = NULL;
  for (int tries = 0; need > cap && tries < 4; tries++) {
    cap = need + need / 8;
    lua_settop(L, 2);
    buf = lua_newuserdatauv(L, cap ? cap : 1, 0);
    need = copy_keys(d, max, buf, cap, &used);
  }
  lua_newtable(L);
  lua_Integer i = 0;
  for (size_t off = 0; off < used;) {
    size_t len;
    memcpy(&len, buf + off, sizeof len);
    off += sizeof len;
    lua_pushlstring(L, buf + off, len);
    lua_rawseti(L, -2, ++i);
    off += len;
  }
  return 1;
}

/***
Delete every entry.
@function dict:flush_all
*/

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
  size_t n = d->n;
  pthread_mutex_unlock(&d->lock);
  lua_pushinteger(L, (lua_Integer)n);
  return 1;
}

static size_t max_chain(const dict_t *d) {
  size_t max = 0;
  for (size_t i = 0; i < d->nbuckets; i++) {
    size_t len = 0;
    for (const entry_t *e = d->buckets[i]; e; e = e->hnext)
      len++;
    max = len > max ? len : max;
  }
  return max;
}

/***
Counters: `entries`, `bytes`, `capacity`, `memory`, `buckets`,
`max_chain` (the longest hash chain), `evictions`.
@function dict:stats
@treturn table
*/

/* stats(): entries, bytes, capacity, memory, buckets, max_chain (the
 * longest hash chain: a walk of every bucket, for tests and diagnosis),
 * evictions. */
static int d_stats(lua_State *L) {
  dict_t *d = check(L);
  pthread_mutex_lock(&d->lock);
  size_t v[] = {d->n, d->bytes, d->capacity, d->memory, d->nbuckets,
                max_chain(d), (size_t)d->evictions};
  pthread_mutex_unlock(&d->lock);
  static const char *const names[] = {"entries", "bytes", "capacity", "memory",
                                      "buckets", "max_chain", "evictions"};
  lua_createtable(L, 0, 7);
  for (int i = 0; i < 7; i++) {
    lua_pushinteger(L, (lua_Integer)v[i]);
    lua_setfield(L, -2, names[i]);
  }
  return 1;
}

static int d_tostring(lua_State *L) {
  dict_t *d = check(L);
  lua_pushfstring(L, "netrun.dict(%s)", d->name);
  return 1;
}

static dict_t *new_dict(const char *name, lua_Integer cap, lua_Integer mem) {
  dict_t *d = calloc(1, sizeof *d + strlen(name) + 1);
  if (d)
    d->buckets = calloc(MIN_BUCKETS, sizeof *d->buckets);
  if (d == NULL || d->buckets == NULL) {
    free(d);
    return NULL;
  }
  strcpy(d->name, name);
  d->nbuckets = MIN_BUCKETS;
  d->capacity = (size_t)cap;
  d->memory = (size_t)mem;
  seed(d);
  pthread_mutex_init(&d->lock, NULL);
  return d;
}

/*** @section end */

/***
The shared dict of that name, the same from every state and thread (the
first call's limits hold). It may be an upvalue of a function sent to a
loop: it crosses as a handle.
@function shared.dict
@string name the dict's name
@tparam[opt] table opts
@int[opt=10000] opts.capacity the most entries
@int[opt=67108864] opts.memory the most bytes (keys, values and each entry's header)
@treturn dict
@usage local hits = netrun.shared.dict("hits")
hits:incr("/", 1, 0)
*/

/* netrun.shared.dict(name [, { capacity = N, memory = BYTES }]): the same
 * dict for the same name, from any state (the first call's limits hold). */
static int l_dict(lua_State *L) {
  static const char *const keys[] = {"capacity", "memory", NULL};
  const char *name = luaL_checkstring(L, 1);
  lnr_opts_t t;
  lnr_opts_open(&t, L, 2, "netrun.shared.dict", keys, false);
  lua_Integer cap = lnr_opt_integer(&t, "capacity", DEFAULT_CAPACITY, 1,
                                    LUA_MAXINTEGER);
  lua_Integer mem = (lua_Integer)lnr_opt_size(&t, "memory", DEFAULT_MEMORY, 1,
                                              LNR_OPT_SIZE_MAX);
  char ns[128];
  if (nr_sim_namespace(ns, sizeof ns) > 0)   /* a simulated host's own */
    name = lua_pushfstring(L, "%s%s", ns, name);
  pthread_mutex_lock(&dicts_lock);
  dict_t *d = dicts;
  while (d && strcmp(d->name, name) != 0)
    d = d->next;
  if (d == NULL && (d = new_dict(name, cap, mem)) != NULL) {
    d->next = dicts;
    dicts = d;
  }
  pthread_mutex_unlock(&dicts_lock);
  if (d == NULL)
    return luaL_error(L, "netrun.shared.dict: %s: out of memory", name);
  lnr_push_handle(L, LNR_DICT, d);
  return 1;
}

/* core.dict_leak(d, key, rate, burst): one request through nginx's
 * limit_req leaky bucket for key (lua/netrun/limit.lua), in one step under
 * the dict's lock so that loops sharing the dict count exactly. The key
 * holds the time (nr_now's, s) its bucket is empty again -- the GCRA form
 * of nginx's excess: excess = (empty_at - now) * rate. A request makes it
 * max(empty_at + 1 / rate, now) (a new key: now), and is refused when
 * that is more than burst requests ahead, leaving it unchanged. The entry
 * expires when its bucket is empty. Returns the delay (s: the excess over
 * the rate, 0 within it) or nil. */
static int l_dict_leak(lua_State *L) {
  dict_t *d = lnr_check_handle(L, 1, LNR_DICT);
  size_t n;
  const char *k = luaL_checklstring(L, 2, &n);
  double rate = luaL_checknumber(L, 3), burst = luaL_checknumber(L, 4);
  uint64_t ns = nr_now();
  double now = (double)ns / 1e9, delay = -1;
  pthread_mutex_lock(&d->lock);
  entry_t *e = find(d, k, n, hash(d, k, n));
  double at = e && e->type == V_FLT ? e->v.n + 1 / rate : now;
  if (at < now)
    at = now;
  if ((at - now) * rate <= burst + 1e-9) {
    entry_t val = {.type = V_FLT, .v.n = at};
    if (store(d, k, n, &val, ns + (uint64_t)((at - now) * 1e9) + NR_SEC(1),
              0) == 0)
      delay = at - now;
  }
  pthread_mutex_unlock(&d->lock);
  if (delay < 0)
    return 0;
  lua_pushnumber(L, delay);
  return 1;
}

/* The process's teardown: every dict is freed. */
static bool free_dicts(lua_State *L) {
  (void)L;
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
  return true;
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

static void open_dict(lua_State *L) {
  static const luaL_Reg methods[] = {
      {"get", d_get}, {"set", d_set}, {"add", d_add}, {"incr", d_incr},
      {"safe_set", d_safe_set}, {"safe_add", d_safe_add}, {"delete", d_delete},
      {"keys", d_keys}, {"flush_all", d_flush_all}, {"stats", d_stats},
      {NULL, NULL}};
  static const luaL_Reg meta[] = {{"__len", d_len}, {"__tostring", d_tostring},
                                  {NULL, NULL}};
  lnr_new_class(L, lnr_kind_names[LNR_DICT], methods, meta);
  lnr_handle_class(L, LNR_DICT);
  static const luaL_Reg funcs[] = {{"dict", l_dict}, {"log", l_log},
                                   {"dict_leak", l_dict_leak},
                                   {"log_level", l_log_level}, {NULL, NULL}};
  luaL_setfuncs(L, funcs, 0);
}

lnr_module_t lnr_dict_module = {
    .name = "dict", .open = open_dict, .teardown = free_dicts};
