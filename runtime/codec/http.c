/*
 * http.c -- the HTTP/1.1 server codec of http.h: request parser, response
 * encoder and the pipeline handler. Loop thread only.
 *
 * Parsing. A request is parsed in place from the bytes fed to it: when a
 * whole request sits in one read, nothing is copied or allocated. When it
 * does not, the unparsed tail (from the request's first byte) goes to the
 * cumulation `in` and parsing resumes there; the header block is then
 * simply re-parsed (cheap, and it keeps every pointer valid whatever the
 * buffer did), while the progress through a body is kept as offsets from
 * the request's start. Chunked bodies are decoded into `body`. A complete
 * header block is validated and split in one pass (a byte class table for
 * tokens, request targets and field values eight bytes at a time); the
 * block's end is searched for on its own only while it is incomplete or
 * after a bad line.
 *
 * Answering. Responses go out in request order: the handler keeps a ring
 * of what it must remember about each delivered, unanswered request (HEAD,
 * HTTP/1.0, "close the connection after it"). Once a request that ends the
 * connection is delivered nothing more is parsed. A protocol error waits
 * for the responses still owed, then is answered and the channel closed
 * (after a half-close that lets the client stop sending: close_after_error).
 *
 * Encoding. When the codec's writes go straight to the channel's head (no
 * handler between, no promise), a response is encoded in place at the end
 * of the outbound buffer (nr_ctx_write_reserve), so its bytes are written
 * once; a prepared response's usual answer is then one copy and the date.
 * Otherwise the status line and headers are built in a per-thread scratch
 * buffer (no allocation per response) and handed to the next handler as
 * one write. A small body goes with the head; a large one follows as a
 * second write (in place) or slice (of the same gathered write).
 */
#include <assert.h>
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>

#include "codec/codec.h"
#include "codec/http.h"
#include "codec/http_parse.h"

enum { P_HEAD, P_BODY, P_CHUNK_SIZE, P_CHUNK_DATA, P_CHUNK_CRLF, P_TRAILER };

/* Kept out of a caller whose usual path is short, so that path does not
 * save and restore the registers the rest needs. */
#define NOINLINE __attribute__((noinline))

/* Bytes allowed in a chunk-size line (size, extensions) before it is
 * called malformed. */
#define CHUNK_LINE_MAX 1024

/* ---- character classes ------------------------------------------------------- */

/* One table lookup per byte classifies it: C_TOKEN an RFC 9110 tchar (ALPHA
 * DIGIT and !#$%&'*+-.^_`|~), C_VALUE a field-value byte (VCHAR, obs-text,
 * SP, HTAB), C_TARGET a request-target byte (VCHAR, obs-text), C_PATH one
 * of those but '?', C_HOST a byte of an RFC 3986 reg-name or IPv4 address
 * (unreserved, sub-delims, '%'). The table is built by the compiler from
 * these rules. */
enum { C_TOKEN = 1, C_VALUE = 2, C_TARGET = 4, C_PATH = 8, C_HOST = 16 };
#define TCHAR(c) ((c) < 128 && (((c) < 64 ? 0x03ff6cfa00000000ull        \
                                           : 0x57ffffffc7fffffeull) >>   \
                                 ((c) & 63) & 1))
#define VALUE(c) (((c) >= 0x20 && (c) != 0x7f) || (c) == '\t')
#define TARGET(c) ((c) > 0x20 && (c) != 0x7f)
#define HOSTC(c) (((c) >= 'a' && (c) <= 'z') || ((c) >= 'A' && (c) <= 'Z') || \
                  ((c) >= '0' && (c) <= '9') || (c) == '-' || (c) == '.' ||  \
                  (c) == '_' || (c) == '~' || (c) == '!' || (c) == '$' ||    \
                  ((c) >= '&' && (c) <= ',') || (c) == ';' || (c) == '=' ||  \
                  (c) == '%')
#define CLS(c) ((TCHAR(c) ? C_TOKEN : 0) | (VALUE(c) ? C_VALUE : 0) |     \
                (TARGET(c) ? C_TARGET : 0) |                              \
                (TARGET(c) && (c) != '?' ? C_PATH : 0) |                  \
                (HOSTC(c) ? C_HOST : 0))
#define CLS4(c) CLS(c), CLS((c) + 1), CLS((c) + 2), CLS((c) + 3)
#define CLS16(c) CLS4(c), CLS4((c) + 4), CLS4((c) + 8), CLS4((c) + 12)
#define CLS64(c) CLS16(c), CLS16((c) + 16), CLS16((c) + 32), CLS16((c) + 48)
static const uint8_t cls[256] = {CLS64(0), CLS64(64), CLS64(128), CLS64(192)};

/* Where the run of class `c` bytes from s[i] ends (n at most), byte by
 * byte: for tokens, which are short. Unrolled: one bound check per four
 * bytes. */
static inline size_t span(const char *s, size_t i, size_t n, int c) {
  const unsigned char *u = (const unsigned char *)s;
  for (; i + 4 <= n; i += 4) {
    if (!(cls[u[i]] & c))
      return i;
    if (!(cls[u[i + 1]] & c))
      return i + 1;
    if (!(cls[u[i + 2]] & c))
      return i + 2;
    if (!(cls[u[i + 3]] & c))
      return i + 3;
  }
  while (i < n && cls[u[i]] & c)
    i++;
  return i;
}

/* Eight bytes at a time, for the long runs: request targets and field
 * values. A word is loaded with the byte at the lowest address least
 * significant, and a test sets the high bit of each byte it flags. Its
 * borrows run upwards only, from a flagged byte, so the lowest flag is
 * exact (the ones above it may be wrong, and are not used). */
#define ONES 0x0101010101010101ull
#define HIGHS (ONES << 7)

static inline uint64_t load8(const char *s) {
  uint64_t x;
  memcpy(&x, s, 8);
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__
  x = __builtin_bswap64(x);
#endif
  return x;
}

/* The bytes of x below c, or equal to 0x7f after x | o (o is 0 or 0x40):
 * x - c borrows into the high bit of a byte below c (c <= 0x80), and
 * (x | o) ^ 0x7f - 1 into that of a byte that was 0x7f; ~x keeps the bytes
 * that had no high bit of their own, and from them these borrows only. */
static inline uint64_t flags(uint64_t x, unsigned c, unsigned o) {
  return ((x - c * ONES) | (((x | o * ONES) ^ 0x7f * ONES) - ONES)) & ~x &
         HIGHS;
}

/* Where the run of class `c` bytes (C_VALUE, C_TARGET or C_PATH) from s[i]
 * ends, n at most. The bytes flagged are those outside the class (for
 * targets, SP, controls, '?' and DEL: x | 0x40 is 0x7f for exactly these
 * two), and also HTAB in a value and '?' in a query: the first flagged
 * byte is looked up in the table, and the run goes on past it if it is of
 * the class after all. */
static inline size_t run(const char *s, size_t i, size_t n, int c) {
  const unsigned char *u = (const unsigned char *)s;
  while (i + 8 <= n) {
    uint64_t x = load8(s + i);
    uint64_t m = c == C_VALUE ? flags(x, 0x20, 0) : flags(x, 0x21, 0x40);
    if (m == 0) {
      i += 8;
      continue;
    }
    i += (size_t)__builtin_ctzll(m) / 8;
    if (c == C_PATH || !(cls[u[i]] & c))
      return i;              /* a path's flags are exact */
    i++;
  }
  return span(s, i, n, c);
}

bool nr_http_is_token(const char *s, size_t n) {
  return n > 0 && span(s, 0, n, C_TOKEN) == n;
}

bool nr_http_is_field_value(const char *s, size_t n) {
  return run(s, 0, n, C_VALUE) == n;
}

static int lower(int c) { return c >= 'A' && c <= 'Z' ? c + 32 : c; }

/* Case-insensitive equality with a lowercase literal. */
static bool ieq(const char *a, size_t n, const char *lit, size_t ln) {
  if (n != ln)
    return false;
  for (size_t i = 0; i < n; i++)
    if (lower((unsigned char)a[i]) != lit[i])
      return false;
  return true;
}
#define IEQ(a, n, lit) ieq((a), (n), lit, sizeof lit - 1)

/* ---- the header block ---------------------------------------------------------- */

/* The offset just past the blank line ending the header block, or 0 when it
 * has not all arrived (p->scan then remembers where the last line began). */
static size_t find_block_end(nr_http_parser_t *p, const char *s, size_t n) {
  size_t ls = p->scan;
  for (;;) {
    const char *nl = ls < n ? memchr(s + ls, '\n', n - ls) : NULL;
    if (nl == NULL) {
      p->scan = ls;
      return 0;
    }
    size_t j = (size_t)(nl - s);
    if (j == ls || (j == ls + 1 && s[ls] == '\r'))
      return j + 1;
    ls = j + 1;
  }
}

/* Parse one "name: value" line at *ip into *h: 0 or 400. A line running
 * past len is malformed too: callers tell that from "not all here" with
 * find_block_end. */
static inline int parse_field(nr_http_header_t *h, const char *s, size_t len,
                              size_t *ip) {
  size_t n0 = *ip, n1 = span(s, n0, len, C_TOKEN), i = n1;
  if (i == n0 || i >= len || s[i] != ':')
    return 400;              /* empty name, space before ':', obs-fold */
  i++;
  while (i < len && (s[i] == ' ' || s[i] == '\t'))
    i++;
  size_t v0 = i, v1 = i = run(s, i, len, C_VALUE);
  if (i < len && s[i] == '\r')
    i++;
  if (i >= len || s[i] != '\n')
    return 400;              /* a control byte, or a bare CR */
  *ip = i + 1;
  while (v1 > v0 && (s[v1 - 1] == ' ' || s[v1 - 1] == '\t'))
    v1--;
  *h = (nr_http_header_t){s + n0, s + v0, n1 - n0, v1 - v0};
  return 0;
}

