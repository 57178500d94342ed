/*
 * lupstream.c -- the shared half of netrun.http.upstream: each backend's
 * state (up or down, recent failures, requests in flight, probe passes),
 * one block per upstream shared by every loop that uses it. The policy
 * (which failures count, retries, probes) is lua/netrun/upstream.lua's;
 * this file picks a server and keeps the counts.
 *
 * An upstream's state is a handle (LNR_UPSTREAM): reference counted, it
 * crosses threads by reference like a channel group (DESIGN.md §3), so
 * the copy of an upstream table in each loop's state points at the same
 * block. Every field a request touches is an atomic, read and written
 * without a lock: a pick reads the servers' flags and counts, a request's
 * end adds to them. Races only blur counts for an instant (two loops
 * counting the same failure window at once), never a server's memory.
 * Each server's fields sit on a cache line of their own, so loops
 * busy with different servers do not share lines.
 *
 * Times are nr_now()'s (monotonic ns; virtual under netrun.sim).
 */
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "lnr.h"

#define MAX_SERVERS 64            /* a retry's tried set is a 64-bit mask */

typedef struct {
  _Alignas(64) _Atomic int down;  /* 1: taken out (failures or probes) */
  _Atomic int fails;              /* failures in the current window */
  _Atomic int passes;             /* probes passed in a row while down */
  _Atomic int probe_fails;        /* probes failed in a row while up */
  _Atomic int in_flight;          /* requests under way (least_conn) */
  _Atomic int64_t window;         /* when the failure window began (ns) */
  _Atomic int64_t down_at;        /* when it was taken out (ns) */
  _Atomic int64_t requests, failures;   /* totals, for stats */
} server_t;

typedef struct {
  _Atomic int refs;
  int n;
  int max_fails;                  /* passive: failures in a window */
  int64_t fail_window;            /* ns; also how long a server stays out
                                     when nothing probes it */
  int passes, probe_fails;        /* active: probes to bring back, take out */
  bool probed;                    /* health probes bring servers back */
  server_t s[];
} upstream_t;

void lnr_upstream_retain(void *p) {
  atomic_fetch_add(&((upstream_t *)p)->refs, 1);
}

void lnr_upstream_release(void *p) {
  upstream_t *u = p;
  if (atomic_fetch_sub(&u->refs, 1) == 1)
    free(u);
}

static upstream_t *check(lua_State *L) {
  return lnr_check_handle(L, 1, LNR_UPSTREAM);
}

/* The server index at idx (1-based in Lua), checked. */
static server_t *server_at(lua_State *L, upstream_t *u, int idx) {
  lua_Integer i = luaL_checkinteger(L, idx);
  luaL_argcheck(L, i >= 1 && i <= u->n, idx, "no such server");
  return &u->s[i - 1];
}

/* May a request go to s now? A server taken out comes back by itself
 * after the failure window when nothing probes it (nginx's
 * fail_timeout); with probes, only they bring it back. */
static bool usable(const upstream_t *u, server_t *s, int64_t now) {
  if (!atomic_load_explicit(&s->down, memory_order_relaxed))
    return true;
  return !u->probed &&
         now - atomic_load_explicit(&s->down_at, memory_order_relaxed) >=
             u->fail_window;
}

/* core.upstream_state(n, max_fails, fail_window, passes, probe_fails,
 * probed) --> handle */
static int l_new(lua_State *L) {
  lua_Integer n = luaL_checkinteger(L, 1);
  luaL_argcheck(L, n >= 1 && n <= MAX_SERVERS, 1, "1 to 64 servers");
  upstream_t *u = aligned_alloc(64, (sizeof *u + (size_t)n * sizeof(server_t)
                                     + 63) / 64 * 64);
  if (u == NULL)
    return luaL_error(L, "out of memory");
  memset(u, 0, sizeof *u + (size_t)n * sizeof(server_t));
  atomic_init(&u->refs, 1);
  u->n = (int)n;
  u->max_fails = (int)luaL_checkinteger(L, 2);
  u->fail_window = (int64_t)(luaL_checknumber(L, 3) * 1e9);
  u->passes = (int)luaL_checkinteger(L, 4);
  u->probe_fails = (int)luaL_checkinteger(L, 5);
  u->probed = lua_toboolean(L, 6);
  lnr_push_handle(L, LNR_UPSTREAM, u);
  lnr_upstream_release(u);               /* the proxy holds it now */
  return 1;
}

