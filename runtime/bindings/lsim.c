/*
 * lsim.c -- the C half of require "netrun.sim" (lua/netrun/sim.lua holds
 * the policy): a world entered from the main thread and left again, with
 * its hosts, its network settings and its clock, trace and generator.
 *
 *   core.sim_begin { seed = n, latency = s, epoch = t, sndbuf = n,
 *                    rcvbuf = n } --> world
 *       The calling (main) thread enters a new world: from now on the
 *       groups it makes are simulated, and its waits (sync, await,
 *       netrun.run) run the world's scheduler. The main state's loop is
 *       the world's main loop meanwhile (lnr_swap_main_loop).
 *   core.sim_end(world)      leave it: the main loop is the real one again
 *   core.sim_current()       the world entered, or nil
 *   core.sim_id()            its number (0: none), to key per-world caches
 *   core.sim_owns(group)     whether the group is simulated
 *   core.sim_state           true in a state made inside a world (its loop
 *                            is simulated): init.lua patches its clocks
 *   world:host(name) --> host;  world:set_host(host) --> previous host
 *   world:latency(a, b, s); world:loss(p); world:duplicate(p);
 *   world:reorder(p); world:partition(a, b); world:heal();
 *   world:reset(a, b) --> n;  world:now(); world:wall(); world:seed();
 *   world:random() --> integer; world:trace_hash() --> "16 hex digits";
 *   world:stats() --> { steps, events, connections, bytes, datagrams,
 *                       resets }
 *   host:name(); host:address()
 *
 * A host is a userdata holding its world (uservalue) so that the world
 * lives while a host is held; hosts compare by identity (one userdata
 * per host, kept in the world's uservalue table).
 *
 * Threads: the main thread only (a world is entered by one thread).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "lmain.h"
#include "lnr.h"
#include "lopts.h"

#define WORLD_MT "netrun.sim.world"
#define HOST_MT "netrun.sim.host"

typedef struct world_ud_s {
  nr_sim_t *w;
  nr_loop_t *main;            /* the world's main loop while entered */
  nr_loop_t *outer;           /* the main state's loop before */
} world_ud_t;

static const char CURRENT = 0;   /* registry: the world userdata entered */

static world_ud_t *check_world(lua_State *L, int idx) {
  world_ud_t *u = luaL_checkudata(L, idx, WORLD_MT);
  if (u->w == NULL)
    luaL_error(L, "netrun.sim: the world has ended");
  return u;
}

static nr_sim_host_t *check_host(lua_State *L, int idx) {
  nr_sim_host_t **h = luaL_checkudata(L, idx, HOST_MT);
  return *h;
}

static nr_sim_host_t *opt_host(lua_State *L, int idx) {
  return lua_isnoneornil(L, idx) ? NULL : check_host(L, idx);
}

/* ---- entering and leaving ---------------------------------------------------------- */

static uint64_t opt_ns(lua_State *L, int t, const char *k) {
  lua_getfield(L, t, k);
  uint64_t ns = lua_isnil(L, -1) ? 0 : lnr_ns(lnr_checkseconds(L, -1, k));
  lua_pop(L, 1);
  return ns;
}

static lua_Integer opt_int(lua_State *L, int t, const char *k) {
  lua_getfield(L, t, k);
  lua_Integer v = lua_isnil(L, -1) ? 0 : luaL_checkinteger(L, -1);
  lua_pop(L, 1);
  return v;
}

