/*
 * ljson.c -- JSON for netrun.json (lua/netrun/json.lua): encode a Lua
 * value to JSON text and decode JSON text (RFC 8259) to Lua values, with
 * Lua 5.4's integers kept exact both ways.
 *
 * Why not lua-cjson alone: Debian's lua-cjson 2.1.0 predates Lua's
 * integers. It formats every number with "%.14g" (123456789012345 becomes
 * 1.2345678901234e+14, 2^53-1 loses digits), decodes every number to a
 * float, and has no way to tell an empty array from an empty object; its
 * precision setting stops at 14 digits and no hook reaches its number
 * formatting or parsing. This file is that library's job redone with
 * numbers as Python's json module treats them, and cjson's settings under
 * cjson's names (json.lua documents them):
 *   - an integer encodes as its decimal digits; a float as the shortest
 *     text that reads back as the same double, with ".0" added when that
 *     text would read as an integer (1.0 -> "1.0", so it comes back a
 *     float); NaN and the infinities raise unless encode_invalid_numbers;
 *   - a number without fraction or exponent decodes to an integer when it
 *     fits in 64 bits, anything else to a float (a larger integer too);
 *   - null is netrun.json.null (cjson's: the NULL light userdata);
 *   - decoded arrays carry array_mt, so an empty one encodes as [] again;
 *     a table with array_mt, and empty_array, always encode as arrays.
 *
 * Invariants: encoding reads tables raw (no metamethod runs, so no user
 * code can re-enter); its output goes to one scratch buffer per state,
 * allocated with the state's allocator (counted against its memory
 * limit) and kept at most SCRATCH_KEEP bytes between calls; a raise never
 * leaks it (the buffer's userdata owns it). Nesting is bounded both ways
 * (encode_max_depth, decode_max_depth; a cycle is nesting without end).
 *
 * Threads: the settings are process-wide (relaxed atomics: configured once
 * at start-up, read by every state); everything else belongs to the
 * state that runs the call.
 *
 * Decoding is ljson_decode.c's; what both halves share, ljson.h's.
 */

/***
JSON (RFC 8259): `netrun.json`, loaded on first use, with Lua 5.4's integers
kept exact. An integer encodes as its digits and a float as the shortest
text that reads back the same (with ".0" where it would read as an
integer); a number without fraction or exponent decodes to an integer when
it fits in 64 bits. `netrun.json.null` is JSON's null (the same as
lua-cjson's); decoded arrays carry `netrun.json.array_mt`, so an empty one
encodes as `[]` again, and `netrun.json.empty_array` encodes as `[]`.
Strings are bytes both ways. Misuse raises at the caller's line, naming
the cause and where.
@module netrun.json
*/
#include <locale.h>
#include <math.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ljson.h"

/* ---- settings ------------------------------------------------------ */

struct lnr_json_cfg lnr_json_cfg = {1000, 1000, INVALID_RAISE, false, false, 2, 10, 0, true, true};

const char lnr_json_empty_array = 0;

/* ---- the scratch buffer --------------------------------------------- */

static int jbuf_gc(lua_State *L) {
  jbuf_t *b = lua_touserdata(L, 1);
  if (b->p)
    b->alloc(b->ud, b->p, b->cap, 0);
  b->p = NULL;
  b->cap = b->len = 0;
  return 0;
}

/* Room for n more bytes, or false (out of memory, or past SIZE_MAX/2). */
bool lnr_jbuf_reserve_slow(jbuf_t *b, size_t n) {
  size_t cap = b->cap ? b->cap : 256;
  while (cap - b->len < n) {
    if (cap > (size_t)-1 / 4)
      return false;
    cap *= 2;
  }
  char *p = b->alloc(b->ud, b->p, b->p ? b->cap : 0, cap);
  if (p == NULL)
    return false;
  b->p = p;
  b->cap = cap;
  return true;
}

/* ---- numbers to text ------------------------------------------------ */

/* The decimal digits of v into out (>= 21 bytes); returns the length. */
static size_t fmt_integer(char *out, lua_Integer v) {
  char tmp[24];
  int i = (int)sizeof tmp;
  unsigned long long u = v < 0 ? 0ULL - (unsigned long long)v : (unsigned long long)v;
  do {
    tmp[--i] = (char)('0' + u % 10);
    u /= 10;
  } while (u);
  if (v < 0)
    tmp[--i] = '-';
  memcpy(out, tmp + i, sizeof tmp - (size_t)i);
  return sizeof tmp - (size_t)i;
}

