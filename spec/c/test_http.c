/*
 * test_http.c -- the HTTP/1.1 request parser (runtime/codec/http_parse.c) over a
 * corpus of real and malformed requests (spec/fixtures/http/NAME.http,
 * each with the expected parse in NAME.out), fed whole, split at every byte
 * boundary, and one byte at a time: every way of splitting must parse the
 * same. NR_HTTP_WRITE_EXPECTED=1 writes missing .out files (review them!).
 */
#include <dirent.h>
#include <stdarg.h>

#include "codec/http.h"
#include "codec/http_parse.h"
#include "test.h"

#define MAX_HEADER 8192
#define MAX_BODY (1 << 20)

typedef struct dump_s {
  char *p;
  size_t len, cap;
  int requests, continues;
  int stop_after;            /* stop the parser after this many requests */
} dump_t;

static void put(dump_t *d, const char *s, size_t n) {
  if (d->len + n + 1 > d->cap) {
    d->cap = (d->len + n + 1) * 2;
    d->p = realloc(d->p, d->cap);
    CHECK(d->p != NULL);
  }
  memcpy(d->p + d->len, s, n);
  d->len += n;
  d->p[d->len] = '\0';
}

static void putf(dump_t *d, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
static void putf(dump_t *d, const char *fmt, ...) {
  char b[256];
  va_list ap;
  va_start(ap, fmt);
  int n = vsnprintf(b, sizeof b, fmt, ap);
  va_end(ap);
  put(d, b, (size_t)n < sizeof b ? (size_t)n : sizeof b - 1);
}

/* Printable form: control bytes escaped, so .out files stay text. */
static void put_esc(dump_t *d, const char *s, size_t n) {
  for (size_t i = 0; i < n; i++) {
    unsigned char c = (unsigned char)s[i];
    if (c < 0x20 || c >= 0x7f || c == '\\')
      putf(d, "\\x%02x", c);
    else
      put(d, (const char *)&c, 1);
  }
}

static int on_request(void *arg, int ev, nr_http_request_t *r) {
  dump_t *d = arg;
  if (ev == NR_HTTP_EV_CONTINUE) {
    d->continues++;          /* depends on the split: not in the dump */
    return 0;
  }
  CHECK_EQ(r->type, NR_MSG_HTTP_REQUEST);
  CHECK(r->body != NULL);
  put(d, "REQ ", 4);
  put_esc(d, r->method, r->method_len);
  put(d, " ", 1);
  put_esc(d, r->path, r->path_len);
  if (r->query) {
    put(d, " ?", 2);
    put_esc(d, r->query, r->query_len);
  }
  putf(d, " HTTP/1.%d keep_alive=%d chunked=%d head=%d expect=%d\n",
       r->minor, r->keep_alive, r->chunked, r->head, r->expect_continue);
  /* the target as it came, when the path is not its first part */
  bool same = r->target_len == r->path_len + (r->query ? r->query_len + 1 : 0) &&
              memcmp(r->target, r->path, r->path_len) == 0;
  if (!same) {
    put(d, "  target [", 10);
    put_esc(d, r->target, r->target_len);
    put(d, "]\n", 2);
  }
  for (size_t i = 0; i < r->nheaders; i++) {
    put(d, "  ", 2);
    put_esc(d, r->headers[i].name, r->headers[i].name_len);
    put(d, ": [", 3);
    put_esc(d, r->headers[i].value, r->headers[i].value_len);
    put(d, "]\n", 2);
  }
  CHECK(r->trailers == r->headers + r->nheaders);
  for (size_t i = 0; i < r->ntrailers; i++) {
    put(d, "  trailer ", 10);
    put_esc(d, r->trailers[i].name, r->trailers[i].name_len);
    put(d, ": [", 3);
    put_esc(d, r->trailers[i].value, r->trailers[i].value_len);
    put(d, "]\n", 2);
  }
  putf(d, "  body %zu [", r->body_len);
  put_esc(d, r->body, r->body_len);
  put(d, "]\n", 2);
  return ++d->requests == d->stop_after;
}

/* Feed data in pieces of at most `step` bytes after a first piece of
 * `first` bytes, at most max_headers fields per request; returns the dump
 * (caller frees). */
static char *run_max(const char *data, size_t n, size_t first, size_t step,
                     size_t max_body, size_t max_headers) {
  nr_http_parser_t p;
  nr_http_parser_init(&p, MAX_HEADER, max_body, max_headers);
  dump_t d = {0};
  put(&d, "", 0);
  size_t off = 0;
  int rc = 0;
  while (off < n && rc == 0) {
    size_t k = off == 0 ? first : step;
    if (k > n - off)
      k = n - off;
    rc = nr_http_feed(&p, data + off, k, on_request, &d);
    off += k;
  }
  if (rc > 1)
    putf(&d, "ERROR %d\n", rc);
  else if (nr_buf_len(&p.in) > 0)
    putf(&d, "INCOMPLETE %zu\n", nr_buf_len(&p.in));
  nr_http_parser_free(&p);
  return d.p;
}

static char *run(const char *data, size_t n, size_t first, size_t step,
                 size_t max_body) {
  return run_max(data, n, first, step, max_body, NR_HTTP_DEFAULT_MAX_HEADERS);
}

static char *slurp(const char *path, size_t *n) {
  FILE *f = fopen(path, "rb");
  if (f == NULL)
    return NULL;
  fseek(f, 0, SEEK_END);
  long len = ftell(f);
  fseek(f, 0, SEEK_SET);
  char *b = malloc((size_t)len + 1);
  CHECK(b != NULL);
  CHECK_EQ(fread(b, 1, (size_t)len, f), len);
  b[len] = '\0';
  fclose(f);
  *n = (size_t)len;
  return b;
}

static const char *fixture_dir(void) {
  static char dir[1024];
  const char *src = __FILE__;                 /* .../spec/c/test_http.c */
  const char *cut = strstr(src, "spec/c/test_http.c");
  CHECK(cut != NULL);
  snprintf(dir, sizeof dir, "%.*sspec/fixtures/http", (int)(cut - src), src);
  return dir;
}

TEST_T(corpus_every_split, 120) {
  const char *dir = fixture_dir();
  DIR *dp = opendir(dir);
  CHECK(dp != NULL);
  struct dirent *e;
  int files = 0;
  while ((e = readdir(dp)) != NULL) {
    size_t nl = strlen(e->d_name);
    if (nl < 6 || strcmp(e->d_name + nl - 5, ".http") != 0)
      continue;
    char path[2048], out[2048];
    snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
    snprintf(out, sizeof out, "%s/%.*s.out", dir, (int)(nl - 5), e->d_name);
    size_t n, en;
    char *data = slurp(path, &n);
    CHECK(data != NULL);
    char *whole = run(data, n, n, n, MAX_BODY);
    char *expected = slurp(out, &en);
    if (expected == NULL && getenv("NR_HTTP_WRITE_EXPECTED")) {
      FILE *f = fopen(out, "wb");
      CHECK(f != NULL);
      fputs(whole, f);
      fclose(f);
      expected = strdup(whole);
    }
    if (expected == NULL)
      FAIL("%s: no expected output %s", e->d_name, out);
    if (strcmp(whole, expected) != 0)
      FAIL("%s parsed whole:\n%s\nexpected:\n%s", e->d_name, whole, expected);
    for (size_t k = 1; k < n; k++) {
      char *split = run(data, n, k, n, MAX_BODY);
      if (strcmp(split, expected) != 0)
        FAIL("%s split at %zu:\n%s\nexpected:\n%s", e->d_name, k, split,
             expected);
      free(split);
    }
    char *bytes = run(data, n, 1, 1, MAX_BODY);
    if (strcmp(bytes, expected) != 0)
      FAIL("%s fed byte by byte:\n%s\nexpected:\n%s", e->d_name, bytes,
           expected);
    free(bytes);
    free(whole);
    free(expected);
    free(data);
    files++;
  }
  closedir(dp);
  CHECK_GE(files, 30);
}

TEST(chunked_body_over_limit_is_413) {
  static const char req[] = "POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n"
                            "\r\n6\r\nabcdef\r\n6\r\nghijkl\r\n0\r\n\r\n";
  char *d = run(req, sizeof req - 1, sizeof req - 1, 1, 10);
  CHECK_STR(d, "ERROR 413\n");
  free(d);
  d = run(req, sizeof req - 1, sizeof req - 1, 1, 12);
  CHECK(strstr(d, "body 12 [abcdefghijkl]") != NULL);
  free(d);
}

TEST(continue_only_while_the_body_is_missing) {
  static const char head[] = "PUT /x HTTP/1.1\r\nHost: x\r\nExpect: 100-continue\r\n"
                             "Content-Length: 3\r\n\r\n";
  nr_http_parser_t p;
  nr_http_parser_init(&p, MAX_HEADER, MAX_BODY, NR_HTTP_DEFAULT_MAX_HEADERS);
  dump_t d = {0};
  CHECK_EQ(nr_http_feed(&p, head, sizeof head - 1, on_request, &d), 0);
  CHECK_EQ(d.continues, 1);
  CHECK_EQ(nr_http_feed(&p, "a", 1, on_request, &d), 0);
  CHECK_EQ(d.continues, 1);          /* once per request */
  CHECK_EQ(nr_http_feed(&p, "bc", 2, on_request, &d), 0);
  CHECK_EQ(d.requests, 1);
  /* the same request arriving whole needs no 100 Continue */
  char whole[256];
  int n = snprintf(whole, sizeof whole, "%sabc", head);
  CHECK_EQ(nr_http_feed(&p, whole, (size_t)n, on_request, &d), 0);
  CHECK_EQ(d.continues, 1);
  CHECK_EQ(d.requests, 2);
  nr_http_parser_free(&p);
  free(d.p);
}

TEST(idle_parser_holds_no_memory) {
  static const char req[] = "GET / HTTP/1.1\r\nHost: x\r\n\r\n";
  nr_http_parser_t p;
  nr_http_parser_init(&p, MAX_HEADER, MAX_BODY, NR_HTTP_DEFAULT_MAX_HEADERS);
  dump_t d = {0};
  CHECK_EQ(nr_http_feed(&p, req, 10, on_request, &d), 0);
  CHECK(p.in.data != NULL);          /* a split request is cumulated */
  CHECK_EQ(nr_http_feed(&p, req + 10, sizeof req - 11, on_request, &d), 0);
  CHECK_EQ(d.requests, 1);
  CHECK(p.in.data == NULL);          /* and released once it is complete */
  CHECK(p.body.data == NULL);
  /* what a connection keeps between requests is small: the request and its
   * header array are rebuilt on the stack from the bytes at each read */
  CHECK_LE(sizeof p, 160);
  nr_http_parser_free(&p);
  free(d.p);
}

TEST(a_body_of_known_length_is_cumulated_once_at_its_size) {
  /* 1 MiB announced, sent in 1000-byte reads: with the body reserved
   * (nr__http_reserve_body, what the server codec does once it admits the
   * body) the cumulation is the request's size, never grown again */
  static const char head[] = "POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 1048576\r\n\r\n";
  nr_http_parser_t p;
  nr_http_parser_init(&p, MAX_HEADER, 2 << 20, NR_HTTP_DEFAULT_MAX_HEADERS);
  dump_t d = {0};
  char chunk[1000];
  memset(chunk, 'b', sizeof chunk);
  CHECK_EQ(nr_http_feed(&p, head, sizeof head - 1, on_request, &d), 0);
  CHECK_EQ(nr_http_feed(&p, chunk, sizeof chunk, on_request, &d), 0);
  CHECK_EQ(nr__http_reserve_body(&p), 0);
  size_t whole = sizeof head - 1 + (1 << 20);
  CHECK_EQ(p.in.cap, whole);
  const char *data = p.in.data;
  size_t sent = sizeof chunk;
  while (sent < (1 << 20)) {
    size_t k = (1 << 20) - sent < sizeof chunk ? (1 << 20) - sent : sizeof chunk;
    CHECK_EQ(nr_http_feed(&p, chunk, k, on_request, &d), 0);
    sent += k;
    if (sent < (1 << 20))
      CHECK(p.in.data == data && p.in.cap == whole);   /* no realloc */
  }
  CHECK_EQ(d.requests, 1);
  CHECK(p.in.data == NULL);
  CHECK_EQ(nr__http_body_bound(&p), 0);
  nr_http_parser_free(&p);
  free(d.p);
}

TEST(callback_stops_the_parser) {
  static const char req[] = "GET /1 HTTP/1.1\r\nHost: x\r\n\r\n"
                            "GET /2 HTTP/1.1\r\nHost: x\r\n\r\n";
  nr_http_parser_t p;
  nr_http_parser_init(&p, MAX_HEADER, MAX_BODY, NR_HTTP_DEFAULT_MAX_HEADERS);
  dump_t d = {.stop_after = 1};
  CHECK_EQ(nr_http_feed(&p, req, sizeof req - 1, on_request, &d), 1);
  CHECK_EQ(d.requests, 1);
  CHECK_EQ(nr_http_feed(&p, req, sizeof req - 1, on_request, &d), 1);
  CHECK_EQ(d.requests, 1);           /* a stopped parser takes nothing */
  CHECK(p.in.data == NULL);
  nr_http_parser_free(&p);
  free(d.p);
}

TEST(garbage_is_rejected_without_waiting_for_more) {
  nr_http_parser_t p;
  nr_http_parser_init(&p, MAX_HEADER, MAX_BODY, NR_HTTP_DEFAULT_MAX_HEADERS);
  dump_t d = {0};
  CHECK_EQ(nr_http_feed(&p, "HELLO\r\n", 7, on_request, &d), 400);
  nr_http_parser_free(&p);
  free(d.p);
}

TEST(reason_and_date) {
  CHECK_STR(nr_http_reason(200), "OK");
  CHECK_STR(nr_http_reason(431), "Request Header Fields Too Large");
  CHECK_STR(nr_http_reason(799), "Unknown");
  const char *date = nr_http_date();
  CHECK_EQ(strlen(date), 29);
  CHECK(strcmp(date + 25, " GMT") == 0);
}

/* ---- conformance: what differential testing against llhttp and nginx
 * found, one request per rule ---- */

/* The dump of req (a C string) fed whole, which must be what every split
 * and a byte-by-byte feed give too; caller frees. */
static char *run_all_splits(const char *req, size_t max_headers) {
  size_t n = strlen(req);
  char *whole = run_max(req, n, n, n, MAX_BODY, max_headers);
  for (size_t k = 1; k < n; k++) {
    char *split = run_max(req, n, k, n, MAX_BODY, max_headers);
    if (strcmp(split, whole) != 0)
      FAIL("split at %zu:\n%s\nwhole:\n%s", k, split, whole);
    free(split);
  }
  char *bytes = run_max(req, n, 1, 1, MAX_BODY, max_headers);
  CHECK_STR(bytes, whole);
  free(bytes);
  return whole;
}

static void expect_error(const char *req, int status) {
  char *d = run_all_splits(req, NR_HTTP_DEFAULT_MAX_HEADERS);
  char want[32];
  snprintf(want, sizeof want, "ERROR %d\n", status);
  if (strcmp(d, want) != 0)
    FAIL("request:\n%s\nparsed as:\n%s\nexpected: %s", req, d, want);
  free(d);
}

#define CHUNKED_HEAD "POST /up HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: chunked\r\n\r\n"

TEST(trailers_are_kept_apart_from_the_headers) {
  char *d = run_all_splits(CHUNKED_HEAD "3\r\nabc\r\n0\r\nX-Sum: 1\r\n"
                           "x-late: yes\r\n\r\n", NR_HTTP_DEFAULT_MAX_HEADERS);
  CHECK_STR(d, "REQ POST /up HTTP/1.1 keep_alive=1 chunked=1 head=0 expect=0\n"
               "  Host: [h]\n  Transfer-Encoding: [chunked]\n"
               "  trailer X-Sum: [1]\n  trailer x-late: [yes]\n"
               "  body 3 [abc]\n");
  free(d);
}

TEST(trailers_that_frame_route_or_authorise_are_refused) {
  static const char *const names[] = {
      "Host: evil", "Content-Length: 0", "Transfer-Encoding: chunked",
      "HOST: evil", "Trailer: X", "Connection: close", "Authorization: x",
      "Cookie: a=1", "Expect: 100-continue"};
  for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
    char req[256];
    snprintf(req, sizeof req, CHUNKED_HEAD "1\r\na\r\n0\r\n%s\r\n\r\n",
             names[i]);
    expect_error(req, 400);
  }
}

