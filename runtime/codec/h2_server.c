/*
 * h2_server.c -- the HTTP/2 server session (h2.h): nghttp2 parses and
 * checks the frames; this file turns streams into the HTTP codec's
 * requests and keeps the limits nghttp2 does not. Loop thread only.
 *
 * Input. A read goes to nghttp2_session_mem_recv whole. Its callbacks only
 * record: a stream's fields and body into its record (h2_internal.h), a
 * whole request into `ready`, frames that cost without doing work into
 * the buckets. Once it has returned, the ready requests are delivered in
 * order -- firing into the pipeline from inside nghttp2 would let
 * handlers call nghttp2 back while it parses -- and what nghttp2 has to
 * say is pumped out (h2_out.c). While the channel is unwritable, ready
 * requests wait (and so does the window of bodies still arriving), but
 * reading goes on: the peer's WINDOW_UPDATEs are what unblocks our own
 * output, and what it may send meanwhile is bounded below.
 *
 * Limits (each an option, docs/guide/limits.md): at most max_streams
 * open (SETTINGS_MAX_CONCURRENT_STREAMS, nghttp2 refuses more) and
 * 2 x max_streams records alive, resets still owed included (REFUSED_STREAM
 * past it); at most 2 x max_streams streams opened per read (Rapid Reset
 * without resets: GOAWAY ENHANCE_YOUR_CALM); the client's RST_STREAMs
 * and the server's own, and frames that do no work (PING, SETTINGS, empty
 * DATA, WINDOW_UPDATE, PRIORITY), each drain a token bucket whose end is
 * GOAWAY ENHANCE_YOUR_CALM (useful work -- a request, DATA with bytes --
 * earns flood tokens back); a header list is bounded by max_header bytes
 * (RFC 9113's size: 32 per field over its name and value) and
 * max_headers fields, past which the stream is answered 431 and decoding
 * what follows stores nothing; CONTINUATION frames a block, by nghttp2's
 * option; a body by max_body (413); request bodies held per connection by
 * `budget`, past which only the oldest arriving stream gets window.
 */
#include <assert.h>
#include <stddef.h>
#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "codec/h2_internal.h"
#include "codec/http_parse.h"
#include "tls/tls.h"

/* ---- lists and records -------------------------------------------------------- */

void nr__h2_list_push(list_t *l, h2s_t *s) {
  s->next = NULL;
  s->prev = l->tail;
  *(l->tail ? &l->tail->next : &l->head) = s;
  l->tail = s;
}

void nr__h2_list_remove(list_t *l, h2s_t *s) {
  *(s->prev ? &s->prev->next : &l->head) = s->next;
  *(s->next ? &s->next->prev : &l->tail) = s->prev;
  s->prev = s->next = NULL;
}

static void drop_request(nr_h2_server_t *h, h2s_t *s) {
  h->buffered -= nr_buf_len(&s->body);
  nr_buf_free(&s->body);
  nr__h2_fields_free(&s->f);
}

void nr__h2_stream_free(nr_h2_server_t *h, h2s_t *s) {
  if (s->sb != NULL)
    nr__h2_body_detach(h, s);
  if (s->b.own)
    nr__h2_held(h, -(ptrdiff_t)s->b.len);
  nr_buf_free(&s->b.copy);
  if (s->p != NULL)
    nr__h2_complete(h, s->p, false);
  nr__h2_settled(h, s);
  h->records--;
  if (s->pinned) {             /* being delivered: freed once it returns */
    s->doomed = true;
    return;
  }
  drop_request(h, s);
  nr_h2_free(s);
}

/* ---- requests in (nghttp2's callbacks: they record, nothing more) ------------------ */

static nghttp2_session_callbacks *callbacks;

static h2s_t *stream_of(nghttp2_session *ng, int32_t id) {
  return nghttp2_session_get_stream_user_data(ng, id);
}

static int on_begin_headers(nghttp2_session *ng, const nghttp2_frame *f,
                            void *ud) {
  nr_h2_server_t *h = ud;
  int32_t id = f->hd.stream_id;
  if (f->hd.type != NGHTTP2_HEADERS)
    return 0;
  h->hs = NULL;
  if (f->headers.cat != NGHTTP2_HCAT_REQUEST) {
    h2s_t *s = stream_of(ng, id);
    if (s != NULL)
      s->f.trailers = true;
    h->hs = s;
    return 0;
  }
  if (++h->opened > 2 * h->o.max_streams) {
    h->calm = true;            /* Rapid Reset: streams opened and reset */
    return 0;
  }
  if (h->records >= 2 * h->o.max_streams) {
    nghttp2_submit_rst_stream(ng, NGHTTP2_FLAG_NONE, id,
                              NGHTTP2_REFUSED_STREAM);
    return 0;
  }
  h2s_t *s = nr_h2_alloc(sizeof *s);
  if (s == NULL)
    return NGHTTP2_ERR_TEMPORAL_CALLBACK_FAILURE;
  memset(s, 0, offsetof(h2s_t, f));
  nr__h2_fields_init(&s->f);
  s->id = id;
  s->clen = -1;
  if (nghttp2_session_set_stream_user_data(ng, id, s) != 0) {
    nr_h2_free(s);
    return NGHTTP2_ERR_TEMPORAL_CALLBACK_FAILURE;
  }
  h->records++;
  nr__h2_list_push(&h->arriving, s);
  h->hs = s;
  return 0;
}

