/*
 * lhttp.c -- netrun.codec.http_server: the native HTTP/1.1 server codec
 * (runtime/codec/http_server.c) as Lua sees it -- its options, the
 * response tables and prepared responses it writes -- and the http
 * module's opening. The request object it hands to Lua is
 * lhttp_request.c. Loop thread only.
 *
 *   ch:pipeline():add_last("http", netrun.codec.http_server {
 *     max_header = 8192,      -- request line + headers; more: 431 and close
 *     max_body = 1 << 20,     -- decoded body; more: 413 and close
 *     max_headers = 64,       -- header + trailer lines (at most 512); more:
 *                             -- 431 and close
 *     header_timeout = 60,    -- seconds from a head's first byte to its
 *                             -- end: 408 and close (also the wait for a
 *                             -- new connection's first byte: closed
 *                             -- silently); 0 = off
 *     body_timeout = 60,      -- seconds between two reads of a body: 408
 *                             -- and close; 0 = off
 *     keepalive_timeout = 75, -- seconds an idle connection waits for its
 *                             -- next request: closed silently; 0 = off
 *     body_budget = 64 MiB,   -- request body bytes held at once by the
 *                             -- connections on one loop (from a body's
 *                             -- head to its answer); past it reading
 *                             -- waits (http_server.c); 0 = none
 *     conn_body_budget = 16 MiB, -- the same for one connection
 *   })
 * The timeouts are nginx's defaults (client_header_timeout,
 * client_body_timeout, keepalive_timeout) and time the client only: none
 * runs while a request is being answered, however slowly.
 *
 * The handler after it receives one request per message (a userdata read
 * like a table: lhttp_request.c has its fields) and answers, in request
 * order, with a table:
 *   ctx:write { status = 200, reason = "OK" (optional),
 *               headers = { ["content-type"] = "text/plain",
 *                           ["set-cookie"] = { "a=1", "b=2" } },  -- repeats
 *               body = "..." }
 * (A table written again with the same strings is sent as the prepared
 * response made of it, and with the same status and headers but another
 * body, from that response's head: lhttp_memo.c.)
 * Server, Date and Content-Length are added (a Content-Length, Server or
 * Date the user gives replaces netrun's); "Connection: close" is added and
 * the channel closed after the response when the request asked for it
 * (HTTP/1.0 without keep-alive, Connection: close) or the response carries
 * Connection: close. A HEAD request's response has its body left out.
 *
 * Streaming: a response with `stream = true` sends its headers (with
 * Transfer-Encoding: chunked; its `body`, if any, is the first chunk), then
 * every string written is one chunk, and a write of "" or false ends it:
 *   ctx:write { status = 200, stream = true }
 *   ctx:write "part 1"; ctx:write "part 2"; ctx:write_and_flush(false)
 * An HTTP/1.0 client gets the body unframed and the connection closed.
 *
 * Errors: a response table with a bad field (status not an integer, a
 * header name that is not a token, CR or LF in a value), a response with
 * no request to answer, or one written while a stream is open fails the
 * write's future and is also reported to exception_caught of the handlers
 * after the codec; nothing is sent.
 *
 * A client that pipelines requests and reads no answers: while the
 * channel is unwritable the codec reads nothing and parses no further
 * request; it goes on once the outbound buffer has drained (http_server.c,
 * nr_http_server_writability).
 *
 * Bad requests are answered by the codec itself and the channel closed
 * once the responses still owed have gone out: 400 malformed (also: an
 * HTTP/1.1 request without exactly one valid Host, Transfer-Encoding in
 * HTTP/1.0 or twice, a length past 2^63 - 1, a trailer that frames, routes
 * or authorises -- Host, Content-Length, Transfer-Encoding, ... -- see
 * http_parse.c), 413 body over max_body, 431 header block over max_header or
 * more than max_headers header lines, 501 a transfer coding other than
 * chunked, 505 an HTTP major version other than 1, 503 more than 64
 * requests unanswered at once; 408 a timeout (above). An
 * Expect: 100-continue request whose body has not arrived yet gets
 * "100 Continue" at once (clients that use it do not pipeline).
 *
 * The value netrun.codec.http_server returns is a configuration: adding it
 * to a pipeline makes a fresh codec, so one value may serve every channel
 * of a state. Like every native handler configuration it is plain bytes,
 * copied when it crosses states (an upvalue of `init`, say).
 */