TEST(a_trailer_line_starting_with_a_bare_cr_is_refused) {
  expect_error(CHUNKED_HEAD "1\r\na\r\n0\r\n\rX-A: 1\r\n\r\n", 400);
  expect_error(CHUNKED_HEAD "1\r\na\r\n0\r\n\r\r\n\r\n", 400);
}

TEST(http11_needs_exactly_one_valid_host) {
  expect_error("GET / HTTP/1.1\r\n\r\n", 400);
  expect_error("GET / HTTP/1.1\r\nHost: a\r\nHost: a\r\n\r\n", 400);
  expect_error("GET / HTTP/1.0\r\nHost: a\r\nhost: b\r\n\r\n", 400);
  static const char *const bad[] = {"a b", "a/b", "a@b", "[::1", "[]",
                                    "a:80x", "a:b:c", "a?", "[::1]x"};
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    char req[128];
    snprintf(req, sizeof req, "GET / HTTP/1.1\r\nHost: %s\r\n\r\n", bad[i]);
    expect_error(req, 400);
  }
  static const char *const good[] = {"", "a", "example.com:8080", "127.0.0.1",
                                     "[::1]:80", "[v1.x]", "a-b_c~d%41", "a:"};
  for (size_t i = 0; i < sizeof good / sizeof good[0]; i++) {
    char req[128];
    snprintf(req, sizeof req, "GET / HTTP/1.1\r\nHost: %s\r\n\r\n", good[i]);
    char *d = run_all_splits(req, NR_HTTP_DEFAULT_MAX_HEADERS);
    if (strncmp(d, "REQ GET / HTTP/1.1", 18) != 0)
      FAIL("Host: %s parsed as:\n%s", good[i], d);
    free(d);
  }
  /* HTTP/1.0 may leave it out */
  char *d = run_all_splits("GET / HTTP/1.0\r\n\r\n", NR_HTTP_DEFAULT_MAX_HEADERS);
  CHECK(strncmp(d, "REQ GET / HTTP/1.0", 18) == 0);
  free(d);
}

