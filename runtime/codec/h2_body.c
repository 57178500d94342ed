/*
 * h2_body.c -- HTTP/2 request bodies as streams (the server codec's
 * body = "stream", DESIGN.md 9.2), as HTTP/1.1 gives them: a request
 * whose HEADERS leave the stream open is delivered at once (streaming,
 * no body), and its body follows as NR_MSG_HTTP_BODY pieces once a
 * handler reads it (nr_h2_server_read: ctx:read(); nr_h2_server_read_body:
 * req:sink(ch)). Loop thread only, like the session.
 *
 * Flow control is the backpressure. The connection's window is given back
 * as DATA arrives (h2_server.c's on_data); a stream's only as its bytes
 * are handed up, and not while where they go -- the sink channel, else
 * the connection itself -- is unwritable. So what a stream holds is at
 * most its window (SETTINGS_INITIAL_WINDOW_SIZE, the h2_window option)
 * plus the piece being handed up, whatever the body's size, and a slow
 * body holds nobody else: the other streams' windows are their own.
 *
 * A body's state (h2sb_t) is apart from its stream's record: nghttp2 may
 * close the stream (the body ended and the answer went, or the client
 * reset it) before what it holds is handed up. Its pieces, its end and
 * its cut are told only from nr__h2_bodies_go, outside nghttp2 and inside
 * the codec's inbound enter/leave (firing into the pipeline from inside
 * nghttp2 would let handlers call it back while it parses). A body cut
 * short (RST_STREAM, or past max_body: RST_STREAM CANCEL) reaches
 * exception_caught, unless its answer was complete (then it is dropped
 * quietly); a body nobody read when its answer ended is refused with
 * RST_STREAM NO_ERROR (RFC 9113 8.1), as HTTP/1.1 closes after such an
 * answer. A body being read that gets no DATA from the client for
 * body_timeout (all it sent handed up, its window open: the client's
 * turn) is reset (RST_STREAM CANCEL) and its handlers told, the other
 * streams going on: a slowloris upload holds one stream, not the
 * connection.
 */
#include <errno.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "codec/h2_internal.h"
#include "codec/inbound.h"

enum { B_WAIT, B_FLOW };

struct h2sb_s {
  nr_h2_server_t *h;
  h2s_t *s;                   /* its record; NULL once it went */
  int32_t id;
  uint8_t state;              /* B_WAIT until read, then B_FLOW */
  bool delivered;             /* its head was handed up (token set) */
  bool ended;                 /* END_STREAM came: pending is the rest */
  bool cut;                   /* it will not end: told, then freed */
  bool quiet;                 /* ... without a word (answered already) */
  int err;                    /* the cut's error and reason */
  const char *why;
  uint32_t unacked;           /* bytes handed up, window not given back */
  uint64_t got;               /* bytes received (max_body) */
  uint64_t since;             /* when the client's turn began (timeout) */
  uint64_t token;             /* its request's read token */
  nr_buf_t pending;           /* received, not yet handed up */
  nr_http_header_t *trl;      /* its trailers, copied at the end */
  size_t ntrl;
  nr_chwatch_t watch;         /* the sink (req:sink(ch)), if any */
  nr_http_sink_t *sink;       /* a C consumer that claimed it, if any */
  bool paused;                /* ... which said stop: its window waits */
  bool dropped;               /* ... which let go: refused after the answer */
  h2sb_t *prev, *next;        /* in the session's bodies */
};

/* ---- the list ----------------------------------------------------------------- */

static void unlink_body(nr_h2_server_t *h, h2sb_t *sb) {
  *(sb->prev ? &sb->prev->next : &h->bodies_head) = sb->next;
  *(sb->next ? &sb->next->prev : &h->bodies_tail) = sb->prev;
  sb->prev = sb->next = NULL;
}

static void body_free(nr_h2_server_t *h, h2sb_t *sb) {
  unlink_body(h, sb);
  nr_channel_unwatch(&sb->watch);
  if (sb->s != NULL)
    sb->s->sb = NULL;
  nr_buf_free(&sb->pending);
  free(sb->trl);
  free(sb);
}