static int l_begin(lua_State *L) {
  static const char *const known[] = {"seed", "latency", "epoch", "sndbuf",
                                      "rcvbuf", NULL};
  lnr_opts_t t;                              /* (checks the keys) */
  lnr_opts_open(&t, L, 1, "netrun.sim.run", known, true);
  if (nr_sim_current() != NULL)
    return luaL_error(L, "netrun.sim.run: already inside a simulation");
  if (lnr_main_loop() == NULL || nr_loop_current() != lnr_main_loop())
    return luaL_error(L, "netrun.sim.run: only the main thread (a script) "
                      "runs a simulation, not a loop");
  nr_sim_opts_t o = {0};
  o.seed = (uint64_t)opt_int(L, 1, "seed");
  o.latency = opt_ns(L, 1, "latency");
  o.epoch = opt_int(L, 1, "epoch");
  o.sndbuf = (size_t)opt_int(L, 1, "sndbuf");
  o.rcvbuf = (size_t)opt_int(L, 1, "rcvbuf");
  world_ud_t *u = lua_newuserdatauv(L, sizeof *u, 1);
  memset(u, 0, sizeof *u);
  luaL_setmetatable(L, WORLD_MT);
  lua_newtable(L);                           /* hosts by name */
  lua_setiuservalue(L, -2, 1);
  u->w = nr_sim_new(&o);
  if (u->w == NULL)
    return luaL_error(L, "netrun.sim.run: out of memory");
  int rc = nr_sim_enter(u->w);
  if (rc < 0) {
    nr_sim_release(u->w);
    u->w = NULL;
    return luaL_error(L, "netrun.sim.run: %s", rc == -EBUSY
                      ? "another thread runs a simulation" : nr_strerror(rc));
  }
  u->main = nr_loop_new(&(nr_loop_opts_t){.name = "main", .external = true});
  if (u->main == NULL) {
    nr_sim_leave(u->w);
    nr_sim_release(u->w);
    u->w = NULL;
    return luaL_error(L, "netrun.sim.run: cannot make the main loop");
  }
  u->outer = lnr_swap_main_loop(u->main);
  lua_pushvalue(L, -1);
  lua_rawsetp(L, LUA_REGISTRYINDEX, &CURRENT);
  return 1;
}

/* Leave the world (its groups have terminated: sim.lua waits for them).
 * Whatever the main loop still holds runs as it is freed. */
static int l_end(lua_State *L) {
  world_ud_t *u = check_world(L, 1);
  if (u->main == NULL)
    return 0;
  nr_loop_t *m = u->main;
  u->main = NULL;
  lnr_swap_main_loop(u->outer);
  nr_loop_free(m);
  nr_sim_leave(u->w);
  lua_pushnil(L);
  lua_rawsetp(L, LUA_REGISTRYINDEX, &CURRENT);
  return 0;
}

static int world_gc(lua_State *L) {
  world_ud_t *u = luaL_checkudata(L, 1, WORLD_MT);
  if (u->main != NULL)                        /* (sim.lua always ends it) */
    l_end(L);
  nr_sim_release(u->w);
  u->w = NULL;
  return 0;
}

static int l_current(lua_State *L) {
  if (nr_sim_current() == NULL)
    lua_pushnil(L);
  else
    lua_rawgetp(L, LUA_REGISTRYINDEX, &CURRENT);
  return 1;
}

static int l_id(lua_State *L) {
  char ns[128];
  if (nr_sim_namespace(ns, sizeof ns) == 0)
    lua_pushinteger(L, 0);
  else
    lua_pushinteger(L, (lua_Integer)strtoull(ns + 3, NULL, 10));
  return 1;
}

static int l_owns(lua_State *L) {
  int kind = lnr_handle_kind(L, 1);
  nr_loop_t *l = NULL;
  if (kind == LNR_GROUP)
    l = nr_group_loop(lnr_group_core(lnr_check_handle(L, 1, LNR_GROUP)), 0);
  else if (kind == LNR_LOOP)
    l = lnr_check_handle(L, 1, LNR_LOOP);
  else
    return luaL_argerror(L, 1, "a group or a loop");
  lua_pushboolean(L, nr_loop_is_simulated(l));
  return 1;
}

/* ---- hosts ------------------------------------------------------------------------------ */

