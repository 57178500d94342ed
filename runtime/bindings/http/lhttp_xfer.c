/*
 * lhttp_xfer.c -- a streamed exchange: a forwarder made with stream =
 * true (client:forwarder, lhttp_lane.c) moves a request body from the
 * client's connection to a pooled backend connection, and the response
 * from that connection back to the client, piece by piece, in C
 * (DESIGN.md §9.2). Loop thread only; the client's and the backend's
 * channels share the loop.
 *
 *   forward(req, cb, ctx)   -- ctx: the client handler's, after the server
 *                           -- codec; the response is written through it
 *   cb(true)                -- the exchange is over: ctx may take the next
 *   cb(nil, err, again)     -- nothing was written: answer it (502, 504);
 *                           -- again: nothing of the request's body was
 *                           -- taken from the client (none, or its claim
 *                           -- never came), so another server may take it
 *   cb(false, err, cut)     -- the client's side is over (its connection
 *                           -- closes, or the codec answers it itself);
 *                           -- cut: because the backend failed after its
 *                           -- head went on (the backend's fault)
 *
 * The pool (lhttp_pool.c) gives the request a connection and writes its
 * head with the body's framing (Content-Length as it came, else chunked);
 * then the exchange (xfer_start) claims the body from the server codec
 * (nr_http_server_claim_body) and turns the client codec's streaming on.
 *
 * Budget, each direction: the body's pieces go to the backend connection
 * while it is writable (its write_buffer_high is `buffer`); past it the
 * sink says stop and the server codec reads nothing more from the client
 * until the backend connection drains (lnr_xfer_writable). The response's
 * pieces go to the client's connection (whose high water mark proxy.lua
 * sets to `buffer`); while it is unwritable the backend connection reads
 * nothing (nr_channel_hold_reads), until the client's drains (the watch).
 * So an exchange holds about 2 x buffer plus a read each way.
 *
 * Ends: the response's last piece with the body all sent: the backend
 * connection goes back to the pool when it keeps alive, and cb(true). A
 * response complete before the body was all sent (the backend answered
 * without reading it): the answer goes to the client, the rest of the
 * body is not read (the server codec closes the client's connection after
 * the answer, lingering), and the backend connection is closed, as its
 * input may still hold body bytes. A body cut short by the client, or the
 * client's connection gone: the backend connection closes (never back to
 * the pool), cb(false). The backend connection lost (or past the timeout
 * before the response head): cb(nil, err) if nothing went to the client
 * yet; once the head went, the client's connection closes (its response
 * cannot be completed) and cb(false).
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "lhttp_pool.h"
#include "codec/http_parse.h"
#include "lhttp_stream.h"
#include "pipeline/lpipeline.h"

struct hxfer {
  nr_http_sink_t sink;        /* the request body's consumer */
  nr_chwatch_t cwatch;        /* the client's channel: writability, close */
  hreq_t *q;                  /* its request in the pool */
  nr_ctx_t *bctx;             /* the backend connection's pool handler,
                                 once started (retained: the connection
                                 may go before the exchange) */
  nr_ctx_t *cctx;             /* the client handler's (retained): writes
                                 go through the server codec before it */
  nr_ctx_t *codec;            /* the server codec with the body (retained
                                 by req), or NULL: no body */
  uint64_t token;             /* the body's request */
  size_t buffer;
  bool chunked;               /* the body goes chunked */
  bool claimed, body_done, body_paused;
  bool head_sent, resp_done, held, keep;
  int depth;                  /* calls into it running (hold) */
  bool dead;                  /* ended while a call ran: freed by the last */
  bool upgrade;               /* the request asks to switch protocols */
  bool tunnel;                /* ... and the backend agreed: a tunnel now */
  bool h2;                    /* the body is an HTTP/2 stream's */
  bool cut;                   /* ... which the client reset (or the codec) */
};

static hxfer_t *of_sink(nr_http_sink_t *k) { return (hxfer_t *)k; }

/* A write can end the exchange under the caller (a client's connection
 * that closes after its answer, a peer that resets): a call holds x, and
 * checks x->dead after each write; the last to let go frees it. */
static void hold(hxfer_t *x) { x->depth++; }

static void let_go(hxfer_t *x) {
  if (--x->depth == 0 && x->dead)
    free(x);
}

