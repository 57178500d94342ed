/*
 * lhttp_client.c -- netrun.codec.http_client: the native HTTP/1.1 client
 * codec (runtime/codec/http_client.c) as Lua sees it. Loop thread only.
 *
 *   ch:pipeline():add_last("http", netrun.codec.http_client {
 *     max_header = 16384,     -- status line + headers; more: an error
 *     max_body = 1 << 20,     -- decoded body; more: an error
 *     max_headers = 100,      -- header + trailer lines (at most 512)
 *     raw = false,            -- true: responses as prepared responses
 *     stream = false,         -- true: a response with a body comes as its
 *                             -- head ({ ..., streaming = true }, no body),
 *                             -- then { type = "body", data, last } pieces,
 *                             -- one per read at most (turn the channel's
 *                             -- auto_read off to pace it); max_body still
 *                             -- bounds the whole (not with raw)
 *   })
 *
 * Written to it, a request table is encoded (other values pass on):
 *   ctx:write { method = "GET", path = "/a?x=1",
 *               headers = { host = "a.example", ["x-a"] = { "1", "2" } },
 *               body = "..." }
 * method defaults to GET and path to "/"; Host is the writer's to give.
 * A table with forward = <a request of netrun.codec.http_server> instead
 * sends that request on (netrun.http's forward option): its method,
 * target, body and end-to-end fields, from the bytes the server codec
 * kept (or the fields its handler assigned), with the table's headers
 * added in place of fields of their names and the table's host as Host
 * when the request has none; hop-by-hop fields, Content-Length and Expect
 * stay behind.
 * netrun.http's pool (lhttp_pool.c) writes its requests in C, from the
 * same fields kept as a userdata's uservalues (lnr_http_write_call).
 * Content-Length is added for a body (and for an empty POST, PUT or
 * PATCH) unless the headers frame it. A bad field (a method or header
 * name that is not a token, a control byte or space in the path, CR or
 * LF in a value) fails the write with a message naming it.
 *
 * The handler after it receives each whole response as a table:
 *   { status = 200, reason = "OK", version = "HTTP/1.1",
 *     headers = { ["content-type"] = "..." },   -- names lowercased,
 *                                               -- repeats joined by ", ",
 *                                               -- but a repeated Set-Cookie
 *                                               -- is an array of its values
 *     trailers = { ... } (only when a chunked body had some),
 *     body = "...", keep_alive = true }
 * keep_alive says whether the connection may carry another request.
 * With raw = true (a proxy's mode) it is instead a
 * netrun.http.raw_response: the response encoded once in C, without its
 * hop-by-hop fields (RFC 9110 7.6.1) and framing (Content-Length,
 * Transfer-Encoding), ready for a server codec's ctx:write, which frames
 * it for its own client (the answer to a HEAD keeps its Content-Length:
 * the size a GET would get, which the server codec then sends as given); res.status, res.keep_alive (true) and
 * res.response (itself) read from it, and no headers or body table is
 * built. A response after which the connection closes comes as
 *   { status = 200, keep_alive = false, response = <raw_response> }
 * (and one that cannot be prepared, a body over 2 GiB, as the table above).
 * A response it cannot read (malformed, over a limit, cut short by the
 * close) reaches exception_caught as "http_client: <kind>: <cause>" and
 * the channel is closed.
 */

/***
@module netrun
*/

/***
Codecs: `netrun.codec`.
@section codec
*/
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "codec/http_client.h"
#include "lhttp.h"
#include "lhttp_stream.h"

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

/* A repeated field's value (the first at -1, the name at -2, the table at
 * -3) with h's joined: by ", " (RFC 9110 5.3), except Set-Cookie, whose
 * values may hold commas (an Expires date) and are never combined (RFC
 * 6265 3): an array of them, in their order, as lua-resty-http gives. */
static void push_repeat(lua_State *L, const nr_http_header_t *h) {
  if (h->name_len == 10 && strncasecmp(h->name, "set-cookie", 10) == 0) {
    if (lua_type(L, -1) == LUA_TSTRING) {     /* the second: an array now */
      lua_createtable(L, 2, 0);
      lua_insert(L, -2);
      lua_rawseti(L, -2, 1);
    }
    lua_pushlstring(L, h->value, h->value_len);
    lua_rawseti(L, -2, (lua_Integer)lua_rawlen(L, -2) + 1);
    return;
  }
  lua_pushliteral(L, ", ");
  lua_pushlstring(L, h->value, h->value_len);
  lua_concat(L, 3);
}

