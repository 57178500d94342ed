/*
 * lhttp_fields.c -- a Lua headers table as the HTTP codecs' header array
 * (see lhttp.h), for a response written to the server codec and a
 * request written to the client codec alike. Loop thread only.
 *
 * No allocation for up to 32 fields, and none per value: strings are used
 * where the table holds them. A number is converted on its copy, which
 * stays on the stack (anchored) while the walk goes on; the walk then
 * pushes its key again for lua_next.
 *
 * Checked strings. Header names must be tokens and values free of control
 * characters, checked on every write; most writes give the same strings
 * again ("content-type", "text/plain"). So a string that passed is
 * remembered by its address, per state (lnr_http_part_t.checked), and
 * kept alive by an anchor table (its checked_ref) for as long as it
 * is remembered: while it is anchored no other string can have its
 * address, so a hit is that very string, immutable and checked already.
 * An entry is replaced together with its anchor. A name and a value are
 * remembered apart (a good value need not be a token); a number's string
 * is not remembered (its copy is not kept).
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "lhttp.h"

enum { CK_NAME, CK_VALUE };

static unsigned ck_slot(const char *s, int kind) {
  uintptr_t a = (uintptr_t)s;
  return (unsigned)kind * LNR_HTTP_CHECKED / 2 +
         (unsigned)((a >> 4 ^ a >> 11) % (LNR_HTTP_CHECKED / 2));
}

static bool ck_known(const lnr_hdrs_t *h, const char *s, int kind) {
  return h->P != NULL && h->P->checked[ck_slot(s, kind)] == s;
}

/* The string at idx passed its check: remember it. Pushes 2 at most. */
static void ck_remember(lua_State *L, lnr_hdrs_t *h, int idx, const char *s,
                        int kind) {
  if (h->P == NULL)
    return;
  unsigned k = ck_slot(s, kind);
  idx = lua_absindex(L, idx);
  if (lnr_push_ref(L, &h->P->checked_ref) != LUA_TTABLE) {
    lua_pop(L, 1);
    lua_createtable(L, LNR_HTTP_CHECKED, 0);
    lua_pushvalue(L, -1);
    lnr_set_ref(L, &h->P->checked_ref);
  }
  lua_pushvalue(L, idx);
  lua_rawseti(L, -2, (lua_Integer)k + 1);
  lua_pop(L, 1);
  h->P->checked[k] = s;
}

/* Room for more fields: the array doubles, off the usual path. */
static __attribute__((noinline)) int grow(lnr_hdrs_t *h, char *err,
                                          size_t el) {
  size_t cap = h->cap * 2;
  nr_http_header_t *v = h->v == h->small ? malloc(cap * sizeof *v)
                                         : realloc(h->v, cap * sizeof *v);
  if (v == NULL) {
    snprintf(err, el, "out of memory");
    return -ENOMEM;
  }
  if (h->v == h->small)
    memcpy(v, h->small, sizeof h->small);
  h->v = v;
  h->cap = cap;
  return 0;
}

/* Append a field whose name was checked; its value is checked here unless
 * `known`. (Inlined: it runs for every field of every response.) */
static inline __attribute__((always_inline)) int
add(lnr_hdrs_t *h, const char *name, size_t nl, const char *val, size_t vl,
    bool known, char *err, size_t el) {
  if (!known && !nr_http_is_field_value(val, vl)) {
    snprintf(err, el, "the value of header '%.*s' contains a control "
             "character", (int)(nl > 64 ? 64 : nl), name);
    return -EINVAL;
  }
  if (h->n == h->cap && grow(h, err, el) < 0)
    return -ENOMEM;
  h->v[h->n++] = (nr_http_header_t){name, val, nl, vl};
  return 0;
}

int lnr_hdrs_add(lnr_hdrs_t *h, const char *name, size_t nl, const char *val,
                 size_t vl, char *err, size_t el) {
  if (!nr_http_is_token(name, nl)) {
    snprintf(err, el, "header name '%.*s' is not a token",
             (int)(nl > 64 ? 64 : nl), name);
    return -EINVAL;
  }
  return add(h, name, nl, val, vl, false, err, el);
}

