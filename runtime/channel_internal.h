/*
 * channel_internal.h -- what the files of the channel share (channel.c:
 * lifetime, accessors, registration, reads, writes and the head handler;
 * channel_close.c: the two-phase close and a loop's shutdown;
 * channel_connect.c: bind and connect; channel_timeout.c: the send
 * timeout; channel_shed.c: fresh and idle channels shed when descriptors
 * run out; channel_any.c: the any-thread entry points). Loop thread only,
 * as everything about a channel but its reference count and its public
 * state word (internal.h).
 */
#ifndef NR_CHANNEL_INTERNAL_H
#define NR_CHANNEL_INTERNAL_H

#include "internal.h"

/* channel.c */
void nr__channel_do_write(nr_channel_t *ch);
void nr__channel_tell_watches(nr_channel_t *ch);

/* channel_close.c */
void nr__channel_finish_close(nr_channel_t *ch, bool abort);

/* channel_connect.c: the head's bind and connect, and a connect's end */
int nr__head_bind(nr_ctx_t *ctx, const struct sockaddr *sa, socklen_t len,
                  nr_promise_t *p);
int nr__head_connect(nr_ctx_t *ctx, const struct sockaddr *sa,
                     socklen_t len, nr_promise_t *p);
void nr__channel_finish_connect(nr_channel_t *ch);

/* channel_shed.c */
void nr__channel_first_bytes(nr_channel_t *ch);

/* channel_timeout.c: the send timeout's list */
void nr__channel_send_unlist(nr_channel_t *ch);
void nr__channel_send_list(nr_channel_t *ch, uint64_t now);
void nr__loop_send_expire(nr_loop_t *l, uint64_t now);

/* After a write: join, restamp (the peer took bytes) or leave the list.
 * One test when the channel is not blocked. */
static inline void nr__channel_send_watch(nr_channel_t *ch,
                                          uint64_t written_before) {
  if (!(ch->st & (NR__WAIT_OUT | NR__SEND_LISTED)))
    return;
  if (!(ch->st & NR__WAIT_OUT) || ch->opts.send_timeout == 0 ||
      ch->kind != NR__STREAM) {
    nr__channel_send_unlist(ch);
  } else if (!(ch->st & NR__SEND_LISTED) ||
             ch->out.written != written_before) {
    nr__channel_send_unlist(ch);
    nr__channel_send_list(ch, nr_now());
  }
}

#endif /* NR_CHANNEL_INTERNAL_H */