static void timer_stop(nr_h2_server_t *h) {
  if (h->body_timer != NULL) {
    nr_timer_cancel(h->body_timer);
    nr_timer_release(h->body_timer);
    h->body_timer = NULL;
  }
}

void nr__h2_bodies_free(nr_h2_server_t *h) {
  nr_codec_resume_cancel(h->body_resume);
  h->body_resume = NULL;
  timer_stop(h);
  while (h->bodies_head != NULL) {
    nr_http_sink_t *k = h->bodies_head->sink;
    body_free(h, h->bodies_head);
    if (k != NULL)             /* (as HTTP/1.1's codec tells it, leaving) */
      k->abort(k, "http2: the connection closed before the request body "
               "ended");
  }
}

/* ---- from nghttp2's callbacks: recorded only ------------------------------------ */

bool nr__h2_body_open(nr_h2_server_t *h, h2s_t *s) {
  h2sb_t *sb = calloc(1, sizeof *sb);
  if (sb == NULL)
    return false;
  sb->h = h;
  sb->s = s;
  sb->id = s->id;
  s->sb = sb;
  sb->prev = h->bodies_tail;
  *(h->bodies_tail ? &h->bodies_tail->next : &h->bodies_head) = sb;
  h->bodies_tail = sb;
  return true;
}

static void cut(h2sb_t *sb, int err, const char *why) {
  if (sb->cut || sb->ended)
    return;
  sb->cut = true;
  sb->err = err;
  sb->why = why;
}

void nr__h2_body_data(nr_h2_server_t *h, h2s_t *s, const uint8_t *d,
                      size_t n) {
  h2sb_t *sb = s->sb;
  if (sb->cut)
    return;
  sb->got += n;
  sb->since = nr_now();
  if (sb->got > h->max_body) {
    cut(sb, NR_ETOOLONG, "http2: the request body is larger than max_body");
    nghttp2_submit_rst_stream(h->ng, NGHTTP2_FLAG_NONE, s->id, NGHTTP2_CANCEL);
    return;
  }
  if (nr_buf_append(&sb->pending, d, n) < 0) {
    cut(sb, -ENOMEM, "http2: no memory for a request body");
    nghttp2_submit_rst_stream(h->ng, NGHTTP2_FLAG_NONE, s->id,
                              NGHTTP2_INTERNAL_ERROR);
  }
}

/* The trailers of s (after its headers in s->f), copied: the record may
 * go before they are handed up. */
static void keep_trailers(h2sb_t *sb, const h2fields_t *f) {
  size_t text = 0;
  for (unsigned i = f->nhdr; i < (unsigned)f->nhdr + f->ntrl; i++)
    text += f->hdr[i].name_len + f->hdr[i].value_len;
  sb->trl = malloc(f->ntrl * sizeof *sb->trl + text + 1);
  if (sb->trl == NULL)
    return;                    /* (the body ends without them) */
  char *t = (char *)(sb->trl + f->ntrl);
  for (unsigned i = 0; i < f->ntrl; i++) {
    const h2hdr_t *x = &f->hdr[f->nhdr + i];
    memcpy(t, f->text.p + x->name, x->name_len);
    memcpy(t + x->name_len, f->text.p + x->value, x->value_len);
    sb->trl[i] = (nr_http_header_t){t, t + x->name_len, x->name_len,
                                    x->value_len};
    t += x->name_len + x->value_len;
  }
  sb->ntrl = f->ntrl;
}

void nr__h2_body_end(nr_h2_server_t *h, h2s_t *s) {
  (void)h;
  h2sb_t *sb = s->sb;
  if (sb->cut || sb->ended)
    return;
  sb->ended = true;
  if (s->f.ntrl > 0 && s->f.ntrl <= NR_HTTP_MAX_HEADERS)
    keep_trailers(sb, &s->f);
}

void nr__h2_body_detach(nr_h2_server_t *h, h2s_t *s) {
  h2sb_t *sb = s->sb;
  if (sb == NULL)
    return;
  s->sb = NULL;
  sb->s = NULL;
  sb->quiet |= s->st == S_SENDING && !s->streaming;  /* answered whole */
  cut(sb, -ECONNRESET, "http2: the stream was reset before its request "
      "body ended");
  if (!h->dead)
    nr__h2_bodies_later(h);
}

