/*
 * http_chunked.c -- chunked request bodies (RFC 9112 7.1) for the HTTP
 * parser (http_parse.c) and the client codec (http_parse.h): chunk-size
 * lines bounded by CHUNK_LINE_MAX, the data decoded in place, trailer
 * fields parsed like headers. Loop thread only, on the parser it is
 * given.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "codec/http.h"
#include "codec/http_chars.h"
#include "codec/http_parse.h"

/* ---- chunked bodies -------------------------------------------------------------- */

/* Each step of decode_chunks returns STEP to go on with the next phase, 0
 * when it needs more input, or -status. */
#define STEP 1

/* The chunk size in hex at s[i .. end) into *v, any number of digits
 * (leading zeros are fine): how many, 0 for none, -1 past 2^63 - 1. */
static long chunk_size(const char *s, size_t i, size_t end, uint64_t *v) {
  size_t digits = 0;
  for (*v = 0; i + digits < end; digits++) {
    int c = lower((unsigned char)s[i + digits]);
    int d = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : -1;
    if (d < 0)
      break;
    if (*v > LENGTH_MAX >> 4)
      return -1;             /* no size at all */
    *v = *v * 16 + (uint64_t)d;
  }
  return (long)digits;
}

/* Chunk extensions at s[i .. end) are ignored, but must be sane: no
 * control bytes (the line's CR aside), and set off from the size. */
static bool chunk_ext_ok(const char *s, size_t i, size_t end) {
  if (i != end && s[i] != ';' && s[i] != ' ' && s[i] != '\t' && s[i] != '\r')
    return false;
  for (; i < end; i++) {
    unsigned char c = (unsigned char)s[i];
    if ((c < 0x20 && c != '\t' && !(c == '\r' && i + 1 == end)) || c == 0x7f)
      return false;
  }
  return true;
}

/* P_CHUNK_SIZE: the chunk-size line; a zero size starts the trailer. */
static long chunk_size_line(nr_http_parser_t *p, const char *s, size_t n) {
  const char *nl = memchr(s + p->pos, '\n', n - p->pos);
  if (nl == NULL)
    return n - p->pos > CHUNK_LINE_MAX ? -400 : 0;
  size_t end = (size_t)(nl - s);
  if (end - p->pos > CHUNK_LINE_MAX)
    return -400;
  uint64_t v;
  long digits = chunk_size(s, p->pos, end, &v);
  if (digits <= 0 || !chunk_ext_ok(s, p->pos + (size_t)digits, end))
    return -400;
  p->pos = end + 1;
  if (v == 0) {
    p->phase = P_TRAILER;
    p->scan = p->pos;
    return STEP;
  }
  uint64_t had = p->sbody ? p->content_length : nr_buf_len(&p->body);
  if (v > p->max_body - had)
    return -413;
  if (p->sbody)
    p->content_length = had + v;   /* (a streamed body counts what came) */
  p->chunk_left = v;
  p->phase = P_CHUNK_DATA;
  return STEP;
}

/* A streamed piece's data s[at .. at + n) (s: what stream_piece was
 * given, at most STREAM_RUN bytes): the first run of a feed is only
 * pointed at, by offset (one chunk spanning reads, the usual, costs no
 * copy); a second one puts both in the body buffer. */
static int piece_add(nr_http_parser_t *p, const char *s, size_t at, size_t n) {
  if (p->piece_len == 0 && nr_buf_len(&p->body) == 0) {
    p->piece_at = (uint32_t)at;
    p->piece_len = (uint32_t)n;
    return 0;
  }
  if (p->piece_len != 0) {
    if (nr_buf_append(&p->body, s + p->piece_at, p->piece_len) < 0)
      return -1;
    p->piece_len = 0;
  }
  return nr_buf_append(&p->body, s + at, n);
}

/* P_CHUNK_DATA: what there is of the chunk, into the body (or the piece
 * streamed). */
