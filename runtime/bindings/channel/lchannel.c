/*
 * lchannel.c -- servers, clients and UDP in Lua (netrun.server,
 * netrun.connect, netrun.udp): their options, and the servers' init
 * registry. (Channel handles are lchannel_handle.c's; channel groups
 * lchgroup.c's.)
 *
 * An init function is packed once per server and unpacked once per loop
 * state, so one handler table can serve every channel of that loop; each
 * state keeps the one it ran last in its part (channel_part_t).
 */

/***
@module netrun
*/
#include <arpa/inet.h>
#include <limits.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "lnr.h"

/* ---- the servers' init registry ------------------------------------------ */

/* A packed init function, shared by every channel of a server. Kept for
 * the life of the process: accepted channels may still be registering on
 * other loops after the server closed.
 *
 * A server's init may be replaced at run time (server:set_init): the blob
 * is swapped atomically and the old one retired (kept until exit, since a
 * loop may be unpacking it right now). Each loop state caches the function
 * it unpacked, with the blob it came from: a swapped blob misses, and a
 * hot reload forgets the cache (forget_inits), so that no copy of an
 * old init -- nor the module tables it resolved -- serves new channels.
 *
 * A server's connection counts (for netrun.metrics) live here too: one
 * atomic add per accepted or closed connection, never per message. */
typedef struct init_s {
  _Atomic(lnr_blob_t *) b;
  bool once;          /* a client's: freed after its one use */
  bool unlisted;      /* netrun.server { metrics = false }: not in stats */
  struct init_s *next;
  lnr_blob_t *retired;            /* swapped-out blobs, under inits_lock */
  nr_channel_t *server;           /* set once bound (identity only) */
  _Atomic bool bound;             /* label and server are set */
  char label[160];                /* "host:port" or the unix path */
  _Atomic uint64_t accepted, closed;
} init_t;

static pthread_mutex_t inits_lock = PTHREAD_MUTEX_INITIALIZER;
static init_t *inits;
static const char INIT_CACHE = 0;     /* init_t -> function */
static const char INIT_BLOBS = 0;     /* init_t -> the blob it came from */

/* A state's part: the server init run last here, its function (in the
 * registry reference init_ref) the one unpacked from blob init_blob of
 * init_t init_in. NULL: none (or forgotten by a reload). */
typedef struct channel_part_s {
  int init_ref;
  const void *init_in, *init_blob;
} channel_part_t;

extern lnr_module_t lnr_channel_module;

static void push_registry_table(lua_State *L, const void *key) {
  if (lua_rawgetp(L, LUA_REGISTRYINDEX, key) != LUA_TTABLE) {
    lua_pop(L, 1);
    lua_newtable(L);
    lua_pushvalue(L, -1);
    lua_rawsetp(L, LUA_REGISTRYINDEX, key);
  }
}

/* The function on top, of init_t in from blob b, becomes P's last. */
static void remember_init(lua_State *L, channel_part_t *P, const init_t *in,
                          const lnr_blob_t *b) {
  lua_pushvalue(L, -1);
  lnr_set_ref(L, &P->init_ref);
  P->init_in = in;
  P->init_blob = b;
}

/* Push this state's function for a server's init: the cached one if it
 * came from the current blob, else a fresh unpack (which resolves the
 * modules it names in this state now). The one run last is also in a
 * slot, so a loop serving one server finds it, per connection, with two
 * compares and an array read, not two registry lookups by pointer. */
