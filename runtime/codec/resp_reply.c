/*
 * resp_reply.c -- the RESP reply scanner, tokenizer and cluster key slot
 * (see resp_reply.h). Pure functions: any thread, no allocation.
 *
 * The scanner walks tokens: a header line (type byte, content, CRLF),
 * then for bulk types the data and its CRLF. It advances st->off only
 * past whole tokens, so an incomplete one is read again from its type
 * byte on the next call; bulk data is never scanned, only its length and
 * trailing CRLF checked. Aggregates push their element count on a stack;
 * each completed element pops finished levels, and when none is left the
 * reply is complete. Limits are checked on the header, before waiting for
 * the data it announces.
 */
#include <errno.h>
#include <string.h>

#include "resp_reply.h"

/* Reset a scan state: left[] is only read below depth, so it stays. */
static inline void reset(nr_resp_scan_t *st) {
  st->off = 0;
  st->depth = 0;
  st->attr = 0;
}

#define FAIL(code, msg)                                                      \
  do {                                                                       \
    *why = (msg);                                                            \
    reset(st);                                                               \
    return -(code);                                                          \
  } while (0)

/* A length or count: optional '-', then 1..18 digits (no more: nothing
 * real is that long, and 18 digits cannot overflow). */
static bool parse_len(const char *s, size_t n, int64_t *out) {
  bool neg = n > 0 && s[0] == '-';
  size_t i = neg ? 1 : 0;
  if (n == i || n - i > 18)
    return false;
  int64_t v = 0;
  for (; i < n; i++) {
    if (s[i] < '0' || s[i] > '9')
      return false;
    v = v * 10 + (s[i] - '0');
  }
  *out = neg ? -v : v;
  return true;
}

/* A 64-bit signed integer, the whole range, with an optional sign. */
static bool parse_i64(const char *s, size_t n, int64_t *out) {
  size_t i = 0;
  bool neg = false;
  if (n > 0 && (s[0] == '-' || s[0] == '+')) {
    neg = s[0] == '-';
    i = 1;
  }
  if (n == i || n - i > 19)
    return false;
  uint64_t v = 0, lim = neg ? (uint64_t)INT64_MAX + 1 : (uint64_t)INT64_MAX;
  for (; i < n; i++) {
    if (s[i] < '0' || s[i] > '9')
      return false;
    uint64_t d = (uint64_t)(s[i] - '0');
    if (v > (lim - d) / 10)
      return false;
    v = v * 10 + d;
  }
  *out = neg ? (int64_t)(0 - v) : (int64_t)v;
  return true;
}

static size_t skip_digits(const char *s, size_t i, size_t n) {
  while (i < n && s[i] >= '0' && s[i] <= '9')
    i++;
  return i;
}

/* RESP3's double: inf, -inf, nan, or [+-]digits[.digits][e[+-]digits]
 * (digits on at least one side of the point), at most 128 bytes so that
 * the builder can copy it for strtod. */
static bool valid_double(const char *s, size_t n) {
  if (n == 0 || n > 128)
    return false;
  if ((n == 3 && (memcmp(s, "inf", 3) == 0 || memcmp(s, "nan", 3) == 0)) ||
      (n == 4 && (memcmp(s, "-inf", 4) == 0 || memcmp(s, "+inf", 4) == 0 ||
                  memcmp(s, "-nan", 4) == 0)))
    return true;
  size_t i = s[0] == '-' || s[0] == '+' ? 1 : 0;
  size_t a = skip_digits(s, i, n), b = a;
  if (a < n && s[a] == '.')
    b = skip_digits(s, a + 1, n);
  if (a == i && b <= a + 1)                 /* no digit at all */
    return false;
  i = b;
  if (i < n && (s[i] == 'e' || s[i] == 'E')) {
    i++;
    if (i < n && (s[i] == '-' || s[i] == '+'))
      i++;
    size_t e = skip_digits(s, i, n);
    if (e == i)
      return false;
    i = e;
  }
  return i == n;
}

/* RESP3's big number: [+-]digits. */
static bool valid_big(const char *s, size_t n) {
  size_t i = n > 0 && (s[0] == '-' || s[0] == '+') ? 1 : 0;
  return i < n && skip_digits(s, i, n) == n;
}

