/*
 * http_server_body.c -- streamed request bodies of the HTTP/1.1 server
 * codec (body = "stream"): a request's head is delivered alone and its
 * body read only when someone reads it, at the pace of where it goes.
 * Loop thread only. The section below states the invariants.
 */
#include <assert.h>
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "codec/http_server_internal.h"

/* ---- streamed bodies ----
 *
 * With body = "stream" (the parser's p->stream) a request with a body is
 * handed up as its head; its body stays unread -- the parser paused, the
 * channel's reads held -- until someone reads it: a handler's outbound
 * read (nr_http_server_read), a C sink's claim, or read_body. Then the
 * pieces flow, fired to the handlers (tokened as their request, so that a
 * handler raising on one is answered for) or given to the sink, and the
 * codec stops after a piece while where the body goes cannot take more:
 * the sink says so, or the channel the handlers write it to (read_body's
 * sink) is unwritable, or this channel is (a handler echoing the body to
 * a client that reads nothing). It goes on from a task, as a read would,
 * when that channel (its watch), the sink, or this channel says so. So a
 * body holds at most one read here, however long it is, and a client
 * waiting for "100 Continue" gets it only once its body is read.
 *
 * An answer to a request whose body has not all been read closes the
 * connection after it (F_BODY; the rest is not read: the close lingers
 * over it). A body cut short -- the client closed, sent bad framing or
 * more than max_body, or stopped sending for body_timeout -- ends its
 * sink with the reason (abort), or reaches exception_caught of the
 * handlers, and is answered (400, 413, 408) in its turn unless its answer
 * has begun, when the connection closes after it. */

/* The ring slot of request `token` while it is owed, or -1. */
static int slot_of(const nr_http_server_t *s, uint64_t token) {
  uint64_t oldest = s->delivered - s->outstanding + 1;
  if (token < oldest || token > s->delivered)
    return -1;
  return (int)((s->oldest + (unsigned)(token - oldest)) % RING);
}

static void body_hold(nr_http_server_t *s, bool held) {
  s->body_held = held;
  nr__hs_apply_holds(s);
}

/* The body is over (read whole, or given up): its watch ends and its
 * request is free to be answered keep-alive (when read whole). */
static void body_over(nr_http_server_t *s, bool whole) {
  int i = slot_of(s, s->body_token);
  if (whole && i >= 0)
    s->flags[i] &= (uint16_t)~F_BODY;
  s->body = B_NONE;
  s->sink = NULL;
  s->body_continue = false;
  nr_channel_unwatch(&s->watch);
  if (s->body_held)
    body_hold(s, false);
}

/* Nothing more is parsed (the body is given up): from inside a feed the
 * parser is told to stop (deliver_piece returns 1 on `closing`); outside
 * one its input goes now. Reads stay held: what the client sends now is
 * left to the close that follows the answer. */
static void halt_parser(nr_http_server_t *s) {
  if (!nr_inbound_busy(&s->in)) {
    nr_http_parser_free(&s->parser);
    s->parser.stopped = true;
  } else {
    s->halted = true;
  }
}

/* The body is given up quietly (its request was answered first, or the
 * handlers failed on it): a sink is told. */
void nr__hs_stop_body(nr_http_server_t *s) {
  nr_http_sink_t *k = s->sink;
  body_over(s, false);
  halt_parser(s);
  body_hold(s, true);
  if (k != NULL)
    k->abort(k, "http_server: the request was answered before its body "
             "was read");
}

/* The body is cut short (the client closed, or the codec left): its sink
 * or the handlers hear why. */
void nr__hs_body_gone(nr_http_server_t *s, const char *why) {
  nr_http_sink_t *k = s->sink;
  body_over(s, false);
  if (k != NULL) {
    k->abort(k, why);
  } else {
    nr_err_t err = {-ECONNRESET, why};
    nr_ctx_fire_exception(s->ctx, &err);
  }
}

