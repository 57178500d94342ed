/*
 * lhttp_stream.h -- bodies as streams in the HTTP bindings (DESIGN.md
 * §9.2): what lhttp.c (server requests), lhttp_client.c (the client
 * codec), lhttp_pool.c (netrun.http's pools and forwarders) and
 * lhttp_stream.c share. Loop thread only, on the state that owns the
 * values.
 */
#ifndef LNR_HTTP_STREAM_H
#define LNR_HTTP_STREAM_H

#include <stdbool.h>
#include <stdint.h>

#include "lnr.h"

/* A streamed server request's body, as its userdata knows it: the codec
 * that has it (retained by the request; check nr_ctx_is_removed before
 * use), its request's token, its framing. */
typedef struct lnr_http_body_ref_s {
  nr_ctx_t *codec;
  uint64_t token;
  bool chunked;
  uint64_t content_length;
} lnr_http_body_ref_t;

/* lhttp_client.c: whether a field is hop-by-hop or framing (RFC 9110
 * 7.6.1): a codec writing the message gives it its own hop. */
bool lnr_http_hop_by_hop(const char *name, size_t len);

/* lhttp.c: whether the value at idx is a streamed server request (*b
 * filled in). */
bool lnr_http_request_body(lua_State *L, int idx, lnr_http_body_ref_t *b);

/* lhttp_stream.c: req:sink(ch) -- the handlers read the body of req, and
 * its codec reads no faster than ch takes what they write to it. */
int lnr_http_req_sink(lua_State *L);
/* The option `body` ("whole" or "stream") of the options table at
 * stack index 1 (none: whole): true for "stream"; raises naming `what`
 * for anything else. */
bool lnr_http_body_option(lua_State *L, const char *what);
/* Registers the converter of NR_MSG_HTTP_BODY (a piece of a streamed
 * body: { type = "body", data = s, last = bool [, trailers = {...}] }).
 * Once per process, from lnr_open_http. */
void lnr_http_stream_register(void);

#endif /* LNR_HTTP_STREAM_H */