static hxfer_t *of_watch(nr_chwatch_t *w) {
  return (hxfer_t *)((char *)w - offsetof(hxfer_t, cwatch));
}

static nr_channel_t *backend(const hxfer_t *x) {
  return x->bctx && !nr_ctx_is_removed(x->bctx) ? nr_ctx_channel(x->bctx) : NULL;
}

/* The backend's reads held (the client cannot take more) or not. */
static void hold_backend(hxfer_t *x, bool held) {
  nr_channel_t *ch = backend(x);
  if (x->held != held && ch != NULL) {
    x->held = held;
    nr_channel_hold_reads(ch, held);
  }
}

static void close_client(hxfer_t *x) {
  if (nr_channel_is_open(nr_ctx_channel(x->cctx))) {
    nr_ctx_flush(x->cctx);     /* (what was written goes first) */
    nr_ctx_close(x->cctx, NULL);
  }
}

/* The response is whole before the body was all sent (the backend
 * answered without reading it): the rest is not read -- the server codec
 * closes the client's connection after the answer -- told before the
 * answer ends, so that the codec does not abort the sink as it closes. */
static void early(hxfer_t *x) {
  if (x->body_done || x->codec == NULL)
    return;
  x->keep = false;             /* (the backend may be reading body bytes) */
  if (x->claimed && !nr_ctx_is_removed(x->codec)) {
    x->claimed = false;
    nr_http_server_drop_sink(x->codec, &x->sink);
  }
}

/* ---- the request body, to the backend ------------------------------------------ */

static bool send_piece(hxfer_t *x, nr_ctx_t *out, const nr_http_body_t *b);

static bool body_piece(nr_http_sink_t *k, const nr_http_body_t *b) {
  hxfer_t *x = of_sink(k);
  nr_channel_t *ch = backend(x);
  if (ch == NULL || !nr_channel_is_open(ch))
    return false;              /* (its close ends the exchange) */
  nr_ctx_t *out = nr_ctx_retain(x->bctx);  /* (x may end midway) */
  hold(x);
  bool go = send_piece(x, out, b);
  nr_ctx_release(out);
  let_go(x);
  return go;
}

static bool send_piece(hxfer_t *x, nr_ctx_t *out, const nr_http_body_t *b) {
  nr_channel_t *ch = nr_ctx_channel(out);
  if (x->chunked) {
    char size[24];
    int n = snprintf(size, sizeof size, "%zx\r\n", b->len);
    nr_slice_t v[3] = {{size, (size_t)n}, {b->data, b->len}, {"\r\n", 2}};
    if (b->len > 0) {
      nr_slices_t sl = {NR_MSG_SLICES, v, 3};
      nr_ctx_write(out, &sl, NULL);
    }
    if (b->last) {             /* the end, with a chunked body's trailers */
      nr_ctx_write(out, &NR_BYTES("0\r\n", 3), NULL);
      for (size_t i = 0; i < b->ntrailers; i++) {
        const nr_http_header_t *t = &b->trailers[i];
        nr_slice_t f[4] = {{t->name, t->name_len}, {": ", 2},
                           {t->value, t->value_len}, {"\r\n", 2}};
        nr_slices_t sl = {NR_MSG_SLICES, f, 4};
        nr_ctx_write(out, &sl, NULL);
      }
      nr_ctx_write(out, &NR_BYTES("\r\n", 2), NULL);
    }
  } else if (b->len > 0) {
    nr_ctx_write(out, &NR_BYTES(b->data, b->len), NULL);
  }
  nr_ctx_flush(out);
  if (x->dead)
    return false;
  if (b->last) {
    x->body_done = true;
    x->claimed = false;        /* (the codec forgot the sink) */
    return true;
  }
  lnr_pool_xfer_retime(x->q);
  if (!nr_channel_is_writable(ch)) {
    x->body_paused = true;     /* on when the backend drains */
    return false;
  }
  return true;
}

/* The client's body will not come whole: the backend, which has a part
 * of it, cannot be reused; the client's connection is the codec's to end
 * (it answers 400/408/413 itself, or closes). An HTTP/2 stream's body was
 * cut with its stream, the connection's other streams going on: nothing
 * answered yet, cb(nil, err) -- the answer written for it is dropped, and
 * the next stream's is not taken for it; a streamed answer under way is
 * ended (dropped too), and cb(false). */
