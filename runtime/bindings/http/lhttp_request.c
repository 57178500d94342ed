/*
 * lhttp_request.c -- the request object of netrun.codec.http_server as
 * Lua sees it: the converter that turns the codec's
 * parsed head into a userdata, its fields made when read, the decoded
 * query (req.args, netrun.http.unescape), and the request class's
 * metamethods. lhttp.c registers the converter and opens the class.
 * Loop thread only; this is on every request's path, so the field reads
 * stay inlined within this file.
 *
 * The handler after it receives one request per message, read like a table:
 *   req.method "GET", req.path "/a", req.query "x=1" (nil without '?'),
 *   req.target "/a?x=1" (the request-target as it came; req.path is what
 *   to match on: an absolute-form target's path -- "GET
 *   http://a.example/x" is "/x", its Host then a.example -- normalized:
 *   dot segments resolved, "//" merged, %XX of an unreserved byte
 *   decoded, other %XX in upper case; a path that climbs above the root
 *   is refused with 400, see http_target.c's normalize_path),
 *   req.args { x = "1" } (the query decoded: + and %XX; a repeated key
 *   gives an array of its values, a key without '=' true),
 *   req.version "HTTP/1.1", req.headers { host = "..." } (names lowercased,
 *   repeated fields joined with ", "), req.trailers { ... } (a chunked
 *   body's trailer fields, the same way; {} when none: they are never
 *   merged into req.headers), req.body "" , req.keep_alive true
 * It is a userdata whose fields are made when read (see "requests to Lua"
 * below); assignments to it are kept, pairs() walks it, and it crosses to
 * other states as a plain table.
 */
#include <assert.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "lhttp_req.h"
#include "lhttp_stream.h"

/* ---- requests to Lua ---------------------------------------------------------- */

/* A request reaches Lua as a userdata holding a copy of its parsed head
 * (offsets into one block of text) and its body as
 * a user value. Its fields are made when they are read, so a handler that
 * reads none pays one allocation per request, not two tables and a string
 * per field. The headers table is made on first use and kept; fields the
 * handler assigns are kept in a table beside it (user value 2), which
 * reads see first. pairs() walks all of them; a request sent to another
 * state (a submit, a shared.dict, a handler on an executor group) crosses
 * as a plain table with the same fields. */
const char lnr_http_req_tag = 0;

bool lnr_http_is_request(lua_State *L, int idx) {
  const req_t *q = lua_touserdata(L, idx);  /* a light one has length 0 */
  return q != NULL && lua_rawlen(L, idx) >= sizeof *q && q->tag == &REQ_TAG;
}

uint64_t lnr_http_request_token(lua_State *L, int idx, const void *p) {
  if (!lnr_http_is_request(L, idx))
    return 0;
  const req_t *q = lua_touserdata(L, idx);
  return q->pipe == p ? q->token : 0;
}

/* The request that is argument 1 of a metamethod (one fetched with
 * getmetatable may be called with anything). */
static const req_t *check_req(lua_State *L) {
  const req_t *q = lua_touserdata(L, 1);    /* a light one has length 0 */
  if (q == NULL || lua_rawlen(L, 1) < sizeof *q || q->tag != &REQ_TAG)
    luaL_typeerror(L, 1, REQ_CLASS);
  return q;
}

/* The codec parses a head in place, so every field of a request without
 * trailers lies in one block, in order, from its method to the end of its
 * last header. That block is copied whole -- one memcpy however many
 * headers -- and the fields kept as offsets into it. A chunked request's
 * trailers lie past its body: its fields are copied one by one. */
#ifndef NDEBUG
static bool in_block(const char *base, size_t span, const char *s, size_t n) {
  uintptr_t off = (uintptr_t)s - (uintptr_t)base;   /* huge if s < base */
  return n == 0 || (off <= span && n <= span - off);
}

static bool all_in_block(const nr_http_request_t *r, size_t span) {
  if (!in_block(r->method, span, r->path, r->path_len) ||
      !in_block(r->method, span, r->query, r->query_len) ||
      !in_block(r->method, span, r->target, r->target_len))
    return false;
  for (size_t i = 0; i < r->nheaders; i++)
    if (!in_block(r->method, span, r->headers[i].name, r->headers[i].name_len) ||
        !in_block(r->method, span, r->headers[i].value, r->headers[i].value_len))
      return false;
  return true;
}
#endif

/* The length of the block holding every field, or 0 (a normalized path,
 * a Host added, trailers past the body: copied one by one). */
