/*
 * lredis.c -- core.redis: the C half of netrun.redis (lua/netrun/redis.lua).
 *
 *   core.redis.codec(max_reply, max_depth, max_line, error_mt [, mt]) --> codec
 *                             (mt: a pipeline's metatable instead of the
 *                             codec's)
 *     c:cmd(name, ...)        encode one command (strings and numbers) at
 *                             the end of the bytes waiting to be sent
 *     c:cmdv(t [, n])         the same, its words t[1 .. n or t.n or #t]
 *     c:out()                 the waiting bytes as one string (nil: none);
 *                             c has none after
 *     c:waiting()             how many bytes wait
 *     c:feed(s)               bytes read from the server
 *     c:take(t, i, n [, pushes [, nulls]]) --> k, why
 *                             up to n whole replies into t[i .. i+k-1];
 *                             why: nil (n taken, or more bytes needed),
 *                             "push" (the next reply is a RESP3 push and
 *                             pushes is not true: it is left where it is),
 *                             or "protocol error: <what>" (malformed, or
 *                             over a limit: the codec takes no more);
 *                             nulls: a null reply is NULL, not a hole
 *     c:buffered()            bytes read and not taken yet
 *   core.redis.send(c, ch)    write c's waiting bytes to channel ch, flushed
 *   core.redis.append(c, p)   move p's waiting bytes to the end of c's:
 *                             how many commands they are
 *   core.redis.method(NAME)   a method encoding command NAME into its codec
 *                             (a pipeline's p:set(...)); core.redis.cmd,
 *                             take, out, waiting, gc: the codec methods as
 *                             functions, for codecs with another metatable
 *   core.redis.waiting_cmds(c) how many commands wait in c
 *   core.redis.table(a, h)    a table with room for a elements, h fields
 *   core.redis.ctx(c [, v])   a value kept with the codec (get, or set)
 *   core.redis.slot(key)      the cluster slot of a key (0..16383)
 *   core.redis.seen()         MOVED and ASK replies decoded so far, in the
 *                             process (a tap for the specs)
 *   core.redis.sha1(s)        SHA-1 of s in hex (a script's EVALSHA name)
 *   core.redis.null           the light userdata NULL (a null in an aggregate)
 *
 * Replies become Lua values: simple and bulk strings, verbatim strings
 * (without "txt:") and big numbers are strings; integers integers; RESP3
 * doubles numbers and booleans booleans; an error reply a table
 * { err = "ERR ..." } with metatable error_mt; arrays, sets and pushes
 * arrays; maps tables of key -> value; attributes are dropped. A null is
 * nil as a whole reply (so t[i] is a hole) and the light userdata NULL
 * (netrun.json.null, netrun.redis.null) inside an aggregate, where a nil
 * would cut the array short.
 *
 * The codec holds no Lua value but the string last fed, which it reads in
 * place while the replies in it are taken (uservalue 2, dropped once
 * consumed); bytes of a reply still incomplete are cumulated (buf.h), and
 * an idle connection's codec holds no memory past a small output buffer.
 * Loop thread of the state that made it, like any Lua value.
 */
#include <math.h>
#include <openssl/evp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "codec/buf.h"
#include "codec/resp_reply.h"
#include "lnr.h"

#define CODEC_MT "netrun.redis.codec"
#define OUT_KEEP 16384          /* output capacity kept across flushes */

typedef struct codec_s {
  const void *tag;              /* &codec_tag: the userdata is a codec */
  nr_buf_t in;                  /* cumulated input, when a reply is split */
  const char *bp;               /* borrowed: the rest of the string fed, */
  size_t bn;                    /*   uservalue 2, while `in` is empty */
  nr_resp_scan_t scan;
  long ready;                   /* a reply already scanned (a push left) */
  nr_resp_reply_limits_t lim;
  const char *failed;           /* a protocol error: takes nothing more */
  char *out;
  size_t olen, ocap;
  lua_Integer ncmd;             /* commands encoded since c:append took them */
} codec_t;

