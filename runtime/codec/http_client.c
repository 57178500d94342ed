/*
 * http_client.c -- the HTTP/1.1 client codec of http_client.h: response
 * parser, request encoder and the pipeline handler. Loop thread only.
 *
 * Parsing follows the server's parser (http_parse.c), whose helpers it uses
 * through http_parse.h: a response is parsed in place from the bytes fed
 * when it sits whole in one read; otherwise its bytes from its first one
 * are cumulated (base.in) and the head is simply parsed again on each
 * feed, which keeps every pointer valid whatever the buffer did, while the
 * progress through the body is kept as offsets (a chunked body is decoded
 * into base.body by the server's own chunk decoder). A body that runs
 * until the close stays in the cumulation, bounded by max_body, and is
 * delivered by nr_http_client_end.
 *
 * Memory: nothing is held between responses; while one arrives, at most
 * its head (max_header) and body (max_body, plus chunk framing for a
 * chunked one) are.
 */
#include <assert.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "codec/codec.h"
#include "codec/h2.h"
#include "codec/http_client.h"
#include "tls/tls.h"
#include "codec/http_parse.h"

/* The HTTP client's messages, registered as the program loads (netrun.h). */
__attribute__((constructor)) static void declare_types(void) {
  nr_msg_declare(NR_MSG_HTTP_CALL, "http_call");
  nr_msg_declare(NR_MSG_HTTP_REPLY, "http_reply");
}

/* What the bytes in hand are: a head being received, then a body framed
 * by its length, by chunks, or by the close. */
enum { C_HEAD, C_LENGTH, C_CHUNKED, C_CLOSE,
       C_SBODY };            /* a streamed body (the parser's stream) */

#define IEQ(a, n, lit) nr__http_ieq((a), (n), lit, sizeof lit - 1)

/* ---- the head ------------------------------------------------------------- */

/* The offset just past the blank line ending the head, or 0 when it has
 * not all arrived (*scan then remembers where the last line began). */
static size_t block_end(const char *s, size_t n, size_t *scan) {
  size_t ls = *scan;
  for (;;) {
    const char *nl = ls < n ? memchr(s + ls, '\n', n - ls) : NULL;
    if (nl == NULL) {
      *scan = ls;
      return 0;
    }
    size_t j = (size_t)(nl - s);
    if (j == ls || (j == ls + 1 && s[ls] == '\r'))
      return j + 1;
    ls = j + 1;
  }
}

static bool digit(char c) { return c >= '0' && c <= '9'; }

/* "HTTP/1." DIGIT SP 3DIGIT [SP reason] CRLF, within s[0 .. end): the
 * offset past it, or 0 with p->why set. */
static size_t status_line(nr_http_client_parser_t *p, nr_http_reply_t *r,
                          const char *s, size_t end) {
  if (end < 13 || memcmp(s, "HTTP/1.", 7) != 0 || !digit(s[7]) ||
      s[8] != ' ') {
    p->why = memcmp(s, "HTTP/", end < 5 ? end : 5) == 0
                 ? "not an HTTP/1.x status line"
                 : "not an HTTP response (no status line)";
    return 0;
  }
  if (!digit(s[9]) || !digit(s[10]) || !digit(s[11]) || s[9] == '0') {
    p->why = "bad status code";
    return 0;
  }
  r->minor = s[7] > '1' ? 1 : s[7] - '0';
  r->status = (s[9] - '0') * 100 + (s[10] - '0') * 10 + (s[11] - '0');
  const char *nl = memchr(s + 12, '\n', end - 12);
  size_t e = (size_t)(nl - s), i = 12;
  if (s[i] != ' ' && s[i] != '\r' && s[i] != '\n') {
    p->why = "bad status code";
    return 0;
  }
  if (s[i] == ' ')
    i++;
  size_t re = e > i && s[e - 1] == '\r' ? e - 1 : e;
  for (size_t k = i; k < re; k++) {
    unsigned char c = (unsigned char)s[k];
    if ((c < 0x20 && c != '\t') || c == 0x7f) {
      p->why = "control character in the status line";
      return 0;
    }
  }
  r->reason = s + i;
  r->reason_len = re > i ? re - i : 0;
  return e + 1;
}

enum { H_LENGTH = 1, H_TE = 2, H_CHUNKED = 4, H_CLOSE = 8, H_KEEP = 16 };

