/*
 * http_parse.h -- the HTTP/1.1 server parser's byte-level helpers, shared
 * with the client codec (http_client.c) so that both sides judge header
 * lines, token lists and chunked bodies by the same code, and with the
 * server handler (http_server.c). Defined in http_parse.c (as thin
 * wrappers of its statics); pure functions over bytes, any thread.
 */
#ifndef NR_CODEC_HTTP_PARSE_H
#define NR_CODEC_HTTP_PARSE_H

#include <stdbool.h>
#include <stddef.h>

#include "codec/http.h"

/* Parse one "name: value" line of s[0 .. len) at *ip into *h, *ip moved
 * past its line end: 0, or 400 for a bad line (a line running past len
 * included). */
int nr__http_parse_field(nr_http_header_t *h, const char *s, size_t len,
                         size_t *ip);
/* Case-insensitive equality of a[0 .. n) with a lowercase literal. */
bool nr__http_ieq(const char *a, size_t n, const char *lit, size_t ln);
/* The next item of the comma-separated list v[0 .. n) from *i, trimmed:
 * true with it at v[*t0 .. *t1), false at the end. */
bool nr__http_next_item(const char *v, size_t n, size_t *i, size_t *t0,
                        size_t *t1);
/* Does the comma-separated list contain the lowercase token? */
bool nr__http_has_token(const char *v, size_t n, const char *tok, size_t tn);

/* Chunked bodies, with p's limits (max_body, max_header for trailers):
 * start decoding at offset `at` of the message's bytes (just past its
 * head), then call decode with the same bytes and more: 0 need more,
 * -status (400 malformed, 413 over max_body, 431 trailers over
 * max_header, 500 no memory), or the offset just past the trailer
 * section (p->pos then holds where that section began). The decoded body
 * is in p->body. */
void nr__http_chunks_start(nr_http_parser_t *p, size_t at);
long nr__http_decode_chunks(nr_http_parser_t *p, const char *s, size_t n);

/* The path s[0 .. n) (beginning with '/') normalized into out (room for
 * n bytes) as the server codec gives handlers req.path (see http_parse.c):
 * its length, or -400 for a path refused. */
long nr__http_normalize_path(const char *s, size_t n, char *out);

/* Whether p is between requests or within a request's head (not in a
 * body): what the server's timeouts tell apart. */
bool nr__http_parsing_head(const nr_http_parser_t *p);
/* The most the body being read may come to: its Content-Length, or
 * max_body when it is chunked; 0 between requests or within a head (what
 * the server's body budget reserves). */
uint64_t nr__http_body_bound(const nr_http_parser_t *p);
/* Whether a body is being streamed (a streaming parser gave its head). */
bool nr__http_streaming_body(const nr_http_parser_t *p);
/* A body streamed in pieces, after its head (the server's body =
 * "stream", the client's stream = true): start one (chunked, or of
 * `length` bytes); then each piece from s[0 .. n) -- the bytes used, or
 * -status (400, 413 over max_body, 431, 500); *piece says whether req
 * holds one (body, body_len, last; a chunked last's trailers in
 * req->trailers), when not the bytes used are framing and the rest needs
 * more input -- and piece_done once it was handed on. The caller resets
 * p once the last piece went (sbody false, as after a request). */
void nr__http_stream_start(nr_http_parser_t *p, bool chunked, uint64_t length);
long nr__http_stream_piece(nr_http_parser_t *p, nr_http_request_t *req,
                           const char *s, size_t n, bool *piece);
void nr__http_stream_piece_done(nr_http_parser_t *p);
/* The server's parser (p->stream) at a head with a body, `end` bytes
 * long: the body's state set up, the head handed up alone (req->streaming).
 * end, or -413 (over max_body). */
long nr__http_stream_head(nr_http_parser_t *p, nr_http_request_t *req,
                          long end);
/* The body being read has a known length: make the cumulation the
 * request's size at once, so that its bytes are copied once and it holds
 * no slack (an 8 MiB upload takes 8 MiB, not the 16 of doublings). Done
 * once the body is admitted, not for every head announcing one. 0 or
 * -ENOMEM. */
int nr__http_reserve_body(nr_http_parser_t *p);

/* Between http_parse.c and http_target.c: a target other than a plain
 * path put in its form (0 or a status), an absolute-form target's
 * authority made the Host (0 or 431), and the Host checks they use. */
int nr__http_target_form(nr_http_parser_t *p, nr_http_request_t *r);
int nr__http_authority_host(nr_http_parser_t *p, nr_http_request_t *r);
bool nr__http_valid_host(const char *v, size_t n);
bool nr__http_named_host(const nr_http_header_t *h);
/* Between http_parse.c and http_chunked.c: the end of a header block (0:
 * not all here), and a chunked request's trailer fields parsed from
 * s[from .. end) (0 or a status). */
size_t nr__http_find_block_end(nr_http_parser_t *p, const char *s, size_t n);
int nr__http_parse_trailers(nr_http_parser_t *p, nr_http_request_t *r,
                            const char *s, size_t from, size_t end);

#endif /* NR_CODEC_HTTP_PARSE_H */
