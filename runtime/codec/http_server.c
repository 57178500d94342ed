/*
 * http_server.c -- the HTTP/1.1 server codec of http.h as a pipeline
 * handler: it feeds what it reads to the parser (http_parse.c), delivers
 * the requests, and encodes the responses written to it (http_encode.c),
 * in request order. Loop thread only.
 *
 * Answering. Responses go out in request order (RFC 9112 9.3.2): the
 * handler keeps a ring of what it must remember about each delivered,
 * unanswered request (HEAD, HTTP/1.0, "close the connection after it") and
 * the state of its answer. A response written while a request is being
 * handled (its channel_read, through handlers that pass it on: the
 * pipeline's reading token, nr_ctx_reading) answers that request; one
 * written later answers the oldest request still owed one (what a handler
 * that answers in order expects). An answer for a request behind one
 * still owed is encoded at once but held (http_hold.c) until the answers
 * before it are out, then written in order ("answering in order" below).
 * Once a request that ends the connection is delivered nothing more is
 * parsed. A protocol error waits for the responses still owed, then is
 * answered and the channel closed (after a half-close that lets the
 * client stop sending: close_after_error).
 *
 * The codec is in four files (http_server_internal.h lists them): this
 * one is the handler itself -- its lifetime, the requests delivered, the
 * answers released in order, the hand-off to HTTP/2; the responses'
 * encoding is http_server_write.c, the timeouts and the body budget
 * http_server_wait.c, streamed request bodies http_server_body.c.
 */
#include <assert.h>
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "codec/http_server_internal.h"
#include "tls/tls.h"

static void drop_held(nr_http_server_t *s);

nr_http_server_t *nr_http_server_new(const nr_http_server_opts_t *o) {
  nr_http_server_t *s = calloc(1, sizeof *s);
  if (s == NULL)
    return NULL;
  nr_http_parser_init(&s->parser, o->max_header, o->max_body, o->max_headers);
  s->timeout[0] = o->header_timeout;
  s->timeout[1] = o->body_timeout;
  s->timeout[2] = o->keepalive_timeout;
  s->o = *o;
  s->sniffed = !o->h2;
  s->budget_limit = o->body_budget;
  s->conn_limit = o->conn_body_budget;
  s->stream_bodies = o->stream_bodies;
  s->parser.stream = o->stream_bodies;
  return s;
}

void nr__hs_free(nr_http_server_t *s) {
  nr_channel_unwatch(&s->watch);
  nr_codec_resume_cancel(s->body_resume);
  nr_h2_server_free(s->h2);
  nr__hs_unlist(s);
  nr__hs_budget_leave(s);
  if (s->prof != NULL)
    nr__hs_profile_put(s->prof);
  free(s->resv);
  nr__http_hold_free(s->hold);   /* (dropped with the channel's count first) */
  nr_inbound_free(&s->in);
  nr_http_parser_free(&s->parser);
  free(s);
}

void nr_http_server_added(nr_ctx_t *ctx) {
  nr_http_server_t *s = nr_ctx_state(ctx);
  s->ctx = ctx;
  /* A head dripping in a byte at a time does not make a connection
   * established: its first whole request head does (settle, deliver).
   * Until then it is among the first closed when the descriptors run
   * out (bootstrap.c). */
  nr_channel_fresh_until_message(nr_ctx_channel(ctx));
  nr__hs_start(s);
}


void nr_http_server_removed(nr_ctx_t *ctx) {
  nr_http_server_t *s = nr_ctx_state(ctx);
  if (s->body != B_NONE)
    nr__hs_body_gone(s, "http_server: the codec left the pipeline in the middle "
              "of a request body");
  if (s->outstanding > 0)     /* nobody will answer them through us */
    nr_channel_unhold(nr_ctx_channel(ctx));
  drop_held(s);
  nr__hs_budget_leave(s);            /* (an upgrade: the next protocol reads on) */
  if (s->idle) {
    s->idle = false;
    nr_channel_set_idle(nr_ctx_channel(ctx), false);
  }
  if (s->reads_held) {
    s->reads_held = s->budget_held = s->body_held = false;
    nr_channel_hold_reads(nr_ctx_channel(ctx), false);
  }
  if (nr_inbound_removed(&s->in, ctx))
    nr__hs_free(s);
}