/* The next item of the comma-separated list v[0 .. n) from *i: true with
 * it at v[*t0 .. *t1), trimmed of spaces and tabs (empty items skipped),
 * false at the end. */
static bool next_item(const char *v, size_t n, size_t *i, size_t *t0,
                      size_t *t1) {
  for (;;) {
    while (*i < n && (v[*i] == ' ' || v[*i] == '\t' || v[*i] == ','))
      (*i)++;
    if (*i == n)
      return false;
    *t0 = *i;
    while (*i < n && v[*i] != ',')
      (*i)++;
    *t1 = *i;
    while (*t1 > *t0 && (v[*t1 - 1] == ' ' || v[*t1 - 1] == '\t'))
      (*t1)--;
    if (*t1 > *t0)
      return true;
  }
}

/* Does the comma-separated list contain the (lowercase) token? */
static bool has_token(const char *v, size_t n, const char *tok, size_t tn) {
  size_t i = 0, t0, t1;
  while (next_item(v, n, &i, &t0, &t1))
    if (ieq(v + t0, t1 - t0, tok, tn))
      return true;
  return false;
}

/* What the framing and routing headers said so far. */
enum { H_LENGTH = 1, H_CHUNKED = 2, H_CLOSE = 4, H_KEEP = 8, H_HOST = 16,
       H_TE = 32 };

/* The largest length a message may state (RFC 9112 leaves the bound to
 * the recipient; past int64 no peer agrees on it, so it is malformed, not
 * merely too large). */
#define LENGTH_MAX ((uint64_t)INT64_MAX)

/* Content-Length: digits only; a repeat must agree. */
static int content_length(nr_http_parser_t *p, const nr_http_header_t *h,
                          unsigned *seen) {
  uint64_t v = 0;
  if (h->value_len == 0)
    return 400;
  for (size_t i = 0; i < h->value_len; i++) {
    unsigned c = (unsigned char)h->value[i] - '0';
    if (c > 9)
      return 400;
    if (v > (LENGTH_MAX - c) / 10)
      return 400;
    v = v * 10 + c;
  }
  if ((*seen & H_LENGTH) && v != p->content_length)
    return 400;
  *seen |= H_LENGTH;
  p->content_length = v;
  return 0;
}

/* parse_request_line's "every byte so far may begin a good line". */
#define NEED NR_HTTP_NEED        /* (-1): see the code space in http.h */

/* The version and line end from s[i]: "HTTP/" DIGIT "." DIGIT, then CRLF
 * or LF. Judged byte by byte, so a wrong byte is refused at once. */
static int parse_version(nr_http_request_t *r, const char *s, size_t len,
                         size_t i, size_t *ip) {
  static const char form[] = "HTTP/#.#";     /* '#': a digit */
  size_t v = i;
  for (size_t k = 0; k < sizeof form - 1; k++, i++) {
    if (i >= len)
      return NEED;
    bool ok = form[k] == '#' ? s[i] >= '0' && s[i] <= '9' : s[i] == form[k];
    if (!ok)
      return 400;
  }
  if (i < len && s[i] == '\r')
    i++;
  if (i >= len)
    return NEED;
  if (s[i] != '\n')
    return 400;
  *ip = i + 1;
  r->minor = s[v + 7] > '1' ? 1 : s[v + 7] - '0';
  return s[v + 5] == '1' ? 0 : 505;
}

/* The request line at s[0 .. len): METHOD SP target SP HTTP/1.x CRLF.
 * 0 when it is whole and good (*ip just past it), NEED when every byte so
 * far may still begin a good line, else the status refusing it -- decided
 * at its first bad byte, not at the line's end, so garbage is refused
 * without waiting for more. A line that parses with some len parses the
 * same with any larger one. */
static int parse_request_line(nr_http_request_t *r, const char *s, size_t len,
                              size_t *ip) {
  size_t i = span(s, 0, len, C_TOKEN);
  if (i == len || (len == 1 && s[0] == '\r'))
    return NEED;             /* (a CR may begin a blank line, skipped) */
  if (i == 0 || s[i] != ' ')
    return 400;
  r->method = s;
  r->method_len = i++;
  size_t t0 = i, q = run(s, i, len, C_PATH);   /* q: '?' or the end */
  i = q < len && s[q] == '?' ? run(s, q + 1, len, C_TARGET) : q;
  if (i == len)
    return NEED;
  if (q == t0 || s[i] != ' ')
    return 400;              /* no target, or no path before its query */
  r->path = s + t0;
  r->path_len = q - t0;
  r->query = q < i ? s + q + 1 : NULL;
  r->query_len = q < i ? i - q - 1 : 0;
  i++;
  if (len - i >= 10 && memcmp(s + i, "HTTP/1.1\r\n", 10) == 0) {
    r->minor = 1;            /* the usual case, in two compares */
    *ip = i + 10;
    return 0;
  }
  return parse_version(r, s, len, i, ip);
}

/* Host = uri-host [ ":" port ] (RFC 9110 7.2): a reg-name or IPv4
 * address, or an IP literal in brackets; empty is allowed (a target
 * without authority). */
static bool valid_host(const char *v, size_t n) {
  size_t i;
  if (n > 0 && v[0] == '[') {
    for (i = 1; i < n && v[i] != ']'; i++)
      if (!(cls[(unsigned char)v[i]] & C_HOST) && v[i] != ':')
        return false;
    if (i == n || i == 1)
      return false;
    i++;
  } else {
    i = span(v, 0, n, C_HOST);
  }
  if (i < n && v[i] == ':')
    for (i++; i < n && v[i] >= '0' && v[i] <= '9'; i++)
      ;
  return i == n;
}

/* Is h named Host? Every request has one, so a word compare: OR 0x20
 * lowercases a letter and maps no other byte onto one of "host". */
static inline bool named_host(const nr_http_header_t *h) {
  uint32_t w;
  memcpy(&w, h->name, 4);
  uint32_t host;
  memcpy(&host, "host", 4);
  return (w | 0x20202020u) == host;
}

/* Transfer-Encoding: only "chunked", last, once (501 for any other
 * coding). None in HTTP/1.0 and no second Transfer-Encoding line: a
 * message framed two ways is how requests are smuggled past a proxy that
 * reads the other (RFC 9112 6.1, 6.3). */
static int transfer_encoding(const nr_http_request_t *r,
                             const nr_http_header_t *h, unsigned *seen) {
  if (r->minor == 0 || (*seen & H_TE))
    return 400;
  *seen |= H_TE;
  if (IEQ(h->value, h->value_len, "chunked")) {
    *seen |= H_CHUNKED;      /* the usual */
    return 0;
  }
  const char *v = h->value;
  size_t n = h->value_len, i = 0, t0, t1, chunked = 0, other = 0;
  bool last = false;
  while (next_item(v, n, &i, &t0, &t1)) {
    last = IEQ(v + t0, t1 - t0, "chunked");
    chunked += last;
    other += !last;
  }
  if (chunked > 1 || (chunked == 1 && !last) || chunked + other == 0)
    return 400;
  return other > 0 ? 501 : (*seen |= H_CHUNKED, 0);
}

/* Apply a header that matters to the codec (chosen by its name's length
 * first, so most headers cost one switch). 0 or an HTTP status. */
static int framing(nr_http_parser_t *p, nr_http_request_t *r,
                   const nr_http_header_t *h, unsigned *seen) {
  switch (h->name_len) {
  case 4:
    if (named_host(h)) {     /* one, and well formed (RFC 9112 3.2) */
      if ((*seen & H_HOST) || !valid_host(h->value, h->value_len))
        return 400;
      *seen |= H_HOST;
    }
    break;
  case 14:
    if (IEQ(h->name, 14, "content-length"))
      return content_length(p, h, seen);
    break;
  case 17:
    if (IEQ(h->name, 17, "transfer-encoding"))
      return transfer_encoding(r, h, seen);
    break;
  case 10:
    if (IEQ(h->name, 10, "connection")) {
      if (has_token(h->value, h->value_len, "close", 5))
        *seen |= H_CLOSE;
      if (has_token(h->value, h->value_len, "keep-alive", 10))
        *seen |= H_KEEP;
    }
    break;
  case 7:
    if (IEQ(h->name, 7, "upgrade"))
      r->switches = true;
    break;
  case 6:
    if (IEQ(h->name, 6, "expect"))
      r->expect_continue = IEQ(h->value, h->value_len, "100-continue");
    break;
  }
  return 0;
}

/* Parse the header fields from s[i] (just past the request line) into r,
 * up to the blank line ending the block, and decide how the body is framed:
 * one pass, each byte looked at once. Returns the offset just past that
 * blank line, or 0 when the block has not all arrived (p->scan then holds
 * where its last line began); *rc gets 0 or the status of the first bad
 * line. At a bad line the rest is only searched for the block's end, as an
 * incomplete or oversized block is judged before its lines. Idempotent: run
 * again after the input moved. */