/***
@module netrun
*/
#include <assert.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "lhttp_req.h"
#include "lhttp_stream.h"

#define CLASS "netrun.codec.http_server"

typedef nr_http_server_opts_t conf_t;

/* ---- interned keys ---------------------------------------------------------------- */

/* Field names, interned once per state, each kept by a registry
 * reference in a state slot: pushing one is an array read, where
 * lua_getfield with a C string pays a string-cache lookup with strcmp on
 * every call, and a table of them one more read to push it. */
enum { K_STATUS = LNR_RF_STATUS, K_REASON, K_BODY, K_STREAM, K_HEADERS,
       NKEYS };                  /* in the order of LNR_RF_* (lhttp.h) */
static const char *const key_names[NKEYS] = {
    NULL, "status", "reason", "body", "stream", "headers"};

/* Push field name k the first time (P: L's part): made, and kept in its
 * reference. */
static __attribute__((noinline)) void make_key(lua_State *L,
                                               lnr_http_part_t *P, int k) {
  lua_pushstring(L, key_names[k]);
  lua_pushvalue(L, -1);
  lnr_set_ref(L, &P->key_refs[k - K_STATUS]);
}

/* Push field name k (P: L's part). Inline: every response table pushes
 * five. */
static inline __attribute__((always_inline)) void
push_key(lua_State *L, lnr_http_part_t *P, int k) {
  int ref = P->key_refs[k - K_STATUS];
  if (ref != 0)
    lua_rawgeti(L, LUA_REGISTRYINDEX, ref);
  else
    make_key(L, P, k);
}

/* ---- responses from Lua -------------------------------------------------------- */

/* Conversion errors: the message is kept for lwrite, which reports it. */
static _Thread_local char bad_msg[256];

static int bad(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static int bad(const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(bad_msg, sizeof bad_msg, fmt, ap);
  va_end(ap);
  return -EINVAL;
}

/* Push the fields of the response table at idx, raw (a metamethod of the
 * user's runs no code here), in key order: t[k] gets each one's type.
 * Keyed reads, cheaper than a lua_next walk (measured): once the keys
 * are in their slots (all five are made on the first read), a registry
 * read and a raw get each, unrolled. */
static void read_fields(lua_State *L, int idx, lnr_http_part_t *P,
                        int t[LNR_RF_N]) {
  if (P->key_refs[K_HEADERS - K_STATUS] == 0) {
    for (int k = K_STATUS; k < NKEYS; k++) {
      push_key(L, P, k);
      t[k] = lua_rawget(L, idx);
    }
    return;
  }
  const int *ref = P->key_refs - K_STATUS;
#define FIELD(k) (lua_rawgeti(L, LUA_REGISTRYINDEX, ref[k]), \
                  t[k] = lua_rawget(L, idx))
  FIELD(K_STATUS);
  FIELD(K_REASON);
  FIELD(K_BODY);
  FIELD(K_STREAM);
  FIELD(K_HEADERS);
#undef FIELD
}

/* Fill r from the fields read_fields left at base (types t; values left
 * on the stack). */
