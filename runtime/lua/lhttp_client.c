/*
 * lhttp_client.c -- netrun.codec.http_client: the native HTTP/1.1 client
 * codec (runtime/codec/http_client.c) as Lua sees it. Loop thread only.
 *
 *   ch:pipeline():add_last("http", netrun.codec.http_client {
 *     max_header = 16384,     -- status line + headers; more: an error
 *     max_body = 1 << 20,     -- decoded body; more: an error
 *     max_headers = 100,      -- header + trailer lines (at most 512)
 *     raw = false,            -- true: responses as prepared responses
 *   })
 *
 * Written to it, a request table is encoded (other values pass on):
 *   ctx:write { method = "GET", path = "/a?x=1",
 *               headers = { host = "a.example", ["x-a"] = { "1", "2" } },
 *               body = "..." }
 * method defaults to GET and path to "/"; Host is the writer's to give.
 * Content-Length is added for a body (and for an empty POST, PUT or
 * PATCH) unless the headers frame it. A bad field (a method or header
 * name that is not a token, a control byte or space in the path, CR or
 * LF in a value) fails the write with a message naming it.
 *
 * The handler after it receives each whole response as a table:
 *   { status = 200, reason = "OK", version = "HTTP/1.1",
 *     headers = { ["content-type"] = "..." },   -- names lowercased,
 *                                               -- repeats joined by ", "
 *     trailers = { ... } (only when a chunked body had some),
 *     body = "...", keep_alive = true }
 * keep_alive says whether the connection may carry another request.
 * With raw = true (a proxy's mode) it is instead
 *   { status = 200, keep_alive = true, response = <netrun.codec.http_response> }
 * the response encoded once in C, without its hop-by-hop fields (RFC 9110
 * 7.6.1) and framing (Content-Length, Transfer-Encoding), ready for a
 * server codec's ctx:write, which frames it for its own client; no headers
 * or body table is built. (A body over 2 GiB comes as a table.)
 * A response it cannot read (malformed, over a limit, cut short by the
 * close) reaches exception_caught as "http_client: <kind>: <cause>" and
 * the channel is closed.
 */
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "codec/http_client.h"
#include "lhttp.h"

#define CLASS "netrun.codec.http_client"

/* ---- responses to Lua ----------------------------------------------------------- */

/* Push a header name lowercased (most arrive so: then no copy). */
static void push_lower(lua_State *L, const char *s, size_t n) {
  char buf[256];
  size_t i = 0;
  while (i < n && !(s[i] >= 'A' && s[i] <= 'Z'))
    i++;
  if (i == n || n > sizeof buf) {
    lua_pushlstring(L, s, n);
    if (i < n) {               /* long and mixed-case: rare */
      lua_getglobal(L, "string");
      lua_getfield(L, -1, "lower");
      lua_pushvalue(L, -3);
      lua_call(L, 1, 1);
      lua_replace(L, -3);
      lua_pop(L, 1);
    }
    return;
  }
  for (size_t k = 0; k < n; k++)
    buf[k] = s[k] >= 'A' && s[k] <= 'Z' ? s[k] + 32 : s[k];
  lua_pushlstring(L, buf, n);
}

/* A table of the fields h[0 .. n), repeats joined with ", ". */
static void push_fields(lua_State *L, const nr_http_header_t *h, size_t n) {
  lua_createtable(L, 0, (int)n);
  for (size_t i = 0; i < n; i++) {
    push_lower(L, h[i].name, h[i].name_len);
    lua_pushvalue(L, -1);
    if (lua_rawget(L, -3) == LUA_TSTRING) {
      lua_pushliteral(L, ", ");
      lua_pushlstring(L, h[i].value, h[i].value_len);
      lua_concat(L, 3);
    } else {
      lua_pop(L, 1);
      lua_pushlstring(L, h[i].value, h[i].value_len);
    }
    lua_rawset(L, -3);
  }
}

/* Hop-by-hop fields and the framing, which the codec writing the
 * response gives its own hop. */
static bool hop_by_hop(const char *n, size_t len) {
#define HOP(s) {s, sizeof s - 1}
  static const struct { const char *s; size_t n; } names[] = {
      HOP("connection"), HOP("keep-alive"), HOP("te"), HOP("trailer"),
      HOP("transfer-encoding"), HOP("upgrade"), HOP("proxy-connection"),
      HOP("proxy-authenticate"), HOP("proxy-authorization"),
      HOP("content-length")};
#undef HOP
  for (size_t i = 0; i < sizeof names / sizeof names[0]; i++)
    if (names[i].n == len && strncasecmp(names[i].s, n, len) == 0)
      return true;
  return false;
}