int nr_http_server_active(nr_ctx_t *ctx) {
  nr__hs_start(nr_ctx_state(ctx));
  nr_ctx_fire_active(ctx);
  return 0;
}

int nr_http_server_inactive(nr_ctx_t *ctx) {
  nr_http_server_t *s = nr_ctx_state(ctx);
  if (s->body != B_NONE)
    nr__hs_body_gone(s, "http_server: the connection closed in the middle of a "
              "request body");
  s->closing = true;          /* nothing more to read, nothing to time */
  s->wait = W_NONE;
  nr__hs_unlist(s);
  nr__hs_budget_leave(s);
  drop_held(s);
  nr_ctx_fire_inactive(ctx);
  return 0;
}

/* Everything held is dropped (a close): never to be sent. */
static void drop_held(nr_http_server_t *s) {
  nr__http_hold_t *h = s->hold;
  if (h == NULL)
    return;
  s->hold = NULL;              /* (failed promises' listeners may write) */
  size_t n = nr__http_hold_free(h);
  s->held_out -= n;
  nr_channel_hold_bytes(nr_ctx_channel(s->ctx), -(ptrdiff_t)n);
}

/* A handler raised on the request in slot i (or its body failed:
 * fail_status), whose answer has not begun: a 500 (or that status)
 * answers it, in its turn. */
void nr__hs_answer_failed(nr_http_server_t *s, unsigned i) {
  uint16_t f = s->flags[i];
  int status = s->fail_status ? s->fail_status : 500;
  bool close = (f & (F_CLOSE | F_HTTP10 | F_BODY)) != 0 ||  /* 1.0: no */
               s->fail_status != 0;              /* keep-alive header */
  s->fail_status = 0;
  nr__hs_write_status(s, i, status, close, f & F_HEAD, NULL);
  if (!holds(s, i))
    nr_ctx_flush(s->ctx);
  answered(s, i, close);
}

/* An answer begun cannot end well: close (what is held is dropped). */
static void abort_answer(nr_http_server_t *s) {
  s->closing = true;
  drop_held(s);
  nr_ctx_close(s->ctx, NULL);
}


/* nr_handler_t.read_failed: the handlers raised on request `token`. */
void nr_http_server_read_failed(nr_ctx_t *ctx, uint64_t token) {
  nr_http_server_t *s = nr_ctx_state(ctx);
  if (s->h2 != NULL) {
    nr_h2_server_read_failed(s->h2, token);
    return;
  }
  unsigned i = slot_owed(s, token);
  if (i == RING || s->closing || (s->flags[i] & A_MASK) == A_DONE)
    return;                   /* answered already (exception_caught did) */
  if (s->body != B_NONE && token == s->body_token)
    nr__hs_stop_body(s);             /* its body goes nowhere now */
  if ((s->flags[i] & A_MASK) == A_OWED)
    nr__hs_answer_failed(s, i);
  else if (holds(s, i))
    s->flags[i] |= F_FAILED;  /* its stream is held: closed in its turn */
  else
    abort_answer(s);
}

/* The oldest request owed has (part of) its answer held: send it, and
 * the whole answers after it, up to one still owed or open (which goes
 * on straight from now). 1: the connection closes after the last one
 * sent; 0: go on; -1: the codec went away or closed meanwhile. */
