/*
 * ljson_decode.c -- JSON text (RFC 8259) to Lua values for netrun.json:
 * a number without fraction or exponent becomes an integer when it fits
 * in 64 bits; arrays carry array_mt when decode_array_with_array_mt is on;
 * nesting stops at decode_max_depth. (Encoding and the settings are
 * ljson.c's; ljson.c's header says why this is not lua-cjson.)
 *
 * Threads: the state that runs the call; the settings are read relaxed.
 */

/***
@module netrun.json
*/
#include <locale.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ljson.h"

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
/***
Decode JSON text.
@string text the text
@return the value (null as `netrun.json.null`)
@function decode
*/
int lnr_json_decode(lua_State *L) {
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
