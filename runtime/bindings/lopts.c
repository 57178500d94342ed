/*
 * lopts.c -- the option readers of lopts.h, their messages, the caller's
 * position, and core.options: the same readers for the constructors
 * written in Lua.
 *
 * Everything here runs on the thread of the state it is given, once per
 * constructor call; nothing is shared between states but constant tables.
 * Messages are built only on the way to lua_error.
 */
#include <ctype.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "lnr.h"
#include "lopts.h"

/* ---- showing values and positions ----------------------------------------------- */

/* A string as Lua source would write it, cut at 40 bytes. */
static void push_quoted(lua_State *L, int idx) {
  size_t n;
  const char *s = lua_tolstring(L, idx, &n);
  luaL_Buffer b;
  luaL_buffinit(L, &b);
  luaL_addchar(&b, '"');
  for (size_t i = 0; i < n && i < 40; i++) {
    unsigned char c = (unsigned char)s[i];
    if (c == '"' || c == '\\') {
      luaL_addchar(&b, '\\');
      luaL_addchar(&b, (char)c);
    } else if (isprint(c)) {
      luaL_addchar(&b, (char)c);
    } else {
      char esc[8];
      snprintf(esc, sizeof esc, "\\%d", c);
      luaL_addstring(&b, esc);
    }
  }
  luaL_addstring(&b, n > 40 ? "\"..." : "\"");
  luaL_pushresult(&b);
}

void lnr_push_shown(lua_State *L, int idx) {
  idx = lua_absindex(L, idx);
  switch (lua_type(L, idx)) {
  case LUA_TNONE:
  case LUA_TNIL: lua_pushliteral(L, "nil"); return;
  case LUA_TSTRING: push_quoted(L, idx); return;
  case LUA_TNUMBER:
  case LUA_TBOOLEAN: luaL_tolstring(L, idx, NULL); return;
  default: break;
  }
  if (luaL_getmetafield(L, idx, "__tostring") != LUA_TNIL) {
    lua_pop(L, 1);
    luaL_tolstring(L, idx, NULL);    /* a handle: netrun.tls.client (...) */
    return;
  }
  if (luaL_getmetafield(L, idx, "__name") == LUA_TSTRING) {
    lua_pushfstring(L, "a %s", lua_tostring(L, -1));
    lua_remove(L, -2);
    return;
  }
  lua_pushfstring(L, "a %s", luaL_typename(L, idx));
}

/* The key of the "@" source prefix of netrun's own Lua modules in this
 * state ("@/usr/share/lua/5.4/netrun/"), which lua/netrun/init.lua
 * registers when it loads (core.options_home). */
static const char HOME_KEY = 0;

/* core.options_home(): the calling chunk's directory is netrun's. */
static int l_options_home(lua_State *L) {
  lua_Debug ar;
  if (!lua_getstack(L, 1, &ar) || !lua_getinfo(L, "S", &ar) ||
      ar.source[0] != '@')
    return 0;
  const char *slash = strrchr(ar.source, '/');
  if (slash == NULL)
    return 0;
  lua_pushlstring(L, ar.source, (size_t)(slash - ar.source + 1));
  lua_rawsetp(L, LUA_REGISTRYINDEX, &HOME_KEY);
  return 0;
}

void lnr_push_where(lua_State *L) {
  size_t n = 0;
  const char *home = NULL;
  if (lua_rawgetp(L, LUA_REGISTRYINDEX, &HOME_KEY) == LUA_TSTRING)
    home = lua_tolstring(L, -1, &n);
  lua_Debug ar;
  for (int level = 1; lua_getstack(L, level, &ar); level++) {
    lua_getinfo(L, "Sl", &ar);
    if (ar.currentline <= 0)             /* C: pcall, or one of ours */
      continue;
    if (home && strncmp(ar.source, home, n) == 0)
      continue;                          /* netrun's Lua: its caller's */
    lua_pop(L, 1);
    lua_pushfstring(L, "%s:%d: ", ar.short_src, ar.currentline);
    return;
  }
  lua_pop(L, 1);
  luaL_where(L, 1);
}

