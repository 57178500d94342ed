/*
 * ws.c -- WebSocket (RFC 6455) of ws.h: the frame decoder, the encoder and
 * the pipeline handler. Loop thread only: a handler belongs to one ctx.
 *
 * Decoding. The handler is a decoder on the base of codec.h, so a frame is
 * decoded straight from the read when it is all there and only a split
 * frame is cumulated (bounded by max_frame: its size is checked from the
 * head, before its payload is waited for). A masked payload is unmasked
 * into a per-thread scratch buffer (the read's bytes are not ours to
 * change), a fragmented message into its reassembly buffer, which is
 * freed once the message was delivered: an idle connection holds nothing.
 * With permessage-deflate agreed (ws_deflate.c), RSV1 on a message's first
 * frame marks it compressed: it is reassembled as it came, then inflated
 * within max_message, then checked as UTF-8.
 *
 * Closing (RFC 6455 7): each side sends one close frame. The peer's close
 * is answered with its status and the socket closed once the answer has
 * gone out. Our close (the channel's close, or a close message written)
 * sends one and waits close_timeout for the peer's answer, which closes
 * the socket; the timer closes it otherwise. A protocol error is a close
 * with its status (1002, 1007, 1009) and the socket closed at once, with
 * a lingering close: what the peer still sends must not reset the close
 * frame away before it has read it. A graceful shutdown of the loop tells
 * the handler (NR_EVT_SHUTDOWN): it sends 1001 "going away" and keeps the
 * channel open, reading, for the answer -- at most close_timeout, which
 * the channel keeps as the loop's timers are gone by then.
 */
#include <assert.h>
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "codec/codec.h"
#include "codec/ws.h"

/* Its message, registered as the program loads (netrun.h). */
__attribute__((constructor)) static void declare_types(void) {
  nr_msg_declare(NR_MSG_WEBSOCKET, "websocket");
}

/* ---- frames ------------------------------------------------------------------ */

bool nr_ws_valid_code(int code) {
  return (code >= 1000 && code <= 1003) || (code >= 1007 && code <= 1014) ||
         (code >= 3000 && code <= 4999);
}

void nr_ws_mask(char *dst, const char *src, size_t n, const uint8_t mask[4],
                size_t phase) {
  size_t i = 0;
  if (phase % 4 == 0) {                    /* eight bytes at a time */
    uint64_t m;
    memcpy(&m, mask, 4);
    memcpy((char *)&m + 4, mask, 4);
    for (; i + 8 <= n; i += 8) {
      uint64_t w;
      memcpy(&w, src + i, 8);
      w ^= m;
      memcpy(dst + i, &w, 8);
    }
  }
  for (; i < n; i++)
    dst[i] = (char)(src[i] ^ mask[(i + phase) % 4]);
}

size_t nr_ws_put_head(char *out, int opcode, uint64_t len,
                      const uint8_t *mask) {
  size_t h = 2;
  out[0] = (char)(0x80 | opcode);
  uint8_t m = mask ? 0x80 : 0;
  if (len < 126) {
    out[1] = (char)(m | len);
  } else if (len <= 0xFFFF) {
    out[1] = (char)(m | 126);
    nr_put_be(out + 2, 2, len);
    h = 4;
  } else {
    out[1] = (char)(m | 127);
    nr_put_be(out + 2, 8, len);
    h = 10;
  }
  if (mask) {
    memcpy(out + h, mask, 4);
    h += 4;
  }
  return h;
}

/* ---- the decoder ---------------------------------------------------------------- */

void nr_ws_parser_init(nr_ws_parser_t *p, bool server, size_t max_message,
                       size_t max_frame) {
  memset(p, 0, sizeof *p);
  p->server = server;
  p->max_message = max_message;
  p->max_frame = max_frame;
  p->inflate_ratio = NR_WS_INFLATE_RATIO;
}

void nr_ws_parser_free(nr_ws_parser_t *p) {
  nr_buf_free(&p->msg);
  nr_ws_pmd_parser_free(p);
}

void nr_ws_parser_deflate(nr_ws_parser_t *p, bool peer_context) {
  p->deflate = true;
  p->peer_context = peer_context;
}

/* Unmasked payloads of whole frames, per thread; what it keeps past a
 * call is bounded (a large one is freed at the next call), and a thread
 * that exits frees it (the key's destructor). */
static _Thread_local char *scratch;
static _Thread_local size_t scratch_cap;
static pthread_key_t scratch_key;
static pthread_once_t scratch_once = PTHREAD_ONCE_INIT;
#define SCRATCH_KEEP 65536

