/*
 * test_http_stream.c -- the request parser streaming bodies
 * (runtime/codec/http_parse.c with p->stream): the head alone, then the
 * body in pieces, whatever the splits; nothing held but framing; limits;
 * a pause keeps the rest.
 */
#include "codec/http.h"
#include "codec/http_parse.h"
#include "test.h"

typedef struct seen_s {
  char heads[512];            /* "METHOD PATH streaming|whole;" each */
  char body[1 << 16];
  size_t body_len;
  int pieces, lasts, requests;
  char trailers[256];
  int pause_after;            /* pause after this many pieces (0: never) */
  size_t max_held;            /* the most the parser held between feeds */
} seen_t;

/* A piece of a streamed body (server or client), gathered into s. */
static void got_piece(seen_t *s, const char *body, size_t len, bool last,
                      const nr_http_header_t *tr, size_t ntr) {
  CHECK(len > 0 || last);
  CHECK_LE(s->body_len + len, sizeof s->body);
  memcpy(s->body + s->body_len, body, len);
  s->body_len += len;
  s->pieces++;
  if (!last)
    return;
  s->lasts++;
  for (size_t i = 0; i < ntr; i++) {
    size_t n = strlen(s->trailers);
    snprintf(s->trailers + n, sizeof s->trailers - n, "%.*s=%.*s;",
             (int)tr[i].name_len, tr[i].name, (int)tr[i].value_len,
             tr[i].value);
  }
}

static int on_event(void *arg, int ev, nr_http_request_t *r) {
  seen_t *s = arg;
  if (ev == NR_HTTP_EV_CONTINUE)
    FAIL("a streaming parser sends no EV_CONTINUE");
  if (ev == NR_HTTP_EV_REQUEST) {
    s->requests++;
    size_t n = strlen(s->heads);
    snprintf(s->heads + n, sizeof s->heads - n, "%.*s %.*s %s;",
             (int)r->method_len, r->method, (int)r->path_len, r->path,
             r->streaming ? "streaming" : "whole");
    if (!r->streaming) {
      CHECK_LE(s->body_len + r->body_len, sizeof s->body);
      memcpy(s->body + s->body_len, r->body, r->body_len);
      s->body_len += r->body_len;
    }
    return 0;
  }
  got_piece(s, r->body, r->body_len, r->last, r->trailers, r->ntrailers);
  if (s->pause_after && s->pieces % s->pause_after == 0)
    return NR_HTTP_PAUSE;
  return 0;
}

/* Feed msg split at every k bytes (k = 0: whole), resuming after pauses. */
static int feed_split(nr_http_parser_t *p, seen_t *s, const char *msg,
                      size_t n, size_t k) {
  size_t at = 0;
  while (at < n) {
    size_t take = k == 0 || n - at < k ? n - at : k;
    int rc = nr_http_feed(p, msg + at, take, on_event, s);
    if (rc != 0)
      return rc;
    for (int i = 0; i < 1000 && nr_buf_len(&p->in) > 0; i++) {
      size_t before = nr_buf_len(&p->in);
      if (before > s->max_held)
        s->max_held = before;
      if ((rc = nr_http_feed(p, NULL, 0, on_event, s)) != 0)
        return rc;
      if (nr_buf_len(&p->in) == before)
        break;               /* (only framing waits: more input needed) */
    }
    at += take;
  }
  return 0;
}

static nr_http_parser_t *parser(size_t max_body) {
  static nr_http_parser_t p;
  nr_http_parser_init(&p, 8192, max_body, 64);
  p.stream = true;
  return &p;
}

static const char chunked[] =
    "POST /c HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
    "5\r\nhello\r\n1;ext=1\r\n \r\n10\r\n0123456789abcdef\r\n0\r\n"
    "X-Sum: 7\r\n\r\n"
    "GET /next HTTP/1.1\r\nHost: x\r\n\r\n";

