/*
 * ltls.c -- TLS in Lua (DESIGN.md §8.1):
 *   netrun.tls.server { cert = path | cert_pem = text, key = ..., alpn = {...},
 *                       sni = { [name] = { cert = ..., key = ... } }, ca = ...,
 *                       verify = "none" | "optional" | "required",
 *                       session_tickets = true, min_version = "TLSv1.2",
 *                       ciphersuites = "...", ciphers = "...", groups = "..." }
 *   netrun.tls.client { server_name = ..., ca = path | nil (system store),
 *                       verify = true, alpn = {...}, cert = ..., key = ... }
 *   netrun.tls.reload(config [, options])   -- new handshakes, new contexts
 *   netrun.tls.handshake(ch [, name])       -- future of the handshake
 *   core.tls.identity(config)               -- what it was built from
 * and the converter of the handshake event.
 *
 * A config is a handle (LNR_TLS): a reference-counted C object whose
 * SSL_CTX is built once, when the config is made, and shared by every
 * loop; it crosses states by reference like a channel, so the copy a loop
 * receives (an upvalue of `init`) is the same config, and a reload seen
 * from any state affects all. Its class has __netrun_native, so
 * `pipeline:add_first("tls", config)` makes a handler state of it.
 */

/***
@module netrun
*/
#include <pthread.h>
#include <string.h>

#include <openssl/ssl.h>

#include "lnr.h"
#include "tls/tls.h"

#define TLS_MT "netrun.tls"

void lnr_tls_retain(void *cfg) { nr_tls_config_retain(cfg); }
void lnr_tls_release(void *cfg) { nr_tls_config_release(cfg); }

/* ---- options ------------------------------------------------------------- */

static void opt_cert(const lnr_opts_t *t, nr_tls_cert_t *c) {
  c->cert = lnr_opt_string(t, "cert", NULL, NULL);
  c->cert_pem = lnr_opt_string(t, "cert_pem", NULL, NULL);
  c->key = lnr_opt_string(t, "key", NULL, NULL);
  c->key_pem = lnr_opt_string(t, "key_pem", NULL, NULL);
  if (c->cert && c->cert_pem)
    lnr_opts_error(t, "%scert and %scert_pem are exclusive", t->prefix,
                   t->prefix);
  if (c->key && c->key_pem)
    lnr_opts_error(t, "%skey and %skey_pem are exclusive", t->prefix,
                   t->prefix);
  if ((c->cert || c->cert_pem) && !(c->key || c->key_pem))
    lnr_opts_error(t, "%scert needs its key (%skey or %skey_pem)", t->prefix,
                   t->prefix, t->prefix);
}

/* alpn = { "h2", "http/1.1" }: an array in a userdata the stack keeps. */
static void opt_alpn(const lnr_opts_t *t, nr_tls_opts_t *o) {
  lua_State *L = t->L;
  int n = lnr_opt_strings(t, "alpn", 32);
  if (n == 0)
    return;
  const char **v = lua_newuserdatauv(L, sizeof *v * (size_t)(n + 1), 0);
  for (int i = 0; i < n; i++) {
    lua_rawgeti(L, -2, i + 1);
    v[i] = lua_tostring(L, -1);
    lua_pop(L, 1);                    /* anchored by the alpn table */
  }
  lua_insert(L, -2);                  /* userdata below the table: both kept */
  o->alpn = v;
  o->nalpn = n;
}

/* sni = { ["b.example"] = { cert = ..., key = ... } } */
static void opt_sni(const lnr_opts_t *t, nr_tls_opts_t *o) {
  static const char *const keys[] = {"cert", "cert_pem", "key", "key_pem",
                                     NULL};
  static const char expect[] = "a table of name = { cert = ..., key = ... }";
  lua_State *L = t->L;
  if (lua_getfield(L, t->t, "sni") == LUA_TNIL) {
    lua_pop(L, 1);
    return;
  }
  int s = lua_gettop(L);
  if (!lua_istable(L, s))
    lnr_opt_bad(t, "sni", s, expect);
  int n = 0;
  for (lua_pushnil(L); lua_next(L, s); lua_pop(L, 1))
    n++;
  nr_tls_cert_t *v = lua_newuserdatauv(L, sizeof *v * (size_t)(n + 1), 0);
  memset(v, 0, sizeof *v * (size_t)(n + 1));
  int i = 0;
  for (lua_pushnil(L); lua_next(L, s); lua_pop(L, 1), i++) {
    if (lua_type(L, -2) != LUA_TSTRING || !lua_istable(L, -1))
      lnr_opt_bad(t, "sni", s, expect);   /* (a name, a table) */
    char k[48];
    snprintf(k, sizeof k, "sni[\"%.30s\"]", lua_tostring(L, -2));
    lnr_opts_t one;
    lnr_opts_at(&one, t, -1, k, keys);
    opt_cert(&one, &v[i]);
    if (!v[i].cert && !v[i].cert_pem)
      lnr_opts_error(t, "%s needs cert or cert_pem", k);
    v[i].name = lua_tostring(L, -2);
  }
  o->sni = v;
  o->nsni = n;
}

