/*
 * h2_client.c -- HTTP/2 for the HTTP client codec (h2.h): the codec's
 * requests (nr_http_call_t) become streams of one nghttp2 client session,
 * and each stream's whole response becomes one nr_http_reply_t carrying
 * its request's tag (a connection answers in any order: the pool above
 * matches replies by tag). Loop thread only.
 *
 * As on the server (h2_server.c), nghttp2's callbacks only record -- a
 * response's fields and body into its stream, a finished stream into
 * `done` -- and replies are fired once nghttp2_session_mem_recv has
 * returned. A request is submitted and pumped at once, its body framed
 * from the caller's bytes; what the server's window holds back is copied.
 *
 * Failures are per stream where HTTP/2 makes them so: a stream the server
 * resets, or whose response passes max_header or max_body (then we reset
 * it), gets a reply with `error` set; `retry` when the server did not
 * process it (REFUSED_STREAM, or a stream past its GOAWAY), which the pool
 * may send again elsewhere. The handlers after the codec hear of the
 * server's limits and its GOAWAY by a user event (nr_h2_state_t).
 */
#include <errno.h>
#include <pthread.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "codec/h2_internal.h"
#include "codec/http_client.h"
#include "codec/http_parse.h"

typedef struct cs_s cs_t;
struct cs_s {
  uint64_t tag;
  int32_t id;
  int status;                 /* the final response's; 0 before it */
  bool done;                  /* in `done`: its reply is owed */
  bool fired;                 /* its reply went (or nobody waits for it):
                                 freed once nghttp2 closes the stream */
  bool ended;                 /* its END_STREAM came */
  const char *error;          /* why it failed (static text) */
  bool retry;
  nr_buf_t body;
  h2body_t b;                 /* the request body not yet framed */
  cs_t *prev, *next;          /* all the session's streams */
  cs_t *dnext;                /* in done */
  h2fields_t f;               /* the response's fields (last) */
};

struct nr_h2_client_s {
  nghttp2_session *ng;
  nr_ctx_t *ctx;
  size_t max_header, max_body, max_headers;
  bool raw, tls;
  bool pumping, dead, firing;
  cs_t *all;                  /* streams open (or owed a reply) */
  cs_t *done, *done_tail;
  nr_buf_t gather;            /* frames for a write through handlers */
  nr_h2_state_t told;         /* what the handlers were told last */
  bool goaway;
};

static nghttp2_session_callbacks *callbacks;

/* ---- streams ----------------------------------------------------------------------- */

static cs_t *cs_new(nr_h2_client_t *h, uint64_t tag) {
  cs_t *s = nr_h2_alloc(sizeof *s);
  if (s == NULL)
    return NULL;
  memset(s, 0, offsetof(cs_t, f));
  nr__h2_fields_init(&s->f);
  s->tag = tag;
  s->next = h->all;
  if (h->all)
    h->all->prev = s;
  h->all = s;
  return s;
}

static void cs_free(nr_h2_client_t *h, cs_t *s) {
  *(s->prev ? &s->prev->next : &h->all) = s->next;
  if (s->next)
    s->next->prev = s->prev;
  nr_buf_free(&s->body);
  nr_buf_free(&s->b.copy);
  nr__h2_fields_free(&s->f);
  nr_h2_free(s);
}

/* s is finished (answered or failed): its reply goes out after nghttp2
 * returns. */
static void finished(nr_h2_client_t *h, cs_t *s, const char *error,
                     bool retry) {
  if (s->done)
    return;
  s->done = true;
  if (error != NULL && s->error == NULL) {
    s->error = error;
    s->retry = retry;
  }
  s->dnext = NULL;
  *(h->done_tail ? &h->done_tail->dnext : &h->done) = s;
  h->done_tail = s;
}

/* A stream we give up on (its response over a limit): reset. */
static void refuse(nr_h2_client_t *h, cs_t *s, const char *why) {
  nghttp2_submit_rst_stream(h->ng, NGHTTP2_FLAG_NONE, s->id, NGHTTP2_CANCEL);
  finished(h, s, why, false);
}

/* ---- responses in (callbacks: they record) ------------------------------------------ */

static int on_begin_headers(nghttp2_session *ng, const nghttp2_frame *f,
                            void *ud) {
  (void)ud;
  cs_t *s = nghttp2_session_get_stream_user_data(ng, f->hd.stream_id);
  if (s != NULL && f->hd.type == NGHTTP2_HEADERS && s->status >= 200)
    s->f.trailers = true;      /* (a block after the final response's) */
  return 0;
}