static int to_response(lua_State *L, int base, const int *t,
                       nr_http_response_t *r, lnr_hdrs_t *h) {
  if (lua_isinteger(L, base + K_STATUS))
    r->status = (int)lua_tointeger(L, base + K_STATUS);
  else if (t[K_STATUS] != LUA_TNIL)
    return bad("http response: status must be an integer, got a %s",
               lua_typename(L, t[K_STATUS]));
  if (t[K_REASON] == LUA_TSTRING)
    r->reason = lua_tostring(L, base + K_REASON);
  if (t[K_BODY] == LUA_TSTRING || t[K_BODY] == LUA_TNUMBER)
    r->body = lua_tolstring(L, base + K_BODY, &r->body_len);  /* converts
                                        the copy, which stays on the stack */
  else if (t[K_BODY] != LUA_TNIL)
    return bad("http response: body must be a string, got a %s",
               lua_typename(L, t[K_BODY]));
  if (t[K_STREAM] != LUA_TNIL)
    r->stream = lua_toboolean(L, base + K_STREAM);
  if (t[K_HEADERS] == LUA_TTABLE) {
    char err[sizeof bad_msg - 16];
    int rc = lnr_collect_headers(L, base + K_HEADERS, h, err, sizeof err);
    if (rc == -ENOMEM)
      return nr_raise(rc, "http response: %s", err);
    if (rc)
      return bad("http response: %s", err);
    r->headers = h->v;
    r->nheaders = h->n;
  } else if (t[K_HEADERS] != LUA_TNIL) {
    return bad("http response: headers must be a table, got a %s",
               lua_typename(L, t[K_HEADERS]));
  }
  return 0;
}

/* ---- prepared responses ---------------------------------------------------------- */

/* netrun.codec.http_response { status, reason, headers, body }: a response
 * whose table is read, checked and encoded once (nr_http_prepare); writing
 * it copies its bytes, adding Date and Connection as the request needs and
 * leaving the body out for HEAD. It is plain bytes, so it crosses states
 * like a handler configuration. It is a native message (lnr.h): written,
 * it goes to the pipeline as the prepared response itself. */
#define RESP_CLASS "netrun.codec.http_response"

static const nr_http_prepared_t *to_prepared(lua_State *L, int idx) {
  const nr_http_prepared_t *pr = lnr_to_native(L, idx);
  return pr && pr->type == NR_MSG_HTTP_PREPARED ? pr : NULL;
}

static size_t prepared_size(const nr_http_prepared_t *pr) {
  return sizeof *pr + pr->head_len + 2 + pr->body_len;
}

/* A prepared response that a Lua handler is to see (an outbound handler
 * between the writer and the codec): a copy. */
static void push_prepared(lua_State *L, void *msg) {
  const nr_http_prepared_t *pr = msg;
  lnr_native_t *h = lua_newuserdatauv(L, sizeof *h + prepared_size(pr), 0);
  h->tag = &lnr_native_tag;
  h->pad = NULL;
  memcpy(h + 1, pr, prepared_size(pr));
  luaL_setmetatable(L, RESP_CLASS);
}

static const nr_handler_t *not_a_handler(lua_State *L, int idx, void **state) {
  (void)idx;
  (void)state;
  luaL_error(L, RESP_CLASS ": a response to write, not a handler");
  return NULL;
}

/***
Codecs: `netrun.codec`.
@section codec
*/

/***
A prepared HTTP response: encoded once, written many times
(`ctx:write(hello, VOID)` copies its bytes and adds Date). Not streamed;
the body is at most 2 GiB.
@function codec.http_response
@tparam table res a response table, as a handler writes
@int[opt=200] res.status the status code (100..999)
@string[opt] res.reason the reason phrase
@tparam[opt] table res.headers header fields (lower-case names; an array value repeats the field)
@string[opt=""] res.body the body
@return a prepared response (a bad field raises)
@usage local hello = netrun.codec.http_response { body = "Hello, World!",
  headers = { ["content-type"] = "text/plain" } }
*/