static void scratch_key_make(void) { pthread_key_create(&scratch_key, free); }

static char *scratch_get(size_t n) {
  if (n > scratch_cap) {
    size_t cap = n < 4096 ? 4096 : n;
    char *s = realloc(scratch, cap);
    if (s == NULL)
      return NULL;
    scratch = s;
    scratch_cap = cap;
    pthread_once(&scratch_once, scratch_key_make);
    pthread_setspecific(scratch_key, s);
  }
  return scratch;
}

static void scratch_trim(void) {
  if (scratch_cap > SCRATCH_KEEP) {
    free(scratch);
    scratch = NULL;
    scratch_cap = 0;
    pthread_setspecific(scratch_key, NULL);
  }
}

static long fail(nr_ws_parser_t *p, nr_ws_event_t *ev, int code,
                 const char *why) {
  p->closed = true;
  nr_buf_free(&p->msg);
  ev->opcode = 0;
  ev->code = code;
  ev->why = why;
  ev->data = why;
  ev->len = strlen(why);
  return -1;
}

typedef struct head_s {
  bool fin, masked;
  int op;
  uint64_t len;
  size_t size;               /* the head's bytes */
  uint8_t mask[4];
} head_t;

/* The frame head at data: 1, 0 (not all there), or -1 (a length past
 * 2^63). */
static int parse_head(const unsigned char *d, size_t len, head_t *h) {
  if (len < 2)
    return 0;
  h->fin = d[0] & 0x80;
  h->op = d[0] & 0x0F;
  h->masked = d[1] & 0x80;
  h->len = d[1] & 0x7F;
  h->size = 2;
  if (h->len == 126) {
    if (len < 4)
      return 0;
    h->len = nr_get_be((const char *)d + 2, 2);
    h->size = 4;
  } else if (h->len == 127) {
    if (len < 10)
      return 0;
    h->len = nr_get_be((const char *)d + 2, 8);
    h->size = 10;
    if (h->len >> 63)
      return -1;
  }
  if (h->masked) {
    if (len < h->size + 4)
      return 0;
    memcpy(h->mask, d + h->size, 4);
    h->size += 4;
  }
  return 1;
}

/* The checks a head allows before its payload is there, so a frame that
 * breaks a rule or a limit is refused before it is cumulated. */
static long check_head(nr_ws_parser_t *p, const head_t *h, const char *data,
                       nr_ws_event_t *ev) {
  bool control = h->op & 8;
  if (data[0] & 0x70) {          /* only RSV1, only where deflate allows */
    if ((data[0] & 0x30) || !p->deflate)
      return fail(p, ev, NR_WS_PROTOCOL, "reserved bits set (no extension "
                  "was agreed)");
    if (control || h->op == NR_WS_CONT)
      return fail(p, ev, NR_WS_PROTOCOL, "compressed bit on a control "
                  "frame or a continuation");
  }
  if ((h->op > NR_WS_BINARY && !control) || h->op > NR_WS_PONG)
    return fail(p, ev, NR_WS_PROTOCOL, "reserved opcode");
  if (h->masked != p->server)
    return fail(p, ev, NR_WS_PROTOCOL, p->server ? "unmasked frame from a "
                "client" : "masked frame from a server");
  if (control && (!h->fin || h->len > 125))
    return fail(p, ev, NR_WS_PROTOCOL, "fragmented or long control frame");
  if (h->op == NR_WS_CONT && p->fragmented == 0)
    return fail(p, ev, NR_WS_PROTOCOL, "continuation without a message");
  if (!control && h->op != NR_WS_CONT && p->fragmented != 0)
    return fail(p, ev, NR_WS_PROTOCOL, "new message inside a fragmented one");
  if (h->len > p->max_frame)
    return fail(p, ev, NR_WS_TOO_BIG, "frame too big");
  if (!control && h->len + nr_buf_len(&p->msg) > p->max_message)
    return fail(p, ev, NR_WS_TOO_BIG, "message too big");
  return 0;
}

/* A close frame's payload: status and a UTF-8 reason. */
static long decode_close(nr_ws_parser_t *p, const char *pl, size_t n,
                         nr_ws_event_t *ev) {
  if (n == 1)
    return fail(p, ev, NR_WS_PROTOCOL, "close frame of one byte");
  int code = n >= 2 ? (int)nr_get_be(pl, 2) : NR_WS_NO_STATUS;
  if (n >= 2 && !nr_ws_valid_code(code))
    return fail(p, ev, NR_WS_PROTOCOL, "invalid close status");
  if (n > 2 && nr_utf8_check(0, pl + 2, n - 2) != 0)
    return fail(p, ev, NR_WS_BAD_DATA, "close reason is not UTF-8");
  p->closed = true;
  ev->opcode = NR_WS_CLOSE;
  ev->code = code;
  ev->data = n > 2 ? pl + 2 : "";
  ev->len = n > 2 ? n - 2 : 0;
  return 0;
}

