/*
 * fuzz_http_rules.c -- libFuzzer target for the HTTP/1.1 parser's framing
 * and routing rules (runtime/codec/http_parse.c): what differential testing
 * against llhttp and nginx found, kept as invariants of every request the
 * parser lets through.
 *
 * Config bytes 0..1: max_headers (1..8, so the limit is met often) and the
 * size of the pieces (1..64 bytes); the rest is the request stream, fed
 * once whole and once in those pieces. Invariants:
 *  - both runs deliver the same requests (headers and trailers apart) and
 *    end the same way;
 *  - trailers are never merged into the headers: they lie after the head's
 *    last field in the input, only a chunked request has any, and none
 *    names a field that frames, routes or authorises the message;
 *  - Host: never two; exactly one in HTTP/1.1, and well formed (checked
 *    here by a validator written apart from the parser's);
 *  - framing: a chunked request is HTTP/1.1 with one Transfer-Encoding and
 *    no Content-Length; otherwise a Content-Length, if any, is the body's
 *    length and within int64;
 *  - headers and trailers together are at most max_headers;
 *  - the path a handler matches on is "*" (OPTIONS), a CONNECT's
 *    authority, or a normalized one: it begins with '/', has no '#', no
 *    empty, "." or ".." segment, and a '%' only before two upper-case hex
 *    digits that encode neither NUL nor an unreserved byte (a validator
 *    written apart from the parser's normalize_path); and parsed again it
 *    is the same (normalization is idempotent);
 *  - an absolute-form target's authority is the request's one Host.
 */
#include <stdbool.h>
#include <strings.h>

#include "codec/http.h"
#include "common.h"

#define CHECK FUZZ_ASSERT
#define MAX_HEADER 2048
#define MAX_BODY 4096

typedef struct run_s {
  size_t max_headers, count;
  uint64_t digest;
} run_t;

static void mix(run_t *r, const char *p, size_t n) {
  for (size_t i = 0; i < n; i++)
    r->digest = (r->digest ^ (unsigned char)p[i]) * 1099511628211ull;
  r->digest = (r->digest ^ n) * 1099511628211ull;
}

static bool named(const nr_http_header_t *h, const char *name) {
  return h->name_len == strlen(name) &&
         strncasecmp(h->name, name, h->name_len) == 0;
}

/* uri-host [":" port], from RFC 3986's grammar, without the parser's
 * byte classes. */
static bool host_ok(const char *v, size_t n) {
  static const char reg[] = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"
                            "0123456789-._~!$&'()*+,;=%";
  size_t i = 0;
  if (n > 0 && v[0] == '[') {
    const char *close = memchr(v, ']', n);
    if (close == NULL || close == v + 1)
      return false;
    for (i = 1; v + i < close; i++)
      if (v[i] == '\0' || (strchr(reg, v[i]) == NULL && v[i] != ':'))
        return false;
    i++;
  } else {
    while (i < n && v[i] != '\0' && strchr(reg, v[i]) != NULL)
      i++;
  }
  if (i < n && v[i] == ':')
    while (++i < n && v[i] >= '0' && v[i] <= '9')
      ;
  return i == n;
}

static const char *const forbidden[] = {
    "host", "content-length", "transfer-encoding", "trailer", "connection",
    "upgrade", "te", "expect", "authorization", "proxy-authorization",
    "cookie", "content-type", "content-encoding", "keep-alive"};

static bool upper_hex(char c) {
  return (c >= '0' && c <= '9') || (c >= 'A' && c <= 'F');
}

static int hex_of(char c) { return c <= '9' ? c - '0' : c - 'A' + 10; }

/* A segment of a normal path (its %XX checked by normal_path). */
static bool normal_segment(const char *s, size_t n, bool last) {
  if (n == 0)
    return last;               /* only a trailing '/' leaves one */
  return !(n == 1 && s[0] == '.') && !(n == 2 && s[0] == '.' && s[1] == '.');
}

static bool normal_path(const char *p, size_t n) {
  static const char unreserved[] = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"
                                   "0123456789-._~";
  if (n == 0 || p[0] != '/')
    return false;
  for (size_t i = 0; i < n; i++) {
    if (p[i] == '#')
      return false;
    if (p[i] != '%')
      continue;
    if (n - i < 3 || !upper_hex(p[i + 1]) || !upper_hex(p[i + 2]))
      return false;
    int v = hex_of(p[i + 1]) * 16 + hex_of(p[i + 2]);
    if (v == 0 || memchr(unreserved, v, sizeof unreserved - 1) != NULL)
      return false;
  }
  size_t from = 1;
  for (size_t i = 1; i <= n; i++)
    if (i == n || p[i] == '/') {
      if (!normal_segment(p + from, i - from, i == n))
        return false;
      from = i + 1;
    }
  return true;
}

static int first_path(void *arg, int ev, nr_http_request_t *r) {
  if (ev == NR_HTTP_EV_REQUEST && r->path_len < 1024) {
    memcpy(arg, r->path, r->path_len);
    ((char *)arg)[r->path_len] = '\0';
  }
  return 1;
}

