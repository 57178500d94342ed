/*
 * http_parse.c -- the HTTP/1.1 request parser of http.h (nr_http_feed):
 * pure functions over bytes, and the byte-level helpers the client codec
 * shares (http_parse.h). Any thread; a parser is used by one at a time.
 * Streamed bodies (body = "stream") are http_parse_stream.c's, chunked
 * framing http_chunked.c's.
 *
 * Parsing. A request is parsed in place from the bytes fed to it: when a
 * whole request sits in one read, nothing is copied or allocated. When it
 * does not, the unparsed tail (from the request's first byte) goes to the
 * cumulation `in` and parsing resumes there; the header block is then
 * simply re-parsed (cheap, and it keeps every pointer valid whatever the
 * buffer did), while the progress through a body is kept as offsets from
 * the request's start. Chunked bodies are decoded into `body`. A complete
 * header block is validated and split in one pass (a byte class table,
 * and request targets, field values and names sixteen bytes at a time with
 * SSE2, eight without; the usual Host line judged at a glance); the
 * block's end is searched for on its own only while it is incomplete or
 * after a bad line.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "codec/http.h"
#include "codec/http_parse.h"

/* The HTTP messages, registered as the program loads (netrun.h). */
__attribute__((constructor)) static void declare_types(void) {
  nr_msg_declare(NR_MSG_HTTP_REQUEST, "http_request");
  nr_msg_declare(NR_MSG_HTTP_RESPONSE, "http_response");
  nr_msg_declare(NR_MSG_HTTP_PREPARED, "http_prepared");
  nr_msg_declare(NR_MSG_HTTP_BODY, "http_body");
}

#include "codec/http_chars.h"

bool nr_http_is_token(const char *s, size_t n) {
  return n > 0 && span(s, 0, n, C_TOKEN) == n;
}

bool nr_http_is_field_value(const char *s, size_t n) {
  return run(s, 0, n, C_VALUE) == n;
}

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
 * find_block_end. Inlined into its callers: a request has a line or more
 * of it, and the call with its stores of h and *ip cost about 25
 * instructions a request (bench/instr.sh). */