TEST(transfer_encoding_in_http10_or_twice_is_refused) {
  expect_error("POST / HTTP/1.0\r\nTransfer-Encoding: chunked\r\n\r\n"
               "1\r\na\r\n0\r\n\r\n", 400);
  expect_error("POST / HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: chunked\r\n"
               "Transfer-Encoding: chunked\r\n\r\n0\r\n\r\n", 400);
  expect_error("POST / HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: chunked, "
               "chunked\r\n\r\n0\r\n\r\n", 400);
  expect_error("POST / HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: chunked\r\n"
               " chunked\r\n\r\n0\r\n\r\n", 400);        /* folded */
  expect_error("POST / HTTP/1.1\r\nHost: h\r\nTransfer-Encoding:\r\n"
               " chunked\r\n\r\n0\r\n\r\n", 400);
  expect_error("POST / HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: chunked, "
               "gzip\r\n\r\n0\r\n\r\n", 400);            /* not last */
  expect_error("POST / HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: gzip, "
               "chunked\r\n\r\n0\r\n\r\n", 501);         /* unknown */
}

TEST(lengths_past_int64_are_malformed_not_too_large) {
  expect_error("POST / HTTP/1.1\r\nHost: h\r\nContent-Length: "
               "9223372036854775808\r\n\r\n", 400);
  expect_error("POST / HTTP/1.1\r\nHost: h\r\nContent-Length: "
               "99999999999999999999999\r\n\r\n", 400);
  expect_error("POST / HTTP/1.1\r\nHost: h\r\nContent-Length: "
               "9223372036854775807\r\n\r\n", 413);
  expect_error(CHUNKED_HEAD "8000000000000000\r\n", 400);
  expect_error(CHUNKED_HEAD "fffffffffffffffffffff\r\n", 400);
  expect_error(CHUNKED_HEAD "7fffffffffffffff\r\n", 413);
}