static size_t parse_head(nr_http_parser_t *p, nr_http_request_t *r,
                         const char *s, size_t n, size_t i, int *rc) {
  r->type = NR_MSG_HTTP_REQUEST;
  r->nheaders = 0;
  r->expect_continue = r->chunked = false;
  r->head = r->method_len == 4 && memcmp(r->method, "HEAD", 4) == 0;
  r->switches = r->method_len == 7 && memcmp(r->method, "CONNECT", 7) == 0;
  r->body = "";
  r->body_len = 0;
  p->content_length = 0;
  *rc = 0;
  unsigned seen = 0;
  for (;;) {
    /* A name starts with a tchar: one compare tells most lines from the
     * blank one ("\n" or "\r\n"; a lone CR fails as a field). */
    if (i < n && (unsigned char)s[i] <= '\r' &&
        (s[i] == '\n' || (s[i] == '\r' && i + 1 < n && s[i + 1] == '\n')))
      break;
    size_t ls = i;
    nr_http_header_t h;
    if ((*rc = parse_field(&h, s, n, &i)) == 0) {
      if (r->nheaders == p->max_headers) {
        *rc = 431;
      } else {
        r->headers[r->nheaders++] = h;
        *rc = framing(p, r, &h, &seen);
      }
    }
    if (*rc != 0) {
      p->scan = ls;
      return find_block_end(p, s, n);
    }
  }
  r->ntrailers = 0;
  r->trailers = r->headers + r->nheaders;
  r->keep_alive = true;      /* HTTP/1.1, a Host and no framing header: the
                                usual */
  if (seen != H_HOST || r->minor == 0) {
    if (r->minor != 0 && !(seen & H_HOST))
      *rc = 400;             /* HTTP/1.1 requires it (RFC 9112 3.2) */
    if ((seen & H_LENGTH) && (seen & H_TE))
      *rc = 400;             /* ambiguous framing: a smuggling vector */
    r->chunked = seen & H_CHUNKED;
    r->keep_alive = !(seen & H_CLOSE) && (r->minor >= 1 || (seen & H_KEEP));
    if (r->minor == 0)
      r->expect_continue = false;
  }
  return i + (s[i] == '\r') + 1;
}

/* The request line and header block at s[0 .. n): the block's length when
 * it is whole and good (r filled in), 0 when more is needed, or -status.
 * The request line is judged as soon as it is whole (within max_header),
 * so garbage gets its 400 without waiting; the fields once the block is. */
static long parse_block(nr_http_parser_t *p, nr_http_request_t *r,
                        const char *s, size_t n) {
  size_t i, max = p->max_header, first = n < max ? n : max;
  int rc;
  /* Resumed (the line was judged good before): search on from where the
   * last call stopped, so a slow block is scanned once. */
  if (p->line_ok && find_block_end(p, s, n) == 0)
    return n > max ? -431 : 0;
  if ((rc = parse_request_line(r, s, first, &i)) != 0)
    return rc != NEED ? -rc : n >= max ? -431 : 0;
  size_t end = parse_head(p, r, s, n, i, &rc);
  if (end == 0) {
    p->line_ok = true;
    return n > max ? -431 : 0;
  }
  if (end > max)
    return -431;
  return rc ? -rc : (long)end;
}

/* ---- chunked bodies -------------------------------------------------------------- */

/* Decode chunks from s[p->pos .. n): 0 need more, -status, or the offset
 * just past the trailer section. */