static void push_server_init(lua_State *L, init_t *in) {
  lnr_blob_t *b = atomic_load_explicit(&in->b, memory_order_acquire);
  channel_part_t *P = lnr_part(lnr_state(L), &lnr_channel_module);
  if (P->init_in == in && P->init_blob == b) {
    if (lnr_push_ref(L, &P->init_ref) != LUA_TNIL)
      return;
    lua_pop(L, 1);
  }
  push_registry_table(L, &INIT_CACHE);
  push_registry_table(L, &INIT_BLOBS);
  int cache = lua_gettop(L) - 1, blobs = cache + 1;
  if (lua_rawgetp(L, blobs, in) == LUA_TLIGHTUSERDATA &&
      lua_touserdata(L, -1) == b && lua_rawgetp(L, cache, in) != LUA_TNIL) {
    lua_replace(L, cache);
    lua_settop(L, cache);
    remember_init(L, P, in, b);
    return;
  }
  lua_settop(L, blobs);
  lnr_unpack(L, b);
  lua_pushvalue(L, -1);
  lua_rawsetp(L, cache, in);
  lua_pushlightuserdata(L, b);
  lua_rawsetp(L, blobs, in);
  lua_replace(L, cache);
  lua_settop(L, cache);
  remember_init(L, P, in, b);
}

/* A hot reload: forget this state's unpacked server inits, so that the
 * next channel unpacks its init afresh, resolving the modules anew. */
static void forget_inits(lua_State *L) {
  channel_part_t *P = lnr_part(lnr_state(L), &lnr_channel_module);
  P->init_in = P->init_blob = NULL;
  lua_pushnil(L);
  lnr_set_ref(L, &P->init_ref);
  lua_pushnil(L);
  lua_rawsetp(L, LUA_REGISTRYINDEX, &INIT_CACHE);
  lua_pushnil(L);
  lua_rawsetp(L, LUA_REGISTRYINDEX, &INIT_BLOBS);
}

static int run_init_p(lua_State *L) {
  init_t *in = lua_touserdata(L, 1);
  nr_channel_t *ch = lua_touserdata(L, 2);
  lua_settop(L, 0);
  if (in->once)
    lnr_unpack(L, atomic_load_explicit(&in->b, memory_order_relaxed));
  else
    push_server_init(L, in);
  lnr_push_new_channel(L, ch);
  lua_call(L, 1, 0);
  return 0;
}

/* A server's connection closed (nr_server_opts_t.child_closed). */
static void count_closed(nr_channel_t *ch, void *arg) {
  (void)ch;
  atomic_fetch_add_explicit(&((init_t *)arg)->closed, 1, memory_order_relaxed);
}

static void run_init(nr_channel_t *ch, void *arg) {
  init_t *in = arg;
  lnr_state_t *S = lnr_current_state();
  if (S == NULL)
    return;
  if (!in->once)
    atomic_fetch_add_explicit(&in->accepted, 1, memory_order_relaxed);
  lua_State *L = S->L;
  LNR_STACK_BEGIN(L);
  lua_pushcfunction(L, run_init_p);
  lua_pushlightuserdata(L, in);
  lua_pushlightuserdata(L, ch);
  if (lnr_pcall(L, 2, 0) != LUA_OK) {
    nr_log(NR_LOG_ERROR, "channel %d: init failed, closing it: %s",
           (int)nr_channel_id(ch), lua_tostring(L, -1));
    lua_pop(L, 1);
    nr_channel_abort(ch);
  }
  LNR_STACK_END(L, 0);
  if (in->once) {
    lnr_blob_free(atomic_load_explicit(&in->b, memory_order_relaxed));
    free(in);
  }
}

static init_t *pack_init(const lnr_opts_t *o, bool once) {
  lua_State *L = o->L;
  if (!lnr_opt_function(o, "init"))
    return NULL;
  init_t *in = calloc(1, sizeof *in);
  if (in == NULL)
    luaL_error(L, "out of memory");
  atomic_init(&in->b, lnr_pack(L, -1, 1, "function 'init'"));
  in->once = once;
  lua_pop(L, 1);
  if (!once) {
    pthread_mutex_lock(&inits_lock);
    in->next = inits;
    inits = in;
    pthread_mutex_unlock(&inits_lock);
  }
  return in;
}

/* A server's bind completed: remember its channel and address (the port
 * it really got), for set_init and the metrics' label. */
