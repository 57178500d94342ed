/*
 * h2_check.c -- the HTTP rules of a request's fields and body, checked by
 * the server (h2_server.c) in place of nghttp2's HTTP messaging, which is
 * off (nghttp2_option_set_no_http_messaging): its checks cost ~1,070
 * instructions a request, these a third of that (bench/RESULTS.md,
 * "HTTP/2 per CPU-second, the levers"). Loop thread only.
 *
 * The rules nghttp2 checked (RFC 9113 8.2, 8.3): a field name is
 * lowercase token characters, a value holds no NUL, CR, LF or other
 * control but HTAB and neither starts nor ends with white space (else
 * the request is malformed, 8.2.1); pseudo-fields come
 * first, once each, known, non-empty, never in trailers, :protocol never
 * (no SETTINGS_ENABLE_CONNECT_PROTOCOL); :method a token, :path visible
 * bytes, :scheme a scheme, :authority and Host an authority's bytes; no
 * connection-specific field (Connection, Keep-Alive, Proxy-Connection,
 * Transfer-Encoding, Upgrade, TE but "trailers"); one Content-Length,
 * digits, equal to the DATA received; a request has :method, :scheme,
 * :path (a CONNECT :authority and neither of the others) and :authority
 * or Host; an http(s) :path starts with "/" or is "*" for OPTIONS;
 * trailers end the stream. A malformed request is a stream error,
 * PROTOCOL_ERROR (h2_server.c resets it).
 */
#include <pthread.h>
#include <string.h>

#include "codec/h2_internal.h"

enum { C_NAME = 1, C_TOKEN = 2, C_VALUE = 4, C_PATH = 8, C_AUTH = 16,
       C_SCHEME = 32 };
static uint8_t cls[256];

static void make_classes(void) {
  const char *tok = "!#$%&'*+-.^_`|~";
  for (int c = 0; c < 256; c++) {
    bool alpha = (c | 32) >= 'a' && (c | 32) <= 'z', digit = c >= '0' && c <= '9';
    uint8_t k = 0;
    if (alpha || digit || (c && strchr(tok, c)))
      k |= C_TOKEN | (c >= 'A' && c <= 'Z' ? 0 : C_NAME);
    if (c == '\t' || (c >= 0x20 && c != 0x7f))
      k |= C_VALUE;
    if (c > 0x20 && c != 0x7f)
      k |= C_PATH;
    if (alpha || digit || (c && strchr("-._~!$&'()*+,;=:@[]%", c)))
      k |= C_AUTH;
    if (alpha || digit || c == '+' || c == '-' || c == '.')
      k |= C_SCHEME;
    cls[c] = k;
  }
}

void nr__h2_check_init(void) {
  static pthread_once_t once = PTHREAD_ONCE_INIT;
  pthread_once(&once, make_classes);
}

static bool all(const uint8_t *p, size_t n, uint8_t k) {
  uint8_t acc = k;
  for (size_t i = 0; i < n; i++)
    acc &= cls[p[i]];
  return acc == k;
}

#define ONES 0x0101010101010101ull
#define HIGH 0x8080808080808080ull

/* Whether any of w's bytes is 0 (exact: no borrow between bytes). */
static uint64_t zero_byte(uint64_t w) {
  return ~(((w & ~HIGH) + ~HIGH) | w) & HIGH;
}

/* A value's bytes eight at a time: none below 0x20 nor 0x7f (a HTAB
 * found so goes to the byte loop). */
static bool good_words(const uint8_t *v, size_t n) {
  for (size_t i = 0;; i += 8) {
    uint64_t w;
    memcpy(&w, v + (i + 8 <= n ? i : n - 8), 8);   /* (the last overlaps) */
    uint64_t low = ((w & ~HIGH) + (HIGH - 0x20 * ONES)) | w;   /* >= 0x20 */
    if (((~low & HIGH) | zero_byte(w ^ (0x7f * ONES))) != 0)
      return all(v, n, C_VALUE);
    if (i + 8 >= n)
      return true;
  }
}

static bool good_value(const uint8_t *v, size_t n) {
  if (n == 0)
    return true;
  if (v[0] == ' ' || v[0] == '\t' || v[n - 1] == ' ' || v[n - 1] == '\t')
    return false;
  return n >= 8 ? good_words(v, n) : all(v, n, C_VALUE);
}

