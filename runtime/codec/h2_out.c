/*
 * h2_out.c -- the HTTP/2 server's output (h2.h): responses written by the
 * handlers become nghttp2 submissions, and the pump serialises what
 * nghttp2 queued into the channel. Loop thread only.
 *
 * Pumping. A response is submitted and pumped at once, inside the write
 * that gave it: its HEADERS and as much of its body as the peer's windows
 * allow go out there, framed straight from the caller's bytes (DATA with
 * NGHTTP2_DATA_FLAG_NO_COPY: nghttp2 writes the 9-byte frame header, we
 * the payload); only what the windows hold back is copied, into the
 * stream's `copy`, and counted toward the channel's water marks
 * (nr_channel_hold_bytes) so that handlers see it unwritable while the
 * peer keeps its window shut. Frames land at the end of the outbound
 * buffer (nr_ctx_write_reserve) when the codec writes straight to the
 * socket, else they are gathered and written on as one message (through
 * TLS: one record). The pump never runs inside nghttp2's own callbacks
 * (h2_server.c delivers requests after nghttp2_session_mem_recv), and
 * never nests: events it causes (writability) wait for it.
 *
 * Promises complete once nghttp2 has returned (their listeners may
 * write): success when a response's last frame reached the outbound
 * buffer (watched to the socket by the write mark when nothing is in
 * between), failure when its stream was reset first.
 */
#include <assert.h>
#include <pthread.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "codec/h2_internal.h"
#include "codec/http_encode.h"
#include "codec/http_parse.h"

static __thread int pump_depth;   /* pumps running on this thread */

/* ---- bytes out --------------------------------------------------------------------- */

static void out_bytes(nr_h2_server_t *h, const void *p, size_t n) {
  if (n == 0)
    return;
  h->wrote = true;
  char *w;
  if (nr_buf_len(&h->gather) == 0 &&
      (w = nr_ctx_write_reserve(h->ctx, n)) != NULL) {
    memcpy(w, p, n);
    nr_ctx_write_commit(h->ctx, n);
    return;
  }
  if (nr_buf_append(&h->gather, p, n) < 0)
    h->calm = true;            /* out of memory: the session ends */
}

static ssize_t on_send(nghttp2_session *ng, const uint8_t *data, size_t len,
                       int flags, void *ud) {
  (void)ng, (void)flags;
  out_bytes(ud, data, len);
  return (ssize_t)len;
}

void nr__h2_held(nr_h2_server_t *h, ptrdiff_t delta) {
  if (delta == 0)
    return;
  h->held += (size_t)delta;
  nr_channel_hold_bytes(nr_ctx_channel(h->ctx), delta);
}

/* DATA: the frame header nghttp2 made, then the payload from the stream. */
static int on_send_data(nghttp2_session *ng, nghttp2_frame *f,
                        const uint8_t *framehd, size_t length,
                        nghttp2_data_source *src, void *ud) {
  (void)ng, (void)f;
  nr_h2_server_t *h = ud;
  h2s_t *s = src->ptr;
  assert(length <= s->b.len);
  out_bytes(h, framehd, 9);
  out_bytes(h, s->b.data, length);
  if (s->b.own)
    nr__h2_held(h, -(ptrdiff_t)length);
  nr__h2_body_sent(&s->b, length);
  h->progress = nr_now();
  return 0;
}

static ssize_t data_read(nghttp2_session *ng, int32_t id, uint8_t *buf,
                         size_t len, uint32_t *flags, nghttp2_data_source *src,
                         void *ud) {
  (void)ng, (void)id, (void)buf, (void)ud;
  h2s_t *s = src->ptr;
  size_t n = len < s->b.len ? len : s->b.len;
  if (n == 0 && !s->eof) {
    s->deferred = true;
    return NGHTTP2_ERR_DEFERRED;
  }
  *flags |= NGHTTP2_DATA_FLAG_NO_COPY;
  if (n == s->b.len && s->eof)
    *flags |= NGHTTP2_DATA_FLAG_EOF;
  return (ssize_t)n;
}