static const char codec_tag = 0;

/* The codec at idx. A tag, not luaL_checkudata: a codec may have another
 * metatable (a pipeline's), and this runs for every command. */
static codec_t *to_codec(lua_State *L, int idx) {
  codec_t *c = lua_touserdata(L, idx);
  if (c == NULL || lua_rawlen(L, idx) != sizeof *c || c->tag != &codec_tag)
    luaL_typeerror(L, idx, "netrun.redis codec");
  return c;
}

static codec_t *check(lua_State *L) {
  return to_codec(L, 1);
}

/* ---- encoding ---------------------------------------------------------------- */

static void grow_out(lua_State *L, codec_t *c, size_t more) {
  size_t cap = c->ocap ? c->ocap : 256;
  while (cap - c->olen < more) {
    if (cap > ((size_t)-1) / 4)
      luaL_error(L, "netrun.redis: command too large");
    cap *= 2;
  }
  char *o = realloc(c->out, cap);
  if (o == NULL)
    luaL_error(L, "netrun.redis: out of memory");
  c->out = o;
  c->ocap = cap;
}

static inline void reserve(lua_State *L, codec_t *c, size_t more) {
  if (c->ocap - c->olen < more)
    grow_out(L, c, more);
}

/* Append "<c><n>\r\n" (room for 24 bytes reserved). Lengths and counts
 * are mostly one or two digits: those skip the division loop. */
static inline void put_header(codec_t *c, char type, size_t n) {
  char *o = c->out + c->olen;
  *o++ = type;
  if (n < 10) {
    *o++ = (char)('0' + n);
  } else if (n < 100) {
    *o++ = (char)('0' + n / 10);
    *o++ = (char)('0' + n % 10);
  } else {
    char tmp[24];
    int i = (int)sizeof tmp;
    do {
      tmp[--i] = (char)('0' + n % 10);
      n /= 10;
    } while (n > 0);
    memcpy(o, tmp + i, sizeof tmp - (size_t)i);
    o += sizeof tmp - (size_t)i;
  }
  *o++ = '\r';
  *o++ = '\n';
  c->olen = (size_t)(o - c->out);
}

static inline void put_bulk(lua_State *L, codec_t *c, const char *s, size_t n) {
  reserve(L, c, n + 26);
  put_header(c, '$', n);
  char *o = c->out + c->olen;
  memcpy(o, s, n);
  o[n] = '\r';
  o[n + 1] = '\n';
  c->olen += n + 2;
}

/* The level of the first caller outside this module (for messages that
 * point at the user's line, past the Lua wrappers of redis.lua). */
static int user_level(lua_State *L) {
  lua_Debug ar;
  for (int level = 1; lua_getstack(L, level, &ar); level++) {
    lua_getinfo(L, "S", &ar);
    if (strstr(ar.source, "netrun/redis") == NULL &&
        strcmp(ar.what, "C") != 0)
      return level;
  }
  return 1;
}

/* Append the value at idx as a bulk string: strings, and numbers as Redis
 * reads them (integers in decimal, floats with 17 significant digits). */
static void put_arg(lua_State *L, codec_t *c, int idx, const char *name,
                    int argn) {
  char num[48];
  size_t n;
  switch (lua_type(L, idx)) {
  case LUA_TSTRING: {
    const char *s = lua_tolstring(L, idx, &n);
    put_bulk(L, c, s, n);
    return;
  }
  case LUA_TNUMBER:
    if (lua_isinteger(L, idx))
      n = (size_t)snprintf(num, sizeof num, LUA_INTEGER_FMT,
                           (LUAI_UACINT)lua_tointeger(L, idx));
    else
      n = (size_t)snprintf(num, sizeof num, "%.17g", (double)lua_tonumber(L, idx));
    put_bulk(L, c, num, n);
    return;
  default:
    luaL_where(L, user_level(L));
    lua_pushfstring(L, "netrun.redis: %s: argument %d is a %s (strings and "
                       "numbers only)", name, argn, luaL_typename(L, idx));
    lua_concat(L, 2);
    lua_error(L);
  }
}

