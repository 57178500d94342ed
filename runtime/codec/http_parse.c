/*
 * http_parse.c -- the HTTP/1.1 request parser of http.h (nr_http_feed):
 * pure functions over bytes, and the byte-level helpers the client codec
 * shares (http_parse.h). Any thread; a parser is used by one at a time.
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
}

enum { P_HEAD, P_BODY, P_CHUNK_SIZE, P_CHUNK_DATA, P_CHUNK_CRLF, P_TRAILER };

/* Bytes allowed in a chunk-size line (size, extensions) before it is
 * called malformed. */
#define CHUNK_LINE_MAX 1024

/* ---- character classes ------------------------------------------------------- */

/* One table lookup per byte classifies it: C_TOKEN an RFC 9110 tchar (ALPHA
 * DIGIT and !#$%&'*+-.^_`|~), C_VALUE a field-value byte (VCHAR, obs-text,
 * SP, HTAB), C_TARGET a request-target byte (VCHAR, obs-text), C_PATH one
 * of those but '?', C_HOST a byte of an RFC 3986 reg-name or IPv4 address
 * (unreserved, sub-delims, '%'), C_DIGIT a decimal digit (a port). The
 * table is built by the compiler from these rules. */
enum { C_TOKEN = 1, C_VALUE = 2, C_TARGET = 4, C_PATH = 8, C_HOST = 16,
       C_DIGIT = 32 };
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
                (HOSTC(c) ? C_HOST : 0) |                                 \
                ((c) >= '0' && (c) <= '9' ? C_DIGIT : 0))
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
static inline size_t run8(const char *s, size_t i, size_t n, int c) {
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

#if defined(__SSE2__) && !defined(NR_HTTP_PORTABLE)
/* Sixteen bytes at a time where SSE2 is there (every x86-64): the same
 * runs, and names, a few instructions a block finding the bytes that
 * may end one (the table judges those). Built with -DNR_HTTP_PORTABLE,
 * the eight-byte code above does it all (the tests run both). */
#include <emmintrin.h>
#define HTTP_SSE2 1

static inline __m128i load16(const char *s) {
  return _mm_loadu_si128((const __m128i *)(const void *)s);
}

/* The digits of x, and its letters, as bytes of all ones. */
static inline __m128i digits16(__m128i x) {
  __m128i d = _mm_sub_epi8(x, _mm_set1_epi8('0'));
  return _mm_cmpeq_epi8(_mm_min_epu8(d, _mm_set1_epi8(9)), d);
}

static inline __m128i letters16(__m128i x) {
  __m128i a = _mm_sub_epi8(_mm_or_si128(x, _mm_set1_epi8(0x20)),
                           _mm_set1_epi8('a'));   /* OR 0x20: a letter's
                                                     lowercase, and no other
                                                     byte becomes one */
  return _mm_cmpeq_epi8(_mm_min_epu8(a, _mm_set1_epi8(25)), a);
}

/* The letters, digits and '-' of x, a bit each: the bytes of most names. */
static inline unsigned name_bits(__m128i x) {
  __m128i h = _mm_cmpeq_epi8(x, _mm_set1_epi8('-'));
  return (unsigned)_mm_movemask_epi8(
      _mm_or_si128(_mm_or_si128(digits16(x), letters16(x)), h));
}

/* The bytes of x that may be outside class c, a bit each. C_TOKEN: all
 * but letters, digits and '-'. C_VALUE, C_TARGET, C_PATH, in three
 * instructions or four: those below 0x20 or 0x21 as signed bytes
 * (controls, SP for a target, and obs-text), DEL, and '?' for a path --
 * exact but for obs-text, and HTAB in a value. */
static inline unsigned flags16(__m128i x, int c) {
  if (c == C_TOKEN)
    return ~name_bits(x) & 0xffff;
  __m128i m = _mm_cmplt_epi8(x, _mm_set1_epi8(c == C_VALUE ? 0x20 : 0x21));
  m = _mm_or_si128(m, _mm_cmpeq_epi8(x, _mm_set1_epi8(0x7f)));
  if (c == C_PATH)
    m = _mm_or_si128(m, _mm_cmpeq_epi8(x, _mm_set1_epi8('?')));
  return (unsigned)_mm_movemask_epi8(m);
}

/* run8's answer (span's for C_TOKEN), sixteen bytes a step, a flagged
 * byte looked up in the table. The last bytes short of sixteen are judged
 * in the block ending at n, the bits of the bytes already judged shifted
 * out. */
static inline size_t run(const char *s, size_t i, size_t n, int c) {
  const unsigned char *u = (const unsigned char *)s;
  for (;;) {
    unsigned m;
    if (i + 16 <= n)
      m = flags16(load16(s + i), c);
    else if (n >= 16)
      m = flags16(load16(s + n - 16), c) >> (i - (n - 16));
    else
      return c == C_TOKEN ? span(s, i, n, c) : run8(s, i, n, c);
    if (m == 0) {
      i += 16;               /* (past n only when the block was the last) */
      if (i >= n)
        return n;
      continue;
    }
    i += (size_t)__builtin_ctz(m);
    if (!(cls[u[i]] & c))
      return i;
    i++;
  }
}
#define tokens(s, i, n) run((s), (i), (n), C_TOKEN)
#else
#define run run8
#define tokens(s, i, n) span((s), (i), (n), C_TOKEN)
#endif

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

/* The same, a word at a time, for bytes a parsed line holds (a name's
 * tchars, a value's bytes: no control byte but HTAB) and a literal of four
 * bytes or more made of lowercase letters, digits and '-'. OR 0x20 then
 * lowercases a letter and maps no other such byte onto one of the
 * literal's (onto '-' only CR, onto a digit only controls, none there).
 * The last word overlaps the one before when the length is not a multiple
 * of it. */
static inline uint64_t word_at(const char *s, size_t w) {
  uint32_t x4;
  uint64_t x8;
  if (w == 4)
    return memcpy(&x4, s, 4), x4;
  return memcpy(&x8, s, 8), x8;
}

static inline bool ieq_lit(const char *a, size_t n, const char *lit,
                           size_t ln) {
  if (n != ln)
    return false;
  if (ln < 4)
    return ieq(a, n, lit, ln);
  size_t w = ln < 8 ? 4 : 8;
  for (size_t k = 0;; k += w) {
    if (k + w > ln)
      k = ln - w;
    if ((word_at(a + k, w) | 0x2020202020202020ull >> (64 - 8 * w)) !=
        word_at(lit + k, w))
      return false;
    if (k + w == ln)
      return true;
  }
}
#define IEQ(a, n, lit) ieq_lit((a), (n), lit, sizeof lit - 1)

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

/* ---- the request-target ------------------------------------------------------- */

static int hexval(int c) {
  return c >= '0' && c <= '9' ? c - '0'
         : c >= 'a' && c <= 'f' ? c - 'a' + 10
         : c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1;
}

/* RFC 3986 unreserved: ALPHA DIGIT - . _ ~ (what percent-encoding never
 * changes the meaning of, 6.2.2.2). */
static bool unreserved(int c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ||
         (c >= '0' && c <= '9') || c == '-' || c == '.' || c == '_' || c == '~';
}

/* Is the segment s[0 .. n) "." or ".."? */
static bool dot_segment(const char *s, size_t n) {
  return (n == 1 && s[0] == '.') || (n == 2 && s[0] == '.' && s[1] == '.');
}

/* Does the segment s[0 .. n) (its %XX in upper case) hold a dot segment
 * once its encoded slashes (%2F, and %5C, a slash to some backends) are
 * decoded? */
static bool hides_dots(const char *s, size_t n) {
  size_t from = 0;
  bool slashed = false;
  for (size_t i = 0; i + 3 <= n; i++) {
    if (s[i] != '%' || s[i + 1] != (s[i + 2] == 'F' ? '2' : '5') ||
        (s[i + 2] != 'F' && s[i + 2] != 'C'))
      continue;
    if (dot_segment(s + from, i - from))
      return true;
    slashed = true;
    from = i + 3;
    i += 2;
  }
  return slashed && dot_segment(s + from, n - from);
}

/* The path s[0 .. n) (it begins with '/') normalized into out (room for n
 * bytes), as nginx does before matching locations (ngx_http_parse_complex_uri)
 * but without decoding what would change the path's meaning: %XX of an
 * unreserved byte decoded (so "%2e%2E" is ".."), other %XX kept with
 * upper-case digits (%2F stays an encoded slash, not a separator);
 * then dot segments resolved (RFC 3986 5.2.4: "/a/./b/../c" is "/a/c",
 * "/a/.." is "/a/") and empty segments merged ("//" is "/", nginx's
 * merge_slashes). Its length, or -400: '#' (no fragment in a request),
 * a '%' without two hex digits, %00 (nginx refuses these three too), a
 * path that climbs above the root (as nginx), or a segment that holds a
 * dot segment behind an encoded slash ("/public/..%2Fadmin": a backend
 * that decodes %2F, nginx among them, would resolve it, past a rule that
 * saw "/public/..."). */
static long normalize_path(const char *s, size_t n, char *out) {
  static const char hex[] = "0123456789ABCDEF";
  size_t m = 0;
  for (size_t i = 0; i < n; i++) {
    int c = (unsigned char)s[i], hi, lo;
    if (c == '#')
      return -400;
    if (c != '%') {
      out[m++] = (char)c;
      continue;
    }
    if (n - i < 3 || (hi = hexval((unsigned char)s[i + 1])) < 0 ||
        (lo = hexval((unsigned char)s[i + 2])) < 0 || (hi | lo) == 0)
      return -400;
    i += 2;
    if (unreserved(hi << 4 | lo)) {
      out[m++] = (char)(hi << 4 | lo);
    } else {
      out[m++] = '%';
      out[m++] = hex[hi];
      out[m++] = hex[lo];
    }
  }
  /* segments, in place: w <= r, and out[0 .. w) ends with '/' but after
   * the last segment */
  size_t w = 1, r = 1;
  while (r <= m) {
    const char *e = memchr(out + r, '/', m - r);
    size_t end = e ? (size_t)(e - out) : m, len = end - r;
    if (len == 2 && out[r] == '.' && out[r + 1] == '.') {
      if (w == 1)
        return -400;          /* above the root */
      for (w--; out[w - 1] != '/'; w--)
        ;                     /* drop the last segment, keep its '/' */
    } else if (len > 0 && !(len == 1 && out[r] == '.')) {
      if (hides_dots(out + r, len))
        return -400;
      memmove(out + w, out + r, len);
      w += len;
      if (end < m)
        out[w++] = '/';
    }                         /* ("" and "." leave nothing) */
    r = end + 1;
  }
  return (long)w;
}

/* Room for n bytes of normalized path: 0 or -500. */
static int norm_room(nr_http_parser_t *p, size_t n) {
  if (p->norm_cap >= n)
    return 0;
  char *b = realloc(p->norm, n);
  if (b == NULL)
    return -500;
  p->norm = b;
  p->norm_cap = n;
  return 0;
}

/* r's path from the origin-form path t[0 .. n): t itself when it is
 * normal already, else its normalized form (p->norm). 0 or a status. */
static int origin_path(nr_http_parser_t *p, nr_http_request_t *r,
                       const char *t, size_t n) {
  if (norm_room(p, n) < 0)
    return 500;
  long m = normalize_path(t, n, p->norm);
  if (m < 0)
    return (int)-m;
  if ((size_t)m == n && memcmp(p->norm, t, n) == 0) {
    r->path = t;
    r->path_len = n;
  } else {
    r->path = p->norm;
    r->path_len = (size_t)m;
    r->rewritten = true;
  }
  return 0;
}

static bool method_is(const nr_http_request_t *r, const char *m, size_t n) {
  return r->method_len == n && memcmp(r->method, m, n) == 0;
}

static bool valid_host(const char *v, size_t n);

/* The length of an RFC 3986 scheme at t[0 .. n) followed by "://" (the
 * form an absolute http(s) URI has), or 0. */
static size_t scheme_len(const char *t, size_t n) {
  size_t k = 0;
  if (n == 0 || !((t[0] | 0x20) >= 'a' && (t[0] | 0x20) <= 'z'))
    return 0;
  while (k < n && (((t[k] | 0x20) >= 'a' && (t[k] | 0x20) <= 'z') ||
                   (t[k] >= '0' && t[k] <= '9') || t[k] == '+' ||
                   t[k] == '-' || t[k] == '.'))
    k++;
  return n - k >= 3 && memcmp(t + k, "://", 3) == 0 ? k : 0;
}

/* Where an absolute-form target's authority lies in its part before '?'
 * (t[0 .. n)): *a0 .. *a1 (the path follows at *a1); false if t is not
 * one: scheme "://" authority, with no userinfo (RFC 9110 4.2.4) and a
 * valid host. */
static bool absolute_form(const char *t, size_t n, size_t *a0, size_t *a1) {
  size_t k = scheme_len(t, n);
  if (k == 0)
    return false;
  *a0 = k + 3;
  const char *slash = memchr(t + *a0, '/', n - *a0);
  *a1 = slash ? (size_t)(slash - t) : n;
  return *a1 > *a0 && memchr(t + *a0, '@', *a1 - *a0) == NULL &&
         valid_host(t + *a0, *a1 - *a0);
}

/* A target that is not a plain path (parse_request_line said ODD; r->path
 * holds its part before any '?'): origin-form with a path to normalize;
 * "*" (asterisk-form: OPTIONS only); authority-form (CONNECT only, as it
 * came); else absolute-form, whose path becomes r->path ("/" when empty;
 * its authority becomes the Host once the fields are parsed:
 * authority_host). 0 or a status. */
static int target_form(nr_http_parser_t *p, nr_http_request_t *r) {
  const char *t = r->path;
  size_t n = r->path_len, a0, a1;
  if (n > 0 && t[0] == '/')
    return origin_path(p, r, t, n);
  if (n == 1 && t[0] == '*')
    return method_is(r, "OPTIONS", 7) && r->query == NULL ? 0 : 400;
  if (method_is(r, "CONNECT", 7))
    return r->query == NULL && valid_host(t, n) ? 0 : 400;
  if (!absolute_form(t, n, &a0, &a1))
    return 400;
  if (a1 == n) {
    r->path = "/";
    r->path_len = 1;
    r->rewritten = true;
    return 0;
  }
  return origin_path(p, r, t + a1, n - a1);
}

/* An absolute-form target's authority is the request's Host (RFC 9112
 * 3.2.2: the Host field sent beside it is ignored): it replaces that
 * field's value, or is added for an HTTP/1.0 request that sent none. 0
 * (and nothing done for another form) or 431 (no room for the field). */
static bool named_host(const nr_http_header_t *h);

static NOINLINE int authority_host(nr_http_parser_t *p, nr_http_request_t *r) {
  size_t a0, a1, tn = r->query ? (size_t)(r->query - 1 - r->target)
                               : r->target_len;
  if (r->target[0] == '/' || method_is(r, "CONNECT", 7) ||
      !absolute_form(r->target, tn, &a0, &a1))
    return 0;
  const char *a = r->target + a0;
  size_t n = a1 - a0;
  r->rewritten = true;         /* (a field out of its line's order) */
  for (size_t i = 0; i < r->nheaders; i++)
    if (r->headers[i].name_len == 4 && named_host(&r->headers[i])) {
      r->headers[i].value = a;
      r->headers[i].value_len = n;
      return 0;
    }
  if (r->nheaders == p->max_headers)
    return 431;
  r->headers[r->nheaders++] = (nr_http_header_t){"Host", a, 4, n};
  r->trailers = r->headers + r->nheaders;
  return 0;
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
    if ((rc = target_form(p, r)) != 0)
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
    rc = authority_host(p, r);
  return rc ? -rc : (long)end;
}

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
  if (v > p->max_body - nr_buf_len(&p->body))
    return -413;
  p->chunk_left = v;
  p->phase = P_CHUNK_DATA;
  return STEP;
}

/* P_CHUNK_DATA: what there is of the chunk, into the body. */
static long chunk_data(nr_http_parser_t *p, const char *s, size_t n) {
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
  size_t end = find_block_end(p, s, n);
  if (end == 0)
    return n - p->pos > p->max_header ? -431 : 0;
  if (end - p->pos > p->max_header)
    return -431;
  return (long)end;
}

/* Decode chunks from s[p->pos .. n): 0 need more, -status, or the offset
 * just past the trailer section. */
static long decode_chunks(nr_http_parser_t *p, const char *s, size_t n) {
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
  const char *s = cum ? nr_buf_peek(&p->in) : data;
  size_t n = cum ? nr_buf_len(&p->in) : len, off = 0;
  /* Between requests (phase P_HEAD, no head search under way), as the
   * parser is after each request: known here, where the compiler could
   * not know it of p after a callback that may reach p. */
  bool between = p->phase == P_HEAD && p->scan == 0;
  while (off < n) {
    if (between && (off = skip_blank(s, off, n)) == n)
      break;
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
    next_request(p);
    between = true;
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
  return p->phase == P_HEAD ? 0 : p->phase == P_BODY ? p->content_length
                                                     : p->max_body;
}
