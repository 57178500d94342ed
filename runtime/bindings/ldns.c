/*
 * ldns.c -- the C half of netrun.dns (lua/netrun/dns.lua): getaddrinfo for
 * the resolver threads, the numeric-address test, and the resolver pool.
 *
 * getaddrinfo blocks, so it never runs on an event loop's thread: the Lua
 * half submits it to the resolver pool, a process-wide executor group of
 * RESOLVER_THREADS threads made on first use (a daemon: it keeps no
 * process alive). One pool serves every state; core.dns_pool() hands each
 * state its handle. Threading: `pool` is read and written under
 * `pool_lock`; the process holds one reference to it until the runtime
 * is torn down (lnr_free_dns).
 */
#include <arpa/inet.h>
#include <netdb.h>
#include <pthread.h>
#include <string.h>
#include <sys/socket.h>

#include "lnr.h"

#define RESOLVER_THREADS 2
#define MAX_ADDRESSES 32

static pthread_mutex_t pool_lock = PTHREAD_MUTEX_INITIALIZER;
static lnr_group_t *pool;

/* "inet", "inet6" or nil (any) at idx, as an address family. */
static int check_family(lua_State *L, int idx) {
  static const char *const names[] = {"any", "inet", "inet6", NULL};
  static const int families[] = {AF_UNSPEC, AF_INET, AF_INET6};
  if (lua_isnoneornil(L, idx))
    return AF_UNSPEC;
  return families[luaL_checkoption(L, idx, NULL, names)];
}

/* core.dns_numeric(s) --> "inet" | "inet6" | nil: whether s is an address
 * already (no resolution, no thread hop). */
static int l_numeric(lua_State *L) {
  const char *s = luaL_checkstring(L, 1);
  unsigned char buf[sizeof(struct in6_addr)];
  if (inet_pton(AF_INET, s, buf) == 1)
    lua_pushliteral(L, "inet");
  else if (inet_pton(AF_INET6, s, buf) == 1)
    lua_pushliteral(L, "inet6");
  else
    lua_pushnil(L);
  return 1;
}

/* Whether addr is among the first n strings of the array at t. */
static bool listed(lua_State *L, int t, int n, const char *addr) {
  for (int i = 1; i <= n; i++) {
    lua_rawgeti(L, t, i);
    bool same = strcmp(lua_tostring(L, -1), addr) == 0;
    lua_pop(L, 1);
    if (same)
      return true;
  }
  return false;
}

/* core.getaddrinfo(name [, family]) --> array of address strings, in
 * getaddrinfo's order (RFC 6724), each once | nil, message. Blocks: for
 * the resolver threads only. */
static int l_getaddrinfo(lua_State *L) {
  const char *name = luaL_checkstring(L, 1);
  struct addrinfo hints = {.ai_family = check_family(L, 2),
                           .ai_socktype = SOCK_STREAM,
                           .ai_flags = AI_ADDRCONFIG}, *res;
  int rc = getaddrinfo(name, NULL, &hints, &res);
  if (rc == EAI_BADFLAGS || (rc == EAI_NONAME && strcmp(name, "localhost") == 0)) {
    hints.ai_flags = 0;          /* no address configured: localhost still is */
    rc = getaddrinfo(name, NULL, &hints, &res);
  }
  if (rc != 0) {
    lua_pushnil(L);
    lua_pushstring(L, rc == EAI_SYSTEM ? strerror(errno) : gai_strerror(rc));
    return 2;
  }
  lua_newtable(L);
  int t = lua_gettop(L), n = 0;
  for (struct addrinfo *ai = res; ai && n < MAX_ADDRESSES; ai = ai->ai_next) {
    char text[INET6_ADDRSTRLEN];
    const void *a = ai->ai_family == AF_INET
        ? (const void *)&((struct sockaddr_in *)ai->ai_addr)->sin_addr
        : (const void *)&((struct sockaddr_in6 *)ai->ai_addr)->sin6_addr;
    if ((ai->ai_family != AF_INET && ai->ai_family != AF_INET6) ||
        inet_ntop(ai->ai_family, a, text, sizeof text) == NULL ||
        listed(L, t, n, text))
      continue;
    lua_pushstring(L, text);
    lua_rawseti(L, t, ++n);
  }
  freeaddrinfo(res);
  if (n == 0) {
    lua_pushnil(L);
    lua_pushliteral(L, "no address of the asked family");
    return 2;
  }
  return 1;
}

/* core.dns_pool() --> the resolver pool (an executor group). Made here on
 * first use with the state's own netrun.executor_group (upvalue 1); a
 * state that loses the race shuts its new group down and takes the
 * winner's. */
static int l_pool(lua_State *L) {
  pthread_mutex_lock(&pool_lock);
  lnr_group_t *g = pool;
  pthread_mutex_unlock(&pool_lock);
  if (g != NULL) {
    lnr_push_handle(L, LNR_GROUP, g);
    return 1;
  }
  lua_pushvalue(L, lua_upvalueindex(1));
  lua_createtable(L, 0, 3);
  lua_pushinteger(L, RESOLVER_THREADS);
  lua_setfield(L, -2, "threads");
  lua_pushliteral(L, "dns");
  lua_setfield(L, -2, "name");
  lua_pushboolean(L, 1);
  lua_setfield(L, -2, "daemon");
  lua_call(L, 1, 1);
  lnr_group_t *made = lnr_check_handle(L, -1, LNR_GROUP);
  pthread_mutex_lock(&pool_lock);
  if (pool == NULL) {
    pool = made;
    lnr_handle_retain(LNR_GROUP, made);        /* the process's reference */
  }
  g = pool;
  pthread_mutex_unlock(&pool_lock);
  if (g != made) {
    nr_group_shutdown_gracefully(lnr_group_core(made), 0, 0);   /* borrowed */
    lua_pop(L, 1);
    lnr_push_handle(L, LNR_GROUP, g);
  }
  return 1;
}

/* The runtime is being torn down (the main state closes, every group has
 * terminated): drop the process's reference, so the pool's threads are
 * joined and its memory freed with the last proxy. */
void lnr_free_dns(void) {
  pthread_mutex_lock(&pool_lock);
  lnr_group_t *g = pool;
  pool = NULL;
  pthread_mutex_unlock(&pool_lock);
  if (g != NULL)
    lnr_handle_release(LNR_GROUP, g);
}

/* Called with the core module table on top of the stack. */
void lnr_open_dns(lua_State *L) {
  lua_pushcfunction(L, l_getaddrinfo);
  lua_setfield(L, -2, "getaddrinfo");
  lua_pushcfunction(L, l_numeric);
  lua_setfield(L, -2, "dns_numeric");
  lua_getfield(L, -1, "executor_group");
  lua_pushcclosure(L, l_pool, 1);
  lua_setfield(L, -2, "dns_pool");
}