/* A compressed message (all its fragments) inflated: the event, or a
 * failure (1009 past max_message, 1007 not deflate or not UTF-8). */
static long inflate_msg(nr_ws_parser_t *p, int op, const char *in, size_t n,
                        nr_ws_event_t *ev) {
  const char *out;
  size_t len;
  int rc = nr_ws_inflate(p, in, n, &out, &len);
  if (rc == NR_WS_TOO_BIG || rc == -ENOMEM)
    return fail(p, ev, NR_WS_TOO_BIG, rc == -ENOMEM ? "out of memory for a "
                "message" : "message too big (inflated)");
  if (rc == NR_WS_POLICY)
    return fail(p, ev, NR_WS_POLICY, "message inflates past inflate_ratio "
                "times what the connection sent compressed");
  if (rc != 0)
    return fail(p, ev, NR_WS_BAD_DATA, "invalid compressed data");
  if (op == NR_WS_TEXT && nr_utf8_check(0, out, len) != 0)
    return fail(p, ev, NR_WS_BAD_DATA, "text message is not UTF-8");
  ev->opcode = op;
  ev->data = out;
  ev->len = len;
  return 0;
}

/* A fragment of a message: kept (unmasked), its text checked so far (a
 * compressed one's once it is inflated, whole). */
static long add_fragment(nr_ws_parser_t *p, const head_t *h, const char *pl,
                         bool rsv1, nr_ws_event_t *ev) {
  if (h->op != NR_WS_CONT) {
    p->fragmented = h->op;
    p->compressed = rsv1;
    p->utf8 = 0;
  }
  size_t n = (size_t)h->len, at = nr_buf_len(&p->msg);
  if (nr_buf_append(&p->msg, pl, n) < 0)
    return fail(p, ev, NR_WS_TOO_BIG, "out of memory for a message");
  char *m = nr_buf_len(&p->msg) > 0 ? p->msg.data + p->msg.r : NULL;
  if (h->masked && n > 0)
    nr_ws_mask(m + at, m + at, n, h->mask, 0);
  if (m == NULL)
    m = (char *)"";              /* empty so far: nothing is written to it */
  if (p->fragmented == NR_WS_TEXT && !p->compressed) {
    p->utf8 = nr_utf8_check(p->utf8, m + at, n);
    if (p->utf8 == NR_UTF8_BAD || (h->fin && p->utf8 != 0))
      return fail(p, ev, NR_WS_BAD_DATA, "text message is not UTF-8");
  }
  if (h->fin) {
    int op = p->fragmented;
    p->fragmented = 0;
    p->reset = true;
    if (p->compressed)
      return inflate_msg(p, op, m, nr_buf_len(&p->msg), ev);
    ev->opcode = op;
    ev->data = m;
    ev->len = nr_buf_len(&p->msg);
  }
  return 0;
}

long nr_ws_decode(nr_ws_parser_t *p, const char *data, size_t len,
                  nr_ws_event_t *ev) {
  memset(ev, 0, sizeof *ev);
  if (p->reset) {
    p->reset = false;
    nr_buf_free(&p->msg);
    free(p->inflated);
    p->inflated = NULL;
  }
  scratch_trim();
  if (p->closed)
    return (long)len;
  head_t h;
  int r = parse_head((const unsigned char *)data, len, &h);
  if (r < 0)
    return fail(p, ev, NR_WS_PROTOCOL, "frame length past 2^63");
  if (r == 0)
    return 0;
  if (check_head(p, &h, data, ev) < 0)
    return -1;
  if (len - h.size < h.len)
    return 0;                              /* the payload is not all here */
  const char *pl = data + h.size;
  size_t n = (size_t)h.len;
  long used = (long)(h.size + n);
  if (h.op == NR_WS_CONT || !h.fin)
    return add_fragment(p, &h, pl, data[0] & NR_WS_RSV1, ev) < 0 ? -1 : used;
  if (h.masked && n > 0) {
    char *s = scratch_get(n);
    if (s == NULL)
      return fail(p, ev, NR_WS_TOO_BIG, "out of memory for a frame");
    nr_ws_mask(s, pl, n, h.mask, 0);
    pl = s;
  }
  if (h.op == NR_WS_CLOSE)
    return decode_close(p, pl, n, ev) < 0 ? -1 : used;
  if (data[0] & NR_WS_RSV1)
    return inflate_msg(p, h.op, pl, n, ev) < 0 ? -1 : used;
  if (h.op == NR_WS_TEXT && nr_utf8_check(0, pl, n) != 0)
    return fail(p, ev, NR_WS_BAD_DATA, "text message is not UTF-8");
  ev->opcode = h.op;
  ev->data = n > 0 ? pl : "";
  ev->len = n;
  return used;
}

