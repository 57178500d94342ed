/*
 * lhttp.c -- netrun.codec.http_server: the native HTTP/1.1 server codec
 * (runtime/codec/http.c) as Lua sees it. Loop thread only.
 *
 *   ch:pipeline():add_last("http", netrun.codec.http_server {
 *     max_header = 8192,      -- request line + headers; more: 431 and close
 *     max_body = 1 << 20,     -- decoded body; more: 413 and close
 *   })
 *
 * The handler after it receives one table per request:
 *   { method = "GET", path = "/a", query = "x=1" (nil without '?'),
 *     version = "HTTP/1.1", headers = { host = "..." } (names lowercased,
 *     repeated fields joined with ", ", chunked trailers included),
 *     body = "" , keep_alive = true }
 * and answers, in request order, with a table:
 *   ctx:write { status = 200, reason = "OK" (optional),
 *               headers = { ["content-type"] = "text/plain",
 *                           ["set-cookie"] = { "a=1", "b=2" } },  -- repeats
 *               body = "..." }
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
 * Bad requests are answered by the codec itself and the channel closed
 * once the responses still owed have gone out: 400 malformed, 413 body over
 * max_body, 431 header block over max_header or more than 64 header lines,
 * 501 a transfer coding other than chunked, 505 an HTTP major version
 * other than 1, 503 more than 64 requests unanswered at once. An
 * Expect: 100-continue request whose body has not arrived yet gets
 * "100 Continue" at once (clients that use it do not pipeline).
 *
 * The value netrun.codec.http_server returns is a configuration: adding it
 * to a pipeline makes a fresh codec, so one value may serve every channel
 * of a state. Like every native handler configuration it is plain bytes,
 * copied when it crosses states (an upvalue of `init`, say).
 */
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "codec/http.h"
#include "lnr.h"

#define CLASS "netrun.codec.http_server"

typedef struct conf_s {
  size_t max_header, max_body;
} conf_t;

/* ---- interned keys ---------------------------------------------------------------- */

/* Field names, interned once per state and kept in a registry array:
 * lua_setfield with a C string pays a string-cache lookup with strcmp on
 * every call, a raw array read does not. */
enum { K_METHOD = 1, K_PATH, K_QUERY, K_VERSION, K_HEADERS, K_BODY,
       K_KEEP_ALIVE, K_HTTP11, K_HTTP10, K_STATUS, K_REASON, K_STREAM, NKEYS };
static const char *const key_names[NKEYS] = {
    NULL, "method", "path", "query", "version", "headers", "body",
    "keep_alive", "HTTP/1.1", "HTTP/1.0", "status", "reason", "stream"};
static const char KEYS = 0;

/* Push the key array; returns its stack index. */
static int push_keys(lua_State *L) {
  if (lua_rawgetp(L, LUA_REGISTRYINDEX, &KEYS) != LUA_TTABLE) {
    lua_pop(L, 1);
    lua_createtable(L, NKEYS, 0);
    for (int i = 1; i < NKEYS; i++) {
      lua_pushstring(L, key_names[i]);
      lua_rawseti(L, -2, i);
    }
    lua_pushvalue(L, -1);
    lua_rawsetp(L, LUA_REGISTRYINDEX, &KEYS);
  }
  return lua_gettop(L);
}

/* ---- requests to Lua ---------------------------------------------------------- */

static bool same_name(const nr_http_header_t *a, const nr_http_header_t *b) {
  if (a->name_len != b->name_len)
    return false;
  for (size_t i = 0; i < a->name_len; i++) {
    int x = (unsigned char)a->name[i], y = (unsigned char)b->name[i];
    if ((x | 0x20) != (y | 0x20))    /* names are tokens: ASCII only */
      return false;
  }
  return true;
}

static void push_lower(lua_State *L, const char *s, size_t n) {
  char small[128];
  char *b = n <= sizeof small ? small : malloc(n);
  if (b == NULL) {
    lua_pushlstring(L, s, n);
    return;
  }
  for (size_t i = 0; i < n; i++)
    b[i] = s[i] >= 'A' && s[i] <= 'Z' ? (char)(s[i] + 32) : s[i];
  lua_pushlstring(L, b, n);
  if (b != small)
    free(b);
}

