/*
 * decoder.c -- the decoder base of codec.h (Netty's ByteToMessageDecoder).
 * Loop thread only: a decoder belongs to one context of one channel.
 *
 * A read is decoded straight from the channel's read buffer when nothing
 * is cumulated; only the unconsumed tail of a read that ended mid-frame is
 * copied into the cumulation, which is freed as soon as it empties.
 *
 * Re-entrancy: a handler after the decoder may feed the same pipeline again
 * (an embedded channel's write_inbound from channel_read), or remove the
 * decoder, or close the channel, while the decode loop runs. Bytes arriving
 * during the loop wait in `pending` and are decoded after the current input,
 * in order; a removal during the loop only marks the decoder, which the loop
 * frees when it unwinds (inbound.h, as for every input codec; so is the
 * backpressure on a peer that reads no answers).
 */
#include <assert.h>
#include <stdio.h>

#include "codec/codec.h"
#include "internal.h"

void nr_decoder_init(nr_decoder_t *d, const char *name,
                     nr_decode_step_fn step) {
  memset(d, 0, sizeof *d);
  d->name = name;
  d->step = step;
}

size_t nr_decoder_buffered(const nr_decoder_t *d) {
  return nr_buf_len(&d->cum) + nr_buf_len(&d->pending);
}

/* Deliver a step's error to exception_caught of the following handlers. */
static void report(nr_ctx_t *ctx, int rc) {
  char msg[512];
  snprintf(msg, sizeof msg, "%s", nr__raised(rc));   /* handlers may raise */
  nr_ctx_fire_exception(ctx, &(nr_err_t){rc, msg});
}

/* The decode loop over data[0 .. len): returns the bytes consumed. Stops
 * when a step needs more input or the decoder was removed. */
static size_t decode(nr_decoder_t *d, nr_ctx_t *ctx, const char *data,
                     size_t len) {
  size_t off = 0;
  while (off < len && !d->in.removed) {
    size_t used = 0;
    int rc = d->step(d, ctx, data + off, len - off, &used);
    assert(used <= len - off);
    off += used;
    if (rc < 0)
      report(ctx, rc);
    if (used == 0)
      break;
    if (!d->eof && !d->in.removed && nr_inbound_hold(&d->in, nr_ctx_channel(ctx)))
      break;                   /* the rest waits for the answers to drain */
  }
  return off;
}

/* Decode what the cumulation holds, dropping what was consumed. */
static void decode_cumulation(nr_decoder_t *d, nr_ctx_t *ctx) {
  size_t used = decode(d, ctx, nr_buf_peek(&d->cum), nr_buf_len(&d->cum));
  nr_buf_consume(&d->cum, used);
}

static void forward(nr_ctx_t *ctx, const char *data, size_t len) {
  if (len > 0) {
    nr_bytes_t b = NR_BYTES(data, len);
    nr_ctx_fire_read(ctx, &b);
  }
}

/* Free a removed decoder. While the channel lives (the decoder left a
 * working pipeline, e.g. for a protocol switch) the bytes it had not
 * decoded go to the next handler, in order, as Netty does; once the
 * channel is closed the handlers after it are gone too, so they are
 * dropped. `rest` is unconsumed input not yet cumulated. */
static void finalize(nr_decoder_t *d, nr_ctx_t *ctx, const char *rest,
                     size_t n) {
  nr_inbound_free(&d->in);
  if (nr_channel_is_open(nr_ctx_channel(ctx))) {
    forward(ctx, nr_buf_peek(&d->cum), nr_buf_len(&d->cum));
    forward(ctx, rest, n);
    forward(ctx, nr_buf_peek(&d->pending), nr_buf_len(&d->pending));
  }
  nr_buf_free(&d->cum);
  nr_buf_free(&d->pending);
  if (d->destroy)
    d->destroy(d);
  free(d);
}

/* Decode reads that arrived during the loop, in order. */
static int drain_pending(nr_decoder_t *d, nr_ctx_t *ctx) {
  int rc = 0;
  while (!d->in.removed && nr_buf_len(&d->pending) > 0) {
    nr_buf_t p = d->pending;
    d->pending = NR_BUF_INIT;
    rc = nr_buf_append(&d->cum, nr_buf_peek(&p), nr_buf_len(&p));
    nr_buf_free(&p);
    if (rc < 0)
      break;
    decode_cumulation(d, ctx);
  }
  return rc;
}