/* Raise the message on top, the caller's position before it. */
static _Noreturn void raise_top(lua_State *L) {
  lnr_push_where(L);
  lua_insert(L, -2);
  lua_concat(L, 2);
  lua_error(L);
  abort();                               /* (lua_error does not return) */
}

_Noreturn void lnr_raise(lua_State *L, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  lua_pushvfstring(L, fmt, ap);
  va_end(ap);
  raise_top(L);
}

_Noreturn void lnr_opts_error(const lnr_opts_t *o, const char *fmt, ...) {
  lua_State *L = o->L;
  lua_pushfstring(L, "%s: ", o->what);
  va_list ap;
  va_start(ap, fmt);
  lua_pushvfstring(L, fmt, ap);
  va_end(ap);
  lua_concat(L, 2);
  raise_top(L);
}

_Noreturn void lnr_opt_bad(const lnr_opts_t *o, const char *k, int idx,
                           const char *expect) {
  lua_State *L = o->L;
  idx = lua_absindex(L, idx);
  lnr_push_shown(L, idx);
  lnr_opts_error(o, "%s%s must be %s, got %s", o->prefix, k, expect,
                 lua_tostring(L, -1));
}

/* ---- keys ------------------------------------------------------------------------ */

int lnr_edit_distance(const char *a, const char *b) {
  size_t na = strlen(a), nb = strlen(b);
  if (na >= 64 || nb >= 64)
    return 64;
  int rows[3][65], *pp = rows[0], *prev = rows[1], *cur = rows[2];
  for (size_t j = 0; j <= nb; j++)
    prev[j] = (int)j;
  for (size_t i = 1; i <= na; i++) {
    cur[0] = (int)i;
    for (size_t j = 1; j <= nb; j++) {
      int best = prev[j - 1] + (a[i - 1] != b[j - 1]);
      if (prev[j] + 1 < best)
        best = prev[j] + 1;
      if (cur[j - 1] + 1 < best)
        best = cur[j - 1] + 1;
      if (i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1] &&
          pp[j - 2] + 1 < best)
        best = pp[j - 2] + 1;
      cur[j] = best;
    }
    int *t = pp;                          /* rotate: prev becomes pp ... */
    pp = prev;
    prev = cur;
    cur = t;
  }
  return prev[nb];
}

const char *lnr_closest(const char *k, const char *const *known) {
  const char *best = NULL;
  int bd = 3;                            /* at most 2 edits ... */
  for (int i = 0; known[i]; i++) {
    int d = lnr_edit_distance(k, known[i]);
    if (d < bd && (size_t)d * 2 <= strlen(known[i])) {  /* ... of a half */
      bd = d;
      best = known[i];
    }
  }
  return best;
}

/* Whether k is one of known. The first bytes are compared inline: most
 * names differ there, and a strcmp call per known name was a third of
 * what checking a table's keys cost (a connection's constructors check
 * some forty keys). */
static bool is_known(const char *k, const char *const *known) {
  for (int i = 0; known[i]; i++)
    if (known[i][0] == k[0] && strcmp(k, known[i]) == 0)
      return true;
  return false;
}

/* Raise for the first key of o's table not in known. */
static void check_keys(const lnr_opts_t *o, const char *const *known) {
  lua_State *L = o->L;
  lua_pushnil(L);
  while (lua_next(L, o->t)) {
    lua_pop(L, 1);
    if (lua_type(L, -1) != LUA_TSTRING) {
      lnr_push_shown(L, -1);
      lnr_opts_error(o, "option names are strings, got %s", lua_tostring(L, -1));
    }
    const char *k = lua_tostring(L, -1);
    if (is_known(k, known))
      continue;
    const char *best = lnr_closest(k, known);
    if (best)
      lnr_opts_error(o, "unknown option '%s%s' (did you mean '%s%s'?)",
                     o->prefix, k, o->prefix, best);
    lnr_opts_error(o, "unknown option '%s%s'", o->prefix, k);
  }
}