static long decode_chunks(nr_http_parser_t *p, const char *s, size_t n) {
  for (;;) {
    if (p->pos - p->head_len > 2 * p->max_body + 65536)
      return -413;           /* chunk framing out of all proportion */
    switch (p->phase) {
    case P_CHUNK_SIZE: {
      const char *nl = memchr(s + p->pos, '\n', n - p->pos);
      if (nl == NULL)
        return n - p->pos > CHUNK_LINE_MAX ? -400 : 0;
      size_t i = p->pos, end = (size_t)(nl - s);
      if (end - i > CHUNK_LINE_MAX)
        return -400;
      uint64_t v = 0;
      size_t digits = 0;     /* any number: leading zeros are fine */
      for (; i < end; i++, digits++) {
        int c = lower((unsigned char)s[i]);
        int d = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : -1;
        if (d < 0)
          break;
        if (v > LENGTH_MAX >> 4)
          return -400;       /* past 2^63 - 1: no size at all */
        v = v * 16 + (uint64_t)d;
      }
      if (digits == 0)
        return -400;
      for (; i < end; i++) {  /* extensions are ignored, but must be sane */
        unsigned char c = (unsigned char)s[i];
        if ((c < 0x20 && c != '\t' && !(c == '\r' && i + 1 == end)) || c == 0x7f)
          return -400;
      }
      if (s[p->pos + digits] != ';' && s[p->pos + digits] != ' ' &&
          s[p->pos + digits] != '\t' && s[p->pos + digits] != '\r' &&
          p->pos + digits != end)
        return -400;
      p->pos = end + 1;
      if (v == 0) {
        p->phase = P_TRAILER;
        p->scan = p->pos;
        break;
      }
      if (v > p->max_body - nr_buf_len(&p->body))
        return -413;
      p->chunk_left = v;
      p->phase = P_CHUNK_DATA;
      break;
    }
    case P_CHUNK_DATA: {
      size_t take = n - p->pos;
      if (take > p->chunk_left)
        take = (size_t)p->chunk_left;
      if (nr_buf_append(&p->body, s + p->pos, take) < 0)
        return -500;
      p->pos += take;
      p->chunk_left -= take;
      if (p->chunk_left > 0)
        return 0;
      p->phase = P_CHUNK_CRLF;
      break;
    }
    case P_CHUNK_CRLF:
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
      break;
    case P_TRAILER: {
      size_t end = find_block_end(p, s, n);
      if (end == 0)
        return n - p->pos > p->max_header ? -431 : 0;
      if (end - p->pos > p->max_header)
        return -431;
      return (long)end;
    }
    default:
      return -500;
    }
  }
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
static int parse_trailers(nr_http_parser_t *p, nr_http_request_t *r,
                          const char *s, size_t from, size_t end) {
  size_t i = from;
  r->trailers = r->headers + r->nheaders;
  r->ntrailers = 0;
  while (i < end && s[i] != '\n' &&
         !(s[i] == '\r' && i + 1 < end && s[i + 1] == '\n')) {
    nr_http_header_t h;
    if (parse_field(&h, s, end, &i) != 0 || forbidden_in_trailer(&h))
      return 400;
    if (r->nheaders + r->ntrailers == p->max_headers)
      return 431;
    r->headers[r->nheaders + r->ntrailers++] = h;
  }
  return 0;
}

/* ---- one request ---------------------------------------------------------------- */

/* Parse one request at s[0 .. n): its length when complete (req is then
 * filled in), 0 when more input is needed, or -status. */
static long parse_one(nr_http_parser_t *p, nr_http_request_t *req,
                      const char *s, size_t n) {
  int rc = 0;
  bool again = p->phase != P_HEAD;   /* the head parsed before: again, in
                                        place (it cannot fail this time) */
  long end = parse_block(p, req, s, again ? p->head_len : n);
  if (end <= 0)
    return end;
  if (!again) {
    if (!req->chunked && p->content_length == 0)
      return end;            /* the usual: no body */
    p->head_len = (size_t)end;
    p->line_ok = false;      /* parse_block reads it in the next phases */
    if (req->chunked) {
      p->phase = P_CHUNK_SIZE;
      p->pos = p->head_len;
    } else {
      if (p->content_length > p->max_body)
        return -413;
      p->phase = P_BODY;
    }
  }
  if (p->phase == P_BODY) {
    if (n - p->head_len < p->content_length)
      return 0;
    req->body = s + p->head_len;
    req->body_len = (size_t)p->content_length;
    return (long)(p->head_len + p->content_length);
  }
  end = decode_chunks(p, s, n);
  if (end <= 0)
    return end;
  /* p->pos stayed where the trailer section began */
  if ((rc = parse_trailers(p, req, s, p->pos, (size_t)end)) != 0)
    return -rc;
  req->body = nr_buf_len(&p->body) ? nr_buf_peek(&p->body) : "";
  req->body_len = nr_buf_len(&p->body);
  return end;
}

/* ---- feeding ------------------------------------------------------------------------ */

void nr_http_parser_init(nr_http_parser_t *p, size_t max_header,
                         size_t max_body, size_t max_headers) {
  memset(p, 0, sizeof *p);
  p->max_header = max_header;
  p->max_body = max_body;
  p->max_headers = (uint16_t)(max_headers < 1 ? 1
                              : max_headers > NR_HTTP_MAX_HEADERS
                                  ? NR_HTTP_MAX_HEADERS : max_headers);
}

void nr_http_parser_free(nr_http_parser_t *p) {
  nr_buf_free(&p->in);
  nr_buf_free(&p->body);
}

/* After a request: a head without a body leaves only the head search's
 * state to reset (the rest is still or again as next_request left it). */
static void next_request(nr_http_parser_t *p) {
  p->scan = 0;
  p->line_ok = false;
  if (p->phase != P_HEAD) {
    p->phase = P_HEAD;
    p->head_len = p->pos = 0;
    p->chunk_left = p->content_length = 0;
    p->continue_sent = false;
    if (p->body.data != NULL)
      nr_buf_free(&p->body);
  }
}

static int stop(nr_http_parser_t *p, int status) {
  nr_http_parser_free(p);
  nr_http_parser_init(p, p->max_header, p->max_body, p->max_headers);
  p->stopped = true;
  return status;
}

/* The callback switched protocols after a request: the bytes after it
 * (s[off .. n), maybe a first frame of the new protocol) are kept in `in`
 * for the caller to hand over, and the parser takes nothing more. */
static int switched(nr_http_parser_t *p, const char *s, size_t off, size_t n,
                    bool cum) {
  nr_buf_free(&p->body);
  if (cum)
    nr_buf_consume(&p->in, off);
  else if (off < n && nr_buf_append(&p->in, s + off, n - off) < 0)
    return stop(p, 500);
  p->stopped = true;
  return 1;
}

/* Blank lines before a request line are skipped (RFC 9112 2.2). */
static size_t skip_blank(const char *s, size_t off, size_t n) {
  while (off < n) {
    if (s[off] == '\n')
      off++;
    else if (s[off] == '\r' && off + 1 < n && s[off + 1] == '\n')
      off += 2;
    else
      break;
  }
  return off;
}

int nr_http_feed(nr_http_parser_t *p, const char *data, size_t len,
                 nr_http_cb cb, void *arg) {
  if (p->stopped)
    return 1;
  bool cum = nr_buf_len(&p->in) > 0;
  if (cum && len > 0 && nr_buf_append(&p->in, data, len) < 0)
    return stop(p, 500);
  /* The request lives on the stack: it is rebuilt from the bytes on every
   * call, so a connection between requests holds none of it. */
  nr_http_request_t req;
  req.expect_continue = false;
  const char *s = cum ? nr_buf_peek(&p->in) : data;
  size_t n = cum ? nr_buf_len(&p->in) : len, off = 0;
  while (off < n) {
    if (p->phase == P_HEAD && p->scan == 0 &&
        (off = skip_blank(s, off, n)) == n)
      break;
    long r = parse_one(p, &req, s + off, n - off);
    if (r < 0)
      return stop(p, (int)-r);
    if (r == 0) {
      if (p->phase != P_HEAD && req.expect_continue && !p->continue_sent) {
        p->continue_sent = true;
        if (cb(arg, NR_HTTP_EV_CONTINUE, &req))
          return stop(p, 1);
      }
      break;
    }
    int halt = cb(arg, NR_HTTP_EV_REQUEST, &req);
    next_request(p);
    off += (size_t)r;
    if (halt == NR_HTTP_PAUSE)
      break;
    if (halt == NR_HTTP_SWITCHED)
      return switched(p, s, off, n, cum);
    if (halt)
      return stop(p, 1);
  }
  if (cum)
    nr_buf_consume(&p->in, off);
  else if (off < n && nr_buf_append(&p->in, s + off, n - off) < 0)
    return stop(p, 500);
  return 0;
}

/* ---- encoding ------------------------------------------------------------------------ */

const char *nr_http_reason(int status) {
  switch (status) {
  case 100: return "Continue";
  case 101: return "Switching Protocols";
  case 200: return "OK";
  case 201: return "Created";
  case 202: return "Accepted";
  case 204: return "No Content";
  case 206: return "Partial Content";
  case 301: return "Moved Permanently";
  case 302: return "Found";
  case 303: return "See Other";
  case 304: return "Not Modified";
  case 307: return "Temporary Redirect";
  case 308: return "Permanent Redirect";
  case 400: return "Bad Request";
  case 401: return "Unauthorized";
  case 403: return "Forbidden";
  case 404: return "Not Found";
  case 405: return "Method Not Allowed";
  case 408: return "Request Timeout";
  case 409: return "Conflict";
  case 410: return "Gone";
  case 411: return "Length Required";
  case 413: return "Content Too Large";
  case 414: return "URI Too Long";
  case 415: return "Unsupported Media Type";
  case 417: return "Expectation Failed";
  case 422: return "Unprocessable Content";
  case 426: return "Upgrade Required";
  case 429: return "Too Many Requests";
  case 431: return "Request Header Fields Too Large";
  case 500: return "Internal Server Error";
  case 501: return "Not Implemented";
  case 502: return "Bad Gateway";
  case 503: return "Service Unavailable";
  case 504: return "Gateway Timeout";
  case 505: return "HTTP Version Not Supported";
  default: return "Unknown";
  }
}

/* The second nr_http_date last formatted, and its text (per thread). */
static _Thread_local time_t date_sec = -1;
static _Thread_local char date_buf[40];

/* Once a second: kept out of line so that nr_http_date is a compare. */
static NOINLINE void format_date(time_t now) {
  static const char days[7][4] = {"Sun", "Mon", "Tue", "Wed", "Thu", "Fri",
                                  "Sat"};
  static const char months[12][4] = {"Jan", "Feb", "Mar", "Apr", "May", "Jun",
                                     "Jul", "Aug", "Sep", "Oct", "Nov", "Dec"};
  struct tm tm;
  gmtime_r(&now, &tm);
  snprintf(date_buf, sizeof date_buf, "%s, %02d %s %04d %02d:%02d:%02d GMT",
           days[tm.tm_wday % 7], tm.tm_mday, months[tm.tm_mon % 12],
           tm.tm_year + 1900, tm.tm_hour, tm.tm_min, tm.tm_sec);
  date_sec = now;
}

const char *nr_http_date(void) {
  time_t now = time(NULL);
  if (now != date_sec)
    format_date(now);
  return date_buf;
}

/* An output buffer: the end of the channel's outbound buffer when the
 * codec's writes go straight there (nr_ctx_write_reserve: the bytes are
 * encoded in place, with no copy), else the thread's scratch when free
 * (encoding never nests in practice, but a handler between us and the head
 * could write again), else the heap. */
static _Thread_local char scratch[8192];
static _Thread_local bool scratch_busy;

typedef struct out_s {
  char *p;
  size_t len, cap;
  bool scratch, failed;
  bool direct;                /* p is reserved room in the outbound buffer */
} out_t;

static void out_init(out_t *o) {
  *o = (out_t){0};
  if (!scratch_busy) {
    scratch_busy = o->scratch = true;
    o->p = scratch;
    o->cap = sizeof scratch;
  }
}

static void out_grow(out_t *o, size_t n) {
  size_t cap = o->cap * 2 > o->len + n + 256 ? o->cap * 2 : o->len + n + 256;
  char *q = o->scratch || o->p == NULL ? malloc(cap) : realloc(o->p, cap);
  if (q == NULL) {
    o->failed = true;
    return;
  }
  if (o->scratch) {
    memcpy(q, o->p, o->len);
    scratch_busy = o->scratch = false;
  }
  o->p = q;
  o->cap = cap;
}

/* Room for n more bytes: where to write them (then set o->len past what
 * was written), or NULL when out of memory (o->failed). */
static inline char *out_reserve(out_t *o, size_t n) {
  if (o->len + n > o->cap) {
    out_grow(o, n);
    if (o->failed)
      return NULL;
  }
  return o->p + o->len;
}

static inline void out_put(out_t *o, const char *s, size_t n) {
  char *w = out_reserve(o, n);
  if (w != NULL) {
    memcpy(w, s, n);
    o->len += n;
  }
}
#define OUT_LIT(o, lit) out_put((o), lit, sizeof lit - 1)

static void out_str(out_t *o, const char *s) { out_put(o, s, strlen(s)); }

/* Unchecked writes into reserved room: each returns the end of its bytes. */
static inline char *put(char *w, const void *s, size_t n) {
  memcpy(w, s, n);
  return w + n;
}
#define PUT_LIT(w, lit) put((w), lit, sizeof lit - 1)

/* v in base 10 or 16: at most 20 digits. */
static inline char *put_uint(char *w, uint64_t v, unsigned base) {
  size_t n = 1;
  for (uint64_t t = v; t >= base; t /= base)
    n++;
  for (size_t i = n; i-- > 0; v /= base)
    w[i] = "0123456789abcdef"[v % base];
  return w + n;
}

static void out_uint(out_t *o, uint64_t v, unsigned base) {
  char *w = out_reserve(o, 20);
  if (w != NULL)
    o->len = (size_t)(put_uint(w, v, base) - o->p);
}

static void out_done(out_t *o) {
  if (o->scratch)
    scratch_busy = false;
  else
    free(o->p);
}

/* Room for a response of at most need bytes: in place when it can be (no
 * promise to attach), else in a buffer written on as one message. */
static inline char *out_start(out_t *o, nr_ctx_t *ctx, size_t need,
                              nr_promise_t *p) {
  char *w = p == NULL ? nr_ctx_write_reserve(ctx, need) : NULL;
  if (w != NULL) {
    *o = (out_t){.p = w, .cap = need, .direct = true};
    return w;
  }
  out_init(o);
  return out_reserve(o, need);
}

/* ---- the handler ------------------------------------------------------------------------ */

#define RING 64
enum { F_HEAD = 1, F_CLOSE = 2, F_HTTP10 = 4, F_FAILED = 8 };
enum { S_NONE, S_CHUNKED, S_RAW, S_DISCARD };

/* What the connection waits for, as its timeouts see it: W_NONE for the
 * server (a request is being answered, or the codec holds input until the
 * client reads: no timeout runs), the client's first request (W_FRESH),
 * its next one (W_IDLE), the rest of a request head (W_HEAD), the next
 * bytes of a body (W_BODY). */
enum { W_NONE, W_FRESH, W_IDLE, W_HEAD, W_BODY, NWAITS };

typedef struct wait_list_s wait_list_t;
typedef struct profile_s profile_t;

struct nr_http_server_s {
  nr_http_parser_t parser;
  nr_ctx_t *ctx;
  uint64_t delivered;         /* requests delivered: the last one's token */
  unsigned outstanding;       /* delivered, not yet answered */
  unsigned oldest;            /* ring index of the oldest of those */
  uint8_t flags[RING];
  int pending_error;          /* status to answer once nothing is owed */
  int stream;                 /* a streamed response is open: how */
  bool stream_close;          /* close when that stream ends */
  bool closing;               /* answered the last request: read nothing */
  bool continue_owed;         /* a "100 Continue" waits for responses */
  bool overflow;              /* too many unanswered requests */
  int depth;                  /* inside read */
  bool dead;                  /* removed during read: free when it returns */
  bool paused;                /* auto_read turned off while unwritable */
  bool held;                  /* parsing paused while unwritable */
  bool started;               /* the first wait (W_FRESH) began */
  uint8_t wait;               /* W_*: what the connection waits for */
  nr_codec_resume_t *resume;  /* a queued task parses what is held */
  uint64_t timeout[3];        /* header, body, keep-alive (ns; 0: none) */
  profile_t *prof;            /* its loop's wait lists for those timeouts */
  wait_list_t *list;          /* the list it is in, or NULL */
  nr_http_server_t *prev, *next;   /* in that list */
  uint64_t since;             /* when it joined it (coarse_now) */
};

nr_http_server_t *nr_http_server_new(const nr_http_server_opts_t *o) {
  nr_http_server_t *s = calloc(1, sizeof *s);
  if (s == NULL)
    return NULL;
  nr_http_parser_init(&s->parser, o->max_header, o->max_body, o->max_headers);
  s->timeout[0] = o->header_timeout;
  s->timeout[1] = o->body_timeout;
  s->timeout[2] = o->keepalive_timeout;
  return s;
}

/* ---- timeouts ----
 *
 * No connection has a timer of its own. Connections that wait for their
 * clients are kept in FIFO lists, one per kind of wait and timeout value
 * on each loop (a profile: the lists of the loops' connections that share
 * header, body and keep-alive timeouts -- usually all of them). A
 * connection joins the tail of its list when its wait begins (watch), so
 * each list is in deadline order: it needs one loop timer, armed for its
 * head's deadline. When that fires, the heads whose deadline passed are
 * answered 408 (a head or body) or closed silently (an idle connection),
 * and the timer is armed again for the next head.
 *
 * Activity touches no timer: a connection that stops waiting (a request
 * delivered: W_NONE) stays in its list until it waits again -- when it
 * moves to the tail of a list -- or until its old deadline passes, when
 * the timer finds it waiting for something else and drops it. A timer
 * armed for a head that has since left merely fires early.
 *
 * So a pipelined keep-alive connection costs, per read: a byte store per
 * request (deliver), and when its answers are all written and nothing is
 * buffered, one read of the coarse clock (vDSO, no TSC) and a move to the
 * tail of the idle list (a few pointer stores). No allocation, no heap
 * operation: the loop's timer heap holds one timer per list, not one per
 * connection, and each fires about once per timeout while the list is
 * busy.
 *
 * Lifetime: a profile is counted by the connections using it, and by a
 * list timer while it runs (an expiry may free connections); the last
 * one cancels its timers (on the loop thread: they cannot fire
 * afterwards) and frees it. A connection leaves its list before it is
 * freed, and when its channel goes inactive. An expiry runs with the
 * connection's `depth` raised, as a read does, so a removal meanwhile
 * frees it only once the expiry is done with it. */

struct wait_list_s {
  nr_http_server_t *head, *tail;   /* oldest first: by deadline */
  uint64_t limit;             /* each waits this long (0: none) */
  nr_timer_t *timer;          /* armed while not empty, maybe early */
  profile_t *prof;
  uint8_t wait;               /* W_* of its members */
};

struct profile_s {
  nr_loop_t *loop;
  uint64_t timeout[3];        /* as nr_http_server_t's */
  unsigned refs;
  wait_list_t list[NWAITS];   /* by W_* (W_NONE's is unused) */
  profile_t *next;            /* the thread's profiles */
};

static _Thread_local profile_t *profiles;

/* The monotonic clock to within the kernel's tick (a few ms, and never
 * ahead of nr_now): cheap enough to read once per read burst. Timeouts
 * may so end up to one tick early. */
static uint64_t coarse_now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC_COARSE, &ts);
  return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static profile_t *profile_get(nr_loop_t *loop, const uint64_t timeout[3]) {
  assert(nr_loop_in_thread(loop));
  profile_t *p;
  for (p = profiles; p != NULL; p = p->next)
    if (p->loop == loop && memcmp(p->timeout, timeout, sizeof p->timeout) == 0)
      break;
  if (p == NULL && (p = calloc(1, sizeof *p)) != NULL) {
    p->loop = loop;
    memcpy(p->timeout, timeout, sizeof p->timeout);
    static const int which[NWAITS] = {-1, 0, 2, 0, 1};  /* W_* -> timeout */
    for (int w = W_FRESH; w < NWAITS; w++)
      p->list[w] = (wait_list_t){.limit = timeout[which[w]], .prof = p,
                                 .wait = (uint8_t)w};
    p->next = profiles;
    profiles = p;
  }
  if (p != NULL)
    p->refs++;
  return p;
}