static int content_length(nr_http_client_parser_t *p,
                          const nr_http_header_t *h, unsigned *seen) {
  uint64_t v = 0;
  if (h->value_len == 0)
    goto bad;
  for (size_t i = 0; i < h->value_len; i++) {
    unsigned c = (unsigned char)h->value[i] - '0';
    if (c > 9 || v > ((uint64_t)INT64_MAX - c) / 10)
      goto bad;
    v = v * 10 + c;
  }
  if ((*seen & H_LENGTH) && v != p->length)
    goto bad;
  *seen |= H_LENGTH;
  p->length = v;
  return 0;
bad:
  p->why = "bad Content-Length";
  return NR_HTTPC_MALFORMED;
}

/* Transfer-Encoding: chunked last means chunked; any other list means the
 * body runs until the close (RFC 9112 6.3). Every line counts. */
static void transfer_encoding(const nr_http_header_t *h, unsigned *seen) {
  size_t i = 0, t0, t1;
  bool last = false;
  while (nr__http_next_item(h->value, h->value_len, &i, &t0, &t1))
    last = IEQ(h->value + t0, t1 - t0, "chunked");
  *seen = (*seen | H_TE) & ~(unsigned)H_CHUNKED;
  if (last)
    *seen |= H_CHUNKED;
}

static int framing(nr_http_client_parser_t *p, const nr_http_header_t *h,
                   unsigned *seen) {
  switch (h->name_len) {
  case 14:
    if (IEQ(h->name, 14, "content-length"))
      return content_length(p, h, seen);
    break;
  case 17:
    if (IEQ(h->name, 17, "transfer-encoding"))
      transfer_encoding(h, seen);
    break;
  case 10:
    if (IEQ(h->name, 10, "connection")) {
      if (nr__http_has_token(h->value, h->value_len, "close", 5))
        *seen |= H_CLOSE;
      if (nr__http_has_token(h->value, h->value_len, "keep-alive", 10))
        *seen |= H_KEEP;
    }
    break;
  }
  return 0;
}

/* Parse the whole head s[0 .. end) into r and decide how its body is
 * framed (*phase). 0 or an error (p->why set). Idempotent: run again
 * after the input moved. */
static int parse_head(nr_http_client_parser_t *p, nr_http_reply_t *r,
                      const char *s, size_t end, int *phase) {
  r->type = NR_MSG_HTTP_REPLY;
  r->streaming = r->piece = r->last = false;
  r->nheaders = r->ntrailers = 0;
  r->body = "";
  r->body_len = 0;
  r->chunked = false;
  size_t i = status_line(p, r, s, end);
  if (i == 0)
    return NR_HTTPC_MALFORMED;
  unsigned seen = 0;
  p->length = 0;
  while (i < end && s[i] != '\n' && !(s[i] == '\r' && s[i + 1] == '\n')) {
    nr_http_header_t h;
    if (nr__http_parse_field(&h, s, end, &i) != 0) {
      p->why = "bad header line";
      return NR_HTTPC_MALFORMED;
    }
    if (r->nheaders == p->base.max_headers) {
      p->why = "more header lines than max_headers";
      return NR_HTTPC_HEADER_TOO_LARGE;
    }
    r->headers[r->nheaders++] = h;
    int rc = framing(p, &h, &seen);
    if (rc)
      return rc;
  }
  r->trailers = r->headers + r->nheaders;
  r->keep_alive = !(seen & H_CLOSE) && (r->minor >= 1 || (seen & H_KEEP));
  bool head = p->nsent > 0 && (p->sent[p->oldest] & NR_HTTPC_HEAD);
  r->head = head;
  int st = r->status;
  if (st < 200 || st == 204 || st == 304 || head) {
    *phase = C_HEAD;           /* no body, whatever the headers say */
  } else if (seen & H_TE) {
    if (seen & H_LENGTH) {     /* framed two ways: a smuggling vector */
      p->why = "both Content-Length and Transfer-Encoding";
      return NR_HTTPC_MALFORMED;
    }
    *phase = (seen & H_CHUNKED) ? C_CHUNKED : C_CLOSE;
  } else {
    *phase = (seen & H_LENGTH) ? C_LENGTH : C_CLOSE;
  }
  if (*phase == C_CLOSE)
    r->keep_alive = false;
  r->chunked = *phase == C_CHUNKED;
  return 0;
}

