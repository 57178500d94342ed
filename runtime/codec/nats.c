/*
 * nats.c -- the NATS protocol parser, reader and publication encoder (see
 * nats.h). No thread of its own.
 *
 * nr_nats_parse restarts from the first byte of an operation each time it
 * is called, as resp.c does: the reader calls it again only once the line
 * feed that ends a control line has arrived, or once a message's payload
 * is complete, so a split operation costs one extra walk of its control
 * line and never a walk of its payload.
 *
 * What the parser accepts is what nats-server sends, and a little more,
 * as the Go client's parser does: operation names in any case, spaces or
 * tabs between arguments, a line ending in LF without its CR. It is strict
 * where a mistake would desynchronise the stream: numbers are plain
 * decimal digits within the limits, and a payload must be followed by
 * CRLF.
 */
#include <errno.h>
#include <string.h>

#include "nats.h"

static inline bool is_sep(char c) { return c == ' ' || c == '\t'; }

/* Split s[0 .. n) into at most max tokens separated by spaces or tabs;
 * returns how many, or max + 1 when there are more. */
static int split(const char *s, size_t n, nr_slice_t *tok, int max) {
  int k = 0;
  size_t i = 0;
  while (i < n) {
    while (i < n && is_sep(s[i]))
      i++;
    if (i == n)
      break;
    size_t b = i;
    while (i < n && !is_sep(s[i]))
      i++;
    if (k == max)
      return max + 1;
    tok[k++] = (nr_slice_t){s + b, i - b};
  }
  return k;
}

/* A decimal number of 1..19 digits, at most max. */
static bool parse_num(nr_slice_t t, uint64_t max, uint64_t *out) {
  if (t.len == 0 || t.len > 19)
    return false;
  uint64_t v = 0;
  for (size_t i = 0; i < t.len; i++) {
    unsigned d = (unsigned)(t.data[i] - '0');
    if (d > 9)
      return false;
    v = v * 10 + d;          /* 19 digits cannot overflow 64 bits */
  }
  if (v > max)
    return false;
  *out = v;
  return true;
}

/* The rest of a line after its operation name, without the separators
 * around it. */
static nr_slice_t rest_of(const char *s, size_t n, size_t from) {
  while (from < n && is_sep(s[from]))
    from++;
  while (n > from && is_sep(s[n - 1]))
    n--;
  return (nr_slice_t){s + from, n - from};
}

/* Whether line[0 .. n) starts with the operation name `name` (upper
 * case, matched in any case) followed by a separator or the line's end. */
static bool op_is(const char *line, size_t n, const char *name, size_t len) {
  if (n < len || (n > len && !is_sep(line[len])))
    return false;
  for (size_t i = 0; i < len; i++) {
    char c = line[i];
    if (c >= 'a' && c <= 'z')
      c = (char)(c - 'a' + 'A');
    if (c != name[i])
      return false;
  }
  return true;
}

#define FAIL(code, msg)                                                     \
  do {                                                                      \
    *why = (msg);                                                           \
    return (code);                                                          \
  } while (0)

/* MSG subject sid [reply] size  /  HMSG subject sid [reply] hsize tsize:
 * the arguments in args, the line `line` bytes long (LF included). */
static long parse_msg(const char *p, size_t n, size_t line, nr_slice_t args,
                      bool hdr, const nr_nats_limits_t *lim, nr_nats_op_t *op,
                      size_t *need, const char **why) {
  nr_slice_t t[5];
  int k = split(args.data, args.len, t, 5);
  int fixed = hdr ? 4 : 3;               /* arguments without a reply */
  if (k != fixed && k != fixed + 1)
    FAIL(-EPROTO, hdr ? "bad HMSG arguments" : "bad MSG arguments");
  uint64_t sid, hsize = 0, tsize;
  if (!parse_num(t[1], (uint64_t)1 << 53, &sid))
    FAIL(-EPROTO, "bad subscription id");
  if (!parse_num(t[k - 1], UINT64_MAX, &tsize))
    FAIL(-EPROTO, "bad message size");
  if (tsize > lim->max_message)
    FAIL(NR_ETOOLONG, "message larger than max_message");
  if (hdr && (!parse_num(t[k - 2], tsize, &hsize)))
    FAIL(-EPROTO, "bad header size");
  size_t total = line + (size_t)tsize + 2;
  if (n < total) {
    *need = total;
    return 0;
  }
  if (p[total - 2] != '\r' || p[total - 1] != '\n')
    FAIL(-EPROTO, "message not followed by CRLF");
  op->kind = hdr ? NR_NATS_HMSG : NR_NATS_MSG;
  op->subject = t[0];
  op->sid = sid;
  op->reply = k == fixed + 1 ? t[2] : (nr_slice_t){NULL, 0};
  op->hdr = (nr_slice_t){p + line, (size_t)hsize};
  op->data = (nr_slice_t){p + line + hsize, (size_t)(tsize - hsize)};
  return (long)total;
}