static void server_bound(nr_promise_t *p, void *arg) {
  init_t *in = arg;
  if (!nr_promise_is_success(p))
    return;
  nr_channel_t *ch = nr_promise_value(p);
  char host[128];
  int port = -1;
  if (nr_channel_local_address(ch, host, sizeof host, &port) < 0)
    snprintf(host, sizeof host, "?");
  if (port >= 0)
    snprintf(in->label, sizeof in->label, strchr(host, ':') ? "[%s]:%d" : "%s:%d",
             host, port);
  else
    snprintf(in->label, sizeof in->label, "%s", host);
  in->server = ch;
  atomic_store_explicit(&in->bound, true, memory_order_release);
}

static void watch_bound(init_t *in, nr_promise_t *p) {
  if (in != NULL)
    nr_promise_add_listener(p, NULL, server_bound, in);
}

/* The newest server init bound to ch (a channel's memory may have served
 * an older server, closed and freed since: that one is older). */
static init_t *init_of(nr_channel_t *ch) {
  init_t *found = NULL;
  pthread_mutex_lock(&inits_lock);
  for (init_t *in = inits; in && !found; in = in->next)
    if (atomic_load_explicit(&in->bound, memory_order_acquire) &&
        in->server == ch)
      found = in;
  pthread_mutex_unlock(&inits_lock);
  return found;
}

/***
@type channel
*/

/***
On a server channel: channels accepted from now on run `fn` as their init
(copied to each child loop); live connections keep theirs.
@function channel:set_init
@tparam function fn the new init, `fn(ch)`
@treturn channel itself
*/

/* server:set_init(fn): channels accepted from now on run fn (copied to
 * their loops like any init); channels already open keep their pipelines. */
static int l_set_init(lua_State *L) {
  nr_channel_t *ch = lnr_check_handle(L, 1, LNR_CHANNEL);
  luaL_checktype(L, 2, LUA_TFUNCTION);
  init_t *in = nr_channel_is_server(ch) ? init_of(ch) : NULL;
  if (in == NULL)
    return luaL_error(L, "set_init: %s is not a server made by netrun.server "
                      "with an init", luaL_tolstring(L, 1, NULL));
  lnr_blob_t *b = lnr_pack(L, 2, 1, "function 'init'");
  lnr_blob_t *old = atomic_exchange_explicit(&in->b, b, memory_order_acq_rel);
  pthread_mutex_lock(&inits_lock);
  old->user = in->retired;           /* a retired blob's link */
  in->retired = old;
  pthread_mutex_unlock(&inits_lock);
  return 0;
}

/* core.server_stats(): { { server = label, accepted = n, open = n }, ... }
 * for every server bound so far, oldest first. */
static int l_server_stats(lua_State *L) {
  lua_newtable(L);
  pthread_mutex_lock(&inits_lock);
  int n = 0;
  for (init_t *in = inits; in; in = in->next) {
    if (in->once || in->unlisted ||
        !atomic_load_explicit(&in->bound, memory_order_acquire))
      continue;
    uint64_t acc = atomic_load_explicit(&in->accepted, memory_order_relaxed);
    uint64_t closed = atomic_load_explicit(&in->closed, memory_order_relaxed);
    lua_createtable(L, 0, 3);
    lua_pushstring(L, in->label);
    lua_setfield(L, -2, "server");
    lua_pushinteger(L, (lua_Integer)acc);
    lua_setfield(L, -2, "accepted");
    lua_pushinteger(L, (lua_Integer)(closed < acc ? acc - closed : 0));
    lua_setfield(L, -2, "open");
    lua_rawseti(L, -2, ++n);
  }
  pthread_mutex_unlock(&inits_lock);
  for (int i = 1, j = n; i < j; i++, j--) {   /* the list is newest first */
    lua_rawgeti(L, -1, i);
    lua_rawgeti(L, -2, j);
    lua_rawseti(L, -3, i);
    lua_rawseti(L, -2, j);
  }
  return 1;
}