/* ---- streamed bodies ------------------------------------------------------------ */

/* A response whose body is streamed: its head goes up alone (r), the body
 * follows as pieces (sbody_step). */
static long stream_head(nr_http_client_parser_t *p, nr_http_reply_t *r,
                        int phase, size_t end) {
  nr_http_parser_t *b = &p->base;
  p->sclose = phase == C_CLOSE;
  nr__http_stream_start(b, phase == C_CHUNKED, p->length);
  if (p->sclose)
    b->content_length = 0;     /* (counts what came, against max_body) */
  p->phase = C_SBODY;
  r->streaming = true;
  return (long)end;
}

static int chunk_error(nr_http_client_parser_t *p, long e) {
  p->why = e == -413 ? "response body over max_body"
           : e == -431 ? "trailers over max_header"
                       : "bad chunked body";
  return e == -413 ? NR_HTTPC_TOO_LARGE : e == -431 ? NR_HTTPC_HEADER_TOO_LARGE
         : e == -500 ? NR_HTTPC_NOMEM : NR_HTTPC_MALFORMED;
}

/* The body's end: the parser is ready for the next head. */
static void sbody_over(nr_http_client_parser_t *p) {
  p->base.sbody = false;
  p->sclose = false;
  p->phase = C_LENGTH;         /* (so that next_response resets it all) */
}

/* The next piece of a streamed body from s[0 .. n), to cb in r (piece):
 * the bytes used (0: more input is needed), or -error; *halt is what cb
 * returned. */
static __attribute__((noinline)) long sbody_step(nr_http_client_parser_t *p, nr_http_reply_t *r,
                                const char *s, size_t n, nr_http_reply_cb cb,
                                void *arg, int *halt) {
  nr_http_parser_t *b = &p->base;
  nr_http_request_t q;
  bool piece;
  long used;
  if (p->sclose) {
    if (n > b->max_body - b->content_length) {
      p->why = "response body over max_body";
      return -NR_HTTPC_TOO_LARGE;
    }
    b->content_length += n;
    q.body = s;
    q.body_len = n;
    q.last = false;
    q.ntrailers = 0;
    q.trailers = q.headers;
    piece = n > 0;
    used = (long)n;
  } else {
    used = nr__http_stream_piece(b, &q, s, n, &piece);
    if (used < 0)
      return -chunk_error(p, used);
  }
  if (!piece)
    return used;
  r->type = NR_MSG_HTTP_REPLY;
  r->streaming = false;
  r->piece = true;
  r->last = q.last;
  r->body = q.body;
  r->body_len = q.body_len;
  r->nheaders = 0;
  r->ntrailers = q.ntrailers;
  r->trailers = q.trailers;
  if (q.last)
    sbody_over(p);
  *halt = cb(arg, r);
  nr__http_stream_piece_done(b);
  return used;
}

/* ---- one response ------------------------------------------------------------ */

/* Parse one response at s[0 .. n): its length when whole (r filled in),
 * 0 when more is needed (or its body runs until the close), or -error. */