/* A malformed request (h2_check.c): reset, its frames ignored from now. */
static void malformed(nr_h2_server_t *h, h2s_t *s) {
  s->reset = true;
  nghttp2_submit_rst_stream(h->ng, NGHTTP2_FLAG_NONE, s->id,
                            NGHTTP2_PROTOCOL_ERROR);
}

static bool is(const uint8_t *a, size_t n, const char *lit, size_t ln) {
  return n == ln && memcmp(a, lit, n) == 0;
}
#define IS(a, n, lit) is((a), (n), lit, sizeof lit - 1)

/* A pseudo-header, known by its HF_* flag (h2_check.c checked which may
 * come, and their order). */
static bool pseudo(h2s_t *s, int which, const uint8_t *value, size_t vl) {
  uint32_t *at, *len;
  if (which == HF_METHOD)
    at = &s->method, len = &s->method_len;
  else if (which == HF_PATH)
    at = &s->path, len = &s->path_len;
  else if (which == HF_AUTHORITY)
    at = &s->authority, len = &s->authority_len;
  else
    return true;               /* :scheme */
  int64_t v = nr__h2_keep(&s->f, value, vl);
  if (v < 0)
    return false;
  *at = (uint32_t)v;
  *len = (uint32_t)vl;
  if (at == &s->method)
    s->head = IS(value, vl, "HEAD");
  return true;
}

static int on_header(nghttp2_session *ng, const nghttp2_frame *f,
                     const uint8_t *name, size_t nl, const uint8_t *value,
                     size_t vl, uint8_t flags, void *ud) {
  (void)flags;
  nr_h2_server_t *h = ud;
  h2s_t *s = h->hs != NULL && h->hs->id == f->hd.stream_id
                 ? h->hs : stream_of(ng, f->hd.stream_id);
  if (s == NULL || s->reset ||
      (s->st != S_ARRIVING && !(s->sb != NULL && s->f.trailers)))
    return 0;                  /* refused or reset: decoded only */
  /* A block that decodes into far more than the limit (an HPACK bomb:
   * a large field indexed once, then referenced by one-byte indices)
   * would cost decoding to its end: past 4 x max_header the connection
   * ends, its HPACK state no longer shared. Up to that, 431. */
  s->f.list_bytes += (uint32_t)(nl + vl + 32);
  if (s->f.list_bytes > 4 * h->max_header + 65536) {
    h->die_code = NGHTTP2_ENHANCE_YOUR_CALM;
    return NGHTTP2_ERR_CALLBACK_FAILURE;
  }
  if (s->error)
    return 0;
  if (s->f.list_bytes > h->max_header) {
    s->error = 431;
    return 0;
  }
  int which = nr__h2_check_field(s, name, nl, value, vl);
  if (which < 0) {
    malformed(h, s);
    return 0;
  }
  if (which > 0) {             /* a pseudo-header */
    if (!pseudo(s, which, value, vl))
      s->error = 500;
    return 0;
  }
  int rc = nr__h2_add_field(&s->f, name, nl, value, vl, h->max_headers);
  if (rc != 0)
    s->error = rc < 0 ? 500 : (int16_t)rc;
  return 0;
}

static void whole(nr_h2_server_t *h, h2s_t *s);

static int on_data(nghttp2_session *ng, uint8_t flags, int32_t id,
                   const uint8_t *data, size_t len, void *ud) {
  (void)flags;
  nr_h2_server_t *h = ud;
  nghttp2_session_consume_connection(ng, len);  /* streams bound the rest */
  h2s_t *s = stream_of(ng, id);
  if (s == NULL || s->reset)
    return 0;
  if (s->sb != NULL || s->st == S_ARRIVING) {
    s->got += len;
    if (s->clen >= 0 && s->got > (uint64_t)s->clen) {
      malformed(h, s);         /* more than its Content-Length */
      return 0;
    }
  }
  if (s->sb != NULL) {
    nr__h2_body_data(h, s, data, len);   /* streamed: h2_body.c */
    return 0;
  }
  if (s->st != S_ARRIVING)
    return 0;
  if (!s->error && nr_buf_len(&s->body) + len > h->max_body) {
    s->error = 413;
    h->buffered -= nr_buf_len(&s->body);
    nr_buf_free(&s->body);
  }
  if (s->error) {              /* answered at once; the bytes go */
    nghttp2_session_consume_stream(ng, id, len);
    whole(h, s);
    return 0;
  }
  if (nr_buf_append(&s->body, data, len) < 0) {
    s->error = 500;
    return 0;
  }
  h->buffered += len;
  s->unacked += (uint32_t)len;
  return 0;
}