static long chunk_data(nr_http_parser_t *p, const char *s, size_t n) {
  size_t take = n - p->pos;
  if (take > p->chunk_left)
    take = (size_t)p->chunk_left;
  if (take > 0 && (p->stream ? piece_add(p, s, p->pos, take)
                             : nr_buf_append(&p->body, s + p->pos, take)) < 0)
    return -500;
  p->pos += take;
  p->chunk_left -= take;
  if (p->chunk_left > 0)
    return 0;
  p->phase = P_CHUNK_CRLF;
  return STEP;
}

/* P_CHUNK_CRLF: the line end after a chunk's data (CRLF or LF). */
static long chunk_crlf(nr_http_parser_t *p, const char *s, size_t n) {
  if (p->pos >= n)
    return 0;
  if (s[p->pos] == '\r') {
    if (p->pos + 1 >= n)
      return 0;
    if (s[p->pos + 1] != '\n')
      return -400;
    p->pos++;
  } else if (s[p->pos] != '\n') {
    return -400;
  }
  p->pos++;
  p->phase = P_CHUNK_SIZE;
  return STEP;
}

/* P_TRAILER: the offset just past the trailer section, 0 or -431. */
static long trailer_end(nr_http_parser_t *p, const char *s, size_t n) {
  size_t end = nr__http_find_block_end(p, s, n);
  if (end == 0)
    return n - p->pos > p->max_header ? -431 : 0;
  if (end - p->pos > p->max_header)
    return -431;
  return (long)end;
}

/* Decode chunks from s[p->pos .. n): 0 need more, -status, or the offset
 * just past the trailer section. */
long nr__http_decode_chunks(nr_http_parser_t *p, const char *s, size_t n) {
  long rc = STEP;
  while (rc == STEP) {
    if (p->pos - p->head_len > 2 * p->max_body + 65536)
      return -413;           /* chunk framing out of all proportion */
    switch (p->phase) {
    case P_CHUNK_SIZE: rc = chunk_size_line(p, s, n); break;
    case P_CHUNK_DATA: rc = chunk_data(p, s, n); break;
    case P_CHUNK_CRLF: rc = chunk_crlf(p, s, n); break;
    case P_TRAILER: return trailer_end(p, s, n);
    default: return -500;
    }
  }
  return rc;
}

/* Fields a trailer may not carry (RFC 9110 6.5.1): those that frame,
 * route or authorise the message, or modify how it is handled. A
 * recipient that merged trailers into the headers -- as netrun once did --
 * would let a trailer "Host: evil" or "Content-Length: 0" change what the
 * head said after the head was judged; netrun keeps trailers apart, and
 * refuses these anyway, so no proxy behind it can be fooled either. */
static const char *const trailer_forbidden[] = {
    "content-length", "transfer-encoding", "trailer", "host", "connection",
    "keep-alive", "upgrade", "te", "expect", "max-forwards", "content-type",
    "content-encoding", "content-range", "range", "if-match",
    "if-none-match", "if-modified-since", "if-unmodified-since", "if-range",
    "cache-control", "authorization", "proxy-authorization", "cookie"};

static bool forbidden_in_trailer(const nr_http_header_t *h) {
  size_t n = sizeof trailer_forbidden / sizeof trailer_forbidden[0];
  for (size_t i = 0; i < n; i++)
    if (ieq(h->name, h->name_len, trailer_forbidden[i],
            strlen(trailer_forbidden[i])))
      return true;
  return false;
}

/* Parse the trailer fields at s[from .. end) (it ends with the blank
 * line) into r->trailers, after the headers in the same array: 0, 400
 * (a bad line, a line starting with a bare CR, a forbidden field) or 431
 * (headers and trailers over max_headers). */
int nr__http_parse_trailers(nr_http_parser_t *p, nr_http_request_t *r,
                          const char *s, size_t from, size_t end) {
  size_t i = from;
  r->trailers = r->headers + r->nheaders;
  r->ntrailers = 0;
  while (i < end && s[i] != '\n' &&
         !(s[i] == '\r' && i + 1 < end && s[i + 1] == '\n')) {
    nr_http_header_t h;
    if (nr__http_parse_field(&h, s, end, &i) != 0 || forbidden_in_trailer(&h))
      return 400;
    if (r->nheaders + r->ntrailers == p->max_headers)
      return 431;
    r->headers[r->nheaders + r->ntrailers++] = h;
  }
  return 0;
}