static int on_header(nghttp2_session *ng, const nghttp2_frame *f,
                     const uint8_t *name, size_t nl, const uint8_t *value,
                     size_t vl, uint8_t flags, void *ud) {
  (void)flags;
  nr_h2_client_t *h = ud;
  cs_t *s = nghttp2_session_get_stream_user_data(ng, f->hd.stream_id);
  if (s == NULL || s->done || f->hd.type != NGHTTP2_HEADERS)
    return 0;
  if (nl == 7 && memcmp(name, ":status", 7) == 0) {
    int st = 0;
    for (size_t i = 0; i < vl && i < 3; i++)
      st = st * 10 + (value[i] - '0');
    if (st >= 200) {
      s->status = st;
      nr__h2_fields_free(&s->f);   /* (fields of a 1xx before it) */
    }
    return 0;
  }
  if (s->status < 200 && !s->f.trailers)
    return 0;                  /* a 1xx's fields: skipped, as HTTP/1.1's */
  s->f.list_bytes += (uint32_t)(nl + vl + 32);
  if (s->f.list_bytes > h->max_header) {
    refuse(h, s, "http_client: response head too large: fields over "
           "max_header");
    return 0;
  }
  int rc = nr__h2_add_field(&s->f, name, nl, value, vl, h->max_headers);
  if (rc != 0)
    refuse(h, s, rc < 0 ? "http_client: out of memory"
                        : "http_client: response head too large: more "
                          "fields than max_headers");
  return 0;
}

static int on_data(nghttp2_session *ng, uint8_t flags, int32_t id,
                   const uint8_t *data, size_t len, void *ud) {
  (void)flags;
  nr_h2_client_t *h = ud;
  cs_t *s = nghttp2_session_get_stream_user_data(ng, id);
  if (s == NULL || s->done)
    return 0;
  if (nr_buf_len(&s->body) + len > h->max_body) {
    refuse(h, s, "http_client: response too large: body over max_body");
    return 0;
  }
  if (nr_buf_append(&s->body, data, len) < 0)
    refuse(h, s, "http_client: out of memory");
  return 0;
}

static int on_frame_recv(nghttp2_session *ng, const nghttp2_frame *f,
                         void *ud) {
  nr_h2_client_t *h = ud;
  if (f->hd.type == NGHTTP2_GOAWAY)
    h->goaway = true;
  if ((f->hd.type == NGHTTP2_HEADERS || f->hd.type == NGHTTP2_DATA) &&
      (f->hd.flags & NGHTTP2_FLAG_END_STREAM)) {
    cs_t *s = nghttp2_session_get_stream_user_data(ng, f->hd.stream_id);
    if (s != NULL) {
      s->ended = true;
      finished(h, s, s->status >= 200 ? NULL
                                      : "http_client: a response without "
                                        "a status", false);
    }
  }
  return 0;
}

static int on_stream_close(nghttp2_session *ng, int32_t id, uint32_t code,
                           void *ud) {
  nr_h2_client_t *h = ud;
  cs_t *s = nghttp2_session_get_stream_user_data(ng, id);
  if (s == NULL)
    return 0;
  if (s->b.own)                  /* (its request body no longer goes) */
    s->b.len = 0;
  s->id = 0;                   /* (no longer nghttp2's) */
  nghttp2_session_set_stream_user_data(ng, id, NULL);
  if (s->fired) {              /* answered (or given up) before: its */
    cs_free(h, s);             /* record waited for nghttp2 to let go */
    return 0;
  }
  if (!s->done)
    finished(h, s, code == NGHTTP2_REFUSED_STREAM
                       ? "http2: the server refused the stream"
                       : "http2: the server reset the stream",
             code == NGHTTP2_REFUSED_STREAM);
  return 0;
}

/* ---- output ---------------------------------------------------------------------------- */

static void out_bytes(nr_h2_client_t *h, const void *p, size_t n) {
  char *w;
  if (nr_buf_len(&h->gather) == 0 &&
      (w = nr_ctx_write_reserve(h->ctx, n)) != NULL) {
    memcpy(w, p, n);
    nr_ctx_write_commit(h->ctx, n);
  } else if (nr_buf_append(&h->gather, p, n) < 0) {
    h->dead = true;
  }
}

static ssize_t on_send(nghttp2_session *ng, const uint8_t *data, size_t len,
                       int flags, void *ud) {
  (void)ng, (void)flags;
  out_bytes(ud, data, len);
  return (ssize_t)len;
}