/* The process's teardown: every server's init is freed. */
static bool free_inits(lua_State *L) {
  (void)L;
  pthread_mutex_lock(&inits_lock);
  init_t *in = inits;
  inits = NULL;
  pthread_mutex_unlock(&inits_lock);
  for (init_t *n; in; in = n) {
    n = in->next;
    for (lnr_blob_t *b = in->retired, *nb; b; b = nb) {
      nb = b->user;
      lnr_blob_free(b);
    }
    lnr_blob_free(atomic_load_explicit(&in->b, memory_order_relaxed));
    free(in);
  }
  return true;
}

/* ---- options -------------------------------------------------------------- */

/* The options each constructor knows, one table each: a key not listed
 * raises (lnr_opts_open), so a new option is added here too. tls is read
 * by lua/netrun/init.lua, which puts its handler first; it is checked
 * here, with the rest. */
static const char *const server_keys[] = {
    "group", "child_group", "host", "port", "unix", "mode", "backlog",
    "reuseport", "child_options", "init", "stream", "metrics", "tls", NULL};
static const char *const connect_keys[] = {
    "group", "host", "port", "unix", "timeout", "options", "init", "tls",
    NULL};
static const char *const udp_keys[] = {
    "group", "host", "port", "options", "init", NULL};
static const char *const channel_keys[] = {
    "tcp_nodelay", "keepalive", "auto_read", "allow_half_closure",
    "write_buffer_low", "write_buffer_high", "sndbuf", "rcvbuf",
    "send_timeout", NULL};

/* Where a channel goes: a group (its next loop), or a loop given instead
 * (DESIGN.md §4: "wherever a group is taken, a loop may be given"). */
typedef struct place_s {
  lnr_group_t *group;
  nr_loop_t *loop;
} place_t;

static place_t opt_place(const lnr_opts_t *o, const char *k) {
  lua_State *L = o->L;
  place_t pl = {NULL, NULL};
  if (lua_getfield(L, o->t, k) != LUA_TNIL) {
    pl.group = lnr_to_handle(L, -1, LNR_GROUP);
    pl.loop = pl.group ? NULL : lnr_to_handle(L, -1, LNR_LOOP);
    if (pl.group == NULL && pl.loop == NULL)
      lnr_opt_bad(o, k, -1, "a netrun.group or a netrun.loop");
    if (pl.loop && lnr_group_of_loop(pl.loop) == NULL)
      lnr_opts_error(o, "%s: the main thread's loop runs no channels; give a "
                     "group or one of its loops", k);
  }
  lua_pop(L, 1);
  return pl;
}

/* The channel options in field k of o. send_timeout: 60 s for a server's
 * children (nginx's send_timeout), none for a channel that connects (its
 * peer is its own choice). */
static void channel_opts(const lnr_opts_t *o, const char *k,
                         nr_channel_opts_t *c, uint64_t send_timeout) {
  lnr_opts_t s;
  lnr_opts_sub(&s, o, k, channel_keys);
  nr_channel_opts_init(c);
  c->tcp_nodelay = lnr_opt_boolean(&s, "tcp_nodelay", true);
  c->keepalive = lnr_opt_boolean(&s, "keepalive", false);
  c->auto_read = lnr_opt_boolean(&s, "auto_read", true);
  c->allow_half_closure = lnr_opt_boolean(&s, "allow_half_closure", false);
  c->write_buffer_low = lnr_opt_size(&s, "write_buffer_low", 32768, 0,
                                     LNR_OPT_SIZE_MAX);
  c->write_buffer_high = lnr_opt_size(&s, "write_buffer_high", 65536, 0,
                                      LNR_OPT_SIZE_MAX);
  c->sndbuf = (int)lnr_opt_size(&s, "sndbuf", 0, 0, INT_MAX);
  c->rcvbuf = (int)lnr_opt_size(&s, "rcvbuf", 0, 0, INT_MAX);
  c->send_timeout = lnr_opt_seconds(&s, "send_timeout", send_timeout);
  if (c->write_buffer_low > c->write_buffer_high)
    lnr_opts_error(&s, "%swrite_buffer_low (%I) is above %swrite_buffer_high "
                   "(%I)", s.prefix, (lua_Integer)c->write_buffer_low, s.prefix,
                   (lua_Integer)c->write_buffer_high);
  lua_pop(o->L, 1);                  /* the sub-table */
}