static long parse_one(nr_http_client_parser_t *p, nr_http_reply_t *r,
                      const char *s, size_t n) {
  nr_http_parser_t *b = &p->base;
  int phase;
  size_t end = p->phase == C_HEAD ? block_end(s, n, &b->scan) : b->head_len;
  if (end == 0) {
    if (n > b->max_header) {
      p->why = "response head over max_header";
      return -NR_HTTPC_HEADER_TOO_LARGE;
    }
    return 0;
  }
  if (end > b->max_header) {
    p->why = "response head over max_header";
    return -NR_HTTPC_HEADER_TOO_LARGE;
  }
  int rc = parse_head(p, r, s, end, &phase);
  if (rc)
    return -rc;
  if (p->nsent == 0 && !(r->status >= 100 && r->status < 200 &&
                         r->status != 101)) {
    p->why = "a response to no request";
    return -NR_HTTPC_UNEXPECTED;
  }
  if (p->phase == C_HEAD) {
    if (phase == C_HEAD)
      return (long)end;        /* no body: the usual for 1xx, 204, 304 */
    b->head_len = end;
    p->phase = phase;
    if (phase == C_CHUNKED)
      nr__http_chunks_start(b, end);
    if (phase == C_LENGTH && p->length > b->max_body) {
      p->why = "response body over max_body";
      return -NR_HTTPC_TOO_LARGE;
    }
    if (p->stream && r->status >= 200 && (phase != C_LENGTH || p->length > 0))
      return stream_head(p, r, phase, end);
  }
  switch (p->phase) {
  case C_LENGTH:
    if (n - end < p->length)
      return 0;
    r->body = s + end;
    r->body_len = (size_t)p->length;
    return (long)(end + p->length);
  case C_CLOSE:
    if (n - end > b->max_body) {
      p->why = "response body over max_body";
      return -NR_HTTPC_TOO_LARGE;
    }
    return 0;
  default: {
    long e = nr__http_decode_chunks(b, s, n);
    if (e <= 0) {
      p->why = e == -413 ? "response body over max_body"
               : e == -431 ? "trailers over max_header"
                           : "bad chunked body";
      return e == 0 ? 0 : e == -413 ? -NR_HTTPC_TOO_LARGE
                        : e == -431 ? -NR_HTTPC_HEADER_TOO_LARGE
                        : e == -500 ? -NR_HTTPC_NOMEM : -NR_HTTPC_MALFORMED;
    }
    size_t i = b->pos;         /* the trailer section: kept apart */
    while (i < (size_t)e && s[i] != '\n' && s[i] != '\r') {
      nr_http_header_t h;
      if (nr__http_parse_field(&h, s, (size_t)e, &i) != 0 ||
          r->nheaders + r->ntrailers == b->max_headers) {
        p->why = "bad trailer";
        return -NR_HTTPC_MALFORMED;
      }
      r->headers[r->nheaders + r->ntrailers++] = h;
    }
    r->body = nr_buf_len(&b->body) ? nr_buf_peek(&b->body) : "";
    r->body_len = nr_buf_len(&b->body);
    return e;
  }
  }
}

/* ---- feeding ------------------------------------------------------------------ */

void nr_http_client_parser_init(nr_http_client_parser_t *p, size_t max_header,
                                size_t max_body, size_t max_headers) {
  memset(p, 0, sizeof *p);
  nr_http_parser_init(&p->base, max_header, max_body, max_headers);
}

void nr_http_client_parser_free(nr_http_client_parser_t *p) {
  nr_http_parser_free(&p->base);
  nr_buf_free(&p->rest);
}

int nr_http_client_expect(nr_http_client_parser_t *p, unsigned flags) {
  if (p->nsent == NR_HTTPC_RING)
    return -EBUSY;
  p->sent[(p->oldest + p->nsent++) % NR_HTTPC_RING] = (uint8_t)flags;
  return 0;
}

bool nr_http_client_busy(const nr_http_client_parser_t *p) {
  return p->phase != C_HEAD || nr_buf_len(&p->base.in) > 0;
}

/* After a response (or a skipped 1xx): ready for the next head. */
static void next_response(nr_http_client_parser_t *p) {
  nr_http_parser_t *b = &p->base;
  b->scan = 0;
  if (p->phase != C_HEAD) {
    p->phase = C_HEAD;
    b->phase = 0;
    b->head_len = b->pos = 0;
    b->chunk_left = 0;
    p->length = 0;
    if (b->body.data != NULL)
      nr_buf_free(&b->body);
  }
}

static void answered(nr_http_client_parser_t *p) {
  if (p->nsent > 0) {
    p->oldest = (p->oldest + 1) % NR_HTTPC_RING;
    p->nsent--;
  }
}

static int stop(nr_http_client_parser_t *p, int rc) {
  nr_http_parser_free(&p->base);
  p->stopped = true;
  return rc;
}