/* ---- the handler ------------------------------------------------------------------ */

enum { HANDSHAKE, OPEN, CLOSING, CLOSED };

typedef struct ws_timer_s ws_timer_t;

typedef struct nr_ws_s {
  nr_decoder_t base;           /* first: the decoder base frees the struct */
  nr_ws_parser_t parser;
  nr_ctx_t *ctx;
  int phase;                   /* HANDSHAKE (a client's), OPEN, CLOSING (our
                                  close went out), CLOSED (the socket's
                                  close is under way) */
  bool client;
  uint64_t close_timeout, handshake_timeout, frame_timeout;
  bool timing_frame;           /* the timer runs for a frame's arrival */
  uint64_t rng;                /* a client's masking keys */
  nr_promise_t *close_promise; /* the close waiting for the peer's answer */
  nr_timer_t *timer;           /* ... for close_timeout */
  ws_timer_t *targ;
  char *request;               /* client: the handshake, until it is sent */
  size_t request_len;
  char accept[32];             /* client: the Sec-WebSocket-Accept expected */
  bool deflate_offered;        /* client: our request offered it */
  nr_ws_pmd_t pmd;             /* permessage-deflate agreed (bits 0: not) */
} nr_ws_t;

struct ws_timer_s {
  nr_ws_t *w;                  /* NULL once w is gone */
  nr_ctx_t *ctx;               /* retained */
};

static uint64_t next_rand(nr_ws_t *w) {   /* xorshift64* */
  w->rng ^= w->rng >> 12;
  w->rng ^= w->rng << 25;
  w->rng ^= w->rng >> 27;
  return w->rng * 0x2545F4914F6CDD1Dull;
}

static int send_deflated(nr_ws_t *w, nr_ctx_t *ctx, int op,
                         const nr_slice_t *v, size_t n, nr_promise_t *p);

/* Write one frame of op whose payload is the n slices v (total bytes):
 * in place when the write goes straight to the outbound buffer, else as
 * one gathered write (a client's masked payload is copied first). A data
 * frame is compressed first when permessage-deflate was agreed. */
static int send_frame(nr_ws_t *w, nr_ctx_t *ctx, int op, const nr_slice_t *v,
                      size_t n, size_t total, nr_promise_t *p) {
  if (w->pmd.bits != 0 && (op == NR_WS_TEXT || op == NR_WS_BINARY))
    return send_deflated(w, ctx, op, v, n, p);
  char head[NR_WS_MAX_HEAD];
  uint8_t key[4];
  if (w->client) {
    uint32_t r = (uint32_t)next_rand(w);
    memcpy(key, &r, 4);
  }
  size_t hl = nr_ws_put_head(head, op, total, w->client ? key : NULL);
  char *o = p == NULL && total <= 65536 ? nr_ctx_write_reserve(ctx, hl + total)
                                        : NULL;
  char *copy = NULL;
  if (o == NULL && w->client && (copy = o = malloc(hl + total)) == NULL)
    return nr_raise(-ENOMEM, "websocket: out of memory for a frame");
  if (o != NULL) {
    memcpy(o, head, hl);
    size_t at = hl;
    for (size_t i = 0; i < n; i++) {
      if (w->client)
        nr_ws_mask(o + at, v[i].data, v[i].len, key, at - hl);
      else
        memcpy(o + at, v[i].data, v[i].len);
      at += v[i].len;
    }
    if (copy == NULL) {
      nr_ctx_write_commit(ctx, hl + total);
      return 0;
    }
    nr_bytes_t b = NR_BYTES(copy, hl + total);
    int rc = nr_ctx_write(ctx, &b, p);
    free(copy);
    return rc;
  }
  nr_slice_t small[9], *sv = small;
  if (n + 1 > 9 && (sv = malloc((n + 1) * sizeof *sv)) == NULL)
    return nr_raise(-ENOMEM, "websocket: out of memory for a frame");
  sv[0] = (nr_slice_t){head, hl};
  memcpy(sv + 1, v, n * sizeof *v);
  nr_slices_t sl = {NR_MSG_SLICES, sv, n + 1};
  int rc = nr_ctx_write(ctx, &sl, p);
  if (sv != small)
    free(sv);
  return rc;
}