/* A table of the fields h[0 .. n), repeats joined (push_repeat). */
static void push_fields(lua_State *L, const nr_http_header_t *h, size_t n) {
  lua_createtable(L, 0, (int)n);
  for (size_t i = 0; i < n; i++) {
    push_lower(L, h[i].name, h[i].name_len);
    lua_pushvalue(L, -1);
    if (lua_rawget(L, -3) != LUA_TNIL) {
      push_repeat(L, &h[i]);
    } else {
      lua_pop(L, 1);
      lua_pushlstring(L, h[i].value, h[i].value_len);
    }
    lua_rawset(L, -3);
  }
}

/* Hop-by-hop fields and the framing, which the codec writing the
 * message gives its own hop. Told apart by length first: most fields of
 * a message are none of them, and one compare then settles it. */
bool lnr_http_hop_by_hop(const char *n, size_t len) {
#define IS(lit) (strncasecmp(n, lit, len) == 0)
  switch (len) {
  case 2: return IS("te");
  case 7: return IS("trailer") || IS("upgrade");
  case 10: return IS("connection") || IS("keep-alive");
  case 14: return IS("content-length");
  case 16: return IS("proxy-connection");
  case 17: return IS("transfer-encoding");
  case 18: return IS("proxy-authenticate");
  case 19: return IS("proxy-authorization");
  default: return false;
  }
#undef IS
}

/* The raw form: a netrun.http.raw_response, which is a prepared response
 * (written, it goes to the pipeline as one: lnr.h's native messages) of
 * r's status, end-to-end headers and body, whose status and keep_alive may
 * be read (and response: itself, as the table form has one). It is made
 * only for a response after which the connection stays open (keep_alive
 * is true); false when r cannot be one (the caller then pushes the table
 * form). The parser took only token names and values without control
 * bytes, so the fields are prepared as they are. */
#define RAW_CLASS "netrun.http.raw_response"

static bool push_raw(lua_State *L, const nr_http_reply_t *r) {
  if (r->body_len > UINT32_MAX / 2 || r->status < 100 || r->status > 999 ||
      !r->keep_alive)
    return false;
  nr_http_header_t small[32], *kept = small;
  if (r->nheaders > sizeof small / sizeof small[0] &&
      (kept = malloc(r->nheaders * sizeof *kept)) == NULL)
    return false;
  size_t n = 0;
  for (size_t i = 0; i < r->nheaders; i++) {
    const nr_http_header_t *h = &r->headers[i];
    if (!lnr_http_hop_by_hop(h->name, h->name_len) || (r->head && h->name_len == 14 &&
                                              strncasecmp(h->name, "content-length", 14) == 0))
      kept[n++] = *h;
  }
  nr_http_response_t res = {.type = NR_MSG_HTTP_RESPONSE, .status = r->status,
                            .headers = kept, .nheaders = n, .body = r->body,
                            .body_len = r->body_len};
  size_t size = nr_http_prepared_size(&res);
  lnr_native_t *ud = lua_newuserdatauv(L, sizeof *ud + size, 0);
  ud->tag = &lnr_native_tag;
  ud->pad = NULL;
  nr_http_prepare(&res, (nr_http_prepared_t *)(ud + 1));
  lnr_http_part_t *P = lnr_http_part(L);
  if (lnr_push_ref(L, &P->raw_mt_ref) != LUA_TTABLE) {   /* one per */
    lua_pop(L, 1);                                      /* response */
    luaL_getmetatable(L, RAW_CLASS);
    lua_pushvalue(L, -1);
    lnr_set_ref(L, &P->raw_mt_ref);
  }
  lua_setmetatable(L, -2);
  if (kept != small)
    free(kept);
  return true;
}

/* A raw response after which the connection closes, as the table
 * { status, keep_alive = false, response }; false when it cannot be
 * prepared (the caller then pushes the table form). */
