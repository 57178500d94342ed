/*
 * http_parse_stream.c -- streamed request bodies in the HTTP/1.1 parser
 * (p->stream, body = "stream"): a head with a body goes out alone, and
 * the body follows in pieces as it arrives -- up to Content-Length, or
 * decoded from chunks (http_chunked.c) with its trailers. The client
 * codec's parser streams its replies' bodies the same way
 * (http_parse.h). Pure functions over bytes; any thread, a parser used
 * by one at a time.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "codec/http.h"
#include "codec/http_chars.h"
#include "codec/http_parse.h"

/* ---- streamed bodies -------------------------------------------------------------- */

static void piece_done(nr_http_parser_t *p);

/* The most of a chunked body's input one stream_piece takes (its piece's
 * offsets fit 32 bits; a feed is one read, far less, in practice). */
#define STREAM_RUN ((size_t)1 << 30)

/* A streaming parser's head with a body: the body's state is set up (it
 * follows the head, which the caller consumes as it delivers it), and the
 * head goes out alone. Its length, or -413. */
long nr__http_stream_head(nr_http_parser_t *p, nr_http_request_t *req,
                          long end) {
  if (!req->chunked && p->content_length > p->max_body)
    return -413;
  req->streaming = true;
  req->content_length = req->chunked ? 0 : p->content_length;
  p->line_ok = false;
  nr__http_stream_start(p, req->chunked, p->content_length);
  return end;
}

void nr__http_stream_start(nr_http_parser_t *p, bool chunked, uint64_t length) {
  p->sbody = true;
  p->head_len = p->pos = 0;  /* offsets from where the body's bytes begin */
  p->piece_len = 0;
  if (chunked) {
    p->phase = P_CHUNK_SIZE;
    p->chunk_left = 0;
    p->content_length = 0;   /* (counts the data that came) */
  } else {
    p->phase = P_SBODY;      /* (content_length counts down) */
    p->content_length = length;
  }
}

/* The next piece of a streamed body from s[0 .. n) into req (body,
 * body_len, last, trailers): the bytes used (*piece says whether req
 * holds a piece to deliver; when not, the bytes used are framing and the
 * rest waits for more input), or -status. */
static long stream_piece(nr_http_parser_t *p, nr_http_request_t *req,
                         const char *s, size_t n, bool *piece) {
  req->nheaders = req->ntrailers = 0;
  req->trailers = req->headers;
  req->last = false;
  if (p->phase == P_SBODY) {
    size_t take = n < p->content_length ? n : (size_t)p->content_length;
    p->content_length -= take;
    req->body = s;
    req->body_len = take;
    req->last = p->content_length == 0;
    *piece = true;
    return (long)take;
  }
  p->pos = 0;
  p->piece_len = 0;
  if (n > STREAM_RUN)
    n = STREAM_RUN;           /* (offsets in 32 bits; the rest comes next) */
  long end = nr__http_decode_chunks(p, s, n);
  if (end < 0)
    return end;
  if (end > 0) {              /* the last chunk and the trailers: p->pos is
                                 where the trailer section began */
    int rc = nr__http_parse_trailers(p, req, s, p->pos, (size_t)end);
    if (rc != 0)
      return -rc;
    req->last = true;
  } else {
    end = (long)p->pos;       /* what was whole; the rest waits */
    if (p->phase == P_TRAILER)
      p->scan -= p->pos;      /* (the trailer search resumes there) */
  }
  req->body = p->piece_len ? s + p->piece_at
              : nr_buf_len(&p->body) ? nr_buf_peek(&p->body) : "";
  req->body_len = p->piece_len ? p->piece_len : nr_buf_len(&p->body);
  *piece = req->body_len > 0 || req->last;
  return end;
}

long nr__http_stream_piece(nr_http_parser_t *p, nr_http_request_t *req,
                           const char *s, size_t n, bool *piece) {
  return stream_piece(p, req, s, n, piece);
}

/* After a piece was delivered: its copy (if any) is let go. */
void nr__http_stream_piece_done(nr_http_parser_t *p) { piece_done(p); }

static void piece_done(nr_http_parser_t *p) {
  p->piece_len = 0;
  if (nr_buf_len(&p->body) > 0)
    nr_buf_consume(&p->body, nr_buf_len(&p->body));
}