/* headers = { name = value }: lowercased, repeats joined with ", ". */
static void push_headers(lua_State *L, const nr_http_request_t *r) {
  lua_createtable(L, 0, (int)r->nheaders);
  for (size_t i = 0; i < r->nheaders; i++) {
    const nr_http_header_t *h = &r->headers[i];
    bool seen = false, repeated = false;   /* before i, after i */
    for (size_t j = 0; j < r->nheaders; j++) {
      if (j == i || !same_name(h, &r->headers[j]))
        continue;
      if (j < i) {
        seen = true;
        break;
      }
      repeated = true;
    }
    if (seen)
      continue;              /* joined when its first occurrence was */
    push_lower(L, h->name, h->name_len);
    if (!repeated) {
      lua_pushlstring(L, h->value, h->value_len);
    } else {
      luaL_Buffer b;
      luaL_buffinit(L, &b);
      luaL_addlstring(&b, h->value, h->value_len);
      for (size_t j = i + 1; j < r->nheaders; j++)
        if (same_name(h, &r->headers[j])) {
          luaL_addlstring(&b, ", ", 2);
          luaL_addlstring(&b, r->headers[j].value, r->headers[j].value_len);
        }
      luaL_pushresult(&b);
    }
    lua_rawset(L, -3);
  }
}