/* ---- tables ---------------------------------------------------------------------- */

void lnr_opts_open(lnr_opts_t *o, lua_State *L, int idx, const char *what,
                   const char *const *known, bool required) {
  o->L = L;
  o->what = what;
  o->prefix[0] = '\0';
  o->t = 0;
  int type = lua_type(L, idx);
  if (type == LUA_TTABLE) {
    o->t = lua_absindex(L, idx);
    if (known)
      check_keys(o, known);
    return;
  }
  if (type <= LUA_TNIL && !required)
    return;
  lnr_push_shown(L, idx);
  lnr_opts_error(o, "expected a table of options, got %s", lua_tostring(L, -1));
}

void lnr_opts_at(lnr_opts_t *sub, const lnr_opts_t *o, int idx,
                 const char *name, const char *const *known) {
  lua_State *L = o->L;
  sub->L = L;
  sub->what = o->what;
  if (snprintf(sub->prefix, sizeof sub->prefix, "%s%s.", o->prefix, name) >=
      (int)sizeof sub->prefix)           /* cut: still a path */
    memcpy(sub->prefix + sizeof sub->prefix - 5, "....", 5);
  sub->t = 0;
  int type = lua_type(L, idx);
  if (type <= LUA_TNIL)
    return;
  if (type != LUA_TTABLE)
    lnr_opt_bad(o, name, idx, "a table");
  sub->t = lua_absindex(L, idx);
  if (known)
    check_keys(sub, known);
}

void lnr_opts_sub(lnr_opts_t *sub, const lnr_opts_t *o, const char *k,
                  const char *const *known) {
  if (o->t)
    lua_getfield(o->L, o->t, k);
  else
    lua_pushnil(o->L);
  lnr_opts_at(sub, o, -1, k, known);
}

/* ---- values on the stack ------------------------------------------------------------- */

/* "a number from 0 to 1", "... >= 0", "... <= 9", or "a number". */
static const char *range(lua_State *L, const char *kind, lua_Number min,
                         lua_Number max) {
  if (min > -HUGE_VAL && max < HUGE_VAL)
    return lua_pushfstring(L, "%s from %f to %f", kind, min, max);
  if (min > -HUGE_VAL)
    return lua_pushfstring(L, "%s >= %f", kind, min);
  if (max < HUGE_VAL)
    return lua_pushfstring(L, "%s <= %f", kind, max);
  return kind;
}

/* The same for integers: "an integer from 0 to 65535". */
static const char *int_range(lua_State *L, const char *kind, lua_Integer min,
                             lua_Integer max) {
  if (min > LUA_MININTEGER && max < LUA_MAXINTEGER)
    return lua_pushfstring(L, "%s from %I to %I", kind, (LUAI_UACINT)min,
                           (LUAI_UACINT)max);
  if (min > LUA_MININTEGER)
    return lua_pushfstring(L, "%s >= %I", kind, (LUAI_UACINT)min);
  if (max < LUA_MAXINTEGER)
    return lua_pushfstring(L, "%s <= %I", kind, (LUAI_UACINT)max);
  return kind;
}

lua_Integer lnr_optv_integer(const lnr_opts_t *o, const char *k, int idx,
                             lua_Integer min, lua_Integer max) {
  idx = lua_absindex(o->L, idx);      /* before messages push */
  int ok = 0;
  lua_Integer v = lua_tointegerx(o->L, idx, &ok);   /* "8080" too */
  if (!ok || v < min || v > max)
    lnr_opt_bad(o, k, idx, int_range(o->L, "an integer", min, max));
  return v;
}

lua_Number lnr_optv_number(const lnr_opts_t *o, const char *k, int idx,
                           lua_Number min, lua_Number max) {
  idx = lua_absindex(o->L, idx);      /* before messages push */
  int ok = 0;
  lua_Number v = lua_tonumberx(o->L, idx, &ok);     /* "2.5" too */
  if (!ok || !(v >= min && v <= max))               /* NaN fails */
    lnr_opt_bad(o, k, idx, range(o->L, "a number", min, max));
  return v;
}