static size_t head_block(const nr_http_request_t *r) {
  if (r->chunked || r->rewritten || r->ntrailers > 0)
    return 0;
  assert(r->ntrailers == 0);
  const char *end = r->query ? r->query + r->query_len : r->path + r->path_len;
  if (r->nheaders > 0)
    end = r->headers[r->nheaders - 1].value + r->headers[r->nheaders - 1].value_len;
  size_t span = (size_t)(end - r->method);
  assert(span <= UINT32_MAX && all_in_block(r, span));
  return span;
}

/* Copy field s[0 .. n) to the text at q: its offset. */
static uint32_t put_text(req_t *q, uint32_t *off, const char *s, size_t n) {
  if (n == 0)                  /* s may be NULL then (no query) */
    return 0;
  uint32_t at = *off;
  memcpy((char *)req_text(q) + at, s, n);
  *off += (uint32_t)n;
  return at;
}

/* The request's metatable and body, once its fields are in place. */
static void request_done(lua_State *L, const nr_http_request_t *r) {
  if (r->streaming) {          /* (rare: a class with __gc of its own) */
    req_t *q = lua_touserdata(L, -1);
    q->streaming = true;
    q->chunked = r->chunked;
    q->content_length = r->content_length;
    q->codec = r->codec ? nr_ctx_retain(r->codec) : NULL;
    luaL_setmetatable(L, REQ_STREAM_CLASS);
    return;
  }
  if (lnr_push_ref(L, &lnr_http_part(L)->request_mt_ref) != LUA_TTABLE) {
    lua_pop(L, 1);
    luaL_getmetatable(L, REQ_CLASS);
  }
  lua_setmetatable(L, -2);
  if (r->body_len) {
    lua_pushlstring(L, r->body, r->body_len);
    lua_setiuservalue(L, -2, 1);
  }
}

void lnr_http_push_request(lua_State *L, void *msg) {
  const nr_http_request_t *r = msg;
  size_t n = r->nheaders, len = head_block(r);
  const char *base = r->method;
  if (len > 0) {               /* the usual: one copy, fields as offsets */
    req_t *q = lua_newuserdatauv(L, sizeof *q + n * sizeof(rhdr_t) + len, 2);
    *q = (req_t){.tag = &REQ_TAG, .pipe = r->pipeline, .token = r->token,
                 .method_len = (uint32_t)r->method_len,
                 .path = (uint32_t)(r->path - base),
                 .path_len = (uint32_t)r->path_len,
                 .query = r->query ? (uint32_t)(r->query - base) : 0,
                 .query_len = r->query ? (uint32_t)r->query_len : 0,
                 .target = (uint32_t)(r->target - base),
                 .target_len = (uint32_t)r->target_len,
                 .nheaders = (uint16_t)n, .has_query = r->query != NULL,
                 .keep_alive = r->keep_alive, .http11 = r->minor != 0,
                 .stream = r->stream};
    for (size_t i = 0; i < n; i++) {
      const nr_http_header_t *h = &r->headers[i];
      q->h[i] = (rhdr_t){(uint32_t)(h->name - base), (uint32_t)h->name_len,
                         (uint32_t)(h->value - base), (uint32_t)h->value_len};
    }
    memcpy((char *)req_text(q), base, len);
    request_done(L, r);
    return;
  }
  n += r->ntrailers;          /* they follow the headers in r->headers */
  len = r->method_len + r->path_len + (r->query ? r->query_len : 0) +
        r->target_len;
  for (size_t i = 0; i < n; i++)
    len += r->headers[i].name_len + r->headers[i].value_len;
  req_t *q = lua_newuserdatauv(L, sizeof *q + n * sizeof(rhdr_t) + len, 2);
  uint32_t off = 0;
  memset(q, 0, sizeof *q);
  q->tag = &REQ_TAG;
  q->pipe = r->pipeline;
  q->token = r->token;
  q->nheaders = (uint16_t)r->nheaders;
  q->ntrailers = (uint16_t)r->ntrailers;
  q->method_len = (uint32_t)r->method_len;
  put_text(q, &off, r->method, r->method_len);
  q->path_len = (uint32_t)r->path_len;
  q->path = put_text(q, &off, r->path, r->path_len);
  q->has_query = r->query != NULL;
  q->query_len = q->has_query ? (uint32_t)r->query_len : 0;
  q->query = put_text(q, &off, r->query, q->query_len);
  q->target_len = (uint32_t)r->target_len;
  q->target = put_text(q, &off, r->target, r->target_len);
  q->keep_alive = r->keep_alive;
  q->http11 = r->minor != 0;
  q->stream = r->stream;
  for (size_t i = 0; i < n; i++) {
    const nr_http_header_t *h = &r->headers[i];
    q->h[i].name_len = (uint32_t)h->name_len;
    q->h[i].name = put_text(q, &off, h->name, h->name_len);
    q->h[i].value_len = (uint32_t)h->value_len;
    q->h[i].value = put_text(q, &off, h->value, h->value_len);
  }
  request_done(L, r);
}