/* A number value at the top of the stack as field `name`: converted on
 * its copy, which stays on the stack to anchor the string (*kept counts
 * it). */
static int add_number(lua_State *L, lnr_hdrs_t *h, const char *name,
                      size_t nl, int *kept, char *err, size_t el) {
  size_t vl;
  const char *val = lua_tolstring(L, -1, &vl);
  if (!lua_checkstack(L, 3)) {                 /* the next value, the key */
    snprintf(err, el, "too many numeric header values");
    return -EINVAL;
  }
  (*kept)++;
  return add(h, name, nl, val, vl, false, err, el);
}

/* A string value at the top of the stack as field `name`; remembered
 * once it passed. */
static inline __attribute__((always_inline)) int
add_string(lua_State *L, lnr_hdrs_t *h, const char *name, size_t nl,
           char *err, size_t el) {
  size_t vl;
  const char *val = lua_tolstring(L, -1, &vl);
  bool known = ck_known(h, val, CK_VALUE);
  int rc = add(h, name, nl, val, vl, known, err, el);
  if (rc == 0 && !known)
    ck_remember(L, h, -1, val, CK_VALUE);
  return rc;
}

/* A repeated field: the array { "a", 2 } at the top of the stack. */
static int add_array(lua_State *L, lnr_hdrs_t *h, const char *name,
                     size_t nl, int *kept, char *err, size_t el) {
  int arr = lua_gettop(L), rc = 0;
  lua_Integer n = (lua_Integer)lua_rawlen(L, arr);
  for (lua_Integer i = 1; rc == 0 && i <= n; i++) {
    int t = lua_rawgeti(L, arr, i);
    if (t == LUA_TSTRING) {
      rc = add_string(L, h, name, nl, err, el);
      lua_pop(L, 1);                           /* the array anchors it */
    } else if (t == LUA_TNUMBER) {
      rc = add_number(L, h, name, nl, kept, err, el);
    } else {
      snprintf(err, el, "header '%s' value %d is a %s", name, (int)i,
               luaL_typename(L, -1));
      rc = -EINVAL;
    }
  }
  return rc;
}

/* The name at -2 is a token (checked, or known to be). */
static inline __attribute__((always_inline)) int
check_name(lua_State *L, lnr_hdrs_t *h, const char *name, size_t nl,
           char *err, size_t el) {
  if (ck_known(h, name, CK_NAME))
    return 0;
  if (!nr_http_is_token(name, nl)) {
    snprintf(err, el, "header name '%.*s' is not a token",
             (int)(nl > 64 ? 64 : nl), name);
    return -EINVAL;
  }
  ck_remember(L, h, -2, name, CK_NAME);
  return 0;
}

int lnr_collect_headers(lua_State *L, int idx, lnr_hdrs_t *h, char *err,
                        size_t el) {
  lua_pushnil(L);
  while (lua_next(L, idx)) {                   /* key, value */
    if (lua_type(L, -2) != LUA_TSTRING) {
      snprintf(err, el, "header names must be strings, got a %s",
               luaL_typename(L, -2));
      return -EINVAL;
    }
    size_t nl;
    const char *name = lua_tolstring(L, -2, &nl);
    int t = lua_type(L, -1), kept = 0;
    int rc = check_name(L, h, name, nl, err, el);
    if (rc) {
      return rc;
    } else if (t == LUA_TSTRING) {             /* the usual: no copy kept */
      rc = add_string(L, h, name, nl, err, el);
      lua_pop(L, 1);
    } else {
      int key = lua_gettop(L) - 1;
      if (t == LUA_TNUMBER) {
        rc = add_number(L, h, name, nl, &kept, err, el);
      } else if (t == LUA_TTABLE) {
        rc = add_array(L, h, name, nl, &kept, err, el);
      } else {
        snprintf(err, el, "header '%s' is a %s, not a string", name,
                 luaL_typename(L, -1));
        rc = -EINVAL;
      }
      if (rc == 0 && kept == 0)
        lua_settop(L, key);    /* only strings: the array anchors them */
      else if (rc == 0)
        lua_pushvalue(L, key); /* the key again, for lua_next, above them */
    }
    if (rc)
      return rc;               /* the caller restores the stack */
  }
  return 0;
}
