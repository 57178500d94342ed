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
 */
#include <locale.h>
#include <math.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "lnr.h"

/* ---- settings ------------------------------------------------------ */

enum { INVALID_RAISE, INVALID_ALLOW, INVALID_NULL };

static struct {
  atomic_int encode_max_depth, decode_max_depth;
  atomic_int encode_invalid;          /* INVALID_* */
  atomic_bool decode_invalid;         /* NaN, Infinity, -Infinity accepted */
  atomic_bool sparse_convert;         /* excessively sparse: an object */
  atomic_int sparse_ratio, sparse_safe;
  atomic_int precision;               /* 0: shortest that round-trips */
  atomic_bool empty_table_as_object;
  atomic_bool array_mt;               /* decoded arrays get array_mt */
} cfg = {1000, 1000, INVALID_RAISE, false, false, 2, 10, 0, true, true};

#define GET(f) atomic_load_explicit(&cfg.f, memory_order_relaxed)
#define SET(f, v) atomic_store_explicit(&cfg.f, (v), memory_order_relaxed)

/* The empty_array sentinel: a light userdata that is the same value in
 * every state (as null is), so it crosses states by name. */
static const char EMPTY_ARRAY = 0;

/* ---- the scratch buffer --------------------------------------------- */

#define SCRATCH_KEEP (64 * 1024)

typedef struct jbuf_s {
  char *p;
  size_t len, cap;
  lua_Alloc alloc;
  void *ud;
} jbuf_t;

static int jbuf_gc(lua_State *L) {
  jbuf_t *b = lua_touserdata(L, 1);
  if (b->p)
    b->alloc(b->ud, b->p, b->cap, 0);
  b->p = NULL;
  b->cap = b->len = 0;
  return 0;
}