static void body_abort(nr_http_sink_t *k, const char *why) {
  hxfer_t *x = of_sink(k);
  x->claimed = false;
  x->keep = false;
  x->cut = x->h2;
  if (!x->h2 || x->head_sent)
    lnr_pool_xfer_gone(x->q);
  lnr_pool_xfer_end(x->q, false, why);
}

void lnr_xfer_writable(hxfer_t *x) {
  nr_channel_t *ch = backend(x);
  if (x->body_paused && x->claimed && ch != NULL && nr_channel_is_writable(ch) &&
      !nr_ctx_is_removed(x->codec)) {
    x->body_paused = false;
    nr_http_server_resume_body(x->codec, &x->sink);
  }
}

/* ---- the response, to the client -------------------------------------------------- */

/* The client's connection turned writable (the backend reads on), or
 * closed (the exchange ends; the backend connection with it, unless the
 * response was whole and the body all sent). */
static void client_changed(nr_chwatch_t *w, nr_channel_t *ch) {
  hxfer_t *x = of_watch(w);
  if (!nr_channel_is_open(ch)) {
    nr_channel_unwatch(w);
    if (x->dead)
      return;
    hold(x);
    lnr_pool_xfer_gone(x->q);
    lnr_pool_xfer_end(x->q, false, "the client's connection closed");
    let_go(x);
    return;
  }
  if (x->held && nr_channel_is_writable(ch))
    hold_backend(x, false);
}

/* The backend's head: end-to-end fields to the client (a HEAD's
 * Content-Length kept), streamed when a body follows. */
static void write_head(hxfer_t *x, const nr_http_reply_t *r) {
  nr_http_header_t small[32], *kept = small;
  if (r->nheaders + 2 > sizeof small / sizeof small[0] &&
      (kept = malloc((r->nheaders + 2) * sizeof *kept)) == NULL) {
    close_client(x);
    return;
  }
  size_t n = 0;
  for (size_t i = 0; i < r->nheaders; i++) {
    const nr_http_header_t *h = &r->headers[i];
    if (!lnr_http_hop_by_hop(h->name, h->name_len) ||
        ((r->head || (r->streaming && !r->chunked)) && h->name_len == 14 &&
         strncasecmp(h->name, "content-length", 14) == 0))
      kept[n++] = *h;
    else if (r->status == 101 && h->name_len == 7 &&
             strncasecmp(h->name, "upgrade", 7) == 0)
      kept[n++] = *h;          /* a switch: the protocol the backend took */
  }
  if (r->status == 101)
    kept[n++] = (nr_http_header_t){"Connection", "upgrade", 10, 7};
  nr_http_response_t res = {.type = NR_MSG_HTTP_RESPONSE, .status = r->status,
                            .headers = kept, .nheaders = n,
                            .body = r->body, .body_len = r->body_len,
                            .stream = r->streaming};
  x->head_sent = true;
  nr_ctx_write(x->cctx, &res, NULL);
  if (kept != small)
    free(kept);
}

/* The backend switched protocols: if the client asked, the 101 goes to
 * it and the two connections become a tunnel (lhttp_tunnel.c), out of the
 * pool; if not, the backend is not to be trusted: closed, and the client
 * gets a 502 (cb(nil, err)). */
static void switched(hxfer_t *x, const nr_http_reply_t *r) {
  if (!x->upgrade) {
    lnr_pool_xfer_end(x->q, false, "the backend switched protocols (101) "
                      "though the request did not ask to");
    return;
  }
  write_head(x, r);
  nr_ctx_flush(x->cctx);
  x->tunnel = true;
  if (lnr_tunnel_start(x->cctx, x->bctx) < 0)
    close_client(x);
  lnr_pool_xfer_detach(x->q);
  lnr_pool_xfer_gone(x->q);
  lnr_pool_xfer_end(x->q, false, "switched protocols: a tunnel now");
}