static inline __attribute__((always_inline)) int
parse_field(nr_http_header_t *h, const char *s, size_t len, size_t *ip) {
  size_t n0 = *ip, n1, i;
  if (len - n0 >= 6 && memcmp(s + n0, "Host: ", 6) == 0) {
    n1 = n0 + 4;             /* the field every request has, at a glance */
    i = n0 + 6;
  } else {
    n1 = i = tokens(s, n0, len);
    if (i == n0 || i >= len || s[i] != ':')
      return 400;            /* empty name, space before ':', obs-fold */
    i++;
  }
  /* (each loop's first test is one compare for the usual byte) */
  if (i < len && s[i] == ' ')
    i++;
  while (i < len && (unsigned char)s[i] <= ' ' &&
         (s[i] == ' ' || s[i] == '\t'))
    i++;
  size_t v0 = i, v1 = i = run(s, i, len, C_VALUE);
  if (len - i >= 2 && memcmp(s + i, "\r\n", 2) == 0)
    *ip = i + 2;
  else if (i < len && s[i] == '\n')
    *ip = i + 1;
  else
    return 400;              /* a control byte, or a bare CR */
  while (v1 > v0 && (unsigned char)s[v1 - 1] <= ' ' &&
         (s[v1 - 1] == ' ' || s[v1 - 1] == '\t'))
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

#define NOINLINE __attribute__((noinline))

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

/* Whether the path at s[t0 .. q) is one handlers may take as it came:
 * origin-form with no '%', '#', dot segment or empty segment (nothing for
 * target_form to do). Loose, as a filter may be: "/.well-known", '!',
 * '"', '$', '&' and '\'' go the long way too (the SSE2 test takes the
 * bytes that are 0x27 once ORed with 6), and come back unchanged. For the
 * path "/" one compare; else sixteen bytes a step where SSE2 is there,
 * each byte with the one before it (before t0: the SP after the method),
 * the flags gathered and tested once; the bytes past the last whole block
 * of the input one by one. */
static inline bool odd_pair(char prev, char c) {
  return c == '%' || c == '#' || (prev == '/' && (c == '.' || c == '/'));
}

#ifdef HTTP_SSE2
/* The bytes of x that make a path odd (loosely, see plain_path), a byte
 * of all ones each; prev is x one byte earlier. */
static inline __m128i odd16(__m128i x, __m128i prev) {
  __m128i slash = _mm_cmpeq_epi8(prev, _mm_set1_epi8('/'));
  __m128i dot_slash = _mm_cmpeq_epi8(_mm_or_si128(x, _mm_set1_epi8(1)),
                                     _mm_set1_epi8('/'));   /* '.' or '/' */
  __m128i pct_hash = _mm_cmpeq_epi8(_mm_or_si128(x, _mm_set1_epi8(6)),
                                    _mm_set1_epi8(0x27));   /* '%', '#' (and
                                                               !"$&') */
  return _mm_or_si128(pct_hash, _mm_and_si128(slash, dot_slash));
}
#endif

static inline bool plain_path(const char *s, size_t t0, size_t q, size_t len) {
  (void)len;                 /* (SSE2 only) */
  if (q - t0 == 1)
    return s[t0] == '/';     /* "/": benchmarks, health checks */
  if (s[t0] != '/')
    return false;
  size_t i = t0 + 1;
#ifdef HTTP_SSE2
  __m128i acc = _mm_setzero_si128();
  for (; i + 16 <= q; i += 16)
    acc = _mm_or_si128(acc, odd16(load16(s + i), load16(s + i - 1)));
  unsigned m = (unsigned)_mm_movemask_epi8(acc);
  if (i < q && i + 16 <= len) {       /* the rest, in a block that ends
                                          past q (the line goes on) */
    m |= (unsigned)_mm_movemask_epi8(odd16(load16(s + i), load16(s + i - 1))) &
         ((1u << (q - i)) - 1);
    i = q;
  }
  if (m != 0)
    return false;
#endif
  for (; i < q; i++)
    if (odd_pair(s[i - 1], s[i]))
      return false;
  return true;
}

/* parse_request_line's "the line is good, but its target is not a plain
 * path": target_form judges it. */
#define ODD (-2)

/* The request line at s[0 .. len): METHOD SP target SP HTTP/1.x CRLF.
 * 0 when it is whole and good (*ip just past it), ODD when its target is
 * not a plain path (plain_path), NEED when every byte so far may still
 * begin a good line, else the status refusing it -- decided at its first
 * bad byte, not at the line's end, so garbage is refused without waiting
 * for more. A line that parses with some len parses the same with any
 * larger one. */
static int parse_request_line(nr_http_request_t *r, const char *s, size_t len,
                              size_t *ip) {
  size_t i;
  if (len >= 4 && memcmp(s, "GET ", 4) == 0) {
    i = 3;                   /* GET, the usual method, in one compare */
    r->head = r->switches = false;
  } else {
    i = span(s, 0, len, C_TOKEN);
    if (i == len || (len == 1 && s[0] == '\r'))
      return NEED;           /* (a CR may begin a blank line, skipped) */
    if (i == 0 || s[i] != ' ')
      return 400;
    r->head = i == 4 && memcmp(s, "HEAD", 4) == 0;
    r->switches = i == 7 && memcmp(s, "CONNECT", 7) == 0;
  }
  r->method = s;
  r->method_len = i++;
  size_t t0 = i, q = run(s, i, len, C_PATH);   /* q: '?' or the end */
  if (q < len && s[q] == ' ' && q > t0) {
    i = q;                   /* the usual: a path, no query */
    r->query = NULL;
    r->query_len = 0;
  } else {
    i = q < len && s[q] == '?' ? run(s, q + 1, len, C_TARGET) : q;
    if (i == len)
      return NEED;
    if (q == t0 || s[i] != ' ')
      return 400;            /* no target, or no path before its query */
    r->query = s + q + 1;    /* (q < i: there is a query) */
    r->query_len = i - q - 1;
  }
  r->path = r->target = s + t0;
  r->path_len = q - t0;
  r->target_len = i - t0;
  r->rewritten = false;
  bool plain = plain_path(s, t0, q, len);
  i++;
  if (len - i >= 10 && memcmp(s + i, "HTTP/1.1\r\n", 10) == 0) {
    r->minor = 1;            /* the usual case, in two compares */
    *ip = i + 10;
    return plain ? 0 : ODD;
  }
  int rc = parse_version(r, s, len, i, ip);
  return rc == 0 && !plain ? ODD : rc;
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
    i = span(v, i + 1, n, C_DIGIT);
  return i == n;
}

#ifdef HTTP_SSE2
/* The bytes of x that may be in the usual Host (letters, digits, '.',
 * '-', ':'), a bit each, with its ':' and its digits. */
static inline uint64_t host_bits(__m128i x, uint64_t *colon, uint64_t *digit) {
  __m128i d = digits16(x), a = letters16(x);
  __m128i c = _mm_cmpeq_epi8(x, _mm_set1_epi8(':'));
  __m128i o = _mm_or_si128(_mm_cmpeq_epi8(x, _mm_set1_epi8('.')),
                           _mm_cmpeq_epi8(x, _mm_set1_epi8('-')));
  *colon = (uint64_t)_mm_movemask_epi8(c);
  *digit = (uint64_t)_mm_movemask_epi8(d);
  o = _mm_or_si128(_mm_or_si128(o, c), _mm_or_si128(d, a));
  return (uint64_t)_mm_movemask_epi8(o);
}

/* The usual Host line's value at v, in one pass: its length when it is
 * letters, digits, '.' and '-' (a name or IPv4 address), then maybe ':'
 * and digits (a port), at most 31 bytes, ended by CRLF -- valid, and with
 * nothing to trim; else NOT_PLAIN, and the line is parsed the long way.
 * v + 17 <= end. */
#define NOT_PLAIN ((size_t)-1)
static inline size_t host_line(const char *v, const char *end) {
  uint64_t colon, digit, c2, d2, ok = host_bits(load16(v), &colon, &digit);
  if (ok == 0xffff) {
    if (end - v < 34)
      return NOT_PLAIN;
    ok |= host_bits(load16(v + 16), &c2, &d2) << 16;
    colon |= c2 << 16;
    digit |= d2 << 16;
  }
  size_t e = (size_t)__builtin_ctzll(~ok);     /* the first other byte */
  if (e == 32 || memcmp(v + e, "\r\n", 2) != 0)
    return NOT_PLAIN;
  uint64_t lanes = (1ull << e) - 1;
  colon &= lanes;
  uint64_t port = lanes & ~((colon & -colon) * 2 - 1);   /* past the first
                                                           ':', if any */
  return (port & ~digit) == 0 ? e : NOT_PLAIN;
}
#endif

/* Is h named Host? Every request has one, so a word compare: OR 0x20
 * lowercases a letter and maps no other byte onto one of "host". */
static inline bool named_host(const nr_http_header_t *h) {
  uint32_t w;
  memcpy(&w, h->name, 4);
  uint32_t host;
  memcpy(&host, "host", 4);
  return (w | 0x20202020u) == host;
}

/* For http_target.c: the checks above, out of line. */
bool nr__http_valid_host(const char *v, size_t n) { return valid_host(v, n); }
bool nr__http_named_host(const nr_http_header_t *h) { return named_host(h); }

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
      if (IEQ(h->value, h->value_len, "keep-alive")) {
        *seen |= H_KEEP;     /* the usual, at a glance */
        break;
      }
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

/* Parse the header fields from s[i] (just past the request line, which
 * parse_request_line put in r with what its method says) into r, up to the
 * blank line ending the block, and decide how the body is framed: one pass,
 * each byte looked at once. Returns the offset just past that blank line, or
 * 0 when the block has not all arrived (p->scan then holds where its last
 * line began); *rc gets 0 or the status of the first bad line, and when the
 * block is whole and good *body whether a body follows (chunked, or a
 * Content-Length above 0). At a bad line the rest is only searched for the
 * block's end, as an incomplete or oversized block is judged before its
 * lines. Idempotent: run again after the input moved. */
static size_t parse_head(nr_http_parser_t *p, nr_http_request_t *r,
                         const char *s, size_t n, size_t i, int *rc,
                         bool *body) {
  r->type = NR_MSG_HTTP_REQUEST;
  r->token = 0;                 /* the server codec's, when it fires it */
  r->pipeline = NULL;
  r->expect_continue = r->chunked = false;
  r->body = "";
  r->body_len = 0;
  p->content_length = 0;
  *rc = 0;
  unsigned seen = 0;
  size_t nh = 0, max = p->max_headers;     /* (kept in registers) */
  for (;;) {
#ifdef HTTP_SSE2
    /* The first Host line, as most requests send it: in one pass (the
     * long way below judges any other, and every error) */
    size_t e;
    if (n - i >= 23 && memcmp(s + i, "Host: ", 6) == 0 && !(seen & H_HOST) &&
        nh < max && (e = host_line(s + i + 6, s + n)) != NOT_PLAIN) {
      r->headers[nh++] = (nr_http_header_t){s + i, s + i + 6, 4, e};
      seen |= H_HOST;
      i += 6 + e + 2;
      continue;
    }
#endif
    /* A name starts with a tchar: one compare tells most lines from the
     * blank one ("\r\n" or "\n"; a lone CR fails as a field). */
    if (i < n && (unsigned char)s[i] <= '\r') {
      if (n - i >= 2 && memcmp(s + i, "\r\n", 2) == 0) {
        i += 2;
        break;
      }
      if (s[i] == '\n') {
        i++;
        break;
      }
    }
    size_t ls = i;
    nr_http_header_t h;
    if ((*rc = parse_field(&h, s, n, &i)) == 0) {
      if (nh == max) {
        *rc = 431;
      } else {
        r->headers[nh++] = h;
        *rc = framing(p, r, &h, &seen);
      }
    }
    if (*rc != 0) {
      r->nheaders = nh;
      p->scan = ls;
      return find_block_end(p, s, n);
    }
  }
  r->nheaders = nh;
  r->ntrailers = 0;
  r->trailers = r->headers + nh;
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
  *body = (seen & (H_CHUNKED | H_LENGTH)) &&
          ((seen & H_CHUNKED) || p->content_length != 0);
  return i;
}

/* The request line and header block at s[0 .. n): the block's length when it
 * is whole and good (r filled in, *body set as parse_head sets it), 0 when
 * more is needed, or -status. The request line is judged as soon as it is
 * whole (within max_header), so garbage gets its 400 without waiting; the
 * fields once the block is. */
static long parse_block(nr_http_parser_t *p, nr_http_request_t *r,
                        const char *s, size_t n, bool *body) {
  size_t i, max = p->max_header, first = n < max ? n : max;
  int rc;
  /* Resumed (the line was judged good before): search on from where the
   * last call stopped, so a slow block is scanned once. */
  if (p->line_ok && find_block_end(p, s, n) == 0)
    return n > max ? -431 : 0;
  bool odd = false;            /* the target was not a plain path */
  if ((rc = parse_request_line(r, s, first, &i)) != 0) {
    if (rc != ODD)
      return rc != NEED ? -rc : n >= max ? -431 : 0;
    if ((rc = nr__http_target_form(p, r)) != 0)
      return -rc;            /* (refused at once, as a bad line is) */
    odd = true;
  }
  size_t end = parse_head(p, r, s, n, i, &rc, body);
  if (end == 0) {
    p->line_ok = true;
    return n > max ? -431 : 0;
  }
  if (end > max)
    return -431;
  if (__builtin_expect(odd, 0) && rc == 0)
    rc = nr__http_authority_host(p, r);
  return rc ? -rc : (long)end;
}

/* ---- one request ---------------------------------------------------------------- */

/* Parse one request at s[0 .. n): its length when complete (req is then
 * filled in), 0 when more input is needed, or -status. `between`: the
 * parser is between requests (so in P_HEAD). */
static long parse_one(nr_http_parser_t *p, nr_http_request_t *req,
                      const char *s, size_t n, bool between) {
  int rc = 0;
  /* the head parsed before: again, in place (it cannot fail this time) */
  bool again = !between && p->phase != P_HEAD;
  bool body = false;          /* (set when the head is whole and good) */
  long end = parse_block(p, req, s, again ? p->head_len : n, &body);
  if (end <= 0)
    return end;
  if (!again) {
    if (!body)
      return end;            /* the usual: no body */
    if (p->stream)
      return nr__http_stream_head(p, req, end);
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
  end = nr__http_decode_chunks(p, s, n);
  if (end <= 0)
    return end;
  /* p->pos stayed where the trailer section began */
  if ((rc = nr__http_parse_trailers(p, req, s, p->pos, (size_t)end)) != 0)
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
  free(p->norm);
  p->norm = NULL;
  p->norm_cap = 0;
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
    p->sbody = false;
    p->piece_len = 0;
    if (p->body.data != NULL)
      nr_buf_free(&p->body);
  }
}

static NOINLINE void free_norm(nr_http_parser_t *p) {
  free(p->norm);
  p->norm = NULL;
  p->norm_cap = 0;
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
  free_norm(p);
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
  req.stream = 0;
  const char *s = cum ? nr_buf_peek(&p->in) : data;
  size_t n = cum ? nr_buf_len(&p->in) : len, off = 0;
  /* Between requests (phase P_HEAD, no head search under way), as the
   * parser is after each request: known here, where the compiler could
   * not know it of p after a callback that may reach p. */
  bool between = p->phase == P_HEAD && p->scan == 0;
  while (off < n) {
    if (p->sbody) {            /* a streamed body's next piece */
      bool piece = false;
      long r = nr__http_stream_piece(p, &req, s + off, n - off, &piece);
      if (__builtin_expect(r < 0, 0))
        return stop(p, (int)-r);
      off += (size_t)r;
      if (!piece)
        break;               /* framing split across reads: wait */
      int halt = cb(arg, NR_HTTP_EV_BODY, &req);
      nr__http_stream_piece_done(p);
      if (req.last) {
        next_request(p);
        between = true;
      }
      if (__builtin_expect(halt != 0, 0)) {
        if (halt == NR_HTTP_PAUSE)
          break;
        return stop(p, 1);
      }
      continue;
    }
    if (between && (off = skip_blank(s, off, n)) == n)
      break;
    req.streaming = false;
    long r = parse_one(p, &req, s + off, n - off, between);
    if (__builtin_expect(r < 0, 0))
      return stop(p, (int)-r);
    if (__builtin_expect(r == 0, 0)) {
      if (p->phase != P_HEAD && req.expect_continue && !p->continue_sent) {
        p->continue_sent = true;
        if (cb(arg, NR_HTTP_EV_CONTINUE, &req))
          return stop(p, 1);
      }
      break;
    }
    int halt = cb(arg, NR_HTTP_EV_REQUEST, &req);
    if (req.streaming) {
      between = false;         /* its body follows */
      p->scan = 0;
    } else {
      next_request(p);
      between = true;
    }
    off += (size_t)r;
    if (__builtin_expect(halt != 0, 0)) {
      if (halt == NR_HTTP_PAUSE)
        break;
      if (halt == NR_HTTP_SWITCHED)
        return switched(p, s, off, n, cum);
      return stop(p, 1);
    }
  }
  if (cum)
    nr_buf_consume(&p->in, off);
  else if (off < n && nr_buf_append(&p->in, s + off, n - off) < 0)
    return stop(p, 500);
  if (__builtin_expect(p->norm != NULL, 0))
    free_norm(p);              /* its requests were delivered: an idle
                                  connection holds no buffer */
  return 0;
}

/* ---- shared with the client codec (http_parse.h) ---------------------------------- */

size_t nr__http_find_block_end(nr_http_parser_t *p, const char *s, size_t n) {
  return find_block_end(p, s, n);
}

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

bool nr__http_parsing_head(const nr_http_parser_t *p) {
  return p->phase == P_HEAD;
}

int nr__http_reserve_body(nr_http_parser_t *p) {
  if (p->phase != P_BODY || nr_buf_len(&p->in) == 0 ||
      p->content_length > SIZE_MAX - p->head_len)
    return 0;
  return nr_buf_reserve(&p->in, p->head_len + (size_t)p->content_length);
}

uint64_t nr__http_body_bound(const nr_http_parser_t *p) {
  return p->phase == P_HEAD || p->sbody ? 0
         : p->phase == P_BODY ? p->content_length : p->max_body;
}

bool nr__http_streaming_body(const nr_http_parser_t *p) { return p->sbody; }