void *lnr_optv_tls(const lnr_opts_t *o, const char *k, int idx, bool server) {
  nr_tls_config_t *c = lnr_to_handle(o->L, idx, LNR_TLS);
  if (c == NULL || nr_tls_config_is_server(c) != server)
    lnr_opt_bad(o, k, idx, server ? "a netrun.tls.server config"
                                  : "a netrun.tls.client config");
  return c;
}

/* Read the options table at t into o (strings borrowed from the stack). */
static void read_opts(lua_State *L, int t, const char *what, bool server,
                      nr_tls_opts_t *o) {
  static const char *const skeys[] = {
      "cert", "cert_pem", "key", "key_pem", "alpn", "sni", "ca", "verify",
      "session_tickets", "min_version", "handshake_timeout", "ciphersuites",
      "ciphers", "groups", NULL};
  static const char *const ckeys[] = {
      "server_name", "ca", "verify", "alpn", "cert", "cert_pem", "key",
      "key_pem", "min_version", "handshake_timeout", "ciphersuites",
      "ciphers", "groups", NULL};
  static const char *const versions[] = {"TLSv1.2", "TLSv1.3", NULL};
  lnr_opts_t r;
  lnr_opts_open(&r, L, t, what, server ? skeys : ckeys, true);
  memset(o, 0, sizeof *o);
  o->server = server;
  opt_cert(&r, &o->cert);
  if (server && !o->cert.cert && !o->cert.cert_pem)
    lnr_opts_error(&r, "cert (or cert_pem) is required");
  o->ca = lnr_opt_string(&r, "ca", NULL, NULL);
  o->ciphersuites = lnr_opt_string(&r, "ciphersuites", NULL, NULL);
  o->ciphers = lnr_opt_string(&r, "ciphers", NULL, NULL);
  o->groups = lnr_opt_string(&r, "groups", NULL, NULL);
  o->min_version = lnr_opt_enum(&r, "min_version", 0, versions) == 0
                       ? TLS1_2_VERSION : TLS1_3_VERSION;
  opt_alpn(&r, o);
  o->handshake_timeout = lnr_opt_seconds(&r, "handshake_timeout", NR_SEC(10));
  if (server) {
    static const char *const modes[] = {"none", "optional", "required", NULL};
    o->verify = lnr_opt_enum(&r, "verify", NR_TLS_VERIFY_NONE, modes);
    if (o->verify != NR_TLS_VERIFY_NONE && o->ca == NULL)
      lnr_opts_error(&r, "verify = \"%s\" needs ca (the CAs of client "
                     "certificates)", modes[o->verify]);
    /* session_tickets = true | false | N (TLS 1.3 tickets per handshake) */
    if (lua_getfield(L, r.t, "session_tickets") == LUA_TBOOLEAN) {
      o->session_tickets = lua_toboolean(L, -1);
    } else if (lua_isnil(L, -1)) {
      o->session_tickets = true;
    } else {
      int ok = 0;
      lua_Integer n = lua_tointegerx(L, -1, &ok);
      if (!ok || n < 0 || n > 16)
        lnr_opt_bad(&r, "session_tickets", -1,
                    "a boolean or a count from 0 to 16");
      o->session_tickets = n > 0;
      o->tickets = (int)n;
    }
    lua_pop(L, 1);
    opt_sni(&r, o);
  } else {
    o->verify = lnr_opt_boolean(&r, "verify", true) ? NR_TLS_VERIFY_REQUIRED
                                                    : NR_TLS_VERIFY_NONE;
    o->server_name = lnr_opt_string(&r, "server_name", NULL, NULL);
  }
}

/* ---- configs --------------------------------------------------------------- */

static int new_config(lua_State *L, bool server) {
  nr_tls_opts_t o;
  read_opts(L, 1, server ? "netrun.tls.server" : "netrun.tls.client", server,
            &o);
  char err[1024];
  nr_tls_config_t *c = nr_tls_config_new(&o, err, sizeof err);
  if (c == NULL)
    lnr_raise(L, "netrun.tls.%s: %s", server ? "server" : "client", err);
  lnr_push_handle(L, LNR_TLS, c);    /* the proxy takes its own reference */
  nr_tls_config_release(c);
  return 1;
}