static void profile_put(profile_t *p) {
  if (--p->refs > 0)
    return;
  for (int w = W_FRESH; w < NWAITS; w++) {
    assert(p->list[w].head == NULL);
    if (p->list[w].timer != NULL) {
      nr_timer_cancel(p->list[w].timer);
      nr_timer_release(p->list[w].timer);
    }
  }
  profile_t **pp = &profiles;
  while (*pp != p)
    pp = &(*pp)->next;
  *pp = p->next;
  free(p);
}

static void unlist(nr_http_server_t *s) {
  wait_list_t *l = s->list;
  if (l == NULL)
    return;
  *(s->prev ? &s->prev->next : &l->head) = s->next;
  *(s->next ? &s->next->prev : &l->tail) = s->prev;
  s->list = NULL;
}

static int on_list_timer(void *arg);

static void arm(wait_list_t *l, uint64_t delay) {
  l->timer = nr_loop_schedule(l->prof->loop, delay, 0, on_list_timer, NULL, l);
}

/* The connection begins to wait for its client (w): it joins the tail of
 * its list, which then needs a timer if it has none. */
static void watch(nr_http_server_t *s, int w) {
  s->wait = (uint8_t)w;
  if (s->prof == NULL)
    return;                    /* no timeouts, or no loop */
  wait_list_t *l = &s->prof->list[w];
  unlist(s);
  if (l->limit == 0)
    return;
  s->since = coarse_now();
  s->prev = l->tail;
  s->next = NULL;
  *(l->tail ? &l->tail->next : &l->head) = s;
  l->tail = s;
  s->list = l;
  if (l->timer == NULL) {      /* (its head is s, or older during an expiry) */
    uint64_t end = l->head->since + l->limit;
    arm(l, end > s->since ? end - s->since : 0);
  }
}

/* What the connection waits for now that the server owes nothing more or
 * a read has been parsed: the rest of a request, or the next one. A head
 * is timed from its first byte (however slowly the rest drips in), a body
 * from its last read, an idle time from its start. */
static NOINLINE void settle(nr_http_server_t *s) {
  if (s->closing || s->outstanding > 0 || s->held || s->pending_error) {
    s->wait = W_NONE;
  } else if (nr_buf_len(&s->parser.in) == 0) {
    if (s->wait != W_IDLE && s->wait != W_FRESH)
      watch(s, W_IDLE);
  } else if (s->parser.phase == P_HEAD) {
    if (s->wait != W_HEAD)
      watch(s, W_HEAD);
  } else {
    watch(s, W_BODY);
  }
}

static void send_error(nr_http_server_t *s, int status);
static void server_free(nr_http_server_t *s);

/* The wait ran out: a request half sent gets 408, an idle connection is
 * closed silently (nginx does both). */
static void expire(nr_http_server_t *s) {
  s->depth++;
  if (s->wait == W_HEAD || s->wait == W_BODY) {
    send_error(s, 408);
  } else {
    s->closing = true;
    nr_ctx_close(s->ctx, NULL);
  }
  if (--s->depth == 0 && s->dead)
    server_free(s);
}

/* A list's timer: expire the heads whose deadline passed (dropping those
 * that wait for something else now), then arm for the next one. */
static int on_list_timer(void *arg) {
  wait_list_t *l = arg;
  profile_t *p = l->prof;
  nr_timer_release(l->timer);  /* this one: the loop holds its own */
  l->timer = NULL;
  p->refs++;                   /* an expiry may free the last connection */
  uint64_t now = nr_now();
  nr_http_server_t *s;
  while ((s = l->head) != NULL && s->since + l->limit <= now) {
    unlist(s);
    if (s->wait == l->wait && !s->closing && s->depth == 0 &&
        nr_channel_is_open(nr_ctx_channel(s->ctx)))
      expire(s);
  }
  if (l->head != NULL && l->timer == NULL)
    arm(l, l->head->since + l->limit - now);
  profile_put(p);
  return 0;
}

/* The first wait, for the first request: from when the channel is
 * active, on its loop's lists. */
static void start(nr_http_server_t *s) {
  nr_channel_t *ch = nr_ctx_channel(s->ctx);
  if (s->started || !nr_channel_is_active(ch))
    return;
  s->started = true;
  nr_loop_t *loop = nr_channel_loop(ch);
  if (loop != NULL && (s->timeout[0] | s->timeout[1] | s->timeout[2]) != 0)
    s->prof = profile_get(loop, s->timeout);
  watch(s, W_FRESH);
}

static void server_free(nr_http_server_t *s) {
  unlist(s);
  if (s->prof != NULL)
    profile_put(s->prof);
  nr_codec_resume_cancel(s->resume);
  nr_http_parser_free(&s->parser);
  free(s);
}

void nr_http_server_added(nr_ctx_t *ctx) {
  nr_http_server_t *s = nr_ctx_state(ctx);
  s->ctx = ctx;
  start(s);
}

void nr_http_server_removed(nr_ctx_t *ctx) {
  nr_http_server_t *s = nr_ctx_state(ctx);
  if (s->outstanding > 0)     /* nobody will answer them through us */
    nr_channel_unhold(nr_ctx_channel(ctx));
  if (s->paused)              /* the reads it stopped are not its to keep */
    nr_channel_set_option(nr_ctx_channel(ctx), "auto_read", 1);
  if (s->depth > 0)
    s->dead = true;
  else
    server_free(s);
}

int nr_http_server_active(nr_ctx_t *ctx) {
  start(nr_ctx_state(ctx));
  nr_ctx_fire_active(ctx);
  return 0;
}

int nr_http_server_inactive(nr_ctx_t *ctx) {
  nr_http_server_t *s = nr_ctx_state(ctx);
  s->closing = true;          /* nothing more to read, nothing to time */
  s->wait = W_NONE;
  unlist(s);
  nr_ctx_fire_inactive(ctx);
  return 0;
}

