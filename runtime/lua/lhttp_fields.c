/*
 * lhttp_fields.c -- a Lua headers table as the HTTP codecs' header array
 * (see lhttp.h), for a response written to the server codec and a
 * request written to the client codec alike. Loop thread only.
 *
 * No allocation for up to 32 fields, and none per value: strings are used
 * where the table holds them. A number is converted on its copy, which
 * stays on the stack (anchored) while the walk goes on; the walk then
 * pushes its key again for lua_next.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "lhttp.h"

static int add(lnr_hdrs_t *h, const char *name, size_t nl, const char *val,
               size_t vl, char *err, size_t el) {
  int shown = (int)(nl > 64 ? 64 : nl);
  if (!nr_http_is_token(name, nl)) {
    snprintf(err, el, "header name '%.*s' is not a token", shown, name);
    return -EINVAL;
  }
  if (!nr_http_is_field_value(val, vl)) {
    snprintf(err, el, "the value of header '%.*s' contains a control "
             "character", shown, name);
    return -EINVAL;
  }
  if (h->n == h->cap) {
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
  }
  h->v[h->n++] = (nr_http_header_t){name, val, nl, vl};
  return 0;
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
  return add(h, name, nl, val, vl, err, el);
}

/* A repeated field: the array { "a", 2 } at the top of the stack. */
static int add_array(lua_State *L, lnr_hdrs_t *h, const char *name,
                     size_t nl, int *kept, char *err, size_t el) {
  int arr = lua_gettop(L), rc = 0;
  lua_Integer n = (lua_Integer)lua_rawlen(L, arr);
  for (lua_Integer i = 1; rc == 0 && i <= n; i++) {
    size_t vl;
    int t = lua_rawgeti(L, arr, i);
    if (t == LUA_TSTRING) {
      const char *val = lua_tolstring(L, -1, &vl);
      rc = add(h, name, nl, val, vl, err, el);
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

int lnr_collect_headers(lua_State *L, int idx, lnr_hdrs_t *h, char *err,
                        size_t el) {
  if (!lua_checkstack(L, 8)) {
    snprintf(err, el, "Lua stack overflow");
    return -ENOMEM;
  }
  lua_pushnil(L);
  while (lua_next(L, idx)) {                   /* key, value */
    if (lua_type(L, -2) != LUA_TSTRING) {
      snprintf(err, el, "header names must be strings, got a %s",
               luaL_typename(L, -2));
      return -EINVAL;
    }
    size_t nl, vl;
    const char *name = lua_tolstring(L, -2, &nl);
    int t = lua_type(L, -1), kept = 0, rc;
    if (t == LUA_TSTRING) {                    /* the usual: no copy kept */
      const char *val = lua_tolstring(L, -1, &vl);
      rc = add(h, name, nl, val, vl, err, el);
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