/* The raw form: a prepared response (lhttp.c's class) of r's status,
 * end-to-end headers and body; false when r cannot be one (the caller
 * then pushes the table form). */
static bool push_raw(lua_State *L, const nr_http_reply_t *r) {
  if (r->body_len > UINT32_MAX / 2 || r->status < 100 || r->status > 999)
    return false;
  nr_http_header_t small[32], *kept = small;
  if (r->nheaders > sizeof small / sizeof small[0] &&
      (kept = malloc(r->nheaders * sizeof *kept)) == NULL)
    return false;
  size_t n = 0;
  bool ok = true;
  for (size_t i = 0; i < r->nheaders && ok; i++) {
    const nr_http_header_t *h = &r->headers[i];
    if (hop_by_hop(h->name, h->name_len))
      continue;
    ok = nr_http_is_token(h->name, h->name_len) &&
         nr_http_is_field_value(h->value, h->value_len);
    kept[n++] = *h;
  }
  if (ok) {
    nr_http_response_t res = {.type = NR_MSG_HTTP_RESPONSE,
                              .status = r->status, .headers = kept,
                              .nheaders = n, .body = r->body,
                              .body_len = r->body_len};
    size_t size = nr_http_prepared_size(&res);
    lua_createtable(L, 0, 3);
    lnr_native_t *ud = lua_newuserdatauv(L, sizeof *ud + size, 0);
    ud->tag = &lnr_native_tag;
    ud->pad = NULL;
    nr_http_prepare(&res, (nr_http_prepared_t *)(ud + 1));
    luaL_setmetatable(L, "netrun.codec.http_response");
    lua_setfield(L, -2, "response");
    lua_pushinteger(L, r->status);
    lua_setfield(L, -2, "status");
    lua_pushboolean(L, r->keep_alive);
    lua_setfield(L, -2, "keep_alive");
  }
  if (kept != small)
    free(kept);
  return ok;
}

static void push_reply(lua_State *L, void *msg) {
  const nr_http_reply_t *r = msg;
  luaL_checkstack(L, 8, "http_client");
  if (r->raw && push_raw(L, r))
    return;
  lua_createtable(L, 0, 7);
  lua_pushinteger(L, r->status);
  lua_setfield(L, -2, "status");
  lua_pushlstring(L, r->reason, r->reason_len);
  lua_setfield(L, -2, "reason");
  lua_pushstring(L, r->minor == 0 ? "HTTP/1.0" : "HTTP/1.1");
  lua_setfield(L, -2, "version");
  push_fields(L, r->headers, r->nheaders);
  lua_setfield(L, -2, "headers");
  if (r->ntrailers > 0) {
    push_fields(L, r->trailers, r->ntrailers);
    lua_setfield(L, -2, "trailers");
  }
  lua_pushlstring(L, r->body, r->body_len);
  lua_setfield(L, -2, "body");
  lua_pushboolean(L, r->keep_alive);
  lua_setfield(L, -2, "keep_alive");
}

/* ---- requests from Lua ------------------------------------------------------------ */

static bool good_target(const char *s, size_t n) {
  if (n == 0)
    return false;
  for (size_t i = 0; i < n; i++)
    if ((unsigned char)s[i] <= 0x20 || s[i] == 0x7f)
      return false;
  return true;
}

/* Fill c from the request table at idx (its strings stay on the stack). */
static int to_call(lua_State *L, int idx, nr_http_call_t *c, lnr_hdrs_t *h,
                   char *err, size_t el) {
  int t = lua_getfield(L, idx, "method");
  c->method = t == LUA_TNIL ? "GET" : lua_tolstring(L, -1, &c->method_len);
  if (t == LUA_TNIL)
    c->method_len = 3;
  if (c->method == NULL || (t != LUA_TSTRING && t != LUA_TNIL) ||
      !nr_http_is_token(c->method, c->method_len)) {
    snprintf(err, el, "method must be a token such as \"GET\", got %s",
             t == LUA_TSTRING ? "a string that is not" : luaL_typename(L, -1));
    return -EINVAL;
  }
  t = lua_getfield(L, idx, "path");
  c->target = t == LUA_TNIL ? "/" : lua_tolstring(L, -1, &c->target_len);
  if (t == LUA_TNIL)
    c->target_len = 1;
  if (c->target == NULL || (t != LUA_TSTRING && t != LUA_TNIL) ||
      !good_target(c->target, c->target_len)) {
    snprintf(err, el, "path must be a string without spaces or control "
             "characters, got %s", t == LUA_TSTRING ? "one with them"
                                                    : luaL_typename(L, -1));
    return -EINVAL;
  }
  t = lua_getfield(L, idx, "body");
  if (t == LUA_TSTRING || t == LUA_TNUMBER) {
    c->body = lua_tolstring(L, -1, &c->body_len);
  } else if (t != LUA_TNIL) {
    snprintf(err, el, "body must be a string, got a %s", luaL_typename(L, -1));
    return -EINVAL;
  }
  t = lua_getfield(L, idx, "headers");
  if (t == LUA_TTABLE) {
    int rc = lnr_collect_headers(L, lua_gettop(L), h, err, el);
    if (rc)
      return rc;
  } else if (t != LUA_TNIL) {
    snprintf(err, el, "headers must be a table, got a %s",
             luaL_typename(L, -1));
    return -EINVAL;
  }
  c->headers = h->v;
  c->nheaders = h->n;
  return 0;
}