/* A message of the backend connection while the exchange has it. */
/* The message; true when the response ended (the exchange with it). */
static bool response(hxfer_t *x, nr_ctx_t *cctx, void *msg) {
  int type = nr_msg_type(msg);
  if (type == NR_MSG_HTTP_REPLY) {
    const nr_http_reply_t *r = msg;
    lnr_pool_xfer_retime(x->q);  /* (the timeout bounds each wait) */
    if (r->status == 101) {
      switched(x, r);
      return false;
    }
    x->keep = r->keep_alive;
    if (!r->streaming)
      early(x);
    write_head(x, r);
    if (r->streaming || x->dead)
      return false;            /* (flushed with the body's first piece) */
  } else if (type == NR_MSG_HTTP_BODY && x->head_sent && !x->resp_done) {
    const nr_http_body_t *b = msg;
    if (b->len > 0)
      nr_ctx_write(cctx, &NR_BYTES(b->data, b->len), NULL);
    if (x->dead)
      return false;
    if (!b->last) {            /* flushed as the backend's read ends */
      lnr_pool_xfer_retime(x->q);
      if (!nr_channel_is_writable(nr_ctx_channel(cctx)))
        hold_backend(x, true);
      return false;
    }
    early(x);
    nr_ctx_write(cctx, &NR_BYTES("", 0), NULL);   /* the end */
  } else {
    return false;
  }
  nr_ctx_flush(cctx);          /* (an answer that closes may end x here) */
  return !x->dead;
}

void lnr_xfer_read(hxfer_t *x, void *msg) {
  nr_ctx_t *cctx = nr_ctx_retain(x->cctx);   /* (x may end midway) */
  hold(x);
  if (response(x, cctx, msg)) {
    x->resp_done = true;
    lnr_pool_xfer_end(x->q, x->keep, NULL);
  }
  nr_ctx_release(cctx);
  let_go(x);
}

void lnr_xfer_read_complete(hxfer_t *x) {
  if (x->head_sent && !x->tunnel && !x->dead)
    nr_ctx_flush(x->cctx);
}

/* ---- its life --------------------------------------------------------------------- */

const char *lnr_xfer_start(hxfer_t *x, hconn_t *c) {
  nr_ctx_t *http = nr_pipeline_context(nr_ctx_pipeline(c->ctx), "http");
  if (http == NULL || !nr_http_client_set_stream(http, true))
    return "the backend connection cannot stream (HTTP/2, or done)";
  x->bctx = nr_ctx_retain(c->ctx);
  nr_channel_t *ch = nr_ctx_channel(c->ctx);
  const nr_channel_opts_t *o = nr_channel_options(ch);
  if (o->write_buffer_high != x->buffer) {   /* (a set costs syscalls) */
    nr_channel_set_option(ch, "write_buffer_high", (int)x->buffer);
    nr_channel_set_option(ch, "write_buffer_low", (int)(x->buffer / 2));
  }
  if (x->codec == NULL) {
    x->body_done = true;
    return NULL;
  }
  if (nr_ctx_is_removed(x->codec) ||
      nr_http_server_claim_body(x->codec, x->token, &x->sink) < 0)
    return "the client's request body is gone";
  x->claimed = true;
  x->q->taken = true;          /* (not to be sent again, from here on) */
  return NULL;
}

bool lnr_xfer_may_retry(hxfer_t *x) {
  if (x->codec != NULL || x->head_sent)
    return false;              /* a body taken, or an answer begun */
  if (x->bctx != NULL)
    nr_ctx_release(x->bctx);
  x->bctx = NULL;
  return true;
}

void lnr_xfer_free(hxfer_t *x, const char *err, bool reuse) {
  if (backend(x) != NULL && err != NULL && !x->tunnel) {
    nr_channel_abort(backend(x));   /* failed midway: what it sends or
                                       holds is of no use (a reset, not a
                                       lingering close over held reads) */
  } else if (backend(x) != NULL && !reuse && !x->tunnel) {
    nr_ctx_close(x->bctx, NULL);
  } else if (backend(x) != NULL) {
    hold_backend(x, false);
    nr_ctx_t *http = nr_pipeline_context(nr_ctx_pipeline(x->bctx), "http");
    if (http != NULL && nr_ctx_handler(http) != NULL &&
        strcmp(nr_ctx_handler(http)->type, "http_client") == 0)
      nr_http_client_set_stream(http, false);
  }
  if (x->bctx != NULL)
    nr_ctx_release(x->bctx);
  if (x->claimed && !nr_ctx_is_removed(x->codec))
    nr_http_server_drop_sink(x->codec, &x->sink);
  nr_channel_unwatch(&x->cwatch);
  if (err != NULL && x->head_sent && x->cut && !x->resp_done &&
      nr_channel_is_open(nr_ctx_channel(x->cctx))) {
    nr_ctx_write_and_flush(x->cctx, &NR_BYTES("", 0), NULL);  /* (its
                                  stream is reset: the end frees it) */
  } else if (err != NULL && x->head_sent && !x->tunnel) {
    if (x->q != NULL && !x->q->gone)
      x->q->gone = x->q->cut = true;   /* cb(false, err, true), not nil */
    close_client(x);           /* its response cannot be completed */
  }
  if (x->codec != NULL)
    nr_ctx_release(x->codec);
  nr_ctx_release(x->cctx);
  x->cctx = x->bctx = x->codec = NULL;
  x->dead = true;
  if (x->depth == 0)
    free(x);
}