static void whole(nr_h2_server_t *h, h2s_t *s) {
  if (s == NULL || s->st != S_ARRIVING || s->reset)
    return;
  nr__h2_list_remove(&h->arriving, s);
  s->st = S_READY;
  nr__h2_list_push(&h->ready, s);
  nr__h2_earn(h);
}

/* The client ended s: whole, if its body is as long as it said. */
static void ended(nr_h2_server_t *h, h2s_t *s) {
  if (s != NULL && s->st == S_ARRIVING && !s->reset && !s->error &&
      s->clen >= 0 && s->got != (uint64_t)s->clen)
    malformed(h, s);
  else
    whole(h, s);
}

static int on_frame_recv(nghttp2_session *ng, const nghttp2_frame *f,
                         void *ud) {
  nr_h2_server_t *h = ud;
  bool end = f->hd.flags & NGHTTP2_FLAG_END_STREAM;
  switch (f->hd.type) {
  case NGHTTP2_HEADERS: {
    h2s_t *s = h->hs != NULL && h->hs->id == f->hd.stream_id
                   ? h->hs : stream_of(ng, f->hd.stream_id);
    if (s != NULL && s->reset)
      break;
    if (s != NULL && s->st == S_ARRIVING && s->sb == NULL && !s->error &&
        (f->headers.cat == NGHTTP2_HCAT_REQUEST ? !nr__h2_check_request(s)
                                                : !end)) {
      malformed(h, s);         /* (trailers end the stream) */
    } else if (s != NULL && s->sb != NULL) {
      if (!end || (s->clen >= 0 && s->got != (uint64_t)s->clen))
        malformed(h, s);       /* a streamed body's trailers */
      else
        nr__h2_body_end(h, s);
    } else if (end || (s != NULL && s->error)) {
      ended(h, s);             /* (an error is answered without its body) */
    } else if (s != NULL && h->stream_bodies && s->st == S_ARRIVING) {
      if (!nr__h2_body_open(h, s))   /* its head goes now, its body */
        s->error = 500;        /* after it */
      whole(h, s);
    }
    break;
  }
  case NGHTTP2_DATA:
    if (f->hd.length == 0 && !end)
      nr__h2_flood(h);
    else if (f->hd.length > 0)
      nr__h2_earn(h);
    if (end) {
      h2s_t *s = stream_of(ng, f->hd.stream_id);
      if (s != NULL && s->sb != NULL && !s->reset) {
        if (s->clen >= 0 && s->got != (uint64_t)s->clen)
          malformed(h, s);     /* shorter than its Content-Length */
        else
          nr__h2_body_end(h, s);
      } else {
        ended(h, s);
      }
    }
    break;
  case NGHTTP2_RST_STREAM:
    if (!nr__h2_take(&h->resets_in, h->o.reset_burst, h->o.reset_rate))
      h->calm = true;
    break;
  case NGHTTP2_PING:
    if (!(f->hd.flags & NGHTTP2_FLAG_ACK))
      nr__h2_flood(h);
    else if (h->shutting && !h->final_goaway &&
             memcmp(f->ping.opaque_data, "netrun-g", 8) == 0)
      h->final_goaway = true;  /* sent after mem_recv returns */
    break;
  case NGHTTP2_SETTINGS:
    if (!(f->hd.flags & NGHTTP2_FLAG_ACK))
      nr__h2_flood(h);
    break;
  case NGHTTP2_WINDOW_UPDATE:   /* (PRIORITY: h2_scan.c) */
    nr__h2_flood(h);
    break;
  }
  return 0;
}

static int on_stream_close(nghttp2_session *ng, int32_t id, uint32_t code,
                           void *ud) {
  nr_h2_server_t *h = ud;
  h2s_t *s = stream_of(ng, id);
  if (s == NULL)
    return 0;
  if (h->hs == s)
    h->hs = NULL;
  nghttp2_session_set_stream_user_data(ng, id, NULL);
  if (s->sb != NULL)
    nr__h2_body_detach(h, s);
  switch (s->st) {
  case S_ARRIVING:
    nr__h2_list_remove(&h->arriving, s);
    break;
  case S_READY:
    nr__h2_list_remove(&h->ready, s);
    break;
  case S_OWED:                 /* its answer is still to be written: the */
    s->gone = true;            /* record waits for it in `owed` */
    return 0;
  case S_SENDING:
    if (s->streaming) {        /* ... or for the stream's end: listed */
      s->gone = true;
      if (s->b.own)
        nr__h2_held(h, -(ptrdiff_t)s->b.len);
      s->b.own = false;
      s->b.len = 0;
      nr_buf_free(&s->b.copy);
      if (s->p != NULL)
        nr__h2_complete(h, s->p, false);
      s->p = NULL;
      return 0;
    }
    if (s->p != NULL)
      nr__h2_complete(h, s->p, code == NGHTTP2_NO_ERROR);
    s->p = NULL;
    break;
  }
  nr__h2_stream_free(h, s);
  return 0;
}