static int on_frame_send(nghttp2_session *ng, const nghttp2_frame *f,
                         void *ud) {
  nr_h2_server_t *h = ud;
  if (f->hd.type == NGHTTP2_RST_STREAM) {
    nr__h2_reset_sent(h, f->hd.stream_id);
    if (!nr__h2_take(&h->resets_out, h->o.reset_burst, h->o.reset_rate))
      h->calm = true;          /* MadeYouReset: the client makes us reset */
  } else if (f->hd.type == NGHTTP2_DATA && f->hd.length > 0 &&
           h->flood.tokens < h->o.flood_burst)
    h->flood.tokens += 1;      /* its WINDOW_UPDATEs are earned */
  if (h->bodies_head != NULL && (f->hd.flags & NGHTTP2_FLAG_END_STREAM) &&
      (f->hd.type == NGHTTP2_DATA || f->hd.type == NGHTTP2_HEADERS)) {
    h2s_t *s = nghttp2_session_get_stream_user_data(ng, f->hd.stream_id);
    if (s != NULL)             /* a streamed request body left unread */
      nr__h2_body_answered(h, s);
  }
  return 0;
}

void nr__h2_out_callbacks(nghttp2_session_callbacks *cb) {
  nghttp2_session_callbacks_set_send_callback(cb, on_send);
  nghttp2_session_callbacks_set_send_data_callback(cb, on_send_data);
  nghttp2_session_callbacks_set_on_frame_send_callback(cb, on_frame_send);
}

/* ---- promises ------------------------------------------------------------------------ */

struct done_s {
  nr_promise_t *p;
  bool ok;
};

void nr__h2_complete(nr_h2_server_t *h, nr_promise_t *p, bool ok) {
  if (h->ndone == h->cdone) {
    size_t c = h->cdone ? h->cdone * 2 : 8;
    struct done_s *d = nr_h2_alloc(c * sizeof *d);
    if (d == NULL) {           /* (its listeners will not hear) */
      nr_promise_release(p);
      return;
    }
    if (h->ndone)
      memcpy(d, h->done, h->ndone * sizeof *d);
    nr_h2_free(h->done);
    h->done = d;
    h->cdone = c;
  }
  h->done[h->ndone++] = (struct done_s){p, ok};
}

static void run_done(nr_h2_server_t *h) {
  nr_channel_t *ch = nr_ctx_channel(h->ctx);
  bool watch = nr_ctx_writes_to_head(h->ctx);
  while (h->ndone > 0) {
    struct done_s d = h->done[--h->ndone];
    if (!d.ok)
      nr_promise_set_failure(d.p, NR_ECLOSED, "http2: the stream was reset");
    else if (!watch || nr_channel_watch_write(ch, nr_channel_write_mark(ch),
                                              d.p) < 0)
      nr_promise_set_success(d.p, NULL, NULL);
    nr_promise_release(d.p);
  }
}

void nr__h2_fail_done(nr_h2_server_t *h) {
  while (h->ndone > 0) {
    struct done_s d = h->done[--h->ndone];
    nr_promise_set_failure(d.p, NR_ECLOSED, "http2: the connection ended");
    nr_promise_release(d.p);
  }
}

/* ---- the pump ------------------------------------------------------------------------ */

static void finish(nr_h2_server_t *h) {
  h->dead = true;
  nr_channel_t *ch = nr_ctx_channel(h->ctx);
  if (!nr_channel_is_open(ch))
    return;
  nr_channel_linger(ch);       /* its late frames must not reset our GOAWAY */
  nr_ctx_flush(h->ctx);
  nr_ctx_close(h->ctx, NULL);
}

/* nghttp2_session_send into the channel: 0 or nghttp2's error. */
static int send_now(nr_h2_server_t *h) {
  h->pumping = true;
  pump_depth++;
  int rv = nghttp2_session_send(h->ng);
  pump_depth--;
  if (nr_buf_len(&h->gather) > 0) {
    nr_bytes_t b = NR_BYTES(nr_buf_peek(&h->gather), nr_buf_len(&h->gather));
    nr_ctx_write(h->ctx, &b, NULL);
    nr_buf_free(&h->gather);
  }
  h->pumping = false;
  return rv;
}

static bool session_done(nr_h2_server_t *h) {
  return !nghttp2_session_want_read(h->ng) && !nghttp2_session_want_write(h->ng);
}