int nr_http_client_feed(nr_http_client_parser_t *p, const char *data,
                        size_t len, nr_http_reply_cb cb, void *arg) {
  if (p->stopped)
    return p->upgraded ? 0 : NR_HTTPC_STOPPED;
  nr_buf_t *in = &p->base.in;
  bool cum = nr_buf_len(in) > 0;
  if (cum && len > 0 && nr_buf_append(in, data, len) < 0) {
    p->why = "out of memory";
    return stop(p, NR_HTTPC_NOMEM);
  }
  /* The reply lives on the stack, rebuilt from the bytes on every call. */
  nr_http_reply_t r;
  const char *s = cum ? nr_buf_peek(in) : data;
  size_t n = cum ? nr_buf_len(in) : len, off = 0;
  while (off < n) {
    if (p->phase == C_SBODY) {
      int halt = 0;
      r.piece = false;
      long k = sbody_step(p, &r, s + off, n - off, cb, arg, &halt);
      if (k < 0)
        return stop(p, (int)-k);
      off += (size_t)k;
      if (r.piece && r.last)
        next_response(p);
      if (halt)
        return stop(p, NR_HTTPC_STOPPED);
      if (k == 0)
        break;                 /* framing split across reads: wait */
      continue;
    }
    long k = parse_one(p, &r, s + off, n - off);
    if (k < 0)
      return stop(p, (int)-k);
    if (k == 0)
      break;
    off += (size_t)k;
    if (r.status < 200 && r.status != 101) {
      next_response(p);        /* 100 Continue, 103 Early Hints: skipped */
      if (++p->info > NR_HTTPC_MAX_INFO) {
        p->why = "more than 5 informational (1xx) responses";
        return stop(p, NR_HTTPC_MALFORMED);
      }
      continue;
    }
    p->info = 0;
    answered(p);
    int halt = cb(arg, &r);
    if (r.streaming)
      p->base.scan = 0;        /* its body follows */
    else
      next_response(p);        /* after: a chunked body lives in base.body */
    if (halt)
      return stop(p, NR_HTTPC_STOPPED);
    if (r.status == 101) {     /* what follows is another protocol's */
      p->upgraded = true;
      if (off < n && nr_buf_append(&p->rest, s + off, n - off) < 0) {
        p->why = "out of memory";
        return stop(p, NR_HTTPC_NOMEM);
      }
      return stop(p, 0);
    }
  }
  if (cum) {
    nr_buf_consume(in, off);
  } else if (off < n && nr_buf_append(in, s + off, n - off) < 0) {
    p->why = "out of memory";
    return stop(p, NR_HTTPC_NOMEM);
  }
  return 0;
}

int nr_http_client_end(nr_http_client_parser_t *p, nr_http_reply_cb cb,
                       void *arg) {
  if (p->stopped)
    return 0;
  nr_buf_t *in = &p->base.in;
  if (p->phase == C_SBODY && p->sclose) {
    nr_http_reply_t r;         /* the end of a body that ran to the close */
    r.type = NR_MSG_HTTP_REPLY;
    r.streaming = false;
    r.piece = r.last = true;
    r.body = "";
    r.body_len = r.nheaders = r.ntrailers = 0;
    r.trailers = r.headers;
    sbody_over(p);
    cb(arg, &r);
    return stop(p, 0);
  }
  if (p->phase == C_CLOSE) {
    nr_http_reply_t r;
    int phase;
    const char *s = nr_buf_peek(in);
    size_t n = nr_buf_len(in), end = p->base.head_len;
    if (parse_head(p, &r, s, end, &phase) == 0) {
      r.body = s + end;
      r.body_len = n - end;
      answered(p);
      cb(arg, &r);
    }
    return stop(p, 0);
  }
  if (nr_http_client_busy(p)) {
    p->why = "the connection closed in the middle of a response";
    return stop(p, NR_HTTPC_TRUNCATED);
  }
  if (p->nsent > 0) {
    p->why = "the connection closed before a response";
    return stop(p, NR_HTTPC_TRUNCATED);
  }
  return stop(p, 0);
}

/* ---- encoder ------------------------------------------------------------------ */

/* Does the request frame its body itself (Content-Length or
 * Transfer-Encoding among its headers)? */
static bool framed(const nr_http_call_t *c) {
  for (size_t i = 0; i < c->nheaders; i++) {
    const nr_http_header_t *h = &c->headers[i];
    if (IEQ(h->name, h->name_len, "content-length") ||
        IEQ(h->name, h->name_len, "transfer-encoding"))
      return true;
  }
  return false;
}

/* A body needs a Content-Length unless framed; so does an empty POST,
 * PUT or PATCH (servers may wait for a body otherwise). */