/* The body's framing for whoever passes it on over HTTP/1.1 (a
 * forwarder, lhttp_xfer.c): its content-length (nghttp2 holds the DATA to
 * it), else chunked. */
static void framing(nr_http_request_t *r) {
  for (size_t i = 0; i < r->nheaders; i++) {
    const nr_http_header_t *f = &r->headers[i];
    if (f->name_len != 14 || memcmp(f->name, "content-length", 14) != 0)
      continue;
    uint64_t v = 0;
    size_t j = 0;
    for (; j < f->value_len && f->value[j] >= '0' && f->value[j] <= '9' &&
           v < UINT64_MAX / 10 - 1; j++)
      v = v * 10 + (uint64_t)(f->value[j] - '0');
    if (j > 0 && j == f->value_len) {
      r->content_length = v;
      return;
    }
  }
  r->chunked = true;
}

void nr__h2_body_delivered(h2s_t *s, nr_http_request_t *r) {
  s->sb->token = s->token;
  s->sb->delivered = true;
  framing(r);
}

/* ---- handed up ---------------------------------------------------------------- */

static bool alive(nr_h2_server_t *h) {
  return !h->dead && !h->in->removed && nr_channel_is_open(nr_ctx_channel(h->ctx));
}

/* Whether where sb's pieces go can take more now. */
static bool full(nr_h2_server_t *h, const h2sb_t *sb) {
  if (sb->sink != NULL)
    return sb->paused;         /* (it says when it takes more) */
  nr_channel_t *k = sb->watch.ch;
  if (k != NULL && nr_channel_is_open(k))
    return !nr_channel_is_writable(k);
  return !nr_channel_is_writable(nr_ctx_channel(h->ctx));
}

/* The window of what was handed up goes back to the client. */
static void give(nr_h2_server_t *h, h2sb_t *sb) {
  if (sb->unacked == 0 || sb->s == NULL)
    return;
  nghttp2_session_consume_stream(h->ng, sb->id, sb->unacked);
  sb->unacked = 0;
  sb->since = nr_now();        /* the client's turn from now */
}

/* Fire what sb has to say: its cut, or a piece. false: the codec went. */
static bool step(nr_h2_server_t *h, h2sb_t *sb) {
  if (sb->cut && sb->sink != NULL) {
    nr_http_sink_t *k = sb->sink;
    char why[160];
    snprintf(why, sizeof why, "%s (stream %d)", sb->why, (int)sb->id);
    body_free(h, sb);
    k->abort(k, why);
    return alive(h);
  }
  if (sb->cut) {
    bool tell = sb->delivered && !sb->quiet;
    char why[160];             /* which stream: several bodies may flow */
    snprintf(why, sizeof why, "%s (stream %d)", sb->why, (int)sb->id);
    nr_err_t err = {sb->err, why};
    body_free(h, sb);
    if (tell)
      nr_ctx_fire_exception(h->ctx, &err);
    return !tell || alive(h);
  }
  if (sb->state != B_FLOW || !sb->delivered || full(h, sb))
    return true;               /* unread, or paused: its window waits */
  size_t n = nr_buf_len(&sb->pending);
  if (n == 0 && !sb->ended) {
    give(h, sb);
    return true;
  }
  nr_http_body_t b = {NR_MSG_HTTP_BODY, sb->ended, n ? nr_buf_peek(&sb->pending) : "",
                      n, sb->trl, sb->ended ? sb->ntrl : 0, sb->token, sb->id};
  if (sb->sink != NULL) {
    if (!sb->sink->piece(sb->sink, &b) && !b.last && sb->sink != NULL)
      sb->paused = true;       /* until nr_h2_server_resume_sink */
  } else {
    h2s_t *cur = h->cur;
    if (sb->s != NULL && sb->s->st == S_OWED)
      h->cur = sb->s;          /* an answer written now is this stream's */
    nr_ctx_fire_read_tokened(h->ctx, &b, b.token, false);
    h->cur = cur;
  }
  if (b.last) {
    body_free(h, sb);
  } else {
    nr_buf_consume(&sb->pending, n);
    sb->unacked += (uint32_t)n;
    if (!full(h, sb))
      give(h, sb);
  }
  return alive(h);
}