/* c:cmd(name, ...) */
static int l_cmd(lua_State *L) {
  codec_t *c = check(L);
  int top = lua_gettop(L);
  if (top < 2)
    return luaL_error(L, "netrun.redis: a command needs a name");
  const char *name = lua_type(L, 2) == LUA_TSTRING ? lua_tostring(L, 2) : "command";
  size_t before = c->olen;
  reserve(L, c, 24);
  put_header(c, '*', (size_t)(top - 1));
  for (int i = 2; i <= top; i++) {
    if (lua_type(L, i) != LUA_TSTRING && lua_type(L, i) != LUA_TNUMBER)
      c->olen = before;                /* nothing half-encoded stays */
    put_arg(L, c, i, name, i - 2);
  }
  c->ncmd++;
  return 0;
}

/* A command method: c:set(...) with the name "SET" as upvalue 1. */
static int l_method(lua_State *L) {
  codec_t *c = check(L);
  int top = lua_gettop(L);
  size_t nlen;
  const char *name = lua_tolstring(L, lua_upvalueindex(1), &nlen);
  size_t before = c->olen;
  reserve(L, c, 24);
  put_header(c, '*', (size_t)top);
  put_bulk(L, c, name, nlen);
  for (int i = 2; i <= top; i++) {
    if (lua_type(L, i) != LUA_TSTRING && lua_type(L, i) != LUA_TNUMBER)
      c->olen = before;
    put_arg(L, c, i, name, i - 1);
  }
  c->ncmd++;
  return 0;
}

/* core.redis.method(NAME): the method that encodes command NAME. */
static int l_new_method(lua_State *L) {
  luaL_checkstring(L, 1);
  lua_settop(L, 1);
  lua_pushcclosure(L, l_method, 1);
  return 1;
}

/* c:cmdv(t [, n]) */
static int l_cmdv(lua_State *L) {
  codec_t *c = check(L);
  luaL_checktype(L, 2, LUA_TTABLE);
  lua_Integer n;
  if (lua_isnoneornil(L, 3)) {
    n = lua_getfield(L, 2, "n") == LUA_TNUMBER ? lua_tointeger(L, -1)
                                               : (lua_Integer)lua_rawlen(L, 2);
    lua_pop(L, 1);
  } else {
    n = luaL_checkinteger(L, 3);
  }
  if (n < 1)
    return luaL_error(L, "netrun.redis: a command needs a name");
  lua_rawgeti(L, 2, 1);
  const char *name = lua_type(L, -1) == LUA_TSTRING ? lua_tostring(L, -1) : "command";
  size_t before = c->olen;
  reserve(L, c, 24);
  put_header(c, '*', (size_t)n);
  for (lua_Integer i = 1; i <= n; i++) {
    lua_rawgeti(L, 2, i);
    if (lua_type(L, -1) != LUA_TSTRING && lua_type(L, -1) != LUA_TNUMBER)
      c->olen = before;
    put_arg(L, c, lua_gettop(L), name, (int)i - 1);
    lua_pop(L, 1);
  }
  c->ncmd++;
  return 0;
}

/* Forget the output buffer if it grew large (a big pipeline once). */
static void out_reset(codec_t *c) {
  c->olen = 0;
  c->ncmd = 0;
  if (c->ocap > OUT_KEEP) {
    free(c->out);
    c->out = NULL;
    c->ocap = 0;
  }
}

/* core.redis.append(c, other) --> the commands moved */
static int l_append(lua_State *L) {
  codec_t *c = check(L), *o = to_codec(L, 2);
  lua_Integer n = o->ncmd;
  if (o->olen > 0 && o != c) {
    reserve(L, c, o->olen);
    memcpy(c->out + c->olen, o->out, o->olen);
    c->olen += o->olen;
    c->ncmd += n;
    out_reset(o);
  }
  o->ncmd = 0;
  lua_pushinteger(L, n);
  return 1;
}