static int l_http_response(lua_State *L) {
  luaL_checktype(L, 1, LUA_TTABLE);
  nr_http_response_t r = {.type = NR_MSG_HTTP_RESPONSE, .status = 200,
                          .body = ""};
  lnr_hdrs_t h;
  lnr_hdrs_init(&h, L);
  int t[LNR_RF_N], base = lua_gettop(L);
  read_fields(L, 1, h.P, t);
  int rc = to_response(L, base, t, &r, &h);
  if (rc == 0 && r.stream)
    rc = bad("http response: a prepared response cannot be streamed");
  if (rc == 0 && (r.status < 100 || r.status > 999))
    rc = bad("http response: status %d is not in 100..999", r.status);
  if (rc == 0 && r.body_len > UINT32_MAX / 2)
    rc = bad("http response: a prepared body is limited to 2 GiB");
  if (rc != 0) {
    lnr_hdrs_free(&h);
    return luaL_error(L, RESP_CLASS ": %s",
                      rc == -EINVAL ? bad_msg : "out of memory");
  }
  size_t n = nr_http_prepared_size(&r);
  lnr_native_t *pr = lua_newuserdatauv(L, sizeof *pr + n, 0);
  pr->tag = &lnr_native_tag;
  pr->pad = NULL;
  nr_http_prepare(&r, (nr_http_prepared_t *)(pr + 1));
  lnr_hdrs_free(&h);
  luaL_setmetatable(L, RESP_CLASS);
  return 1;
}

static int resp_tostring(lua_State *L) {
  const nr_http_prepared_t *pr = to_prepared(L, 1);
  lua_pushfstring(L, RESP_CLASS " (%d, %d bytes of body)",
                  pr ? pr->status : 0, pr ? (int)pr->body_len : 0);
  return 1;
}

/* The codec's write behind a Lua front: response tables are converted,
 * false ends a stream, everything else goes to the core as it is. */
static int lwrite(nr_ctx_t *ctx, void *msg, nr_promise_t *p) {
  if (nr_msg_type(msg) != NR_MSG_LUA)
    return nr_http_server_write(ctx, msg, p);
  const lnr_lmsg_t *m = msg;
  lua_State *L = m->L;
  int type = lua_type(L, m->idx);
  if (type == LUA_TBOOLEAN && !lua_toboolean(L, m->idx)) {
    nr_bytes_t end = NR_BYTES("", 0);
    return nr_http_server_write(ctx, &end, p);
  }
  if (type != LUA_TTABLE)
    return nr_http_server_write(ctx, msg, p);
  int top = lua_gettop(L);
  if (!lua_checkstack(L, 20))      /* the fields' 5, collect_headers' 5 */
    return nr_raise(-ENOMEM, "http response: Lua stack overflow");
  lnr_http_part_t *P = lnr_http_part(L);
  int t[LNR_RF_N];
  read_fields(L, m->idx, P, t);
  const nr_http_prepared_t *pr;
  if (P->memo != NULL && (pr = lnr_http_memo_hit(L, P->memo, top, t)) != NULL) {
    int rc = nr_http_server_write(ctx, (void *)pr, p);
    lua_settop(L, top);
    return rc;
  }
  nr_http_response_t r = {.type = NR_MSG_HTTP_RESPONSE, .status = 200};
  lnr_hdrs_t h;
  lnr_hdrs_start(&h, P);
  int rc = to_response(L, top, t, &r, &h);
  if (rc == -EINVAL) {
    char msg[sizeof bad_msg];
    memcpy(msg, bad_msg, sizeof msg);
    nr_err_t err = {rc, msg};
    if (p != NULL)           /* without one, the pipeline reports the error */
      nr_ctx_fire_exception(ctx, &err);
    rc = nr_raise(rc, "%s", msg);
  } else if (rc == 0) {
    lnr_http_memo_note(L, P, top, t, &r);
    rc = nr_http_server_write(ctx, &r, p);
  }
  lnr_hdrs_free(&h);
  lua_settop(L, top);
  return rc;
}

static const nr_handler_t lua_http_vt = {
    .type = "http_server", .added = nr_http_server_added,
    .removed = nr_http_server_removed, .active = nr_http_server_active,
    .inactive = nr_http_server_inactive,
    .channel_read = nr_http_server_channel_read,
    .read_failed = nr_http_server_read_failed,
    .writability_changed = nr_http_server_writability,
    .read = nr_http_server_read,
    .user_event = nr_http_server_user_event,
    .write = lwrite, .flags = NR_HANDLER_SYNC_WRITE};