static int write_out(nr_ctx_t *ctx, out_t *o, const char *body, size_t blen,
                     nr_promise_t *p) {
  int rc;
  if (o->direct) {            /* in place: a body too big to copy follows */
    nr_ctx_write_commit(ctx, o->len);
    if (blen == 0)
      return 0;
    nr_bytes_t b = NR_BYTES(body, blen);
    return nr_ctx_write(ctx, &b, p);
  }
  if (o->failed) {
    rc = nr_raise(-ENOMEM, "http_server: out of memory encoding a response");
  } else if (blen == 0) {
    nr_bytes_t b = NR_BYTES(o->p, o->len);
    rc = nr_ctx_write(ctx, &b, p);
  } else {
    nr_slice_t v[2] = {{o->p, o->len}, {body, blen}};
    nr_slices_t sl = {NR_MSG_SLICES, v, 2};
    rc = nr_ctx_write(ctx, &sl, p);
  }
  out_done(o);
  return rc;
}

/* The status line plus Server and Date (each unless the user gives it) at
 * w, in room for status_room(reason) bytes. The usual case -- a standard
 * reason, both headers -- is copied from a per-thread prefix rebuilt when
 * the second or the status changes. */
enum { U_SERVER = 1, U_DATE = 2, U_LENGTH = 4, U_CONN = 8, U_CLOSE = 16 };

static size_t status_room(const char *reason) {
  /* "HTTP/1.1 NNN " reason CRLF, Server, Date: 68 bytes besides the reason,
   * and no standard reason is longer than 31 */
  return 68 + (reason ? strlen(reason) : 31);
}

/* The status line, and Server unless the user gives it. */
static char *put_line(char *w, int status, const char *reason, unsigned user) {
  w = PUT_LIT(w, "HTTP/1.1 ");
  *w++ = (char)('0' + status / 100 % 10);
  *w++ = (char)('0' + status / 10 % 10);
  *w++ = (char)('0' + status % 10);
  *w++ = ' ';
  reason = reason ? reason : nr_http_reason(status);
  w = put(w, reason, strlen(reason));
  w = PUT_LIT(w, "\r\n");
  if (!(user & U_SERVER))
    w = PUT_LIT(w, "Server: netrun\r\n");
  return w;
}

static char *put_date(char *w, const char *date) {
  w = PUT_LIT(w, "Date: ");
  w = put(w, date, 29);
  return PUT_LIT(w, "\r\n");
}

static char *put_status(char *w, int status, const char *reason,
                        unsigned user) {
  static _Thread_local char prefix[160];
  static _Thread_local size_t prefix_len;
  static _Thread_local int prefix_status;
  static _Thread_local const char *prefix_date;
  static _Thread_local time_t prefix_sec = -1;
  const char *date = nr_http_date();
  bool plain = reason == NULL && !(user & (U_SERVER | U_DATE));
  if (plain && status == prefix_status && date == prefix_date &&
      date_sec == prefix_sec)
    return put(w, prefix, prefix_len);
  char *start = w;
  w = put_line(w, status, reason, user);
  if (!(user & U_DATE))
    w = put_date(w, date);
  if (plain && (size_t)(w - start) <= sizeof prefix) {
    prefix_len = (size_t)(w - start);
    memcpy(prefix, start, prefix_len);
    prefix_status = status;
    prefix_date = date;
    prefix_sec = date_sec;
  }
  return w;
}

/* How long a connection that got an error response may go on sending
 * before it is closed anyway. */
#define ERROR_LINGER NR_SEC(2)

static int linger_done(void *arg) {
  nr_channel_close(arg, NULL);
  nr_channel_release(arg);
  return 0;
}

static int linger_cancelled(void *arg) {
  nr_channel_release(arg);
  return 0;
}

/* The error response left (the write's promise succeeded): half-close;
 * or it cannot: close. */
static void error_sent(nr_promise_t *p, void *arg) {
  nr_channel_t *ch = arg;
  int fd = nr_channel_fd(ch);
  if (!nr_promise_is_success(p) ||
      (nr_channel_is_open(ch) && (fd < 0 || shutdown(fd, SHUT_WR) != 0)))
    nr_channel_close(ch, NULL);
  nr_channel_release(ch);
}

/* Closing a socket with unread input makes the kernel send a reset, which
 * can destroy the error response before the client reads it (a client
 * still uploading a body it was refused). So once the response has left
 * -- at once, or when the socket takes the rest of it (p, the write's
 * promise) -- half-close instead: the client sees the response and EOF,
 * and closes; its EOF closes the channel (what is still read meanwhile is
 * discarded). ERROR_LINGER after the error the channel closes anyway,
 * whether the response left or not (a client that reads nothing). Takes
 * p. */
static void close_after_error(nr_http_server_t *s, nr_promise_t *p) {
  nr_channel_t *ch = nr_ctx_channel(s->ctx);
  nr_timer_t *t = p == NULL ? NULL
                  : nr_loop_schedule(nr_channel_loop(ch), ERROR_LINGER, 0,
                                     linger_done, linger_cancelled,
                                     nr_channel_retain(ch));
  if (t == NULL) {
    if (p != NULL)
      nr_channel_release(ch);          /* the timer's reference */
    nr_ctx_close(s->ctx, NULL);
  } else {
    nr_timer_release(t);
    if (nr_promise_add_listener(p, NULL, error_sent, nr_channel_retain(ch)) < 0)
      nr_channel_release(ch);          /* the timer closes it */
  }
  if (p != NULL)
    nr_promise_release(p);
}

/* An answer of the codec's own: status, its reason as the plain-text body
 * (none to HEAD); p (or NULL) learns when it has left. */
static void write_status(nr_http_server_t *s, int status, bool close,
                         bool head, nr_promise_t *p) {
  out_t o;
  out_init(&o);
  const char *reason = nr_http_reason(status);
  nr_http_count_status(status);
  char *w = out_reserve(&o, status_room(NULL));
  if (w != NULL)
    o.len = (size_t)(put_status(w, status, NULL, 0) - o.p);
  OUT_LIT(&o, "Content-Type: text/plain\r\nContent-Length: ");
  out_uint(&o, strlen(reason) + 1, 10);
  if (close)
    OUT_LIT(&o, "\r\nConnection: close");
  OUT_LIT(&o, "\r\n\r\n");
  if (!head) {
    out_str(&o, reason);
    OUT_LIT(&o, "\n");
  }
  write_out(s->ctx, &o, NULL, 0, p);
}

static void send_error(nr_http_server_t *s, int status) {
  s->closing = true;
  nr_promise_t *p = nr_promise_new();
  write_status(s, status, true, false, p);
  nr_ctx_flush(s->ctx);
  close_after_error(s, p);
}

/* "100 Continue" for the request whose body is awaited. */
static void send_continue(nr_http_server_t *s) {
  static const char cont[] = "HTTP/1.1 100 Continue\r\n\r\n";
  nr_bytes_t b = NR_BYTES(cont, sizeof cont - 1);
  s->continue_owed = false;
  nr_ctx_write(s->ctx, &b, NULL);
  nr_ctx_flush(s->ctx);
}

/* A response was completed: forget its request, close, or answer a
 * pending error or send a "100 Continue" owed if that was the last
 * response owed before them. */
static inline void finish_response(nr_http_server_t *s, bool close);

/* A handler raised on the oldest request owed and left it unanswered: a
 * 500 answers it in its turn, so that no later answer is taken for it. An
 * answer it had begun (a stream) cannot end well: close. */
static void answer_failed(nr_http_server_t *s) {
  uint8_t f = s->flags[s->oldest];
  if (s->stream != S_NONE) {
    s->closing = true;
    nr_ctx_close(s->ctx, NULL);
    return;
  }
  bool close = (f & (F_CLOSE | F_HTTP10)) != 0;  /* 1.0: no keep-alive header */
  write_status(s, 500, close, f & F_HEAD, NULL);
  nr_ctx_flush(s->ctx);
  finish_response(s, close);
}

/* nr_handler_t.read_failed: the handlers raised on request `token`. */
void nr_http_server_read_failed(nr_ctx_t *ctx, uint64_t token) {
  nr_http_server_t *s = nr_ctx_state(ctx);
  uint64_t oldest = s->delivered - s->outstanding + 1;
  if (token < oldest || token > s->delivered || s->closing)
    return;                   /* answered already (exception_caught did) */
  s->flags[(s->oldest + (unsigned)(token - oldest)) % RING] |= F_FAILED;
  if (token == oldest)
    answer_failed(s);
}

static NOINLINE void finished(nr_http_server_t *s, bool close);

static inline void finish_response(nr_http_server_t *s, bool close) {
  s->oldest = (s->oldest + 1) % RING;
  if (--s->outstanding == 0)   /* (a close it brings waits for our return) */
    nr_channel_unhold(nr_ctx_channel(s->ctx));
  else if (!close && !(s->flags[s->oldest] & F_FAILED))
    return;                    /* the usual when pipelined: more are owed */
  finished(s, close);
}

/* What finish_response does besides forgetting the request. */
static NOINLINE void finished(nr_http_server_t *s, bool close) {
  if (close) {
    s->closing = true;
    /* a client may pipeline past the request that closes: what it sends
     * meanwhile must not turn our close into a reset that destroys the
     * answers it has not read yet */
    nr_channel_linger(nr_ctx_channel(s->ctx));
    nr_ctx_flush(s->ctx);
    nr_ctx_close(s->ctx, NULL);
  } else if (s->outstanding > 0) {
    if (s->flags[s->oldest] & F_FAILED)
      answer_failed(s);       /* its turn came */
  } else if (s->pending_error) {
    send_error(s, s->pending_error);
  } else if (s->continue_owed) {
    send_continue(s);
  } else if (s->depth == 0) {
    settle(s);                 /* (inside a read, feed settles at its end) */
  }
}