/* The codec's write behind a Lua front: request tables are converted,
 * everything else goes to the core as it is. */
static int lwrite(nr_ctx_t *ctx, void *msg, nr_promise_t *p) {
  if (nr_msg_type(msg) != NR_MSG_LUA)
    return nr_http_client_write(ctx, msg, p);
  const lnr_lmsg_t *m = msg;
  lua_State *L = m->L;
  if (lua_type(L, m->idx) != LUA_TTABLE)
    return nr_http_client_write(ctx, msg, p);
  int top = lua_gettop(L);
  if (!lua_checkstack(L, 16))
    return nr_raise(-ENOMEM, "http_client: Lua stack overflow");
  nr_http_call_t c = {.type = NR_MSG_HTTP_CALL};
  lnr_hdrs_t h;
  lnr_hdrs_init(&h);
  char err[200];
  int rc = to_call(L, m->idx, &c, &h, err, sizeof err);
  if (rc == 0)
    rc = nr_http_client_write(ctx, &c, p);
  else
    rc = nr_raise(rc, "http_client request: %s", err);
  lnr_hdrs_free(&h);
  lua_settop(L, top);
  return rc;
}

static const nr_handler_t lua_vt = {
    .type = "http_client", .removed = nr_http_client_removed,
    .inactive = nr_http_client_inactive, .read = nr_http_client_read,
    .write = lwrite, .flags = NR_HANDLER_SYNC_WRITE};

/* ---- the constructor --------------------------------------------------------------- */

static const nr_handler_t *make(lua_State *L, int idx, void **state) {
  nr_http_client_opts_t *o = luaL_checkudata(L, idx, CLASS);
  *state = nr_http_client_new(o);
  if (*state == NULL)
    luaL_error(L, CLASS ": out of memory");
  return &lua_vt;
}

/* Size options: lnr_codec_int, as for the other codecs. */
static size_t opt_size(lua_State *L, const char *k, lua_Integer d,
                       lua_Integer min, lua_Integer max) {
  return (size_t)lnr_codec_int(L, "http_client", k, d, min, max);
}

static int l_http_client(lua_State *L) {
  if (!lua_isnoneornil(L, 1))
    luaL_checktype(L, 1, LUA_TTABLE);
  nr_http_client_opts_t o;
  o.max_header = opt_size(L, "max_header", 16384, 64, 1 << 30);
  o.max_body = opt_size(L, "max_body", 1 << 20, 0, (lua_Integer)1 << 40);
  o.max_headers = opt_size(L, "max_headers", 100, 1, NR_HTTP_MAX_HEADERS);
  o.raw = lnr_codec_bool(L, "http_client", "raw", false);
  nr_http_client_opts_t *c = lua_newuserdatauv(L, sizeof *c, 0);
  *c = o;
  luaL_setmetatable(L, CLASS);
  return 1;
}

static int l_tostring(lua_State *L) {
  nr_http_client_opts_t *c = luaL_checkudata(L, 1, CLASS);
  lua_pushfstring(L, CLASS "{ max_header = %I, max_body = %I, "
                  "max_headers = %I, raw = %s }", (lua_Integer)c->max_header,
                  (lua_Integer)c->max_body, (lua_Integer)c->max_headers,
                  c->raw ? "true" : "false");
  return 1;
}

static void register_converter(void) {
  lnr_register_msg(NR_MSG_HTTP_REPLY, push_reply);
}

void lnr_open_http_client(lua_State *L) {
  static pthread_once_t once = PTHREAD_ONCE_INIT;
  pthread_once(&once, register_converter);   /* every state opens this */
  lnr_native_class(L, CLASS, make, l_tostring);
  lua_getfield(L, -1, "codec");
  lua_pushcfunction(L, l_http_client);
  lua_setfield(L, -2, "http_client");
  lua_pop(L, 1);
}