/* The body went wrong (bad framing, over max_body, a timeout): given up,
 * told, and its request answered `status` in its turn -- or, if its
 * answer has begun, the connection closes after it. */
void nr__hs_fail_body(nr_http_server_t *s, int status, const char *why) {
  nr_http_sink_t *k = s->sink;
  int i = slot_of(s, s->body_token);
  body_over(s, false);
  halt_parser(s);
  body_hold(s, true);
  if (k != NULL) {
    k->abort(k, why);
  } else {
    nr_err_t err = {status == 413 ? NR_ETOOLONG : -EBADMSG, why};
    nr_ctx_fire_exception(s->ctx, &err);
  }
  if (i < 0 || s->closing)
    return;                    /* answered already: it closes after */
  s->flags[i] |= F_CLOSE;
  if ((s->flags[i] & A_MASK) != A_OWED) {
    s->flags[i] |= F_ACLOSE;   /* its answer is under way (or held): then
                                  the close */
    return;
  }
  s->fail_status = status;
  if (nr_channel_is_open(nr_ctx_channel(s->ctx)))
    nr__hs_answer_failed(s, (unsigned)i);   /* (held behind earlier answers) */
}

/* A streamed head: fired, and its body waits to be read (the parser is
 * told to pause) unless a handler read it meanwhile. */
int nr__hs_streamed_head(nr_http_server_t *s, nr_http_request_t *req) {
  nr_channel_t *ch = nr_ctx_channel(s->ctx);
  s->body = B_WAIT;
  s->body_token = req->token;
  s->body_continue = req->expect_continue;
  req->codec = s->ctx;
  req->body = NULL;
  nr_ctx_fire_read_tokened(s->ctx, req, req->token, true);
  if (s->in.removed || s->closing || !nr_channel_is_open(ch) ||
      s->body == B_NONE)
    return 1;                  /* (B_NONE: given up meanwhile) */
  if (s->body == B_WAIT) {
    body_hold(s, true);
    return NR_HTTP_PAUSE;      /* until it is read */
  }
  return nr_inbound_hold(&s->in, ch) ? NR_HTTP_PAUSE : 0;
}

/* Whether where the body goes can take more. */
static bool sink_full(const nr_http_server_t *s) {
  return s->watch.ch != NULL && nr_channel_is_open(s->watch.ch) &&
         !nr_channel_is_writable(s->watch.ch);
}

/* A piece of the body: to the sink, or to the handlers; then stop if
 * where it goes is full. */
int nr__hs_deliver_piece(nr_http_server_t *s, const nr_http_request_t *req) {
  nr_channel_t *ch = nr_ctx_channel(s->ctx);
  nr_http_body_t b = {NR_MSG_HTTP_BODY, req->last, req->body, req->body_len,
                      req->trailers, req->ntrailers, s->body_token, 0};
  nr_http_sink_t *k = s->sink;
  int i = slot_of(s, s->body_token);
  bool go = true, close = i >= 0 && (s->flags[i] & F_CLOSE);
  if (req->last)
    body_over(s, true);        /* (the request may be answered keep-alive) */
  if (k != NULL)
    go = k->piece(k, &b);
  else
    nr_ctx_fire_read_tokened(s->ctx, &b, b.token, false);
  if (s->in.removed || s->closing || s->halted || !nr_channel_is_open(ch))
    return 1;
  if (req->last)
    return close ? 1 : nr_inbound_hold(&s->in, ch) ? NR_HTTP_PAUSE : 0;
  if (s->body == B_NONE)
    return 1;                  /* given up meanwhile (drop_sink) */
  if (!go || sink_full(s)) {
    s->body = B_PAUSED;
    body_hold(s, true);
    return NR_HTTP_PAUSE;
  }
  return nr_inbound_hold(&s->in, ch) ? NR_HTTP_PAUSE : 0;
}