#define EXACT (9007199254740992.0)     /* 2^53: below it every integer is a double */

/* The fast path of fmt_float: d as m / 10^k with m an integer below 2^53
 * and k <= 6, if some k gives back exactly d (m / 10^k is then correctly
 * rounded, so the text "m with a point k digits from the right" reads
 * back as d: Clinger's condition); the smallest such k. Returns the
 * length, or 0 when d has no such form (then printf decides). */
static size_t fmt_decimal(char *out, double d) {
  double a = fabs(d);
  if (!(a < 1e15) || a == 0)
    return 0;
  for (int k = 0; k <= 6; k++) {
    double m = nearbyint(a * POW10[k]);
    if (m >= EXACT)
      return 0;
    if (m / POW10[k] != a)
      continue;
    char digits[24];
    size_t n = fmt_integer(digits, (lua_Integer)m), len = 0;
    if (d < 0)
      out[len++] = '-';
    if (n <= (size_t)k) {               /* 0.000ddd */
      out[len++] = '0';
      out[len++] = '.';
      for (size_t z = n; z < (size_t)k; z++)
        out[len++] = '0';
      memcpy(out + len, digits, n);
      return len + n;
    }
    memcpy(out + len, digits, n - (size_t)k);
    len += n - (size_t)k;
    out[len++] = '.';
    if (k == 0) {
      out[len++] = '0';
      return len;
    }
    memcpy(out + len, digits + n - (size_t)k, (size_t)k);
    return len + (size_t)k;
  }
  return 0;
}

/* A finite double as text that reads back as the same double: a plain
 * decimal when one of up to 6 places does (12.5, 0.25, 3.0), else the
 * shortest of %.15g, %.16g, %.17g that does (or %.{precision}g when one
 * is set), with the locale's decimal point made '.', and ".0" added when
 * the text has neither point nor exponent (it would read back as an
 * integer). out holds >= 32 bytes; returns the length. */
static size_t fmt_float(char *out, double d) {
  int prec = GET(precision);
  size_t fast = prec ? 0 : fmt_decimal(out, d);
  if (fast)
    return fast;
  int n = 0;
  for (int p = prec ? prec : 15; p <= 17; p++) {
    n = snprintf(out, 32, "%.*g", p, d);
    if (prec || strtod(out, NULL) == d)
      break;
  }
  bool marked = false;
  for (int i = 0; i < n; i++) {
    char c = out[i];
    if (c == 'e')
      marked = true;
    else if (c != '-' && c != '+' && (c < '0' || c > '9')) {
      out[i] = '.';                    /* the locale's point, whatever it is */
      marked = true;
    }
  }
  if (!marked) {
    out[n++] = '.';
    out[n++] = '0';
  }
  return (size_t)n;
}

/* ---- encoding -------------------------------------------------------- */

typedef struct enc_s {
  lua_State *L;
  jbuf_t *b;
  int mt;                     /* stack index of array_mt */
  int depth, max_depth;
  char err[96];               /* what failed, then the path is prepended */
  char path[256];
} enc_t;

#define PATH_NAMED 160           /* bytes of path named; "..." for the rest */

enum { ENC_OK, ENC_FAIL, ENC_NOMEM };

/* The escape of each byte in a string: 0 none, 'u' as \u00XX, else the
 * letter after the backslash. */
static const char ESC[256] = {
    ['\b'] = 'b', ['\t'] = 't', ['\n'] = 'n', ['\f'] = 'f', ['\r'] = 'r',
    [0] = 'u', [1] = 'u', [2] = 'u', [3] = 'u', [4] = 'u', [5] = 'u', [6] = 'u',
    [7] = 'u', [11] = 'u', [14] = 'u', [15] = 'u', [16] = 'u', [17] = 'u',
    [18] = 'u', [19] = 'u', [20] = 'u', [21] = 'u', [22] = 'u', [23] = 'u',
    [24] = 'u', [25] = 'u', [26] = 'u', [27] = 'u', [28] = 'u', [29] = 'u',
    [30] = 'u', [31] = 'u', ['"'] = '"', ['\\'] = '\\', [127] = 'u'};