uint64_t lnr_optv_seconds(const lnr_opts_t *o, const char *k, int idx) {
  idx = lua_absindex(o->L, idx);      /* before messages push */
  int ok = 0;
  lua_Number s = lua_tonumberx(o->L, idx, &ok);
  if (!ok || !(s >= 0 && s <= 1e9))
    lnr_opt_bad(o, k, idx, "a number of seconds from 0 to 1e9");
  uint64_t ns = lnr_ns(s);
  return s > 0 && ns == 0 ? 1 : ns;
}

/* "64k": digits and a k, m or g (any case), with spaces around as Lua
 * allows them around numbers; -1 if s is not that. */
static int64_t suffixed(const char *s) {
  while (isspace((unsigned char)*s))
    s++;
  if (!isdigit((unsigned char)*s))
    return -1;
  char *end;
  unsigned long long v = strtoull(s, &end, 10);
  int shift = 0;
  switch (*end) {
  case 'k': case 'K': shift = 10; break;
  case 'm': case 'M': shift = 20; break;
  case 'g': case 'G': shift = 30; break;
  default: return -1;
  }
  for (end++; isspace((unsigned char)*end); end++) {
  }
  if (*end != '\0' || v > ((unsigned long long)1 << 50))
    return -1;
  return (int64_t)(v << shift);
}

size_t lnr_optv_size(const lnr_opts_t *o, const char *k, int idx, size_t min,
                     size_t max) {
  idx = lua_absindex(o->L, idx);      /* before messages push */
  lua_State *L = o->L;
  int ok = 0;
  lua_Integer v = lua_tointegerx(L, idx, &ok);
  if (!ok && lua_type(L, idx) == LUA_TSTRING) {
    int64_t s = suffixed(lua_tostring(L, idx));
    ok = s >= 0;
    v = (lua_Integer)s;
  }
  if (!ok || v < 0 || (size_t)v < min || (size_t)v > max)
    lnr_opt_bad(o, k, idx, int_range(L, "a size in bytes", (lua_Integer)min,
                                     (lua_Integer)max));
  return (size_t)v;
}

/* `"none", "optional" or "required"` */
static const char *alternatives(lua_State *L, const char *const *names) {
  luaL_Buffer b;
  luaL_buffinit(L, &b);
  for (int i = 0; names[i]; i++) {
    if (i > 0)
      luaL_addstring(&b, names[i + 1] ? ", " : " or ");
    luaL_addchar(&b, '"');
    luaL_addstring(&b, names[i]);
    luaL_addchar(&b, '"');
  }
  luaL_pushresult(&b);
  return lua_tostring(L, -1);
}

int lnr_optv_enum(const lnr_opts_t *o, const char *k, int idx,
                  const char *const *names) {
  idx = lua_absindex(o->L, idx);      /* before messages push */
  if (lua_type(o->L, idx) == LUA_TSTRING) {
    const char *s = lua_tostring(o->L, idx);
    for (int i = 0; names[i]; i++)
      if (strcmp(s, names[i]) == 0)
        return i;
  }
  lnr_opt_bad(o, k, idx, alternatives(o->L, names));
}

int lnr_optv_strings(const lnr_opts_t *o, const char *k, int idx, int max) {
  lua_State *L = o->L;
  idx = lua_absindex(L, idx);
  lua_Integer n = lua_type(L, idx) == LUA_TTABLE ? (lua_Integer)lua_rawlen(L, idx)
                                                 : 0;
  if (n < 1 || n > max)
    lnr_opt_bad(o, k, idx, lua_pushfstring(L, "an array of 1 to %d strings", max));
  for (lua_Integer i = 1; i <= n; i++) {
    if (lua_rawgeti(L, idx, i) != LUA_TSTRING)
      lnr_opt_bad(o, lua_pushfstring(L, "%s[%I]", k, (LUAI_UACINT)i), -2,
                  "a string");
    lua_pop(L, 1);
  }
  return (int)n;
}