static void make_callbacks(void) {
  nghttp2_session_callbacks *cb;
  if (nghttp2_session_callbacks_new(&cb) != 0)
    return;
  nr__h2_check_init();
  nghttp2_session_callbacks_set_on_begin_frame_callback(cb,
                                                        nr__h2_on_begin_frame);
  nghttp2_session_callbacks_set_on_begin_headers_callback(cb, on_begin_headers);
  nghttp2_session_callbacks_set_on_header_callback(cb, on_header);
  nghttp2_session_callbacks_set_on_data_chunk_recv_callback(cb, on_data);
  nghttp2_session_callbacks_set_on_frame_recv_callback(cb, on_frame_recv);
  nghttp2_session_callbacks_set_on_stream_close_callback(cb, on_stream_close);
  nr__h2_out_callbacks(cb);
  callbacks = cb;
}

/* ---- the window of request bodies ------------------------------------------------ */

void nr__h2_credit(nr_h2_server_t *h) {
  if (!nr_channel_is_writable(nr_ctx_channel(h->ctx)))
    return;                    /* a slow reader: the peer waits */
  for (h2s_t *s = h->arriving.head; s != NULL; s = s->next) {
    if (s->unacked == 0)
      continue;
    if (h->buffered > h->budget && s != h->arriving.head)
      break;                   /* the oldest goes on: no deadlock */
    nghttp2_session_consume_stream(h->ng, s->id, s->unacked);
    s->unacked = 0;
  }
}

/* ---- delivery -------------------------------------------------------------------- */

/* The stream's fields as the HTTP codec's request. The text is laid out
 * as HTTP/1.1's head is: the method first and every field after it, in
 * order, so the bindings copy it in one piece (lhttp.c's head_block). */
static bool method_first(h2s_t *s) {
  if (s->method == 0)
    return true;
  uint32_t d = s->method_len, len = s->f.text.len;
  if (!nr__h2_text_add(&s->f, s->f.text.p, d))  /* room for it, then moved to the front */
    return false;
  char *t = s->f.text.p;
  char small[32], *m = d <= sizeof small ? small : malloc(d);
  if (m == NULL)
    return false;
  memcpy(m, t + s->method, d);
  memmove(t + d, t, len);
  memcpy(t, m, d);
  if (m != small)              /* (a method is a short token: malloc and */
    free(m);                   /* free cost 135 instructions a request) */
  s->path += d;
  s->authority += d;
  for (unsigned i = 0; i < (unsigned)s->f.nhdr + s->f.ntrl; i++)
    s->f.hdr[i].name += d, s->f.hdr[i].value += d;
  s->method = 0;
  return true;
}

static bool lower_is(const char *a, size_t n, const char *lit) {
  return n == strlen(lit) && memcmp(a, lit, n) == 0;   /* names are lowercase */
}

/* Cookies joined with "; " (RFC 9113 8.2.3) and a Host from :authority
 * when none came (8.3.1), appended to the text: into r's headers. */