/* The header line at q (avail bytes): the offset of its CR, 0 if it is
 * not all there yet, -1 if its content passes max_line, -2 if the CR is
 * not followed by LF. */
static long line_end(const char *q, size_t avail, size_t max_line) {
  size_t look = avail < max_line + 2 ? avail : max_line + 2;
  if (q[0] == '\r')
    return -2;                              /* no type byte */
  /* Most lines are short ("$3", "+OK", ":1"): look at a few bytes
   * before calling memchr. */
  size_t short_look = look < 8 ? look : 8;
  for (size_t i = 1; i < short_look; i++) {
    if (q[i] == '\r') {
      if (i + 1 == avail)
        return 0;
      return q[i + 1] == '\n' ? (long)i : -2;
    }
  }
  const char *cr = short_look < look ? memchr(q + short_look, '\r', look - short_look) : NULL;
  if (cr == NULL)
    return avail < max_line + 2 ? 0 : -1;
  size_t i = (size_t)(cr - q);
  if (i + 1 == avail)
    return 0;
  return cr[1] == '\n' ? (long)i : -2;
}

/* An element just completed: pop the aggregates it completed. True when
 * that completes the reply. */
static bool complete_element(nr_resp_scan_t *st) {
  while (st->depth > 0) {
    unsigned d = st->depth - 1;
    if (--st->left[d] > 0)
      return false;
    st->depth = d;
    if (st->attr >> d & 1)
      return false;                         /* metadata: its value follows */
  }
  return true;
}

/* An aggregate header with cnt elements (counted twice for pairs):
 * open a level for it. 1 if it is an element already (empty or null),
 * 0 if a level was opened (or an empty attribute read), -1 if too deep. */
static int open_aggregate(nr_resp_scan_t *st, char type, int64_t cnt,
                          size_t max_depth) {
  if (cnt <= 0)
    return type == '|' ? 0 : 1;
  if (st->depth >= max_depth)
    return -1;
  st->left[st->depth] = cnt;
  if (type == '|')
    st->attr |= (uint64_t)1 << st->depth;
  else
    st->attr &= ~((uint64_t)1 << st->depth);
  st->depth++;
  return 0;
}

long nr_resp_reply_scan(nr_resp_scan_t *st, const char *p, size_t n,
                        const nr_resp_reply_limits_t *lim, const char **why) {
  size_t max_reply = lim->max_reply ? lim->max_reply : NR_RESP_REPLY_MAX;
  size_t max_line = lim->max_line ? lim->max_line : NR_RESP_REPLY_MAX_LINE;
  size_t max_depth = lim->max_depth ? lim->max_depth : NR_RESP_REPLY_MAX_DEPTH;
  if (max_depth > NR_RESP_REPLY_DEPTH)
    max_depth = NR_RESP_REPLY_DEPTH;
  for (;;) {
    size_t off = st->off;
    if (off >= n)
      return 0;
    const char *q = p + off, *s = q + 1;
    long cr = line_end(q, n - off, max_line);
    if (cr == 0)
      return 0;
    if (cr == -1)
      FAIL(EMSGSIZE, "line too long");
    if (cr < 0)
      FAIL(EPROTO, "line without CRLF");
    size_t sl = (size_t)cr - 1, hl = (size_t)cr + 2, tok = hl;
    int64_t v;
    int elem = 1;
    switch (q[0]) {
    case '+': case '-':
      break;
    case ':':
      if (!parse_i64(s, sl, &v))
        FAIL(EPROTO, "invalid integer");
      break;
    case '_':
      if (sl != 0)
        FAIL(EPROTO, "invalid null");
      break;
    case '#':
      if (sl != 1 || (s[0] != 't' && s[0] != 'f'))
        FAIL(EPROTO, "invalid boolean");
      break;
    case ',':
      if (!valid_double(s, sl))
        FAIL(EPROTO, "invalid double");
      break;
    case '(':
      if (!valid_big(s, sl))
        FAIL(EPROTO, "invalid big number");
      break;
    case '$': case '!': case '=':
      if (!parse_len(s, sl, &v) || v < -1 || (v == -1 && q[0] != '$'))
        FAIL(EPROTO, "invalid bulk length");
      if (v >= 0) {
        size_t len = (size_t)v;
        if (len > max_reply || off + hl + len + 2 > max_reply)
          FAIL(EMSGSIZE, "reply too large");
        if (q[0] == '=' && len < 4)
          FAIL(EPROTO, "invalid verbatim string");
        if (n - off < hl + len + 2)
          return 0;
        if (q[hl + len] != '\r' || q[hl + len + 1] != '\n')
          FAIL(EPROTO, "bulk string without CRLF");
        if (q[0] == '=' && q[hl + 3] != ':')
          FAIL(EPROTO, "invalid verbatim string");
        tok = hl + len + 2;
      }
      break;
    case '*': case '~': case '>': case '%': case '|':
      if (!parse_len(s, sl, &v) || v < -1 || (v == -1 && q[0] != '*'))
        FAIL(EPROTO, "invalid multibulk length");
      if (q[0] == '%' || q[0] == '|')
        v *= 2;
      elem = open_aggregate(st, q[0], v, max_depth);
      if (elem < 0)
        FAIL(EMSGSIZE, "nesting too deep");
      break;
    default:
      FAIL(EPROTO, "unknown reply type");
    }
    off += tok;
    if (off > max_reply)
      FAIL(EMSGSIZE, "reply too large");
    st->off = off;
    if (elem && complete_element(st)) {
      reset(st);
      return (long)off;
    }
  }
}