/* From the task body_go queued: parse what is held, as a read would. */
static void body_parse(void *state, nr_ctx_t *ctx) {
  nr_http_server_t *s = state;
  if (nr_inbound_busy(&s->in) || s->closing || s->body == B_PAUSED ||
      !nr_channel_is_open(nr_ctx_channel(ctx)))
    return;
  if (nr_buf_len(&s->parser.in) > 0 && nr__hs_feed(s, NULL, 0))
    nr_ctx_fire_read_complete(ctx);
}

/* The body may flow: first from its head's wait ("100 Continue" if the
 * client waits for it), or again after a pause. */
static void body_go(nr_http_server_t *s) {
  if (s->body == B_WAIT && s->body_continue) {
    s->body_continue = false;
    nr__hs_send_continue(s);
  }
  s->body = B_FLOW;
  body_hold(s, false);
  if (nr_buf_len(&s->parser.in) > 0)
    nr_codec_resume(s->ctx, s, &s->body_resume, body_parse);
  else if (!nr_inbound_busy(&s->in))
    nr__hs_settle(s);                 /* the client's turn: timed */
}

/* Where the body goes turned writable (or closed: the handlers' writes
 * fail there, and they hear it): on. */
static void sink_changed(nr_chwatch_t *w, nr_channel_t *ch) {
  nr_http_server_t *s = (nr_http_server_t *)((char *)w -
                                             offsetof(nr_http_server_t, watch));
  if (!nr_channel_is_open(ch))
    nr_channel_unwatch(w);
  if (s->body == B_PAUSED && !sink_full(s))
    body_go(s);
}

int nr_http_server_read(nr_ctx_t *ctx) {
  nr_http_server_t *s = nr_ctx_state(ctx);
  if (s->h2 != NULL)
    nr_h2_server_read(s->h2);  /* every body waiting (h2_body.c) */
  else if (s->body == B_WAIT && s->sink == NULL)
    body_go(s);
  return nr_ctx_read(ctx);
}

int nr_http_server_claim_body(nr_ctx_t *ctx, uint64_t token, nr_http_sink_t *k) {
  nr_http_server_t *s = nr_ctx_state(ctx);
  if (s->h2 != NULL)
    return s->closing ? -ENOENT : nr_h2_server_claim_body(s->h2, token, k);
  if (s->body != B_WAIT || s->body_token != token || s->closing)
    return -ENOENT;
  s->sink = k;
  body_go(s);
  return 0;
}

void nr_http_server_drop_sink(nr_ctx_t *ctx, nr_http_sink_t *k) {
  nr_http_server_t *s = nr_ctx_state(ctx);
  if (s->h2 != NULL) {
    nr_h2_server_drop_sink(s->h2, k);
    return;
  }
  if (s->sink != k || s->body == B_NONE)
    return;
  body_over(s, false);         /* (F_BODY stays: the answer closes) */
  halt_parser(s);
  body_hold(s, true);
}

void nr_http_server_resume_body(nr_ctx_t *ctx, nr_http_sink_t *k) {
  nr_http_server_t *s = nr_ctx_state(ctx);
  if (s->h2 != NULL)
    nr_h2_server_resume_sink(s->h2, k);
  else if (s->body == B_PAUSED && s->sink == k)
    body_go(s);
}

int nr_http_server_read_body(nr_ctx_t *ctx, uint64_t token, nr_channel_t *sink) {
  nr_http_server_t *s = nr_ctx_state(ctx);
  if (s->h2 != NULL)
    return s->closing ? -ENOENT : nr_h2_server_read_body(s->h2, token, sink);
  if (s->body == B_NONE || s->body_token != token || s->sink != NULL ||
      s->closing)
    return -ENOENT;
  if (sink != NULL && sink != s->watch.ch) {
    nr_channel_unwatch(&s->watch);
    s->watch.fn = sink_changed;
    nr_channel_watch(sink, &s->watch);
  }
  if (s->body == B_WAIT)
    body_go(s);
  return 0;
}