/***
TLS: `netrun.tls` (OpenSSL 3).
A config is a handle whose SSL_CTX is built once and shared by every loop;
it crosses states by reference. Put it first in a pipeline
(`pipeline:add_first("tls", config)`), or give it to `netrun.server`,
`netrun.connect`, `netrun.tcp.connect`, `netrun.http.client`. The
handshake finishes before `channel_active` reaches the handlers behind it,
then they get the user event `{ tls = "handshake", version, cipher, alpn,
server_name, peer = { subject, ... } }`; a failed handshake reaches
`exception_caught` with OpenSSL's reason and the channel closes; `close`
sends close_notify.
@section tls
*/

/***
A server config. A bad certificate or key raises.
@function tls.server
@tparam table opts
@string[opt] opts.cert the certificate chain, a PEM file (or `cert_pem`, the PEM text)
@string[opt] opts.key the private key, a PEM file (or `key_pem`)
@tparam[opt] {string,...} opts.alpn protocols offered, in order of preference (e.g. `{ "h2", "http/1.1" }`)
@tparam[opt] table opts.sni extra names: `{ ["b.example"] = { cert = ..., key = ... } }`
@string[opt] opts.ca CA file to verify client certificates with
@string[opt="none"] opts.verify client certificates: "none", "optional" or "required"
@param[opt=1] opts.session_tickets TLS 1.3 tickets per handshake (`true`: 1, `false`: none)
@string[opt="TLSv1.2"] opts.min_version "TLSv1.2" or "TLSv1.3"
@number[opt=10] opts.handshake_timeout seconds from `channel_active` (0: none)
@string[opt] opts.ciphersuites TLS 1.3 suites (OpenSSL's syntax)
@string[opt] opts.ciphers TLS 1.2 ciphers
@string[opt] opts.groups key exchange groups
@return a TLS config
@usage local tls = netrun.tls.server { cert = "server.crt", key = "server.key" }
netrun.server { port = 8443, tls = tls, init = ... }
*/
/***
A client config. The server's certificate is verified against `ca` (or the
system's store) and the host name.
@function tls.client
@tparam[opt] table opts
@string[opt] opts.server_name the name sent (SNI) and verified (default: the host connected to)
@string[opt] opts.ca CA file (default: the system's store)
@bool[opt=true] opts.verify verify the server's certificate
@tparam[opt] {string,...} opts.alpn protocols offered
@string[opt] opts.cert a client certificate (or `cert_pem`)
@string[opt] opts.key its key (or `key_pem`)
@string[opt="TLSv1.2"] opts.min_version "TLSv1.2" or "TLSv1.3"
@number[opt=10] opts.handshake_timeout seconds (0: none)
@string[opt] opts.ciphersuites TLS 1.3 suites
@string[opt] opts.ciphers TLS 1.2 ciphers
@string[opt] opts.groups key exchange groups
@return a TLS config
*/

static int l_server(lua_State *L) { return new_config(L, true); }
static int l_client(lua_State *L) { return new_config(L, false); }

/***
Rebuild a config's contexts -- re-reading its files, or from new options --
for new handshakes; live connections keep theirs. Raises, keeping the old
contexts, on a bad certificate. (A hot reload does it too.)
@function tls.reload
@param config the config
@tparam[opt] table opts new options, as the constructor's
@treturn int the config's new generation
*/

/* netrun.tls.reload(config [, options]): rebuild the contexts -- re-reading
 * the same files, or from new options -- for new handshakes. Raises (and
 * keeps the old contexts) on a bad certificate. */
static int l_reload(lua_State *L) {
  nr_tls_config_t *c = lnr_check_handle(L, 1, LNR_TLS);
  nr_tls_opts_t o;
  bool with = !lua_isnoneornil(L, 2);
  if (with)
    read_opts(L, 2, "netrun.tls.reload", nr_tls_config_is_server(c), &o);
  char err[1024];
  if (nr_tls_config_reload(c, with ? &o : NULL, err, sizeof err) < 0)
    lnr_raise(L, "netrun.tls.reload: %s", err);
  lua_pushinteger(L, nr_tls_config_generation(c));
  return 1;
}

/* core.tls.identity(config): nr_tls_config_identity's 32 hex digits --
 * equal for configs made alike, another after a reload that changed
 * anything (netrun.http keys its pools by it). */
static int l_identity(lua_State *L) {
  nr_tls_config_t *c = lnr_check_handle(L, 1, LNR_TLS);
  char id[NR_TLS_ID_LEN + 1];
  nr_tls_config_identity(c, id);
  lua_pushlstring(L, id, NR_TLS_ID_LEN);
  return 1;
}

