/*
 * lhttp_stream.c -- bodies as streams, the server side as Lua sees it
 * (DESIGN.md §9.2). Loop thread only.
 *
 *   netrun.codec.http_server { body = "stream" }
 *
 * A request with a body comes as its head: req.streaming is true and
 * req.body nil. Its body stays unread (the codec reads nothing more from
 * that client) until a handler reads it:
 *   ctx:read()          -- the pieces come to the handlers after the codec
 *   req:sink(ch)        -- the same, and the codec reads no faster than ch
 *                       -- (a channel on this loop, where the handler
 *                       -- writes the body) takes: while ch is unwritable
 *                       -- it reads nothing
 * A client that sent "Expect: 100-continue" gets "100 Continue" then, and
 * not before. Each piece is a message
 *   { type = "body", data = "...", last = false }
 * and the last one has last = true (its data may be ""), with trailers =
 * { name = value } when a chunked body had some. What one read brings is
 * one piece (chunk framing decoded); the codec holds at most one read of
 * a body, however long. Requests without a body come whole, as with body
 * = "whole" (req.streaming false, req.body "").
 *
 * HTTP/2 (h2_body.c): the same, per stream; pieces also carry
 *   stream = req.stream
 * since several bodies may flow at once. req:sink() (no channel) reads
 * that request's body; ctx:read() every body of the connection waiting.
 * Flow control is the backpressure: a stream's window reopens only as
 * its pieces are handed up and `ch` (else the connection) is writable.
 *
 * An answer written before the body was all read closes the connection
 * after it (what is left is not read). A body cut short -- the client
 * closed, sent bad chunk framing or more than max_body, or sent nothing
 * for body_timeout -- reaches exception_caught, and its request is
 * answered 400, 413 or 408 in its turn (the connection closes after),
 * unless its answer has begun, when the connection closes after that.
 */
#include <string.h>

#include "codec/http.h"
#include "lhttp_stream.h"

/* { type = "body", data, last [, trailers] } */
static void push_body(lua_State *L, void *msg) {
  const nr_http_body_t *b = msg;
  lua_createtable(L, 0, 3 + (b->ntrailers > 0) + (b->stream != 0));
  lua_pushliteral(L, "body");
  lua_setfield(L, -2, "type");
  if (b->stream != 0) {        /* HTTP/2: its request's req.stream */
    lua_pushinteger(L, b->stream);
    lua_setfield(L, -2, "stream");
  }
  lua_pushlstring(L, b->data, b->len);
  lua_setfield(L, -2, "data");
  lua_pushboolean(L, b->last);
  lua_setfield(L, -2, "last");
  if (b->ntrailers == 0)
    return;
  lua_createtable(L, 0, (int)b->ntrailers);
  for (size_t i = 0; i < b->ntrailers; i++) {
    const nr_http_header_t *h = &b->trailers[i];
    luaL_Buffer lb;
    char *w = luaL_buffinitsize(L, &lb, h->name_len);
    for (size_t k = 0; k < h->name_len; k++)
      w[k] = (char)(h->name[k] >= 'A' && h->name[k] <= 'Z' ? h->name[k] + 32
                                                           : h->name[k]);
    luaL_pushresultsize(&lb, h->name_len);
    lua_pushvalue(L, -1);
    if (lua_rawget(L, -3) == LUA_TSTRING) {      /* a repeat: joined */
      lua_pushliteral(L, ", ");
      lua_pushlstring(L, h->value, h->value_len);
      lua_concat(L, 3);
    } else {
      lua_pop(L, 1);
      lua_pushlstring(L, h->value, h->value_len);
    }
    lua_rawset(L, -3);
  }
  lua_setfield(L, -2, "trailers");
}

void lnr_http_stream_register(void) {
  lnr_register_msg(NR_MSG_HTTP_BODY, push_body);
}

/* The codec's context of a streamed request, still in its pipeline. */
static nr_ctx_t *live_codec(const lnr_http_body_ref_t *b) {
  if (b->codec == NULL || nr_ctx_is_removed(b->codec))
    return NULL;
  const nr_handler_t *h = nr_ctx_handler(b->codec);
  return h != NULL && h->type != NULL && strcmp(h->type, "http_server") == 0
             ? b->codec : NULL;
}

int lnr_http_req_sink(lua_State *L) {
  lnr_http_body_ref_t b;
  if (!lnr_http_request_body(L, 1, &b))
    return luaL_error(L, "req:sink(ch): req must be a request of "
                      "netrun.codec.http_server { body = \"stream\" } with "
                      "a body (req.streaming), got %s", luaL_typename(L, 1));
  nr_channel_t *ch = lua_isnoneornil(L, 2) ? NULL
                                           : lnr_check_handle(L, 2, LNR_CHANNEL);
  nr_ctx_t *ctx = live_codec(&b);
  if (ctx == NULL)
    return luaL_error(L, "req:sink(ch): the request's connection is gone");
  nr_loop_t *loop = nr_channel_loop(nr_ctx_channel(ctx));
  if (!nr_loop_in_thread(loop))
    return luaL_error(L, "req:sink(ch): call it on the request's loop");
  if (ch != NULL && nr_channel_loop(ch) != loop)
    return luaL_error(L, "req:sink(ch): ch must be on the request's loop "
                      "(connect it with group = ctx:loop())");
  if (nr_http_server_read_body(ctx, b.token, ch) < 0)
    return luaL_error(L, "req:sink(ch): the request's body is not waiting to "
                      "be read (read already, answered, or taken)");
  return 0;
}

bool lnr_http_body_option(lua_State *L, const char *what) {
  if (lua_type(L, 1) != LUA_TTABLE)
    return false;
  int t = lua_getfield(L, 1, "body");
  bool stream = false;
  if (t == LUA_TSTRING && strcmp(lua_tostring(L, -1), "stream") == 0)
    stream = true;
  else if (t != LUA_TNIL && !(t == LUA_TSTRING &&
                              strcmp(lua_tostring(L, -1), "whole") == 0))
    luaL_error(L, "%s: body must be \"whole\" or \"stream\", got %s", what,
               t == LUA_TSTRING ? lua_tostring(L, -1) : luaL_typename(L, -1));
  lua_pop(L, 1);
  return stream;
}