TEST(chunk_sizes_are_judged_by_value_not_digits) {
  char *d = run_all_splits(CHUNKED_HEAD "000000000000000A\r\n0123456789\r\n"
                           "00000000000000000000000000000003\r\nabc\r\n"
                           "0000000000000000000\r\n\r\n",
                           NR_HTTP_DEFAULT_MAX_HEADERS);
  CHECK_CONTAINS(d, "body 13 [0123456789abc]");
  free(d);
}

TEST(max_headers_is_configurable) {
  static const char four[] = "GET / HTTP/1.1\r\nHost: h\r\nA: 1\r\nB: 2\r\n"
                             "C: 3\r\n\r\n";
  char *d = run_all_splits(four, 4);
  CHECK_CONTAINS(d, "C: [3]");
  free(d);
  d = run_all_splits(four, 3);
  CHECK_STR(d, "ERROR 431\n");
  free(d);
  /* trailers count with the headers */
  static const char trailed[] = CHUNKED_HEAD "0\r\nX-A: 1\r\nX-B: 2\r\n\r\n";
  d = run_all_splits(trailed, 4);
  CHECK_CONTAINS(d, "trailer X-B: [2]");
  free(d);
  d = run_all_splits(trailed, 3);
  CHECK_STR(d, "ERROR 431\n");
  free(d);
  /* the default, and the ceiling */
  char big[8192];
  size_t n = (size_t)snprintf(big, sizeof big, "GET / HTTP/1.1\r\nHost: h\r\n");
  for (int i = 1; i < NR_HTTP_DEFAULT_MAX_HEADERS; i++)
    n += (size_t)snprintf(big + n, sizeof big - n, "X%d: v\r\n", i);
  snprintf(big + n, sizeof big - n, "\r\n");
  d = run(big, strlen(big), strlen(big), 1, MAX_BODY);
  CHECK(strncmp(d, "REQ GET", 7) == 0);
  free(d);
  snprintf(big + n, sizeof big - n, "X: one too many\r\n\r\n");
  d = run(big, strlen(big), strlen(big), 1, MAX_BODY);
  CHECK_STR(d, "ERROR 431\n");
  free(d);
  nr_http_parser_t p;
  nr_http_parser_init(&p, MAX_HEADER, MAX_BODY, 100000);
  CHECK_EQ(p.max_headers, NR_HTTP_MAX_HEADERS);
  nr_http_parser_free(&p);
}

