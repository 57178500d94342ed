/*
 * channel_close.c -- closing channels: the two-phase close (flushed data
 * drains, bounded by CLOSE_LINGER, then the descriptor goes and the
 * pipeline is torn down), holds that delay an idle close, and a loop's
 * shutdown (close_each). Loop thread only. A closed channel stays in
 * memory until the loop's pass ends (nr__channel_unlink's graveyard).
 */
#include <stdio.h>
#include <sys/socket.h>
#include <unistd.h>

#include "channel_internal.h"

#define CLOSE_LINGER NR_SEC(30)   /* longest drain of flushed data at close */

/* ---- closing ------------------------------------------------------------------ */

static int linger_expired(void *arg) {
  nr_channel_t *ch = arg;
  if (ch->st & NR__CLOSING) {
    nr_log(NR_LOG_WARN, "channel %llu: peer did not read %llu pending bytes "
           "within the close linger; resetting",
           (unsigned long long)ch->id,
           (unsigned long long)(ch->out.flushed - ch->out.written));
    nr__channel_finish_close(ch, true);
  }
  return 0;
}

void nr__channel_close(nr_channel_t *ch, bool abort) {
  if (ch->st & NR__CLOSED)
    return;
  if ((ch->st & NR__CLOSING) && !abort)
    return;
  atomic_fetch_and(&ch->pub, ~NR__OPEN);
  if (!abort && (ch->st & NR__REGISTERED)) {
    nr__out_fail_unflushed(ch->loop, &ch->out, NR_ECLOSED);
    bool pending = ch->out.written < ch->out.flushed || ch->out.dq != NULL;
    if (pending && nr_channel_is_active(ch)) {
      /* Flush what was already flushed-to-channel, then close. */
      ch->st |= NR__CLOSING;
      nr__channel_update_interest(ch);
      ch->linger_timer = nr_loop_schedule(ch->loop, CLOSE_LINGER, 0,
                                          linger_expired, NULL, ch);
      if (!(ch->st & NR__WAIT_OUT))
        nr__channel_do_write(ch);
      return;
    }
  }
  nr__channel_finish_close(ch, abort);
}


void nr__channel_finish_close(nr_channel_t *ch, bool abort) {
  if (ch->st & NR__CLOSED)
    return;
  nr__channel_send_unlist(ch);
  if (ch->st & NR__SEND_TIMED_OUT)
    abort = true;
  bool was_active = nr_channel_is_active(ch);
  ch->st = (ch->st | NR__CLOSED) & ~NR__CLOSING;
  atomic_store(&ch->pub, 0);
  nr__timer_drop(&ch->linger_timer);
  if (ch->srv)
    nr__timer_drop(&ch->srv->backoff_timer);
  nr_setup_t *su = ch->setup;
  if (su) {
    nr__timer_drop(&su->connect_timer);
    nr__attempts_end(ch);
    if (su->connect_promise) {
      nr_promise_set_failure(su->connect_promise, NR_ECLOSED,
                             "channel closed before the connect completed");
      nr_promise_release(su->connect_promise);
      su->connect_promise = NULL;
    }
  }
  bool linger = !abort && was_active && ch->kind == NR__STREAM &&
                (ch->st & NR__REGISTERED) && !(ch->st & NR__INPUT_SHUT) &&
                nr__linger_start(ch);
  if (!linger) {
    if (ch->st & NR__REGISTERED)
      nr__io_stop(ch->loop, &ch->io);
    if (abort && ch->kind == NR__STREAM && was_active) {
      struct linger lg = {1, 0};               /* RST, not FIN */
      nr_sys_setsockopt(ch->io.fd, SOL_SOCKET, SO_LINGER, &lg, sizeof lg);
    }
    if (ch->kind == NR__LISTEN && (ch->st & NR__UNLINK_PATH))
      nr__unlink_socket(su->unix_path, su->unix_dev, su->unix_ino);
    nr_sys_close(ch->io.fd);   /* (io.fd stays: other threads may read it;
                                  the loop's own users ask nr_channel_fd) */
  }
  if (ch->loop)
    nr__out_fail_all(ch->loop, &ch->out, NR_ECLOSED, "channel closed");
  unsigned td = was_active ? NR__TD_INACTIVE : 0;
  if (ch->st & NR__REGISTERED) {
    td |= NR__TD_UNREGISTERED | NR__TD_DESTROY;
    ch->st &= ~NR__REGISTERED;
    if (!linger)
      nr__channel_unlink(ch);                  /* else the linger's end does */
  }
  /* A reuseport server's close future waits for its other listeners. */
  if (ch->srv == NULL || !nr__server_closed(ch))
    nr__channel_closed(ch);
  if (td != 0)
    nr__pipeline_teardown(&ch->pipe, td);
  nr__channel_tell_watches(ch);             /* (closed: each learns it, and lets go) */
}

int nr_channel_shutdown_output(nr_channel_t *ch) {
  NR_ASSERT_CHANNEL_LOOP(ch);
  if (ch->st & NR__CLOSED)
    return -ENOTCONN;
  return nr_sys_shutdown(ch->io.fd, SHUT_WR) < 0 ? -errno : 0;
}

void nr_channel_set_ref(nr_channel_t *ch, bool ref) {
  NR_ASSERT_CHANNEL_LOOP(ch);
  if (!(ch->st & NR__REGISTERED) || ref == !(ch->st & NR__UNREF))
    return;                          /* closed, or so already */
  ch->st ^= NR__UNREF;
  if (ref)
    atomic_fetch_sub(&ch->loop->channel_unrefs, 1);
  else
    atomic_fetch_add(&ch->loop->channel_unrefs, 1);
}