static int l_tostring(lua_State *L) {
  nr_tls_config_t *c = lnr_check_handle(L, 1, LNR_TLS);
  lua_pushfstring(L, "netrun.tls.%s (generation %d)",
                  nr_tls_config_is_server(c) ? "server" : "client",
                  (int)nr_tls_config_generation(c));
  return 1;
}

/* The pipeline's builder: a handler state per channel. */
static const nr_handler_t *make(lua_State *L, int idx, void **state) {
  nr_tls_config_t *c = lnr_check_handle(L, idx, LNR_TLS);
  if ((*state = nr_tls_new(c)) == NULL)
    luaL_error(L, "netrun.tls: out of memory");
  return &nr_tls_handler;
}

/* ---- per channel ------------------------------------------------------------ */

static nr_ctx_t *check_tls_ctx(lua_State *L, const char *what) {
  nr_channel_t *ch = lnr_check_handle(L, 1, LNR_CHANNEL);
  const char *name = luaL_optstring(L, 2, "tls");
  if (!nr_loop_in_thread(nr_channel_loop(ch)))
    luaL_error(L, "%s: only on the channel's loop", what);
  nr_ctx_t *ctx = nr_pipeline_context(nr_channel_pipeline(ch), name);
  if (ctx == NULL || nr_ctx_handler(ctx) != &nr_tls_handler)
    luaL_error(L, "%s: no tls handler named '%s'", what, name);
  return ctx;
}

/***
The future of a channel's TLS handshake. On the channel's loop.
@function tls.handshake
@tparam channel ch the channel
@string[opt="tls"] name the TLS handler's name in its pipeline
@treturn future of the handshake (fails with OpenSSL's reason)
*/

/* netrun.tls.handshake(ch [, name]) --> future of the handshake. */
static int l_handshake(lua_State *L) {
  nr_ctx_t *ctx = check_tls_ctx(L, "netrun.tls.handshake");
  nr_promise_t *p = nr_tls_handshake_future(ctx);
  if (p == NULL)
    return luaL_error(L, "netrun.tls.handshake: out of memory");
  lnr_push_promise(L, p);
  return 1;
}

/* core.tls.set_host(ch, name, host): the host a client connects to, for
 * SNI and the certificate check when the config names no server_name. */
static int l_set_host(lua_State *L) {
  nr_ctx_t *ctx = check_tls_ctx(L, "netrun.tls.set_host");
  nr_tls_set_host(nr_ctx_state(ctx), luaL_checkstring(L, 3));
  return 0;
}

/* ---- the handshake event -------------------------------------------------------- */

static void set_str(lua_State *L, const char *k, const char *v) {
  if (v != NULL) {
    lua_pushstring(L, v);
    lua_setfield(L, -2, k);
  }
}

static void push_event(lua_State *L, void *msg) {
  const nr_tls_event_t *e = msg;
  lua_createtable(L, 0, 8);
  if (e->kind == NR_TLS_CLOSE_NOTIFY) {
    set_str(L, "tls", "close_notify");
    return;
  }
  set_str(L, "tls", "handshake");
  set_str(L, "version", e->version);
  set_str(L, "cipher", e->cipher);
  set_str(L, "alpn", e->alpn);
  set_str(L, "server_name", e->server_name);
  lua_pushboolean(L, e->resumed);
  lua_setfield(L, -2, "resumed");
  if (e->peer_subject || e->peer_error) {
    lua_createtable(L, 0, 2);
    set_str(L, "subject", e->peer_subject);
    set_str(L, "issuer", e->peer_issuer);
    set_str(L, "error", e->peer_error);
    lua_setfield(L, -2, "peer");
  }
}

static pthread_once_t once = PTHREAD_ONCE_INIT;
static void register_msgs(void) {
  lnr_register_msg(NR_MSG_TLS_EVENT, push_event);
}

static void open_tls(lua_State *L) {
  pthread_once(&once, register_msgs);
  static const luaL_Reg meta[] = {{"__tostring", l_tostring}, {NULL, NULL}};
  lnr_new_class(L, TLS_MT, NULL, meta);
  lnr_handle_class(L, LNR_TLS);
  luaL_getmetatable(L, TLS_MT);
  lua_pushlightuserdata(L, (void *)(uintptr_t)make);
  lua_setfield(L, -2, "__netrun_native");
  lua_pop(L, 1);
  static const luaL_Reg funcs[] = {
      {"server", l_server}, {"client", l_client}, {"reload", l_reload},
      {"handshake", l_handshake}, {"set_host", l_set_host},
      {"identity", l_identity}, {NULL, NULL}};
  lua_newtable(L);
  luaL_setfuncs(L, funcs, 0);
  lua_setfield(L, -2, "tls");
}

lnr_module_t lnr_tls_module = {.name = "tls", .open = open_tls};