/* The one userdata of host h (world at w_idx). */
static void push_host(lua_State *L, int w_idx, nr_sim_host_t *h) {
  w_idx = lua_absindex(L, w_idx);
  lua_getiuservalue(L, w_idx, 1);
  if (lua_getfield(L, -1, nr_sim_host_name(h)) == LUA_TNIL) {
    lua_pop(L, 1);
    nr_sim_host_t **p = lua_newuserdatauv(L, sizeof *p, 1);
    *p = h;
    luaL_setmetatable(L, HOST_MT);
    lua_pushvalue(L, w_idx);
    lua_setiuservalue(L, -2, 1);               /* the host keeps its world */
    lua_pushvalue(L, -1);
    lua_setfield(L, -3, nr_sim_host_name(h));
  }
  lua_remove(L, -2);
}

static int w_host(lua_State *L) {
  world_ud_t *u = check_world(L, 1);
  size_t n;
  const char *name = luaL_checklstring(L, 2, &n);
  if (n == 0 || n > 63 || strpbrk(name, " \t\r\n:/[]") != NULL)
    return luaL_error(L, "world:host: a host name is a word of at most 63 "
                      "bytes (no spaces, ':' or '/'), got '%s'", name);
  if (nr_sim_current() != u->w)
    return luaL_error(L, "world:host: the world has ended");
  nr_sim_host_t *h = nr_sim_host(u->w, name);
  if (h == NULL)
    return luaL_error(L, "world:host: out of memory");
  push_host(L, 1, h);
  return 1;
}

static int w_set_host(lua_State *L) {
  world_ud_t *u = check_world(L, 1);
  nr_sim_host_t *old = nr_sim_set_host(u->w, opt_host(L, 2));
  push_host(L, 1, old);
  return 1;
}

static int h_name(lua_State *L) {
  lua_pushstring(L, nr_sim_host_name(check_host(L, 1)));
  return 1;
}

static int h_address(lua_State *L) {
  lua_pushstring(L, nr_sim_host_addr(check_host(L, 1)));
  return 1;
}

static int h_tostring(lua_State *L) {
  nr_sim_host_t *h = check_host(L, 1);
  lua_pushfstring(L, "netrun.sim.host(%s %s)", nr_sim_host_name(h),
                  nr_sim_host_addr(h));
  return 1;
}

/* ---- the network -------------------------------------------------------------------------- */

static double check_prob(lua_State *L, int idx, const char *what) {
  double p = luaL_checknumber(L, idx);
  if (!(p >= 0 && p <= 1))
    luaL_error(L, "world:%s: a probability from 0 to 1, got %f", what, p);
  return p;
}

static int w_latency(lua_State *L) {
  world_ud_t *u = check_world(L, 1);
  nr_sim_host_t *a = check_host(L, 2), *b = check_host(L, 3);
  nr_sim_latency(u->w, a, b, lnr_ns(lnr_checkseconds(L, 4, "world:latency")));
  return 0;
}

static int w_loss(lua_State *L) {
  nr_sim_loss(check_world(L, 1)->w, check_prob(L, 2, "loss"));
  return 0;
}

static int w_duplicate(lua_State *L) {
  nr_sim_duplicate(check_world(L, 1)->w, check_prob(L, 2, "duplicate"));
  return 0;
}

static int w_reorder(lua_State *L) {
  nr_sim_reorder(check_world(L, 1)->w, check_prob(L, 2, "reorder"));
  return 0;
}

static int w_partition(lua_State *L) {
  nr_sim_partition(check_world(L, 1)->w, opt_host(L, 2), opt_host(L, 3));
  return 0;
}

static int w_heal(lua_State *L) {
  nr_sim_heal(check_world(L, 1)->w);
  return 0;
}

static int w_reset(lua_State *L) {
  lua_pushinteger(L, nr_sim_reset(check_world(L, 1)->w, opt_host(L, 2),
                                  opt_host(L, 3)));
  return 1;
}

/* ---- the clock, the generator, the trace -------------------------------------------------- */

static int w_now(lua_State *L) {
  lua_pushnumber(L, (double)nr_sim_now(check_world(L, 1)->w) / 1e9);
  return 1;
}