/* c:out() */
static int l_out(lua_State *L) {
  codec_t *c = check(L);
  if (c->olen == 0)
    return 0;
  lua_pushlstring(L, c->out, c->olen);
  out_reset(c);
  return 1;
}

/* core.redis.send(c, ch): write c's waiting bytes to the channel ch (on
 * its loop) and flush; no future is made. The bytes written (0: none). */
static int l_send(lua_State *L) {
  codec_t *c = check(L);
  nr_channel_t *ch = lnr_check_handle(L, 2, LNR_CHANNEL);
  size_t n = c->olen;
  if (n > 0) {
    nr_channel_write(ch, c->out, n, true, NULL);
    out_reset(c);
  }
  lua_pushinteger(L, (lua_Integer)n);
  return 1;
}

static int l_waiting(lua_State *L) {
  lua_pushinteger(L, (lua_Integer)check(L)->olen);
  return 1;
}

/* core.redis.waiting_cmds(c): commands encoded and not sent or moved */
static int l_waiting_cmds(lua_State *L) {
  lua_pushinteger(L, check(L)->ncmd);
  return 1;
}

/* ---- decoding ---------------------------------------------------------------- */

/* The bytes not taken yet. */
static const char *view(codec_t *c, size_t *n) {
  if (nr_buf_len(&c->in) > 0) {
    *n = nr_buf_len(&c->in);
    return nr_buf_peek(&c->in);
  }
  *n = c->bn;
  return c->bp;
}

static void drop_borrowed(lua_State *L, codec_t *c) {
  c->bp = NULL;
  c->bn = 0;
  lua_pushnil(L);
  lua_setiuservalue(L, 1, 2);
}

/* Copy the borrowed bytes into the cumulation (more are coming). */
static void keep_borrowed(lua_State *L, codec_t *c) {
  if (c->bn == 0)
    return;
  if (nr_buf_append(&c->in, c->bp, c->bn) < 0)
    luaL_error(L, "netrun.redis: out of memory");
  drop_borrowed(L, c);
}

/* c:feed(s) */
static int l_feed(lua_State *L) {
  codec_t *c = check(L);
  size_t n;
  const char *s = luaL_checklstring(L, 2, &n);
  if (c->failed || n == 0)
    return 0;
  keep_borrowed(L, c);
  if (nr_buf_len(&c->in) > 0) {
    if (nr_buf_append(&c->in, s, n) < 0)
      return luaL_error(L, "netrun.redis: out of memory");
    return 0;
  }
  c->bp = s;
  c->bn = n;
  lua_settop(L, 2);
  lua_setiuservalue(L, 1, 2);          /* keeps s alive while read in place */
  return 0;
}

static void consume(lua_State *L, codec_t *c, size_t n) {
  if (nr_buf_len(&c->in) > 0) {
    nr_buf_consume(&c->in, n);
    return;
  }
  c->bp += n;
  c->bn -= n;
  if (c->bn == 0)
    drop_borrowed(L, c);
}

static void build(lua_State *L, const char *p, size_t n, size_t *off,
                  int top, int error_mt);

/* A double's text (checked by the scanner: at most 128 bytes). */
static double to_double(const char *s, size_t n) {
  char tmp[136];
  memcpy(tmp, s, n);
  tmp[n] = '\0';
  return strtod(tmp, NULL);
}

/* Redirects as they came off the wire, counted where the replies are
 * decoded, apart from the cluster client's own counting (its metrics):
 * the specs compare the two. Any thread: atomic. */
static _Atomic long seen_moved, seen_ask;