/* ---- body_timeout ------------------------------------------------------------- */

/* Whether sb waits on the client: read, not ended, everything it sent
 * handed up and its window given back. */
static bool awaited(nr_h2_server_t *h, const h2sb_t *sb) {
  return sb->state == B_FLOW && sb->delivered && !sb->ended && !sb->cut &&
         sb->s != NULL && sb->unacked == 0 && nr_buf_len(&sb->pending) == 0 &&
         !full(h, sb);
}

static void timer_check(nr_h2_server_t *h);

static int timer_fired(void *arg) {
  nr_h2_server_t *h = arg;
  nr_timer_release(h->body_timer);
  h->body_timer = NULL;
  if (h->dead)
    return 0;
  uint64_t now = nr_now();
  bool any = false;
  for (h2sb_t *sb = h->bodies_head; sb != NULL; sb = sb->next)
    if (awaited(h, sb) && now - sb->since >= h->body_timeout) {
      cut(sb, NR_ETIMEDOUT, "http2: no request body data for body_timeout");
      nghttp2_submit_rst_stream(h->ng, NGHTTP2_FLAG_NONE, sb->id,
                                NGHTTP2_CANCEL);
      any = true;
    }
  if (any) {
    nr__h2_bodies_later(h);    /* (told from there) */
    if (!nr__h2_pump(h, true))
      return 0;
  }
  timer_check(h);
  return 0;
}

/* Arm the timer for the body that has waited on the client the longest
 * (none: no timer). */
static void timer_check(nr_h2_server_t *h) {
  uint64_t first = UINT64_MAX;
  if (h->body_timeout > 0 && !h->dead)
    for (h2sb_t *sb = h->bodies_head; sb != NULL; sb = sb->next)
      if (awaited(h, sb) && sb->since < first)
        first = sb->since;
  if (first == UINT64_MAX) {
    timer_stop(h);
    return;
  }
  if (h->body_timer != NULL)
    return;                    /* (it checks again as it fires) */
  uint64_t now = nr_now(), end = first + h->body_timeout;
  h->body_timer = nr_loop_schedule(nr_channel_loop(nr_ctx_channel(h->ctx)),
                                   end > now ? end - now : 0, 0, timer_fired,
                                   NULL, h);
}

/* ---- handed up, continued ----------------------------------------------------------- */

void nr__h2_bodies_go(nr_h2_server_t *h) {
  if (h->bodies_busy || h->dead)
    return;
  h->bodies_busy = true;
  for (h2sb_t *sb = h->bodies_head, *next; sb != NULL; sb = next) {
    next = sb->next;           /* (only steps free bodies) */
    if (!step(h, sb))
      break;
  }
  h->bodies_busy = false;
  if (alive(h))
    timer_check(h);
}

static void bodies_task(void *state, nr_ctx_t *ctx) {
  nr_h2_server_t *h = state;
  (void)ctx;
  if (h->dead || nr_inbound_busy(h->in))
    return;                    /* (a feed running hands them up) */
  nr_inbound_enter_quiet(h->in);
  nr__h2_bodies_go(h);
  if (nr_inbound_leave(h->in) || !alive(h))
    return;                    /* (the codec's removal frees h) */
  nr__h2_pump(h, true);
  nr_ctx_fire_read_complete(h->ctx);   /* as after a read: handlers flush */
}

void nr__h2_bodies_later(nr_h2_server_t *h) {
  if (h->bodies_head != NULL && !h->dead)
    nr_codec_resume(h->ctx, h, &h->body_resume, bodies_task);
}

/* ---- read by the handlers ------------------------------------------------------ */

static void sink_changed(nr_chwatch_t *w, nr_channel_t *ch) {
  h2sb_t *sb = (h2sb_t *)((char *)w - offsetof(h2sb_t, watch));
  if (!nr_channel_is_open(ch))
    nr_channel_unwatch(w);     /* (then the connection paces it) */
  nr__h2_bodies_later(sb->h);
}