TEST(a_chunked_body_streams_the_same_whatever_the_splits) {
  size_t n = sizeof chunked - 1;
  for (size_t k = 0; k <= n; k++) {
    seen_t s = {0};
    nr_http_parser_t *p = parser(1 << 20);
    CHECK_EQ(feed_split(p, &s, chunked, n, k), 0);
    CHECK_STR(s.heads, "POST /c streaming;GET /next whole;");
    CHECK_EQ(s.body_len, 22);
    CHECK(memcmp(s.body, "hello 0123456789abcdef", 22) == 0);
    CHECK_EQ(s.lasts, 1);
    CHECK_STR(s.trailers, "X-Sum=7;");
    CHECK_EQ(nr_buf_len(&p->in), 0);
    nr_http_parser_free(p);
  }
}

TEST(a_body_of_known_length_streams_without_being_held) {
  char msg[70000];
  int h = snprintf(msg, sizeof msg,
                   "PUT /u HTTP/1.1\r\nHost: x\r\nContent-Length: 65536\r\n\r\n");
  for (int i = 0; i < 65536; i++)
    msg[h + i] = (char)('a' + i % 26);
  size_t n = (size_t)h + 65536;
  static const size_t splits[] = {0, 1, 7, 1000, 4096, 65535};
  for (size_t i = 0; i < sizeof splits / sizeof splits[0]; i++) {
    seen_t s = {0};
    nr_http_parser_t *p = parser(1 << 20);
    CHECK_EQ(feed_split(p, &s, msg, n, splits[i]), 0);
    CHECK_STR(s.heads, "PUT /u streaming;");
    CHECK_EQ(s.body_len, 65536);
    CHECK(memcmp(s.body, msg + h, 65536) == 0);
    CHECK_EQ(s.lasts, 1);
    CHECK_EQ(p->in.cap, 0);          /* nothing was ever cumulated but */
    nr_http_parser_free(p);          /* (a split head) */
  }
}

TEST(a_pause_keeps_the_rest_for_the_next_feed) {
  size_t n = sizeof chunked - 1;
  seen_t s = {.pause_after = 1};
  nr_http_parser_t *p = parser(1 << 20);
  CHECK_EQ(feed_split(p, &s, chunked, n, 0), 0);
  CHECK_STR(s.heads, "POST /c streaming;GET /next whole;");
  CHECK_EQ(s.body_len, 22);
  CHECK_STR(s.trailers, "X-Sum=7;");
  nr_http_parser_free(p);
}

TEST(a_streamed_body_over_max_body_is_413) {
  seen_t s = {0};
  static const char big[] = "POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 11\r\n\r\n";
  CHECK_EQ(nr_http_feed(parser(10), big, sizeof big - 1, on_event, &s), 413);
  CHECK_EQ(s.requests, 0);           /* refused before its head goes up */
  seen_t t = {0};
  nr_http_parser_t *p = parser(10);
  static const char ch[] = "POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
                           "6\r\nabcdef\r\n5\r\nghijk\r\n";
  CHECK_EQ(nr_http_feed(p, ch, sizeof ch - 1, on_event, &t), 413);
  CHECK_EQ(t.requests, 1);           /* (known only as it comes) */
  CHECK_EQ(t.body_len, 0);           /* the piece of that feed is refused */
}

TEST(chunk_framing_holds_a_line_at_most) {
  seen_t s = {0};
  nr_http_parser_t *p = parser(1 << 20);
  static const char head[] = "POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n";
  CHECK_EQ(nr_http_feed(p, head, sizeof head - 1, on_event, &s), 0);
  char line[2000];
  memset(line, '0', sizeof line);    /* a chunk-size line that never ends */
  int rc = 0;
  for (int i = 0; i < 10 && rc == 0; i++)
    rc = nr_http_feed(p, line, sizeof line, on_event, &s);
  CHECK_EQ(rc, 400);
}