/* ---- readers ---------------------------------------------------------------------------- */

/* Push field k of o (nil when o has no table): its type. */
static int field(const lnr_opts_t *o, const char *k) {
  if (o->t == 0) {
    lua_pushnil(o->L);
    return LUA_TNIL;
  }
  return lua_getfield(o->L, o->t, k);
}

lua_Integer lnr_opt_integer(const lnr_opts_t *o, const char *k,
                            lua_Integer def, lua_Integer min, lua_Integer max) {
  if (field(o, k) != LUA_TNIL)
    def = lnr_optv_integer(o, k, -1, min, max);
  lua_pop(o->L, 1);
  return def;
}

lua_Number lnr_opt_number(const lnr_opts_t *o, const char *k, lua_Number def,
                          lua_Number min, lua_Number max) {
  if (field(o, k) != LUA_TNIL)
    def = lnr_optv_number(o, k, -1, min, max);
  lua_pop(o->L, 1);
  return def;
}

uint64_t lnr_opt_seconds(const lnr_opts_t *o, const char *k, uint64_t def) {
  if (field(o, k) != LUA_TNIL)
    def = lnr_optv_seconds(o, k, -1);
  lua_pop(o->L, 1);
  return def;
}

bool lnr_opt_boolean(const lnr_opts_t *o, const char *k, bool def) {
  int t = field(o, k);
  if (t != LUA_TNIL && t != LUA_TBOOLEAN)
    lnr_opt_bad(o, k, -1, "a boolean");
  if (t == LUA_TBOOLEAN)
    def = lua_toboolean(o->L, -1);
  lua_pop(o->L, 1);
  return def;
}

const char *lnr_opt_string(const lnr_opts_t *o, const char *k, const char *def,
                           size_t *len) {
  int t = field(o, k);
  if (t != LUA_TNIL && t != LUA_TSTRING)
    lnr_opt_bad(o, k, -1, "a string");
  const char *s = def;
  if (t == LUA_TSTRING)
    s = lua_tolstring(o->L, -1, len);     /* anchored by the table */
  else if (len)
    *len = def ? strlen(def) : 0;
  lua_pop(o->L, 1);
  return s;
}

int lnr_opt_enum(const lnr_opts_t *o, const char *k, int def,
                 const char *const *names) {
  if (field(o, k) != LUA_TNIL)
    def = lnr_optv_enum(o, k, -1, names);
  lua_pop(o->L, 1);
  return def;
}

size_t lnr_opt_size(const lnr_opts_t *o, const char *k, size_t def,
                    size_t min, size_t max) {
  if (field(o, k) != LUA_TNIL)
    def = lnr_optv_size(o, k, -1, min, max);
  lua_pop(o->L, 1);
  return def;
}

int lnr_opt_strings(const lnr_opts_t *o, const char *k, int max) {
  if (field(o, k) == LUA_TNIL) {
    lua_pop(o->L, 1);
    return 0;
  }
  return lnr_optv_strings(o, k, -1, max);
}

void *lnr_opt_handle(const lnr_opts_t *o, const char *k, int kind,
                     const char *expect) {
  if (field(o, k) == LUA_TNIL) {
    lua_pop(o->L, 1);
    return NULL;
  }
  void *h = lnr_to_handle(o->L, -1, kind);
  if (h == NULL)
    lnr_opt_bad(o, k, -1, expect);
  lua_pop(o->L, 1);                       /* the handle is the table's */
  return h;
}

bool lnr_opt_function(const lnr_opts_t *o, const char *k) {
  int t = field(o, k);
  if (t == LUA_TNIL) {
    lua_pop(o->L, 1);
    return false;
  }
  if (t != LUA_TFUNCTION)
    lnr_opt_bad(o, k, -1, "a function");
  return true;
}