/* Feed bytes that end with no line end: the status they get at once. */
static int feed_once(const char *s, size_t n) {
  nr_http_parser_t p;
  nr_http_parser_init(&p, MAX_HEADER, MAX_BODY, NR_HTTP_DEFAULT_MAX_HEADERS);
  dump_t d = {0};
  int rc = nr_http_feed(&p, s, n, on_request, &d);
  nr_http_parser_free(&p);
  free(d.p);
  return rc;
}
#define FEED_ONCE(lit) feed_once(lit, sizeof lit - 1)

TEST(a_bad_request_line_is_refused_at_its_first_bad_byte) {
  CHECK_EQ(FEED_ONCE("\x16\x03\x01\x02\x00"), 400);   /* a TLS hello */
  CHECK_EQ(FEED_ONCE("G@T"), 400);
  CHECK_EQ(FEED_ONCE("GET /a\x01"), 400);
  CHECK_EQ(FEED_ONCE("GET  /"), 400);
  CHECK_EQ(FEED_ONCE("GET /a?b\x7f"), 400);
  CHECK_EQ(FEED_ONCE("GET / X"), 400);
  CHECK_EQ(FEED_ONCE("GET / HTTP/x"), 400);
  CHECK_EQ(FEED_ONCE("GET / HTTP/1.1 "), 400);
  CHECK_EQ(FEED_ONCE("GET / HTTP/1.1\rX"), 400);
  /* while every byte may still begin a good line, it waits */
  CHECK_EQ(FEED_ONCE("GE"), 0);
  CHECK_EQ(FEED_ONCE("GET /a?b=c"), 0);
  CHECK_EQ(FEED_ONCE("GET / HTTP/1."), 0);
  CHECK_EQ(FEED_ONCE("GET / HTTP/1.1\r"), 0);
  CHECK_EQ(FEED_ONCE("\r"), 0);
}

