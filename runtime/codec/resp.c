/*
 * resp.c -- the RESP request decoder (see resp.h). Loop thread only.
 *
 * nr_resp_parse restarts from the first byte of a request each time it is
 * called: the cost of a split request is one re-walk of its header lines,
 * never of its bulk data (lengths are known, so data is skipped, not
 * scanned), and the decoder needs no resumable state. The handler parses
 * straight from the channel's read buffer and cumulates only the tail of a
 * read that holds an incomplete request.
 *
 * Removal during a read (a handler upgrades the protocol, or closes the
 * channel, which empties the pipeline) is deferred: the state is freed when
 * the read that is in progress returns (inbound.h). Commands are fired deferrable
 * (decode): a Lua handler may take a read's commands at its end.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "buf.h"
#include "codec.h"
#include "resp.h"

/* Its message, registered as the program loads (netrun.h). */
__attribute__((constructor)) static void declare_types(void) {
  nr_msg_declare(NR_MSG_RESP, "resp");
}

/* A strict decimal integer: optional '-', then 1..18 digits. */
static bool parse_int(const char *s, size_t n, long long *out) {
  bool neg = n > 0 && s[0] == '-';
  size_t i = neg ? 1 : 0;
  if (n == i || n - i > 18)
    return false;
  long long v = 0;
  for (; i < n; i++) {
    if (s[i] < '0' || s[i] > '9')
      return false;
    v = v * 10 + (s[i] - '0');
  }
  *out = neg ? -v : v;
  return true;
}

/* A header line "<c><int>\r\n" at p (n bytes available, at most `max` long).
 * 1 with *v and *len (line length with CRLF), 0 if incomplete, -1 if bad
 * or too long. */
static int header_slow(const char *p, size_t n, size_t max, long long *v,
                       size_t *len) {
  size_t look = n < max ? n : max;
  const char *cr = memchr(p, '\r', look);
  if (cr == NULL)
    return n > max ? -1 : 0;
  size_t i = (size_t)(cr - p);
  if (i + 1 == n)
    return 0;
  if (cr[1] != '\n' || !parse_int(p + 1, i - 1, v))
    return -1;
  *len = i + 2;
  return 1;
}

/* The same, inlined where it is called three times a request: the usual
 * line, whole and good ("$3\r\n"), in one pass over its digits. What it
 * accepts, header_slow accepts with the same value and length (the CR
 * within `look`, 1..18 digits after an optional '-', then LF); anything
 * else goes there. */
static inline int header(const char *p, size_t n, size_t max, long long *v,
                         size_t *len) {
  size_t look = n < max ? n : max;
  size_t d0 = look > 1 && p[1] == '-' ? 2 : 1, e = d0;
  size_t stop = look < d0 + 18 ? look : d0 + 18;   /* at most 18 digits */
  long long x = 0;
  while (e < stop && (unsigned)(p[e] - '0') <= 9)
    x = x * 10 + (p[e++] - '0');
  if (e > d0 && e < look && e + 1 < n && p[e] == '\r' && p[e + 1] == '\n') {
    *v = d0 == 2 ? -x : x;
    *len = e + 2;
    return 1;
  }
  return header_slow(p, n, max, v, len);
}

#define FAIL(code, msg) (*why = (msg), (long)(code))

static long parse_multibulk(const char *p, size_t n, const nr_resp_limits_t *lim,
                            nr_slice_t *argv, size_t cap, size_t *argc,
                            const char **why) {
  long long count, blen;
  size_t hl;
  int h = header(p, n, lim->max_inline, &count, &hl);
  if (h <= 0)
    return h == 0 ? 0 : FAIL(-EPROTO, "invalid multibulk length");
  if (count <= 0)                   /* "*0", "*-1": nothing to run */
    return (long)hl;
  if ((unsigned long long)count > lim->max_args)
    return FAIL(NR_ETOOLONG, "too many arguments in a request");
  size_t pos = hl;
  for (long long i = 0; i < count; i++) {
    if (pos == n)
      return 0;
    if (p[pos] != '$')
      return FAIL(-EPROTO, "expected '$'");
    h = header(p + pos, n - pos, 32, &blen, &hl);
    if (h == 0)
      return 0;
    if (h < 0 || blen < 0)
      return FAIL(-EPROTO, "invalid bulk length");
    if ((unsigned long long)blen > lim->max_bulk)
      return FAIL(NR_ETOOLONG, "bulk length over the limit");
    size_t data = pos + hl, len = (size_t)blen;
    /* Refused on the lengths it announces, before its data comes: the
     * cumulation never holds more than max_request. */
    if (lim->max_request && data + len + 2 > lim->max_request)
      return FAIL(NR_ETOOLONG, "request size over the limit");
    if (n - data < len + 2)
      return 0;
    if (p[data + len] != '\r' || p[data + len + 1] != '\n')
      return FAIL(-EPROTO, "bulk data not followed by CRLF");
    if ((size_t)i < cap)
      argv[i] = (nr_slice_t){p + data, len};
    pos = data + len + 2;
  }
  *argc = (size_t)count;
  return (long)pos;
}