int nr_decoder_feed(nr_decoder_t *d, nr_ctx_t *ctx, const char *data,
                    size_t len) {
  if (nr_inbound_busy(&d->in))
    return nr_buf_append(&d->pending, data, len);
  nr_inbound_enter(&d->in);
  int rc = 0;
  size_t used = 0;
  if (nr_buf_len(&d->cum) == 0) {
    used = decode(d, ctx, data, len);          /* straight from the read */
    if (!d->in.removed && used < len) {
      rc = nr_buf_append(&d->cum, data + used, len - used);
      used = len;                              /* the rest is cumulated */
    }
  } else {
    used = len;
    rc = nr_buf_append(&d->cum, data, len);
    if (rc == 0)
      decode_cumulation(d, ctx);
  }
  if (rc == 0)
    rc = drain_pending(d, ctx);
  if (nr_inbound_leave(&d->in))
    finalize(d, ctx, data + used, len - used);
  return rc;
}

/* Last decode at end of input; an incomplete frame left over is reported
 * (the peer closed mid-frame) and dropped. */
void nr_decoder_end(nr_decoder_t *d, nr_ctx_t *ctx) {
  d->eof = true;
  if (nr_inbound_busy(&d->in))
    return;   /* closed under the loop: the removal that follows stops it */
  nr_inbound_enter_quiet(&d->in);
  if (nr_buf_len(&d->cum) > 0)
    decode_cumulation(d, ctx);
  drain_pending(d, ctx);
  size_t left = nr_buf_len(&d->cum);
  if (left > 0 && !d->in.removed) {
    nr_buf_free(&d->cum);
    report(ctx, nr_raise(NR_ECLOSED, "%s: input ended inside a frame "
                         "(%zu byte%s discarded)", d->name, left,
                         left == 1 ? "" : "s"));
  }
  nr_buf_free(&d->cum);
  if (nr_inbound_leave(&d->in))
    finalize(d, ctx, NULL, 0);
}

/* ---- handler callbacks ----------------------------------------------------- */

static int feed_error(const char *name, int rc) {
  return nr_raise(rc, "%s: cannot keep the bytes of a partial frame: %s",
                  name, nr_strerror(rc));
}

/* Bytes are decoded; gathered bytes too, slice by slice; anything else is
 * not for this decoder and passes on. */
int nr_decoder_channel_read(nr_ctx_t *ctx, void *msg) {
  nr_decoder_t *d = nr_ctx_state(ctx);
  const char *name = d->name;                  /* d may be freed by feed */
  int type = nr_msg_type(msg);
  if (type == NR_MSG_BYTES) {
    const nr_bytes_t *b = msg;
    int rc = nr_decoder_feed(d, ctx, b->data, b->len);
    return rc < 0 ? feed_error(name, rc) : 0;
  }
  if (type == NR_MSG_SLICES) {
    const nr_slices_t *s = msg;
    int rc = 0;      /* ctx outlives this call even if removed midway */
    for (size_t i = 0; rc == 0 && i < s->n; i++) {
      if (nr_ctx_is_removed(ctx)) {            /* as finalize() does */
        if (!nr_channel_is_open(nr_ctx_channel(ctx)))
          break;
        nr_bytes_t b = NR_BYTES(s->v[i].data, s->v[i].len);
        nr_ctx_fire_read(ctx, &b);             /* what follows, raw */
      } else {
        rc = nr_decoder_feed(d, ctx, s->v[i].data, s->v[i].len);
      }
    }
    return rc < 0 ? feed_error(name, rc) : 0;
  }
  nr_ctx_fire_read(ctx, msg);
  return 0;
}

int nr_decoder_inactive(nr_ctx_t *ctx) {
  nr_decoder_end(nr_ctx_state(ctx), ctx);
  nr_ctx_fire_inactive(ctx);
  return 0;
}

int nr_decoder_user_event(nr_ctx_t *ctx, void *evt) {
  if (evt == &NR_EVT_INPUT_SHUTDOWN)
    nr_decoder_end(nr_ctx_state(ctx), ctx);
  nr_ctx_fire_user_event(ctx, evt);
  return 0;
}

static void decode_held(void *state, nr_ctx_t *ctx) {
  nr_decoder_t *d = state;
  if (nr_inbound_resumable(&d->in, ctx)) {
    static const char none[1];
    nr_decoder_feed(d, ctx, none, 0);     /* may free d */
    nr_ctx_fire_read_complete(ctx);       /* as after a read */
  }
}

int nr_decoder_writability(nr_ctx_t *ctx) {
  nr_decoder_t *d = nr_ctx_state(ctx);
  return nr_inbound_writability(&d->in, ctx, d, decode_held);
}

void nr_decoder_removed(nr_ctx_t *ctx) {
  nr_decoder_t *d = nr_ctx_state(ctx);
  if (nr_inbound_removed(&d->in, ctx))
    finalize(d, ctx, NULL, 0);
}