void lnr_push_copy(lua_State *L, int idx) {
  idx = lua_absindex(L, idx);
  lua_newtable(L);
  for (lua_pushnil(L); lua_next(L, idx); lua_pop(L, 1)) {
    lua_pushvalue(L, -2);
    lua_pushvalue(L, -2);
    lua_rawset(L, -5);
  }
}

/* ---- core.options: the readers for constructors written in Lua -------------------------- */

/* A checker's fields, from its schema: { key = "integer 1 65535", ... }.
 * A spec is a type, then what the type takes: bounds (a number, or * for
 * none) for integer, number and size, names for enum; a trailing "!"
 * on the type marks the option required. */
enum { T_ANY, T_INTEGER, T_NUMBER, T_SECONDS, T_SIZE, T_BOOLEAN, T_STRING,
       T_ENUM, T_STRINGS, T_TABLE, T_FUNCTION, T_TLS_CLIENT, T_TLS_SERVER,
       T_GROUP };
static const char *const type_names[] = {
    "any", "integer", "number", "seconds", "size", "boolean", "string",
    "enum", "strings", "table", "function", "tls.client", "tls.server",
    "group", NULL};

#define MAX_NAMES 8
typedef struct field_s {
  const char *key;            /* anchored by the index (an upvalue) */
  int type;
  bool required;
  lua_Number min, max;
  lua_Integer imin, imax;     /* the bounds of integer and size */
  const char *names[MAX_NAMES + 1];
  char buf[96];               /* the names, back to back */
} field_t;

typedef struct checker_s {
  const char *what;           /* anchored by an upvalue */
  int n;
  int required;               /* how many fields are */
  const char **keys;          /* n + 1, NULL-terminated (after fields) */
  field_t f[];
} checker_t;

/* A bound: a number, or "*" for none (def). */
static lua_Number bound(lua_State *L, const char *s, lua_Number def,
                        const char *spec) {
  if (s == NULL || strcmp(s, "*") == 0)
    return def;
  char *end;
  lua_Number v = strtod(s, &end);
  if (*end != '\0')
    luaL_error(L, "core.options: bad bound '%s' in '%s'", s, spec);
  return v;
}

static void compile(lua_State *L, field_t *f, const char *key,
                    const char *spec) {
  char tmp[160];
  if (strlen(spec) >= sizeof tmp)
    luaL_error(L, "core.options: spec too long: %s", spec);
  strcpy(tmp, spec);
  char *word[MAX_NAMES + 2];
  int nw = 0;
  for (char *p = tmp; *p && nw < MAX_NAMES + 2;) {   /* words split by spaces */
    while (*p == ' ')
      *p++ = '\0';
    if (*p)
      word[nw++] = p;
    while (*p && *p != ' ')
      p++;
  }
  if (nw == 0)
    luaL_error(L, "core.options: empty spec for %s", key);
  size_t tl = strlen(word[0]);
  f->key = key;
  f->required = tl > 0 && word[0][tl - 1] == '!';
  if (f->required)
    word[0][tl - 1] = '\0';
  f->type = -1;
  for (int i = 0; type_names[i]; i++)
    if (strcmp(word[0], type_names[i]) == 0)
      f->type = i;
  if (f->type < 0)
    luaL_error(L, "core.options: unknown type '%s' for %s", word[0], key);
  bool ints = f->type == T_INTEGER || f->type == T_SIZE;
  lua_Number lo = ints ? (lua_Number)LUA_MININTEGER : -HUGE_VAL;
  lua_Number hi = ints ? (lua_Number)LUA_MAXINTEGER : HUGE_VAL;
  if (f->type == T_SIZE)
    lo = 0, hi = (lua_Number)LNR_OPT_SIZE_MAX;
  bool bounded = ints || f->type == T_NUMBER;
  f->min = bound(L, bounded && nw > 1 ? word[1] : NULL, lo, spec);
  f->max = bound(L, bounded && nw > 2 ? word[2] : NULL, hi, spec);
  f->imin = f->min <= (lua_Number)LUA_MININTEGER ? LUA_MININTEGER
                                                 : (lua_Integer)f->min;
  f->imax = f->max >= (lua_Number)LUA_MAXINTEGER ? LUA_MAXINTEGER
                                                 : (lua_Integer)f->max;
  if (f->type == T_ENUM) {
    size_t off = 0;
    for (int i = 1; i < nw; i++) {
      size_t l = strlen(word[i]) + 1;
      if (off + l > sizeof f->buf || i > MAX_NAMES)
        luaL_error(L, "core.options: too many names for %s", key);
      memcpy(f->buf + off, word[i], l);
      f->names[i - 1] = f->buf + off;
      off += l;
    }
    f->names[nw - 1] = NULL;
  }
}