static int deliver(void *arg, int ev, nr_http_request_t *req) {
  nr_http_server_t *s = arg;
  nr_channel_t *ch = nr_ctx_channel(s->ctx);
  if (ev == NR_HTTP_EV_CONTINUE) {
    if (s->outstanding > 0)
      s->continue_owed = true;   /* after the responses owed before it */
    else
      send_continue(s);
    return !nr_channel_is_open(ch);
  }
  if (s->outstanding == RING) {
    s->overflow = true;
    return 1;
  }
  uint8_t f = (req->head ? F_HEAD : 0) | (req->keep_alive ? 0 : F_CLOSE) |
              (req->minor == 0 ? F_HTTP10 : 0);
  s->flags[(s->oldest + s->outstanding) % RING] = f;
  if (s->outstanding++ == 0)   /* a shutdown waits for the answers owed */
    nr_channel_hold(ch);
  s->wait = W_NONE;            /* the server's turn: no timeout runs */
  s->continue_owed = false;    /* it was for this request: its body came */
  /* Whether the handlers answer now or later, the next requests parse the
   * same, and a close stops them: they may take this one later -- unless
   * it may switch protocols, when what follows is theirs to read. */
  nr_ctx_fire_read_tokened(s->ctx, req, ++s->delivered, !req->switches);
  if (s->dead && req->switches && nr_channel_is_open(ch))
    return NR_HTTP_SWITCHED;   /* replaced by the new protocol's codec */
  if ((f & F_CLOSE) || s->dead || s->closing || !nr_channel_is_open(ch))
    return 1;
  if (!nr_channel_is_writable(ch)) {
    s->held = true;            /* the rest waits for the answers to drain */
    return NR_HTTP_PAUSE;
  }
  return 0;
}

/* A handler replaced the codec while it delivered an upgrade request
 * (a WebSocket, say): what the client sent after that request goes to the
 * codec that took its place, as Netty's decoders hand over their rest. */
static void handover(nr_http_server_t *s) {
  nr_buf_t *in = &s->parser.in;
  if (s->parser.stopped && nr_buf_len(in) > 0 &&
      nr_channel_is_open(nr_ctx_channel(s->ctx))) {
    nr_bytes_t b = NR_BYTES(nr_buf_peek(in), nr_buf_len(in));
    nr_ctx_fire_read(s->ctx, &b);
  }
}

/* Parse bytes (none: what is held); false if s was freed meanwhile. */
static bool feed(nr_http_server_t *s, const char *data, size_t len) {
  s->held = false;
  s->depth++;
  int rc = nr_http_feed(&s->parser, data, len, deliver, s);
  s->depth--;
  if (s->dead) {
    if (s->depth == 0) {
      handover(s);
      server_free(s);
    }
    return false;
  }
  if (s->overflow)
    rc = 503;
  if (rc > 1 && !s->closing && nr_channel_is_open(nr_ctx_channel(s->ctx))) {
    if (s->outstanding > 0)
      s->pending_error = rc;
    else
      send_error(s, rc);
  }
  if (s->depth == 0)
    settle(s);
  return true;
}

int nr_http_server_read(nr_ctx_t *ctx, void *msg) {
  nr_http_server_t *s = nr_ctx_state(ctx);
  if (nr_msg_type(msg) != NR_MSG_BYTES) {
    nr_ctx_fire_read(ctx, msg);
    return 0;
  }
  if (s->closing || s->parser.stopped)
    return 0;                /* after the last request: ignore the rest */
  if (s->depth > 0)
    return nr_raise(-EBUSY, "http_server: bytes fired into the codec while "
                    "it is delivering a request");
  const nr_bytes_t *b = msg;
  feed(s, b->data, b->len);
  return 0;
}

/* A response written wrongly is a programmer mistake: besides failing the
 * write's future (which Lua code rarely watches) it is reported to the
 * handlers after the codec, so exception_caught sees it. */
static int misuse(nr_ctx_t *ctx, const char *fmt, ...)
    __attribute__((format(printf, 2, 3), cold));
static int misuse(nr_ctx_t *ctx, const char *fmt, ...) {
  char msg[256];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  nr_err_t err = {-EINVAL, msg};
  nr_ctx_fire_exception(ctx, &err);
  return nr_raise(-EINVAL, "%s", msg);
}

/* What the user's headers set that netrun would otherwise add; *room gets
 * the bytes they take in the head. */
static unsigned user_flags(const nr_http_response_t *r, size_t *room) {
  unsigned u = 0;
  *room = 0;
  for (size_t i = 0; i < r->nheaders; i++) {
    const nr_http_header_t *h = &r->headers[i];
    *room += h->name_len + h->value_len + 4;
    switch (h->name_len) {
    case 4: u |= IEQ(h->name, 4, "date") ? U_DATE : 0; break;
    case 6: u |= IEQ(h->name, 6, "server") ? U_SERVER : 0; break;
    case 14: u |= IEQ(h->name, 14, "content-length") ? U_LENGTH : 0; break;
    case 10:
      if (IEQ(h->name, 10, "connection"))
        u |= U_CONN | (has_token(h->value, h->value_len, "close", 5) ? U_CLOSE : 0);
      break;
    }
  }
  return u;
}

/* Connection: close beside any Connection the user set (in a list, close
 * wins); keep-alive for an HTTP/1.0 client that keeps the connection. */
static char *put_connection(char *w, uint8_t f, unsigned user, bool close) {
  if (close && !(user & U_CLOSE))
    return PUT_LIT(w, "Connection: close\r\n");
  if (!close && !(user & U_CONN) && (f & F_HTTP10))
    return PUT_LIT(w, "Connection: keep-alive\r\n");
  return w;
}

static char *put_headers(char *w, const nr_http_response_t *r) {
  for (size_t i = 0; i < r->nheaders; i++) {
    const nr_http_header_t *h = &r->headers[i];
    w = put(w, h->name, h->name_len);
    w = PUT_LIT(w, ": ");
    w = put(w, h->value, h->value_len);
    w = PUT_LIT(w, "\r\n");
  }
  return w;
}

static bool bodyless_status(int status) {
  return status < 200 || status == 204 || status == 304;
}

/* The rest of the head after the status prefix, into room reserved for
 * it: framing, Connection, the user's headers, the blank line. */
static char *put_head(char *w, const nr_http_response_t *r, uint8_t f,
                      unsigned user, bool bodyless, bool close) {
  if (r->stream) {
    if (!bodyless && !(f & F_HTTP10))
      w = PUT_LIT(w, "Transfer-Encoding: chunked\r\n");
  } else if (!bodyless && !(user & U_LENGTH)) {
    w = PUT_LIT(w, "Content-Length: ");
    w = put_uint(w, r->body_len, 10);
    w = PUT_LIT(w, "\r\n");
  }
  w = put_connection(w, f, user, close);
  w = put_headers(w, r);
  return PUT_LIT(w, "\r\n");
}

/* Room for what put_head writes besides the user's headers, and a first
 * chunk's size line and CRLF: 38 + 24 + 2 + 20 bytes at most. */
#define HEAD_FIXED 128

/* A response may be written: no stream open, a request to answer. */
static int check_turn(nr_http_server_t *s, nr_ctx_t *ctx) {
  if (s->stream != S_NONE)
    return misuse(ctx, "http_server: a response written while a streamed "
                  "one is open (end it with \"\" or false)");
  if (s->outstanding == 0)
    return misuse(ctx, "http_server: a response with no request to answer");
  return 0;
}

/* Whether the response to the oldest request (flags f) closes the
 * connection: the request asked, or the user's headers say so. (An error
 * answer waiting behind it follows it, and closes.) */
static bool closes(uint8_t f, unsigned user) {
  return (f & F_CLOSE) || (user & U_CLOSE);
}

static NOINLINE int write_response(nr_http_server_t *s, nr_ctx_t *ctx,
                                   const nr_http_response_t *r,
                                   nr_promise_t *p) {
  int rc = check_turn(s, ctx);
  if (rc < 0)
    return rc;
  if (r->status < 100 || r->status > 999)
    return misuse(ctx, "http_server: bad status %d", r->status);
  nr_http_count_status(r->status);
  uint8_t f = s->flags[s->oldest];
  size_t need;
  unsigned user = user_flags(r, &need);
  bool close = closes(f, user) ||
               (r->stream && (f & F_HTTP10));  /* no chunked in 1.0: the
                                                  close ends the body */
  bool bodyless = bodyless_status(r->status);
  bool no_body = bodyless || (f & F_HEAD);
  const char *body = no_body ? NULL : r->body;
  size_t blen = no_body || body == NULL ? 0 : r->body_len;
  /* the body given with a stream goes as its first chunk; a small one is
   * copied (one copy now beats a second slice) */
  bool chunk = r->stream && blen > 0 && !(f & F_HTTP10);
  size_t copy = chunk || blen <= 4096 ? blen : 0;
  need += status_room(r->reason) + HEAD_FIXED + copy;
  out_t o;
  char *w = out_start(&o, ctx, need, p);
  if (w != NULL) {
    w = put_status(w, r->status, r->reason, user);
    w = put_head(w, r, f, user, bodyless, close);
    if (chunk) {
      w = put_uint(w, blen, 16);
      w = PUT_LIT(w, "\r\n");
    }
    if (copy > 0)
      w = put(w, body, copy);
    if (chunk)
      w = PUT_LIT(w, "\r\n");
    o.len = (size_t)(w - o.p);
  }
  rc = write_out(ctx, &o, body, blen - copy, p);
  if (rc < 0)
    return rc;
  if (r->stream) {
    s->stream = no_body ? S_DISCARD : (f & F_HTTP10) ? S_RAW : S_CHUNKED;
    s->stream_close = close;
  } else {
    finish_response(s, close);
  }
  return 0;
}

/* ---- prepared responses ---- */

/* A prepared response's bytes are what most writes send as they are: the
 * status line, Server, a Date line (its value is filled in per write,
 * unless the user's headers have a Date), Content-Length, the user's
 * headers, the blank line and the body. Only a Connection line, when one
 * is needed, goes in between (before the blank line); HEAD stops at the
 * blank line. */