static bool push_raw_closing(lua_State *L, const nr_http_reply_t *r) {
  nr_http_reply_t open = *r;
  open.keep_alive = true;      /* (push_raw makes none for a closing one) */
  if (!push_raw(L, &open))
    return false;
  lua_createtable(L, 0, 3);
  lua_insert(L, -2);
  lua_setfield(L, -2, "response");
  lua_pushinteger(L, r->status);
  lua_setfield(L, -2, "status");
  lua_pushboolean(L, 0);
  lua_setfield(L, -2, "keep_alive");
  return true;
}

static int raw_index(lua_State *L) {
  const nr_http_prepared_t *pr = lnr_to_native(L, 1);
  size_t n = 0;
  const char *k = lua_type(L, 2) == LUA_TSTRING ? lua_tolstring(L, 2, &n) : "";
  if (pr == NULL)
    return luaL_typeerror(L, 1, RAW_CLASS);
  if (n == 6 && memcmp(k, "status", 6) == 0)
    lua_pushinteger(L, pr->status);
  else if (n == 10 && memcmp(k, "keep_alive", 10) == 0)
    lua_pushboolean(L, 1);
  else if (n == 8 && memcmp(k, "response", 8) == 0)
    lua_settop(L, 1);
  else
    lua_pushnil(L);
  return 1;
}

static int raw_tostring(lua_State *L) {
  const nr_http_prepared_t *pr = lnr_to_native(L, 1);
  lua_pushfstring(L, RAW_CLASS " (%d, %d bytes of body)", pr ? pr->status : 0,
                  pr ? (int)pr->body_len : 0);
  return 1;
}

static const nr_handler_t *raw_not_a_handler(lua_State *L, int idx,
                                             void **state) {
  (void)idx;
  (void)state;
  luaL_error(L, RAW_CLASS ": a response to write, not a handler");
  return NULL;
}

