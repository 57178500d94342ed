/*
 * http_server_write.c -- the HTTP/1.1 server codec's outbound side
 * (http_server.c is the handler): the responses written to it -- tables,
 * prepared responses, the chunks of a streamed one -- encoded for the
 * request they answer (target, stream_slot), and the codec's own answers
 * (an error, with the half-close after it; "100 Continue"). What is
 * written for a request behind one still owed is held (emit, http_hold.c)
 * until its turn. Loop thread only.
 *
 * Encoding. When the codec's writes go straight to the channel's head (no
 * handler between, no promise), a response is encoded in place at the end
 * of the outbound buffer (nr_ctx_write_reserve), so its bytes are written
 * once; a prepared response's usual answer is then one copy and the date.
 * Otherwise the status line and headers are built in a per-thread scratch
 * buffer (no allocation per response) and handed to the next handler as
 * one write. A body up to SMALL_BODY goes with the head; a larger one
 * follows as a second write (in place) or slice (of the same gathered
 * write).
 */
#include <assert.h>
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "codec/http_server_internal.h"
static int emit(nr_http_server_t *s, unsigned i, void *msg, nr_promise_t *p);

/* The encoded answer for slot i, and the body after it: on to the next
 * handler, or held. */
static int write_out(nr_http_server_t *s, unsigned i, out_t *o,
                     const char *body, size_t blen, nr_promise_t *p) {
  int rc;
  if (o->direct) {            /* in place: a body too big to copy follows */
    nr_ctx_write_commit(s->ctx, o->len);
    if (blen == 0)
      return 0;
    nr_bytes_t b = NR_BYTES(body, blen);
    return emit(s, i, &b, p);
  }
  if (o->failed) {
    rc = nr_raise(-ENOMEM, "http_server: out of memory encoding a response");
  } else if (blen == 0) {
    nr_bytes_t b = NR_BYTES(o->p, o->len);
    rc = emit(s, i, &b, p);
  } else {
    nr_slice_t v[2] = {{o->p, o->len}, {body, blen}};
    nr_slices_t sl = {NR_MSG_SLICES, v, 2};
    rc = emit(s, i, &sl, p);
  }
  nr__http_out_done(o);
  return rc;
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
  if (!nr_promise_is_success(p) ||
      (nr_channel_is_open(ch) && nr_channel_shutdown_output(ch) != 0))
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

/* ---- the observer (an access log: nr_http_server_observe) ---------------- */

NOINLINE void nr__hs_tell(nr_http_server_t *s, unsigned i, int ev, int status,
                          uint64_t head, uint64_t body) {
  uint64_t token = 0;
  unsigned k = (i + RING - s->oldest) % RING;
  if (i < RING && k < s->outstanding)
    token = s->delivered - s->outstanding + 1 + k;
  s->seen(s->seen_arg, ev, token, status, head, body);
}

bool nr_http_server_is(const nr_ctx_t *ctx) {
  return nr_ctx_handler(ctx)->added == nr_http_server_added;
}

void nr_http_server_observe(nr_ctx_t *ctx, nr_http_seen_fn fn, void *arg) {
  nr_http_server_t *s = nr_ctx_state(ctx);
  s->seen = fn;
  s->seen_arg = arg;
}

/* An answer of the codec's own for slot i: status, its reason as the
 * plain-text body (none to HEAD); p (or NULL) learns when it has left. */
void nr__hs_write_status(nr_http_server_t *s, unsigned i, int status,
                         bool close, bool head, nr_promise_t *p) {
  out_t o;
  nr__http_out_init(&o);
  const char *reason = nr_http_reason(status);
  nr_http_count_status(status);
  char *w = out_reserve(&o, status_room(NULL));
  if (w != NULL)
    o.len = (size_t)(nr__http_put_status(w, status, NULL, 0) - o.p);
  OUT_LIT(&o, "Content-Type: text/plain\r\nContent-Length: ");
  nr__http_out_uint(&o, strlen(reason) + 1, 10);
  if (close)
    OUT_LIT(&o, "\r\nConnection: close");
  OUT_LIT(&o, "\r\n\r\n");
  size_t hlen = o.len;
  if (!head) {
    nr__http_out_str(&o, reason);
    OUT_LIT(&o, "\n");
  }
  TELL(s, i, NR_HTTP_SEEN_ANSWER, status, hlen, o.len - hlen);
  write_out(s, i, &o, NULL, 0, p);
}

void nr__hs_send_error(nr_http_server_t *s, int status) {
  s->closing = true;
  nr_promise_t *p = nr_promise_new();
  nr__hs_write_status(s, s->oldest, status, true, false, p);   /* (none owed) */
  nr_ctx_flush(s->ctx);
  close_after_error(s, p);
}

/* "100 Continue" for the request whose body is awaited. */
void nr__hs_send_continue(nr_http_server_t *s) {
  static const char cont[] = "HTTP/1.1 100 Continue\r\n\r\n";
  nr_bytes_t b = NR_BYTES(cont, sizeof cont - 1);
  s->continue_owed = false;
  nr_ctx_write(s->ctx, &b, NULL);
  nr_ctx_flush(s->ctx);
}

/* The slot a response written now answers (see above), RING when none
 * may be answered; *open_own: the request being handled has a streamed
 * answer open (a response written over it is a mistake). */
static unsigned target(const nr_http_server_t *s, uint64_t token,
                       bool *open_own) {
  unsigned i = slot_owed(s, token);
  *open_own = i != RING && streaming(s->flags[i]);
  if (i != RING && (s->flags[i] & A_MASK) == A_OWED)
    return i;
  for (unsigned k = 0; k < s->outstanding; k++) {
    i = (s->oldest + k) % RING;
    if ((s->flags[i] & A_MASK) == A_OWED)
      return i;
  }
  return RING;
}

/* The slot of the streamed answer a chunk written now belongs to
 * (s->streams > 0). */
static unsigned stream_slot(const nr_http_server_t *s, uint64_t token) {
  unsigned i = slot_owed(s, token);
  if (i != RING && streaming(s->flags[i]))
    return i;
  for (unsigned k = 0; k < s->outstanding; k++) {
    i = (s->oldest + k) % RING;
    if (streaming(s->flags[i]))
      return i;
  }
  return s->oldest;            /* (not reached while streams > 0) */
}

/* Bytes of slot i's answer: on to the next handler, or held. */
static int emit(nr_http_server_t *s, unsigned i, void *msg, nr_promise_t *p) {
  if (!holds(s, i))
    return nr_ctx_write(s->ctx, msg, p);
  ptrdiff_t n = nr__http_hold_add(&s->hold, i, msg, p);
  if (n < 0)
    return nr_raise((int)n, n == -ENOMEM ? "http_server: out of memory "
                    "holding an answer" : "http_server: a file region ended "
                    "early, or could not be read");
  s->held_out += (size_t)n;
  nr_channel_hold_bytes(nr_ctx_channel(s->ctx), n);
  return 0;
}

/* Room to encode slot i's answer in: in place when it goes on at once. */
static inline char *begin(nr_http_server_t *s, unsigned i, out_t *o,
                          size_t need, nr_promise_t *p) {
  if (!holds(s, i))
    return out_start(o, s->ctx, need, p);
  nr__http_out_init(o);
  return out_reserve(o, need);
}

/* A response written wrongly is a programmer mistake: besides failing the
 * write's future (which Lua code rarely watches) it is reported to the
 * handlers after the codec, so exception_caught sees it. */
/* A response the handler should not have written: an error for the
 * write, reported once. Without a promise the pipeline raises the returned
 * error to exception_caught; with one it only fails that promise, so the
 * misuse is fired here as well (a programming error should be heard). */
int nr__http_misuse(nr_ctx_t *ctx, nr_promise_t *p, const char *fmt, ...) {
  char msg[256];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  if (p != NULL) {
    nr_err_t err = {-EINVAL, msg};
    nr_ctx_fire_exception(ctx, &err);
  }
  return nr_raise(-EINVAL, "%s", msg);
}

/* Connection: close beside any Connection the user set (in a list, close
 * wins); keep-alive for an HTTP/1.0 client that keeps the connection. */
static char *put_connection(char *w, uint16_t f, unsigned user, bool close) {
  if (close && !(user & U_CLOSE))
    return PUT_LIT(w, "Connection: close\r\n");
  if (!close && !(user & U_CONN) && (f & F_HTTP10))
    return PUT_LIT(w, "Connection: keep-alive\r\n");
  return w;
}

/* The rest of the head after the status prefix, into room reserved for
 * it: framing, the user's headers, Connection, the blank line (the order
 * of a prepared response's bytes, so that a table and its prepared form
 * -- lhttp_memo.c sends one as the other -- give the same bytes). */
static char *put_head(char *w, const nr_http_response_t *r, uint16_t f,
                      unsigned user, bool bodyless, bool close) {
  if (r->stream) {
    if (!bodyless && !(f & F_HTTP10) && !(user & U_LENGTH))
      w = PUT_LIT(w, "Transfer-Encoding: chunked\r\n");
  } else if (!bodyless && !(user & U_LENGTH)) {
    w = PUT_LIT(w, "Content-Length: ");
    w = put_uint(w, r->body_len, 10);
    w = PUT_LIT(w, "\r\n");
  }
  w = nr__http_put_headers(w, r);
  w = put_connection(w, f, user, close);
  return PUT_LIT(w, "\r\n");
}

/* Room for what put_head writes besides the user's headers, and a first
 * chunk's size line and CRLF: 38 + 24 + 2 + 20 bytes at most. */
#define HEAD_FIXED 128

/* Whether the response to the request with flags f closes the
 * connection: the request asked, its streamed body has not all been read
 * (what is left of it cannot be told from a next request), or the user's
 * headers say so. (An error answer waiting behind it follows it, and
 * closes.) */
static bool closes(uint16_t f, unsigned user) {
  return (f & (F_CLOSE | F_BODY)) || (user & U_CLOSE);
}

/* A response table for slot i (owed). */
static NOINLINE int write_response(nr_http_server_t *s, nr_ctx_t *ctx,
                                   unsigned i, const nr_http_response_t *r,
                                   nr_promise_t *p) {
  if (r->status < 100 || r->status > 999)
    return nr__http_misuse(ctx, p, "http_server: bad status %d", r->status);
  nr_http_count_status(r->status);
  uint16_t f = s->flags[i];
  size_t need;
  unsigned user = nr__http_user_flags(r, &need);
  /* a stream whose length the user's headers give goes as it is
   * written (a proxy's, with its backend's Content-Length) */
  bool sized = r->stream && (user & U_LENGTH);
  bool close = closes(f, user) ||
               (r->stream && (f & F_HTTP10) && !sized);  /* no chunked in
                                                  1.0: the close ends it */
  bool bodyless = bodyless_status(r->status);
  bool no_body = bodyless || (f & F_HEAD);
  const char *body = no_body ? NULL : r->body;
  size_t blen = no_body || body == NULL ? 0 : r->body_len;
  /* the body given with a stream goes as its first chunk; a small one is
   * copied (one copy now beats a second slice) */
  bool chunk = r->stream && blen > 0 && !(f & F_HTTP10) && !sized;
  size_t copy = chunk || blen <= SMALL_BODY ? blen : 0;
  need += status_room(r->reason) + HEAD_FIXED + copy;
  out_t o;
  char *w = begin(s, i, &o, need, p);
  if (w != NULL) {
    w = nr__http_put_status(w, r->status, r->reason, user);
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
  TELL(s, i, r->stream ? NR_HTTP_SEEN_HEAD : NR_HTTP_SEEN_ANSWER, r->status,
       o.len - copy, blen);
  int rc = write_out(s, i, &o, body, blen - copy, p);
  if (rc < 0)
    return rc;
  if (r->stream) {
    s->flags[i] |= (uint16_t)((no_body ? A_DISCARD : (f & F_HTTP10) || sized
                                                                   ? A_RAW : A_CHUNKED) |
                             (close ? F_ACLOSE : 0));
    s->streams++;
  } else {
    answered(s, i, close);
  }
  return 0;
}

/* A prepared response for slot i (owed): its bytes, with the date and a
 * Connection line put in, the body copied when small, left out for HEAD. */
static NOINLINE int write_prepared(nr_http_server_t *s, nr_ctx_t *ctx,
                                   unsigned i, const nr_http_prepared_t *pr,
                                   nr_promise_t *p) {
  (void)ctx;
  uint16_t f = s->flags[i];
  bool close = closes(f, pr->user);
  nr_http_count_status(pr->status);
  bool no_body = bodyless_status(pr->status) || (f & F_HEAD);
  size_t head = pr->head_len, blen = no_body ? 0 : pr->body_len;
  size_t copy = blen <= SMALL_BODY ? blen : 0;
  const char *body = pr->bytes + head + 2;
  out_t o;
  /* Connection: 26 at most */
  char *w = begin(s, i, &o, head + 26 + 2 + copy, p);
  if (w != NULL) {
    w = put(w, pr->bytes, head);
    w = put_connection(w, f, pr->user, close);
    w = put(w, pr->bytes + head, 2 + copy);
    if (pr->date_at != 0)
      memcpy(o.p + pr->date_at, nr_http_date(), DATE_LEN);
    o.len = (size_t)(w - o.p);
  }
  TELL(s, i, NR_HTTP_SEEN_ANSWER, pr->status, o.len - copy, blen);
  int rc = write_out(s, i, &o, body, blen - copy, p);
  if (rc < 0)
    return rc;
  answered(s, i, close);
  return 0;
}

/* A response (table or prepared): for the request it answers (target), or
 * a mistake. */
static NOINLINE int respond(nr_http_server_t *s, nr_ctx_t *ctx, void *msg,
                            nr_promise_t *p) {
  bool open_own;
  unsigned i = target(s, nr_ctx_reading(ctx), &open_own);
  if (open_own || (i == RING && s->streams > 0))
    return nr__http_misuse(ctx, p, "http_server: a response written while a streamed "
                  "one is open (end it with \"\" or false)");
  if (i == RING)
    return nr__http_misuse(ctx, p, "http_server: a response with no request to answer");
  if (nr_msg_type(msg) == NR_MSG_HTTP_PREPARED)
    return write_prepared(s, ctx, i, msg, p);
  return write_response(s, ctx, i, msg, p);
}

/* The usual case of write_prepared -- a keep-alive HTTP/1.1 GET's turn,
 * the oldest request owed (and the one being handled, if any), no error
 * waiting, no promise -- is the bytes as they are and the date, encoded in
 * place in the outbound buffer: straight-line code with nothing to
 * decide. 1 when it is not that case. */
static inline int write_plain(nr_http_server_t *s, nr_ctx_t *ctx,
                              const nr_http_prepared_t *pr, nr_promise_t *p) {
  if (s->outstanding == 0 || s->flags[s->oldest] != 0 ||
      s->pending_error || pr->plain_len == 0 || p != NULL)
    return 1;
  /* a later request being handled: its answer is held (k - 1 wraps for
   * the oldest, k = 0, and for none, token 0) */
  uint64_t k = nr_ctx_reading(ctx) - (s->delivered - s->outstanding + 1);
  if (k - 1 < (uint64_t)s->outstanding - 1)
    return 1;
  char *w = nr_ctx_write_reserve(ctx, pr->plain_len);
  if (w == NULL)
    return 1;
  memcpy(w, pr->bytes, pr->plain_len);
  if (pr->date_at != 0)
    memcpy(w + pr->date_at, nr_http_date(), DATE_LEN);
  nr_ctx_write_commit(ctx, pr->plain_len);
  nr_http_count_status(pr->status);
  TELL(s, s->oldest, NR_HTTP_SEEN_ANSWER, pr->status,
       pr->plain_len - pr->body_len, pr->body_len);
  finish_response(s, false);
  return 0;
}

/* A file region while a stream is open (a static file's body): as it is
 * in a sized or HTTP/1.0 stream, framed as one chunk in a chunked one,
 * dropped for HEAD. A region of no bytes is not the end. */
static NOINLINE int write_file_chunk(nr_http_server_t *s, unsigned i, int how,
                                     nr_file_region_t *r, nr_promise_t *p) {
  if (how == A_DISCARD || r->len == 0) {
    if (p)
      nr_promise_set_success(p, NULL, NULL);
    return 0;
  }
  if (how == A_RAW)
    return emit(s, i, r, p);
  char size[24];
  int sl = snprintf(size, sizeof size, "%zx\r\n", r->len);
  nr_bytes_t b = NR_BYTES(size, (size_t)sl);
  int rc = emit(s, i, &b, NULL);
  if (rc == 0)
    rc = emit(s, i, r, NULL);
  b = NR_BYTES("\r\n", 2);
  return rc == 0 ? emit(s, i, &b, p) : rc;
}

/* A byte write while a stream is open: one chunk, or the end. */
static NOINLINE int write_chunk(nr_http_server_t *s, nr_ctx_t *ctx,
                                void *msg, nr_promise_t *p) {
  unsigned i = stream_slot(s, nr_ctx_reading(ctx));
  int how = s->flags[i] & A_MASK;
  size_t total = 0, n = 1;
  nr_slice_t one, *parts = &one;
  if (nr_msg_type(msg) == NR_MSG_FILE)
    return write_file_chunk(s, i, how, msg, p);
  if (nr_msg_type(msg) == NR_MSG_BYTES) {
    one = (nr_slice_t){((nr_bytes_t *)msg)->data, ((nr_bytes_t *)msg)->len};
  } else {
    nr_slices_t *sl = msg;
    parts = (nr_slice_t *)sl->v;
    n = sl->n;
  }
  for (size_t k = 0; k < n; k++)
    total += parts[k].len;
  int rc = 0;
  if (how != A_DISCARD || total == 0)
    TELL(s, i, total == 0 ? NR_HTTP_SEEN_END : NR_HTTP_SEEN_CHUNK, 0, 0, total);
  if (total == 0) {
    s->flags[i] &= (uint16_t)~A_MASK;
    s->streams--;
    if (how == A_CHUNKED) {
      nr_bytes_t end = NR_BYTES("0\r\n\r\n", 5);
      rc = emit(s, i, &end, p);
    } else if (p) {
      nr_promise_set_success(p, NULL, NULL);
    }
    answered(s, i, s->flags[i] & F_ACLOSE);
    return rc;
  }
  if (how == A_DISCARD) {
    if (p)
      nr_promise_set_success(p, NULL, NULL);
    return 0;
  }
  if (how == A_RAW)
    return emit(s, i, msg, p);
  (void)ctx;
  char size[24];
  int sl = snprintf(size, sizeof size, "%zx\r\n", total);
  nr_slice_t small[18], *v = n + 2 <= 18 ? small : malloc((n + 2) * sizeof *v);
  if (v == NULL)
    return nr_raise(-ENOMEM, "http_server: out of memory");
  v[0] = (nr_slice_t){size, (size_t)sl};
  memcpy(v + 1, parts, n * sizeof *v);
  v[n + 1] = (nr_slice_t){"\r\n", 2};
  nr_slices_t out = {NR_MSG_SLICES, v, n + 2};
  rc = emit(s, i, &out, p);
  if (v != small)
    free(v);
  return rc;
}

static NOINLINE int write_h2(nr_http_server_t *s, void *msg,
                             nr_promise_t *p) {
  int rc = nr_h2_server_write(s->h2, msg, p);
  if (!nr_inbound_busy(&s->in))
    nr__hs_settle(s);                 /* the last answer out: idle from now */
  return rc;
}

int nr_http_server_write(nr_ctx_t *ctx, void *msg, nr_promise_t *p) {
  nr_http_server_t *s = nr_ctx_state(ctx);
  if (s->h2 != NULL)
    return write_h2(s, msg, p);
  int type = nr_msg_type(msg);
  if (type == NR_MSG_HTTP_PREPARED && write_plain(s, ctx, msg, p) == 0)
    return 0;
  if (type == NR_MSG_HTTP_PREPARED || type == NR_MSG_HTTP_RESPONSE)
    return respond(s, ctx, msg, p);
  if (s->streams != 0 &&
      (type == NR_MSG_BYTES || type == NR_MSG_SLICES || type == NR_MSG_FILE))
    return write_chunk(s, ctx, msg, p);
  return nr_ctx_write(ctx, msg, p);  /* raw bytes pass through */
}