/* Room for what nr_http_prepare writes besides the reason, the user's
 * headers and the body: "HTTP/1.1 NNN " and CRLF, Server (16), Date (37),
 * Content-Length (38 at most), the blank line. */
#define PREP_FIXED 112
#define DATE_LEN 29           /* an IMF-fixdate */

size_t nr_http_prepared_size(const nr_http_response_t *r) {
  size_t room;
  user_flags(r, &room);
  return sizeof(nr_http_prepared_t) + PREP_FIXED +
         strlen(r->reason ? r->reason : nr_http_reason(r->status)) + room +
         r->body_len;
}

void nr_http_prepare(const nr_http_response_t *r, nr_http_prepared_t *out) {
  size_t room;
  unsigned user = user_flags(r, &room);
  char *w = out->bytes;
  w = put_line(w, r->status, r->reason, user);
  out->date_at = 0;
  if (!(user & U_DATE)) {
    out->date_at = (uint32_t)(w - out->bytes) + 6;
    w = put_date(w, nr_http_date());
  }
  if (!bodyless_status(r->status) && !(user & U_LENGTH)) {
    w = PUT_LIT(w, "Content-Length: ");
    w = put_uint(w, r->body_len, 10);
    w = PUT_LIT(w, "\r\n");
  }
  w = put_headers(w, r);
  out->head_len = (uint32_t)(w - out->bytes);
  w = PUT_LIT(w, "\r\n");
  if (r->body_len > 0)
    memcpy(w, r->body, r->body_len);
  out->body_len = (uint32_t)r->body_len;
  /* what a keep-alive HTTP/1.1 GET gets: every byte but a big body's */
  bool bodyless = bodyless_status(r->status);
  out->plain_len = (user & U_CLOSE) || (!bodyless && r->body_len > 4096) ? 0
                   : out->head_len + 2 + (bodyless ? 0 : out->body_len);
  out->type = NR_MSG_HTTP_PREPARED;
  out->status = r->status;
  out->user = user;
}

/* A prepared response: its bytes, with the date and a Connection line put
 * in, the body copied when small, left out for HEAD. */
static NOINLINE int write_prepared(nr_http_server_t *s, nr_ctx_t *ctx,
                                   const nr_http_prepared_t *pr,
                                   nr_promise_t *p) {
  int rc = check_turn(s, ctx);
  if (rc < 0)
    return rc;
  uint8_t f = s->flags[s->oldest];
  bool close = closes(f, pr->user);
  nr_http_count_status(pr->status);
  bool no_body = bodyless_status(pr->status) || (f & F_HEAD);
  size_t head = pr->head_len, blen = no_body ? 0 : pr->body_len;
  size_t copy = blen <= 4096 ? blen : 0;
  const char *body = pr->bytes + head + 2;
  out_t o;
  /* Connection: 26 at most */
  char *w = out_start(&o, ctx, head + 26 + 2 + copy, p);
  if (w != NULL) {
    w = put(w, pr->bytes, head);
    w = put_connection(w, f, pr->user, close);
    w = put(w, pr->bytes + head, 2 + copy);
    if (pr->date_at != 0)
      memcpy(o.p + pr->date_at, nr_http_date(), DATE_LEN);
    o.len = (size_t)(w - o.p);
  }
  rc = write_out(ctx, &o, body, blen - copy, p);
  if (rc < 0)
    return rc;
  finish_response(s, close);
  return 0;
}

/* The usual case of write_prepared -- a keep-alive HTTP/1.1 GET's turn, no
 * stream open, no error waiting, no promise -- is the bytes as they are and
 * the date, encoded in place in the outbound buffer: straight-line code
 * with nothing to decide. 1 when it is not that case. */
static inline int write_plain(nr_http_server_t *s, nr_ctx_t *ctx,
                              const nr_http_prepared_t *pr, nr_promise_t *p) {
  if (s->outstanding == 0 || s->flags[s->oldest] != 0 || s->stream ||
      s->pending_error || pr->plain_len == 0 || p != NULL)
    return 1;
  char *w = nr_ctx_write_reserve(ctx, pr->plain_len);
  if (w == NULL)
    return 1;
  memcpy(w, pr->bytes, pr->plain_len);
  if (pr->date_at != 0)
    memcpy(w + pr->date_at, nr_http_date(), DATE_LEN);
  nr_ctx_write_commit(ctx, pr->plain_len);
  nr_http_count_status(pr->status);
  finish_response(s, false);
  return 0;
}

/* A byte write while a stream is open: one chunk, or the end. */
static NOINLINE int write_chunk(nr_http_server_t *s, nr_ctx_t *ctx,
                                void *msg, nr_promise_t *p) {
  size_t total = 0, n = 1;
  nr_slice_t one, *parts = &one;
  if (nr_msg_type(msg) == NR_MSG_BYTES) {
    one = (nr_slice_t){((nr_bytes_t *)msg)->data, ((nr_bytes_t *)msg)->len};
  } else {
    nr_slices_t *sl = msg;
    parts = (nr_slice_t *)sl->v;
    n = sl->n;
  }
  for (size_t i = 0; i < n; i++)
    total += parts[i].len;
  int rc = 0;
  if (total == 0) {
    int how = s->stream;
    s->stream = S_NONE;
    if (how == S_CHUNKED) {
      nr_bytes_t end = NR_BYTES("0\r\n\r\n", 5);
      rc = nr_ctx_write(ctx, &end, p);
    } else if (p) {
      nr_promise_set_success(p, NULL, NULL);
    }
    finish_response(s, s->stream_close);
    return rc;
  }
  if (s->stream == S_DISCARD) {
    if (p)
      nr_promise_set_success(p, NULL, NULL);
    return 0;
  }
  if (s->stream == S_RAW)
    return nr_ctx_write(ctx, msg, p);
  char size[24];
  int sl = snprintf(size, sizeof size, "%zx\r\n", total);
  nr_slice_t small[18], *v = n + 2 <= 18 ? small : malloc((n + 2) * sizeof *v);
  if (v == NULL)
    return nr_raise(-ENOMEM, "http_server: out of memory");
  v[0] = (nr_slice_t){size, (size_t)sl};
  memcpy(v + 1, parts, n * sizeof *v);
  v[n + 1] = (nr_slice_t){"\r\n", 2};
  nr_slices_t out = {NR_MSG_SLICES, v, n + 2};
  rc = nr_ctx_write(ctx, &out, p);
  if (v != small)
    free(v);
  return rc;
}

int nr_http_server_write(nr_ctx_t *ctx, void *msg, nr_promise_t *p) {
  nr_http_server_t *s = nr_ctx_state(ctx);
  int type = nr_msg_type(msg);
  if (type == NR_MSG_HTTP_PREPARED)
    return write_plain(s, ctx, msg, p) == 0 ? 0
           : write_prepared(s, ctx, msg, p);
  if (type == NR_MSG_HTTP_RESPONSE)
    return write_response(s, ctx, msg, p);
  if (s->stream != S_NONE && (type == NR_MSG_BYTES || type == NR_MSG_SLICES))
    return write_chunk(s, ctx, msg, p);
  return nr_ctx_write(ctx, msg, p);  /* raw bytes pass through */
}

/* A client that sends requests and does not read the answers: once the
 * channel turns unwritable (its outbound buffer above write_buffer_high)
 * the codec stops reading (auto_read off) and parses nothing past the
 * request just delivered (deliver); once the buffer has drained below
 * write_buffer_low it reads again, and a task parses what it held and
 * fires read_complete, as a read would. So the answers it owes cannot
 * grow without bound. Only an auto_read the codec finds on is turned off,
 * and back on. */
static void parse_held(void *state, nr_ctx_t *ctx) {
  nr_http_server_t *s = state;
  if (s->held && s->depth == 0 && !s->closing &&
      nr_channel_is_open(nr_ctx_channel(ctx)) && feed(s, NULL, 0))
    nr_ctx_fire_read_complete(ctx);      /* as after a read: handlers flush */
}

int nr_http_server_writability(nr_ctx_t *ctx) {
  nr_http_server_t *s = nr_ctx_state(ctx);
  if (nr_codec_throttle(nr_ctx_channel(ctx), &s->paused) && s->held)
    nr_codec_resume(ctx, s, &s->resume, parse_held);
  nr_ctx_fire_writability_changed(ctx);
  return 0;
}

const nr_handler_t nr_http_server_handler = {
    .type = "http_server", .added = nr_http_server_added, .removed = nr_http_server_removed,
    .active = nr_http_server_active, .inactive = nr_http_server_inactive,
    .read = nr_http_server_read, .writability_changed = nr_http_server_writability,
    .write = nr_http_server_write, .read_failed = nr_http_server_read_failed};

/* ---- shared with the client codec (http_parse.h) ---------------------------------- */

int nr__http_parse_field(nr_http_header_t *h, const char *s, size_t len,
                         size_t *ip) {
  return parse_field(h, s, len, ip);
}

bool nr__http_ieq(const char *a, size_t n, const char *lit, size_t ln) {
  return ieq(a, n, lit, ln);
}

bool nr__http_next_item(const char *v, size_t n, size_t *i, size_t *t0,
                        size_t *t1) {
  return next_item(v, n, i, t0, t1);
}

bool nr__http_has_token(const char *v, size_t n, const char *tok, size_t tn) {
  return has_token(v, n, tok, tn);
}

void nr__http_chunks_start(nr_http_parser_t *p, size_t at) {
  p->phase = P_CHUNK_SIZE;
  p->head_len = p->pos = at;
  p->chunk_left = 0;
}

long nr__http_decode_chunks(nr_http_parser_t *p, const char *s, size_t n) {
  return decode_chunks(p, s, n);
}