/* ---- the parser's scans, byte by byte: every byte value at positions
 * around the 16-byte blocks the SSE2 code judges (and the 8-byte words of
 * the portable code: test_http_portable runs these too), near the end of
 * the bytes fed or not, must get the verdict of the plain rules below ---- */

typedef struct seen_s {
  int requests;
  char path[64], query[64], value[64];
  int has_query;
} seen_t;

static void copy_field(char *dst, const char *s, size_t n) {
  CHECK_LT(n, 64);
  memcpy(dst, s, n);
  dst[n] = '\0';
}

static int on_seen(void *arg, int ev, nr_http_request_t *r) {
  seen_t *z = arg;
  CHECK_EQ(ev, NR_HTTP_EV_REQUEST);
  z->requests++;
  copy_field(z->path, r->path, r->path_len);
  z->has_query = r->query != NULL;
  copy_field(z->query, r->query ? r->query : "", r->query_len);
  CHECK_GE(r->nheaders, 1);
  const nr_http_header_t *h = &r->headers[r->nheaders - 1];
  copy_field(z->value, h->value, h->value_len);
  return 0;
}

/* Feed n bytes from a buffer of exactly n bytes (ASan sees any read past
 * it): whole, or `tail` bytes held back for a second feed. */
static int feed_exact(const char *req, size_t n, size_t tail, seen_t *z) {
  nr_http_parser_t p;
  nr_http_parser_init(&p, MAX_HEADER, MAX_BODY, NR_HTTP_DEFAULT_MAX_HEADERS);
  char *b = malloc(n);
  CHECK(b != NULL);
  memcpy(b, req, n);
  memset(z, 0, sizeof *z);
  int rc = nr_http_feed(&p, b, n - tail, on_seen, z);
  if (rc == 0 && tail > 0)
    rc = nr_http_feed(&p, b + n - tail, tail, on_seen, z);
  if (rc == 0 && z->requests == 0)
    rc = -1;                 /* incomplete */
  free(b);
  nr_http_parser_free(&p);
  return rc;
}

enum { IN_PATH, IN_QUERY, IN_VALUE, IN_HOST };

/* Lengths around the block and word sizes, and positions within them. */
static const size_t lens[] = {1, 2, 3, 7, 8, 9, 14, 15, 16, 17, 18, 24,
                              30, 31, 32, 33, 34, 40};