/* Whether the request asks to switch protocols (Upgrade, with upgrade
 * among its Connection tokens): its Upgrade value then (*v, *n). */
static bool asks_upgrade(lua_State *L, int req, const char **v, size_t *n) {
  nr_http_header_t f[NR_HTTP_MAX_HEADERS];
  size_t k = lnr_http_forward_fields(L, req, f, NR_HTTP_MAX_HEADERS);
  bool conn = false;
  *v = NULL;
  for (size_t i = 0; i < k && i < NR_HTTP_MAX_HEADERS; i++) {
    if (f[i].name_len == 7 && strncasecmp(f[i].name, "upgrade", 7) == 0) {
      *v = f[i].value;
      *n = f[i].value_len;
    } else if (f[i].name_len == 10 && strncasecmp(f[i].name, "connection", 10) == 0) {
      conn = conn || nr__http_has_token(f[i].value, f[i].value_len, "upgrade", 7);
    }
  }
  return conn && *v != NULL;
}

hxfer_t *lnr_xfer_new(lua_State *L, int req, int ctx, size_t buffer) {
  nr_ctx_t *cctx = lnr_check_ctx(L, ctx);
  lnr_http_body_ref_t b;
  bool body = lnr_http_request_body(L, req, &b);
  if (body && (b.codec == NULL || nr_ctx_is_removed(b.codec)))
    luaL_error(L, "netrun.http forwarder: the request's connection is gone");
  hxfer_t *x = calloc(1, sizeof *x);
  if (x == NULL)
    luaL_error(L, "netrun.http forwarder: out of memory");
  x->sink = (nr_http_sink_t){.piece = body_piece, .abort = body_abort};
  x->cwatch.fn = client_changed;
  x->cctx = nr_ctx_retain(cctx);
  x->buffer = buffer;
  const char *up;
  size_t upn;
  x->upgrade = asks_upgrade(L, req, &up, &upn);   /* (its value: later) */
  if (body) {
    x->codec = nr_ctx_retain(b.codec);
    x->token = b.token;
    x->chunked = b.chunked;
    lua_getfield(L, req, "stream");   /* (its HTTP/2 stream, or nil) */
    x->h2 = lua_toboolean(L, -1);
    lua_pop(L, 1);
  }
  nr_channel_watch(nr_ctx_channel(cctx), &x->cwatch);
  return x;
}

void lnr_xfer_bind(hxfer_t *x, hreq_t *q) {
  x->q = q;
  q->streamed = true;
  q->x = x;
}

void lnr_xfer_push_headers(lua_State *L, hxfer_t *x, int req, int headers) {
  if (x->codec == NULL && !x->upgrade) {
    lua_pushvalue(L, headers);
    return;
  }
  lua_newtable(L);
  if (lua_istable(L, headers)) {
    lua_pushnil(L);
    while (lua_next(L, headers)) {
      lua_pushvalue(L, -2);
      lua_insert(L, -2);
      lua_rawset(L, -4);
    }
  }
  if (x->upgrade) {            /* asked of the backend in turn */
    const char *up;
    size_t n;
    asks_upgrade(L, req, &up, &n);
    lua_pushlstring(L, up, n);
    lua_setfield(L, -2, "upgrade");
    lua_pushliteral(L, "upgrade");
    lua_setfield(L, -2, "connection");
  }
  if (x->codec != NULL && x->chunked) {         /* the body's framing */
    lua_pushliteral(L, "chunked");
    lua_setfield(L, -2, "transfer-encoding");
  } else if (x->codec != NULL) {
    lnr_http_body_ref_t b;
    lnr_http_request_body(L, req, &b);
    lua_pushfstring(L, "%I", (LUAI_UACINT)b.content_length);
    lua_setfield(L, -2, "content-length");
  }
}