static int put_string(jbuf_t *b, const char *s, size_t n) {
  if (!reserve(b, n + 2))              /* the common case: nothing escaped */
    return ENC_NOMEM;
  b->p[b->len++] = '"';
  size_t run = 0;
  for (size_t i = 0; i < n; i++) {
    char e = ESC[(unsigned char)s[i]];
    if (e == 0)
      continue;
    if (!reserve(b, (i - run) + 6 + (n - i) + 1))
      return ENC_NOMEM;
    memcpy(b->p + b->len, s + run, i - run);
    b->len += i - run;
    run = i + 1;
    if (e == 'u') {
      static const char hex[] = "0123456789abcdef";
      unsigned char c = (unsigned char)s[i];
      memcpy(b->p + b->len, "\\u00", 4);
      b->p[b->len + 4] = hex[c >> 4];
      b->p[b->len + 5] = hex[c & 15];
      b->len += 6;
    } else {
      b->p[b->len++] = '\\';
      b->p[b->len++] = e;
    }
  }
  if (!reserve(b, (n - run) + 1))
    return ENC_NOMEM;
  memcpy(b->p + b->len, s + run, n - run);
  b->len += n - run;
  b->p[b->len++] = '"';
  return ENC_OK;
}

static int fail(enc_t *e, const char *fmt, const char *arg) {
  snprintf(e->err, sizeof e->err, fmt, arg);
  return ENC_FAIL;
}

/* On the way out of a failure: the key that led there, prepended to the
 * path (".name", "[3]", "[\"a b\"]"); the key is at idx. */
static int with_key(enc_t *e, int rc, int idx) {
  if (rc != ENC_FAIL)
    return rc;
  lua_State *L = e->L;
  char seg[80];
  if (lua_type(L, idx) == LUA_TNUMBER) {
    lua_pushvalue(L, idx);
    snprintf(seg, sizeof seg, "[%s]", lua_tostring(L, -1));
    lua_pop(L, 1);
  } else {
    const char *k = lua_tostring(L, idx);
    bool ident = *k != '\0' && !(*k >= '0' && *k <= '9');
    for (const char *c = k; ident && *c; c++)
      ident = *c == '_' || ((*c | 32) >= 'a' && (*c | 32) <= 'z') ||
              (*c >= '0' && *c <= '9');
    snprintf(seg, sizeof seg, ident ? ".%.60s" : "[\"%.60s\"]", k);
  }
  size_t sl = strlen(seg), pl = strlen(e->path);
  if (strncmp(e->path, "...", 3) == 0)
    return rc;
  if (sl + pl > PATH_NAMED) {           /* too deep to name: the inner part */
    sl = 3;
    memcpy(seg, "...", 4);
  }
  memmove(e->path + sl, e->path, pl + 1);
  memcpy(e->path, seg, sl);
  return rc;
}

static int encode_value(enc_t *e, int idx);

static int put_number(enc_t *e, int idx) {
  lua_State *L = e->L;
  if (!reserve(e->b, 32))
    return ENC_NOMEM;
  char *out = e->b->p + e->b->len;
  if (lua_isinteger(L, idx)) {
    e->b->len += fmt_integer(out, lua_tointeger(L, idx));
    return ENC_OK;
  }
  double d = lua_tonumber(L, idx);
  if (isfinite(d)) {
    e->b->len += fmt_float(out, d);
    return ENC_OK;
  }
  int mode = GET(encode_invalid);
  const char *text = mode == INVALID_NULL ? "null"
                     : isnan(d)           ? "NaN"
                     : d > 0              ? "Infinity"
                                          : "-Infinity";
  if (mode == INVALID_RAISE)
    return fail(e, "cannot encode %s (see encode_invalid_numbers)", text);
  memcpy(out, text, strlen(text));
  e->b->len += strlen(text);
  return ENC_OK;
}

/* A table's shape: its length as an array, or -1 for an object. As
 * cjson: an array has only positive integer keys; one whose largest key
 * is past sparse_safe and more than sparse_ratio times its count is
 * excessively sparse (an object if sparse_convert, else an error, -2). */
static lua_Integer array_length(enc_t *e, int idx) {
  lua_State *L = e->L;
  if (lua_getmetatable(L, idx)) {
    bool arr = lua_rawequal(L, -1, e->mt);
    lua_pop(L, 1);
    if (arr)
      return (lua_Integer)lua_rawlen(L, idx);
  }
  lua_Integer max = 0, count = 0;
  lua_pushnil(L);
  while (lua_next(L, idx)) {
    lua_pop(L, 1);
    if (!lua_isinteger(L, -1) || lua_tointeger(L, -1) < 1) {
      lua_pop(L, 1);
      return -1;
    }
    lua_Integer k = lua_tointeger(L, -1);
    if (k > max)
      max = k;
    count++;
  }
  if (count == 0 && GET(empty_table_as_object))
    return -1;
  int ratio = GET(sparse_ratio), safe = GET(sparse_safe);
  if (ratio > 0 && max > safe && max > count * ratio)
    return GET(sparse_convert) ? -1 : -2;
  return max;
}