size_t nr_resp_reply_token(const char *p, size_t n, nr_resp_token_t *t) {
  const char *cr = n > 1 ? memchr(p + 1, '\r', n - 1) : NULL;
  if (cr == NULL || (size_t)(cr - p) + 2 > n || cr[1] != '\n')
    return 0;
  size_t sl = (size_t)(cr - p) - 1, hl = sl + 3;
  const char *s = p + 1;
  int64_t v = 0;
  *t = (nr_resp_token_t){.type = p[0], .data = s, .len = sl};
  switch (p[0]) {
  case ':':
    if (!parse_i64(s, sl, &v))
      return 0;
    t->n = v;
    return hl;
  case '#':
    t->n = sl == 1 && s[0] == 't';
    return hl;
  case '_':
    t->null = true;
    return hl;
  case '$': case '!': case '=':
    if (!parse_len(s, sl, &v) || v < -1)
      return 0;
    if (v < 0) {
      t->null = true;
      return hl;
    }
    if ((uint64_t)v > n - hl || n - hl - (size_t)v < 2)
      return 0;
    t->data = p + hl;
    t->len = (size_t)v;
    if (p[0] == '=' && t->len >= 4) {        /* "txt:" is not the text */
      t->data += 4;
      t->len -= 4;
    }
    return hl + (size_t)v + 2;
  case '*': case '~': case '>': case '%': case '|':
    if (!parse_len(s, sl, &v) || v < -1)
      return 0;
    t->null = v < 0;
    t->n = v < 0 ? 0 : (p[0] == '%' || p[0] == '|') ? v * 2 : v;
    return hl;
  default:                                  /* + - , ( : the line itself */
    return hl;
  }
}

/* ---- the cluster key slot ------------------------------------------------ */