/* Inline: one line, arguments separated by spaces or tabs (no quoting). */
static long parse_inline(const char *p, size_t n, const nr_resp_limits_t *lim,
                         nr_slice_t *argv, size_t cap, size_t *argc,
                         const char **why) {
  size_t look = n < lim->max_inline + 1 ? n : lim->max_inline + 1;
  const char *nl = memchr(p, '\n', look);
  if (nl == NULL)
    return n > lim->max_inline ? FAIL(NR_ETOOLONG, "too big inline request") : 0;
  const char *end = nl > p && nl[-1] == '\r' ? nl - 1 : nl;
  size_t k = 0;
  for (const char *s = p; s < end;) {
    while (s < end && (*s == ' ' || *s == '\t'))
      s++;
    if (s == end)
      break;
    const char *e = s;
    while (e < end && *e != ' ' && *e != '\t')
      e++;
    if (k == lim->max_args)
      return FAIL(NR_ETOOLONG, "too many arguments in a request");
    if (k < cap)
      argv[k] = (nr_slice_t){s, (size_t)(e - s)};
    k++;
    s = e;
  }
  *argc = k;
  return (long)(nl - p + 1);
}

long nr_resp_parse(const char *p, size_t n, const nr_resp_limits_t *lim,
                   nr_slice_t *argv, size_t cap, size_t *argc,
                   const char **why) {
  *argc = 0;
  *why = NULL;
  if (n == 0)
    return 0;
  if (p[0] == '*')
    return parse_multibulk(p, n, lim, argv, cap, argc, why);
  return parse_inline(p, n, lim, argv, cap, argc, why);
}

/* ---- the pipeline handler ------------------------------------------------- */

typedef struct resp_s {
  nr_buf_t cum;             /* an incomplete request; empty between requests */
  nr_resp_limits_t lim;
  nr_inbound_t in;          /* re-entrancy, backpressure */
  bool failed;              /* protocol error: discard everything after */
} resp_t;

void *nr_resp_new(const nr_resp_limits_t *lim) {
  resp_t *s = calloc(1, sizeof *s);
  if (s == NULL)
    return NULL;
  if (lim)
    s->lim = *lim;
  if (s->lim.max_bulk == 0)
    s->lim.max_bulk = NR_RESP_MAX_BULK;
  if (s->lim.max_args == 0)
    s->lim.max_args = NR_RESP_MAX_ARGS;
  if (s->lim.max_inline == 0)
    s->lim.max_inline = NR_RESP_MAX_INLINE;
  if (s->lim.max_request == 0)
    s->lim.max_request = NR_RESP_MAX_REQUEST;
  return s;
}

/* Tell the pipeline first, so that a handler holding replies to earlier
 * requests can send them; then answer like Redis, and close. A handler that
 * closed the channel itself gets no error reply written after its close. */
static void fail(nr_ctx_t *ctx, resp_t *s, int code, const char *why) {
  char line[160];
  s->failed = true;
  nr_buf_free(&s->cum);
  snprintf(line, sizeof line, "RESP: Protocol error: %s", why);
  nr_err_t err = {code, line};
  nr_ctx_fire_exception(ctx, &err);
  if (nr_channel_is_open(nr_ctx_channel(ctx))) {
    int n = snprintf(line, sizeof line, "-ERR Protocol error: %s\r\n", why);
    nr_bytes_t b = NR_BYTES(line, (size_t)n);
    nr_ctx_write_and_flush(ctx, &b, NULL);
    nr_ctx_close(ctx, NULL);
  }
}

