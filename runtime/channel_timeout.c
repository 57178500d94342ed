/*
 * channel_timeout.c -- the send timeout of stream channels: a loop's list
 * of the channels whose peer takes nothing, in deadline order, and its
 * one timer (the section below states how). Loop thread only: the list
 * and its timer are the loop's.
 */
#include <stdio.h>
#include <sys/ioctl.h>

#include <linux/sockios.h>

#include "channel_internal.h"

/* ---- send timeout ---------------------------------------------------------------
 *
 * No channel has a timer of its own, and a socket that keeps up costs
 * nothing: a stream channel joins its loop's list only when a write meets
 * EAGAIN (NR__WAIT_OUT: already an epoll_ctl), is stamped again when an
 * EPOLLOUT write makes progress (moving to the tail), and leaves when it
 * has drained or closes. The list is kept in deadline order (equal
 * timeouts, the usual case, insert at the tail), so one loop timer, armed
 * for the head's deadline, finds the channels whose peer took nothing for
 * send_timeout. EPOLLOUT comes only once a third of the socket's send
 * buffer is free, which a slow but steady reader may take longer than the
 * timeout to make room for: so the kernel's unacknowledged bytes
 * (SIOCOUTQ) are noted at each stamp, and a channel whose queue shrank
 * meanwhile is stamped again instead of closed. A shutting-down loop
 * cancels its timers: close_each then checks the list every turn, as it
 * does the linger's bound. */

static int send_timer_fired(void *arg);

void nr__channel_send_unlist(nr_channel_t *ch) {
  if (!(ch->st & NR__SEND_LISTED))
    return;
  nr_loop_t *l = ch->loop;
  *(ch->sprev ? &ch->sprev->snext : &l->send_head) = ch->snext;
  *(ch->snext ? &ch->snext->sprev : &l->send_tail) = ch->sprev;
  ch->sprev = ch->snext = NULL;
  ch->st &= ~NR__SEND_LISTED;
}

/* Arm the list's timer for its head, unless armed as early already. */
static void send_arm(nr_loop_t *l, uint64_t now) {
  uint64_t at = l->send_head->send_deadline;
  if (l->send_timer != NULL) {
    if (l->send_at <= at)
      return;
    nr_timer_cancel(l->send_timer);          /* (a shorter timeout came) */
    nr_timer_release(l->send_timer);
  }
  l->send_timer = nr_loop_schedule(l, at > now ? at - now : 0, 0,
                                   send_timer_fired, NULL, l);
  l->send_at = at;
}

void nr__channel_send_list(nr_channel_t *ch, uint64_t now) {
  nr_loop_t *l = ch->loop;
  ch->send_deadline = now + ch->opts.send_timeout;
  if (nr_sys_ioctl(ch->io.fd, SIOCOUTQ, &ch->send_outq) < 0)
    ch->send_outq = -1;
  nr_channel_t *p = l->send_tail;
  while (p != NULL && p->send_deadline > ch->send_deadline)
    p = p->sprev;
  ch->sprev = p;
  ch->snext = p ? p->snext : l->send_head;
  *(ch->snext ? &ch->snext->sprev : &l->send_tail) = ch;
  *(p ? &p->snext : &l->send_head) = ch;
  ch->st |= NR__SEND_LISTED;
  if (l->send_head == ch)
    send_arm(l, now);
}

/* What Netty's WriteTimeoutHandler does, then a reset: the pending writes
 * fail with the cause, exception_caught hears it, and the channel closes
 * abortively however a handler closes it (a graceful close would wait on
 * the very peer that does not read). */
static void send_timed_out(nr_channel_t *ch) {
  if (ch->st & NR__CLOSED)
    return;
  char msg[160];
  snprintf(msg, sizeof msg, "send timeout: the peer took none of %llu "
           "pending bytes for %.3g s",
           (unsigned long long)(ch->out.flushed - ch->out.written),
           (double)ch->opts.send_timeout / 1e9);
  ch->st |= NR__SEND_TIMED_OUT;
  nr_channel_retain(ch);
  nr__out_fail_all(ch->loop, &ch->out, NR_ESENDTIMEOUT, msg);
  nr_pipeline_fire_exception(&ch->pipe, &(nr_err_t){NR_ESENDTIMEOUT, msg});
  nr__channel_close(ch, true);
  nr_channel_release(ch);
}

void nr__loop_send_expire(nr_loop_t *l, uint64_t now) {
  nr_channel_t *ch;
  while ((ch = l->send_head) != NULL && ch->send_deadline <= now) {
    int outq = 0;
    nr__channel_send_unlist(ch);
    if (nr_sys_ioctl(ch->io.fd, SIOCOUTQ, &outq) == 0 && outq < ch->send_outq)
      nr__channel_send_list(ch, now);            /* the peer took bytes: time afresh */
    else
      send_timed_out(ch);
  }
}

static int send_timer_fired(void *arg) {
  nr_loop_t *l = arg;
  nr_timer_release(l->send_timer);     /* this one: the loop holds its own */
  l->send_timer = NULL;
  uint64_t now = nr_now();
  nr__loop_send_expire(l, now);
  if (l->send_head != NULL)
    send_arm(l, now);
  return 0;
}

void nr_channel_set_send_timeout(nr_channel_t *ch, uint64_t ns) {
  NR_ASSERT_CHANNEL_LOOP(ch);
  ch->opts.send_timeout = ns;
  if (ch->st & NR__CLOSED)
    return;
  nr__channel_send_unlist(ch);
  nr__channel_send_watch(ch, ch->out.written);
}