static int lower(int c) { return c >= 'A' && c <= 'Z' ? c + 32 : c; }

static bool same_name(const req_t *q, const rhdr_t *a, const rhdr_t *b) {
  if (a->name_len != b->name_len)
    return false;
  const char *x = req_text(q) + a->name, *y = req_text(q) + b->name;
  for (size_t i = 0; i < a->name_len; i++)
    if (lower(x[i]) != lower(y[i]))  /* names are tokens: ASCII only */
      return false;
  return true;
}

static void push_lower(lua_State *L, const char *s, size_t n) {
  char small[128];
  char *b = n <= sizeof small ? small : malloc(n);
  if (b == NULL)
    luaL_error(L, "out of memory");
  for (size_t i = 0; i < n; i++)
    b[i] = (char)lower(s[i]);
  lua_pushlstring(L, b, n);
  if (b != small)
    free(b);
}

/* headers = { name = value } from the fields q->h[from .. from + n):
 * lowercased, repeats joined with ", ". */
static void push_fields(lua_State *L, const req_t *q, size_t from, size_t n) {
  const char *text = req_text(q);
  lua_createtable(L, 0, (int)n);
  for (size_t i = from; i < from + n; i++) {
    const rhdr_t *h = &q->h[i];
    bool seen = false, repeated = false;   /* before i, after i */
    for (size_t j = from; j < from + n && !seen; j++)
      if (j != i && same_name(q, h, &q->h[j]))
        *(j < i ? &seen : &repeated) = true;
    if (seen)
      continue;              /* joined when its first occurrence was */
    push_lower(L, text + h->name, h->name_len);
    if (!repeated) {
      lua_pushlstring(L, text + h->value, h->value_len);
    } else {
      luaL_Buffer b;
      luaL_buffinit(L, &b);
      luaL_addlstring(&b, text + h->value, h->value_len);
      for (size_t j = i + 1; j < from + n; j++)
        if (same_name(q, h, &q->h[j])) {
          luaL_addlstring(&b, ", ", 2);
          luaL_addlstring(&b, text + q->h[j].value, q->h[j].value_len);
        }
      luaL_pushresult(&b);
    }
    lua_rawset(L, -3);
  }
}

enum { F_NONE, F_METHOD, F_PATH, F_QUERY, F_VERSION, F_HEADERS, F_BODY,
       F_KEEP_ALIVE, F_TRAILERS, F_ARGS, F_TARGET, F_STREAM, F_STREAMING,
       NFIELDS };
static const char *const field_names[NFIELDS] = {
    NULL, "method", "path", "query", "version", "headers", "body",
    "keep_alive", "trailers", "args", "target", "stream", "streaming"};

/* ---- query arguments ---------------------------------------------------------- */

static int hexval(int c) {
  return c >= '0' && c <= '9' ? c - '0'
         : c >= 'a' && c <= 'f' ? c - 'a' + 10
         : c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1;
}

/* Push s[0..n) decoded as a form or query component: + is a space, %XX a
 * byte; a % not followed by two hex digits stays as it is. */
static void push_unescaped(lua_State *L, const char *s, size_t n) {
  luaL_Buffer b;
  char *out = luaL_buffinitsize(L, &b, n);
  size_t m = 0;
  for (size_t i = 0; i < n; i++) {
    int hi, lo;
    if (s[i] == '+') {
      out[m++] = ' ';
    } else if (s[i] == '%' && i + 2 < n && (hi = hexval(s[i + 1])) >= 0 &&
               (lo = hexval(s[i + 2])) >= 0) {
      out[m++] = (char)(hi << 4 | lo);
      i += 2;
    } else {
      out[m++] = s[i];
    }
  }
  luaL_pushresultsize(&b, m);
}

/* netrun.http.unescape(s) */
int lnr_http_unescape(lua_State *L) {
  size_t n;
  const char *s = luaL_checklstring(L, 1, &n);
  push_unescaped(L, s, n);
  return 1;
}