static int encode_array(enc_t *e, int idx, lua_Integer n) {
  lua_State *L = e->L;
  jbuf_t *b = e->b;
  if (!reserve(b, 1))
    return ENC_NOMEM;
  b->p[b->len++] = '[';
  for (lua_Integer i = 1; i <= n; i++) {
    if (i > 1) {
      if (!reserve(b, 1))
        return ENC_NOMEM;
      b->p[b->len++] = ',';
    }
    lua_rawgeti(L, idx, i);
    int rc = encode_value(e, lua_gettop(L));
    if (rc != ENC_OK) {
      lua_pushinteger(L, i);
      return with_key(e, rc, lua_gettop(L));
    }
    lua_pop(L, 1);
  }
  if (!reserve(b, 1))
    return ENC_NOMEM;
  b->p[b->len++] = ']';
  return ENC_OK;
}

static int encode_object(enc_t *e, int idx) {
  lua_State *L = e->L;
  jbuf_t *b = e->b;
  if (!reserve(b, 1))
    return ENC_NOMEM;
  b->p[b->len++] = '{';
  bool first = true;
  lua_pushnil(L);
  while (lua_next(L, idx)) {
    int key = lua_gettop(L) - 1;
    if (!first) {
      if (!reserve(b, 1))
        return ENC_NOMEM;
      b->p[b->len++] = ',';
    }
    first = false;
    int rc;
    int kt = lua_type(L, key);
    if (kt == LUA_TSTRING) {
      size_t n;
      const char *s = lua_tolstring(L, key, &n);
      rc = put_string(b, s, n);
    } else if (kt == LUA_TNUMBER) {       /* as its text, quoted */
      char num[40];
      size_t n = lua_isinteger(L, key) ? fmt_integer(num, lua_tointeger(L, key))
                                       : (size_t)snprintf(num, sizeof num, "%.17g",
                                                          lua_tonumber(L, key));
      rc = put_string(b, num, n);
    } else {
      return fail(e, "cannot encode a %s key", lua_typename(L, kt));
    }
    if (rc == ENC_OK && !reserve(b, 1))
      rc = ENC_NOMEM;
    if (rc != ENC_OK)
      return rc;
    b->p[b->len++] = ':';
    rc = encode_value(e, key + 1);
    if (rc != ENC_OK)
      return with_key(e, rc, key);
    lua_pop(L, 1);
  }
  if (!reserve(b, 1))
    return ENC_NOMEM;
  b->p[b->len++] = '}';
  return ENC_OK;
}

static int encode_table(enc_t *e, int idx) {
  if (++e->depth > e->max_depth) {
    snprintf(e->err, sizeof e->err, "nesting deeper than %d (a cycle?)", e->max_depth);
    return ENC_FAIL;
  }
  if (!lua_checkstack(e->L, 6))
    return ENC_NOMEM;
  lua_Integer n = array_length(e, idx);
  int rc = n >= 0    ? encode_array(e, idx, n)
           : n == -1 ? encode_object(e, idx)
                     : fail(e, "cannot encode an excessively sparse array "
                               "(see encode_sparse_array)%s", "");
  e->depth--;
  return rc;
}