static void push_request(lua_State *L, void *msg) {
  const nr_http_request_t *r = msg;
  int kt = push_keys(L);
  lua_createtable(L, 0, 8);
  lua_rawgeti(L, kt, K_METHOD);
  lua_pushlstring(L, r->method, r->method_len);
  lua_rawset(L, -3);
  lua_rawgeti(L, kt, K_PATH);
  lua_pushlstring(L, r->path, r->path_len);
  lua_rawset(L, -3);
  if (r->query) {
    lua_rawgeti(L, kt, K_QUERY);
    lua_pushlstring(L, r->query, r->query_len);
    lua_rawset(L, -3);
  }
  lua_rawgeti(L, kt, K_VERSION);
  lua_rawgeti(L, kt, r->minor ? K_HTTP11 : K_HTTP10);
  lua_rawset(L, -3);
  lua_rawgeti(L, kt, K_HEADERS);
  push_headers(L, r);
  lua_rawset(L, -3);
  lua_rawgeti(L, kt, K_BODY);
  lua_pushlstring(L, r->body, r->body_len);
  lua_rawset(L, -3);
  lua_rawgeti(L, kt, K_KEEP_ALIVE);
  lua_pushboolean(L, r->keep_alive);
  lua_rawset(L, -3);
  lua_replace(L, kt);           /* the request where the keys were */
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

typedef struct hdrs_s {
  nr_http_header_t small[32], *v;
  size_t n, cap;
  char nums[512];              /* numeric values formatted here */
  size_t nums_used;
} hdrs_t;

/* The string value at idx (anchored by its table); a number is formatted
 * into h->nums, so converting it allocates nothing. NULL if it is
 * neither (or the arena is full). */
static const char *field_string(lua_State *L, int idx, size_t *len,
                                hdrs_t *h) {
  int t = lua_type(L, idx);
  if (t == LUA_TSTRING)
    return lua_tolstring(L, idx, len);
  if (t != LUA_TNUMBER)
    return NULL;
  char *b = h->nums + h->nums_used;
  size_t room = sizeof h->nums - h->nums_used;
  int n = lua_isinteger(L, idx)
              ? snprintf(b, room, LUA_INTEGER_FMT, lua_tointeger(L, idx))
              : snprintf(b, room, LUA_NUMBER_FMT, lua_tonumber(L, idx));
  if (n < 0 || (size_t)n >= room)
    return NULL;
  h->nums_used += (size_t)n;
  *len = (size_t)n;
  return b;
}

static int add_header(hdrs_t *h, const char *name, size_t nl, const char *val,
                      size_t vl) {
  if (!nr_http_is_token(name, nl))
    return bad("http response: header name '%.*s' is not a "
                    "token", (int)(nl > 64 ? 64 : nl), name);
  if (!nr_http_is_field_value(val, vl))
    return bad("http response: the value of header '%.*s' "
                    "contains a control character", (int)(nl > 64 ? 64 : nl),
                    name);
  if (h->n == h->cap) {
    size_t cap = h->cap * 2;
    nr_http_header_t *v = h->v == h->small ? malloc(cap * sizeof *v)
                                           : realloc(h->v, cap * sizeof *v);
    if (v == NULL)
      return nr_raise(-ENOMEM, "http response: out of memory");
    if (h->v == h->small)
      memcpy(v, h->small, sizeof h->small);
    h->v = v;
    h->cap = cap;
  }
  h->v[h->n++] = (nr_http_header_t){name, val, nl, vl};
  return 0;
}

/* Collect the headers table at idx. Strings stay anchored by the table. */
static int collect_headers(lua_State *L, int idx, hdrs_t *h) {
  if (!lua_checkstack(L, 8))
    return nr_raise(-ENOMEM, "http response: Lua stack overflow");
  lua_pushnil(L);
  while (lua_next(L, idx)) {
    size_t nl, vl;
    if (lua_type(L, -2) != LUA_TSTRING)
      return bad("http response: header names must be "
                      "strings, got a %s", luaL_typename(L, -2));
    const char *name = lua_tolstring(L, -2, &nl), *val;
    int rc = 0;
    if (lua_type(L, -1) == LUA_TTABLE) {   /* repeated: { "a=1", "b=2" } */
      size_t n = lua_rawlen(L, -1);
      for (size_t i = 1; rc == 0 && i <= n; i++) {
        lua_rawgeti(L, -1, (lua_Integer)i);
        val = field_string(L, lua_gettop(L), &vl, h);
        rc = val ? add_header(h, name, nl, val, vl)
                 : bad("http response: header '%s' value %d "
                            "is a %s", name, (int)i, luaL_typename(L, -1));
        lua_pop(L, 1);
      }
    } else if ((val = field_string(L, lua_gettop(L), &vl, h)) != NULL) {
      rc = add_header(h, name, nl, val, vl);
    } else {
      rc = bad("http response: header '%s' is a %s, not a "
                    "string", name, luaL_typename(L, -1));
    }
    if (rc)
      return rc;             /* the caller restores the stack */
    lua_pop(L, 1);
  }
  return 0;
}

static int raw_field(lua_State *L, int idx, int kt, int k) {
  lua_rawgeti(L, kt, k);
  return lua_rawget(L, idx);
}

/* Fill r from the response table at idx (values left on the stack). Raw
 * reads with interned keys: cheaper than a lua_next walk (measured). */
static int to_response(lua_State *L, int idx, nr_http_response_t *r,
                       hdrs_t *h) {
  int kt = push_keys(L);
  int t = raw_field(L, idx, kt, K_STATUS);
  if (t == LUA_TNUMBER && lua_isinteger(L, -1))
    r->status = (int)lua_tointeger(L, -1);
  else if (t != LUA_TNIL)
    return bad("http response: status must be an integer, got a %s",
               luaL_typename(L, -1));
  t = raw_field(L, idx, kt, K_REASON);
  if (t == LUA_TSTRING)
    r->reason = lua_tostring(L, -1);
  t = raw_field(L, idx, kt, K_BODY);
  if (t == LUA_TSTRING || t == LUA_TNUMBER)
    r->body = lua_tolstring(L, -1, &r->body_len);  /* converts the copy,
                                                      which stays on the stack */
  else if (t != LUA_TNIL)
    return bad("http response: body must be a string, got a %s",
               luaL_typename(L, -1));
  raw_field(L, idx, kt, K_STREAM);
  r->stream = lua_toboolean(L, -1);
  t = raw_field(L, idx, kt, K_HEADERS);
  if (t == LUA_TTABLE) {
    int rc = collect_headers(L, lua_gettop(L), h);
    if (rc)
      return rc;
    r->headers = h->v;
    r->nheaders = h->n;
  } else if (t != LUA_TNIL) {
    return bad("http response: headers must be a table, got a %s",
               luaL_typename(L, -1));
  }
  return 0;
}

/* The codec's write behind a Lua front: response tables are converted,
 * false ends a stream, everything else goes to the core as it is. */
static int lwrite(nr_ctx_t *ctx, void *msg, nr_promise_t *p) {
  if (nr_msg_type(msg) != NR_MSG_LUA)
    return nr_http_server_write(ctx, msg, p);
  const lnr_lmsg_t *m = msg;
  lua_State *L = m->L;
  int t = lua_type(L, m->idx);
  if (t == LUA_TBOOLEAN && !lua_toboolean(L, m->idx)) {
    nr_bytes_t end = NR_BYTES("", 0);
    return nr_http_server_write(ctx, &end, p);
  }
  if (t != LUA_TTABLE)
    return nr_http_server_write(ctx, msg, p);
  int top = lua_gettop(L);
  if (!lua_checkstack(L, 12))
    return nr_raise(-ENOMEM, "http response: Lua stack overflow");
  nr_http_response_t r = {.type = NR_MSG_HTTP_RESPONSE, .status = 200};
  hdrs_t h;
  h.v = h.small;
  h.n = 0;
  h.cap = sizeof h.small / sizeof h.small[0];
  h.nums_used = 0;
  int rc = to_response(L, m->idx, &r, &h);
  if (rc == -EINVAL) {
    char msg[sizeof bad_msg];
    memcpy(msg, bad_msg, sizeof msg);
    nr_err_t err = {rc, msg};
    if (p != NULL)           /* without one, the pipeline reports the error */
      nr_ctx_fire_exception(ctx, &err);
    rc = nr_raise(rc, "%s", msg);
  } else if (rc == 0) {
    rc = nr_http_server_write(ctx, &r, p);
  }
  if (h.v != h.small)
    free(h.v);
  lua_settop(L, top);
  return rc;
}

static const nr_handler_t lua_http_vt = {
    .type = "http_server", .added = nr_http_server_added,
    .removed = nr_http_server_removed, .read = nr_http_server_read,
    .write = lwrite, .flags = NR_HANDLER_SYNC_WRITE};

/* ---- the constructor ------------------------------------------------------------ */

static const nr_handler_t *make(lua_State *L, int idx, void **state) {
  conf_t *c = luaL_checkudata(L, idx, CLASS);
  nr_http_server_t *s = nr_http_server_new(c->max_header, c->max_body);
  if (s == NULL)
    luaL_error(L, "netrun.codec.http_server: out of memory");
  *state = s;
  return &lua_http_vt;
}

static size_t opt_size(lua_State *L, const char *k, lua_Integer d,
                       lua_Integer min) {
  if (lua_isnoneornil(L, 1))
    return (size_t)d;
  lua_getfield(L, 1, k);
  lua_Integer v = d;
  if (!lua_isnil(L, -1)) {
    if (!lua_isinteger(L, -1))
      luaL_error(L, "netrun.codec.http_server: %s must be an integer, got "
                 "a %s", k, luaL_typename(L, -1));
    v = lua_tointeger(L, -1);
    if (v < min)
      luaL_error(L, "netrun.codec.http_server: %s must be at least %d, got "
                 "%d", k, (int)min, (int)v);
  }
  lua_pop(L, 1);
  return (size_t)v;
}

static int l_http_server(lua_State *L) {
  if (!lua_isnoneornil(L, 1))
    luaL_checktype(L, 1, LUA_TTABLE);
  size_t mh = opt_size(L, "max_header", 8192, 64);
  size_t mb = opt_size(L, "max_body", 1 << 20, 0);
  conf_t *c = lua_newuserdatauv(L, sizeof *c, 0);
  c->max_header = mh;
  c->max_body = mb;
  luaL_setmetatable(L, CLASS);
  return 1;
}

static int l_tostring(lua_State *L) {
  conf_t *c = luaL_checkudata(L, 1, CLASS);
  lua_pushfstring(L, CLASS "{ max_header = %d, max_body = %d }",
                  (int)c->max_header, (int)c->max_body);
  return 1;
}

static void register_converter(void) {
  lnr_register_msg(NR_MSG_HTTP_REQUEST, push_request);
}

void lnr_open_http(lua_State *L) {
  static pthread_once_t once = PTHREAD_ONCE_INIT;
  pthread_once(&once, register_converter);   /* every state opens this */
  if (luaL_newmetatable(L, CLASS)) {
    lua_pushlightuserdata(L, (void *)(uintptr_t)make);
    lua_setfield(L, -2, "__netrun_native");
    lua_pushcfunction(L, l_tostring);
    lua_setfield(L, -2, "__tostring");
  }
  lua_pop(L, 1);
  lua_getfield(L, -1, "codec");
  lua_pushcfunction(L, l_http_server);
  lua_setfield(L, -2, "http_server");
  lua_pop(L, 1);
}