bool nr__h2_pump(nr_h2_server_t *h, bool flush) {
  if (h->pumping || h->dead)
    return !h->dead;
  int rv = send_now(h);
  if (h->calm && rv == 0) {    /* a limit passed while sending */
    h->calm = false;
    nghttp2_session_terminate_session(h->ng, NGHTTP2_ENHANCE_YOUR_CALM);
    rv = send_now(h);
  }
  if (rv == 0 && h->shutting && !h->goaway2 && session_done(h)) {
    h->goaway2 = true;         /* the last stream finished before the ACK */
    nghttp2_submit_goaway(h->ng, NGHTTP2_FLAG_NONE,
                          nghttp2_session_get_last_proc_stream_id(h->ng),
                          NGHTTP2_NO_ERROR, NULL, 0);
    rv = send_now(h);
  }
  run_done(h);
  if (flush && h->wrote) {
    h->wrote = false;
    nr_ctx_flush(h->ctx);
  }
  if (rv != 0 || session_done(h)) {
    finish(h);
    return false;
  }
  nr__h2_window_check(h);
  return true;
}

/* ---- the send timeout ----------------------------------------------------------------- */

static int window_expired(void *arg) {
  nr_h2_server_t *h = arg;
  nr_timer_release(h->window_timer);
  h->window_timer = NULL;
  if (h->dead)
    return 0;
  uint64_t now = nr_now(), end = h->progress + h->o.send_timeout;
  if (h->held > 0 && now >= end) {
    nr_log(NR_LOG_DEBUG, "http2: the peer kept its window shut for %.0f s",
           (double)h->o.send_timeout / 1e9);
    nr__h2_die(h, NGHTTP2_FLOW_CONTROL_ERROR);
  } else if (h->held > 0) {
    h->window_timer = nr_loop_schedule(nr_channel_loop(nr_ctx_channel(h->ctx)),
                                       end - now, 0, window_expired, NULL, h);
  }
  return 0;
}

/* Data held back by the peer's window: time it (from the last DATA that
 * went out); nothing held: no timer. */
void nr__h2_window_check(nr_h2_server_t *h) {
  if (h->held > 0 && h->window_timer == NULL) {
    if (h->progress == 0)
      h->progress = nr_now();
    h->window_timer = nr_loop_schedule(nr_channel_loop(nr_ctx_channel(h->ctx)),
                                       h->o.send_timeout, 0, window_expired,
                                       NULL, h);
  } else if (h->held == 0 && h->window_timer != NULL) {
    nr_timer_cancel(h->window_timer);
    nr_timer_release(h->window_timer);
    h->window_timer = NULL;
  }
}

/* ---- responses ------------------------------------------------------------------------- */

void nr__h2_settled(nr_h2_server_t *h, h2s_t *s) {
  if (!s->counted)
    return;
  s->counted = false;
  if (--h->owing == 0)
    nr_channel_unhold(nr_ctx_channel(h->ctx));
}

/* Header fields HTTP/2 forbids (RFC 9113 8.2.2): the connection's own
 * (TE among them: a request's "trailers" is h2_check.c's to allow). */
bool nr__h2_connection_field(const char *n, size_t l) {
  switch (l) {
  case 2: return nr__http_ieq(n, l, "te", 2);   /* (only "trailers" is
                                                    allowed: not sent) */
  case 7: return nr__http_ieq(n, l, "upgrade", 7);
  case 10: return nr__http_ieq(n, l, "connection", 10) ||
                  nr__http_ieq(n, l, "keep-alive", 10);
  case 16: return nr__http_ieq(n, l, "proxy-connection", 16);
  case 17: return nr__http_ieq(n, l, "transfer-encoding", 17);
  }
  return false;
}

/* The fields of a response being built. nghttp2 copies the array as it
 * is submitted, and with it every name and value not marked NO_COPY;
 * those marked must live until the pump that follows the submission has
 * framed them: literals, the thread's date, the caller's strings (its
 * write has not returned) and a memo's (not replaced while any pump of
 * the thread runs, pump_depth). What is made here per write (a lowercased
 * name, the length) is copied. */
#define NV_MAX (NR_HTTP_MAX_HEADERS + 8)
typedef struct nvs_s {
  nghttp2_nv v[NV_MAX];
  size_t n;
  char length[24];
  char low[8192];             /* lowercased names; longer ones as given */
  size_t low_used;
} nvs_t;

enum { KEEP = NGHTTP2_NV_FLAG_NO_COPY_NAME | NGHTTP2_NV_FLAG_NO_COPY_VALUE };