static int on_send_data(nghttp2_session *ng, nghttp2_frame *f,
                        const uint8_t *framehd, size_t length,
                        nghttp2_data_source *src, void *ud) {
  (void)ng, (void)f;
  nr_h2_client_t *h = ud;
  cs_t *s = src->ptr;
  out_bytes(h, framehd, 9);
  out_bytes(h, s->b.data, length);
  nr__h2_body_sent(&s->b, length);
  return 0;
}

static ssize_t data_read(nghttp2_session *ng, int32_t id, uint8_t *buf,
                         size_t len, uint32_t *flags, nghttp2_data_source *src,
                         void *ud) {
  (void)ng, (void)id, (void)buf, (void)ud;
  cs_t *s = src->ptr;
  size_t n = len < s->b.len ? len : s->b.len;
  *flags |= NGHTTP2_DATA_FLAG_NO_COPY;
  if (n == s->b.len)
    *flags |= NGHTTP2_DATA_FLAG_EOF;
  return (ssize_t)n;
}

static void make_callbacks(void) {
  nghttp2_session_callbacks *cb;
  if (nghttp2_session_callbacks_new(&cb) != 0)
    return;
  nghttp2_session_callbacks_set_on_begin_headers_callback(cb, on_begin_headers);
  nghttp2_session_callbacks_set_on_header_callback(cb, on_header);
  nghttp2_session_callbacks_set_on_data_chunk_recv_callback(cb, on_data);
  nghttp2_session_callbacks_set_on_frame_recv_callback(cb, on_frame_recv);
  nghttp2_session_callbacks_set_on_stream_close_callback(cb, on_stream_close);
  nghttp2_session_callbacks_set_send_callback(cb, on_send);
  nghttp2_session_callbacks_set_send_data_callback(cb, on_send_data);
  callbacks = cb;
}

/* ---- after nghttp2 returns: replies, what the handlers are told, frames out ---------------- */

static void fire_reply(nr_h2_client_t *h, cs_t *s) {
  nr_http_reply_t r;
  r.type = NR_MSG_HTTP_REPLY;
  r.streaming = r.piece = r.last = false;  /* (its body comes whole) */
  r.tag = s->tag;
  r.h2 = true;
  r.error = s->error;
  r.retry = s->retry;
  r.status = s->error ? 0 : s->status;
  r.minor = 1;
  r.keep_alive = true;
  r.chunked = false;
  r.raw = h->raw;
  r.reason = s->error ? "" : nr_http_reason(s->status);   /* (HTTP/2 has */
  r.reason_len = strlen(r.reason);                        /* none: ours) */
  r.body = nr_buf_len(&s->body) ? nr_buf_peek(&s->body) : "";
  r.body_len = nr_buf_len(&s->body);
  const char *t = s->f.text.p;
  size_t n = 0;
  for (unsigned i = 0; i < (unsigned)s->f.nhdr + s->f.ntrl; i++)
    r.headers[n++] = (nr_http_header_t){t + s->f.hdr[i].name,
                                        t + s->f.hdr[i].value,
                                        s->f.hdr[i].name_len,
                                        s->f.hdr[i].value_len};
  r.nheaders = s->f.nhdr;
  r.ntrailers = s->f.ntrl;
  r.trailers = r.headers + r.nheaders;
  nr_ctx_fire_read(h->ctx, &r);
}

/* What the handlers know of the session: told again when it changes. */
static void tell(nr_h2_client_t *h) {
  nr_h2_state_t now = {NR_MSG_H2_STATE,
                       nghttp2_session_get_remote_settings(
                           h->ng, NGHTTP2_SETTINGS_MAX_CONCURRENT_STREAMS),
                       h->goaway};
  if (now.max_streams == h->told.max_streams && now.goaway == h->told.goaway)
    return;
  h->told = now;
  nr_ctx_fire_user_event(h->ctx, &now);
}

static void pump(nr_h2_client_t *h) {
  if (h->pumping || h->dead)
    return;
  h->pumping = true;
  int rv = nghttp2_session_send(h->ng);
  if (nr_buf_len(&h->gather) > 0) {
    nr_bytes_t b = NR_BYTES(nr_buf_peek(&h->gather), nr_buf_len(&h->gather));
    nr_ctx_write(h->ctx, &b, NULL);
    nr_buf_free(&h->gather);
  }
  h->pumping = false;
  if (rv != 0 || h->dead || (!nghttp2_session_want_read(h->ng) &&
                             !nghttp2_session_want_write(h->ng))) {
    nr_log(NR_LOG_DEBUG, "http_client: the HTTP/2 session ends (%s)",
           rv != 0 ? nghttp2_strerror(rv) : h->dead ? "failed" : "done");
    h->dead = true;
    nr_ctx_flush(h->ctx);
    nr_ctx_close(h->ctx, NULL);  /* (inactive: what is open fails) */
  }
}

