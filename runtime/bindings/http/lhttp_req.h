/*
 * lhttp_req.h -- a request object's layout, shared by lhttp_request.c
 * (which makes requests and their fields), lhttp.c (which registers and
 * opens them) and lhttp_forward.c (which forwards them). Private to the http module; loop thread only.
 */
#ifndef LNR_HTTP_REQ_H
#define LNR_HTTP_REQ_H

#include "lhttp.h"

#define REQ_CLASS "netrun.http.request"
#define REQ_STREAM_CLASS "netrun.http.request (streamed)"

typedef struct rhdr_s {
  uint32_t name, name_len, value, value_len;   /* offsets into the text */
} rhdr_t;

typedef struct req_s {
  const void *tag;             /* &REQ_TAG: proves the userdata is one */
  const void *pipe;            /* its read's pipeline and token (from the */
  uint64_t token;              /* codec: nr_http_request_t's) */
  int32_t stream;              /* HTTP/2: its stream; 0 for HTTP/1.x */
  uint32_t method_len, path, path_len, query, query_len, target, target_len;
  uint16_t nheaders, ntrailers;
  bool has_query, keep_alive, http11;
  /* A streamed head's (body = "stream"): its body follows as messages,
   * framed so (chunked, or content_length bytes), from the codec at
   * `codec` (retained; released by the streamed class's __gc). */
  bool streaming, chunked;
  uint64_t content_length;
  nr_ctx_t *codec;
  rhdr_t h[];                  /* headers, trailers, then the text */
} req_t;

/* Its address tags a request userdata (lhttp_request.c). */
extern const char lnr_http_req_tag;
#define REQ_TAG lnr_http_req_tag

static inline const char *req_text(const req_t *q) {
  return (const char *)(q->h + q->nheaders + q->ntrailers);
}

/* The table of assigned and cached fields (made if make); pushes it, or
 * nothing and returns 0. */
static inline int req_fields(lua_State *L, int ud, bool make) {
  if (lua_getiuservalue(L, ud, 2) == LUA_TTABLE)
    return 1;
  lua_pop(L, 1);
  if (!make)
    return 0;
  lua_createtable(L, 0, 4);
  lua_pushvalue(L, -1);
  lua_setiuservalue(L, ud, 2);
  return 1;
}

/* lhttp_request.c's entry points for lhttp.c: the converter of
 * NR_MSG_HTTP_REQUEST, the request classes made in a state, and
 * netrun.http.unescape(s). */
void lnr_http_push_request(lua_State *L, void *msg);
void lnr_http_request_class_open(lua_State *L);
int lnr_http_unescape(lua_State *L);

#endif