/* Check the value at idx for f; true if it was converted (a numeric
 * string), its number then pushed. */
static bool check_value(const lnr_opts_t *o, const field_t *f, int idx) {
  lua_State *L = o->L;
  const char *k = f->key;
  int t = lua_type(L, idx);
  switch (f->type) {
  case T_INTEGER: {
    lua_Integer v = lnr_optv_integer(o, k, idx, f->imin, f->imax);
    if (t == LUA_TNUMBER && lua_isinteger(L, idx))
      return false;
    lua_pushinteger(L, v);
    return true;
  }
  case T_NUMBER: {
    lua_Number v = lnr_optv_number(o, k, idx, f->min, f->max);
    if (t == LUA_TNUMBER)
      return false;
    lua_pushnumber(L, v);
    return true;
  }
  case T_SECONDS:
    lnr_optv_seconds(o, k, idx);
    if (t == LUA_TNUMBER)
      return false;
    lua_pushnumber(L, lua_tonumber(L, idx));
    return true;
  case T_SIZE: {
    size_t v = lnr_optv_size(o, k, idx, (size_t)f->imin, (size_t)f->imax);
    if (t == LUA_TNUMBER && lua_isinteger(L, idx))
      return false;
    lua_pushinteger(L, (lua_Integer)v);
    return true;
  }
  case T_BOOLEAN:
    if (t != LUA_TBOOLEAN)
      lnr_opt_bad(o, k, idx, "a boolean");
    return false;
  case T_STRING:
    if (t != LUA_TSTRING)
      lnr_opt_bad(o, k, idx, "a string");
    return false;
  case T_ENUM:
    lnr_optv_enum(o, k, idx, f->names);
    return false;
  case T_TABLE:
    if (t != LUA_TTABLE)
      lnr_opt_bad(o, k, idx, "a table");
    return false;
  case T_FUNCTION:
    if (t != LUA_TFUNCTION)
      lnr_opt_bad(o, k, idx, "a function");
    return false;
  case T_STRINGS:
    lnr_optv_strings(o, k, idx, 64);
    return false;
  case T_TLS_CLIENT:
  case T_TLS_SERVER:
    lnr_optv_tls(o, k, idx, f->type == T_TLS_SERVER);
    return false;
  case T_GROUP:
    if (!lnr_to_handle(L, idx, LNR_GROUP) && !lnr_to_handle(L, idx, LNR_LOOP))
      lnr_opt_bad(o, k, idx, "a netrun.group or a netrun.loop");
    return false;
  default:
    return false;
  }
}

/* A required option is absent (nil on top): raise as its reader would. */
static _Noreturn void absent(const lnr_opts_t *o, const field_t *f) {
  if (f->type != T_ANY)
    check_value(o, f, lua_gettop(o->L));   /* nil is none of the others */
  lnr_opt_bad(o, f->key, -1, "given");
}

/* checker(opts) --> opts, or a copy of it with its numeric strings made
 * numbers; nil for nil (every option absent). Upvalues: the checker, and
 * the index of its fields by name (which anchors the names); one pass
 * over the options given, a lookup each: a connect pays for the options
 * it gives, not for those it could. */