/* The body of request `token` still to be read by someone, or NULL. */
static h2sb_t *body_of(nr_h2_server_t *h, uint64_t token) {
  h2sb_t *sb = h->bodies_head;
  while (sb != NULL && !(sb->delivered && sb->token == token && !sb->cut))
    sb = sb->next;
  return sb == NULL || h->dead || sb->sink != NULL || sb->dropped ? NULL : sb;
}

static h2sb_t *body_of_sink(nr_h2_server_t *h, const nr_http_sink_t *k) {
  h2sb_t *sb = h->bodies_head;
  while (sb != NULL && sb->sink != k)
    sb = sb->next;
  return sb;
}

int nr_h2_server_read_body(nr_h2_server_t *h, uint64_t token,
                           nr_channel_t *sink) {
  h2sb_t *sb = body_of(h, token);
  if (sb == NULL)
    return -ENOENT;
  if (sink != NULL && sink != sb->watch.ch) {
    nr_channel_unwatch(&sb->watch);
    sb->watch.fn = sink_changed;
    nr_channel_watch(sink, &sb->watch);
  }
  if (sb->state == B_WAIT)
    sb->since = nr_now();
  sb->state = B_FLOW;
  nr__h2_bodies_later(h);
  return 0;
}

void nr_h2_server_read(nr_h2_server_t *h) {
  bool any = false;
  for (h2sb_t *sb = h->bodies_head; sb != NULL; sb = sb->next)
    if (sb->delivered && sb->state == B_WAIT && !sb->dropped) {
      sb->state = B_FLOW;
      sb->since = nr_now();
      any = true;
    }
  if (any)
    nr__h2_bodies_later(h);
}

/* ---- claimed by a C sink (a forwarder, nr_http_sink_t) --------------------------- */

/* The sink takes the pieces as they are handed up; the stream's window
 * goes back as it takes them, and not while it says stop (piece returned
 * false) until it resumes: what the stream holds stays within its window
 * whatever the sink's pace, the other streams going on. */
int nr_h2_server_claim_body(nr_h2_server_t *h, uint64_t token,
                            nr_http_sink_t *k) {
  h2sb_t *sb = body_of(h, token);
  if (sb == NULL || sb->state != B_WAIT)
    return -ENOENT;            /* (read by the handlers already) */
  sb->sink = k;
  sb->paused = false;
  sb->state = B_FLOW;
  sb->since = nr_now();
  nr__h2_bodies_later(h);
  return 0;
}

void nr_h2_server_resume_sink(nr_h2_server_t *h, nr_http_sink_t *k) {
  h2sb_t *sb = body_of_sink(h, k);
  if (sb != NULL && sb->paused) {
    sb->paused = false;
    nr__h2_bodies_later(h);
  }
}

/* k lets go before the body ended: the rest is read by nobody, and the
 * stream is refused (RST_STREAM NO_ERROR) once its answer ended, as a
 * body nobody read (HTTP/1.1 closes the connection after the answer). */
void nr_h2_server_drop_sink(nr_h2_server_t *h, nr_http_sink_t *k) {
  h2sb_t *sb = body_of_sink(h, k);
  if (sb == NULL)
    return;
  sb->sink = NULL;
  sb->paused = false;
  sb->dropped = sb->quiet = true;
  sb->state = B_WAIT;          /* (refused as its END_STREAM goes out) */
}

/* An answer's END_STREAM went out on s: a body nobody read is refused
 * (RFC 9113 8.1), as HTTP/1.1 closes after such an answer. */
void nr__h2_body_answered(nr_h2_server_t *h, h2s_t *s) {
  h2sb_t *sb = s->sb;
  if (sb == NULL || sb->cut || sb->state != B_WAIT)
    return;
  sb->quiet = sb->cut = true;  /* (what it holds goes, ended or not) */
  if (!sb->ended)
    nghttp2_submit_rst_stream(h->ng, NGHTTP2_FLAG_NONE, s->id,
                              NGHTTP2_NO_ERROR);
  nr__h2_bodies_later(h);
}