static bool add_derived(h2s_t *s, nr_http_request_t *r, size_t *n) {
  const char *t = s->f.text.p;
  unsigned cookies = 0, first = 0;
  bool host = false;
  for (unsigned i = 0; i < s->f.nhdr; i++) {
    if (lower_is(t + s->f.hdr[i].name, s->f.hdr[i].name_len, "cookie") &&
        cookies++ == 0)
      first = i;
    host |= lower_is(t + s->f.hdr[i].name, s->f.hdr[i].name_len, "host");
  }
  /* appended in the order they go into r, after every field received:
   * the last field's end is the text's (what head_block relies on) */
  uint32_t host_name = 0, cookie = 0, cookie_len = 0;
  if (!host && s->authority_len > 0) {
    host_name = s->f.text.len;
    if (!nr__h2_text_add(&s->f, "host", 4) ||
        !nr__h2_text_add(&s->f, s->f.text.p + s->authority, s->authority_len))
      return false;
  }
  if (cookies > 1) {
    cookie = s->f.text.len;
    for (unsigned i = 0, k = 0; i < s->f.nhdr; i++) {
      const h2hdr_t *c = &s->f.hdr[i];
      if (!lower_is(s->f.text.p + c->name, c->name_len, "cookie"))
        continue;
      if ((k++ > 0 && !nr__h2_text_add(&s->f, "; ", 2)) ||
          !nr__h2_text_add(&s->f, s->f.text.p + c->value, c->value_len))
        return false;
    }
    cookie_len = s->f.text.len - cookie;
  }
  t = s->f.text.p;                 /* (it may have moved) */
  for (unsigned i = 0; i < s->f.nhdr; i++) {
    const h2hdr_t *f = &s->f.hdr[i];
    if (cookies > 1 && lower_is(t + f->name, f->name_len, "cookie"))
      continue;                /* joined, at the end */
    r->headers[(*n)++] = (nr_http_header_t){t + f->name, t + f->value,
                                            f->name_len, f->value_len};
  }
  if (!host && s->authority_len > 0)
    r->headers[(*n)++] = (nr_http_header_t){t + host_name, t + host_name + 4,
                                            4, s->authority_len};
  if (cookies > 1)
    r->headers[(*n)++] = (nr_http_header_t){t + s->f.hdr[first].name, t + cookie,
                                            6, cookie_len};
  return true;
}

/* The path as handlers judge it (HTTP/1.1's rules: dot segments, "//",
 * %XX of unreserved bytes; http_parse.c), when that is not the path as it
 * came: appended to the text, at *at. 0, 1 (appended), or a status. */
static int normal_path(h2s_t *s, size_t len, uint32_t *at, size_t *n) {
  const char *p = s->f.text.p + s->path;
  if (len == 0 || p[0] != '/')
    return 0;                  /* "*" (OPTIONS), a CONNECT's authority */
  char small[512], *out = len <= sizeof small ? small : malloc(len);
  if (out == NULL)
    return 500;
  long m = nr__http_normalize_path(p, len, out);
  int rc = m < 0 ? (int)-m : 0;
  if (m >= 0 && ((size_t)m != len || memcmp(out, p, len) != 0)) {
    *at = s->f.text.len;
    *n = (size_t)m;
    rc = nr__h2_text_add(&s->f, out, (size_t)m) ? 1 : 500;
  }
  if (out != small)
    free(out);
  return rc;
}

/* The request of s, in r; 0 or the status to answer instead. */
static int build(h2s_t *s, nr_http_request_t *r) {
  if (!method_first(s))
    return 500;
  const char *q0 = memchr(s->f.text.p + s->path, '?', s->path_len);
  size_t plen = q0 ? (size_t)(q0 - (s->f.text.p + s->path)) : s->path_len;
  uint32_t norm = 0;
  size_t norm_len = 0;
  int rc = normal_path(s, plen, &norm, &norm_len);
  if (rc > 1)
    return rc;
  size_t n = 0;                /* (pointers from here: the text is whole) */
  if (!add_derived(s, r, &n))
    return 500;
  const char *t = s->f.text.p;
  r->type = NR_MSG_HTTP_REQUEST;
  r->streaming = r->last = false;  /* (its body comes whole) */
  r->codec = NULL;
  r->content_length = 0;
  r->method = t + s->method;
  r->method_len = s->method_len;
  const char *path = t + s->path, *q = memchr(path, '?', s->path_len);
  r->target = path;
  r->target_len = s->path_len;
  r->rewritten = rc == 1;
  r->path = rc == 1 ? t + norm : path;
  r->path_len = rc == 1 ? norm_len : plen;
  r->query = q ? q + 1 : NULL;
  r->query_len = q ? s->path_len - plen - 1 : 0;
  r->minor = 1;
  r->stream = s->id;
  r->keep_alive = true;
  r->expect_continue = r->chunked = r->switches = false;
  r->head = s->head;
  r->body = nr_buf_len(&s->body) ? nr_buf_peek(&s->body) : "";
  r->body_len = nr_buf_len(&s->body);
  r->nheaders = n;
  for (unsigned i = s->f.nhdr; i < (unsigned)s->f.nhdr + s->f.ntrl; i++)
    r->headers[n++] = (nr_http_header_t){t + s->f.hdr[i].name, t + s->f.hdr[i].value,
                                         s->f.hdr[i].name_len, s->f.hdr[i].value_len};
  r->ntrailers = s->f.ntrl;
  r->trailers = r->headers + r->nheaders;
  r->token = 0;
  r->pipeline = NULL;
  return 0;
}