static bool eq(const uint8_t *a, size_t n, const char *lit, size_t ln) {
  return n == ln && memcmp(a, lit, n) == 0;
}
#define EQ(a, n, lit) eq((a), (n), lit, sizeof lit - 1)

static bool ieq(const uint8_t *a, size_t n, const char *lit, size_t ln) {
  if (n != ln)
    return false;
  for (size_t i = 0; i < n; i++)
    if ((a[i] | 32) != lit[i])
      return false;
  return true;
}

/* A pseudo-field: the flag it sets, or 0 (malformed). */
static unsigned pseudo(h2s_t *s, const uint8_t *n, size_t nl,
                       const uint8_t *v, size_t vl) {
  unsigned f;
  if (vl == 0 || (s->hf & HF_REGULAR))
    return 0;
  if (EQ(n, nl, ":method")) {
    if (!all(v, vl, C_TOKEN))
      return 0;
    f = HF_METHOD;
    if (EQ(v, vl, "CONNECT"))
      s->hf |= HF_CONNECT;
    else if (EQ(v, vl, "OPTIONS"))
      s->hf |= HF_OPTIONS;
  } else if (EQ(n, nl, ":path")) {
    if (!all(v, vl, C_PATH))
      return 0;
    f = HF_PATH;
    if (v[0] == '/')
      s->hf |= HF_PATH_REGULAR;
    else if (vl == 1 && v[0] == '*')
      s->hf |= HF_PATH_STAR;
  } else if (EQ(n, nl, ":scheme")) {
    if (!(cls[v[0]] & C_SCHEME) || (v[0] | 32) < 'a' || (v[0] | 32) > 'z' ||
        !all(v, vl, C_SCHEME))
      return 0;
    f = HF_SCHEME;
    if (ieq(v, vl, "http", 4) || ieq(v, vl, "https", 5))
      s->hf |= HF_SCHEME_HTTP;
  } else if (EQ(n, nl, ":authority")) {
    if (!all(v, vl, C_AUTH))
      return 0;
    f = HF_AUTHORITY;
  } else {
    return 0;                  /* unknown, or :protocol */
  }
  return s->hf & f ? 0 : f;
}

/* Content-Length: digits, once. */
static bool content_length(h2s_t *s, const uint8_t *v, size_t vl) {
  if (s->clen >= 0 || vl == 0 || vl > 18)
    return false;
  int64_t x = 0;
  for (size_t i = 0; i < vl; i++) {
    if (v[i] < '0' || v[i] > '9')
      return false;
    x = x * 10 + (v[i] - '0');
  }
  s->clen = x;
  return true;
}

int nr__h2_check_field(h2s_t *s, const uint8_t *n, size_t nl,
                       const uint8_t *v, size_t vl) {
  if (nl > 0 && n[0] == ':') {
    if (s->f.trailers)         /* (names matched whole, values checked */
      return -1;               /* by stricter classes, in pseudo) */
    unsigned f = pseudo(s, n, nl, v, vl);
    if (f == 0)
      return -1;
    s->hf |= f;
    return (int)f;
  }
  s->hf |= HF_REGULAR;
  if (nl == 0 || !all(n, nl, C_NAME) || !good_value(v, vl))
    return -1;
  if (nl == 4 && EQ(n, nl, "host")) {
    if (vl == 0 || (s->hf & HF_HOST) || !all(v, vl, C_AUTH))
      return -1;
    s->hf |= HF_HOST;
  } else if (nl == 14 && EQ(n, nl, "content-length")) {
    if (!content_length(s, v, vl))
      return -1;
  } else if (nl == 2 && EQ(n, nl, "te")) {
    if (!ieq(v, vl, "trailers", 8))
      return -1;
  } else if (nr__h2_connection_field((const char *)n, nl)) {
    return -1;
  }
  return 0;
}

bool nr__h2_check_request(const h2s_t *s) {
  unsigned hf = s->hf;
  if (hf & HF_CONNECT)
    return !(hf & (HF_SCHEME | HF_PATH)) && (hf & HF_AUTHORITY);
  if ((hf & (HF_METHOD | HF_SCHEME | HF_PATH)) !=
          (HF_METHOD | HF_SCHEME | HF_PATH) ||
      !(hf & (HF_AUTHORITY | HF_HOST)))
    return false;
  return !(hf & HF_SCHEME_HTTP) || (hf & HF_PATH_REGULAR) ||
         ((hf & HF_OPTIONS) && (hf & HF_PATH_STAR));
}