/* port: required (0: any free port). */
static int check_port(const lnr_opts_t *o) {
  lua_getfield(o->L, o->t, "port");
  int port = (int)lnr_optv_integer(o, "port", -1, 0, 65535);
  lua_pop(o->L, 1);
  return port;
}

/* A unix socket's file mode (0: the umask's). */
static int check_mode(const lnr_opts_t *o) {
  static const char expect[] =
      "a file mode from 0 to 0777 (e.g. tonumber(\"600\", 8))";
  lua_State *L = o->L;
  lua_Integer mode = 0;
  if (lua_getfield(L, o->t, "mode") != LUA_TNIL) {
    int ok = 0;
    mode = lua_tointegerx(L, -1, &ok);
    if (!ok || mode < 0 || mode > 0777)
      lnr_opt_bad(o, "mode", -1, expect);
  }
  lua_pop(L, 1);
  return (int)mode;
}

/* tls: a netrun.tls config of the right side (lua/netrun/init.lua adds
 * its handler). */
static void check_tls(const lnr_opts_t *o, bool server) {
  if (lua_getfield(o->L, o->t, "tls") != LUA_TNIL)
    lnr_optv_tls(o, "tls", -1, server);
  lua_pop(o->L, 1);
}

/* ---- creating channels ---------------------------------------------------- */

/* require(mod)[fn](the options at 1): its result replaces nothing, it is
 * pushed. The Lua side of an option (streams, host names) lives in Lua. */
static void call_lua_side(lua_State *L, const char *mod, const char *fn) {
  lua_getglobal(L, "require");
  lua_pushstring(L, mod);
  lua_call(L, 1, 1);
  lua_getfield(L, -1, fn);
  lua_pushvalue(L, 1);
  lua_call(L, 1, 1);
  lua_remove(L, -2);             /* the module */
}

/* netrun.server { stream = fn }: lua/netrun/stream.lua turns the options
 * into plain ones whose init adds the stream handler (fn runs in a
 * coroutine per connection); they replace the table at 1. */
static void stream_options(lua_State *L) {
  if (lua_getfield(L, 1, "stream") == LUA_TNIL) {
    lua_pop(L, 1);
    return;
  }
  lua_pop(L, 1);
  call_lua_side(L, "netrun.stream", "server_options");
  lua_replace(L, 1);
}

static bool is_address(const char *host) {
  unsigned char buf[sizeof(struct in6_addr)];
  return inet_pton(AF_INET, host, buf) == 1 || inet_pton(AF_INET6, host, buf) == 1;
}

/* Whether binding host needs a lookup: not for an address, nor for
 * localhost (the core binds 127.0.0.1 for it, as on the main thread). */
static bool needs_lookup(const char *host) {
  nr_addrs_t a;
  return nr_resolve_local(host, AF_UNSPEC, &a) == 0;
}

/* Whether the caller runs on a loop (or executor) thread, where a
 * getaddrinfo would hold up every channel of the loop; the main thread
 * may block. */
static bool on_loop(void) {
  nr_loop_t *cur = nr_loop_current();
  return cur != NULL && cur != lnr_main_loop();
}

/* netrun.server or netrun.udp with a host name, called on a loop: the name
 * is resolved off the loop (lua/netrun/dns.lua, listen), which then calls
 * here again with its first address. The options at 1 are checked. */
