/*
 * ldns.c -- the C half of netrun.dns (lua/netrun/dns.lua): the core's
 * resolver (runtime/resolver.c) as futures, the names answered without it
 * (numeric addresses, localhost), and its configuration.
 *
 * A lookup's future completes on the resolver's thread; its listeners
 * run on the state that added them, as every future's do. Its value is
 * an nr_addrs_t, which lfuture.c's result() turns into an array of
 * address strings with the answer's TTL as field `ttl` (lnr_push_addrs).
 * Any state, any thread: the resolver is the process's.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

#include "lnr.h"

/* "inet", "inet6" or nil (any) at idx, as an address family. */
static int check_family(lua_State *L, int idx) {
  static const char *const names[] = {"any", "inet", "inet6", NULL};
  static const int families[] = {AF_UNSPEC, AF_INET, AF_INET6};
  if (lua_isnoneornil(L, idx))
    return AF_UNSPEC;
  return families[luaL_checkoption(L, idx, NULL, names)];
}

static const char *check_name(lua_State *L, int idx) {
  size_t n;
  const char *name = luaL_checklstring(L, idx, &n);
  if (strlen(name) != n)
    luaL_argerror(L, idx, "a host name holds no NUL byte");
  return name;
}

void lnr_push_addrs(lua_State *L, const nr_addrs_t *a) {
  lua_createtable(L, a->n, 1);
  for (int i = 0; i < a->n; i++) {
    lua_pushstring(L, a->addr[i]);
    lua_rawseti(L, -2, i + 1);
  }
  lua_pushinteger(L, a->ttl);
  lua_setfield(L, -2, "ttl");
}

/* core.dns_local(name [, family]) --> array of addresses, for a name no
 * server is asked about (a numeric address, localhost) | nil (ask one) |
 * nil, message (a numeric address of another family). No thread hop. */
static int l_local(lua_State *L) {
  const char *name = check_name(L, 1);
  int family = check_family(L, 2);
  nr_addrs_t a;
  int rc = nr_resolve_local(name, family, &a);
  if (rc == 0) {
    lua_pushnil(L);
    return 1;
  }
  if (rc < 0) {
    lua_pushnil(L);
    lua_pushfstring(L, "%s is an %s address, not %s", name,
                    family == AF_INET ? "inet6" : "inet",
                    family == AF_INET ? "inet" : "inet6");
    return 2;
  }
  lua_createtable(L, a.n, 0);
  for (int i = 0; i < a.n; i++) {
    lua_pushstring(L, a.addr[i]);
    lua_rawseti(L, -2, i + 1);
  }
  return 1;
}

/* A lookup keeps its caller's loop (or the main thread) alive while it is
 * under way (nr_loop_ref): a script that resolves a name and ends waits
 * for the answer. The caller gets a future of its own, completed from the
 * resolver's on the resolver's thread, and the ref goes after that: by
 * then the caller's listeners are queued to it. */
typedef struct lookup_s {
  nr_promise_t *out;
  nr_loop_t *caller;
} lookup_t;

static void lookup_done(nr_promise_t *p, void *arg) {
  lookup_t *k = arg;
  nr_addrs_t *a = nr_promise_is_success(p) ? malloc(sizeof *a) : NULL;
  if (a != NULL) {
    *a = *(const nr_addrs_t *)nr_promise_value(p);
    nr_promise_set_success(k->out, a, nr_addrs_free);
  } else if (nr_promise_is_success(p)) {
    nr_promise_set_failure(k->out, -ENOMEM, "out of memory");
  } else {
    nr_promise_set_failure(k->out, nr_promise_code(p), nr_promise_message(p));
  }
  nr_loop_unref(k->caller);
  nr_promise_release(k->out);
  free(k);
}

/* core.dns_lookup(name, family, timeout) --> future of the addresses
 * (lnr_push_addrs's table), or failed with the resolver's reason. */