static void nv_put(nvs_t *a, const char *name, size_t nl, const char *value,
                   size_t vl, uint8_t flags) {
  if (a->n < NV_MAX)
    a->v[a->n++] = (nghttp2_nv){(uint8_t *)name, (uint8_t *)value, nl, vl,
                                flags};
}

/* A field whose name and value live as long as the write: lowercased
 * into `low` when it has capitals (then that copy is copied). */
static void nv_add(nvs_t *a, const char *name, size_t nl, const char *value,
                   size_t vl) {
  size_t i = 0;
  while (i < nl && !(name[i] >= 'A' && name[i] <= 'Z'))
    i++;
  if (i == nl || a->low_used + nl > sizeof a->low) {
    nv_put(a, name, nl, value, vl, KEEP);
    return;
  }
  char *d = a->low + a->low_used;
  for (i = 0; i < nl; i++)
    d[i] = name[i] >= 'A' && name[i] <= 'Z' ? (char)(name[i] + 32) : name[i];
  a->low_used += nl;
  nv_put(a, d, nl, value, vl, NGHTTP2_NV_FLAG_NO_COPY_VALUE);
}
#define NV_LIT(a, n, v, vl) nv_put((a), n, sizeof n - 1, (v), (vl), KEEP)

/* "100" .. "999", made once. */
static char statuses[900][4];
static pthread_once_t statuses_once = PTHREAD_ONCE_INIT;
static void make_statuses(void) {
  for (int i = 0; i < 900; i++)
    snprintf(statuses[i], sizeof statuses[i], "%03d", i + 100);
}

static void nv_status(nvs_t *a, int status) {
  pthread_once(&statuses_once, make_statuses);
  NV_LIT(a, ":status", statuses[status - 100], 3);
}

/* Which stream a response head answers (see h2.h). */
static h2s_t *answering(nr_h2_server_t *h) {
  if (h->cur != NULL && h->cur->st == S_OWED)
    return h->cur;
  return h->owed.head;
}

/* Whether s is still nghttp2's stream id (a pump may have closed and
 * freed it). */
static bool stream_alive(nr_h2_server_t *h, int32_t id, h2s_t *s) {
  return nghttp2_session_get_stream_user_data(h->ng, id) == s;
}

/* What the windows held back of a body given by the caller, copied
 * before the caller's bytes go away. */
static void keep_rest(nr_h2_server_t *h, h2s_t *s) {
  if (s->b.len == 0 || s->b.own)
    return;
  if (nr_buf_append(&s->b.copy, s->b.data, s->b.len) < 0) {
    nghttp2_submit_rst_stream(h->ng, NGHTTP2_FLAG_NONE, s->id,
                              NGHTTP2_INTERNAL_ERROR);
    s->b.len = 0;
    return;
  }
  s->b.data = nr_buf_peek(&s->b.copy);
  s->b.own = true;
  nr__h2_held(h, (ptrdiff_t)s->b.len);
}

/* Submit s's response (fields in a, body bytes borrowed) and pump; what
 * the windows held back of the body is copied. A streamed response to
 * HEAD (bodyless) stays listed, so that its chunks are dropped. */
static int submit(nr_h2_server_t *h, h2s_t *s, nvs_t *a, const char *body,
                  size_t blen, bool stream, bool bodyless, nr_promise_t *p) {
  int32_t id = s->id;
  s->st = S_SENDING;
  s->b.data = body;
  s->b.len = bodyless ? 0 : blen;
  s->eof = !stream;
  s->discard = bodyless;
  s->streaming = stream;
  if (stream)
    nr__h2_list_push(&h->streaming, s);
  if (p != NULL && !nr_promise_is_void(p))
    s->p = nr_promise_retain(p);
  nghttp2_data_provider dp = {.source.ptr = s, .read_callback = data_read};
  bool data = !bodyless && (stream || blen > 0);
  /* Written from inside our own pump: framed later, so copied. (Framing
   * a read's answers together, once all are delivered, cost more than it
   * saved: 13.3k instructions a request against 12.5k, measured.) */
  bool later = h->pumping;
  if (later)
    for (size_t i = 0; i < a->n; i++)
      a->v[i].flags = NGHTTP2_NV_FLAG_NONE;
  int rv = nghttp2_submit_response(h->ng, id, a->v, a->n, data ? &dp : NULL);
  if (rv != 0) {
    nr_log(NR_LOG_DEBUG, "http2: stream %d: %s", (int)id, nghttp2_strerror(rv));
    if (stream)
      nr__h2_list_remove(&h->streaming, s);
    s->streaming = false;
    s->b.len = 0;
    return 0;                  /* (closed by now: dropped with it) */
  }
  if (!later)
    nr__h2_pump(h, false);
  if (stream_alive(h, id, s))
    keep_rest(h, s);
  return 0;
}