/* FNV-1a of a hash key: a server for it that stays put while the list
 * does. */
static uint64_t hash_key(const char *s, size_t n) {
  uint64_t h = 1469598103934665603ull;
  for (size_t i = 0; i < n; i++)
    h = (h ^ (unsigned char)s[i]) * 1099511628211ull;
  return h;
}

/* u:pick(balance, start | key, tried) --> server index, or nil when every
 * server was tried. balance: 0 round robin from start, 1 least requests
 * in flight (ties from start), 2 hash of key (the next ones when that
 * one cannot take it). A server out of use is passed over while another
 * can take the request; when none can, the first untried one gets it
 * (better a try than a certain 502: a probe path that is wrong should
 * not take the whole pool out). */
static int l_pick(lua_State *L) {
  upstream_t *u = check(L);
  int mode = (int)luaL_checkinteger(L, 2);
  uint64_t tried = (uint64_t)luaL_optinteger(L, 4, 0);
  int start;
  if (mode == 2) {
    size_t n;
    const char *k = luaL_checklstring(L, 3, &n);
    start = (int)(hash_key(k, n) % (uint64_t)u->n);
  } else {
    start = (int)((luaL_checkinteger(L, 3) - 1) % u->n);
    if (start < 0)
      start += u->n;
  }
  int64_t now = (int64_t)nr_now();
  int best = -1, fallback = -1, least = 0;
  for (int k = 0; k < u->n; k++) {
    int i = (start + k) % u->n;
    if (tried & (1ull << i))
      continue;
    if (fallback < 0)
      fallback = i;
    if (!usable(u, &u->s[i], now))
      continue;
    if (mode != 1) {
      best = i;
      break;
    }
    int f = atomic_load_explicit(&u->s[i].in_flight, memory_order_relaxed);
    if (best < 0 || f < least)
      best = i, least = f;
  }
  if (best < 0)
    best = fallback;
  if (best < 0)
    return 0;
  lua_pushinteger(L, best + 1);
  return 1;
}

/* u:begin(i): a request goes to server i. */
static int l_begin(lua_State *L) {
  server_t *s = server_at(L, check(L), 2);
  atomic_fetch_add_explicit(&s->in_flight, 1, memory_order_relaxed);
  atomic_fetch_add_explicit(&s->requests, 1, memory_order_relaxed);
  return 0;
}

/* A failure of server s: counted in its window; max_fails of them take
 * it out. Returns whether this one did. */
static bool failed(upstream_t *u, server_t *s, int64_t now) {
  atomic_fetch_add_explicit(&s->failures, 1, memory_order_relaxed);
  if (now - atomic_load_explicit(&s->window, memory_order_relaxed) >
      u->fail_window) {
    atomic_store_explicit(&s->window, now, memory_order_relaxed);
    atomic_store_explicit(&s->fails, 0, memory_order_relaxed);
  }
  if (atomic_fetch_add_explicit(&s->fails, 1, memory_order_relaxed) + 1 <
      u->max_fails)
    return false;
  atomic_store_explicit(&s->down_at, now, memory_order_relaxed);
  atomic_store_explicit(&s->passes, 0, memory_order_relaxed);
  return atomic_exchange_explicit(&s->down, 1, memory_order_relaxed) == 0;
}

/* u:done(i, outcome): the request to server i ended; outcome 0: it
 * answered, 1: it failed (counted), 2: neither (ours, say a full pool).
 * Returns true when this took the server out. An answer from a server
 * out of use brings it back only when nothing probes it (the window
 * passed and it was tried: nginx's way); with probes, they decide. */