void nr_channel_hold(nr_channel_t *ch) {
  NR_ASSERT_CHANNEL_LOOP(ch);
  ch->holds++;
}

static int close_idle_task(void *arg) {
  nr_channel_t *ch = arg;
  if (ch->holds == 0 && (ch->st & NR__CLOSE_IDLE_PIPE))
    nr_pipeline_close(&ch->pipe, NULL);
  else if (ch->holds == 0 && !(nr_loop_is_shutting_down(ch->loop) &&
                               nr__loop_held(ch->loop)))
    nr__channel_close(ch, false);  /* (work owed to the loop: close_each's) */
  nr_channel_release(ch);
  return 0;
}

void nr_channel_close_when_idle(nr_channel_t *ch) {
  NR_ASSERT_CHANNEL_LOOP(ch);
  if (ch->st & (NR__CLOSING | NR__CLOSED | NR__CLOSE_IDLE))
    return;                      /* closing already, or a shutdown will */
  ch->st |= NR__CLOSE_IDLE | NR__CLOSE_IDLE_PIPE;
  nr__channel_update_interest(ch);
  if (ch->holds == 0 &&
      nr_loop_execute(ch->loop, close_idle_task, nr_channel_retain(ch)) < 0) {
    nr_channel_release(ch);
    nr_pipeline_close(&ch->pipe, NULL);
  }
}

/* The last hold goes with the answer's write, whose flush may still come
 * (write_and_flush, a read batch's read_complete): close from a task. */
void nr_channel_unhold(nr_channel_t *ch) {
  NR_ASSERT_CHANNEL_LOOP(ch);
  assert(ch->holds > 0);
  if (--ch->holds == 0 && (ch->st & NR__CLOSE_IDLE) &&
      nr_loop_execute(ch->loop, close_idle_task, nr_channel_retain(ch)) < 0) {
    nr_channel_release(ch);
    nr__channel_close(ch, false);
  }
}

void nr_channel_delay_shutdown_close(nr_channel_t *ch, uint64_t deadline) {
  NR_ASSERT_CHANNEL_LOOP(ch);
  ch->goodbye_until = deadline;
}

/* A graceful shutdown's first word to an open stream channel: its
 * handlers may say goodbye (and delay the close). True if it is to be
 * left open for now. */
static bool tell_shutdown(nr_channel_t *ch) {
  if (!(ch->st & NR__SHUTDOWN_TOLD) && ch->kind == NR__STREAM &&
      nr_channel_is_active(ch) && !(ch->st & (NR__CLOSING | NR__CLOSED))) {
    ch->st |= NR__SHUTDOWN_TOLD;
    nr_pipeline_fire_user_event(&ch->pipe, (void *)&NR_EVT_SHUTDOWN);
  }
  return !(ch->st & NR__CLOSED) && ch->goodbye_until != 0 &&
         nr_now() < ch->goodbye_until;
}

/* Close every channel of a shutting-down loop (Netty's closeAll): flushed
 * data still drains. Each is told first (NR_EVT_SHUTDOWN), and one whose
 * handlers say goodbye stays open until it ends or its deadline. A
 * channel that holds work owed (nr_channel_hold) stops reading and closes
 * when the work is done; while work is owed to the loop itself
 * (nr_loop_hold: an answer computed elsewhere, for any of them), every
 * channel does, but a listener, which owes nothing: it closes at once,
 * and no connection comes in meanwhile. With abort, reset whatever is
 * left. */
static void close_each(nr_loop_t *l, bool abort) {
  nr__loop_send_expire(l, nr_now());      /* the loop's timers are cancelled by now */
  bool loop_held = !abort && nr__loop_held(l);
  size_t n = 0, i = 0;
  for (nr_channel_t *ch = l->channels; ch; ch = ch->lnext)
    n++;
  if (n == 0)
    return;
  nr_channel_t **v = malloc(n * sizeof *v);
  if (v == NULL)
    return;
  for (nr_channel_t *ch = l->channels; ch; ch = ch->lnext)
    v[i++] = nr_channel_retain(ch);
  for (i = 0; i < n; i++) {
    if (!abort && tell_shutdown(v[i])) {
      nr_channel_release(v[i]);
      continue;
    }
    if (v[i]->st & NR__LINGER) {
      nr__linger_shutdown(v[i], abort);
    } else if (!abort && (v[i]->holds > 0 ||
                          (loop_held && v[i]->kind != NR__LISTEN))) {
      if (!(v[i]->st & NR__CLOSE_IDLE)) {
        v[i]->st |= NR__CLOSE_IDLE;
        nr__channel_update_interest(v[i]);
      }
    } else if (abort || !(v[i]->st & NR__CLOSING)) {
      nr__channel_close(v[i], abort);
    }
    nr_channel_release(v[i]);
  }
  free(v);
}

void nr__channels_close_all(nr_loop_t *l) { close_each(l, false); }

void nr__channels_abort_all(nr_loop_t *l) {
  close_each(l, true);
  if (l->send_timer != NULL) {
    nr_timer_cancel(l->send_timer);
    nr_timer_release(l->send_timer);
    l->send_timer = NULL;
  }
  nr__loop_reap(l);
}