static void one_byte_case(int where, size_t len, size_t k, int b,
                          size_t tail) {
  char text[64], req[256];
  memset(text, where == IN_HOST ? '1' : 'a', len);   /* the bytes around */
  text[len] = '\0';
  size_t n;
  if (where == IN_PATH || where == IN_QUERY)
    n = (size_t)snprintf(req, sizeof req,
                         "GET /%s%.*s HTTP/1.1\r\nHost: h\r\n\r\n",
                         where == IN_QUERY ? "p?" : "", (int)len, text);
  else
    n = (size_t)snprintf(req, sizeof req, "GET / HTTP/1.1\r\n%s%.*s\r\n\r\n",
                         where == IN_HOST ? "Host: " : "Host: h\r\nX-V: ",
                         (int)len, text);
  /* then the byte (snprintf would stop at a NUL) */
  text[k] = (char)b;
  char *at = strstr(req, where == IN_HOST ? "Host: " : where == IN_VALUE
                    ? "X-V: " : "GET /");
  at += where == IN_QUERY ? 7 : where == IN_PATH ? 5 : where == IN_HOST ? 6 : 5;
  at[k] = (char)b;
  seen_t z;
  int rc = feed_exact(req, n, tail, &z);
  /* the rules, plainly */
  bool vchar = b > 0x20 && b != 0x7f;      /* and obs-text */
  bool ok;
  const char *got;
  size_t want_len = len;
  size_t want_off = 0;
  if (where == IN_PATH) {
    /* normalized: '#' and a '%' without two hex digits refused, "%aa"
     * in upper case, "//" merged, "/." the root */
    ok = vchar && b != '#' && (b != '%' || k + 2 < len);
    if (b == '?')
      want_len = k;          /* the path ends at '?' */
    if (b == '%') {
      text[k + 1] = text[k + 2] = 'A';
    } else if (k == 0 && (b == '/' || (b == '.' && len == 1))) {
      want_off = 1;          /* the byte goes: "//a" is "/a", "/." "/" */
      want_len = len - 1;
    }
    got = z.path + 1;        /* after the '/' */
  } else if (where == IN_QUERY) {
    ok = vchar;
    got = z.query;
  } else {
    bool value = (b >= 0x20 && b != 0x7f) || b == '\t';
    bool space = b == ' ' || b == '\t';
    bool lf_end = b == '\n' && k == len - 1;   /* a bare LF ends the line */
    if ((space && (k == 0 || k == len - 1)) || lf_end) {
      want_len = len - 1;    /* leading or trailing whitespace: trimmed */
      want_off = k == 0 && !lf_end;
    }
    if (where == IN_VALUE) {
      ok = value || lf_end;
    } else {                 /* digits and the byte: a host, or host:port */
      bool hostc = (b >= 'a' && b <= 'z') || (b >= 'A' && b <= 'Z') ||
                   (b >= '0' && b <= '9') || strchr("-._~!$&'()*+,;=%", b);
      ok = b != 0 && (hostc || b == ':' || lf_end ||
                      (space && (k == 0 || k == len - 1)));
    }
    got = z.value;
  }
  if (!ok) {
    if (rc != 400)
      FAIL("where %d len %zu pos %zu byte 0x%02x tail %zu: %d, not 400", where,
           len, k, b, tail, rc);
    return;
  }
  if (rc != 0)
    FAIL("where %d len %zu pos %zu byte 0x%02x tail %zu: refused with %d",
         where, len, k, b, tail, rc);
  CHECK_EQ(z.requests, 1);
  if (strlen(got) != want_len || memcmp(got, text + want_off, want_len) != 0)
    FAIL("where %d len %zu pos %zu byte 0x%02x: parsed [%s]", where, len, k,
         b, got);
}

TEST_T(every_byte_at_every_block_position, 120) {
  for (int where = IN_PATH; where <= IN_HOST; where++)
    for (size_t li = 0; li < sizeof lens / sizeof lens[0]; li++) {
      size_t len = lens[li];
      size_t pos[] = {0, 1, len / 2, len > 2 ? len - 2 : 0, len - 1};
      for (size_t pi = 0; pi < sizeof pos / sizeof pos[0]; pi++)
        for (int b = 0; b < 256 && pos[pi] < len; b++) {
          one_byte_case(where, len, pos[pi], b, 0);
          one_byte_case(where, len, pos[pi], b, 7);   /* the rest later:
                                                         parsed from `in` */
        }
    }
}

/* What a handler matches on (nginx's normalized $uri, less the decoding
 * that would change a path's meaning), and what is refused with 400. */
