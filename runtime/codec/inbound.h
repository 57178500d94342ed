/*
 * inbound.h -- what every input codec (the decoder base, the RESP and the
 * HTTP server codecs) needs besides its parser: re-entrancy, and
 * backpressure on a peer that does not read what it is answered. A codec
 * embeds one nr_inbound_t in its state. Loop thread only: the state
 * belongs to one context of one channel.
 *
 * Re-entrancy. The handlers a codec fires into may remove it (a protocol
 * switch, or a close that empties the pipeline) while it decodes. So a
 * codec brackets its decode loop with nr_inbound_enter / nr_inbound_leave;
 * its removed() calls nr_inbound_removed, which marks a codec that is
 * inside and lets the caller free one that is not; leave() then tells the
 * outermost return to free it. Between the two the codec must not touch
 * more than its state (in->removed says it is on its way out).
 *
 * Backpressure. While the channel is unwritable (its outbound buffer above
 * write_buffer_high) a codec decodes nothing past the message just
 * delivered (nr_inbound_hold) and reads nothing (auto_read off, if it was
 * on: `paused` remembers that this codec turned it off, so it turns back
 * on only what it turned off, and its removal gives it back). Once the
 * buffer has drained, nr_inbound_writability queues a task that decodes
 * what was held -- from a task, not from inside the flush that drained it
 * -- and the codec fires read_complete as after a read. Reading stays off
 * until what was held is decoded (the decode loop that ends holding
 * nothing gives the reads back as it leaves): a read meanwhile would only
 * pile more input behind the held rest. So what the codec owes is bounded
 * by the high water mark and one read, however long its peer reads
 * nothing.
 */
#ifndef NR_CODEC_INBOUND_H
#define NR_CODEC_INBOUND_H

#include <stdbool.h>

#include "netrun.h"

typedef struct nr_codec_resume_s nr_codec_resume_t;

typedef struct nr_inbound_s {
  int depth;                   /* decode loops (and expiries) in progress */
  bool removed;                /* removed during one: free when it ends */
  bool paused;                 /* auto_read turned off while unwritable, or
                                  while input is held */
  bool held;                   /* decoding stopped while unwritable */
  nr_codec_resume_t *resume;   /* a queued task decodes what is held */
  nr_channel_t *ch;            /* the channel paused (set with `paused`) */
} nr_inbound_t;

/* A decode loop begins: nothing is held any more (it decodes it). */
static inline void nr_inbound_enter(nr_inbound_t *in) {
  in->held = false;
  in->depth++;
}

/* What runs for the codec without decoding (a timer's expiry) and may
 * still see it removed. */
static inline void nr_inbound_enter_quiet(nr_inbound_t *in) {
  in->depth++;
}

void nr__inbound_reads_back(nr_inbound_t *in);

/* The loop ends: true when it was the outermost one and the codec was
 * removed meanwhile, so the caller frees its state now. The outermost one
 * that leaves nothing held gives back the reads it kept off. */
static inline bool nr_inbound_leave(nr_inbound_t *in) {
  if (--in->depth > 0)
    return false;
  if (__builtin_expect(in->paused && !in->held && !in->removed, 0))
    nr__inbound_reads_back(in);
  return in->removed;
}

static inline bool nr_inbound_busy(const nr_inbound_t *in) {
  return in->depth > 0;
}

/* After a message was delivered: true (and the codec holds the rest) when
 * its channel ch is unwritable, so the decode loop stops. */
static inline bool nr_inbound_hold(nr_inbound_t *in, nr_channel_t *ch) {
  if (nr_channel_is_writable(ch))
    return false;
  in->held = true;             /* the rest waits for the answers to drain */
  return true;
}

/* Whether a queued resume task may decode what is held: something is,
 * no loop is running, the channel is open. */
static inline bool nr_inbound_resumable(const nr_inbound_t *in,
                                        nr_ctx_t *ctx) {
  return in->held && in->depth == 0 && nr_channel_is_open(nr_ctx_channel(ctx));
}

/* The codec's removed(): gives back the reads it stopped. True when the
 * caller frees its state now; false when a loop is running, which frees it
 * as it leaves. */
bool nr_inbound_removed(nr_inbound_t *in, nr_ctx_t *ctx);

/* Before the codec's state is freed: cancels a queued resume task. */
void nr_inbound_free(nr_inbound_t *in);

/* The codec's writability_changed(): throttles the channel's reads, and
 * once it is writable with input held, queues go_on(state, ctx) (once);
 * then tells the next handler. Returns 0. */
int nr_inbound_writability(nr_inbound_t *in, nr_ctx_t *ctx, void *state,
                           void (*go_on)(void *state, nr_ctx_t *ctx));

/* The parts, for a codec whose peer may not read what it is sent but that
 * keeps no nr_inbound_t. nr_codec_throttle: with ch unwritable, turn its
 * auto_read off (if on; *paused remembers that this codec did), and back
 * on once ch is writable; returns whether ch is writable.
 * nr_codec_resume: run fn(state, ctx) from a task on ctx's loop, once:
 * *slot holds the queued task (a second call meanwhile does nothing) and
 * is cleared when it runs. ctx is retained until then; a codec that frees
 * state first calls nr_codec_resume_cancel(*slot). */
bool nr_codec_throttle(nr_channel_t *ch, bool *paused);
void nr_codec_resume(nr_ctx_t *ctx, void *state, nr_codec_resume_t **slot,
                     void (*fn)(void *state, nr_ctx_t *ctx));
void nr_codec_resume_cancel(nr_codec_resume_t *r);

#endif /* NR_CODEC_INBOUND_H */