static void push_error(lua_State *L, const char *s, size_t n, int error_mt) {
  if (n > 6 && memcmp(s, "MOVED ", 6) == 0)
    atomic_fetch_add_explicit(&seen_moved, 1, memory_order_relaxed);
  else if (n > 4 && memcmp(s, "ASK ", 4) == 0)
    atomic_fetch_add_explicit(&seen_ask, 1, memory_order_relaxed);
  lua_createtable(L, 0, 1);
  lua_pushlstring(L, s, n);
  lua_setfield(L, -2, "err");
  lua_pushvalue(L, error_mt);
  lua_setmetatable(L, -2);
}

/* Build the aggregate whose header t was just read. */
static void build_aggregate(lua_State *L, const char *p, size_t n, size_t *off,
                            const nr_resp_token_t *t, int error_mt) {
  luaL_checkstack(L, 4, "netrun.redis: reply nested too deeply");
  int64_t cnt = t->n;
  if (t->type == '%') {
    lua_createtable(L, 0, (int)(cnt / 2 > 1 << 24 ? 1 << 24 : cnt / 2));
    for (int64_t i = 0; i < cnt; i += 2) {
      build(L, p, n, off, 0, error_mt);
      if (lua_type(L, -1) == LUA_TNUMBER && lua_tonumber(L, -1) != lua_tonumber(L, -1)) {
        lua_pop(L, 1);
        lua_pushliteral(L, "nan");       /* NaN cannot be a key */
      }
      build(L, p, n, off, 0, error_mt);
      lua_rawset(L, -3);
    }
    return;
  }
  lua_createtable(L, (int)(cnt > 1 << 24 ? 1 << 24 : cnt), 0);
  for (int64_t i = 1; i <= cnt; i++) {
    build(L, p, n, off, 0, error_mt);
    lua_rawseti(L, -2, (lua_Integer)i);
  }
}

/* Push the value at p[*off] (a scanned reply: every token is whole) and
 * advance *off past it. top: a whole reply (a null is nil) or an element
 * (a null is NULL, which an array can hold). */
static void build(lua_State *L, const char *p, size_t n, size_t *off,
                  int top, int error_mt) {
  nr_resp_token_t t;
  for (;;) {
    size_t len = nr_resp_reply_token(p + *off, n - *off, &t);
    if (len == 0)
      luaL_error(L, "netrun.redis: internal error: a scanned reply does not parse");
    *off += len;
    if (t.type != '|')
      break;
    for (int64_t i = 0; i < t.n; i++) {  /* an attribute: read and dropped */
      build(L, p, n, off, 0, error_mt);
      lua_pop(L, 1);
    }
  }
  if (t.null) {
    if (top)
      lua_pushnil(L);
    else
      lua_pushlightuserdata(L, NULL);
    return;
  }
  switch (t.type) {
  case ':':
    lua_pushinteger(L, (lua_Integer)t.n);
    return;
  case '#':
    lua_pushboolean(L, t.n != 0);
    return;
  case ',':
    lua_pushnumber(L, (lua_Number)to_double(t.data, t.len));
    return;
  case '-': case '!':
    push_error(L, t.data, t.len, error_mt);
    return;
  case '*': case '~': case '>': case '%':
    build_aggregate(L, p, n, off, &t, error_mt);
    return;
  default:                             /* + $ = ( */
    lua_pushlstring(L, t.data, t.len);
    return;
  }
}

/* The usual whole replies, +OK and $3 abc, pushed without the token walk:
 * true if it was one. p[0 .. r) is a scanned reply. */
static bool push_simple(lua_State *L, const char *p, size_t r, bool nulls) {
  if (p[0] == '+') {
    lua_pushlstring(L, p + 1, r - 3);
    return true;
  }
  if (p[0] != '$')
    return false;
  if (p[1] == '-') {                   /* $-1 */
    if (nulls)
      lua_pushlightuserdata(L, NULL);
    else
      lua_pushnil(L);
    return true;
  }
  size_t i = 1;
  while (p[i] != '\r')                 /* the digits, checked by the scan */
    i++;
  lua_pushlstring(L, p + i + 2, r - i - 4);
  return true;
}