static bool needs_length(const nr_http_call_t *c) {
  if (c->body == NULL && !(c->method_len == 4 && memcmp(c->method, "POST", 4) == 0) &&
      !(c->method_len == 3 && memcmp(c->method, "PUT", 3) == 0) &&
      !(c->method_len == 5 && memcmp(c->method, "PATCH", 5) == 0))
    return false;
  return !framed(c);
}

size_t nr_http_call_head_size(const nr_http_call_t *c) {
  size_t n = c->method_len + 1 + c->target_len + sizeof " HTTP/1.1\r\n" - 1;
  for (size_t i = 0; i < c->nheaders; i++)
    n += c->headers[i].name_len + 2 + c->headers[i].value_len + 2;
  if (needs_length(c))
    n += sizeof "Content-Length: \r\n" - 1 + 20;
  return n + 2;
}

static char *put(char *w, const void *s, size_t n) {
  memcpy(w, s, n);
  return w + n;
}

size_t nr_http_call_encode_head(const nr_http_call_t *c, char *out) {
  char *w = put(out, c->method, c->method_len);
  *w++ = ' ';
  w = put(w, c->target, c->target_len);
  w = put(w, " HTTP/1.1\r\n", 11);
  for (size_t i = 0; i < c->nheaders; i++) {
    const nr_http_header_t *h = &c->headers[i];
    w = put(w, h->name, h->name_len);
    w = put(w, ": ", 2);
    w = put(w, h->value, h->value_len);
    w = put(w, "\r\n", 2);
  }
  if (needs_length(c))
    w += sprintf(w, "Content-Length: %zu\r\n", c->body ? c->body_len : 0);
  w = put(w, "\r\n", 2);
  return (size_t)(w - out);
}

/* ---- the handler ---------------------------------------------------------------- */

typedef struct client_s {
  nr_http_client_parser_t parser;
  nr_ctx_t *ctx;
  int depth;                  /* inside read */
  bool dead;                  /* removed during read: free when it returns */
  bool raw;                   /* opts->raw, passed on in each reply */
  bool tls;                   /* TLS was agreed under the codec */
  nr_h2_client_t *h2;         /* the connection speaks HTTP/2 (h2.h) */
  nr_http_client_opts_t o;    /* (its h2 mode, the session's limits) */
} client_t;

void *nr_http_client_new(const nr_http_client_opts_t *o) {
  client_t *c = calloc(1, sizeof *c);
  if (c != NULL) {
    nr_http_client_parser_init(&c->parser, o->max_header, o->max_body,
                               o->max_headers);
    c->raw = o->raw;
    c->parser.stream = o->stream;
    c->o = *o;
  }
  return c;
}

static void client_free(client_t *c) {
  nr_h2_client_free(c->h2);
  nr_http_client_parser_free(&c->parser);
  free(c);
}

/* HTTP/2 from now on (TLS agreed "h2", or h2c by prior knowledge). */
static int start_h2(client_t *c, nr_ctx_t *ctx) {
  c->ctx = ctx;
  c->h2 = nr_h2_client_new(ctx, &c->o, c->tls);
  if (c->h2 == NULL)
    return nr_raise(-ENOMEM, "http_client: out of memory starting HTTP/2");
  return 0;
}

/* Whether a TLS handler comes before ctx in its pipeline. */
static bool behind_tls(nr_ctx_t *ctx) {
  for (nr_ctx_t *c = nr_pipeline_first(nr_ctx_pipeline(ctx)); c && c != ctx;
       c = nr_ctx_next(c))
    if (strcmp(nr_ctx_handler(c)->type, "tls") == 0)
      return true;
  return false;
}

/* h2 = true on a plain connection: h2c by prior knowledge, from the
 * start (the handlers after the codec hear of it before they write). */
int nr_http_client_active(nr_ctx_t *ctx) {
  client_t *c = nr_ctx_state(ctx);
  if (c->o.h2 == NR_H2C_ON && c->h2 == NULL && !behind_tls(ctx) &&
      start_h2(c, ctx) < 0) {
    nr_err_t err = {-ENOMEM, "http_client: out of memory starting HTTP/2"};
    nr_ctx_fire_exception(ctx, &err);
    nr_ctx_close(ctx, NULL);
  }
  nr_ctx_fire_active(ctx);
  return 0;
}