/* Hand s's request to the handlers; it is owed an answer from now on. */
static __attribute__((noinline)) void deliver(nr_h2_server_t *h, h2s_t *s) {
  nr_http_request_t req;
  int bad = build(s, &req);
  if (bad) {
    nr__h2_answer_status(h, s, bad);
    return;
  }
  s->st = S_OWED;
  nr__h2_list_push(&h->owed, s);
  if (h->owing++ == 0)        /* a shutdown waits for the answers owed */
    nr_channel_hold(nr_ctx_channel(h->ctx));
  s->counted = true;
  s->token = ++h->delivered;
  if (s->sb != NULL) {         /* its body follows (h2_body.c) */
    nr__h2_body_delivered(s, &req);
    req.streaming = true;
    req.body = NULL;
    req.ntrailers = 0;
    req.codec = h->ctx;
  }
  req.token = s->token;        /* (a copy fired on later is answered for) */
  req.pipeline = nr_ctx_pipeline(h->ctx);
  h->cur = s;
  s->pinned = true;            /* an answer may close it meanwhile */
  nr_ctx_fire_read_tokened(h->ctx, &req, s->token, false);
  s->pinned = false;
  if (h->cur == s)
    h->cur = NULL;
  drop_request(h, s);
  if (s->doomed)
    nr_h2_free(s);
}

/* Hand up streamed bodies' pieces; false when the codec went away. */
static bool bodies_go(nr_h2_server_t *h) {
  nr__h2_bodies_go(h);
  return !h->in->removed && nr_channel_is_open(nr_ctx_channel(h->ctx));
}

/* Deliver what is ready, in order, while the channel takes answers;
 * false when the codec went away (removed, closed). */
static bool deliver_ready(nr_h2_server_t *h) {
  nr_channel_t *ch = nr_ctx_channel(h->ctx);
  h2s_t *s;
  while ((s = h->ready.head) != NULL && !h->dead) {
    if (!nr_channel_is_writable(ch)) {
      h->in->held = true;      /* nr_h2_server_writability goes on */
      return true;
    }
    nr__h2_list_remove(&h->ready, s);
    if (s->error) {
      nr__h2_answer_status(h, s, s->error);
      continue;
    }
    deliver(h, s);
    if (h->in->removed || !nr_channel_is_open(ch))
      return false;
  }
  return true;
}

/* ---- the session ------------------------------------------------------------------ */

static void defaults(nr_h2_opts_t *o) {
  if (!o->max_streams) o->max_streams = NR_H2_MAX_STREAMS;
  if (!o->window) o->window = NR_H2_WINDOW;
  if (!o->reset_burst) o->reset_burst = NR_H2_RESET_BURST;
  if (!o->reset_rate) o->reset_rate = NR_H2_RESET_RATE;
  if (!o->flood_burst) o->flood_burst = NR_H2_FLOOD_BURST;
  if (!o->flood_rate) o->flood_rate = NR_H2_FLOOD_RATE;
  if (!o->max_continuations) o->max_continuations = NR_H2_MAX_CONTINUATIONS;
  if (!o->send_timeout) o->send_timeout = NR_H2_SEND_TIMEOUT;
}

static nghttp2_option *make_options(const nr_h2_opts_t *o) {
  nghttp2_option *opt;
  if (nghttp2_option_new(&opt) != 0)
    return NULL;
  nghttp2_option_set_no_auto_window_update(opt, 1);
  nghttp2_option_set_no_closed_streams(opt, 1);   /* (h2_scan.c) */
  nghttp2_option_set_no_http_messaging(opt, 1);   /* (h2_check.c) */
  nghttp2_option_set_max_continuations(opt, o->max_continuations);
  /* ours end in ENHANCE_YOUR_CALM first; nghttp2's is the backstop */
  nghttp2_option_set_stream_reset_rate_limit(opt, 2ull * o->reset_burst,
                                             2ull * o->reset_rate);
  return opt;
}

nr_h2_server_t *nr_h2_server_new(nr_ctx_t *ctx, nr_inbound_t *in,
                                 const nr_http_server_opts_t *o) {
  static pthread_once_t once = PTHREAD_ONCE_INIT;
  pthread_once(&once, make_callbacks);
  if (callbacks == NULL)
    return NULL;
  nr_h2_server_t *h = calloc(1, sizeof *h);
  if (h == NULL)
    return NULL;
  h->ctx = ctx;
  h->in = in;
  h->o = o->h2o;
  defaults(&h->o);
  h->max_header = o->max_header;
  h->max_body = o->max_body;
  h->max_headers = o->max_headers;
  h->stream_bodies = o->stream_bodies;
  h->body_timeout = o->body_timeout;
  h->budget = o->max_body > (1u << 20) ? o->max_body : (1u << 20);
  uint64_t now = nr_now();
  h->resets_in = h->resets_out = (bucket_t){h->o.reset_burst, now};
  h->flood = (bucket_t){h->o.flood_burst, now};
  h->scan.skip = NR_H2_PREFACE_LEN;   /* (fed like any bytes) */
  nghttp2_option *opt = make_options(&h->o);
  int rc = opt ? nghttp2_session_server_new3(&h->ng, callbacks, h, opt,
                                             nr_h2_mem())
               : NGHTTP2_ERR_NOMEM;
  nghttp2_option_del(opt);
  nghttp2_settings_entry iv[] = {
      {NGHTTP2_SETTINGS_MAX_CONCURRENT_STREAMS, h->o.max_streams},
      {NGHTTP2_SETTINGS_INITIAL_WINDOW_SIZE, h->o.window},
      {NGHTTP2_SETTINGS_MAX_HEADER_LIST_SIZE, (uint32_t)h->max_header},
      {NGHTTP2_SETTINGS_NO_RFC7540_PRIORITIES, 1}};   /* (h2_scan.c) */
  if (rc != 0 ||
      nghttp2_submit_settings(h->ng, NGHTTP2_FLAG_NONE, iv, 4) != 0) {
    nr_h2_server_free(h);
    return NULL;
  }
  return h;
}