/* Add key = value (on top) to the args table at t: a second value for a
 * key makes an array of them, in order. */
static void add_arg(lua_State *L, int t) {
  lua_pushvalue(L, -2);
  int old = lua_rawget(L, t);                  /* key value old */
  if (old == LUA_TNIL) {
    lua_pop(L, 1);
    lua_rawset(L, t);
    return;
  }
  if (old != LUA_TTABLE) {
    lua_createtable(L, 2, 0);
    lua_insert(L, -2);
    lua_rawseti(L, -2, 1);                     /* key value {old} */
    lua_pushvalue(L, -3);
    lua_pushvalue(L, -2);
    lua_rawset(L, t);
  }
  lua_insert(L, -2);                           /* key list value */
  lua_rawseti(L, -2, (lua_Integer)lua_rawlen(L, -2) + 1);
  lua_pop(L, 2);
}

/* The decoded query: { key = value | { values... } | true }. */
static void push_args(lua_State *L, const char *q, size_t n) {
  lua_newtable(L);
  int t = lua_gettop(L);
  const char *end = q + n;
  while (q < end) {
    const char *amp = memchr(q, '&', (size_t)(end - q));
    const char *stop = amp ? amp : end;
    const char *eq = memchr(q, '=', (size_t)(stop - q));
    if (stop > q && eq != q) {                 /* skip "" and "=v" */
      push_unescaped(L, q, (size_t)((eq ? eq : stop) - q));
      if (eq)
        push_unescaped(L, eq + 1, (size_t)(stop - eq - 1));
      else
        lua_pushboolean(L, 1);
      add_arg(L, t);
    }
    q = stop + 1;
  }
}

static int field_of(lua_State *L, int idx) {
  if (lua_type(L, idx) != LUA_TSTRING)
    return F_NONE;
  size_t n;
  const char *k = lua_tolstring(L, idx, &n);
  for (int f = F_METHOD; f < NFIELDS; f++)
    if (strlen(field_names[f]) == n && memcmp(field_names[f], k, n) == 0)
      return f;
  return F_NONE;
}

/* Push field f of the request at ud as it arrived. */
static void push_field(lua_State *L, int ud, int f) {
  const req_t *q = lua_touserdata(L, ud);
  const char *text = req_text(q);
  switch (f) {
  case F_METHOD: lua_pushlstring(L, text, q->method_len); break;
  case F_PATH: lua_pushlstring(L, text + q->path, q->path_len); break;
  case F_TARGET: lua_pushlstring(L, text + q->target, q->target_len); break;
  case F_QUERY:
    if (q->has_query)
      lua_pushlstring(L, text + q->query, q->query_len);
    else
      lua_pushnil(L);
    break;
  case F_VERSION:
    lua_pushstring(L, q->stream ? "2" : q->http11 ? "HTTP/1.1" : "HTTP/1.0");
    break;
  case F_STREAM:               /* HTTP/2's stream id; nil for HTTP/1.x */
    if (q->stream)
      lua_pushinteger(L, q->stream);
    else
      lua_pushnil(L);
    break;
  case F_BODY:
    if (lua_getiuservalue(L, ud, 1) != LUA_TSTRING) {
      lua_pop(L, 1);
      if (q->streaming)
        lua_pushnil(L);        /* it follows as messages */
      else
        lua_pushliteral(L, "");
    }
    break;
  case F_STREAMING: lua_pushboolean(L, q->streaming); break;
  case F_KEEP_ALIVE: lua_pushboolean(L, q->keep_alive); break;
  case F_ARGS:               /* made once, kept, like the headers */
    req_fields(L, ud, true);
    push_args(L, text + q->query, q->has_query ? q->query_len : 0);
    lua_pushstring(L, "args");
    lua_pushvalue(L, -2);
    lua_rawset(L, -4);
    lua_remove(L, -2);
    break;
  case F_HEADERS:            /* made once, kept: changes to it stay */
  case F_TRAILERS:
    req_fields(L, ud, true);
    if (f == F_HEADERS)
      push_fields(L, q, 0, q->nheaders);
    else
      push_fields(L, q, q->nheaders, q->ntrailers);
    lua_pushstring(L, field_names[f]);
    lua_pushvalue(L, -2);
    lua_rawset(L, -4);
    lua_remove(L, -2);
    break;
  default: lua_pushnil(L);
  }
}