long nr_nats_parse(const char *p, size_t n, const nr_nats_limits_t *lim,
                   nr_nats_op_t *op, size_t *need, const char **why) {
  *need = 0;
  size_t look = n < lim->max_control_line ? n : lim->max_control_line;
  const char *lf = memchr(p, '\n', look);
  if (lf == NULL) {
    if (n >= lim->max_control_line)
      FAIL(NR_ETOOLONG, "control line longer than max_control_line");
    return 0;
  }
  size_t line = (size_t)(lf - p) + 1, len = line - 1;
  if (len > 0 && p[len - 1] == '\r')
    len--;
  memset(op, 0, sizeof *op);
  switch (p[0]) {
  case 'M': case 'm':
    if (op_is(p, len, "MSG", 3))
      return parse_msg(p, n, line, rest_of(p, len, 3), false, lim, op, need,
                       why);
    break;
  case 'H': case 'h':
    if (op_is(p, len, "HMSG", 4))
      return parse_msg(p, n, line, rest_of(p, len, 4), true, lim, op, need,
                       why);
    break;
  case 'P': case 'p':
    if (op_is(p, len, "PING", 4) && rest_of(p, len, 4).len == 0)
      op->kind = NR_NATS_PING;
    else if (op_is(p, len, "PONG", 4) && rest_of(p, len, 4).len == 0)
      op->kind = NR_NATS_PONG;
    break;
  case '+':
    if (op_is(p, len, "+OK", 3) && rest_of(p, len, 3).len == 0)
      op->kind = NR_NATS_OK;
    break;
  case '-':
    if (op_is(p, len, "-ERR", 4)) {
      nr_slice_t s = rest_of(p, len, 4);
      if (s.len >= 2 && s.data[0] == '\'' && s.data[s.len - 1] == '\'')
        s = (nr_slice_t){s.data + 1, s.len - 2};
      op->kind = NR_NATS_ERR;
      op->data = s;
    }
    break;
  case 'I': case 'i':
    if (op_is(p, len, "INFO", 4)) {
      op->kind = NR_NATS_INFO;
      op->data = rest_of(p, len, 4);
    }
    break;
  }
  if (op->kind == 0)
    FAIL(-EPROTO, "unknown protocol operation");
  return (long)line;
}

/* ---- the reader -------------------------------------------------------- */

void nr_nats_reader_init(nr_nats_reader_t *r, const nr_nats_limits_t *lim) {
  memset(r, 0, sizeof *r);
  r->lim.max_control_line = lim && lim->max_control_line
                                ? lim->max_control_line
                                : NR_NATS_MAX_CONTROL_LINE;
  r->lim.max_message =
      lim && lim->max_message ? lim->max_message : NR_NATS_MAX_MESSAGE;
}

void nr_nats_reader_reset(nr_nats_reader_t *r) {
  nr_buf_free(&r->acc);
  r->need = 0;
}

static int failed(nr_nats_reader_t *r, int rc) {
  nr_nats_reader_reset(r);
  return rc;
}

/* Complete the operation kept in acc from p[0 .. *n); advances p and n.
 * 0 while incomplete (everything taken), 1 once it was delivered, or the
 * callback's non-zero value, or an error (< 0). */