void nr_h2_server_free(nr_h2_server_t *h) {
  if (h == NULL)
    return;
  h->dead = true;
  if (h->window_timer != NULL) {
    nr_timer_cancel(h->window_timer);
    nr_timer_release(h->window_timer);
  }
  nr_codec_resume_cancel(h->resume);
  /* the records nghttp2 still points at go with the session; the rest
   * (owed, streaming) are ours */
  list_t *ours[] = {&h->owed, &h->streaming};
  for (int i = 0; i < 2; i++)
    for (h2s_t *s; (s = ours[i]->head) != NULL;) {
      nr__h2_list_remove(ours[i], s);
      if (!s->gone && h->ng != NULL)
        nghttp2_session_set_stream_user_data(h->ng, s->id, NULL);
      nr__h2_stream_free(h, s);
    }
  list_t *ng_lists[] = {&h->arriving, &h->ready};
  for (int i = 0; i < 2; i++)
    for (h2s_t *s; (s = ng_lists[i]->head) != NULL;) {
      nr__h2_list_remove(ng_lists[i], s);
      nr__h2_stream_free(h, s);
    }
  nr__h2_bodies_free(h);
  if (h->ng != NULL)
    nghttp2_session_del(h->ng);  /* (its callbacks no longer find records) */
  nr__h2_fail_done(h);         /* the connection ended first */
  nr_h2_free(h->done);
  nr_buf_free(&h->rest);
  nr_buf_free(&h->gather);
  if (h->held > 0)
    nr_channel_hold_bytes(nr_ctx_channel(h->ctx), -(ptrdiff_t)h->held);
  free(h);
}

void nr__h2_die(nr_h2_server_t *h, uint32_t code) {
  if (h->dead)
    return;
  nghttp2_session_terminate_session(h->ng, code);
  nr__h2_pump(h, true);
}

/* After nghttp2 returned: the limits it reported, the second GOAWAY. */
static void after(nr_h2_server_t *h) {
  if (h->calm) {
    h->calm = false;
    nr_log(NR_LOG_DEBUG, "http2: a client passed a limit: GOAWAY "
           "ENHANCE_YOUR_CALM");
    nr__h2_die(h, NGHTTP2_ENHANCE_YOUR_CALM);
  }
}

/* The GOAWAY for an error nghttp2_session_mem_recv could not go on
 * after: a flood of what it must answer (SETTINGS, PING ACKs past 1000
 * queued) or a header block of too many CONTINUATIONs is an abuse. */
static uint32_t fatal_code(int rv) {
  switch (rv) {
  case NGHTTP2_ERR_BAD_CLIENT_MAGIC: return NGHTTP2_PROTOCOL_ERROR;
  case NGHTTP2_ERR_FLOODED:
  case NGHTTP2_ERR_TOO_MANY_CONTINUATIONS:
  case NGHTTP2_ERR_TOO_MANY_SETTINGS: return NGHTTP2_ENHANCE_YOUR_CALM;
  }
  return NGHTTP2_INTERNAL_ERROR;
}