static int encode_value(enc_t *e, int idx) {
  lua_State *L = e->L;
  jbuf_t *b = e->b;
  switch (lua_type(L, idx)) {
  case LUA_TSTRING: {
    size_t n;
    const char *s = lua_tolstring(L, idx, &n);
    return put_string(b, s, n);
  }
  case LUA_TNUMBER:
    return put_number(e, idx);
  case LUA_TTABLE:
    return encode_table(e, idx);
  case LUA_TBOOLEAN: {
    bool t = lua_toboolean(L, idx);
    if (!reserve(b, 5))
      return ENC_NOMEM;
    memcpy(b->p + b->len, t ? "true" : "false", t ? 4 : 5);
    b->len += t ? 4 : 5;
    return ENC_OK;
  }
  case LUA_TNIL:
    break;
  case LUA_TLIGHTUSERDATA: {
    void *p = lua_touserdata(L, idx);
    if (p == &EMPTY_ARRAY) {
      if (!reserve(b, 2))
        return ENC_NOMEM;
      memcpy(b->p + b->len, "[]", 2);
      b->len += 2;
      return ENC_OK;
    }
    if (p != NULL)
      return fail(e, "cannot encode %s", "a light userdata");
    break;
  }
  default:
    return fail(e, "cannot encode %s", luaL_typename(L, idx));
  }
  if (!reserve(b, 4))                  /* nil and null */
    return ENC_NOMEM;
  memcpy(b->p + b->len, "null", 4);
  b->len += 4;
  return ENC_OK;
}

/* json.encode(v) --> text; raises "netrun.json.encode: cannot encode
 * function at .handlers[2]" for what JSON cannot hold. */
/***
Encode a value as JSON text.
@param v nil (null), a boolean, a number, a string, or a table (an array
when its keys are 1..n, else an object with string keys)
@treturn string the text
@function encode
*/
static int l_encode(lua_State *L) {
  luaL_checkany(L, 1);
  lua_settop(L, 1);
  lua_pushvalue(L, ARRAY_MT);
  enc_t e = {.L = L, .b = lua_touserdata(L, SCRATCH), .mt = 2,
             .max_depth = GET(encode_max_depth)};
  e.b->len = 0;
  int rc = encode_value(&e, 1);
  if (rc == ENC_OK)
    lua_pushlstring(L, e.b->p, e.b->len);
  jbuf_reset(e.b);
  if (rc == ENC_NOMEM)
    return luaL_error(L, "netrun.json.encode: not enough memory");
  if (rc == ENC_FAIL)
    return luaL_error(L, "netrun.json.encode: %s%s%s", e.err,
                      e.path[0] ? " at " : "", e.path);
  return 1;
}

/* ---- settings -------------------------------------------------------- */

/* The settings configure knows (set_option reads each). */
static const char *const settings[] = {
    "encode_max_depth", "decode_max_depth", "encode_invalid_numbers",
    "decode_invalid_numbers", "encode_sparse_convert", "encode_sparse_ratio",
    "encode_sparse_safe", "encode_number_precision",
    "encode_empty_table_as_object", "decode_array_with_array_mt", NULL};

static bool opt_bool(const lnr_opts_t *o, const char *k) {
  if (!lua_isboolean(o->L, -1))
    lnr_opt_bad(o, k, -1, "a boolean");
  return lua_toboolean(o->L, -1);
}

static int opt_invalid(const lnr_opts_t *o, const char *k) {
  if (lua_type(o->L, -1) == LUA_TSTRING &&
      strcmp(lua_tostring(o->L, -1), "null") == 0)
    return INVALID_NULL;
  if (!lua_isboolean(o->L, -1))
    lnr_opt_bad(o, k, -1, "true, false or \"null\"");
  return lua_toboolean(o->L, -1) ? INVALID_ALLOW : INVALID_RAISE;
}

/* The setting named k to the value on top of the stack: checked always,
 * stored only if apply. */
static void set_option(const lnr_opts_t *o, const char *k, bool apply) {
#define INT(f, lo, hi) do { int v_ = (int)lnr_optv_integer(o, k, -1, lo, hi); if (apply) SET(f, v_); } while (0)
#define BOOL(f) do { bool v_ = opt_bool(o, k); if (apply) SET(f, v_); } while (0)
  if (strcmp(k, "encode_max_depth") == 0)
    INT(encode_max_depth, 1, 10000);
  else if (strcmp(k, "decode_max_depth") == 0)
    INT(decode_max_depth, 1, 10000);
  else if (strcmp(k, "encode_invalid_numbers") == 0) {
    int v = opt_invalid(o, k);
    if (apply)
      SET(encode_invalid, v);
  } else if (strcmp(k, "decode_invalid_numbers") == 0)
    BOOL(decode_invalid);
  else if (strcmp(k, "encode_sparse_convert") == 0)
    BOOL(sparse_convert);
  else if (strcmp(k, "encode_sparse_ratio") == 0)
    INT(sparse_ratio, 0, 1 << 30);
  else if (strcmp(k, "encode_sparse_safe") == 0)
    INT(sparse_safe, 0, 1 << 30);
  else if (strcmp(k, "encode_number_precision") == 0)
    INT(precision, 0, 17);
  else if (strcmp(k, "encode_empty_table_as_object") == 0)
    BOOL(empty_table_as_object);
  else if (strcmp(k, "decode_array_with_array_mt") == 0)
    BOOL(array_mt);
#undef INT
#undef BOOL
}