/* TLS's handshake: ALPN says which protocol (with h2 off, none is asked). */
int nr_http_client_user_event(nr_ctx_t *ctx, void *evt) {
  client_t *c = nr_ctx_state(ctx);
  const nr_tls_event_t *e = evt;
  if (nr_msg_type(evt) == NR_MSG_TLS_EVENT && e->kind == NR_TLS_HANDSHAKE &&
      c->h2 == NULL) {
    c->tls = true;
    bool h2 = e->alpn != NULL && strcmp(e->alpn, "h2") == 0;
    if (h2 && c->o.h2 != NR_H2C_OFF && start_h2(c, ctx) < 0) {
      nr_err_t err = {-ENOMEM, "http_client: out of memory starting HTTP/2"};
      nr_ctx_fire_exception(ctx, &err);
      nr_ctx_close(ctx, NULL);
    } else if (!h2 && c->o.h2 == NR_H2C_ON) {
      nr_err_t err = {-EPROTO, "http_client: the server did not agree h2 "
                               "(ALPN) and h2 = true"};
      nr_ctx_fire_exception(ctx, &err);
      nr_ctx_close(ctx, NULL);
    }
  }
  nr_ctx_fire_user_event(ctx, evt);
  return 0;
}

void nr_http_client_removed(nr_ctx_t *ctx) {
  client_t *c = nr_ctx_state(ctx);
  if (c->depth > 0)
    c->dead = true;
  else
    client_free(c);
}

static int deliver(void *arg, nr_http_reply_t *r) {
  client_t *c = arg;
  if (r->piece) {              /* a streamed body's: as the server's pieces */
    nr_http_body_t b = {NR_MSG_HTTP_BODY, r->last, r->body, r->body_len,
                        r->trailers, r->ntrailers, 0, 0};
    nr_ctx_fire_read(c->ctx, &b);
    return c->dead || !nr_channel_is_open(nr_ctx_channel(c->ctx));
  }
  r->raw = c->raw;
  r->tag = 0;                  /* HTTP/1.1: replies come in request order */
  r->error = NULL;
  r->retry = r->h2 = false;
  nr_ctx_fire_read(c->ctx, r);
  return c->dead || !nr_channel_is_open(nr_ctx_channel(c->ctx));
}

/* A response that cannot be read: say why to the handlers after the
 * codec, and close the connection (nothing after it can be trusted). */
static void failed(client_t *c, nr_ctx_t *ctx, int rc) {
  char msg[160];
  const char *kind = rc == NR_HTTPC_TOO_LARGE ? "response too large"
                     : rc == NR_HTTPC_HEADER_TOO_LARGE ? "response head too large"
                     : rc == NR_HTTPC_TRUNCATED ? "incomplete response"
                     : rc == NR_HTTPC_NOMEM ? "out of memory"
                     : "malformed response";
  if (rc == NR_HTTPC_TOO_LARGE)
    snprintf(msg, sizeof msg, "http_client: %s: body over max_body (%zu bytes)",
             kind, c->parser.base.max_body);
  else if (rc == NR_HTTPC_HEADER_TOO_LARGE)
    snprintf(msg, sizeof msg, "http_client: %s: %s (%zu bytes)", kind,
             c->parser.why, c->parser.base.max_header);
  else
    snprintf(msg, sizeof msg, "http_client: %s: %s", kind,
             c->parser.why ? c->parser.why : "?");
  nr_err_t err = {rc == NR_HTTPC_NOMEM ? -ENOMEM : -EBADMSG, msg};
  nr_ctx_fire_exception(ctx, &err);
  nr_ctx_close(ctx, NULL);
}

/* After a 101, what came with it goes to the handlers (a tunnel, or the
 * next protocol's codec), as bytes. */
static void handover(client_t *c, nr_ctx_t *ctx) {
  nr_buf_t rest = c->parser.rest;
  c->parser.rest = NR_BUF_INIT;
  nr_bytes_t b = NR_BYTES(nr_buf_peek(&rest), nr_buf_len(&rest));
  nr_ctx_fire_read(ctx, &b);
  nr_buf_free(&rest);
}