static int send_deflated(nr_ws_t *w, nr_ctx_t *ctx, int op,
                         const nr_slice_t *v, size_t n, nr_promise_t *p) {
  nr_slice_t z;
  if (nr_ws_deflate(w->pmd.bits, v, n, &z.data, &z.len) < 0)
    return nr_raise(-ENOMEM, "websocket: out of memory to compress");
  return send_frame(w, ctx, op | NR_WS_RSV1, &z, 1, z.len, p);
}

/* A close frame: status (none for NR_WS_NO_STATUS) and up to 123 bytes of
 * reason. */
static void send_close(nr_ws_t *w, nr_ctx_t *ctx, int code, const char *why,
                       size_t n, nr_promise_t *p) {
  char pl[2];
  nr_slice_t v[2] = {{pl, 2}, {why, n > 123 ? 123 : n}};
  if (code == NR_WS_NO_STATUS || !nr_ws_valid_code(code)) {
    send_frame(w, ctx, NR_WS_CLOSE, v, 0, 0, p);
  } else {
    nr_put_be(pl, 2, (uint64_t)code);
    send_frame(w, ctx, NR_WS_CLOSE, v, 2, 2 + v[1].len, p);
  }
  nr_ctx_flush(ctx);
}

static void stop_timer(nr_ws_t *w) {
  w->timing_frame = false;
  if (w->timer == NULL)
    return;
  if (w->targ != NULL)
    w->targ->w = NULL;          /* its task may still run: it finds nobody */
  nr_timer_cancel(w->timer);
  nr_timer_release(w->timer);
  w->timer = NULL;
  w->targ = NULL;
}

/* Close the socket now, completing the close that waited, if any. */
static void close_socket(nr_ws_t *w, nr_ctx_t *ctx) {
  stop_timer(w);
  w->phase = CLOSED;
  nr_promise_t *p = w->close_promise;
  w->close_promise = NULL;
  nr_ctx_close(ctx, p);
  if (p != NULL)
    nr_promise_release(p);
}

static void handshake_failed(nr_ws_t *w, nr_ctx_t *ctx, const char *why,
                             const char *line, size_t n);

static int timer_free(void *arg) {
  ws_timer_t *t = arg;
  nr_ctx_release(t->ctx);
  free(t);
  return 0;
}

/* Cancelled by someone else than stop_timer (a shutting-down loop cancels
 * every timer): w must not point at it any more. */
static int timer_cancelled(void *arg) {
  ws_timer_t *t = arg;
  if (t->w != NULL)
    t->w->targ = NULL;
  return timer_free(t);
}

/* The peer did not answer our close in time. */
static int timer_fire(void *arg) {
  ws_timer_t *t = arg;
  nr_ws_t *w = t->w;
  if (w != NULL) {
    w->targ = NULL;             /* w->timer is released by close_socket */
    if (w->phase == HANDSHAKE) {
      handshake_failed(w, t->ctx, "no answer in time", "", 0);
    } else if (w->timing_frame && w->phase == OPEN) {
      static const char why[] = "frame timeout";
      w->parser.closed = true;  /* what is still to come is ignored */
      send_close(w, t->ctx, NR_WS_POLICY, why, sizeof why - 1, NULL);
      nr_ws_msg_t m = {NR_MSG_WEBSOCKET, NR_WS_CLOSE, NR_WS_POLICY, why,
                       sizeof why - 1};
      nr_ctx_fire_user_event(t->ctx, &m);
      nr_channel_linger(nr_ctx_channel(t->ctx));
      close_socket(w, t->ctx);
    } else {
      close_socket(w, t->ctx);
    }
  }
  return timer_free(t);
}

/* Close the socket after `ns` unless something stops the timer first. */
static void start_timer(nr_ws_t *w, nr_ctx_t *ctx, uint64_t ns) {
  nr_loop_t *loop = nr_channel_loop(nr_ctx_channel(ctx));
  ws_timer_t *t;
  if (ns == 0 || loop == NULL || w->timer != NULL ||
      (t = malloc(sizeof *t)) == NULL)
    return;
  *t = (ws_timer_t){w, nr_ctx_retain(ctx)};
  w->timer = nr_loop_schedule(loop, ns, 0, timer_fire, timer_cancelled, t);
  if (w->timer == NULL)
    timer_free(t);
  else
    w->targ = t;
}

/* Our close frame went out: wait for the answer (close_timeout). */
static void await_answer(nr_ws_t *w, nr_ctx_t *ctx) {
  w->phase = CLOSING;
  start_timer(w, ctx, w->close_timeout);
}