static int fail(lua_State *L, codec_t *c, lua_Integer k, const char *why) {
  c->failed = why;
  lua_pushinteger(L, k);
  lua_pushfstring(L, "protocol error: %s", why);
  return 2;
}

/* c:take(t, i, n [, pushes [, nulls]]) */
static int l_take(lua_State *L) {
  codec_t *c = check(L);
  luaL_checktype(L, 2, LUA_TTABLE);
  lua_Integer i = luaL_checkinteger(L, 3), want = luaL_checkinteger(L, 4);
  bool pushes = lua_toboolean(L, 5), nulls = lua_toboolean(L, 6);
  lua_settop(L, 4);
  lua_getiuservalue(L, 1, 1);          /* 5: error_mt */
  lua_Integer k = 0;
  if (c->failed)
    return fail(L, c, 0, c->failed);
  while (k < want) {
    size_t n;
    const char *p = view(c, &n);
    long r = c->ready;
    if (r == 0) {
      const char *why = NULL;
      r = nr_resp_reply_scan(&c->scan, p, n, &c->lim, &why);
      if (r < 0)
        return fail(L, c, k, why);
      if (r == 0) {
        keep_borrowed(L, c);           /* the rest follows in later reads */
        break;
      }
    }
    if (p[0] == '>' && !pushes) {
      c->ready = r;
      lua_pushinteger(L, k);
      lua_pushliteral(L, "push");
      return 2;
    }
    c->ready = 0;
    if (!push_simple(L, p, (size_t)r, nulls)) {
      size_t off = 0;
      build(L, p, (size_t)r, &off, !nulls, 5);
    }
    lua_rawseti(L, 2, i + k);
    k++;
    consume(L, c, (size_t)r);
  }
  lua_pushinteger(L, k);
  return 1;
}

static int l_buffered(lua_State *L) {
  codec_t *c = check(L);
  lua_pushinteger(L, (lua_Integer)(nr_buf_len(&c->in) + c->bn));
  return 1;
}

static int l_gc(lua_State *L) {
  codec_t *c = check(L);
  nr_buf_free(&c->in);
  free(c->out);
  c->out = NULL;
  c->olen = c->ocap = 0;
  c->bp = NULL;
  c->bn = 0;
  return 0;
}

static int l_tostring(lua_State *L) {
  codec_t *c = check(L);
  lua_pushfstring(L, "netrun.redis.codec(%d bytes to send, %d read)",
                  (int)c->olen, (int)(nr_buf_len(&c->in) + c->bn));
  return 1;
}

/* core.redis.ctx(c [, v]): the value Lua keeps with a codec (uservalue
 * 3: a pipeline's pool); with v, set it. */
static int l_ctx(lua_State *L) {
  check(L);
  if (lua_gettop(L) >= 2) {
    lua_settop(L, 2);
    lua_setiuservalue(L, 1, 3);
    return 0;
  }
  lua_getiuservalue(L, 1, 3);
  return 1;
}

/* core.redis.table(narr, nrec): a table with room for that many */
static int l_table(lua_State *L) {
  lua_Integer a = luaL_checkinteger(L, 1), h = luaL_optinteger(L, 2, 0);
  luaL_argcheck(L, a >= 0 && a <= 1 << 24, 1, "out of range");
  luaL_argcheck(L, h >= 0 && h <= 64, 2, "out of range");
  lua_createtable(L, (int)a, (int)h);
  return 1;
}