/* ---- the constructor ------------------------------------------------------------ */

static const nr_handler_t *make(lua_State *L, int idx, void **state) {
  conf_t *c = luaL_checkudata(L, idx, CLASS);
  nr_http_server_t *s = nr_http_server_new(c);
  if (s == NULL)
    luaL_error(L, "netrun.codec.http_server: out of memory");
  *state = s;
  return &lua_http_vt;
}

/***
The HTTP/1.1 server codec. The handler after it reads one request per
message -- a userdata read like a table whose fields are made when first
read: `method`, `path` (normalized: match on it), `target` (as it came),
`query`, `args` (the query decoded; a repeated key gives an array),
`version`, `headers` (lower-case names; repeats joined with ", "),
`trailers`, `body`, `keep_alive` -- and answers each, in request order, by
writing (or returning from `channel_read`) a response table
`{ status = 200, reason, headers = {...}, body = "..." }` or a
`codec.http_response`. Server, Date and Content-Length are added; with
`stream = true` the response is chunked: each string written next is a
chunk, and `""` or `false` ends it. A request over a limit is answered by
the codec (413, 431, 408) and the connection closed.
@function codec.http_server
@tparam[opt] table opts
@int[opt=8192] opts.max_header request line and headers, bytes
@int[opt=1048576] opts.max_body the decoded body, bytes
@int[opt=64] opts.max_headers header and trailer lines (at most 512)
@number[opt=60] opts.header_timeout seconds for a head, from its first byte (0: off)
@number[opt=60] opts.body_timeout seconds between two reads of a body (0: off)
@number[opt=75] opts.keepalive_timeout seconds an idle connection waits for its next request (0: off)
@int[opt=67108864] opts.body_budget request body bytes held at once by one loop's connections (0: none)
@int[opt=16777216] opts.conn_body_budget the same for one connection
@return a codec configuration
@usage ch:pipeline():add_last("http", netrun.codec.http_server { max_body = 1 << 20 })
*/

static int l_http_server(lua_State *L) {
  static const char *const keys[] = {
      "max_header", "max_body", "max_headers", "header_timeout",
      "body_timeout", "keepalive_timeout", "body_budget", "conn_body_budget",
      "h2", "h2_max_streams", "h2_window", "h2_reset_burst", "h2_reset_rate",
      "h2_flood_burst", "h2_flood_rate", "h2_max_continuations",
      "h2_send_timeout", "body", NULL};
  lnr_opts_t t;
  lnr_opts_open(&t, L, 1, "netrun.codec.http_server", keys, false);
  conf_t o;
  o.max_header = lnr_opt_size(&t, "max_header", 8192, 64, 1 << 30);
  o.max_body = lnr_opt_size(&t, "max_body", 1 << 20, 0, LNR_OPT_SIZE_MAX);
  o.max_headers = (size_t)lnr_opt_integer(&t, "max_headers",
                                          NR_HTTP_DEFAULT_MAX_HEADERS, 1,
                                          NR_HTTP_MAX_HEADERS);
  /* timeouts: 0 turns one off */
  o.header_timeout = lnr_opt_seconds(&t, "header_timeout",
                                     NR_HTTP_HEADER_TIMEOUT);
  o.body_timeout = lnr_opt_seconds(&t, "body_timeout", NR_HTTP_BODY_TIMEOUT);
  o.keepalive_timeout = lnr_opt_seconds(&t, "keepalive_timeout",
                                        NR_HTTP_KEEPALIVE_TIMEOUT);
  /* bytes of request bodies held at once, per loop and per connection */
  o.body_budget = lnr_opt_size(&t, "body_budget", (size_t)64 << 20, 0,
                               (size_t)1 << 50);
  o.conn_body_budget = lnr_opt_size(&t, "conn_body_budget", (size_t)16 << 20,
                                    0, (size_t)1 << 50);
  o.h2 = lnr_opt_boolean(&t, "h2", true);
  nr_h2_opts_t *h = &o.h2o;
  h->max_streams = (uint32_t)lnr_opt_integer(&t, "h2_max_streams",
                                             NR_H2_MAX_STREAMS, 1, 1 << 16);
  h->window = (uint32_t)lnr_opt_size(&t, "h2_window", NR_H2_WINDOW, 1024,
                                     (1u << 31) - 1);
  h->reset_burst = (uint32_t)lnr_opt_integer(&t, "h2_reset_burst",
                                             NR_H2_RESET_BURST, 1, 1 << 30);
  h->reset_rate = (uint32_t)lnr_opt_integer(&t, "h2_reset_rate",
                                            NR_H2_RESET_RATE, 1, 1 << 30);
  h->flood_burst = (uint32_t)lnr_opt_integer(&t, "h2_flood_burst",
                                             NR_H2_FLOOD_BURST, 1, 1 << 30);
  h->flood_rate = (uint32_t)lnr_opt_integer(&t, "h2_flood_rate",
                                            NR_H2_FLOOD_RATE, 1, 1 << 30);
  h->max_continuations = (uint32_t)lnr_opt_integer(
      &t, "h2_max_continuations", NR_H2_MAX_CONTINUATIONS, 1, 1024);
  h->send_timeout = lnr_opt_seconds(&t, "h2_send_timeout", NR_H2_SEND_TIMEOUT);
  o.stream_bodies = lnr_http_body_option(L, "netrun.codec.http_server");
  conf_t *c = lua_newuserdatauv(L, sizeof *c, 0);
  *c = o;
  luaL_setmetatable(L, CLASS);
  return 1;
}