/* A protocol error: close with its status, at once (lingering). */
static void protocol_error(nr_ws_t *w, nr_ctx_t *ctx, const nr_ws_event_t *ev) {
  if (w->phase == OPEN)
    send_close(w, ctx, ev->code, ev->why, strlen(ev->why), NULL);
  nr_ws_msg_t m = {NR_MSG_WEBSOCKET, NR_WS_CLOSE, ev->code, ev->why,
                   strlen(ev->why)};
  nr_ctx_fire_user_event(ctx, &m);
  nr_channel_linger(nr_ctx_channel(ctx));
  close_socket(w, ctx);
}

/* The peer's close: answered (unless it answers ours), then the socket
 * closes once the answer is out. */
static void peer_closed(nr_ws_t *w, nr_ctx_t *ctx, const nr_ws_event_t *ev) {
  if (w->phase == OPEN)
    send_close(w, ctx, ev->code, "", 0, NULL);
  nr_ws_msg_t m = {NR_MSG_WEBSOCKET, NR_WS_CLOSE, ev->code, ev->data, ev->len};
  nr_ctx_fire_user_event(ctx, &m);
  if (w->phase != CLOSED)
    close_socket(w, ctx);
}

static void handshake_failed(nr_ws_t *w, nr_ctx_t *ctx, const char *why,
                             const char *line, size_t n) {
  char msg[256];
  snprintf(msg, sizeof msg, "websocket: handshake failed: %s%s%.*s", why,
           n ? ": " : "", (int)(n > 120 ? 120 : n), line);
  nr_ctx_fire_exception(ctx, &(nr_err_t){-EPROTO, msg});
  close_socket(w, ctx);
}

static int lower(int c) { return c >= 'A' && c <= 'Z' ? c + 32 : c; }

static bool iequal(const char *a, size_t n, const char *lit) {
  if (strlen(lit) != n)
    return false;
  for (size_t i = 0; i < n; i++)
    if (lower((unsigned char)a[i]) != lit[i])
      return false;
  return true;
}

/* The value of header `name` (lowercase) in the head h[0 .. n), trimmed. */
static const char *find_header(const char *h, size_t n, const char *name,
                               size_t *vlen) {
  const char *end = h + n, *line = memchr(h, '\n', n);
  while (line != NULL && ++line < end) {
    const char *eol = memchr(line, '\n', (size_t)(end - line));
    if (eol == NULL)
      break;
    const char *colon = memchr(line, ':', (size_t)(eol - line));
    if (colon != NULL && iequal(line, (size_t)(colon - line), name)) {
      const char *v = colon + 1, *e = eol;
      while (v < e && (*v == ' ' || *v == '\t'))
        v++;
      while (e > v && (e[-1] == '\r' || e[-1] == ' ' || e[-1] == '\t'))
        e--;
      *vlen = (size_t)(e - v);
      return v;
    }
    line = eol;
  }
  return NULL;
}

/* A client's handshake: the server's answer must be 101 with our accept. */
static int handshake_step(nr_ws_t *w, nr_ctx_t *ctx, const char *data,
                          size_t len, size_t *consumed) {
  const char *end = memmem(data, len, "\r\n\r\n", 4);
  if (end == NULL) {
    if (len > NR_WS_MAX_RESPONSE_HEAD) {
      *consumed = len;
      handshake_failed(w, ctx, "response head too long", "", 0);
    }
    return 0;
  }
  size_t hl = (size_t)(end + 4 - data), vl = 0;
  const char *eol = memchr(data, '\r', hl);
  size_t ll = (size_t)(eol - data);
  *consumed = hl;
  if (ll < 12 || memcmp(data, "HTTP/1.1 101", 12) != 0) {
    *consumed = len;
    handshake_failed(w, ctx, "the server answered", data, ll);
    return 0;
  }
  const char *v = find_header(data, hl, "sec-websocket-accept", &vl);
  if (v == NULL || vl != strlen(w->accept) || memcmp(v, w->accept, vl) != 0) {
    *consumed = len;
    handshake_failed(w, ctx, "wrong Sec-WebSocket-Accept", "", 0);
    return 0;
  }
  if ((v = find_header(data, hl, "sec-websocket-extensions", &vl)) != NULL) {
    const char *why = w->deflate_offered ? nr_ws_pmd_check(v, vl, &w->pmd)
                                         : "an extension that was not offered";
    if (why != NULL) {
      *consumed = len;
      handshake_failed(w, ctx, why, v, vl);
      return 0;
    }
    nr_ws_parser_deflate(&w->parser, w->pmd.peer_context);
  }
  stop_timer(w);
  w->phase = OPEN;
  nr_ctx_fire_active(ctx);       /* the handlers after us see it open now */
  return 0;
}