static int req_index(lua_State *L) {
  check_req(L);
  if (req_fields(L, 1, false)) {
    lua_pushvalue(L, 2);
    if (lua_rawget(L, -2) != LUA_TNIL)
      return 1;
    lua_pop(L, 2);
  }
  int f = field_of(L, 2);
  if (f == F_NONE && lua_type(L, 2) == LUA_TSTRING &&
      strcmp(lua_tostring(L, 2), "sink") == 0) {
    lua_pushcfunction(L, lnr_http_req_sink);
    return 1;
  }
  push_field(L, 1, f);
  return 1;
}

static int req_newindex(lua_State *L) {
  check_req(L);
  req_fields(L, 1, true);
  lua_insert(L, 2);
  lua_rawset(L, 2);
  return 0;
}

/* All fields in the fields table, which is left pushed. */
static void req_materialize(lua_State *L, int ud) {
  const req_t *q = lua_touserdata(L, ud);
  req_fields(L, ud, true);
  for (int f = F_METHOD; f < NFIELDS; f++) {
    if (f == F_STREAMING && !q->streaming)
      continue;                /* (a field of streamed requests only) */
    if (lua_getfield(L, -1, field_names[f]) == LUA_TNIL) {
      push_field(L, ud, f);
      lua_setfield(L, -3, field_names[f]);
    }
    lua_pop(L, 1);
  }
}

static int req_pairs(lua_State *L) {
  check_req(L);
  lua_pushvalue(L, lua_upvalueindex(1));   /* the base library's next */
  req_materialize(L, 1);
  lua_pushnil(L);
  return 3;
}

/* What crosses to another state: a plain table, a copy of the fields. */
static int req_copy(lua_State *L) {
  check_req(L);
  req_materialize(L, 1);
  lua_newtable(L);
  lua_pushnil(L);
  while (lua_next(L, -3)) {
    lua_pushvalue(L, -2);
    lua_insert(L, -2);
    lua_rawset(L, -4);
  }
  return 1;
}

static int req_tostring(lua_State *L) {
  const req_t *q = check_req(L);
  luaL_Buffer b;
  luaL_buffinit(L, &b);
  luaL_addstring(&b, REQ_CLASS ": ");
  luaL_addlstring(&b, req_text(q), q->method_len);
  luaL_addchar(&b, ' ');
  luaL_addlstring(&b, req_text(q) + q->path, q->path_len > 200 ? 200 : q->path_len);
  luaL_pushresult(&b);
  return 1;
}

static int req_gc(lua_State *L);

void lnr_http_request_class_open(lua_State *L) {
  if (luaL_newmetatable(L, REQ_CLASS)) {
    static const luaL_Reg m[] = {
        {"__index", req_index}, {"__newindex", req_newindex},
        {"__netrun_copy", req_copy}, {"__tostring", req_tostring},
        {NULL, NULL}};
    luaL_setfuncs(L, m, 0);
    lua_getglobal(L, "next");       /* kept: a script may replace the global */
    lua_pushcclosure(L, req_pairs, 1);
    lua_setfield(L, -2, "__pairs");
    lua_pushvalue(L, -1);
    lnr_set_ref(L, &lnr_http_part(L)->request_mt_ref);
  }
  if (luaL_newmetatable(L, REQ_STREAM_CLASS)) {   /* the same, and __gc */
    luaL_getmetatable(L, REQ_CLASS);
    lua_pushnil(L);
    while (lua_next(L, -2)) {
      lua_pushvalue(L, -2);
      lua_insert(L, -2);
      lua_rawset(L, -5);
    }
    lua_pop(L, 1);
    lua_pushcfunction(L, req_gc);
    lua_setfield(L, -2, "__gc");
  }
  lua_pop(L, 2);
}

/* A streamed request lets go of its codec's context. */
static int req_gc(lua_State *L) {
  req_t *q = lua_touserdata(L, 1);
  if (q != NULL && lua_rawlen(L, 1) >= sizeof *q && q->tag == &REQ_TAG &&
      q->codec != NULL) {
    nr_ctx_release(q->codec);
    q->codec = NULL;
  }
  return 0;
}

bool lnr_http_request_body(lua_State *L, int idx, lnr_http_body_ref_t *b) {
  const req_t *q = lua_touserdata(L, idx);
  if (q == NULL || lua_rawlen(L, idx) < sizeof *q || q->tag != &REQ_TAG ||
      !q->streaming)
    return false;
  *b = (lnr_http_body_ref_t){.codec = q->codec, .token = q->token,
                             .chunked = q->chunked,
                             .content_length = q->content_length};
  return true;
}
