/*
 * lhttp_tunnel.c -- a byte tunnel between two connections of one loop:
 * what a stream forwarder (lhttp_xfer.c) makes of a client's connection
 * and its backend's once the backend answered an Upgrade (a WebSocket)
 * with 101. The HTTP codecs step aside: on the client's side the server
 * codec is replaced by a tunnel handler (what the client sent after its
 * request is handed over to it); on the backend's the client codec,
 * stopped after the 101, passes bytes through (what came with the 101
 * first) and a tunnel handler goes last.
 *
 * Each side writes what it reads to the other and flushes. Budget: while
 * the other side's connection is unwritable (over its write_buffer_high:
 * `buffer` on both) this side reads nothing (nr_channel_hold_reads), until
 * the other drains; so a tunnel holds about 2 x buffer plus a read each
 * way. A close, a reset or an error on one side closes the other after
 * what was flushed to it is written (the channel's graceful close).
 *
 * The two handler states point at each other until either leaves its
 * pipeline; each is freed by its own removed(). Loop thread only.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "lhttp_pool.h"

typedef struct tun_s tun_t;
struct tun_s {
  nr_ctx_t *ctx;
  tun_t *peer;                /* the other side, or NULL once it went */
  bool held;                  /* this side's reads held (the peer is full) */
};

static void t_added(nr_ctx_t *ctx) {
  tun_t *t = nr_ctx_state(ctx);
  t->ctx = ctx;
}

/* The other side is gone: this one closes after what it has flushed. */
static void part(tun_t *t) {
  tun_t *p = t->peer;
  if (p == NULL)
    return;
  t->peer = NULL;
  p->peer = NULL;
  if (p->ctx != NULL) {
    nr_ctx_flush(p->ctx);
    nr_ctx_close(p->ctx, NULL);
  }
}

static int t_read(nr_ctx_t *ctx, void *msg) {
  tun_t *t = nr_ctx_state(ctx);
  int type = nr_msg_type(msg);
  if (t->peer == NULL || (type != NR_MSG_BYTES && type != NR_MSG_SLICES))
    return 0;                  /* (nothing else crosses) */
  nr_ctx_t *out = t->peer->ctx;
  nr_ctx_write(out, msg, NULL);          /* (copied) */
  nr_ctx_flush(out);
  if (!t->held && !nr_channel_is_writable(nr_ctx_channel(out))) {
    t->held = true;
    nr_channel_hold_reads(nr_ctx_channel(ctx), true);
  }
  return 0;
}

static int t_writability(nr_ctx_t *ctx) {
  tun_t *t = nr_ctx_state(ctx);
  tun_t *p = t->peer;
  if (p != NULL && p->held && nr_channel_is_writable(nr_ctx_channel(ctx))) {
    p->held = false;
    nr_channel_hold_reads(nr_ctx_channel(p->ctx), false);
  }
  nr_ctx_fire_writability_changed(ctx);
  return 0;
}

static int t_inactive(nr_ctx_t *ctx) {
  part(nr_ctx_state(ctx));
  nr_ctx_fire_inactive(ctx);
  return 0;
}

static int t_exception(nr_ctx_t *ctx, const nr_err_t *err) {
  (void)err;                   /* a reset, a failed write: this side closes,
                                  its inactive closes the other */
  nr_ctx_close(ctx, NULL);
  return 0;
}

static void t_removed(nr_ctx_t *ctx) {
  tun_t *t = nr_ctx_state(ctx);
  part(t);
  free(t);
}

static const nr_handler_t tun_vt = {
    .type = "http_tunnel", .added = t_added, .removed = t_removed,
    .inactive = t_inactive, .channel_read = t_read,
    .writability_changed = t_writability, .exception = t_exception};

/* The handler just before ctx in its pipeline, or NULL. */
static nr_ctx_t *before(nr_ctx_t *ctx) {
  for (nr_ctx_t *c = nr_pipeline_first(nr_ctx_pipeline(ctx)); c; c = nr_ctx_next(c))
    if (nr_ctx_next(c) == ctx)
      return c;
  return NULL;
}

int lnr_tunnel_start(nr_ctx_t *client, nr_ctx_t *backend) {
  nr_ctx_t *codec = before(client);
  tun_t *a = calloc(1, sizeof *a), *b = calloc(1, sizeof *b);
  if (codec == NULL || a == NULL || b == NULL) {
    free(a);
    free(b);
    return -ENOMEM;
  }
  a->peer = b;
  b->peer = a;
  char name[64];
  snprintf(name, sizeof name, "%s", nr_ctx_name(codec));
  int rc = nr_pipeline_add_last(nr_ctx_pipeline(backend), "tunnel", &tun_vt, b);
  if (rc < 0) {
    free(a);
    free(b);
    return rc;
  }
  rc = nr_pipeline_replace(nr_ctx_pipeline(client), name, "tunnel", &tun_vt, a);
  if (rc < 0) {
    b->peer = NULL;
    free(a);
    nr_ctx_close(backend, NULL);
  }
  return rc;
}