static int l_done(lua_State *L) {
  upstream_t *u = check(L);
  server_t *s = server_at(L, u, 2);
  int outcome = (int)luaL_checkinteger(L, 3);
  atomic_fetch_sub_explicit(&s->in_flight, 1, memory_order_relaxed);
  bool out = false;
  if (outcome == 1) {
    out = failed(u, s, (int64_t)nr_now());
  } else if (outcome == 0) {
    if (atomic_load_explicit(&s->fails, memory_order_relaxed) != 0)
      atomic_store_explicit(&s->fails, 0, memory_order_relaxed);
    if (!u->probed && atomic_load_explicit(&s->down, memory_order_relaxed))
      atomic_store_explicit(&s->down, 0, memory_order_relaxed);
  }
  lua_pushboolean(L, out);
  return 1;
}

/* u:probe(i, ok) --> "down", "up" or nil: a health probe's result, and
 * the change it made. `passes` probes in a row bring a server back,
 * `fails` in a row take it out. */
static int l_probe(lua_State *L) {
  upstream_t *u = check(L);
  server_t *s = server_at(L, u, 2);
  bool ok = lua_toboolean(L, 3);
  bool down = atomic_load_explicit(&s->down, memory_order_relaxed);
  if (ok) {
    atomic_store_explicit(&s->probe_fails, 0, memory_order_relaxed);
    if (down && atomic_fetch_add_explicit(&s->passes, 1, memory_order_relaxed)
                    + 1 >= u->passes) {
      atomic_store_explicit(&s->fails, 0, memory_order_relaxed);
      atomic_store_explicit(&s->down, 0, memory_order_relaxed);
      lua_pushliteral(L, "up");
      return 1;
    }
    return 0;
  }
  atomic_store_explicit(&s->passes, 0, memory_order_relaxed);
  if (!down && atomic_fetch_add_explicit(&s->probe_fails, 1,
                                         memory_order_relaxed) + 1 >=
                   u->probe_fails) {
    atomic_store_explicit(&s->probe_fails, 0, memory_order_relaxed);
    atomic_store_explicit(&s->down_at, (int64_t)nr_now(), memory_order_relaxed);
    atomic_store_explicit(&s->down, 1, memory_order_relaxed);
    lua_pushliteral(L, "down");
    return 1;
  }
  return 0;
}

/* u:server(i) --> { up, in_flight, fails, requests, failures } */
static int l_server(lua_State *L) {
  upstream_t *u = check(L);
  server_t *s = server_at(L, u, 2);
  lua_createtable(L, 0, 5);
  lua_pushboolean(L, usable(u, s, (int64_t)nr_now()));
  lua_setfield(L, -2, "up");
  static const struct { const char *k; size_t off; } ints[] = {
      {"in_flight", offsetof(server_t, in_flight)},
      {"fails", offsetof(server_t, fails)}};
  for (size_t i = 0; i < sizeof ints / sizeof ints[0]; i++) {
    lua_pushinteger(L, atomic_load((_Atomic int *)((char *)s + ints[i].off)));
    lua_setfield(L, -2, ints[i].k);
  }
  lua_pushinteger(L, atomic_load(&s->requests));
  lua_setfield(L, -2, "requests");
  lua_pushinteger(L, atomic_load(&s->failures));
  lua_setfield(L, -2, "failures");
  return 1;
}

static int l_len(lua_State *L) {
  lua_pushinteger(L, check(L)->n);
  return 1;
}

static int l_tostring(lua_State *L) {
  lua_pushfstring(L, "netrun.upstream_state(%d servers)", check(L)->n);
  return 1;
}

static void open_upstream(lua_State *L) {
  static const luaL_Reg methods[] = {
      {"pick", l_pick},   {"begin", l_begin},   {"done", l_done},
      {"probe", l_probe}, {"server", l_server}, {NULL, NULL}};
  static const luaL_Reg meta[] = {
      {"__len", l_len}, {"__tostring", l_tostring}, {NULL, NULL}};
  lnr_new_class(L, lnr_kind_names[LNR_UPSTREAM], methods, meta);
  lnr_handle_class(L, LNR_UPSTREAM);
  lua_pushcfunction(L, l_new);
  lua_setfield(L, -2, "upstream_state");
}

lnr_module_t lnr_upstream_module = {.name = "upstream", .open = open_upstream};