static int ws_step(nr_decoder_t *d, nr_ctx_t *ctx, const char *data,
                   size_t len, size_t *consumed) {
  nr_ws_t *w = (nr_ws_t *)d;
  if (w->phase == HANDSHAKE)
    return handshake_step(w, ctx, data, len, consumed);
  nr_ws_event_t ev;
  long r = nr_ws_decode(&w->parser, data, len, &ev);
  if (r < 0) {
    *consumed = len;
    protocol_error(w, ctx, &ev);
    return 0;
  }
  *consumed = (size_t)r;
  if (r == 0 && w->phase == OPEN && w->frame_timeout && w->timer == NULL) {
    start_timer(w, ctx, w->frame_timeout);   /* a frame begun: time it */
    w->timing_frame = w->timer != NULL;
  } else if (r > 0 && w->timing_frame) {
    stop_timer(w);                           /* it arrived in time */
  }
  switch (ev.opcode) {
  case NR_WS_TEXT:
  case NR_WS_BINARY:
    if (w->phase == OPEN || w->phase == CLOSING) {
      nr_ws_msg_t m = {NR_MSG_WEBSOCKET, ev.opcode, 0, ev.data, ev.len};
      nr_ctx_fire_read(ctx, &m);
    }
    break;
  case NR_WS_PING:
    if (w->phase == OPEN) {
      nr_slice_t v = {ev.data, ev.len};
      send_frame(w, ctx, NR_WS_PONG, &v, 1, ev.len, NULL);
      nr_ctx_flush(ctx);
    }
    break;
  case NR_WS_CLOSE:
    peer_closed(w, ctx, &ev);
    break;
  default:
    break;                       /* a pong, or a fragment kept */
  }
  return 0;
}

static void ws_destroy(nr_decoder_t *d) {
  nr_ws_t *w = (nr_ws_t *)d;
  stop_timer(w);
  if (w->close_promise != NULL)
    nr_promise_release(w->close_promise);
  nr_ws_parser_free(&w->parser);
  free(w->request);
}

void *nr_ws_new(const nr_ws_opts_t *o) {
  nr_ws_t *w = calloc(1, sizeof *w);
  if (w == NULL)
    return NULL;
  nr_decoder_init(&w->base, "websocket", ws_step);
  w->base.destroy = ws_destroy;
  size_t max_message = o->max_message ? o->max_message : NR_WS_MAX_MESSAGE;
  size_t max_frame = o->max_frame ? o->max_frame : max_message;
  nr_ws_parser_init(&w->parser, !o->client, max_message, max_frame);
  if (o->inflate_ratio != 0)
    w->parser.inflate_ratio = o->inflate_ratio == NR_WS_NO_RATIO
                                  ? 0 : o->inflate_ratio;
  w->client = o->client;
  w->close_timeout = o->close_timeout;
  w->handshake_timeout = o->handshake_timeout;
  w->frame_timeout = o->frame_timeout;
  w->phase = o->client ? HANDSHAKE : OPEN;
  w->deflate_offered = o->client && o->deflate_offered;
  if (!o->client && o->deflate.bits != 0) {
    w->pmd = o->deflate;
    nr_ws_parser_deflate(&w->parser, o->deflate.peer_context);
  }
  if (o->client) {
    nr_random_bytes(&w->rng, sizeof w->rng);
    w->rng |= 1;
    if (strlen(o->accept) >= sizeof w->accept ||
        (w->request = malloc(o->request_len + 1)) == NULL) {
      free(w);
      errno = ENOMEM;
      return NULL;
    }
    memcpy(w->request, o->request, o->request_len);
    w->request_len = o->request_len;
    strcpy(w->accept, o->accept);
  }
  return w;
}

/* A client sends its handshake once the channel is active. */
static void send_request(nr_ws_t *w, nr_ctx_t *ctx) {
  if (w->request == NULL)
    return;
  nr_bytes_t b = NR_BYTES(w->request, w->request_len);
  nr_ctx_write_and_flush(ctx, &b, NULL);
  free(w->request);
  w->request = NULL;
  start_timer(w, ctx, w->handshake_timeout);
}

void nr_ws_handler_added(nr_ctx_t *ctx) {
  nr_ws_t *w = nr_ctx_state(ctx);
  w->ctx = ctx;
  if (w->client && nr_channel_is_active(nr_ctx_channel(ctx)))
    send_request(w, ctx);
}