static int finish_kept(nr_nats_reader_t *r, const char **p, size_t *n,
                       nr_nats_op_fn fn, void *ud, const char **why) {
  size_t have = nr_buf_len(&r->acc), take;
  if (r->need > 0) {
    take = r->need - have < *n ? r->need - have : *n;
  } else {
    /* acc holds the start of a control line and no line feed. */
    size_t budget = r->lim.max_control_line - have;
    const char *lf = memchr(*p, '\n', *n < budget ? *n : budget);
    if (lf == NULL && *n >= budget) {
      *why = "control line longer than max_control_line";
      return NR_ETOOLONG;
    }
    take = lf ? (size_t)(lf - *p) + 1 : *n;
  }
  if (nr_buf_append(&r->acc, *p, take) < 0) {
    *why = "out of memory";
    return -ENOMEM;
  }
  *p += take;
  *n -= take;
  have += take;
  if ((r->need > 0 && have < r->need) || (r->need == 0 && (*p)[-1] != '\n'))
    return 0;
  nr_nats_op_t op;
  size_t need;
  long rc = nr_nats_parse(nr_buf_peek(&r->acc), have, &r->lim, &op, &need, why);
  if (rc < 0)
    return (int)rc;
  if (rc == 0) {                 /* the line is whole: a payload to wait for */
    r->need = need;
    return *n > 0 ? finish_kept(r, p, n, fn, ud, why) : 0;
  }
  int stop = fn(ud, &op);
  nr_buf_consume(&r->acc, have);
  r->need = 0;
  return stop != 0 ? stop : 1;
}

int nr_nats_reader_feed(nr_nats_reader_t *r, const char *p, size_t n,
                        nr_nats_op_fn fn, void *ud, const char **why) {
  *why = NULL;
  if (nr_buf_len(&r->acc) > 0 && n > 0) {
    int rc = finish_kept(r, &p, &n, fn, ud, why);
    if (rc < 0)
      return failed(r, rc);
    if (rc == 0)
      return 0;                  /* still incomplete: everything is kept */
    if (rc != 1)
      return rc;                 /* stopped by the callback */
  }
  while (n > 0) {
    nr_nats_op_t op;
    size_t need;
    long rc = nr_nats_parse(p, n, &r->lim, &op, &need, why);
    if (rc < 0)
      return failed(r, (int)rc);
    if (rc == 0) {
      if (nr_buf_append(&r->acc, p, n) < 0) {
        *why = "out of memory";
        return failed(r, -ENOMEM);
      }
      r->need = need;
      return 0;
    }
    int stop = fn(ud, &op);
    if (stop != 0)
      return stop;
    p += rc;
    n -= (size_t)rc;
  }
  return 0;
}

/* ---- the encoder ------------------------------------------------------- */

bool nr_nats_valid_subject(const char *s, size_t n) {
  if (n == 0)
    return false;
  for (size_t i = 0; i < n; i++) {
    unsigned char c = (unsigned char)s[i];
    if (c <= ' ' && (c == ' ' || c == '\t' || c == '\r' || c == '\n' || c == 0))
      return false;
  }
  return true;
}

/* Write v in decimal at o; returns the digits written. */
static size_t put_u(char *o, size_t v) {
  char tmp[20];
  size_t k = 0;
  do {
    tmp[k++] = (char)('0' + v % 10);
    v /= 10;
  } while (v > 0);
  for (size_t i = 0; i < k; i++)
    o[i] = tmp[k - 1 - i];
  return k;
}

size_t nr_nats_pub_line(char *out, const char *subject, size_t slen,
                        const char *reply, size_t rlen, size_t hdr_len,
                        size_t data_len) {
  char *o = out;
  if (hdr_len > 0) {
    memcpy(o, "HPUB ", 5);
    o += 5;
  } else {
    memcpy(o, "PUB ", 4);
    o += 4;
  }
  memcpy(o, subject, slen);
  o += slen;
  *o++ = ' ';
  if (rlen > 0) {
    memcpy(o, reply, rlen);
    o += rlen;
    *o++ = ' ';
  }
  if (hdr_len > 0) {
    o += put_u(o, hdr_len);
    *o++ = ' ';
  }
  o += put_u(o, hdr_len + data_len);
  *o++ = '\r';
  *o++ = '\n';
  return (size_t)(o - out);
}