int nr_http_client_channel_read(nr_ctx_t *ctx, void *msg) {
  client_t *c = nr_ctx_state(ctx);
  if (nr_msg_type(msg) != NR_MSG_BYTES) {
    nr_ctx_fire_read(ctx, msg);
    return 0;
  }
  if (c->parser.stopped) {      /* after an error, or an upgrade: then the
                                  next protocol's bytes, to the handlers */
    if (c->parser.upgraded)
      nr_ctx_fire_read(ctx, msg);
    return 0;
  }
  if (c->depth > 0)
    return nr_raise(-EBUSY, "http_client: bytes fired into the codec while "
                    "it is delivering a response");
  const nr_bytes_t *b = msg;
  c->ctx = ctx;
  c->depth++;
  int rc = 0;
  if (c->h2 != NULL)
    nr_h2_client_feed(c->h2, b->data, b->len);
  else
    rc = nr_http_client_feed(&c->parser, b->data, b->len, deliver, c);
  c->depth--;
  if (c->dead) {
    client_free(c);
    return 0;
  }
  if (rc > NR_HTTPC_STOPPED)
    failed(c, ctx, rc);
  else if (c->parser.upgraded && nr_buf_len(&c->parser.rest) > 0)
    handover(c, ctx);
  return 0;
}

int nr_http_client_inactive(nr_ctx_t *ctx) {
  client_t *c = nr_ctx_state(ctx);
  c->ctx = ctx;
  c->depth++;
  int rc = 0;
  if (c->h2 != NULL)
    nr_h2_client_end(c->h2);   /* every stream still open fails */
  else
    rc = nr_http_client_end(&c->parser, deliver, c);
  c->depth--;
  if (c->dead) {
    client_free(c);
    return 0;
  }
  if (rc > NR_HTTPC_STOPPED) {
    char msg[160];
    snprintf(msg, sizeof msg, "http_client: incomplete response: %s",
             c->parser.why);
    nr_err_t err = {-ECONNRESET, msg};
    nr_ctx_fire_exception(ctx, &err);
  }
  nr_ctx_fire_inactive(ctx);
  return 0;
}

bool nr_http_client_set_stream(nr_ctx_t *ctx, bool on) {
  client_t *c = nr_ctx_state(ctx);
  if (c->h2 != NULL || c->parser.stopped)
    return false;
  c->parser.stream = on;
  return true;
}

int nr_http_client_write(nr_ctx_t *ctx, void *msg, nr_promise_t *p) {
  if (nr_msg_type(msg) != NR_MSG_HTTP_CALL)
    return nr_ctx_write(ctx, msg, p);
  client_t *c = nr_ctx_state(ctx);
  const nr_http_call_t *call = msg;
  if (c->h2 != NULL)
    return nr_h2_client_write(c->h2, call, p);
  if (call->cancel)
    return 0;                  /* (HTTP/1.1: the pool closes the connection) */
  bool head = call->method_len == 4 && memcmp(call->method, "HEAD", 4) == 0;
  if (c->parser.stopped)
    return nr_raise(-EPIPE, "http_client: the connection can carry no more "
                    "requests (a response failed or switched protocols)");
  if (nr_http_client_expect(&c->parser, head ? NR_HTTPC_HEAD : 0) < 0)
    return nr_raise(-EBUSY, "http_client: more than %d requests unanswered",
                    NR_HTTPC_RING);
  char small[2048];
  size_t n = nr_http_call_head_size(call);
  char *h = n <= sizeof small ? small : malloc(n);
  if (h == NULL)
    return nr_raise(-ENOMEM, "http_client: out of memory encoding a request");
  n = nr_http_call_encode_head(call, h);
  int rc;
  if (call->body == NULL || call->body_len == 0) {
    nr_bytes_t b = NR_BYTES(h, n);
    rc = nr_ctx_write(ctx, &b, p);
  } else {
    nr_slice_t v[2] = {{h, n}, {call->body, call->body_len}};
    nr_slices_t sl = {NR_MSG_SLICES, v, 2};
    rc = nr_ctx_write(ctx, &sl, p);
  }
  if (h != small)
    free(h);
  return rc;
}

const nr_handler_t nr_http_client_handler = {
    .type = "http_client", .removed = nr_http_client_removed,
    .active = nr_http_client_active, .inactive = nr_http_client_inactive,
    .user_event = nr_http_client_user_event,
    .channel_read = nr_http_client_channel_read,
    .write = nr_http_client_write, .flags = NR_HANDLER_SYNC_WRITE};