static NOINLINE int release(nr_http_server_t *s) {
  nr_channel_t *ch = nr_ctx_channel(s->ctx);
  int rc = 0;
  nr_inbound_enter_quiet(&s->in);      /* a write's events may remove us */
  while (rc == 0 && s->outstanding > 0) {
    unsigned i = s->oldest;
    while (nr__http_hold_has(s->hold, i) && !s->in.removed) {
      size_t n;
      nr__http_hold_pop(s->hold, i, s->ctx, &n);
      s->held_out -= n;
      nr_channel_hold_bytes(ch, -(ptrdiff_t)n);
    }
    uint16_t f = s->flags[i];
    if (s->in.removed || s->closing || !nr_channel_is_open(ch)) {
      rc = -1;
    } else if ((f & A_MASK) != A_DONE) {  /* owed, or streaming on */
      if (streaming(f) && (f & F_FAILED))
        abort_answer(s);
      break;
    } else {                            /* whole: forgotten */
      forget_oldest(s);
      if (f & F_ACLOSE)
        rc = 1;
    }
  }
  if (!s->in.removed)
    nr_ctx_flush(s->ctx);
  if (s->held_out == 0 && nr__http_hold_empty(s->hold)) {
    nr__http_hold_free(s->hold);        /* (1 KiB a connection otherwise) */
    s->hold = NULL;
  }
  if (nr_inbound_leave(&s->in)) {
    nr__hs_free(s);
    return -1;
  }
  return rc;
}

/* The request just answered asked for the close (Connection: close, or
 * HTTP/1.0 without keep-alive), was read whole, and nothing came after
 * it: a client that asks to close sends no further request (RFC 9112
 * 9.6), so there is nothing in flight for a lingering close to wait for
 * (nginx lingers only on unread or pipelined input too). Bytes already
 * in the socket still make the close linger (start_linger's FIONREAD). */
static bool client_closes(const nr_http_server_t *s) {
  uint16_t f = s->flags[(s->oldest + RING - 1) % RING];
  return (f & F_CLOSE) && s->outstanding == 0 &&
         nr__http_parsing_head(&s->parser) && nr_buf_len(&s->parser.in) == 0;
}

/* What finish_response does besides forgetting the request. */
NOINLINE void nr__hs_finished(nr_http_server_t *s, bool close) {
  if (!close && s->outstanding > 0 &&
      (s->flags[s->oldest] & (F_FAILED | A_MASK))) {
    int rc = release(s);       /* its turn came */
    if (rc < 0)
      return;
    close = rc;
  }
  if (close && s->body != B_NONE && s->body_token <= s->delivered - s->outstanding)
    nr__hs_stop_body(s);              /* answered before its body was all read */
  if (close) {
    s->closing = true;
    drop_held(s);              /* answers to requests after the close */
    /* a client may pipeline past the request that closes: what it sends
     * meanwhile must not turn our close into a reset that destroys the
     * answers it has not read yet -- unless the client closes itself */
    if (!client_closes(s))
      nr_channel_linger(nr_ctx_channel(s->ctx));
    nr_ctx_flush(s->ctx);
    nr_ctx_close(s->ctx, NULL);
  } else if (s->outstanding > 0) {
    return;                    /* an answer is owed, or streaming */
  } else if (s->pending_error) {
    nr__hs_send_error(s, s->pending_error);
  } else if (s->continue_owed) {
    nr__hs_send_continue(s);
  } else if (!nr_inbound_busy(&s->in)) {
    nr__hs_settle(s);                 /* (inside a read, feed settles at its end) */
  }
}

static bool upgrade_h2c(nr_http_server_t *s, nr_http_request_t *req);