static int listen_by_name(lua_State *L, const char *kind) {
  lua_getglobal(L, "require");
  lua_pushliteral(L, "netrun.dns");
  lua_call(L, 1, 1);
  lua_getfield(L, -1, "listen");
  lua_pushvalue(L, 1);
  lua_pushstring(L, kind);
  lua_call(L, 2, 1);
  return 1;
}

static int l_server(lua_State *L) {
  lnr_opts_t t;
  lnr_opts_open(&t, L, 1, "netrun.server", server_keys, true);
  check_tls(&t, true);
  stream_options(L);
  nr_server_opts_t o = {0};
  place_t g = opt_place(&t, "group");
  place_t cg = opt_place(&t, "child_group");
  o.reuseport = lnr_opt_boolean(&t, "reuseport", false);
  bool listed = lnr_opt_boolean(&t, "metrics", true);
  if (!g.group && !g.loop && !cg.group && !cg.loop) {
    /* reuseport: each worker accepts for itself; no boss group needed */
    g.group = o.reuseport ? NULL : lnr_default_group(L, true);
    cg.group = lnr_default_group(L, false);
  }
  if (!g.group && !g.loop)
    g = cg;                      /* child_group alone serves both roles */
  if (!cg.group && !cg.loop)
    cg = g;
  o.group = g.group ? lnr_group_core(g.group) : NULL;
  o.loop = g.loop;
  o.child_group = cg.group ? lnr_group_core(cg.group) : NULL;
  o.child_loop = cg.loop;
  o.unix_path = lnr_opt_string(&t, "unix", NULL, NULL);
  o.host = lnr_opt_string(&t, "host", "0.0.0.0", NULL);
  o.port = o.unix_path ? 0 : check_port(&t);
  o.unix_mode = check_mode(&t);
  o.backlog = (int)lnr_opt_integer(&t, "backlog", 1024, 1, INT_MAX);
  channel_opts(&t, "child_options", &o.child, NR_SEC(60));
  if (o.unix_path == NULL && needs_lookup(o.host) && on_loop())
    return listen_by_name(L, "server");
  init_t *in = pack_init(&t, false);
  if (in != NULL)
    in->unlisted = !listed;
  o.child_init = in ? run_init : NULL;
  o.child_closed = in ? count_closed : NULL;
  o.arg = in;
  nr_promise_t *p = nr_server_bind(&o);
  watch_bound(in, p);
  lnr_push_promise(L, p);
  return 1;
}

/* A host name is resolved off the loop (lua/netrun/dns.lua), which then
 * connects here again with its addresses: a lookup on the calling thread
 * would block a loop. The options at 1 are checked already. */
static int connect_by_name(lua_State *L) {
  call_lua_side(L, "netrun.dns", "connect");
  return 1;
}

/* host = { "::1", "127.0.0.1", ... }: numeric addresses, tried in turn
 * (the core's RFC 8305 connect). The strings stay anchored in the options
 * table at 1; *n of them (at most NR_MAX_ADDRS) go into v. */
static void opt_hosts(const lnr_opts_t *t, const char **v, int *n) {
  lua_State *L = t->L;
  lua_getfield(L, t->t, "host");
  lua_Integer len = (lua_Integer)lua_rawlen(L, -1);
  if (len < 1)
    lnr_opt_bad(t, "host", -1, "a string or a non-empty array of addresses");
  *n = len > NR_MAX_ADDRS ? NR_MAX_ADDRS : (int)len;
  for (int i = 0; i < *n; i++) {
    lua_rawgeti(L, -1, i + 1);
    v[i] = lua_tostring(L, -1);
    if (lua_type(L, -1) != LUA_TSTRING || !is_address(v[i])) {
      char k[32];
      snprintf(k, sizeof k, "host[%d]", i + 1);
      lnr_opt_bad(t, k, -1, "a numeric address");
    }
    lua_pop(L, 1);
  }
  lua_pop(L, 1);
}