static void push_reply(lua_State *L, void *msg) {
  const nr_http_reply_t *r = msg;
  luaL_checkstack(L, 8, "http_client");
  if (r->error != NULL) {      /* an HTTP/2 stream that failed */
    lua_createtable(L, 0, 2);
    lua_pushstring(L, r->error);
    lua_setfield(L, -2, "error");
    lua_pushboolean(L, r->retry);
    lua_setfield(L, -2, "retry");
    return;
  }
  if (r->raw && !r->streaming &&
      (r->keep_alive ? push_raw(L, r) : push_raw_closing(L, r)))
    return;
  lua_createtable(L, 0, 7);
  lua_pushinteger(L, r->status);
  lua_setfield(L, -2, "status");
  lua_pushlstring(L, r->reason, r->reason_len);
  lua_setfield(L, -2, "reason");
  lua_pushstring(L, r->h2 ? "2" : r->minor == 0 ? "HTTP/1.0" : "HTTP/1.1");
  lua_setfield(L, -2, "version");
  push_fields(L, r->headers, r->nheaders);
  lua_setfield(L, -2, "headers");
  if (r->ntrailers > 0) {
    push_fields(L, r->trailers, r->ntrailers);
    lua_setfield(L, -2, "trailers");
  }
  if (r->streaming) {          /* its body follows, in pieces */
    lua_pushboolean(L, 1);
    lua_setfield(L, -2, "streaming");
  } else {
    lua_pushlstring(L, r->body, r->body_len);
    lua_setfield(L, -2, "body");
  }
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

/* ---- forwarding a server request ------------------------------------------- */

/* What a forwarded request may carry as its target: origin-form (a path,
 * maybe a query) or "*". Never absolute-form: the backend would take the
 * target's host over the Host sent beside it (RFC 9112 3.2.2), and serve
 * another host's path than the one a rule looked at -- the server codec
 * turns a client's absolute-form into origin-form, and a handler that
 * sets req.path = "http://..." is refused here. */
static bool origin_form(const char *s, size_t n) {
  return n > 0 && (s[0] == '/' || (n == 1 && s[0] == '*'));
}

/* Fields a forwarded request leaves behind besides the hop-by-hop ones:
 * the server codec answered its Expect already. */
static bool not_forwarded(const char *n, size_t len) {
  return lnr_http_hop_by_hop(n, len) || (len == 6 && strncasecmp(n, "expect", 6) == 0);
}

/* Is name among h->v[0 .. n) (the fields the writer gave)? */
static bool given(const lnr_hdrs_t *h, size_t n, const char *name, size_t len) {
  for (size_t i = 0; i < n; i++)
    if (h->v[i].name_len == len && strncasecmp(h->v[i].name, name, len) == 0)
      return true;
  return false;
}

/* A forwarded field, unless hop-by-hop or given by the writer; *host is
 * set when it is Host. */
static int forward_field(lnr_hdrs_t *h, size_t ngiven, const char *name,
                         size_t nl, const char *val, size_t vl, bool *host,
                         char *err, size_t el) {
  if (not_forwarded(name, nl) || given(h, ngiven, name, nl))
    return 0;
  *host = *host || (nl == 4 && strncasecmp(name, "host", 4) == 0);
  return lnr_hdrs_add(h, name, nl, val, vl, err, el);
}

/* The fields of the headers table at t (the handler read or set them):
 * each value a string, or an array of them. */
static int forward_table(lua_State *L, int t, lnr_hdrs_t *h, size_t ngiven,
                         bool *host, char *err, size_t el) {
  lnr_hdrs_t all;
  lnr_hdrs_init(&all, L);
  int rc = lnr_collect_headers(L, t, &all, err, el);
  for (size_t i = 0; rc == 0 && i < all.n; i++)
    rc = forward_field(h, ngiven, all.v[i].name, all.v[i].name_len,
                       all.v[i].value, all.v[i].value_len, host, err, el);
  lnr_hdrs_free(&all);
  return rc;
}

/* The head's own fields, as they arrived (checked by the server's parser). */
static int forward_raw(lua_State *L, int idx, size_t n, lnr_hdrs_t *h,
                       size_t ngiven, bool *host, char *err, size_t el) {
  nr_http_header_t small[32], *v = small;
  if (n > sizeof small / sizeof small[0] && (v = malloc(n * sizeof *v)) == NULL) {
    snprintf(err, el, "out of memory");
    return -ENOMEM;
  }
  lnr_http_forward_fields(L, idx, v, n);
  int rc = 0;                  /* (checked by the server's parser, but
                                  checked again: cheap, and a codec that
                                  trusted a field would send it) */
  for (size_t i = 0; rc == 0 && i < n; i++)
    rc = forward_field(h, ngiven, v[i].name, v[i].name_len, v[i].value,
                       v[i].value_len, host, err, el);
  if (v != small)
    free(v);
  return rc;
}

/* A request's fields come by name (a table a writer gives) or as the
 * uservalues of a userdata, at the positions REQ_* (netrun.http's pool,
 * lhttp_pool.c: lnr_http_write_call). */
enum { REQ_METHOD = 2, REQ_PATH, REQ_HEADERS, REQ_BODY, REQ_FORWARD, REQ_HOST };
enum { BY_NAME, BY_UVALUE };

/* Push the request's field (its uservalue, or its name), as lua_getfield;
 * false counts as nil in a userdata's. */
static int field(lua_State *L, int idx, int how, int i, const char *name) {
  if (how == BY_NAME)
    return lua_getfield(L, idx, name);
  int t = lua_getiuservalue(L, idx, i);
  if (t == LUA_TBOOLEAN && !lua_toboolean(L, -1)) {
    lua_pop(L, 1);
    lua_pushnil(L);
    return LUA_TNIL;
  }
  return t == LUA_TNONE ? LUA_TNIL : t;
}

/* Fill c from the server request at fwd (the request table's forward
 * field, at idx): its method, target, body and end-to-end fields; the
 * table's headers are added and replace forwarded ones of their names; the
 * table's host is the Host when the request has none (HTTP/1.0). */
static int to_forward(lua_State *L, int idx, int how, int fwd,
                      nr_http_call_t *c, lnr_hdrs_t *h, char *err, size_t el) {
  lnr_http_fwd_t f;
  if (!lnr_http_forward_view(L, fwd, &f)) {
    snprintf(err, el, "forward must be a request of netrun.codec.http_server, "
             "got a %s", luaL_typename(L, fwd));
    return -EINVAL;
  }
  if (f.bad != NULL) {
    snprintf(err, el, "the forwarded request's %s cannot be sent", f.bad);
    return -EINVAL;
  }
  if (!nr_http_is_token(f.method, f.method_len) ||
      !good_target(f.target, f.target_len)) {
    snprintf(err, el, "the forwarded request's %s cannot be sent",
             nr_http_is_token(f.method, f.method_len) ? "path" : "method");
    return -EINVAL;
  }
  if (!origin_form(f.target, f.target_len)) {
    snprintf(err, el, "the forwarded request's path cannot be sent: it must "
             "begin with '/' (origin-form), got \"%.*s\"",
             f.target_len > 64 ? 64 : (int)f.target_len, f.target);
    return -EINVAL;
  }
  uint64_t tag = c->tag;       /* (the pool's: its reply comes back with it) */
  *c = (nr_http_call_t){.type = NR_MSG_HTTP_CALL, .tag = tag, .method = f.method,
                        .method_len = f.method_len, .target = f.target,
                        .target_len = f.target_len,
                        .body = f.body_len ? f.body : NULL,
                        .body_len = f.body_len};
  int rc = 0;
  if (field(L, idx, how, REQ_HEADERS, "headers") == LUA_TTABLE)
    rc = lnr_collect_headers(L, lua_gettop(L), h, err, el);
  size_t ngiven = h->n;
  bool host = given(h, ngiven, "host", 4);
  if (rc == 0)
    rc = f.headers ? forward_table(L, f.headers, h, ngiven, &host, err, el)
                   : forward_raw(L, fwd, f.nheaders, h, ngiven, &host, err, el);
  if (rc == 0 && !host &&
      field(L, idx, how, REQ_HOST, "host") == LUA_TSTRING) {
    size_t n;
    const char *v = lua_tolstring(L, -1, &n);
    rc = lnr_hdrs_add(h, "host", 4, v, n, err, el);
  }
  c->headers = h->v;
  c->nheaders = h->n;
  return rc;
}

/* Fill c from the request table at idx (its strings stay on the stack). */
static int to_call(lua_State *L, int idx, int how, nr_http_call_t *c,
                   lnr_hdrs_t *h, char *err, size_t el) {
  if (field(L, idx, how, REQ_FORWARD, "forward") != LUA_TNIL)
    return to_forward(L, idx, how, lua_gettop(L), c, h, err, el);
  int t = field(L, idx, how, REQ_METHOD, "method");
  c->method = t == LUA_TNIL ? "GET" : lua_tolstring(L, -1, &c->method_len);
  if (t == LUA_TNIL)
    c->method_len = 3;
  if (c->method == NULL || (t != LUA_TSTRING && t != LUA_TNIL) ||
      !nr_http_is_token(c->method, c->method_len)) {
    snprintf(err, el, "method must be a token such as \"GET\", got %s",
             t == LUA_TSTRING ? "a string that is not" : luaL_typename(L, -1));
    return -EINVAL;
  }
  t = field(L, idx, how, REQ_PATH, "path");
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
  t = field(L, idx, how, REQ_BODY, "body");
  if (t == LUA_TSTRING || t == LUA_TNUMBER) {
    c->body = lua_tolstring(L, -1, &c->body_len);
  } else if (t != LUA_TNIL) {
    snprintf(err, el, "body must be a string, got a %s", luaL_typename(L, -1));
    return -EINVAL;
  }
  t = field(L, idx, how, REQ_HEADERS, "headers");
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
  lnr_hdrs_init(&h, L);
  char err[200];
  int rc = to_call(L, m->idx, BY_NAME, &c, &h, err, sizeof err);
  if (rc == 0)
    rc = nr_http_client_write(ctx, &c, p);
  else
    rc = nr_raise(rc, "http_client request: %s", err);
  lnr_hdrs_free(&h);
  lua_settop(L, top);
  return rc;
}

int lnr_http_write_call(lua_State *L, int idx, nr_ctx_t *ctx, uint64_t tag,
                        char *err, size_t el) {
  int top = lua_gettop(L);
  if (!lua_checkstack(L, 16)) {
    snprintf(err, el, "Lua stack overflow");
    return 1;
  }
  nr_http_call_t c = {.type = NR_MSG_HTTP_CALL, .tag = tag};
  lnr_hdrs_t h;
  lnr_hdrs_init(&h, L);
  int rc = to_call(L, idx, BY_UVALUE, &c, &h, err, el);
  if (rc == 0)
    rc = nr_ctx_write(ctx, &c, NULL);      /* a failure went to exception_caught */
  else
    rc = 1;
  lnr_hdrs_free(&h);
  lua_settop(L, top);
  return rc;
}

static const nr_handler_t lua_vt = {
    .type = "http_client", .removed = nr_http_client_removed,
    .active = nr_http_client_active, .inactive = nr_http_client_inactive,
    .user_event = nr_http_client_user_event,
    .channel_read = nr_http_client_channel_read,
    .write = lwrite, .flags = NR_HANDLER_SYNC_WRITE};

/* ---- a request's options (netrun.http) ---------------------------------------------- */

/* core.http.check_request(opts): raises, at the caller's line (outside
 * netrun.http: lnr_push_where), when opts is not a table of known options
 * of the right types. One pass in C: a request is checked each time it
 * is made, and this way that costs a few hundred instructions rather
 * than a Lua loop and a C call per option. The messages are lopts.c's. */

/* The options, in the order of lnr.h's LNR_HOPT_*, and the type each must
 * have (LUA_TNONE: any; LUA_TNUMBER: a kind of number, below). */
static const struct { const char *k; size_t n; int t; } options[] = {
#define OPT(name, type) {name, sizeof name - 1, type}
    OPT("url", LUA_TNONE), OPT("forward", LUA_TUSERDATA),
    OPT("headers", LUA_TTABLE), OPT("method", LUA_TSTRING),
    OPT("body", LUA_TSTRING), OPT("timeout", LUA_TNUMBER),
    OPT("max_body", LUA_TNUMBER), OPT("tls", LUA_TNONE),
    OPT("follow", LUA_TNUMBER), OPT("follow_downgrade", LUA_TBOOLEAN),
    OPT("stream", LUA_TBOOLEAN), OPT("upstream", LUA_TTABLE),
    OPT("path", LUA_TSTRING)};
#undef OPT
static const char *const option_names[] = {
    "url", "forward", "headers", "method", "body", "timeout", "max_body",
    "tls", "follow", "follow_downgrade", "stream", "upstream", "path", NULL};

/* The option named k (its LNR_HOPT_*), or -1: no such option. Lengths are
 * compared first: most options differ in length. */
static int option_index(const char *k, size_t n) {
  for (int i = 0; i < LNR_HOPT_N; i++)
    if (options[i].n == n && memcmp(options[i].k, k, n) == 0)
      return i;
  return -1;
}

/* The number option i at the top, checked (a numeric string too): the
 * number itself replaces it when it was a string or an integral float;
 * true then. */
static bool check_number(const lnr_opts_t *o, int i) {
  lua_State *L = o->L;
  const char *k = options[i].k;
  if (lua_type(L, -1) == LUA_TNUMBER) {      /* the usual: checked inline */
    if (i == LNR_HOPT_TIMEOUT) {
      lua_Number s = lua_tonumber(L, -1);
      if (s >= 0 && s <= 1e9)
        return false;
    } else if (lua_isinteger(L, -1)) {
      lua_Integer v = lua_tointeger(L, -1);
      if (v >= 0 && (i != LNR_HOPT_MAX_BODY || v <= LNR_OPT_SIZE_MAX))
        return false;
    }
  }
  if (i == LNR_HOPT_TIMEOUT) {
    lnr_optv_seconds(o, k, -1);
    if (lua_type(L, -1) == LUA_TNUMBER)
      return false;
    lua_pushnumber(L, lua_tonumber(L, -1));
  } else {
    lua_Integer v = i == LNR_HOPT_MAX_BODY
        ? (lua_Integer)lnr_optv_size(o, k, -1, 0, LNR_OPT_SIZE_MAX)
        : lnr_optv_integer(o, k, -1, 0, LUA_MAXINTEGER);
    if (lua_isinteger(L, -1))
      return false;
    lua_pushinteger(L, v);
  }
  lua_replace(L, -2);
  return true;
}

/* A key of the request at idx is not an option: say which, and what it
 * may have meant (lnr_opts_open's check of the keys). */
static _Noreturn void unknown_option(lnr_opts_t *o, int idx) {
  lnr_opts_open(o, o->L, idx, o->what, option_names, true);
  abort();                      /* (it raised) */
}

bool lnr_http_check_request(lua_State *L, int idx, int base) {
  idx = lua_absindex(L, idx);
  lnr_opts_t o = {.L = L, .t = idx, .what = "netrun.http.request"};
  if (lua_type(L, idx) != LUA_TTABLE)       /* (raises) */
    lnr_opts_open(&o, L, idx, o.what, NULL, true);
  bool forward = false, method_or_body = false, converted = false,
       stream = false, stream_body = false;
  lua_pushnil(L);
  while (lua_next(L, idx)) {
    size_t n = 0;
    const char *k = lua_type(L, -2) == LUA_TSTRING ? lua_tolstring(L, -2, &n)
                                                   : NULL;
    int i = k ? option_index(k, n) : -1, t = lua_type(L, -1);
    int want = i >= 0 ? options[i].t : LUA_TNONE;
    if (i < 0)
      unknown_option(&o, idx);
    if (want == LUA_TUSERDATA && t == LUA_TBOOLEAN && !lua_toboolean(L, -1)) {
      lua_pop(L, 1);                         /* forward = false: none */
      continue;
    }
    if (want == LUA_TUSERDATA) {             /* forward */
      if (!lnr_http_is_request(L, -1))
        lnr_opt_bad(&o, k, -1, "a request of netrun.codec.http_server");
      forward = true;
    } else if (want == LUA_TNUMBER) {
      converted |= check_number(&o, i);
    } else if (i == LNR_HOPT_BODY && t == LUA_TFUNCTION) {
      stream_body = true;                    /* (with stream = true only) */
      method_or_body = true;
    } else if (want != LUA_TNONE && t != want) {
      lnr_opt_bad(&o, k, -1, want == LUA_TTABLE     ? "a table"
                             : want == LUA_TBOOLEAN ? "a boolean"
                                                    : "a string");
    } else if (i == LNR_HOPT_STREAM && lua_toboolean(L, -1)) {
      stream = true;
    } else if (want == LUA_TSTRING) {        /* method or body */
      method_or_body = true;
    }
    if (base > 0)
      lua_copy(L, -1, base + i);
    lua_pop(L, 1);
  }
  if (forward && method_or_body)
    lnr_opts_error(&o, "forward takes the request's method and body: give "
                   "neither");
  if (stream_body && !stream)
    lnr_opts_error(&o, "a body that is a function needs stream = true");
  return converted;
}

void lnr_http_converted(lua_State *L, int idx, int base) {
  static const int numbers[] = {LNR_HOPT_TIMEOUT, LNR_HOPT_MAX_BODY,
                                LNR_HOPT_FOLLOW};
  lnr_push_copy(L, idx);
  for (int i = 0; i < 3; i++) {
    lua_pushvalue(L, base + numbers[i]);
    lua_setfield(L, -2, options[numbers[i]].k);
  }
}

/* core.http.check_request(opts) --> opts, or a copy of it whose numeric
 * strings are numbers. */
static int l_check_request(lua_State *L) {
  lua_settop(L, 1 + LNR_HOPT_N);
  if (lnr_http_check_request(L, 1, 2))
    lnr_http_converted(L, 1, 2);
  else
    lua_settop(L, 1);
  return 1;
}

/* ---- the constructor --------------------------------------------------------------- */

static const nr_handler_t *make(lua_State *L, int idx, void **state) {
  nr_http_client_opts_t *o = luaL_checkudata(L, idx, CLASS);
  *state = nr_http_client_new(o);
  if (*state == NULL)
    luaL_error(L, CLASS ": out of memory");
  return &lua_vt;
}

/***
The HTTP/1.1 client codec (`netrun.http` pools such channels for you).
Write request tables `{ method = "GET", path = "/a?x=1", headers = {...},
body = "..." }` (Host is yours to give; Content-Length is added), and read
one table per whole response: `{ status, reason, version, headers,
trailers, body, keep_alive }` (a repeated Set-Cookie is an array).
Content-Length, chunked (trailers kept apart), bodies until the close, no
body for HEAD, 204 and 304; 1xx skipped (at most 5); a response framed by
both Content-Length and Transfer-Encoding is refused.
@function codec.http_client
@tparam[opt] table opts
@int[opt=16384] opts.max_header status line and headers, bytes
@int[opt=1048576] opts.max_body the decoded body, bytes
@int[opt=100] opts.max_headers header and trailer lines (at most 512)
@bool[opt=false] opts.raw responses as prepared responses (`netrun.http.raw_response`), for proxies
@return a codec configuration
*/

static int l_http_client(lua_State *L) {
  static const char *const keys[] = {"max_header", "max_body", "max_headers",
                                     "raw", "h2", "stream", NULL};
  lnr_opts_t t;
  lnr_opts_open(&t, L, 1, CLASS, keys, false);
  nr_http_client_opts_t o;
  o.max_header = lnr_opt_size(&t, "max_header", 16384, 64, 1 << 30);
  o.max_body = lnr_opt_size(&t, "max_body", 1 << 20, 0, LNR_OPT_SIZE_MAX);
  o.max_headers = (size_t)lnr_opt_integer(&t, "max_headers", 100, 1,
                                          NR_HTTP_MAX_HEADERS);
  o.raw = lnr_opt_boolean(&t, "raw", false);
  o.stream = lnr_opt_boolean(&t, "stream", false);
  if (o.raw && o.stream)
    lnr_opts_error(&t, "raw and stream cannot go together (a raw response "
                   "is prepared whole)");
  o.h2 = NR_H2C_OFF;           /* h2 = "auto" | true | false */
  if (!lua_isnoneornil(L, 1)) {
    int ty = lua_getfield(L, 1, "h2");
    if (ty == LUA_TSTRING && strcmp(lua_tostring(L, -1), "auto") == 0)
      o.h2 = NR_H2C_AUTO;
    else if (ty == LUA_TBOOLEAN)
      o.h2 = lua_toboolean(L, -1) ? NR_H2C_ON : NR_H2C_OFF;
    else if (ty != LUA_TNIL)
      lnr_opt_bad(&t, "h2", -1, "\"auto\", true or false");
    lua_pop(L, 1);
  }
  nr_http_client_opts_t *c = lua_newuserdatauv(L, sizeof *c, 0);
  *c = o;
  luaL_setmetatable(L, CLASS);
  return 1;
}

static int l_tostring(lua_State *L) {
  nr_http_client_opts_t *c = luaL_checkudata(L, 1, CLASS);
  lua_pushfstring(L, CLASS "{ max_header = %I, max_body = %I, "
                  "max_headers = %I, raw = %s, h2 = %s%s }",
                  (lua_Integer)c->max_header,
                  (lua_Integer)c->max_body, (lua_Integer)c->max_headers,
                  c->raw ? "true" : "false",
                  c->h2 == NR_H2C_AUTO ? "\"auto\"" : c->h2 ? "true" : "false",
                  c->stream ? ", stream = true" : "");
  return 1;
}

static void register_converter(void) {
  lnr_register_msg(NR_MSG_HTTP_REPLY, push_reply);
}

static void open_http_client(lua_State *L) {
  static pthread_once_t once = PTHREAD_ONCE_INIT;
  pthread_once(&once, register_converter);   /* every state opens this */
  lnr_native_class(L, CLASS, make, l_tostring);
  lnr_native_class(L, RAW_CLASS, raw_not_a_handler, raw_tostring);
  luaL_getmetatable(L, RAW_CLASS);
  lua_pushcfunction(L, raw_index);
  lua_setfield(L, -2, "__index");
  lua_pop(L, 1);
  luaL_getsubtable(L, -1, "codec");
  lua_pushcfunction(L, l_http_client);
  lua_setfield(L, -2, "http_client");
  lua_pop(L, 1);
  lua_getfield(L, -1, "http");                 /* made by the http row, before */
  lua_pushcfunction(L, l_check_request);
  lua_setfield(L, -2, "check_request");
  lua_pop(L, 1);
}

lnr_module_t lnr_http_client_module = {.name = "http_client", .open = open_http_client};
