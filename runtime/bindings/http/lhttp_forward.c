/*
 * lhttp_forward.c -- a request forwarded as it came (the HTTP client's
 * forward = req, netrun.http's proxies): its method, target, headers and
 * body read from the request object without making its Lua fields,
 * with what the handler assigned taking their place. Loop thread only.
 */
#include <assert.h>
#include <stdbool.h>

#include "lhttp_req.h"

/* ---- requests forwarded (the HTTP client's forward = req) ------------------- */

/* A field as it is now: the one assigned (pushed, returns true) or none
 * (nothing pushed). Only a request whose fields table exists has any. */
static bool assigned(lua_State *L, int fields, const char *k) {
  if (fields == 0)
    return false;
  if (lua_getfield(L, fields, k) != LUA_TNIL)
    return true;
  lua_pop(L, 1);
  return false;
}

/* Is the value at i a string (or, if may_be_none, false or nil)? */
static bool string_or(lua_State *L, int i, bool may_be_none) {
  return lua_type(L, i) == LUA_TSTRING || (may_be_none && !lua_toboolean(L, i));
}

bool lnr_http_forward_view(lua_State *L, int idx, lnr_http_fwd_t *f) {
  const req_t *q = lua_touserdata(L, idx);
  if (q == NULL || lua_rawlen(L, idx) < sizeof *q || q->tag != &REQ_TAG)
    return false;
  const char *text = req_text(q);
  *f = (lnr_http_fwd_t){.method = text, .method_len = q->method_len,
                        .target = text + q->path,
                        .target_len = q->has_query
                                          ? q->query + q->query_len - q->path
                                          : q->path_len,
                        .nheaders = q->nheaders};
  if (q->has_query && q->query != q->path + q->path_len + 1) {
    lua_pushlstring(L, text + q->path, q->path_len);   /* copied apart (a */
    lua_pushliteral(L, "?");                            /* chunked request's */
    lua_pushlstring(L, text + q->query, q->query_len);  /* fields): joined */
    lua_concat(L, 3);
    f->target = lua_tolstring(L, -1, &f->target_len);
  }
  int fields = req_fields(L, idx, false) ? lua_gettop(L) : 0;
  if (fields == 0) {           /* the usual: nothing assigned or read */
    if (lua_getiuservalue(L, idx, 1) == LUA_TSTRING)
      f->body = lua_tolstring(L, -1, &f->body_len);    /* anchored by q */
    lua_pop(L, 1);
    return true;
  }
  if (assigned(L, fields, "method")) {
    if (!string_or(L, -1, false))
      return f->bad = "method", true;
    f->method = lua_tolstring(L, -1, &f->method_len);
  }
  int path = assigned(L, fields, "path") ? lua_gettop(L) : 0;
  int query = assigned(L, fields, "query") ? lua_gettop(L) : 0;
  if ((path && !string_or(L, path, false)) ||
      (query && !string_or(L, query, true)))
    return f->bad = path && !string_or(L, path, false) ? "path" : "query",
           true;
  if (path || query) {         /* rebuilt: path ["?" query] */
    if (path)
      lua_pushvalue(L, path);
    else
      lua_pushlstring(L, text + q->path, q->path_len);
    if (query && lua_toboolean(L, query)) {
      lua_pushliteral(L, "?");
      lua_pushvalue(L, query);
      lua_concat(L, 3);
    } else if (!query && q->has_query) {
      lua_pushliteral(L, "?");
      lua_pushlstring(L, text + q->query, q->query_len);
      lua_concat(L, 3);
    }                          /* query = false: none */
    f->target = lua_tolstring(L, -1, &f->target_len);
  }
  if (assigned(L, fields, "body")) {
    if (!string_or(L, -1, true))
      return f->bad = "body", true;
    if (lua_toboolean(L, -1))
      f->body = lua_tolstring(L, -1, &f->body_len);
  } else if (lua_getiuservalue(L, idx, 1) == LUA_TSTRING) {
    f->body = lua_tolstring(L, -1, &f->body_len);      /* anchored by q */
  }
  if (assigned(L, fields, "headers")) {
    if (lua_type(L, -1) != LUA_TTABLE)
      return f->bad = "headers", true;
    f->headers = lua_gettop(L);
  }
  return true;
}

size_t lnr_http_forward_fields(lua_State *L, int idx, nr_http_header_t *out,
                               size_t cap) {
  const req_t *q = lua_touserdata(L, idx);
  assert(q != NULL && q->tag == &REQ_TAG);
  const char *text = req_text(q);
  for (size_t i = 0; i < q->nheaders && i < cap; i++)
    out[i] = (nr_http_header_t){text + q->h[i].name, text + q->h[i].value,
                                q->h[i].name_len, q->h[i].value_len};
  return q->nheaders;
}