static void push_settings(lua_State *L) {
  lua_createtable(L, 0, 10);
  int inv = GET(encode_invalid);
  if (inv == INVALID_NULL)
    lua_pushliteral(L, "null");
  else
    lua_pushboolean(L, inv == INVALID_ALLOW);
  lua_setfield(L, -2, "encode_invalid_numbers");
#define FIELD_I(f, name) (lua_pushinteger(L, GET(f)), lua_setfield(L, -2, name))
#define FIELD_B(f, name) (lua_pushboolean(L, GET(f)), lua_setfield(L, -2, name))
  FIELD_I(encode_max_depth, "encode_max_depth");
  FIELD_I(decode_max_depth, "decode_max_depth");
  FIELD_B(decode_invalid, "decode_invalid_numbers");
  FIELD_B(sparse_convert, "encode_sparse_convert");
  FIELD_I(sparse_ratio, "encode_sparse_ratio");
  FIELD_I(sparse_safe, "encode_sparse_safe");
  FIELD_I(precision, "encode_number_precision");
  FIELD_B(empty_table_as_object, "encode_empty_table_as_object");
  FIELD_B(array_mt, "decode_array_with_array_mt");
#undef FIELD_I
#undef FIELD_B
}

/***
Process-wide settings (every state follows them), with lua-cjson's names:
`encode_max_depth` and `decode_max_depth` (1000), `encode_invalid_numbers`
and `decode_invalid_numbers` (false), `encode_sparse_convert` (false),
`encode_sparse_ratio` (2), `encode_sparse_safe` (10),
`encode_number_precision` (0: the shortest that round-trips),
`encode_empty_table_as_object` (true), `decode_array_with_array_mt` (true).
@tparam[opt] table settings those to change
@treturn table every setting
@function configure
*/

/* json.configure { setting = value, ... } --> every setting's value now
 * (process-wide); json.configure() only reads them. A setting checked
 * bad raises and changes nothing (all are checked first). */
static int l_configure(lua_State *L) {
  lnr_opts_t o;
  lnr_opts_open(&o, L, 1, "netrun.json.configure", settings, false);
  for (int apply = 0; o.t && apply < 2; apply++) {
    lua_pushnil(L);
    while (lua_next(L, 1)) {
      set_option(&o, lua_tostring(L, -2), apply);
      lua_pop(L, 1);
    }
  }
  push_settings(L);
  return 1;
}

/* core.json() --> this state's codec: { encode, decode, configure, null,
 * empty_array, array_mt }, sharing one scratch buffer and array_mt. */
static int l_new(lua_State *L) {
  lua_createtable(L, 0, 6);
  jbuf_t *b = lua_newuserdatauv(L, sizeof *b, 0);
  memset(b, 0, sizeof *b);
  b->alloc = lua_getallocf(L, &b->ud);
  lua_createtable(L, 0, 1);
  lua_pushcfunction(L, jbuf_gc);
  lua_setfield(L, -2, "__gc");
  lua_setmetatable(L, -2);
  lua_createtable(L, 0, 1);                 /* array_mt */
  lua_pushliteral(L, "array");
  lua_setfield(L, -2, "__jsontype");
  lua_pushvalue(L, -1);
  lua_setfield(L, -4, "array_mt");
  lua_pushvalue(L, -2);
  lua_pushvalue(L, -2);
  lua_pushcclosure(L, l_encode, 2);
  lua_setfield(L, -4, "encode");
  lua_pushcclosure(L, lnr_json_decode, 2);
  lua_setfield(L, -2, "decode");
  lua_pushcfunction(L, l_configure);
  lua_setfield(L, -2, "configure");
  lua_pushlightuserdata(L, NULL);
  lua_setfield(L, -2, "null");
  lua_pushlightuserdata(L, (void *)&EMPTY_ARRAY);
  lua_setfield(L, -2, "empty_array");
  return 1;
}

static void open_json(lua_State *L) {
  lua_pushcfunction(L, l_new);
  lua_setfield(L, -2, "json");
}

lnr_module_t lnr_json_module = {.name = "json", .open = open_json};
