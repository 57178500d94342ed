/*
 * channel_shed.c -- fresh, idle and handshaking channels, the ones shed
 * when the server runs out of descriptors (the section below says which
 * and why), and the loop's graveyard of closed channels. Loop thread only.
 */
#include "channel_internal.h"

/* ---- fresh and idle connections, shed when descriptors run out ---------------
 *
 * An accepted channel is fresh (NR__FRESH, set by the acceptor) until its
 * peer shows it speaks: its first byte read, unless a codec said a byte is
 * not enough (nr_channel_fresh_until_message: the HTTP server codec, whose
 * request head may drip in a byte a second), then the codec's first whole
 * message (nr_channel_established). When accept fails for want of a
 * descriptor, the acceptor asks each loop it serves to close its oldest
 * fresh channels: those that took a descriptor the longest for nothing
 * (slowloris). The loop's channel list is newest first, so they are found
 * from its tail; a channel that is not fresh is passed over (a walk as long
 * as the established channels older than the fresh ones, only when the
 * table is full). Codecs mark two more kinds as sheddable, as nginx's
 * "reusable" connections: one that waits for its peer's next request and
 * owes it nothing (NR__IDLE: the HTTP server codec between requests, or
 * while a head after the first drips in), and one whose TLS handshake is
 * under way (NR__HANDSHAKING: the TLS server handler, until the handshake
 * completes). Both are shed with the fresh ones, oldest accepted first. No
 * channel carries anything for it but these bits. */

void nr_channel_fresh_until_message(nr_channel_t *ch) {
  NR_ASSERT_CHANNEL_LOOP(ch);
  if (ch->st & NR__FRESH)
    ch->st |= NR__FRESH_TO_MESSAGE;
}

void nr_channel_established(nr_channel_t *ch) {
  NR_ASSERT_CHANNEL_LOOP(ch);
  ch->st &= ~(NR__FRESH | NR__FRESH_TO_MESSAGE);
}

/* Only an accepted channel (one the bootstrap did not make: no setup) is
 * ever shed. */
static void mark_sheddable(nr_channel_t *ch, unsigned bit, bool on) {
  NR_ASSERT_CHANNEL_LOOP(ch);
  if (ch->setup != NULL)
    return;
  if (on)
    ch->st |= bit;
  else
    ch->st &= ~bit;
}

void nr_channel_set_idle(nr_channel_t *ch, bool idle) {
  mark_sheddable(ch, NR__IDLE, idle);
}

void nr_channel_set_handshaking(nr_channel_t *ch, bool on) {
  mark_sheddable(ch, NR__HANDSHAKING, on);
}

/* The first bytes came: enough, unless a codec waits for a message. */
void nr__channel_first_bytes(nr_channel_t *ch) {
  if (!(ch->st & NR__FRESH_TO_MESSAGE))
    ch->st &= ~NR__FRESH;
}

int nr__loop_shed_fresh(nr_loop_t *l, int max) {
  NR_ASSERT_LOOP(l);
  nr_channel_t *v[64];
  int n = 0;
  if (max > 64)
    max = 64;
  for (nr_channel_t *ch = l->channels_tail; ch != NULL && n < max; ch = ch->lprev)
    if ((ch->st & (NR__FRESH | NR__IDLE | NR__HANDSHAKING)) &&
        !(ch->st & (NR__CLOSED | NR__CLOSING)))
      v[n++] = nr_channel_retain(ch);
  for (int i = 0; i < n; i++) {        /* (a close may run hooks: the walk
                                          is done first) */
    nr__channel_close(v[i], true);
    nr_channel_release(v[i]);
  }
  return n;
}

void nr__loop_reap(nr_loop_t *l) {
  nr_channel_t *ch = l->graveyard;
  l->graveyard = NULL;
  for (nr_channel_t *n; ch; ch = n) {
    n = ch->lnext;
    nr_channel_release(ch);
  }
}