/* ---- the client's streamed responses (http_client.c with stream) ---- */

#include "codec/http_client.h"


static int on_reply(void *arg, nr_http_reply_t *r) {
  seen_t *s = arg;
  if (!r->piece) {
    size_t n = strlen(s->heads);
    snprintf(s->heads + n, sizeof s->heads - n, "%d %s;", r->status,
             r->streaming ? "streaming" : "whole");
    return 0;
  }
  got_piece(s, r->body, r->body_len, r->last, r->trailers, r->ntrailers);
  return 0;
}

static const char replies[] =
    "HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nhello"
    "HTTP/1.1 204 No Content\r\n\r\n"
    "HTTP/1.1 201 Created\r\nTransfer-Encoding: chunked\r\n\r\n"
    "3\r\nabc\r\n4;x=y\r\ndefg\r\n0\r\nX-Sum: 9\r\n\r\n"
    "HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n"
    "HTTP/1.0 200 OK\r\n\r\nto the close";

TEST(client_streams_response_bodies_whatever_the_splits) {
  size_t n = sizeof replies - 1;
  for (size_t k = 1; k <= n; k++) {
    seen_t s = {0};
    nr_http_client_parser_t p;
    nr_http_client_parser_init(&p, 8192, 1 << 20, 64);
    p.stream = true;
    for (int i = 0; i < 5; i++)
      CHECK_EQ(nr_http_client_expect(&p, 0), 0);
    for (size_t at = 0; at < n; at += k)
      CHECK_EQ(nr_http_client_feed(&p, replies + at, n - at < k ? n - at : k,
                                   on_reply, &s), 0);
    CHECK_EQ(nr_http_client_end(&p, on_reply, &s), 0);
    CHECK_STR(s.heads, "200 streaming;204 whole;201 streaming;200 whole;"
                       "200 streaming;");
    CHECK_EQ(s.body_len, 24);
    CHECK(memcmp(s.body, "helloabcdefgto the close", 24) == 0);
    CHECK_EQ(s.lasts, 3);
    CHECK_STR(s.trailers, "X-Sum=9;");
    nr_http_client_parser_free(&p);
  }
}

TEST(client_streamed_body_cut_short_or_too_long_fails) {
  seen_t s = {0};
  nr_http_client_parser_t p;
  nr_http_client_parser_init(&p, 8192, 10, 64);
  p.stream = true;
  CHECK_EQ(nr_http_client_expect(&p, 0), 0);
  static const char cut[] = "HTTP/1.1 200 OK\r\nContent-Length: 9\r\n\r\nabc";
  CHECK_EQ(nr_http_client_feed(&p, cut, sizeof cut - 1, on_reply, &s), 0);
  CHECK_EQ(nr_http_client_end(&p, on_reply, &s), NR_HTTPC_TRUNCATED);
  CHECK_EQ(s.lasts, 0);
  nr_http_client_parser_free(&p);
  seen_t t = {0};
  nr_http_client_parser_init(&p, 8192, 10, 64);
  p.stream = true;
  CHECK_EQ(nr_http_client_expect(&p, 0), 0);
  static const char big[] = "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
                            "6\r\nabcdef\r\n6\r\nghijkl\r\n";
  CHECK_EQ(nr_http_client_feed(&p, big, sizeof big - 1, on_reply, &t),
           NR_HTTPC_TOO_LARGE);
  nr_http_client_parser_free(&p);
  seen_t u = {0};
  nr_http_client_parser_init(&p, 8192, 10, 64);
  p.stream = true;
  CHECK_EQ(nr_http_client_expect(&p, 0), 0);
  static const char closed[] = "HTTP/1.1 200 OK\r\nConnection: close\r\n\r\n0123456789X";
  CHECK_EQ(nr_http_client_feed(&p, closed, sizeof closed - 1, on_reply, &u),
           NR_HTTPC_TOO_LARGE);
  nr_http_client_parser_free(&p);
}