static int l_lookup(lua_State *L) {
  const char *name = check_name(L, 1);
  int family = check_family(L, 2);
  double timeout = lnr_checkseconds(L, 3, "netrun.dns timeout");
  nr_loop_t *caller = nr_loop_current();
  nr_promise_t *out = caller ? nr_promise_new() : NULL;
  lookup_t *k = out ? malloc(sizeof *k) : NULL;
  nr_promise_t *p = nr_resolve(name, family, lnr_ns(timeout));
  if (p == NULL || (caller != NULL && k == NULL)) {
    free(k);
    nr_promise_release(out);
    nr_promise_release(p);
    return luaL_error(L, "netrun.dns: out of memory");
  }
  if (k == NULL) {                 /* not from a loop: nothing to keep */
    lnr_push_promise(L, p);
    return 1;
  }
  k->out = nr_promise_retain(out);
  k->caller = caller;
  nr_loop_ref(caller);
  nr_promise_add_listener(p, NULL, lookup_done, k);
  nr_promise_release(p);
  lnr_push_promise(L, out);
  return 1;
}

/* servers: an array of "host[:port]" strings, one such string (a
 * comma-separated list), or false for the system's. */
static void configure_servers(const lnr_opts_t *o, int idx) {
  lua_State *L = o->L;
  luaL_Buffer b;
  char err[256];
  if (lua_type(L, idx) == LUA_TBOOLEAN && !lua_toboolean(L, idx)) {
    nr_resolver_set_servers(NULL, err, sizeof err);
    return;
  }
  if (lua_type(L, idx) == LUA_TSTRING) {
    lua_pushvalue(L, idx);
  } else if (lua_type(L, idx) == LUA_TTABLE) {
    luaL_buffinit(L, &b);
    lua_Integer n = (lua_Integer)lua_rawlen(L, idx);
    for (lua_Integer i = 1; i <= n; i++) {
      if (lua_rawgeti(L, idx, i) != LUA_TSTRING)
        lnr_opt_bad(o, lua_pushfstring(L, "servers[%I]", (LUAI_UACINT)i), -2,
                    "a string");
      if (i > 1)
        luaL_addchar(&b, ',');
      luaL_addvalue(&b);
    }
    luaL_pushresult(&b);
  } else {
    lnr_opt_bad(o, "servers", idx, "an array of \"host[:port]\" strings, a "
                "string or false");
  }
  if (nr_resolver_set_servers(lua_tostring(L, -1), err, sizeof err) < 0)
    lnr_opts_error(o, "%s", err);
  lua_pop(L, 1);
}

/* core.dns_configure { servers = ..., max_inflight = n, max_waiting = n }:
 * for the whole process, from the next lookup on; absent keys keep their
 * setting (-1 for the core). */
static int l_configure(lua_State *L) {
  static const char *const keys[] = {"servers", "max_inflight", "max_waiting", NULL};
  lnr_opts_t o;
  lnr_opts_open(&o, L, 1, "netrun.dns.configure", keys, true);
  int inflight = (int)lnr_opt_integer(&o, "max_inflight", -1, 1, 1000000);
  int waiting = (int)lnr_opt_integer(&o, "max_waiting", -1, 0, 1000000);
  if (lua_getfield(L, 1, "servers") != LUA_TNIL)
    configure_servers(&o, lua_gettop(L));
  lua_pop(L, 1);
  nr_resolver_set_limits(inflight, waiting);
  return 0;
}

/* The runtime is being torn down (the main state closes, every group has
 * terminated): lookups still in flight fail, the resolver's thread ends. */
static bool stop_resolver(lua_State *L) {
  (void)L;
  nr_resolver_shutdown();
  return true;
}

/* Called with the core module table on top of the stack. */
static void open_dns(lua_State *L) {
  static const luaL_Reg fns[] = {{"dns_local", l_local}, {"dns_lookup", l_lookup},
                                 {"dns_configure", l_configure}, {NULL, NULL}};
  luaL_setfuncs(L, fns, 0);
}

lnr_module_t lnr_dns_module = {
    .name = "dns", .open = open_dns, .teardown = stop_resolver};