static int w_wall(lua_State *L) {
  check_world(L, 1);
  lua_pushnumber(L, (double)nr_wall_ns() / 1e9);
  return 1;
}

/* world:limit(seconds from now | nil): the clock stops short of it. */
static int w_limit(lua_State *L) {
  world_ud_t *u = check_world(L, 1);
  nr_sim_limit(u->w, lua_isnoneornil(L, 2) ? 0
               : nr_sim_now(u->w) + lnr_ns(lnr_checkseconds(L, 2, "world:limit")));
  return 0;
}

static int w_seed(lua_State *L) {
  lua_pushinteger(L, (lua_Integer)nr_sim_seed(check_world(L, 1)->w));
  return 1;
}

static int w_random(lua_State *L) {
  lua_pushinteger(L, (lua_Integer)nr_sim_random(check_world(L, 1)->w));
  return 1;
}

static int w_trace_hash(lua_State *L) {
  char hex[17];
  snprintf(hex, sizeof hex, "%016llx",
           (unsigned long long)nr_sim_trace_hash(check_world(L, 1)->w));
  lua_pushstring(L, hex);
  return 1;
}

static int w_stats(lua_State *L) {
  nr_sim_stats_t st;
  nr_sim_stats(check_world(L, 1)->w, &st);
  lua_createtable(L, 0, 6);
  const struct { const char *k; uint64_t v; } f[] = {
      {"steps", st.steps}, {"events", st.events},
      {"connections", st.connections}, {"bytes", st.bytes},
      {"datagrams", st.datagrams}, {"resets", st.resets}};
  for (size_t i = 0; i < sizeof f / sizeof f[0]; i++) {
    lua_pushinteger(L, (lua_Integer)f[i].v);
    lua_setfield(L, -2, f[i].k);
  }
  return 1;
}

/* core.sim_wall(): the wall clock in seconds (a float; virtual in a
 * world); core.sim_random(): an integer from the world's generator. */
static int l_wall(lua_State *L) {
  lua_pushnumber(L, (double)nr_wall_ns() / 1e9);
  return 1;
}

static int l_random(lua_State *L) {
  lua_Integer v;
  nr_random_bytes(&v, sizeof v);
  lua_pushinteger(L, v);
  return 1;
}

static void open_sim(lua_State *L) {
  static const luaL_Reg world_methods[] = {
      {"host", w_host}, {"set_host", w_set_host}, {"latency", w_latency},
      {"loss", w_loss}, {"duplicate", w_duplicate}, {"reorder", w_reorder},
      {"partition", w_partition}, {"heal", w_heal}, {"reset", w_reset},
      {"now", w_now}, {"wall", w_wall}, {"seed", w_seed}, {"limit", w_limit},
      {"random", w_random}, {"trace_hash", w_trace_hash}, {"stats", w_stats},
      {NULL, NULL}};
  static const luaL_Reg world_meta[] = {{"__gc", world_gc}, {NULL, NULL}};
  static const luaL_Reg host_methods[] = {
      {"name", h_name}, {"address", h_address}, {NULL, NULL}};
  static const luaL_Reg host_meta[] = {{"__tostring", h_tostring},
                                       {NULL, NULL}};
  lnr_new_class(L, WORLD_MT, world_methods, world_meta);
  lnr_new_class(L, HOST_MT, host_methods, host_meta);
  static const luaL_Reg funcs[] = {
      {"sim_begin", l_begin}, {"sim_end", l_end}, {"sim_current", l_current},
      {"sim_id", l_id}, {"sim_owns", l_owns}, {"sim_wall", l_wall},
      {"sim_random", l_random}, {NULL, NULL}};
  luaL_setfuncs(L, funcs, 0);
  lua_pushboolean(L, nr_clock_is_virtual());
  lua_setfield(L, -2, "sim_state");
}

lnr_module_t lnr_sim_module = {.name = "sim", .open = open_sim};