/* A head for a stream the client reset: dropped, and so is the record
 * (but for a streamed one, which stays listed until its end). */
static int drop_answer(nr_h2_server_t *h, h2s_t *s, bool stream,
                       nr_promise_t *p) {
  if (p != NULL && !nr_promise_is_void(p))
    nr_promise_set_failure(p, NR_ECLOSED, "http2: the stream was reset");
  if (stream) {
    s->st = S_SENDING;
    s->streaming = s->discard = true;
    nr__h2_list_push(&h->streaming, s);
    return 0;
  }
  nr__h2_stream_free(h, s);
  return 0;
}

/* The fields every response gets unless the user's give them. */
static void nv_common(nvs_t *a, unsigned user, bool length, size_t blen) {
  if (!(user & U_SERVER))
    NV_LIT(a, "server", "netrun", 6);
  if (!(user & U_DATE))
    NV_LIT(a, "date", nr_http_date(), DATE_LEN);
  if (length && !(user & U_LENGTH)) {
    int n = snprintf(a->length, sizeof a->length, "%zu", blen);
    nv_put(a, "content-length", 14, a->length, (size_t)n,
           NGHTTP2_NV_FLAG_NO_COPY_NAME);
  }
}

static __thread nvs_t *nvs_scratch;
static void thread_owned(void);

static nvs_t *nvs(void) {
  if (nvs_scratch == NULL && (nvs_scratch = malloc(sizeof *nvs_scratch)))
    thread_owned();
  if (nvs_scratch != NULL)
    nvs_scratch->n = nvs_scratch->low_used = 0;
  return nvs_scratch;
}

static int write_response(nr_h2_server_t *h, const nr_http_response_t *r,
                          nr_promise_t *p) {
  h2s_t *s = answering(h);
  if (s == NULL)
    return nr__http_misuse(h->ctx, p,
                           "http_server: a response with no request to answer");
  if (r->status < 100 || r->status > 999)
    return nr__http_misuse(h->ctx, p, "http_server: bad status %d",
                           r->status);
  if (r->status < 200)
    return nr__http_misuse(h->ctx, p, "http_server: HTTP/2 takes no 1xx "
                           "response from handlers (status %d)", r->status);
  nr__h2_list_remove(&h->owed, s);
  nr_http_count_status(r->status);
  if (s->gone)
    return drop_answer(h, s, r->stream, p);
  nvs_t *a = nvs();
  if (a == NULL)
    return nr_raise(-ENOMEM, "http2: out of memory");
  size_t room;
  unsigned user = nr__http_user_flags(r, &room);
  bool bodyless = bodyless_status(r->status) || s->head;
  nv_status(a, r->status);
  nv_common(a, user, !r->stream && !bodyless_status(r->status),
            r->body ? r->body_len : 0);
  for (size_t i = 0; i < r->nheaders; i++) {
    const nr_http_header_t *f = &r->headers[i];
    if (!nr__h2_connection_field(f->name, f->name_len))
      nv_add(a, f->name, f->name_len, f->value, f->value_len);
  }
  return submit(h, s, a, r->body, r->body ? r->body_len : 0, r->stream,
                bodyless, p);
}

/* A prepared response's head read back into fields: lowercased names,
 * values as they are, the date the thread's own (unless the user's
 * headers gave one). */
static void prepared_fields(nvs_t *a, const nr_http_prepared_t *pr,
                            const char *head) {
  nv_status(a, pr->status);
  const char *end = head + pr->head_len;
  const char *line = memchr(head, '\n', pr->head_len);   /* past the status */
  for (line = line ? line + 1 : end; line < end;) {
    const char *eol = memchr(line, '\r', (size_t)(end - line));
    const char *colon = memchr(line, ':', (size_t)(end - line));
    if (eol == NULL || colon == NULL || colon > eol)
      break;
    const char *v = colon + 1;
    while (v < eol && (*v == ' ' || *v == '\t'))
      v++;
    size_t nl = (size_t)(colon - line);
    if ((size_t)(v - head) == pr->date_at && pr->date_at != 0)
      nv_add(a, line, nl, nr_http_date(), DATE_LEN);
    else if (!nr__h2_connection_field(line, nl))
      nv_add(a, line, nl, v, (size_t)(eol - v));
    line = eol + 2;
  }
}