/* Fire every complete request in p[0 .. n); returns the bytes used. */
static size_t decode(nr_ctx_t *ctx, resp_t *s, const char *p, size_t n) {
  size_t off = 0;
  while (off < n && !s->failed && !s->in.removed &&
         nr_channel_is_open(nr_ctx_channel(ctx))) {
    nr_slice_t small[16], *v = small;
    size_t argc;
    const char *why;
    long r = nr_resp_parse(p + off, n - off, &s->lim, small, 16, &argc, &why);
    if (r == 0)
      break;
    if (r < 0) {
      fail(ctx, s, (int)r, why);
      break;
    }
    if (argc > 16) {
      if ((v = malloc(argc * sizeof *v)) == NULL) {
        fail(ctx, s, -ENOMEM, "out of memory");
        break;
      }
      nr_resp_parse(p + off, n - off, &s->lim, v, argc, &argc, &why);
    }
    off += (size_t)r;
    if (argc > 0) {
      /* Deferrable: what this loop does next does not depend on what the
       * handlers do with the command (a close stops the rest; so does an
       * unwritable channel, and a Lua handler's batch then holds what it
       * took, lpipeline_batch.c). A Lua handler runs a read's commands in one
       * protected call. A handler that removes this decoder gets the
       * commands of the same read decoded, as the HTTP codec's requests
       * are: no RESP command makes a client send anything but RESP. */
      nr_resp_cmd_t cmd = {NR_MSG_RESP, argc, v};
      nr_ctx_fire_read_deferrable(ctx, &cmd);
    }
    if (v != small)
      free(v);
    if (nr_inbound_hold(&s->in, nr_ctx_channel(ctx)))
      break;                  /* the rest waits for the replies to drain */
  }
  return off;
}

/* Free the state. Bytes not yet decoded (cumulated, or `rest` of the read
 * in progress) belong to whoever comes next: Netty does the same when a
 * decoder leaves the pipeline. */
static void release(nr_ctx_t *ctx, resp_t *s, const char *rest, size_t n) {
  if (nr_buf_len(&s->cum) > 0) {
    rest = nr_buf_peek(&s->cum);
    n = nr_buf_len(&s->cum);
  }
  if (!s->failed && n > 0 && nr_channel_is_open(nr_ctx_channel(ctx))) {
    nr_bytes_t b = NR_BYTES(rest, n);
    nr_ctx_fire_read(ctx, &b);
  }
  nr_inbound_free(&s->in);
  nr_buf_free(&s->cum);
  free(s);
}

/* Decode data[0 .. len) after what is cumulated (len 0: what is held). */
static void feed(nr_ctx_t *ctx, resp_t *s, const char *data, size_t len) {
  const char *rest = NULL;
  size_t nrest = 0;
  nr_inbound_enter(&s->in);
  if (nr_buf_len(&s->cum) == 0) {
    if (len > 0) {
      size_t used = decode(ctx, s, data, len);
      rest = data + used;
      nrest = len - used;
    }
    if (nrest > 0 && !s->failed && !s->in.removed &&
        nr_buf_append(&s->cum, rest, nrest) < 0)
      fail(ctx, s, -ENOMEM, "out of memory");
  } else if (len > 0 && nr_buf_append(&s->cum, data, len) < 0) {
    fail(ctx, s, -ENOMEM, "out of memory");
  } else {
    size_t used = decode(ctx, s, nr_buf_peek(&s->cum), nr_buf_len(&s->cum));
    if (!s->failed)
      nr_buf_consume(&s->cum, used);
  }
  if (nr_inbound_leave(&s->in))
    release(ctx, s, rest, nrest);
}

static int resp_channel_read(nr_ctx_t *ctx, void *msg) {
  resp_t *s = nr_ctx_state(ctx);
  if (nr_msg_type(msg) != NR_MSG_BYTES) {
    nr_ctx_fire_read(ctx, msg);
    return 0;
  }
  if (s->failed)
    return 0;
  const nr_bytes_t *b = msg;
  feed(ctx, s, b->data, b->len);
  return 0;
}

static void resp_removed(nr_ctx_t *ctx) {
  resp_t *s = nr_ctx_state(ctx);
  if (nr_inbound_removed(&s->in, ctx))
    release(ctx, s, NULL, 0);
}

/* A client that sends commands and reads no replies (as the HTTP codec
 * does, http_server.c): while the channel is unwritable the codec reads nothing
 * (auto_read off, if it found it on) and decodes no command past the one
 * just delivered; once the outbound buffer has drained, it reads again
 * and a task decodes what it held, then fires read_complete as a read
 * would. */
static void decode_held(void *state, nr_ctx_t *ctx) {
  resp_t *s = state;
  if (nr_inbound_resumable(&s->in, ctx) && !s->failed) {
    feed(ctx, s, NULL, 0);    /* may free s */
    nr_ctx_fire_read_complete(ctx);
  }
}

static int resp_writability(nr_ctx_t *ctx) {
  resp_t *s = nr_ctx_state(ctx);
  return nr_inbound_writability(&s->in, ctx, s, decode_held);
}

const nr_handler_t nr_resp_handler = {
    .type = "resp",
    .removed = resp_removed,
    .channel_read = resp_channel_read,
    .writability_changed = resp_writability,
};