static int deliver(void *arg, int ev, nr_http_request_t *req) {
  nr_http_server_t *s = arg;
  nr_channel_t *ch = nr_ctx_channel(s->ctx);
  if (ev == NR_HTTP_EV_BODY)
    return nr__hs_deliver_piece(s, req);
  if (req->switches && ev == NR_HTTP_EV_REQUEST && s->o.h2 && !s->tls &&
      s->outstanding == 0 && upgrade_h2c(s, req))
    return NR_HTTP_SWITCHED;   /* the rest of the input is HTTP/2's */
  if (ev == NR_HTTP_EV_CONTINUE) {
    if (s->outstanding > 0)
      s->continue_owed = true;   /* after the responses owed before it */
    else
      nr__hs_send_continue(s);
    return !nr_channel_is_open(ch);
  }
  if (s->outstanding == RING) {
    s->overflow = true;
    return 1;
  }
  if (__builtin_expect(s->delivered == 0, 0))
    nr_channel_established(ch);
  uint8_t f = (req->head ? F_HEAD : 0) | (req->keep_alive ? 0 : F_CLOSE) |
              (req->minor == 0 ? F_HTTP10 : 0) | (req->streaming ? F_BODY : 0);
  unsigned slot = (s->oldest + s->outstanding) % RING;
  s->flags[slot] = f;
  if ((req->body_len | s->admitted) != 0 && s->budget != NULL)
    nr__hs_budget_delivered(s, slot, req->body_len);
  if (s->outstanding++ == 0)   /* a shutdown waits for the answers owed */
    nr_channel_hold(ch);
  s->wait = W_NONE;            /* the server's turn: no timeout runs */
  mark_idle(s);
  s->continue_owed = false;    /* it was for this request: its body came */
  /* Whether the handlers answer now or later, the next requests parse the
   * same, and a close stops them: they may take this one later -- unless
   * it may switch protocols, when what follows is theirs to read. */
  req->token = ++s->delivered;
  req->pipeline = nr_ctx_pipeline(s->ctx);
  if (req->streaming)
    return nr__hs_streamed_head(s, req);
  nr_ctx_fire_read_tokened(s->ctx, req, req->token, !req->switches);
  if (s->in.removed && req->switches && nr_channel_is_open(ch))
    return NR_HTTP_SWITCHED;   /* replaced by the new protocol's codec */
  if ((f & F_CLOSE) || s->in.removed || s->closing || !nr_channel_is_open(ch))
    return 1;
  if (nr_inbound_hold(&s->in, ch))
    return NR_HTTP_PAUSE;      /* the rest waits for the answers to drain */
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

/* Bytes for the HTTP/2 session (none: what it held); false if s was freed
 * meanwhile. */
static bool feed_h2(nr_http_server_t *s, const char *data, size_t len) {
  nr_inbound_enter(&s->in);
  if (nr_h2_server_feed(s->h2, data, len) < 0)
    s->closing = true;
  if (nr_inbound_leave(&s->in)) {
    nr__hs_free(s);
    return false;
  }
  if (!s->in.removed && !nr_inbound_busy(&s->in))
    nr__hs_settle(s);
  return !s->in.removed;
}

/* Parse bytes (none: what is held); false if s was freed meanwhile. */
bool nr__hs_feed(nr_http_server_t *s, const char *data, size_t len) {
  nr_inbound_enter(&s->in);
  int rc = nr_http_feed(&s->parser, data, len, deliver, s);
  if (s->h2 != NULL && !s->in.removed && nr_buf_len(&s->parser.in) > 0) {
    nr_buf_t rest = s->parser.in;       /* after `Upgrade: h2c`: HTTP/2 */
    s->parser.in = NR_BUF_INIT;
    if (nr_h2_server_feed(s->h2, nr_buf_peek(&rest), nr_buf_len(&rest)) < 0)
      s->closing = true;
    nr_buf_free(&rest);
  }
  if (nr_inbound_leave(&s->in)) {
    handover(s);
    nr__hs_free(s);
    return false;
  }
  if (s->in.removed)
    return false;
  if (s->overflow)
    rc = 503;
  if (rc > 1 && s->body != B_NONE) {
    nr_inbound_enter_quiet(&s->in);    /* (its answer may close: s goes) */
    nr__hs_fail_body(s, rc, rc == 413 ? "http_server: the request body is over "
              "max_body" : "http_server: malformed request body");
    if (nr_inbound_leave(&s->in)) {
      nr__hs_free(s);
      return false;
    }
    if (s->in.removed)
      return false;
    rc = 0;                    /* (answered in its turn) */
  }
  if (rc > 1 && s->h2 == NULL && !s->closing &&
      nr_channel_is_open(nr_ctx_channel(s->ctx))) {
    if (s->outstanding > 0)
      s->pending_error = rc;
    else
      nr__hs_send_error(s, rc);
  }
  if (s->budget != NULL && !nr_inbound_busy(&s->in) && !budget_idle(s)) {
    nr__hs_gate(s);
    nr__hs_budget_wake(s->budget);    /* (room a delivery gave back) */
  } else if (s->budget == NULL && !nr__http_parsing_head(&s->parser)) {
    nr__http_reserve_body(&s->parser);     /* (no budget: at once) */
  }
  if (!nr_inbound_busy(&s->in))
    nr__hs_settle(s);
  return true;
}

/* The connection speaks HTTP/2 from now on; false if it failed (the
 * channel is closing). */
static bool start_h2(nr_http_server_t *s) {
  s->sniffed = true;
  nr_channel_established(nr_ctx_channel(s->ctx));   /* it spoke: not shed */
  nr__hs_budget_off(s);
  s->h2 = nr_h2_server_new(s->ctx, &s->in, &s->o);
  if (s->h2 == NULL) {
    nr_log(NR_LOG_WARN, "http_server: out of memory starting HTTP/2");
    s->closing = true;
    nr_ctx_close(s->ctx, NULL);
    return false;
  }
  return true;
}

/* The first bytes of a connection, when HTTP/2 is on: the client preface
 * (h2c by prior knowledge) or HTTP/1.1. A preface split across reads
 * waits here (its bytes are known: only a count is kept). */
static int sniff(nr_http_server_t *s, const char *data, size_t len) {
  size_t want = NR_H2_PREFACE_LEN - s->nsniff, take = len < want ? len : want;
  if (s->delivered > 0 || nr_buf_len(&s->parser.in) > 0 ||
      memcmp(data, &NR_H2_PREFACE[s->nsniff], take) != 0) {
    s->sniffed = true;         /* HTTP/1.1 (with what matched before) */
    size_t had = s->nsniff;
    if (had > 0 && !nr__hs_feed(s, NR_H2_PREFACE, had))
      return 0;
    if (!s->closing && !s->parser.stopped)
      nr__hs_feed(s, data, len);
    return 0;
  }
  s->nsniff = (uint8_t)(s->nsniff + take);
  if (s->nsniff < NR_H2_PREFACE_LEN)
    return 0;
  if (start_h2(s) && feed_h2(s, NR_H2_PREFACE, NR_H2_PREFACE_LEN) &&
      len > take && !s->closing)
    feed_h2(s, data + take, len - take);
  return 0;
}

/* `Upgrade: h2c` with HTTP2-Settings (RFC 7540 3.2, kept by RFC 9113 as
 * deprecated): 101, then the request is stream 1's, answered in HTTP/2.
 * False when the request does not ask for it (or the switch failed: it
 * is then answered as HTTP/1.1). */
static bool upgrade_h2c(nr_http_server_t *s, nr_http_request_t *req) {
  const nr_http_header_t *settings = NULL;
  bool h2c = false;
  for (size_t i = 0; i < req->nheaders; i++) {
    const nr_http_header_t *h = &req->headers[i];
    if (nr__http_ieq(h->name, h->name_len, "upgrade", 7))
      h2c |= nr__http_has_token(h->value, h->value_len, "h2c", 3);
    else if (nr__http_ieq(h->name, h->name_len, "http2-settings", 14))
      settings = settings == NULL ? h : req->headers;   /* twice: none */
  }
  if (!h2c || settings == NULL || settings == req->headers)
    return false;
  nr_h2_server_t *h2 = nr_h2_server_new(s->ctx, &s->in, &s->o);
  if (h2 == NULL)
    return false;
  if (nr_h2_server_upgrade(h2, settings->value, settings->value_len,
                           req->head) < 0) {
    nr_h2_server_free(h2);
    return false;
  }
  static const char ok[] = "HTTP/1.1 101 Switching Protocols\r\n"
                           "Connection: Upgrade\r\nUpgrade: h2c\r\n\r\n";
  nr_channel_established(nr_ctx_channel(s->ctx));
  nr__hs_budget_off(s);
  nr_bytes_t b = NR_BYTES(ok, sizeof ok - 1);
  nr_ctx_write(s->ctx, &b, NULL);
  s->h2 = h2;
  s->sniffed = true;
  s->wait = W_NONE;
  nr_h2_server_deliver_upgraded(h2, req);
  return true;
}

int nr_http_server_channel_read(nr_ctx_t *ctx, void *msg) {
  nr_http_server_t *s = nr_ctx_state(ctx);
  if (nr_msg_type(msg) != NR_MSG_BYTES) {
    nr_ctx_fire_read(ctx, msg);
    return 0;
  }
  if (s->h2 != NULL) {
    const nr_bytes_t *b = msg;
    if (!s->closing)
      feed_h2(s, b->data, b->len);
    return 0;
  }
  if (s->closing || s->parser.stopped)
    return 0;                /* after the last request: ignore the rest */
  if (nr_inbound_busy(&s->in))
    return nr_raise(-EBUSY, "http_server: bytes fired into the codec while "
                    "it is delivering a request");
  const nr_bytes_t *b = msg;
  if (!s->sniffed)
    return sniff(s, b->data, b->len);
  nr__hs_feed(s, b->data, b->len);
  return 0;
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
  if (nr_inbound_resumable(&s->in, ctx) && !s->closing && nr__hs_feed(s, NULL, 0))
    nr_ctx_fire_read_complete(ctx);      /* as after a read: handlers flush */
}

int nr_http_server_writability(nr_ctx_t *ctx) {
  nr_http_server_t *s = nr_ctx_state(ctx);
  if (s->h2 != NULL) {         /* HTTP/2 reads on: WINDOW_UPDATEs unblock */
    nr_h2_server_writability(s->h2);
    nr_ctx_fire_writability_changed(ctx);
    return 0;
  }
  return nr_inbound_writability(&s->in, ctx, s, parse_held);
}

/* TLS agreed "h2": HTTP/2 from the first byte. A graceful shutdown:
 * HTTP/2 says GOAWAY. */
int nr_http_server_user_event(nr_ctx_t *ctx, void *evt) {
  nr_http_server_t *s = nr_ctx_state(ctx);
  if (nr_msg_type(evt) == NR_MSG_TLS_EVENT) {
    const nr_tls_event_t *e = evt;
    if (e->kind == NR_TLS_HANDSHAKE) {
      s->tls = true;
      if (s->o.h2 && s->h2 == NULL && e->alpn != NULL &&
          strcmp(e->alpn, "h2") == 0 && s->delivered == 0 && start_h2(s))
        feed_h2(s, NULL, 0);   /* our SETTINGS */
    }
  } else if (evt == &NR_EVT_SHUTDOWN && s->h2 != NULL) {
    nr_h2_server_shutdown(s->h2);
  }
  nr_ctx_fire_user_event(ctx, evt);
  return 0;
}

bool nr_http_server_speaks_h2(const nr_ctx_t *ctx) {
  const nr_handler_t *h = nr_ctx_handler(ctx);
  return h != NULL && h->type != NULL && strcmp(h->type, "http_server") == 0 &&
         ((const nr_http_server_t *)nr_ctx_state(ctx))->o.h2;
}

const nr_handler_t nr_http_server_handler = {
    .type = "http_server", .added = nr_http_server_added, .removed = nr_http_server_removed,
    .active = nr_http_server_active, .inactive = nr_http_server_inactive,
    .channel_read = nr_http_server_channel_read,
    .writability_changed = nr_http_server_writability, .read = nr_http_server_read,
    .user_event = nr_http_server_user_event,
    .write = nr_http_server_write, .read_failed = nr_http_server_read_failed};