int nr_h2_server_feed(nr_h2_server_t *h, const char *data, size_t len) {
  if (h->dead)
    return -1;
  h->opened = 0;
  uint32_t bad = 0;
  if (len > 0)                 /* the frames nghttp2 would let by */
    len = nr__h2_scan(h, (const uint8_t *)data, len, &bad);
  if (len > 0 || bad) {
    ssize_t rv = len > 0 ? nghttp2_session_mem_recv(h->ng,
                                                    (const uint8_t *)data, len)
                         : 0;
    if (rv >= 0 && bad) {
      h->die_code = h->die_code ? h->die_code : bad;
      rv = NGHTTP2_ERR_CALLBACK_FAILURE;
    }
    if (rv < 0) {
      nr_log(NR_LOG_DEBUG, "http2: %s", nghttp2_strerror((int)rv));
      nr__h2_die(h, h->die_code ? h->die_code : fatal_code((int)rv));
      if (!h->dead) {
        h->dead = true;
        nr_ctx_close(h->ctx, NULL);
      }
      return -1;
    }
  }
  after(h);
  if (!h->dead && !deliver_ready(h))
    return -1;                 /* the codec is gone */
  if (h->bodies_head != NULL && !bodies_go(h))
    return -1;
  if (h->dead)
    return -1;
  nr__h2_credit(h);
  if (h->final_goaway && !h->goaway2) {
    h->goaway2 = true;
    nghttp2_submit_goaway(h->ng, NGHTTP2_FLAG_NONE,
                          nghttp2_session_get_last_proc_stream_id(h->ng),
                          NGHTTP2_NO_ERROR, NULL, 0);
  }
  return nr__h2_pump(h, true) ? 0 : -1;
}

/* ---- the codec's other events ------------------------------------------------------ */

void nr_h2_server_read_failed(nr_h2_server_t *h, uint64_t token) {
  for (h2s_t *s = h->owed.head; s != NULL; s = s->next)
    if (s->token == token) {
      nr__h2_list_remove(&h->owed, s);
      nr__h2_answer_status(h, s, 500);
      nr__h2_pump(h, true);
      return;
    }
  for (h2s_t *s = h->streaming.head; s != NULL; s = s->next)
    if (s->token == token && !s->gone) {  /* a streamed answer broken off */
      nghttp2_submit_rst_stream(h->ng, NGHTTP2_FLAG_NONE, s->id,
                                NGHTTP2_INTERNAL_ERROR);
      nr__h2_pump(h, true);
      return;
    }
}

static void go_on(void *state, nr_ctx_t *ctx) {
  nr_h2_server_t *h = state;
  (void)ctx;
  if (h->dead || !h->in->held || nr_inbound_busy(h->in))
    return;
  nr_inbound_enter(h->in);   /* (clears held) */
  bool ok = deliver_ready(h) && (h->bodies_head == NULL || bodies_go(h));
  bool freed = nr_inbound_leave(h->in);
  if (freed || !ok)
    return;                    /* (the codec's removal frees h) */
  nr__h2_credit(h);
  nr__h2_pump(h, true);
  nr_ctx_fire_read_complete(h->ctx);   /* as after a read: handlers flush */
}

void nr_h2_server_writability(nr_h2_server_t *h) {
  if (h->dead || h->pumping)
    return;
  if (nr_channel_is_writable(nr_ctx_channel(h->ctx))) {
    nr__h2_bodies_later(h);
    if (h->in->held)
      nr_codec_resume(h->ctx, h, &h->resume, go_on);
    else if (!nr_inbound_busy(h->in))
      nr__h2_credit(h), nr__h2_pump(h, true);
  }
}

/* RFC 9113 6.8: a GOAWAY with the highest stream id first, so that
 * requests in flight are not lost; after a round trip (our PING's ACK)
 * the one with the last stream processed. Open streams are finished, and
 * the connection closes once none is left (nr__h2_pump: with the second
 * GOAWAY, if the ACK never came). The loop's timers are cancelled by a
 * shutdown, so none bounds the wait: the shutdown's own timeout does. A
 * connection with nothing open gets both at once, and closes. */
void nr_h2_server_shutdown(nr_h2_server_t *h) {
  if (h->dead || h->shutting)
    return;
  h->shutting = true;
  nr_channel_t *ch = nr_ctx_channel(h->ctx);
  nr_channel_delay_shutdown_close(ch, nr_now() + NR_SEC(3600));
  nghttp2_submit_shutdown_notice(h->ng);
  if (nr_h2_server_waiting(h) == NR_H2_IDLE) {
    h->final_goaway = h->goaway2 = true;
    nghttp2_submit_goaway(h->ng, NGHTTP2_FLAG_NONE,
                          nghttp2_session_get_last_proc_stream_id(h->ng),
                          NGHTTP2_NO_ERROR, NULL, 0);
  } else {
    nghttp2_submit_ping(h->ng, NGHTTP2_FLAG_NONE, (const uint8_t *)"netrun-g");
  }
  nr__h2_pump(h, true);
}

void nr_h2_server_expire(nr_h2_server_t *h) {
  if (h->dead)
    return;
  nghttp2_session_terminate_session2(
      h->ng, nghttp2_session_get_last_proc_stream_id(h->ng), NGHTTP2_NO_ERROR);
  nr__h2_pump(h, true);
}

int nr_h2_server_waiting(const nr_h2_server_t *h) {
  if (h->owing > 0 || h->ready.head != NULL || h->held > 0)
    return NR_H2_OWED;
  if (h->arriving.head != NULL)
    return NR_H2_ARRIVING;
  return NR_H2_IDLE;
}