static int run_checker(lua_State *L) {
  checker_t *c = lua_touserdata(L, lua_upvalueindex(1));
  lua_settop(L, 1);
  lnr_opts_t o;
  lnr_opts_open(&o, L, 1, c->what, NULL, false);
  int seen = 0;                          /* required options given */
  lua_pushnil(L);                        /* 2: the copy, once one is made */
  for (lua_pushnil(L); o.t && lua_next(L, 1); lua_pop(L, 1)) {
    lua_pushvalue(L, 3);                 /* 3 the key, 4 its value */
    int i = lua_rawget(L, lua_upvalueindex(2)) == LUA_TNUMBER
                ? (int)lua_tointeger(L, -1) : -1;
    lua_pop(L, 1);
    if (i < 0)                           /* says which, and what it meant */
      lnr_opts_open(&o, L, 1, c->what, c->keys, false);
    seen += c->f[i].required;
    if (check_value(&o, &c->f[i], 4)) {  /* its number at 5 */
      if (lua_isnil(L, 2)) {
        lnr_push_copy(L, 1);
        lua_replace(L, 2);
      }
      lua_pushvalue(L, 3);
      lua_insert(L, -2);
      lua_rawset(L, 2);
    }
  }
  for (int i = 0; seen < c->required && i < c->n; i++) {
    if (!c->f[i].required)
      continue;
    if (o.t)
      lua_getfield(L, 1, c->f[i].key);
    else
      lua_pushnil(L);
    if (lua_isnil(L, -1))
      absent(&o, &c->f[i]);
    lua_pop(L, 1);
  }
  if (lua_isnil(L, 2))
    lua_pop(L, 1);
  return 1;
}

/* core.options(what, schema) --> checker (see run_checker). */
static int l_options(lua_State *L) {
  luaL_checkstring(L, 1);
  luaL_checktype(L, 2, LUA_TTABLE);
  lua_settop(L, 2);
  int n = 0;
  for (lua_pushnil(L); lua_next(L, 2); lua_pop(L, 1))
    n++;
  size_t size = sizeof(checker_t) + sizeof(field_t) * (size_t)n;
  checker_t *c = lua_newuserdatauv(L, size + sizeof(char *) * (size_t)(n + 1), 0);
  c->what = lua_tostring(L, 1);
  c->n = n;
  c->required = 0;
  c->keys = (const char **)((char *)c + size);
  lua_createtable(L, 0, n);              /* 4: name -> field index */
  int i = 0;
  for (lua_pushnil(L); lua_next(L, 2); lua_pop(L, 1), i++) {
    if (lua_type(L, -2) != LUA_TSTRING || lua_type(L, -1) != LUA_TSTRING)
      return luaL_error(L, "core.options: a schema maps names to specs");
    compile(L, &c->f[i], lua_tostring(L, -2), lua_tostring(L, -1));
    c->keys[i] = c->f[i].key;
    c->required += c->f[i].required;
    lua_pushvalue(L, -2);
    lua_pushinteger(L, i);
    lua_rawset(L, 4);
  }
  c->keys[n] = NULL;
  lua_pushvalue(L, 1);                   /* anchors what */
  lua_pushcclosure(L, run_checker, 3);   /* the checker, the index, what */
  return 1;
}

/* core.raise(message): raise it at the caller's line (lnr_push_where). */
static int l_raise(lua_State *L) {
  luaL_checkstring(L, 1);
  lua_settop(L, 1);
  raise_top(L);
}

/* core.option_error(what, field, value, expect): raise "<what>: field must
 * be expect, got <value>" at the caller's line. */
static int l_option_error(lua_State *L) {
  lnr_opts_t o = {.L = L, .t = 0, .what = luaL_checkstring(L, 1)};
  o.prefix[0] = '\0';
  const char *k = luaL_checkstring(L, 2);
  lnr_opt_bad(&o, k, 3, luaL_checkstring(L, 4));
}

void lnr_open_opts(lua_State *L) {
  static const luaL_Reg fns[] = {{"options", l_options},
                                 {"options_home", l_options_home},
                                 {"raise", l_raise},
                                 {"option_error", l_option_error},
                                 {NULL, NULL}};
  luaL_setfuncs(L, fns, 0);
}