TEST(paths_are_normalized_before_handlers_match_them) {
  static const struct { const char *target, *path; } cases[] = {
      {"/", "/"}, {"/a/b", "/a/b"}, {"/a/b/", "/a/b/"}, {"/.well-known/x", "/.well-known/x"},
      {"/a/./b", "/a/b"}, {"/a/b/..", "/a/"}, {"/a/b/../../c", "/c"}, {"/a/.", "/a/"},
      {"/./", "/"}, {"//", "/"}, {"//a//b//", "/a/b/"}, {"/a/..//b", "/b"},
      {"/a//../b", "/b"}, {"/%2e%2E/x", NULL}, {"/a/%2e%2e/b", "/b"},
      {"/%7euser/%41%62c", "/~user/Abc"}, {"/a%2fb", "/a%2Fb"}, {"/a%3a%3A", "/a%3A%3A"},
      {"/%e2%82%ac", "/%E2%82%AC"}, {"/..", NULL}, {"/../", NULL}, {"/a/../..", NULL},
      {"/a/..%2Fb", NULL}, {"/a/b%2F..%2Fc", NULL}, {"/a%5C..%5Cb", NULL}, {"/a%2F", "/a%2F"},
      {"/a%2F.b", "/a%2F.b"}, {"/a%00", NULL}, {"/a%0", NULL}, {"/a%g0", NULL},
      {"/a#b", NULL}, {"a/b", NULL}, {"*", NULL}, {"http://h/a/../b", "/b"},
      {"http://h", "/"}, {"HTTP://h:80/x?", "/x"}, {"http://u@h/", NULL}, {"http:///x", NULL},
      {"http://h:x/", NULL}, {"ftp:/h/x", NULL}, {"1http://h/", NULL}};
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    char req[256];
    int n = snprintf(req, sizeof req, "GET %s HTTP/1.1\r\nHost: x\r\n\r\n",
                     cases[i].target);
    seen_t z;
    int rc = feed_exact(req, (size_t)n, 0, &z);
    if (cases[i].path == NULL) {
      if (rc != 400)
        FAIL("%s: %d (path %s), not 400", cases[i].target, rc, z.path);
    } else if (rc != 0 || strcmp(z.path, cases[i].path) != 0) {
      FAIL("%s: %d, path %s, not %s", cases[i].target, rc, z.path, cases[i].path);
    }
  }
}

/* The Host rules where the usual Host line is judged at a glance: a Host
 * line with more header lines after it, of every length about the 16- and
 * 32-byte blocks. */
TEST(host_rules_hold_on_the_usual_host_line) {
  static const char *const bad[] = {"a:80x", "a:b:c", "a:8:0", "a:80a",
                                    "x:80 x", "a b", "a/b", "a@b", "a?",
                                    "[::1", "[]", "[::1]x", "\x80", "a\x7f"};
  static const char *const good[] = {"", "a", ":80", "a:", "127.0.0.1:8080",
                                     "A-Z.example.COM:65535", "[::1]:80",
                                     "a-b_c~d%41", "0123456789abcde",
                                     "0123456789abcdef", "0123456789abcdefg",
                                     "0123456789abcdef0123456789abcde",
                                     "0123456789abcdef0123456789abcdef",
                                     "0123456789abcdef0123456789abcdefg",
                                     "0123456789abcdef0123456789a:12345",
                                     "0123456789abcdef:12345678901234"};
  for (int good_ones = 0; good_ones < 2; good_ones++) {
    const char *const *list = good_ones ? good : bad;
    size_t count = good_ones ? sizeof good / sizeof good[0]
                             : sizeof bad / sizeof bad[0];
    for (size_t i = 0; i < count; i++) {
      char req[256];
      int n = snprintf(req, sizeof req, "GET / HTTP/1.1\r\nHost: %s\r\n"
                       "User-Agent: long enough for the block\r\n\r\n",
                       list[i]);
      for (size_t tail = 0; tail < 40; tail += 13) {
        seen_t z;
        int rc = feed_exact(req, (size_t)n, tail, &z);
        if (rc != (good_ones ? 0 : 400))
          FAIL("Host: %s (tail %zu): %d", list[i], tail, rc);
      }
    }
  }
  /* a second Host, after one judged at a glance or the long way */
  static const char twice[] = "GET / HTTP/1.1\r\nHost: a\r\nHost: a\r\n"
                              "User-Agent: long enough for the block\r\n\r\n";
  static const char twice_long[] =
      "GET / HTTP/1.1\r\nhost: a\r\nHost: a\r\n"
      "User-Agent: long enough for the block\r\n\r\n";
  seen_t z;
  CHECK_EQ(feed_exact(twice, sizeof twice - 1, 0, &z), 400);
  CHECK_EQ(feed_exact(twice_long, sizeof twice_long - 1, 0, &z), 400);
}
