/*
 * inbound.c -- re-entrancy and backpressure of the input codecs (see
 * inbound.h). Loop thread only.
 */
#include <stdlib.h>

#include "codec/inbound.h"

struct nr_codec_resume_s {
  void *state;                 /* NULL: cancelled */
  nr_ctx_t *ctx;               /* retained */
  nr_codec_resume_t **slot;
  void (*fn)(void *state, nr_ctx_t *ctx);
};

static int resume_run(void *arg) {
  nr_codec_resume_t *r = arg;
  if (r->state != NULL) {
    *r->slot = NULL;
    r->fn(r->state, r->ctx);
  }
  nr_ctx_release(r->ctx);
  free(r);
  return 0;
}

void nr_codec_resume(nr_ctx_t *ctx, void *state, nr_codec_resume_t **slot,
                     void (*fn)(void *state, nr_ctx_t *ctx)) {
  if (*slot != NULL)
    return;
  nr_codec_resume_t *r = malloc(sizeof *r);
  if (r == NULL)
    return;                    /* the next read decodes what is held */
  *r = (nr_codec_resume_t){state, nr_ctx_retain(ctx), slot, fn};
  *slot = r;
  if (nr_loop_execute(nr_channel_loop(nr_ctx_channel(ctx)), resume_run, r) < 0) {
    *slot = NULL;              /* the loop is shutting down */
    nr_ctx_release(ctx);
    free(r);
  }
}

void nr_codec_resume_cancel(nr_codec_resume_t *r) {
  if (r != NULL)
    r->state = NULL;
}

void nr__inbound_reads_back(nr_inbound_t *in) {
  nr_codec_throttle(in->ch, &in->paused);   /* on, if writable */
}

bool nr_codec_throttle(nr_channel_t *ch, bool *paused) {
  bool writable = nr_channel_is_writable(ch);
  if (!writable && !*paused && nr_channel_options(ch)->auto_read) {
    *paused = true;
    nr_channel_set_option(ch, "auto_read", 0);
  } else if (writable && *paused) {
    *paused = false;
    nr_channel_set_option(ch, "auto_read", 1);
  }
  return writable;
}

bool nr_inbound_removed(nr_inbound_t *in, nr_ctx_t *ctx) {
  if (in->paused)              /* the reads it stopped are not its to keep */
    nr_channel_set_option(nr_ctx_channel(ctx), "auto_read", 1);
  if (in->depth > 0) {
    in->removed = true;        /* the loop frees it when it unwinds */
    return false;
  }
  return true;
}

void nr_inbound_free(nr_inbound_t *in) {
  nr_codec_resume_cancel(in->resume);
}

int nr_inbound_writability(nr_inbound_t *in, nr_ctx_t *ctx, void *state,
                           void (*go_on)(void *state, nr_ctx_t *ctx)) {
  nr_channel_t *ch = nr_ctx_channel(ctx);
  in->ch = ch;
  if (in->held && nr_channel_is_writable(ch))
    nr_codec_resume(ctx, state, &in->resume, go_on);   /* reads stay off */
  if (!in->held || !nr_channel_is_writable(ch) ||
      in->resume == NULL)      /* (none queued: out of memory; the next
                                  read decodes what is held) */
    nr_codec_throttle(ch, &in->paused);
  nr_ctx_fire_writability_changed(ctx);
  return 0;
}