/* Nobody waits for s any more: freed, or -- nghttp2 still has its
 * stream (our body was still going; the server answered first) -- reset
 * and freed as nghttp2 closes it (its data source points at s). */
static void let_go(nr_h2_client_t *h, cs_t *s) {
  s->fired = s->done = true;
  if (s->id == 0 || h->dead) {
    cs_free(h, s);
    return;
  }
  nghttp2_submit_rst_stream(h->ng, NGHTTP2_FLAG_NONE, s->id, NGHTTP2_CANCEL);
}

/* Fire the replies owed, in the order their streams finished (all of
 * them at the end; else while the channel stays open). */
static void settle(nr_h2_client_t *h, bool all) {
  h->firing = true;
  cs_t *s;
  while ((s = h->done) != NULL) {
    h->done = s->dnext;
    if (h->done == NULL)
      h->done_tail = NULL;
    fire_reply(h, s);
    let_go(h, s);
    if (!all && !nr_channel_is_open(nr_ctx_channel(h->ctx)))
      break;
  }
  h->firing = false;
}

void nr_h2_client_feed(nr_h2_client_t *h, const char *data, size_t len) {
  if (h->dead)
    return;
  ssize_t rv = nghttp2_session_mem_recv(h->ng, (const uint8_t *)data, len);
  if (rv < 0) {
    char msg[128];
    snprintf(msg, sizeof msg, "http_client: HTTP/2: %s",
             nghttp2_strerror((int)rv));
    nr_err_t err = {-EBADMSG, msg};
    nr_ctx_fire_exception(h->ctx, &err);
    h->dead = true;
    nr_ctx_close(h->ctx, NULL);
    return;
  }
  settle(h, false);
  if (!h->dead && nr_channel_is_open(nr_ctx_channel(h->ctx))) {
    tell(h);
    pump(h);
    nr_ctx_flush(h->ctx);
  }
}

void nr_h2_client_end(nr_h2_client_t *h) {
  h->dead = true;              /* (let_go frees: nghttp2 is done) */
  for (cs_t *s = h->all; s != NULL; s = s->next)
    if (!s->done)
      finished(h, s, "http2: the connection closed before the response",
               s->id != 0 && h->goaway);
  settle(h, true);
}

/* ---- requests out ---------------------------------------------------------------------- */

static bool forbidden(const char *n, size_t l) {
  return nr__http_ieq(n, l, "host", 4) || nr__http_ieq(n, l, "connection", 10) ||
         nr__http_ieq(n, l, "keep-alive", 10) ||
         nr__http_ieq(n, l, "proxy-connection", 16) ||
         nr__http_ieq(n, l, "transfer-encoding", 17) ||
         nr__http_ieq(n, l, "upgrade", 7) || nr__http_ieq(n, l, "te", 2);
}

#define NVC_MAX (NR_HTTP_MAX_HEADERS + 8)

static int cancel(nr_h2_client_t *h, uint64_t tag) {
  for (cs_t *s = h->all; s != NULL; s = s->next)
    if (s->tag == tag && !s->done) {
      let_go(h, s);            /* (a timeout: nobody waits for it now) */
      pump(h);
      return 0;
    }
  return 0;
}