/* Prepared responses are written again and again: the fields of the last
 * few heads a thread wrote are kept (MEMOS of them, each with a copy of
 * its head, which is compared whole, so a response at another address,
 * or a new one at an old address, is recognised by its bytes). */
#define MEMOS 4
#define MEMO_HEAD 1024
typedef struct memo_s {
  uint32_t head_len;
  int date;                   /* the date field's index, or -1 */
  nvs_t nv;                   /* names lowercased in nv.low */
  char head[MEMO_HEAD];
} memo_t;
static __thread memo_t *memos[MEMOS];
static __thread unsigned memo_next;

static memo_t *memo_of(const nr_http_prepared_t *pr) {
  for (int i = 0; i < MEMOS; i++) {
    memo_t *m = memos[i];
    if (m != NULL && m->head_len == pr->head_len &&
        memcmp(m->head, pr->bytes, pr->head_len) == 0)
      return m;
  }
  if (pr->head_len > MEMO_HEAD || pump_depth > 0)
    return NULL;               /* (a memo in use is not replaced) */
  unsigned i = memo_next++ % MEMOS;
  if (memos[i] == NULL) {
    if ((memos[i] = malloc(sizeof *memos[i])) == NULL)
      return NULL;
    thread_owned();
  }
  memo_t *m = memos[i];
  m->head_len = pr->head_len;
  memcpy(m->head, pr->bytes, pr->head_len);
  m->nv.n = m->nv.low_used = 0;
  prepared_fields(&m->nv, pr, m->head);
  m->date = -1;
  for (size_t k = 0; k < m->nv.n; k++) {
    m->nv.v[k].flags = KEEP;   /* (all of it is the memo's) */
    if (m->nv.v[k].value == (uint8_t *)nr_http_date() && pr->date_at != 0)
      m->date = (int)k;
  }
  return m;
}

/* The scratch fields and the memos are the thread's: freed as it ends
 * (a key's destructor runs while its thread's TLS is still there). */
static pthread_key_t thread_key;
static pthread_once_t thread_once = PTHREAD_ONCE_INIT;

static void thread_free(void *unused) {
  (void)unused;
  free(nvs_scratch);
  nvs_scratch = NULL;
  for (int i = 0; i < MEMOS; i++) {
    free(memos[i]);
    memos[i] = NULL;
  }
}

static void thread_key_make(void) { pthread_key_create(&thread_key, thread_free); }

static void thread_owned(void) {
  pthread_once(&thread_once, thread_key_make);
  pthread_setspecific(thread_key, &thread_key);  /* (any non-NULL value) */
}

/* A prepared response: its head's fields (from a memo when it can), its
 * body as it is. */
static int write_prepared(nr_h2_server_t *h, const nr_http_prepared_t *pr,
                          nr_promise_t *p) {
  h2s_t *s = answering(h);
  if (s == NULL)
    return nr__http_misuse(h->ctx, p,
                           "http_server: a response with no request to answer");
  nr__h2_list_remove(&h->owed, s);
  nr_http_count_status(pr->status);
  if (s->gone)
    return drop_answer(h, s, false, p);
  bool bodyless = bodyless_status(pr->status) || s->head;
  const char *body = pr->bytes + pr->head_len + 2;
  memo_t *m = h->pumping ? NULL : memo_of(pr);
  if (m != NULL) {
    if (m->date >= 0)
      m->nv.v[m->date].value = (uint8_t *)nr_http_date();
    return submit(h, s, &m->nv, body, pr->body_len, false, bodyless, p);
  }
  nvs_t *a = nvs();
  if (a == NULL)
    return nr_raise(-ENOMEM, "http2: out of memory");
  prepared_fields(a, pr, pr->bytes);
  return submit(h, s, a, body, pr->body_len, false, bodyless, p);
}