/* core.redis.codec(max_reply, max_depth, max_line, error_mt [, mt]) */
static int l_codec(lua_State *L) {
  lua_Integer max_reply = luaL_checkinteger(L, 1);
  lua_Integer max_depth = luaL_checkinteger(L, 2);
  lua_Integer max_line = luaL_checkinteger(L, 3);
  luaL_checktype(L, 4, LUA_TTABLE);
  luaL_argcheck(L, max_reply > 0, 1, "must be positive");
  luaL_argcheck(L, max_depth > 0 && max_depth <= NR_RESP_REPLY_DEPTH, 2,
                "must be from 1 to 64");
  luaL_argcheck(L, max_line > 0, 3, "must be positive");
  codec_t *c = lua_newuserdatauv(L, sizeof *c, 3);
  memset(c, 0, sizeof *c);
  c->tag = &codec_tag;
  c->lim = (nr_resp_reply_limits_t){(size_t)max_reply, (size_t)max_depth,
                                    (size_t)max_line};
  if (lua_istable(L, 5)) {             /* a pipeline: its own methods */
    lua_pushvalue(L, 5);
    lua_setmetatable(L, -2);
  } else {
    luaL_setmetatable(L, CODEC_MT);
  }
  lua_pushvalue(L, 4);
  lua_setiuservalue(L, -2, 1);
  return 1;
}

/* core.redis.seen(): the MOVED and ASK replies decoded in the process */
static int l_seen(lua_State *L) {
  lua_pushinteger(L, atomic_load_explicit(&seen_moved, memory_order_relaxed));
  lua_pushinteger(L, atomic_load_explicit(&seen_ask, memory_order_relaxed));
  return 2;
}

/* core.redis.slot(key) */
static int l_slot(lua_State *L) {
  size_t n;
  const char *k = luaL_checklstring(L, 1, &n);
  lua_pushinteger(L, (lua_Integer)nr_resp_key_slot(k, n));
  return 1;
}

/* core.redis.sha1(s) */
static int l_sha1(lua_State *L) {
  size_t n;
  const char *s = luaL_checklstring(L, 1, &n);
  unsigned char md[EVP_MAX_MD_SIZE];
  unsigned int len = 0;
  if (!EVP_Digest(s, n, md, &len, EVP_sha1(), NULL))
    return luaL_error(L, "netrun.redis: SHA-1 failed");
  char hex[2 * EVP_MAX_MD_SIZE + 1];
  for (unsigned int i = 0; i < len; i++) {
    hex[2 * i] = "0123456789abcdef"[md[i] >> 4];
    hex[2 * i + 1] = "0123456789abcdef"[md[i] & 15];
  }
  lua_pushlstring(L, hex, 2 * (size_t)len);
  return 1;
}

static void open_redis(lua_State *L) {
  static const luaL_Reg methods[] = {
      {"cmd", l_cmd}, {"cmdv", l_cmdv}, {"out", l_out},
      {"waiting", l_waiting}, {"feed", l_feed}, {"take", l_take},
      {"buffered", l_buffered}, {NULL, NULL}};
  if (luaL_newmetatable(L, CODEC_MT)) {
    luaL_newlib(L, methods);
    lua_setfield(L, -2, "__index");
    lua_pushcfunction(L, l_gc);
    lua_setfield(L, -2, "__gc");
    lua_pushcfunction(L, l_tostring);
    lua_setfield(L, -2, "__tostring");
  }
  lua_pop(L, 1);
  lua_createtable(L, 0, 12);
  static const luaL_Reg funcs[] = {
      {"append", l_append}, {"method", l_new_method}, {"table", l_table},
      {"ctx", l_ctx}, {"send", l_send}, {"seen", l_seen},
      {"gc", l_gc}, {"cmd", l_cmd}, {"cmdv", l_cmdv}, {"take", l_take}, {"out", l_out},
      {"waiting", l_waiting}, {"waiting_cmds", l_waiting_cmds}, {NULL, NULL}};
  luaL_setfuncs(L, funcs, 0);
  lua_pushlightuserdata(L, NULL);      /* cjson's null: netrun.json.null */
  lua_setfield(L, -2, "null");
  lua_pushcfunction(L, l_sha1);
  lua_setfield(L, -2, "sha1");
  lua_pushcfunction(L, l_codec);
  lua_setfield(L, -2, "codec");
  lua_pushcfunction(L, l_slot);
  lua_setfield(L, -2, "slot");
  lua_setfield(L, -2, "redis");
}

lnr_module_t lnr_redis_module = {.name = "redis", .open = open_redis};