/* CRC16/XMODEM (polynomial 0x1021, initial value 0), a byte at a time. */
static const uint16_t crc16_table[256] = {
    0x0000, 0x1021, 0x2042, 0x3063, 0x4084, 0x50a5, 0x60c6, 0x70e7,
    0x8108, 0x9129, 0xa14a, 0xb16b, 0xc18c, 0xd1ad, 0xe1ce, 0xf1ef,
    0x1231, 0x0210, 0x3273, 0x2252, 0x52b5, 0x4294, 0x72f7, 0x62d6,
    0x9339, 0x8318, 0xb37b, 0xa35a, 0xd3bd, 0xc39c, 0xf3ff, 0xe3de,
    0x2462, 0x3443, 0x0420, 0x1401, 0x64e6, 0x74c7, 0x44a4, 0x5485,
    0xa56a, 0xb54b, 0x8528, 0x9509, 0xe5ee, 0xf5cf, 0xc5ac, 0xd58d,
    0x3653, 0x2672, 0x1611, 0x0630, 0x76d7, 0x66f6, 0x5695, 0x46b4,
    0xb75b, 0xa77a, 0x9719, 0x8738, 0xf7df, 0xe7fe, 0xd79d, 0xc7bc,
    0x48c4, 0x58e5, 0x6886, 0x78a7, 0x0840, 0x1861, 0x2802, 0x3823,
    0xc9cc, 0xd9ed, 0xe98e, 0xf9af, 0x8948, 0x9969, 0xa90a, 0xb92b,
    0x5af5, 0x4ad4, 0x7ab7, 0x6a96, 0x1a71, 0x0a50, 0x3a33, 0x2a12,
    0xdbfd, 0xcbdc, 0xfbbf, 0xeb9e, 0x9b79, 0x8b58, 0xbb3b, 0xab1a,
    0x6ca6, 0x7c87, 0x4ce4, 0x5cc5, 0x2c22, 0x3c03, 0x0c60, 0x1c41,
    0xedae, 0xfd8f, 0xcdec, 0xddcd, 0xad2a, 0xbd0b, 0x8d68, 0x9d49,
    0x7e97, 0x6eb6, 0x5ed5, 0x4ef4, 0x3e13, 0x2e32, 0x1e51, 0x0e70,
    0xff9f, 0xefbe, 0xdfdd, 0xcffc, 0xbf1b, 0xaf3a, 0x9f59, 0x8f78,
    0x9188, 0x81a9, 0xb1ca, 0xa1eb, 0xd10c, 0xc12d, 0xf14e, 0xe16f,
    0x1080, 0x00a1, 0x30c2, 0x20e3, 0x5004, 0x4025, 0x7046, 0x6067,
    0x83b9, 0x9398, 0xa3fb, 0xb3da, 0xc33d, 0xd31c, 0xe37f, 0xf35e,
    0x02b1, 0x1290, 0x22f3, 0x32d2, 0x4235, 0x5214, 0x6277, 0x7256,
    0xb5ea, 0xa5cb, 0x95a8, 0x8589, 0xf56e, 0xe54f, 0xd52c, 0xc50d,
    0x34e2, 0x24c3, 0x14a0, 0x0481, 0x7466, 0x6447, 0x5424, 0x4405,
    0xa7db, 0xb7fa, 0x8799, 0x97b8, 0xe75f, 0xf77e, 0xc71d, 0xd73c,
    0x26d3, 0x36f2, 0x0691, 0x16b0, 0x6657, 0x7676, 0x4615, 0x5634,
    0xd94c, 0xc96d, 0xf90e, 0xe92f, 0x99c8, 0x89e9, 0xb98a, 0xa9ab,
    0x5844, 0x4865, 0x7806, 0x6827, 0x18c0, 0x08e1, 0x3882, 0x28a3,
    0xcb7d, 0xdb5c, 0xeb3f, 0xfb1e, 0x8bf9, 0x9bd8, 0xabbb, 0xbb9a,
    0x4a75, 0x5a54, 0x6a37, 0x7a16, 0x0af1, 0x1ad0, 0x2ab3, 0x3a92,
    0xfd2e, 0xed0f, 0xdd6c, 0xcd4d, 0xbdaa, 0xad8b, 0x9de8, 0x8dc9,
    0x7c26, 0x6c07, 0x5c64, 0x4c45, 0x3ca2, 0x2c83, 0x1ce0, 0x0cc1,
    0xef1f, 0xff3e, 0xcf5d, 0xdf7c, 0xaf9b, 0xbfba, 0x8fd9, 0x9ff8,
    0x6e17, 0x7e36, 0x4e55, 0x5e74, 0x2e93, 0x3eb2, 0x0ed1, 0x1ef0,
};

static uint16_t crc16(const char *s, size_t n) {
  uint16_t crc = 0;
  for (size_t i = 0; i < n; i++)
    crc = (uint16_t)(crc << 8) ^ crc16_table[((crc >> 8) ^ (uint8_t)s[i]) & 0xff];
  return crc;
}

unsigned nr_resp_key_slot(const char *key, size_t len) {
  const char *open = memchr(key, '{', len);
  if (open != NULL) {
    size_t from = (size_t)(open - key) + 1;
    const char *close = memchr(open + 1, '}', len - from);
    if (close != NULL && close > open + 1)     /* "{}" is no tag */
      return crc16(open + 1, (size_t)(close - open - 1)) & 16383;
  }
  return crc16(key, len) & 16383;
}