static int l_connect(lua_State *L) {
  lnr_opts_t t;
  lnr_opts_open(&t, L, 1, "netrun.connect", connect_keys, true);
  check_tls(&t, false);
  nr_connect_opts_t o = {0};
  place_t g = opt_place(&t, "group");
  if (g.group == NULL && g.loop == NULL)
    g.group = lnr_default_group(L, false);
  o.group = g.group ? lnr_group_core(g.group) : NULL;
  o.loop = g.loop;
  o.unix_path = lnr_opt_string(&t, "unix", NULL, NULL);
  const char *hosts[NR_MAX_ADDRS];
  bool many = lua_getfield(L, 1, "host") == LUA_TTABLE;
  lua_pop(L, 1);
  if (many)
    opt_hosts(&t, hosts, &o.nhosts);
  o.hosts = many ? hosts : NULL;
  o.host = many ? NULL : lnr_opt_string(&t, "host", "127.0.0.1", NULL);
  o.port = o.unix_path ? 0 : check_port(&t);
  o.timeout = lnr_opt_seconds(&t, "timeout", NR_SEC(30));
  channel_opts(&t, "options", &o.opts, 0);
  if (o.unix_path == NULL && !many && !is_address(o.host))
    return connect_by_name(L);
  init_t *in = pack_init(&t, true);
  o.init = in ? run_init : NULL;
  o.arg = in;
  lnr_push_promise(L, nr_connect(&o));
  return 1;
}

/*** @section end */

/***
Open a UDP channel. Its messages are datagrams,
`{ data = "...", host = "1.2.3.4", port = 1234 }`, read and written.
@function udp
@tparam table opts the options; an unknown key raises
@tparam[opt] group opts.group where it lives (a loop may be given)
@string[opt="0.0.0.0"] opts.host the address to bind
@int[opt=0] opts.port the port to bind (0: an ephemeral one)
@tparam[opt] table opts.options channel options (`sndbuf`, `rcvbuf`, ...)
@tparam[opt] function opts.init `init(ch)`, run on its loop
@treturn future of the channel
*/

static int l_udp(lua_State *L) {
  lnr_opts_t t;
  lnr_opts_open(&t, L, 1, "netrun.udp", udp_keys, true);
  nr_udp_opts_t o = {0};
  place_t g = opt_place(&t, "group");
  if (g.group == NULL && g.loop == NULL)
    g.group = lnr_default_group(L, false);
  o.group = g.group ? lnr_group_core(g.group) : NULL;
  o.loop = g.loop;
  o.host = lnr_opt_string(&t, "host", "0.0.0.0", NULL);
  o.port = check_port(&t);
  channel_opts(&t, "options", &o.opts, 0);
  if (needs_lookup(o.host) && on_loop())
    return listen_by_name(L, "udp");
  init_t *in = pack_init(&t, true);
  o.init = in ? run_init : NULL;
  o.arg = in;
  lnr_push_promise(L, nr_udp_bind(&o));
  return 1;
}

static void open_channel(lua_State *L) {
  static const luaL_Reg funcs[] = {{"server", l_server},
                                   {"connect", l_connect},
                                   {"udp", l_udp},
                                   {"server_stats", l_server_stats},
                                   {NULL, NULL}};
  luaL_setfuncs(L, funcs, 0);
  /* server:set_init(fn), a method of every channel handle */
  luaL_getmetatable(L, lnr_kind_names[LNR_CHANNEL]);
  lua_getfield(L, -1, "__index");
  lua_pushcfunction(L, l_set_init);
  lua_setfield(L, -2, "set_init");
  lua_pop(L, 2);
}

lnr_module_t lnr_channel_module = {
    .name = "channel", .open = open_channel,
    .part_size = sizeof(channel_part_t), .reload = forget_inits,
    .teardown = free_inits};