static int l_tostring(lua_State *L) {
  conf_t *c = luaL_checkudata(L, 1, CLASS);
  char b[448];
  snprintf(b, sizeof b, CLASS "{ %smax_header = %zu, max_body = %zu, "
           "body_budget = %llu, conn_body_budget = %llu, "
           "max_headers = %zu, header_timeout = %g, body_timeout = %g, "
           "keepalive_timeout = %g, h2 = %s, h2_max_streams = %u }",
           c->stream_bodies ? "body = \"stream\", " : "", c->max_header,
           c->max_body,
           (unsigned long long)c->body_budget,
           (unsigned long long)c->conn_body_budget, c->max_headers,
           (double)c->header_timeout / 1e9, (double)c->body_timeout / 1e9,
           (double)c->keepalive_timeout / 1e9,
           c->h2 ? "true" : "false", c->h2o.max_streams);
  lua_pushstring(L, b);
  return 1;
}

static void register_converter(void) {
  lnr_register_msg(NR_MSG_HTTP_REQUEST, lnr_http_push_request);
  lnr_register_msg(NR_MSG_HTTP_PREPARED, push_prepared);
  lnr_http_stream_register();
}

static void open_http(lua_State *L) {
  static pthread_once_t once = PTHREAD_ONCE_INIT;
  pthread_once(&once, register_converter);   /* every state opens this */
  lnr_http_request_class_open(L);
  lnr_native_class(L, RESP_CLASS, not_a_handler, resp_tostring);
  lnr_native_class(L, CLASS, make, l_tostring);
  luaL_getsubtable(L, -1, "codec");
  lua_pushcfunction(L, l_http_server);
  lua_setfield(L, -2, "http_server");
  lua_pushcfunction(L, l_http_response);
  lua_setfield(L, -2, "http_response");
  lua_pop(L, 1);
  lua_newtable(L);                             /* core.http */
  lua_pushcfunction(L, lnr_http_unescape);
  lua_setfield(L, -2, "unescape");
  lua_setfield(L, -2, "http");
}

lnr_module_t lnr_http_module = {
    .name = "http", .open = open_http, .part_size = sizeof(lnr_http_part_t)};
