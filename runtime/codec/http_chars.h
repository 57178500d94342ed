/*
 * http_chars.h -- what the HTTP parser's files (http_parse.c,
 * http_chunked.c) share: its phases and bounds, the byte classes and the
 * word and SIMD scans built on them (static inline, so each scan compiles
 * into its caller's loop). Private to the HTTP codec; pure functions.
 */
#ifndef NR_CODEC_HTTP_CHARS_H
#define NR_CODEC_HTTP_CHARS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

/* ---- the parser's phases and bounds (http_parse.c, http_chunked.c) ---- */

enum { P_HEAD, P_BODY, P_CHUNK_SIZE, P_CHUNK_DATA, P_CHUNK_CRLF, P_TRAILER,
       P_SBODY };            /* P_SBODY: a streamed body of known length */

/* Bytes allowed in a chunk-size line (size, extensions) before it is
 * called malformed. */
#define CHUNK_LINE_MAX 1024

/* The largest length a message may state (RFC 9112 leaves the bound to
 * the recipient; past int64 no peer agrees on it, so it is malformed, not
 * merely too large). */
#define LENGTH_MAX ((uint64_t)INT64_MAX)

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

static __attribute__((unused)) int lower(int c) { return c >= 'A' && c <= 'Z' ? c + 32 : c; }

/* Case-insensitive equality with a lowercase literal. */
static __attribute__((unused)) bool
ieq(const char *a, size_t n, const char *lit, size_t ln) {
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

#endif /* NR_CODEC_HTTP_CHARS_H */