/* The chunks of a streamed response, and its end (a zero-length write). */
static int write_chunk(nr_h2_server_t *h, void *msg, nr_promise_t *p) {
  h2s_t *s = h->cur != NULL && h->cur->streaming ? h->cur : h->streaming.head;
  if (s == NULL)
    return nr__http_misuse(h->ctx, p, "http_server: bytes written on HTTP/2 "
                           "with no streamed response open (write a "
                           "response first)");
  const nr_slice_t *parts;
  nr_slice_t one;
  size_t n = 1, total = 0;
  if (nr_msg_type(msg) == NR_MSG_BYTES) {
    one = (nr_slice_t){((nr_bytes_t *)msg)->data, ((nr_bytes_t *)msg)->len};
    parts = &one;
  } else {
    parts = ((nr_slices_t *)msg)->v;
    n = ((nr_slices_t *)msg)->n;
  }
  for (size_t i = 0; i < n; i++)
    total += parts[i].len;
  int32_t id = s->id;
  if (total == 0) {            /* the end: later chunks go elsewhere */
    nr__h2_list_remove(&h->streaming, s);
    s->streaming = false;
    if (s->gone || s->discard) {
      if (p != NULL && !nr_promise_is_void(p))
        nr_promise_set_success(p, NULL, NULL);
      if (s->gone)
        nr__h2_stream_free(h, s);
      return 0;
    }
    s->eof = true;
    if (p != NULL && !nr_promise_is_void(p) && s->p == NULL)
      s->p = nr_promise_retain(p);
    else if (p != NULL && !nr_promise_is_void(p))
      nr_promise_set_success(p, NULL, NULL);
  } else if (s->gone || s->discard) {
    if (p != NULL && !nr_promise_is_void(p))
      nr_promise_set_success(p, NULL, NULL);
    return 0;
  } else if (s->b.len == 0 && n == 1 && !h->pumping) {
    s->b.data = parts[0].data;   /* borrowed while it is pumped */
    s->b.len = parts[0].len;
    s->b.own = false;
  } else {
    if (!s->b.own && s->b.len > 0)
      keep_rest(h, s);
    for (size_t i = 0; i < n; i++)
      if (nr_buf_append(&s->b.copy, parts[i].data, parts[i].len) < 0)
        return nr_raise(-ENOMEM, "http2: out of memory");
    s->b.data = nr_buf_peek(&s->b.copy);
    s->b.len += total;
    if (!s->b.own)
      s->b.len = total;
    s->b.own = true;
    nr__h2_held(h, (ptrdiff_t)total);
  }
  if (total > 0 && p != NULL && !nr_promise_is_void(p))
    nr_promise_set_success(p, NULL, NULL);  /* taken: the stream's own */
  if (s->deferred) {
    s->deferred = false;
    nghttp2_session_resume_data(h->ng, id);
  }
  nr__h2_pump(h, false);
  if (stream_alive(h, id, s))
    keep_rest(h, s);
  return 0;
}

int nr_h2_server_write(nr_h2_server_t *h, void *msg, nr_promise_t *p) {
  if (h->dead) {
    if (p != NULL && !nr_promise_is_void(p))
      nr_promise_set_failure(p, NR_ECLOSED, "http2: the connection ended");
    return 0;
  }
  switch (nr_msg_type(msg)) {
  case NR_MSG_HTTP_PREPARED: return write_prepared(h, msg, p);
  case NR_MSG_HTTP_RESPONSE: return write_response(h, msg, p);
  case NR_MSG_BYTES:
  case NR_MSG_SLICES: return write_chunk(h, msg, p);
  }
  return nr__http_misuse(h->ctx, p, "http_server: HTTP/2 takes responses and "
                         "the chunks of streamed ones, not this message");
}

/* An answer of the server's own: the status and its reason as text. */
void nr__h2_answer_status(nr_h2_server_t *h, h2s_t *s, int status) {
  nr_http_count_status(status);
  nvs_t *a = nvs();
  if (a == NULL) {
    nghttp2_submit_rst_stream(h->ng, NGHTTP2_FLAG_NONE, s->id,
                              NGHTTP2_INTERNAL_ERROR);
    return;
  }
  static __thread char body[64];
  int n = snprintf(body, sizeof body, "%s\n", nr_http_reason(status));
  nv_status(a, status);
  NV_LIT(a, "content-type", "text/plain", 10);
  nv_common(a, 0, true, (size_t)n);
  submit(h, s, a, body, (size_t)n, false, s->head, NULL);
}
