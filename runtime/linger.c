/*
 * linger.c -- the lingering close (nginx's lingering_close).
 *
 * Closing a socket with unread input makes the kernel answer with a reset,
 * and a reset destroys whatever the peer had not yet read of our last
 * writes -- a response, the last megabytes to a slow reader at shutdown.
 * So a graceful close of a connection that holds unread input, or whose
 * peer may still be sending (nr_channel_linger: it pipelines), sends our
 * FIN (shutdown), then reads and discards until the peer's FIN or reset,
 * or INPUT_LINGER. (Else the close is immediate: an idle keep-alive peer
 * must not hold a shutdown up.) The channel is closed for its users
 * meanwhile (its pipeline gone, its close future done); only its fd waits,
 * still on the loop's list, so a shutting-down loop waits for it (within
 * its timeout) and aborts it at the end.
 *
 * Invariant: NR__LINGER is set exactly while the fd waits (its timer
 * armed, the channel still on the loop's list); end_linger clears it,
 * closes the fd and unlinks the channel, once. Loop thread only.
 */
#include <errno.h>
#include <stdlib.h>
#include <sys/ioctl.h>
#include <unistd.h>

#include "internal.h"

#define INPUT_LINGER NR_SEC(5)    /* longest wait for the peer's FIN after ours */

static void end_linger(nr_channel_t *ch) {
  ch->st &= ~NR__LINGER;
  nr__timer_drop(&ch->linger_timer);
  nr__io_stop(ch->loop, &ch->io);
  nr_sys_close(ch->io.fd);
  nr__channel_unlink(ch);
}

static int linger_timed_out(void *arg) {
  nr_channel_t *ch = arg;
  if (ch->st & NR__LINGER)
    end_linger(ch);
  return 0;
}

void nr_channel_linger(nr_channel_t *ch) {
  NR_ASSERT_CHANNEL_LOOP(ch);
  ch->st |= NR__LINGER_WANTED;
}

bool nr__linger_start(nr_channel_t *ch) {
  int unread = 0;
  if (!(ch->st & NR__LINGER_WANTED) &&
      (nr_sys_ioctl(ch->io.fd, FIONREAD, &unread) < 0 || unread == 0))
    return false;
  if (nr_sys_shutdown(ch->io.fd, SHUT_WR) < 0 ||
      nr__io_modify(ch->loop, &ch->io, EPOLLIN) < 0)
    return false;
  ch->st |= NR__LINGER;
  ch->linger_until = nr_now() + INPUT_LINGER;  /* (timers end at shutdown) */
  ch->linger_timer = nr_loop_schedule(ch->loop, INPUT_LINGER, 0,
                                      linger_timed_out, NULL, ch);
  return true;
}

/* Input on a lingering fd: discard it; the peer's FIN or an error ends it. */
void nr__linger_drain(nr_channel_t *ch) {
  nr_loop_t *l = ch->loop;
  if (l->rbuf == NULL && (l->rbuf = malloc(NR_READ_BUF)) == NULL) {
    end_linger(ch);
    return;
  }
  for (int i = 0; i < 16; i++) {   /* a flood waits for the next turn */
    ssize_t n = nr_sys_read(ch->io.fd, l->rbuf, NR_READ_BUF);
    if (n < 0 && errno == EINTR)
      continue;
    if (n < 0 && errno == EAGAIN)
      return;
    if (n <= 0) {
      end_linger(ch);
      return;
    }
    if ((size_t)n < NR_READ_BUF)
      return;   /* all there was: the peer's FIN (or reset) mostly comes
                   after its last bytes (a TLS close_notify), with a later
                   event; reading on now would mostly say EAGAIN */
  }
}

/* A shutting-down loop's turn (nr__channels_close_all, every turn of the
 * shutdown): the loop cancels its timers, so the linger's bound is kept
 * here; an abort ends it now. */
void nr__linger_shutdown(nr_channel_t *ch, bool abort) {
  if (abort || nr_now() >= ch->linger_until)
    end_linger(ch);
}