/* The path parsed again, as the target of a request of its own. */
static void check_idempotent(const nr_http_request_t *r) {
  if (r->path_len > 512)
    return;
  char req[600], again[1024] = "";
  int n = snprintf(req, sizeof req, "GET %.*s HTTP/1.1\r\nHost: x\r\n\r\n",
                   (int)r->path_len, r->path);
  nr_http_parser_t p;
  nr_http_parser_init(&p, MAX_HEADER, MAX_BODY, 8);
  nr_http_feed(&p, req, (size_t)n, first_path, again);
  nr_http_parser_free(&p);
  CHECK(strlen(again) == r->path_len && memcmp(again, r->path, r->path_len) == 0);
}

static bool method_is(const nr_http_request_t *r, const char *m) {
  return r->method_len == strlen(m) && memcmp(r->method, m, r->method_len) == 0;
}

static void check_target(const nr_http_request_t *r) {
  if (r->path_len == 1 && r->path[0] == '*') {
    CHECK(method_is(r, "OPTIONS"));
    return;
  }
  if (method_is(r, "CONNECT") && r->target[0] != '/')
    return;                    /* authority-form, as it came */
  CHECK(normal_path(r->path, r->path_len));
  check_idempotent(r);
  if (r->target[0] == '/')
    return;
  /* absolute-form: scheme "://" authority, which is the Host */
  const char *t = r->target, *end = t + r->target_len;
  const char *sep = memchr(t, ':', r->target_len);
  CHECK(sep != NULL && end - sep >= 3 && sep[1] == '/' && sep[2] == '/');
  const char *a = sep + 3, *e = a;
  while (e < end && *e != '/' && *e != '?')
    e++;
  size_t hosts = 0;
  for (size_t i = 0; i < r->nheaders; i++)
    if (named(&r->headers[i], "host")) {
      hosts++;
      CHECK(r->headers[i].value_len == (size_t)(e - a) &&
            memcmp(r->headers[i].value, a, (size_t)(e - a)) == 0);
    }
  CHECK(hosts == 1);
}

static void check_request(run_t *run, const nr_http_request_t *r) {
  size_t hosts = 0, lengths = 0, tes = 0;
  const char *head_end = r->method;
  CHECK(r->nheaders + r->ntrailers <= run->max_headers);
  CHECK(r->trailers == r->headers + r->nheaders);
  for (size_t i = 0; i < r->nheaders; i++) {
    const nr_http_header_t *h = &r->headers[i];
    if (named(h, "host")) {
      hosts++;
      CHECK(host_ok(h->value, h->value_len));
    }
    if (named(h, "content-length")) {
      lengths++;
      uint64_t v = 0;
      for (size_t j = 0; j < h->value_len; j++) {
        CHECK(h->value[j] >= '0' && h->value[j] <= '9');
        CHECK(v <= ((uint64_t)INT64_MAX - (uint64_t)(h->value[j] - '0')) / 10);
        v = v * 10 + (uint64_t)(h->value[j] - '0');
      }
      CHECK(r->chunked || v == r->body_len);
    }
    tes += named(h, "transfer-encoding");
    if (h->value + h->value_len > head_end)
      head_end = h->value + h->value_len;
  }
  CHECK(hosts <= 1);
  CHECK(r->minor == 0 || hosts == 1);
  check_target(r);
  if (r->chunked) {
    CHECK(r->minor == 1 && tes == 1 && lengths == 0);
  } else {
    CHECK(tes == 0 && r->ntrailers == 0);
  }
  for (size_t i = 0; i < r->ntrailers; i++) {
    const nr_http_header_t *t = &r->trailers[i];
    CHECK(t->name >= head_end);        /* from past the head, not merged */
    for (size_t k = 0; k < sizeof forbidden / sizeof forbidden[0]; k++)
      CHECK(!named(t, forbidden[k]));
  }
}

static int on_request(void *arg, int ev, nr_http_request_t *r) {
  run_t *run = arg;
  if (ev != NR_HTTP_EV_REQUEST)
    return 0;
  check_request(run, r);
  run->count++;
  mix(run, r->method, r->method_len);
  mix(run, r->path, r->path_len);
  mix(run, r->target, r->target_len);
  mix(run, r->body, r->body_len);
  for (size_t i = 0; i < r->nheaders + r->ntrailers; i++) {
    mix(run, i < r->nheaders ? "h" : "t", 1);
    mix(run, r->headers[i].name, r->headers[i].name_len);
    mix(run, r->headers[i].value, r->headers[i].value_len);
  }
  return 0;
}

static int feed_all(const uint8_t *data, size_t size, size_t step, run_t *run) {
  nr_http_parser_t p;
  nr_http_parser_init(&p, MAX_HEADER, MAX_BODY, run->max_headers);
  size_t off = 0;
  int rc = 0;
  while (off < size && rc == 0) {
    size_t k = step < size - off ? step : size - off;
    char *piece = malloc(k);           /* exactly k bytes: ASan sees overreads */
    CHECK(piece != NULL);
    memcpy(piece, data + off, k);
    rc = nr_http_feed(&p, piece, k, on_request, run);
    free(piece);
    off += k;
  }
  nr_http_parser_free(&p);
  return rc;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (size < 2)
    return 0;
  run_t whole = {1 + data[0] % 8, 0, 14695981039346656037ull};
  run_t split = whole;
  size_t step = (size_t)data[1] % 64 + 1;
  int a = feed_all(data + 2, size - 2, size, &whole);
  int b = feed_all(data + 2, size - 2, step, &split);
  CHECK(a == b);
  CHECK(whole.count == split.count && whole.digest == split.digest);
  return 0;
}