int nr_h2_client_write(nr_h2_client_t *h, const nr_http_call_t *c,
                       nr_promise_t *p) {
  if (c->cancel)
    return cancel(h, c->tag);
  if (h->dead || h->goaway)
    return nr_raise(-EPIPE, "http_client: the HTTP/2 connection takes no "
                    "more requests (GOAWAY)");
  nghttp2_nv *nv = malloc(NVC_MAX * sizeof *nv);
  if (nv == NULL)
    return nr_raise(-ENOMEM, "http_client: out of memory");
  size_t n = 0;
  const nr_http_header_t *host = NULL;
  for (size_t i = 0; i < c->nheaders; i++)
    if (nr__http_ieq(c->headers[i].name, c->headers[i].name_len, "host", 4))
      host = &c->headers[i];
#define NV(nm, nl, v, vl) \
  (nv[n++] = (nghttp2_nv){(uint8_t *)(nm), (uint8_t *)(v), (nl), (vl), \
                          NGHTTP2_NV_FLAG_NONE})
  NV(":method", 7, c->method, c->method_len);
  NV(":scheme", 7, h->tls ? "https" : "http", h->tls ? 5u : 4u);
  NV(":path", 5, c->target, c->target_len);
  if (host != NULL)
    NV(":authority", 10, host->value, host->value_len);
  char low[4096];
  size_t used = 0;
  for (size_t i = 0; i < c->nheaders && n < NVC_MAX; i++) {
    const nr_http_header_t *f = &c->headers[i];
    if (forbidden(f->name, f->name_len) || f->name_len > sizeof low - used)
      continue;
    char *d = low + used;
    for (size_t k = 0; k < f->name_len; k++)
      d[k] = f->name[k] >= 'A' && f->name[k] <= 'Z' ? (char)(f->name[k] + 32)
                                                    : f->name[k];
    used += f->name_len;
    NV(d, f->name_len, f->value, f->value_len);
  }
#undef NV
  cs_t *s = cs_new(h, c->tag);
  if (s == NULL) {
    free(nv);
    return nr_raise(-ENOMEM, "http_client: out of memory");
  }
  s->b.data = c->body;
  s->b.len = c->body ? c->body_len : 0;
  nghttp2_data_provider dp = {.source.ptr = s, .read_callback = data_read};
  int32_t id = nghttp2_submit_request(h->ng, NULL, nv, n,
                                      s->b.len > 0 ? &dp : NULL, s);
  free(nv);
  if (id < 0) {
    cs_free(h, s);
    return nr_raise(-EPROTO, "http_client: HTTP/2: %s", nghttp2_strerror(id));
  }
  s->id = id;
  pump(h);
  /* what the window held back of the body is the caller's: copied */
  if (!h->dead && s->b.len > 0 &&
      nghttp2_session_get_stream_user_data(h->ng, id) == s && !s->b.own) {
    if (nr_buf_append(&s->b.copy, s->b.data, s->b.len) < 0) {
      refuse(h, s, "http_client: out of memory");
    } else {
      s->b.data = nr_buf_peek(&s->b.copy);
      s->b.own = true;
    }
  }
  if (p != NULL && !nr_promise_is_void(p))
    nr_promise_set_success(p, NULL, NULL);
  return 0;
}

/* ---- the session ------------------------------------------------------------------------ */

nr_h2_client_t *nr_h2_client_new(nr_ctx_t *ctx, const nr_http_client_opts_t *o,
                                 bool tls) {
  static pthread_once_t once = PTHREAD_ONCE_INIT;
  pthread_once(&once, make_callbacks);
  if (callbacks == NULL)
    return NULL;
  nr_h2_client_t *h = calloc(1, sizeof *h);
  if (h == NULL)
    return NULL;
  h->ctx = ctx;
  h->tls = tls;
  h->raw = o->raw;
  h->max_header = o->max_header;
  h->max_body = o->max_body;
  h->max_headers = o->max_headers;
  nghttp2_option *opt;
  if (nghttp2_option_new(&opt) != 0) {
    free(h);
    return NULL;
  }
  nghttp2_option_set_max_continuations(opt, NR_H2_MAX_CONTINUATIONS);
  int rc = nghttp2_session_client_new3(&h->ng, callbacks, h, opt, nr_h2_mem());
  nghttp2_option_del(opt);
  /* a response body may be as large as max_body: let it come in one go
   * (up to 16 MiB a stream), and the connection carry a few */
  uint32_t win = o->max_body < (16u << 20) ? (uint32_t)o->max_body : 16u << 20;
  if (win < 65535)
    win = 65535;
  nghttp2_settings_entry iv[] = {
      {NGHTTP2_SETTINGS_ENABLE_PUSH, 0},
      {NGHTTP2_SETTINGS_INITIAL_WINDOW_SIZE, win},
      {NGHTTP2_SETTINGS_MAX_HEADER_LIST_SIZE, (uint32_t)o->max_header}};
  if (rc != 0 || nghttp2_submit_settings(h->ng, NGHTTP2_FLAG_NONE, iv, 3) != 0 ||
      nghttp2_session_set_local_window_size(h->ng, NGHTTP2_FLAG_NONE, 0,
                                            (int32_t)(win < (1u << 30) / 4
                                                          ? win * 4
                                                          : 1u << 30)) != 0) {
    nr_h2_client_free(h);
    return NULL;
  }
  pump(h);
  nr_ctx_flush(ctx);
  tell(h);
  return h;
}

void nr_h2_client_free(nr_h2_client_t *h) {
  if (h == NULL)
    return;
  if (h->ng != NULL)
    nghttp2_session_del(h->ng);
  while (h->all != NULL)
    cs_free(h, h->all);
  nr_buf_free(&h->gather);
  free(h);
}