int nr_ws_active(nr_ctx_t *ctx) {
  nr_ws_t *w = nr_ctx_state(ctx);
  if (w->phase != HANDSHAKE) {
    nr_ctx_fire_active(ctx);
    return 0;
  }
  send_request(w, ctx);          /* active goes on after the handshake */
  return 0;
}

int nr_ws_inactive(nr_ctx_t *ctx) {
  nr_ws_t *w = nr_ctx_state(ctx);
  stop_timer(w);
  if (w->close_promise != NULL)  /* the socket closed before the answer */
    close_socket(w, ctx);
  w->phase = CLOSED;
  return nr_decoder_inactive(ctx);
}

/* A graceful shutdown is about to close the socket: say goodbye first
 * (1001, going away) and keep it open, reading, for the peer's answer --
 * at most close_timeout (the loop's timers are gone by now: the channel
 * keeps the deadline). */
int nr_ws_user_event(nr_ctx_t *ctx, void *evt) {
  nr_ws_t *w = nr_ctx_state(ctx);
  if (evt == &NR_EVT_SHUTDOWN && (w->phase == OPEN || w->phase == CLOSING)) {
    if (w->phase == OPEN) {
      static const char why[] = "going away";
      send_close(w, ctx, NR_WS_GOING_AWAY, why, sizeof why - 1, NULL);
      w->phase = CLOSING;
    }
    uint64_t t = w->close_timeout ? w->close_timeout : NR_SEC(3600);
    nr_channel_delay_shutdown_close(nr_ctx_channel(ctx), nr_now() + t);
  }
  return nr_decoder_user_event(ctx, evt);
}

/* Bytes are a text frame, NR_MSG_WEBSOCKET messages frames of their
 * opcode (a close one starts the close handshake); anything else passes. */
int nr_ws_write(nr_ctx_t *ctx, void *msg, nr_promise_t *p) {
  nr_ws_t *w = nr_ctx_state(ctx);
  int type = nr_msg_type(msg);
  if (type != NR_MSG_BYTES && type != NR_MSG_SLICES &&
      type != NR_MSG_WEBSOCKET)
    return nr_ctx_write(ctx, msg, p);
  if (w->phase != OPEN)
    return nr_raise(NR_ECLOSED, "websocket: %s", w->phase == HANDSHAKE
                    ? "not open yet (the handshake is under way)"
                    : "closing: no message may follow a close");
  if (type == NR_MSG_BYTES) {
    const nr_bytes_t *b = msg;
    nr_slice_t v = {b->data, b->len};
    return send_frame(w, ctx, NR_WS_TEXT, &v, 1, b->len, p);
  }
  if (type == NR_MSG_SLICES) {
    const nr_slices_t *s = msg;
    size_t total = 0;
    for (size_t i = 0; i < s->n; i++)
      total += s->v[i].len;
    return send_frame(w, ctx, NR_WS_TEXT, s->v, s->n, total, p);
  }
  const nr_ws_msg_t *m = msg;
  if (m->opcode == NR_WS_CLOSE) {
    send_close(w, ctx, m->code, m->data, m->len, p);
    await_answer(w, ctx);
    return 0;
  }
  if ((m->opcode & 8) && m->len > 125)
    return nr_raise(-EINVAL, "websocket: a ping or pong carries at most "
                    "125 bytes, got %zu", m->len);
  nr_slice_t v = {m->data, m->len};
  return send_frame(w, ctx, m->opcode, &v, 1, m->len, p);
}

/* A close from the handlers: the close handshake first (the socket closes
 * when the peer answers, or after close_timeout). */
int nr_ws_close(nr_ctx_t *ctx, nr_promise_t *p) {
  nr_ws_t *w = nr_ctx_state(ctx);
  if (w->phase == OPEN && nr_channel_is_active(nr_ctx_channel(ctx))) {
    send_close(w, ctx, NR_WS_NORMAL, "", 0, NULL);
    await_answer(w, ctx);
  }
  if (w->phase == CLOSING && w->timer != NULL && w->close_promise == NULL) {
    if (p != NULL)               /* completed when the socket closes */
      w->close_promise = nr_promise_retain(p);
    return 0;
  }
  return nr_ctx_close(ctx, p);
}

const nr_handler_t nr_ws_handler = {
    .type = "websocket", .added = nr_ws_handler_added,
    .removed = nr_decoder_removed, .active = nr_ws_active,
    .inactive = nr_ws_inactive, .channel_read = nr_decoder_channel_read,
    .user_event = nr_ws_user_event,
    .writability_changed = nr_decoder_writability,
    .write = nr_ws_write, .close = nr_ws_close,
    .flags = NR_HANDLER_SYNC_WRITE};