/* Room for n more bytes, or false (out of memory, or past SIZE_MAX/2). */
static bool reserve_slow(jbuf_t *b, size_t n) {
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

static inline bool reserve(jbuf_t *b, size_t n) {
  return b->cap - b->len >= n || reserve_slow(b, n);
}

/* After a call: a buffer grown past SCRATCH_KEEP is given back. */
static void jbuf_reset(jbuf_t *b) {
  b->len = 0;
  if (b->cap > SCRATCH_KEEP) {
    b->alloc(b->ud, b->p, b->cap, 0);
    b->p = NULL;
    b->cap = 0;
  }
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

static const double POW10[] = {1e0, 1e1, 1e2, 1e3, 1e4, 1e5, 1e6, 1e7, 1e8, 1e9, 1e10,
                               1e11, 1e12, 1e13, 1e14, 1e15, 1e16, 1e17, 1e18, 1e19,
                               1e20, 1e21, 1e22};
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

#define SCRATCH lua_upvalueindex(1)
#define ARRAY_MT lua_upvalueindex(2)

/* json.encode(v) --> text; raises "netrun.json.encode: cannot encode
 * function at .handlers[2]" for what JSON cannot hold. */
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

/* ---- decoding -------------------------------------------------------- */

typedef struct dec_s {
  lua_State *L;
  const char *s, *p, *end;
  jbuf_t *b;
  int depth, max_depth;
  bool invalid_ok, mark_arrays;
} dec_t;

static int dec_error(dec_t *d, const char *what) {
  size_t at = (size_t)(d->p - d->s) + 1;
  if (d->p >= d->end)
    return luaL_error(d->L, "netrun.json.decode: %s but the text ended (character %d)",
                      what, (int)at);
  unsigned char c = (unsigned char)*d->p;
  if (c >= 0x20 && c < 0x7f)
    return luaL_error(d->L, "netrun.json.decode: %s but found '%c' at character %d",
                      what, c, (int)at);
  return luaL_error(d->L, "netrun.json.decode: %s but found byte %d at character %d",
                    what, c, (int)at);
}

static inline void skip_ws(dec_t *d) {
  while (d->p < d->end && (*d->p == ' ' || *d->p == '\n' || *d->p == '\r' || *d->p == '\t'))
    d->p++;
}

static bool literal(dec_t *d, const char *word, size_t n) {
  if ((size_t)(d->end - d->p) < n || memcmp(d->p, word, n) != 0)
    return false;
  d->p += n;
  return true;
}

static inline bool digit(dec_t *d) { return d->p < d->end && *d->p >= '0' && *d->p <= '9'; }

/* A float of at most 15 significant digits and a small exponent, from
 * text already checked: m * 10^e or m / 10^-e with m below 2^53 and |e|
 * <= 22 is correctly rounded (Clinger's fast path), as strtod would
 * round it. Pushes it and returns true, or false for the general case. */
static bool fast_float(lua_State *L, const char *p, const char *end, bool neg) {
  uint64_t m = 0;
  int sig = 0, exp10 = 0;
  bool frac = false;
  for (; p < end && *p != 'e' && *p != 'E'; p++) {
    if (*p == '.') {
      frac = true;
      continue;
    }
    if (sig > 0 || *p != '0')
      sig++;
    if (sig > 15)
      return false;
    m = m * 10 + (uint64_t)(*p - '0');
    exp10 -= frac;
  }
  if (p < end) {                         /* the exponent */
    p++;
    bool eneg = *p == '-';
    p += *p == '+' || *p == '-';
    int e = 0;
    for (; p < end; p++) {
      if (e > 1000)
        return false;
      e = e * 10 + (*p - '0');
    }
    exp10 += eneg ? -e : e;
  }
  if (exp10 < -22 || exp10 > 22)
    return false;
  double v = (double)m;
  v = exp10 < 0 ? v / POW10[-exp10] : v * POW10[exp10];
  lua_pushnumber(L, neg ? -v : v);
  return true;
}

/* A number: checked against JSON's grammar, then an integer when it has
 * neither fraction nor exponent and fits in 64 bits, else a float. */
static void decode_number(dec_t *d) {
  const char *start = d->p;
  bool neg = d->p < d->end && *d->p == '-';
  d->p += neg;
  if (!digit(d))
    dec_error(d, "expected a digit");
  if (*d->p == '0')
    d->p++;
  else
    while (digit(d))
      d->p++;
  bool integer = true;
  if (d->p < d->end && *d->p == '.') {
    d->p++;
    if (!digit(d))
      dec_error(d, "expected a digit after the decimal point");
    while (digit(d))
      d->p++;
    integer = false;
  }
  if (d->p < d->end && (*d->p | 32) == 'e') {
    d->p++;
    if (d->p < d->end && (*d->p == '+' || *d->p == '-'))
      d->p++;
    if (!digit(d))
      dec_error(d, "expected a digit in the exponent");
    while (digit(d))
      d->p++;
    integer = false;
  }
  size_t len = (size_t)(d->p - start);
  if (integer && len - neg <= 18) {      /* < 10^18: no overflow possible */
    lua_Integer v = 0;
    for (const char *c = start + neg; c < d->p; c++)
      v = v * 10 + (*c - '0');
    lua_pushinteger(d->L, neg ? -v : v);
    return;
  }
  if (!integer && fast_float(d->L, start + neg, d->p, neg))
    return;
  /* Lua's own reader: an integer if it fits, else a float (as 2^64 is). */
  char small[64];
  char *text = small;
  if (len >= sizeof small)
    text = lua_newuserdatauv(d->L, len + 1, 0);
  memcpy(text, start, len);
  text[len] = '\0';
  if (lua_stringtonumber(d->L, text) == 0) {
    d->p = start;
    dec_error(d, "expected a number");
  }
  if (text != small)
    lua_remove(d->L, -2);
}

static unsigned hex4(dec_t *d) {
  unsigned v = 0;
  for (int i = 0; i < 4; i++, d->p++) {
    char c = d->p < d->end ? *d->p : 0;
    int x = c >= '0' && c <= '9' ? c - '0' : (c | 32) >= 'a' && (c | 32) <= 'f' ? (c | 32) - 'a' + 10 : -1;
    if (x < 0)
      dec_error(d, "expected 4 hex digits after \\u");
    v = v << 4 | (unsigned)x;
  }
  return v;
}

static size_t utf8(char *out, unsigned cp) {
  if (cp < 0x80) {
    out[0] = (char)cp;
    return 1;
  }
  if (cp < 0x800) {
    out[0] = (char)(0xc0 | cp >> 6);
    out[1] = (char)(0x80 | (cp & 0x3f));
    return 2;
  }
  if (cp < 0x10000) {
    out[0] = (char)(0xe0 | cp >> 12);
    out[1] = (char)(0x80 | ((cp >> 6) & 0x3f));
    out[2] = (char)(0x80 | (cp & 0x3f));
    return 3;
  }
  out[0] = (char)(0xf0 | cp >> 18);
  out[1] = (char)(0x80 | ((cp >> 12) & 0x3f));
  out[2] = (char)(0x80 | ((cp >> 6) & 0x3f));
  out[3] = (char)(0x80 | (cp & 0x3f));
  return 4;
}

/* \uXXXX (the backslash and u read): a code point, a surrogate pair
 * joined; a lone surrogate is refused (it has no UTF-8). */
static unsigned unicode_escape(dec_t *d) {
  const char *at = d->p - 2;
  unsigned cp = hex4(d);
  if (cp >= 0xdc00 && cp <= 0xdfff) {
    d->p = at;
    dec_error(d, "expected a high surrogate before a low one");
  }
  if (cp >= 0xd800 && cp <= 0xdbff) {
    if (!literal(d, "\\u", 2)) {
      d->p = at;
      dec_error(d, "expected a low surrogate after a high one");
    }
    unsigned lo = hex4(d);
    if (lo < 0xdc00 || lo > 0xdfff) {
      d->p = at;
      dec_error(d, "expected a low surrogate after a high one");
    }
    cp = 0x10000 + ((cp - 0xd800) << 10) + (lo - 0xdc00);
  }
  return cp;
}

/* A string (the opening quote read). Bytes pass as they are (no UTF-8
 * check, as cjson); control characters must be escaped, as RFC 8259
 * says. Without escapes the text is pushed straight from the input. */
static void decode_string(dec_t *d) {
  const char *run = d->p;
  while (d->p < d->end) {
    unsigned char c = (unsigned char)*d->p;
    if (c == '"' || c == '\\' || c < 0x20)
      break;
    d->p++;
  }
  if (d->p < d->end && *d->p == '"') {
    lua_pushlstring(d->L, run, (size_t)(d->p - run));
    d->p++;
    return;
  }
  jbuf_t *b = d->b;
  b->len = 0;
  for (;;) {
    while (d->p < d->end) {
      unsigned char c = (unsigned char)*d->p;
      if (c == '"' || c == '\\' || c < 0x20)
        break;
      d->p++;
    }
    size_t n = (size_t)(d->p - run);
    if (!reserve(b, n + 4))
      luaL_error(d->L, "netrun.json.decode: not enough memory");
    memcpy(b->p + b->len, run, n);
    b->len += n;
    if (d->p >= d->end)
      dec_error(d, "expected '\"' to end the string");
    char c = *d->p++;
    if (c == '"')
      break;
    if (c != '\\') {
      d->p--;
      dec_error(d, "expected an escaped control character");
    }
    char e = d->p < d->end ? *d->p++ : 0;
    switch (e) {
    case '"': case '\\': case '/': b->p[b->len++] = e; break;
    case 'b': b->p[b->len++] = '\b'; break;
    case 'f': b->p[b->len++] = '\f'; break;
    case 'n': b->p[b->len++] = '\n'; break;
    case 'r': b->p[b->len++] = '\r'; break;
    case 't': b->p[b->len++] = '\t'; break;
    case 'u': b->len += utf8(b->p + b->len, unicode_escape(d)); break;
    default:
      d->p -= 1 + (e != 0);
      dec_error(d, "expected a valid escape");
    }
    run = d->p;
  }
  lua_pushlstring(d->L, b->p, b->len);
  jbuf_reset(b);
}

static void decode_value(dec_t *d);

static void enter(dec_t *d) {
  if (++d->depth > d->max_depth) {
    char what[80];
    snprintf(what, sizeof what, "expected nesting of at most %d (decode_max_depth)",
             d->max_depth);
    dec_error(d, what);
  }
  luaL_checkstack(d->L, 4, "netrun.json.decode: nesting too deep");
}

static void decode_object(dec_t *d) {
  enter(d);
  lua_createtable(d->L, 0, 4);
  skip_ws(d);
  if (d->p < d->end && *d->p == '}') {
    d->p++;
    d->depth--;
    return;
  }
  for (;;) {
    if (d->p >= d->end || *d->p != '"')
      dec_error(d, "expected a string key");
    d->p++;
    decode_string(d);
    skip_ws(d);
    if (d->p >= d->end || *d->p != ':')
      dec_error(d, "expected ':' after a key");
    d->p++;
    skip_ws(d);
    decode_value(d);
    lua_rawset(d->L, -3);
    skip_ws(d);
    if (d->p < d->end && *d->p == ',') {
      d->p++;
      skip_ws(d);
    } else if (d->p < d->end && *d->p == '}') {
      d->p++;
      break;
    } else {
      dec_error(d, "expected ',' or '}'");
    }
  }
  d->depth--;
}

static void decode_array(dec_t *d) {
  enter(d);
  lua_createtable(d->L, 4, 0);
  if (d->mark_arrays) {
    lua_pushvalue(d->L, ARRAY_MT);
    lua_setmetatable(d->L, -2);
  }
  skip_ws(d);
  if (d->p < d->end && *d->p == ']') {
    d->p++;
    d->depth--;
    return;
  }
  for (lua_Integer i = 1;; i++) {
    decode_value(d);
    lua_rawseti(d->L, -2, i);
    skip_ws(d);
    if (d->p < d->end && *d->p == ',') {
      d->p++;
      skip_ws(d);
    } else if (d->p < d->end && *d->p == ']') {
      d->p++;
      break;
    } else {
      dec_error(d, "expected ',' or ']'");
    }
  }
  d->depth--;
}

static void decode_value(dec_t *d) {
  lua_State *L = d->L;
  char c = d->p < d->end ? *d->p : 0;
  switch (c) {
  case '{': d->p++; decode_object(d); return;
  case '[': d->p++; decode_array(d); return;
  case '"': d->p++; decode_string(d); return;
  case 't': if (literal(d, "true", 4)) { lua_pushboolean(L, 1); return; } break;
  case 'f': if (literal(d, "false", 5)) { lua_pushboolean(L, 0); return; } break;
  case 'n': if (literal(d, "null", 4)) { lua_pushlightuserdata(L, NULL); return; } break;
  case 'N': if (d->invalid_ok && literal(d, "NaN", 3)) { lua_pushnumber(L, NAN); return; } break;
  case 'I': if (d->invalid_ok && literal(d, "Infinity", 8)) { lua_pushnumber(L, HUGE_VAL); return; } break;
  case '-':
    if (d->invalid_ok && literal(d, "-Infinity", 9)) {
      lua_pushnumber(L, -HUGE_VAL);
      return;
    }
    decode_number(d);
    return;
  default:
    if (c >= '0' && c <= '9') {
      decode_number(d);
      return;
    }
  }
  dec_error(d, "expected a value");
}

/* json.decode(text) --> value; raises "netrun.json.decode: expected a
 * value but found 'x' at character 7" for text that is not JSON. */
static int l_decode(lua_State *L) {
  if (lua_type(L, 1) != LUA_TSTRING)
    return luaL_error(L, "netrun.json.decode: expected a string, got %s", luaL_typename(L, 1));
  size_t n;
  const char *s = lua_tolstring(L, 1, &n);
  lua_settop(L, 1);
  dec_t d = {.L = L, .s = s, .p = s, .end = s + n, .b = lua_touserdata(L, SCRATCH),
             .max_depth = GET(decode_max_depth), .invalid_ok = GET(decode_invalid),
             .mark_arrays = GET(array_mt)};
  skip_ws(&d);
  decode_value(&d);
  skip_ws(&d);
  if (d.p < d.end)
    dec_error(&d, "expected the end of the text");
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
  lua_pushcclosure(L, l_decode, 2);
  lua_setfield(L, -2, "decode");
  lua_pushcfunction(L, l_configure);
  lua_setfield(L, -2, "configure");
  lua_pushlightuserdata(L, NULL);
  lua_setfield(L, -2, "null");
  lua_pushlightuserdata(L, (void *)&EMPTY_ARRAY);
  lua_setfield(L, -2, "empty_array");
  return 1;
}

void lnr_open_json(lua_State *L) {
  lua_pushcfunction(L, l_new);
  lua_setfield(L, -2, "json");
}
