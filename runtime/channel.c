/*
 * channel.c -- channels (Netty's AbstractNioChannel and its unsafe): the
 * head handler that turns outbound operations into syscalls, reads into
 * the loop's shared buffer, flushes with gathered writes, writability,
 * half-close, and the two-phase close. Loop thread only, except where a
 * public function says "any thread": those hop to the loop with a task.
 *
 * Lifetime: the creator's reference becomes the loop's at registration. A
 * close unregisters the channel at once but parks it in the loop's
 * graveyard; the loop drops its reference only after the current pass, so
 * an event already fetched for it finds memory that says CLOSED.
 */
#include <assert.h>
#include <netinet/in.h>
#include <stdio.h>
#include <sys/ioctl.h>
#include <sys/uio.h>
#include <sys/un.h>
#include <unistd.h>

#include <linux/sockios.h>

#include "internal.h"

#define CLOSE_LINGER NR_SEC(30)   /* longest drain of flushed data at close */
#define MAX_IOV 64

static _Atomic uint64_t next_id = 1;
const nr_event_t NR_EVT_INPUT_SHUTDOWN = {NR_MSG_EVENT, "input_shutdown"};
const nr_event_t NR_EVT_SHUTDOWN = {NR_MSG_EVENT, "shutdown"};

void nr_channel_opts_init(nr_channel_opts_t *o) {
  memset(o, 0, sizeof *o);
  o->tcp_nodelay = 1;
  o->auto_read = 1;
  o->write_buffer_low = 32 * 1024;
  o->write_buffer_high = 64 * 1024;
  o->max_reads = 16;
  o->write_spin = 16;
  o->send_timeout = NR_SEC(60);
}

static void fix_opts(nr_channel_opts_t *dst, const nr_channel_opts_t *src) {
  static const nr_channel_opts_t zero;
  if (src == NULL || memcmp(src, &zero, sizeof zero) == 0) {
    nr_channel_opts_init(dst);
    return;
  }
  *dst = *src;
  if (dst->write_buffer_high == 0)
    dst->write_buffer_high = 64 * 1024;
  if (dst->write_buffer_low == 0 || dst->write_buffer_low > dst->write_buffer_high)
    dst->write_buffer_low = dst->write_buffer_high / 2;
  if (dst->max_reads <= 0)
    dst->max_reads = 16;
  if (dst->write_spin <= 0)
    dst->write_spin = 16;
}

static int on_io(nr_loop_t *l, nr_io_t *io, uint32_t events);

nr_channel_t *nr__channel_new(int kind, int family, int fd,
                              const nr_channel_opts_t *opts) {
  nr_channel_t *ch = calloc(1, sizeof *ch);
  if (ch == NULL)
    return NULL;
  atomic_init(&ch->refs, 1);
  atomic_init(&ch->pub, NR__OPEN | NR__WRITABLE);
  ch->id = atomic_fetch_add(&next_id, 1);
  ch->kind = kind;
  ch->family = family;
  ch->io.fd = fd;
  ch->io.cb = on_io;
  fix_opts(&ch->opts, opts);
  nr__pipeline_init(&ch->pipe, ch, &nr__head_handler);
  nr__out_init(&ch->out);
  ch->out.high = ch->opts.write_buffer_high;
  return ch;
}

nr_channel_t *nr_channel_retain(nr_channel_t *ch) {
  atomic_fetch_add_explicit(&ch->refs, 1, memory_order_relaxed);
  return ch;
}

void nr_channel_release(nr_channel_t *ch) {
  if (ch == NULL || atomic_fetch_sub(&ch->refs, 1) != 1)
    return;
  if (ch->io.fd >= 0 && !(ch->st & NR__CLOSED))
    nr_sys_close(ch->io.fd);                   /* never registered */
  nr_promise_release(atomic_load(&ch->close_future));
  free(ch->raddr_big);
  if (ch->setup) {
    nr__attempts_free_list(ch->setup->attempts);   /* never connected */
    nr_promise_release(ch->setup->reg_promise);
    free(ch->setup->unix_path);
    free(ch->setup);
  }
  nr__server_free(ch->srv);
  free(ch);
}

nr_setup_t *nr__channel_setup(nr_channel_t *ch) {
  if (ch->setup == NULL)
    ch->setup = calloc(1, sizeof *ch->setup);
  return ch->setup;
}

/* ---- accessors ------------------------------------------------------------- */

static inline int pub(const nr_channel_t *ch) {
  return atomic_load_explicit(&((nr_channel_t *)ch)->pub, memory_order_acquire);
}
uint64_t nr_channel_id(const nr_channel_t *ch) { return ch->id; }
nr_loop_t *nr_channel_loop(const nr_channel_t *ch) { return ch->loop; }
nr_pipeline_t *nr_channel_pipeline(nr_channel_t *ch) { return &ch->pipe; }
bool nr_channel_is_open(const nr_channel_t *ch) { return pub(ch) & NR__OPEN; }
bool nr_channel_is_active(const nr_channel_t *ch) { return pub(ch) & NR__ACTIVE; }
bool nr_channel_is_writable(const nr_channel_t *ch) {
  return pub(ch) & NR__WRITABLE;
}
bool nr_channel_fired_active(const nr_channel_t *ch) {
  NR_ASSERT_CHANNEL_LOOP(ch);
  return ch->st & NR__WAS_ACTIVE;
}
bool nr_channel_is_server(const nr_channel_t *ch) { return ch->kind == NR__LISTEN; }
bool nr_channel_is_datagram(const nr_channel_t *ch) { return ch->kind == NR__DGRAM; }
/* Loop thread (or before registration). -1 once closed: the number is
 * anybody's from then on. */
int nr_channel_fd(const nr_channel_t *ch) {
  return (ch->st & NR__CLOSED) ? -1 : ch->io.fd;
}
size_t nr_channel_pending_bytes(const nr_channel_t *ch) { return ch->out.pending; }
uint64_t nr_channel_write_mark(const nr_channel_t *ch) {
  NR_ASSERT_CHANNEL_LOOP(ch);
  return ch->out.appended;
}
bool nr_channel_has_unflushed(const nr_channel_t *ch) {
  NR_ASSERT_CHANNEL_LOOP(ch);
  return ch->out.appended > ch->out.flushed || ch->out.dq_unflushed > 0;
}
int nr_channel_watch_write(nr_channel_t *ch, uint64_t mark, nr_promise_t *p) {
  NR_ASSERT_CHANNEL_LOOP(ch);
  return nr__out_watch(&ch->out, mark, p);
}
/* Lazily made, from any thread. The closing loop sets `closed` then looks
 * for a future; a requester installs its future then looks at `closed`:
 * one of them (or both: completion is idempotent) completes it. */
nr_promise_t *nr_channel_close_future(const nr_channel_t *cch) {
  nr_channel_t *ch = (nr_channel_t *)cch;
  nr_promise_t *p = atomic_load(&ch->close_future);
  if (p != NULL)
    return p;
  nr_promise_t *n = nr_promise_new();
  if (n == NULL)
    return NULL;
  if (!atomic_compare_exchange_strong(&ch->close_future, &p, n)) {
    nr_promise_release(n);                  /* another thread was first */
    return p;
  }
  if (atomic_load(&ch->closed))
    nr_promise_set_success(n, NULL, NULL);
  return n;
}

void nr__channel_closed(nr_channel_t *ch) {
  nr_init_fn hook = ch->closed_hook;
  ch->closed_hook = NULL;                     /* once */
  if (hook)
    hook(ch, ch->init_arg);
  atomic_store(&ch->closed, true);
  nr_promise_t *p = atomic_load(&ch->close_future);
  if (p != NULL)
    nr_promise_set_success(p, NULL, NULL);
}
const nr_channel_opts_t *nr_channel_options(const nr_channel_t *ch) {
  NR_ASSERT_CHANNEL_LOOP(ch);
  return &ch->opts;
}

/* Any thread: nothing is cached, so there is nothing to race on. */
int nr_channel_local_address(const nr_channel_t *ch, char *host, size_t n,
                             int *port) {
  if (ch->setup && ch->setup->unix_path) {   /* set before the bind completed */
    snprintf(host, n, "%s", ch->setup->unix_path);
    *port = -1;
    return 0;
  }
  struct sockaddr_storage ss;
  socklen_t len = sizeof ss;
  if (!(pub(ch) & NR__OPEN) ||
      nr_sys_getsockname(ch->io.fd, (struct sockaddr *)&ss, &len) < 0)
    return -ENOTCONN;
  return nr_format_addr(&ss, len, host, n, port);
}

static const struct sockaddr_storage *peer(const nr_channel_t *ch) {
  return ch->raddr_big ? ch->raddr_big
                       : (const struct sockaddr_storage *)(const void *)&ch->raddr;
}

int nr__channel_set_raddr(nr_channel_t *ch, const void *sa, socklen_t len) {
  if (len <= sizeof ch->raddr && ((const struct sockaddr *)sa)->sa_family != AF_UNIX) {
    memcpy(&ch->raddr, sa, len);
  } else {
    if (ch->raddr_big == NULL &&
        (ch->raddr_big = malloc(sizeof *ch->raddr_big)) == NULL)
      return -ENOMEM;
    memset(ch->raddr_big, 0, sizeof *ch->raddr_big);  /* paths end in NUL */
    memcpy(ch->raddr_big, sa, len < sizeof *ch->raddr_big ? len : sizeof *ch->raddr_big);
  }
  ch->rlen = len;
  return 0;
}

int nr_channel_remote_address(const nr_channel_t *ch, char *host, size_t n,
                              int *port) {
  if (ch->kind != NR__STREAM)
    return -ENOTCONN;
  return nr_format_addr(peer(ch), ch->rlen, host, n, port);
}

/* ---- registration and interest ------------------------------------------------ */

void nr__channel_update_interest(nr_channel_t *ch) {
  if (ch->st & NR__CLOSED || !(ch->st & NR__REGISTERED))
    return;
  uint32_t ev = 0;
  bool active = pub(ch) & NR__ACTIVE;
  if (ch->kind == NR__LISTEN) {
    if (active && !(ch->st & NR__ACCEPT_PAUSED))
      ev = EPOLLIN;
  } else {
    if (ch->st & (NR__CONNECTING | NR__WAIT_OUT))
      ev |= EPOLLOUT;
    if (active && !(ch->st & (NR__INPUT_SHUT | NR__CLOSING | NR__CLOSE_IDLE |
                              NR__READS_HELD)) &&
        (ch->opts.auto_read || (ch->st & NR__READ_REQ)))
      ev |= EPOLLIN;
  }
  int rc = nr__io_modify(ch->loop, &ch->io, ev);
  if (rc < 0)
    nr_log(NR_LOG_WARN, "channel %llu: epoll_ctl: %s",
           (unsigned long long)ch->id, nr_strerror(rc));
}

int nr__channel_register(nr_channel_t *ch, uint32_t events) {
  nr_loop_t *l = ch->loop;
  int rc = nr__io_start(l, &ch->io, events);
  if (rc < 0)
    return rc;
  ch->st |= NR__REGISTERED;
  ch->lprev = NULL;
  ch->lnext = l->channels;
  if (l->channels)
    l->channels->lprev = ch;
  else
    l->channels_tail = ch;
  l->channels = ch;
  atomic_fetch_add_explicit(&l->channel_count, 1, memory_order_relaxed);
  if (ch->init)
    ch->init(ch, ch->init_arg);
  if (!(ch->st & NR__CLOSED))
    nr__pipeline_fire_registered(&ch->pipe);
  return 0;
}

void nr__channel_set_active(nr_channel_t *ch) {
  atomic_fetch_or(&ch->pub, NR__ACTIVE);
  ch->st |= NR__WAS_ACTIVE;
  nr__pipeline_fire_active(&ch->pipe);
  nr__channel_update_interest(ch);
}

void nr__channel_unlink(nr_channel_t *ch) {
  nr_loop_t *l = ch->loop;
  if (ch->st & NR__UNREF) {
    ch->st &= ~NR__UNREF;
    atomic_fetch_sub(&l->channel_unrefs, 1);
  }
  if (ch->lprev)
    ch->lprev->lnext = ch->lnext;
  else
    l->channels = ch->lnext;
  if (ch->lnext)
    ch->lnext->lprev = ch->lprev;
  else
    l->channels_tail = ch->lprev;
  ch->st &= ~(NR__FRESH | NR__IDLE | NR__HANDSHAKING);
  atomic_fetch_sub_explicit(&l->channel_count, 1, memory_order_relaxed);
  ch->lprev = NULL;
  ch->lnext = l->graveyard;                  /* the loop's ref waits here */
  l->graveyard = ch;
}

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
static void first_bytes(nr_channel_t *ch) {
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

/* ---- writing ------------------------------------------------------------------ */

/* ---- watches (nr_channel_watch) ----
 *
 * A list per channel, told in order. A watch may end itself or another
 * while they are told: each walk under way on this thread is a frame on
 * its stack (walks nest: a watch that writes to another channel tells
 * that one's), and nr_channel_unwatch moves a frame's cursor past the
 * watch it removes, so no walk reaches freed memory. A change met while
 * a channel's watches are told (a watch wrote to it) is told as one more
 * round once this one ends: each watch reads the state itself. The
 * channel keeps only the list's head (a connection stays within its
 * memory budget). */
typedef struct tell_s {
  nr_channel_t *ch;
  nr_chwatch_t *next;                  /* the next one told */
  bool again;                          /* a change met meanwhile */
  struct tell_s *up;
} tell_t;
static _Thread_local tell_t *telling;

void nr_channel_watch(nr_channel_t *ch, nr_chwatch_t *w) {
  NR_ASSERT_CHANNEL_LOOP(ch);
  assert(w->ch == NULL);
  w->ch = nr_channel_retain(ch);
  w->prev = NULL;
  w->next = ch->watches;
  if (ch->watches)
    ch->watches->prev = w;
  ch->watches = w;
}

void nr_channel_unwatch(nr_chwatch_t *w) {
  nr_channel_t *ch = w->ch;
  if (ch == NULL)
    return;
  NR_ASSERT_CHANNEL_LOOP(ch);
  for (tell_t *t = telling; t != NULL; t = t->up)
    if (t->next == w)
      t->next = w->next;
  *(w->prev ? &w->prev->next : &ch->watches) = w->next;
  if (w->next)
    w->next->prev = w->prev;
  w->ch = NULL;
  w->prev = w->next = NULL;
  nr_channel_release(ch);
}

static void tell_watches(nr_channel_t *ch) {
  if (ch->watches == NULL)
    return;
  for (tell_t *t = telling; t != NULL; t = t->up)
    if (t->ch == ch) {                 /* told again by a watch: once */
      t->again = true;                 /* more, after this round */
      return;
    }
  tell_t t = {ch, NULL, false, telling};
  telling = &t;
  nr_channel_retain(ch);               /* (the last watch may end) */
  do {
    t.again = false;
    for (nr_chwatch_t *w = ch->watches; w != NULL; w = t.next) {
      t.next = w->next;
      w->fn(w, ch);
    }
  } while (t.again);
  telling = t.up;
  nr_channel_release(ch);
}

static void check_writability(nr_channel_t *ch) {
  bool w = pub(ch) & NR__WRITABLE;
  if (w && ch->out.pending > ch->opts.write_buffer_high) {
    atomic_fetch_and(&ch->pub, ~NR__WRITABLE);
    ch->st |= NR__LAGGING;                   /* (read_stream) */
  } else if (!w && ch->out.pending < ch->opts.write_buffer_low &&
           (pub(ch) & NR__OPEN))
    atomic_fetch_or(&ch->pub, NR__WRITABLE);
  else
    return;
  nr__pipeline_fire_writability(&ch->pipe);
  tell_watches(ch);
}

static void finish_close(nr_channel_t *ch, bool abort);
static void do_write(nr_channel_t *ch);

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

static void send_unlist(nr_channel_t *ch) {
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

static void send_list(nr_channel_t *ch, uint64_t now) {
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

/* After a write: join, restamp (the peer took bytes) or leave the list.
 * One test when the channel is not blocked. */
static inline void send_watch(nr_channel_t *ch, uint64_t written_before) {
  if (!(ch->st & (NR__WAIT_OUT | NR__SEND_LISTED)))
    return;
  if (!(ch->st & NR__WAIT_OUT) || ch->opts.send_timeout == 0 ||
      ch->kind != NR__STREAM) {
    send_unlist(ch);
  } else if (!(ch->st & NR__SEND_LISTED) ||
             ch->out.written != written_before) {
    send_unlist(ch);
    send_list(ch, nr_now());
  }
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

static void send_expire(nr_loop_t *l, uint64_t now) {
  nr_channel_t *ch;
  while ((ch = l->send_head) != NULL && ch->send_deadline <= now) {
    int outq = 0;
    send_unlist(ch);
    if (nr_sys_ioctl(ch->io.fd, SIOCOUTQ, &outq) == 0 && outq < ch->send_outq)
      send_list(ch, now);            /* the peer took bytes: time afresh */
    else
      send_timed_out(ch);
  }
}

static int send_timer_fired(void *arg) {
  nr_loop_t *l = arg;
  nr_timer_release(l->send_timer);     /* this one: the loop holds its own */
  l->send_timer = NULL;
  uint64_t now = nr_now();
  send_expire(l, now);
  if (l->send_head != NULL)
    send_arm(l, now);
  return 0;
}

void nr_channel_set_send_timeout(nr_channel_t *ch, uint64_t ns) {
  NR_ASSERT_CHANNEL_LOOP(ch);
  ch->opts.send_timeout = ns;
  if (ch->st & NR__CLOSED)
    return;
  send_unlist(ch);
  send_watch(ch, ch->out.written);
}

static int flush_task(void *arg) {
  nr_channel_t *ch = arg;
  ch->st &= ~NR__FLUSH_TASK;
  if (!(ch->st & NR__CLOSED) && !(ch->st & NR__WAIT_OUT))
    do_write(ch);
  nr_channel_release(ch);
  return 0;
}

/* The write spin ran out with the socket still writable: let other channels
 * run and continue in a task (Netty's incompleteWrite(false)). */
static void schedule_flush(nr_channel_t *ch) {
  if (ch->st & NR__FLUSH_TASK)
    return;
  ch->st |= NR__FLUSH_TASK;
  if (nr_loop_execute(ch->loop, flush_task, nr_channel_retain(ch)) < 0) {
    ch->st &= ~NR__FLUSH_TASK;
    nr_channel_release(ch);
  }
}

static void write_failed(nr_channel_t *ch, int err) {
  char msg[160];
  snprintf(msg, sizeof msg, "write: %s", nr__errname(err));
  nr__out_fail_all(ch->loop, &ch->out, err, msg);
  finish_close(ch, true);
}

static void write_stream(nr_channel_t *ch) {
  nr_outbound_t *o = &ch->out;
  struct iovec iov[MAX_IOV];
  int spins = ch->opts.write_spin;
  while (o->written < o->flushed) {
    if (spins-- == 0) {
      schedule_flush(ch);
      return;
    }
    int n = nr__out_iov(o, iov, MAX_IOV);
    struct msghdr mh = {.msg_iov = iov, .msg_iovlen = (size_t)n};
    ssize_t w = n == 0 ? nr__out_sendfile(o, ch->io.fd)  /* a file region */
                : n == 1 ? nr_sys_send(ch->io.fd, iov[0].iov_base, iov[0].iov_len)
                         : nr_sys_sendmsg(ch->io.fd, &mh);
    if (w < 0) {
      if (errno == EINTR)
        continue;
      if (errno == EAGAIN) {
        if (!(ch->st & NR__WAIT_OUT)) {
          ch->st |= NR__WAIT_OUT;
          nr__channel_update_interest(ch);
          nr__out_trim_head(ch->loop, o);
        }
        return;
      }
      write_failed(ch, -errno);
      return;
    }
    nr__out_consume(ch->loop, o, (size_t)w);
  }
}

static void write_dgrams(nr_channel_t *ch) {
  nr_outbound_t *o = &ch->out;
  while (o->dq && o->dq_count > o->dq_unflushed) {
    nr_dgram_t *g = o->dq;
    ssize_t w = nr_sys_sendto(ch->io.fd, g->data, g->len,
                              (struct sockaddr *)&g->addr, g->addrlen);
    if (w < 0 && errno == EINTR)
      continue;
    if (w < 0 && errno == EAGAIN) {
      if (!(ch->st & NR__WAIT_OUT)) {
        ch->st |= NR__WAIT_OUT;
        nr__channel_update_interest(ch);
      }
      return;
    }
    int err = w < 0 ? -errno : 0;
    o->dq = g->next;
    if (o->dq == NULL)
      o->dq_tail = &o->dq;
    o->dq_count--;
    o->pending -= g->len;
    if (g->p) {
      if (err)  /* per-datagram failures (e.g. ICMP refused) fail only it */
        nr_promise_set_failure(g->p, err, nr__errname(err));
      else
        nr_promise_set_success(g->p, NULL, NULL);
      nr_promise_release(g->p);
    }
    free(g);
  }
}

static bool drained(const nr_channel_t *ch) {
  return ch->out.written == ch->out.flushed &&
         (ch->out.dq == NULL || ch->out.dq_count == ch->out.dq_unflushed);
}

static void do_write(nr_channel_t *ch) {
  uint64_t written = ch->out.written;
  if (ch->kind == NR__DGRAM)
    write_dgrams(ch);
  else
    write_stream(ch);
  if (ch->st & NR__CLOSED)
    return;
  if (drained(ch) && (ch->st & NR__WAIT_OUT)) {
    ch->st &= ~NR__WAIT_OUT;
    nr__channel_update_interest(ch);
  }
  send_watch(ch, written);
  check_writability(ch);
  /* Ask again: a writability handler may have written, flushed and closed
   * meanwhile (its flush runs a nested do_write), and what it flushed must
   * still reach the peer before the close completes. */
  if ((ch->st & NR__CLOSING) && drained(ch))
    finish_close(ch, false);
}

/* ---- reading ------------------------------------------------------------------ */

static void read_error(nr_channel_t *ch, int err) {
  char msg[160];
  snprintf(msg, sizeof msg, "read: %s", nr__errname(err));
  nr_pipeline_fire_exception(&ch->pipe, &(nr_err_t){err, msg});
  nr__channel_close(ch, true);
}

static void input_closed(nr_channel_t *ch) {
  if (!ch->opts.allow_half_closure) {
    ch->st |= NR__INPUT_SHUT;                /* nothing more will come */
    nr__channel_close(ch, false);
    return;
  }
  ch->st |= NR__INPUT_SHUT;
  nr_sys_shutdown(ch->io.fd, SHUT_RD);
  nr__channel_update_interest(ch);
  nr_pipeline_fire_user_event(&ch->pipe, (void *)&NR_EVT_INPUT_SHUTDOWN);
}

/* A read of a lagging channel (NR__LAGGING: it turned unwritable, its
 * peer is sent more than it takes) that drained the socket with nothing
 * left to send: the peer has caught up, and is read in full again. */
static void caught_up(nr_channel_t *ch) {
  if (ch->out.pending == 0)
    ch->st &= ~NR__LAGGING;
}

static void read_stream(nr_channel_t *ch) {
  nr_loop_t *l = ch->loop;
  if (ch->st & NR__READS_HELD)
    return;               /* (an event from before the hold) */
  if (l->rbuf == NULL && (l->rbuf = malloc(NR_READ_BUF)) == NULL)
    return;
  int reads = 0, err = 0;
  bool eof = false;
  /* Every read asks for the whole shared buffer. Netty guesses a size
   * because each read allocates a buffer; here the buffer is the loop's and
   * the message is borrowed, so a smaller guess would only split what the
   * socket holds into more read() calls (and make an exact fit cost an
   * extra read that meets EAGAIN). But a peer that is sent more than it
   * takes (a client that pipelines requests and reads no answers) is read
   * NR_READ_LAGGING at a time until it catches up: the codecs stop when
   * the channel is unwritable and hold the rest of the read that filled
   * it, for as long as the peer reads nothing -- so a full read's rest
   * would stay with every such connection. */
  while (reads < ch->opts.max_reads) {
    size_t want = ch->st & NR__LAGGING ? NR_READ_LAGGING : NR_READ_BUF;
    ssize_t n = nr_sys_read(ch->io.fd, l->rbuf, want);
    if (n > 0) {
      if (reads++ == 0) { /* a read() is answered by data, not by EAGAIN */
        ch->st &= ~NR__READ_REQ;
        if (__builtin_expect(ch->st & NR__FRESH, 0))
          first_bytes(ch);
      }
      nr_bytes_t b = NR_BYTES(l->rbuf, (size_t)n);
      bool full = (size_t)n == want;
      if (__builtin_expect(!full && (ch->st & NR__LAGGING), 0))
        caught_up(ch);
      /* A short read is the last of this batch whatever the handlers do,
       * so they may take it later (before read_complete); after a full
       * one, what they do (a close, auto_read off) decides whether to
       * read again. */
      if (!full)
        nr_pipeline_fire_read_deferrable(&ch->pipe, &b);
      else
        nr_pipeline_fire_read(&ch->pipe, &b);
      if ((ch->st & (NR__CLOSED | NR__CLOSING)) || !full)
        break;            /* a short read drained the socket: skip EAGAIN */
      if ((!ch->opts.auto_read && !(ch->st & NR__READ_REQ)) ||
          (ch->st & NR__READS_HELD))
        break;
    } else if (n == 0) {
      eof = true;
      break;
    } else if (errno == EINTR) {
      continue;
    } else {
      if (errno != EAGAIN)
        err = -errno;
      break;
    }
  }
  if (reads > 0 && !(ch->st & NR__CLOSED))
    nr__pipeline_fire_read_complete(&ch->pipe);
  if (ch->st & NR__CLOSED)
    return;
  if (err)
    read_error(ch, err);
  else if (eof)
    input_closed(ch);
  else if (!ch->opts.auto_read)
    nr__channel_update_interest(ch);         /* one batch per read() */
}

static void read_dgrams(nr_channel_t *ch) {
  nr_loop_t *l = ch->loop;
  if (l->rbuf == NULL && (l->rbuf = malloc(NR_READ_BUF)) == NULL)
    return;
  int reads = 0;
  while (reads < ch->opts.max_reads && !(ch->st & NR__CLOSED)) {
    nr_datagram_t d;
    d.type = NR_MSG_DATAGRAM;
    d.addrlen = sizeof d.addr;
    ssize_t n = nr_sys_recvfrom(ch->io.fd, l->rbuf, NR_READ_BUF,
                                (struct sockaddr *)&d.addr, &d.addrlen);
    if (n < 0) {
      if (errno == EINTR)
        continue;
      if (errno != EAGAIN) {
        int err = -errno;
        char msg[160];
        snprintf(msg, sizeof msg, "recvfrom: %s", nr__errname(err));
        nr_pipeline_fire_exception(&ch->pipe, &(nr_err_t){err, msg});
      }
      break;
    }
    if (reads++ == 0)     /* a read() is answered by a datagram */
      ch->st &= ~NR__READ_REQ;
    d.data = l->rbuf;
    d.len = (size_t)n;
    nr_pipeline_fire_read(&ch->pipe, &d);
  }
  if (reads > 0 && !(ch->st & NR__CLOSED))
    nr__pipeline_fire_read_complete(&ch->pipe);
  if (!(ch->st & NR__CLOSED) && !ch->opts.auto_read)
    nr__channel_update_interest(ch);
}

/* ---- connecting --------------------------------------------------------------- */

static void connected(nr_channel_t *ch, nr_promise_t *p) {
  ch->st &= ~NR__CONNECTING;
  nr__attempts_end(ch);
  if (ch->setup)
    nr__timer_drop(&ch->setup->connect_timer);
  nr__channel_set_active(ch);
  if (p)
    nr_promise_set_success(p, nr_channel_retain(ch),
                           (void (*)(void *))nr_channel_release);
}

static void connect_failed(nr_channel_t *ch, int err, const char *msg) {
  nr_promise_t *p = ch->setup->connect_promise;
  ch->setup->connect_promise = NULL;
  if (p) {
    nr_promise_set_failure(p, err, msg);
    nr_promise_release(p);
  }
  nr__channel_close(ch, true);
}

void nr__channel_connect_fail(nr_channel_t *ch, int err, const char *msg) {
  connect_failed(ch, err, msg);
}

const struct sockaddr_storage *nr__channel_raddr(const nr_channel_t *ch) {
  return peer(ch);
}

void nr__channel_connect_done(nr_channel_t *ch) {
  nr_promise_t *p = ch->setup->connect_promise;
  ch->setup->connect_promise = NULL;
  connected(ch, p);
  if (p)
    nr_promise_release(p);
}

static void finish_connect(nr_channel_t *ch) {
  int err = 0;
  socklen_t len = sizeof err;
  if (nr_sys_getsockopt(ch->io.fd, SOL_SOCKET, SO_ERROR, &err, &len) < 0)
    err = errno;
  if (ch->setup->attempts && err != 0) {
    nr__attempt_failed(ch, -err);
    return;
  }
  if (err != 0) {
    char host[128], msg[256];
    int port = 0;
    nr_format_addr(peer(ch), ch->rlen, host, sizeof host, &port);
    snprintf(msg, sizeof msg, "%s:%d: %s", host, port, nr__errname(-err));
    connect_failed(ch, -err, msg);
    return;
  }
  nr__channel_connect_done(ch);
}

static int connect_timed_out(void *arg) {
  nr_channel_t *ch = arg;
  if (ch->st & NR__CONNECTING) {
    char host[128], msg[256];
    int port = 0;
    nr_format_addr(peer(ch), ch->rlen, host, sizeof host, &port);
    int n = snprintf(msg, sizeof msg, "%s:%d: connect timed out after %.3g s",
                     host, port, (double)ch->setup->connect_timeout / 1e9);
    if (ch->setup->attempts) {   /* what the addresses tried before said */
      int code;
      const char *before = nr__attempts_message(ch->setup->attempts, &code);
      if (*before && n > 0 && (size_t)n < sizeof msg)
        snprintf(msg + n, sizeof msg - (size_t)n, "; %s", before);
    }
    connect_failed(ch, NR_ETIMEDOUT, msg);
  }
  return 0;
}

/* ---- closing ------------------------------------------------------------------ */

static int linger_expired(void *arg) {
  nr_channel_t *ch = arg;
  if (ch->st & NR__CLOSING) {
    nr_log(NR_LOG_WARN, "channel %llu: peer did not read %llu pending bytes "
           "within the close linger; resetting",
           (unsigned long long)ch->id,
           (unsigned long long)(ch->out.flushed - ch->out.written));
    finish_close(ch, true);
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
    if (pending && (pub(ch) & NR__ACTIVE)) {
      /* Flush what was already flushed-to-channel, then close. */
      ch->st |= NR__CLOSING;
      nr__channel_update_interest(ch);
      ch->linger_timer = nr_loop_schedule(ch->loop, CLOSE_LINGER, 0,
                                          linger_expired, NULL, ch);
      if (!(ch->st & NR__WAIT_OUT))
        do_write(ch);
      return;
    }
  }
  finish_close(ch, abort);
}


static void finish_close(nr_channel_t *ch, bool abort) {
  if (ch->st & NR__CLOSED)
    return;
  send_unlist(ch);
  if (ch->st & NR__SEND_TIMED_OUT)
    abort = true;
  bool was_active = pub(ch) & NR__ACTIVE;
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
  tell_watches(ch);             /* (closed: each learns it, and lets go) */
}

int nr_channel_shutdown_output(nr_channel_t *ch) {
  NR_ASSERT_CHANNEL_LOOP(ch);
  if (ch->st & NR__CLOSED)
    return -ENOTCONN;
  return nr_sys_shutdown(ch->io.fd, SHUT_WR) < 0 ? -errno : 0;
}

/* Counted in the outbound buffer's pending bytes, as if written, with no
 * field of their own (an accepted channel's block stays within its
 * budget: spec/c/test_channel.c): nr_channel_pending_bytes tells what
 * the peer has yet to take, held here or there, and a channel whose peer
 * keeps its window shut stays lagging (read_stream) as one that does not
 * read. A write error or the close fails the buffer and forgets them
 * with the rest: what the holder gives back after that is gone already. */
void nr_channel_hold_bytes(nr_channel_t *ch, ptrdiff_t delta) {
  NR_ASSERT_CHANNEL_LOOP(ch);
  size_t give = delta < 0 ? (size_t)-delta : 0;
  if (give > ch->out.pending)       /* a failed buffer forgot them (close) */
    give = ch->out.pending;
  ch->out.pending = ch->out.pending - give + (delta > 0 ? (size_t)delta : 0);
  check_writability(ch);
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
      (pub(ch) & NR__ACTIVE) && !(ch->st & (NR__CLOSING | NR__CLOSED))) {
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
  send_expire(l, nr_now());      /* the loop's timers are cancelled by now */
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

/* ---- readiness ----------------------------------------------------------------- */

/* Whether the event is for a socket the channel had before connect.c gave
 * it another in this same pass (a connect to several addresses): fetched
 * in the batch before the swap, it says nothing of the new one. */
static inline bool stale(nr_loop_t *l, const nr_channel_t *ch) {
  return ch->setup && ch->setup->swapped_at ==
         atomic_load_explicit(&l->iterations, memory_order_relaxed);
}

static int on_io(nr_loop_t *l, nr_io_t *io, uint32_t events) {
  nr_channel_t *ch = (nr_channel_t *)io;
  if (stale(l, ch))
    return 0;
  if (ch->st & NR__CLOSED) {
    if (!(ch->st & NR__LINGER))
      return 0;
    nr__linger_drain(ch);
    return 1;
  }
  if (ch->kind == NR__LISTEN) {
    nr__accept_ready(ch);
    return 1;
  }
  if (ch->st & NR__CONNECTING) {
    finish_connect(ch);
    return 1;
  }
  if ((events & (EPOLLOUT | EPOLLERR)) && (ch->st & NR__WAIT_OUT))
    do_write(ch);
  if (ch->st & NR__CLOSED)
    return 1;
  if (events & (EPOLLIN | EPOLLERR | EPOLLHUP)) {
    if (io->events & EPOLLIN) {
      if (ch->kind == NR__DGRAM)
        read_dgrams(ch);
      else
        read_stream(ch);
    } else if (events & (EPOLLHUP | EPOLLERR)) {
      nr__channel_close(ch, true);   /* gone, and nobody asked to read */
    }
  }
  return 1;
}

/* ---- the head: outbound operations become syscalls ------------------------------- */

static int head_bind(nr_ctx_t *ctx, const struct sockaddr *sa, socklen_t len,
                     nr_promise_t *p) {
  nr_channel_t *ch = nr_ctx_channel(ctx);
  char host[128];
  int port = 0;
  nr_format_addr((const struct sockaddr_storage *)sa, len, host, sizeof host,
                  &port);
  nr_setup_t *su = nr__channel_setup(ch);
  if (su == NULL) {
    nr__channel_close(ch, true);
    return nr_raise(-ENOMEM, "bind: out of memory");
  }
  if (nr_sys_bind(ch->io.fd, sa, len) < 0 ||
      (ch->kind == NR__LISTEN &&
       nr_sys_listen(ch->io.fd, su->backlog > 0 ? su->backlog : 1024) < 0)) {
    int err = -errno;
    nr__channel_close(ch, true);
    return port >= 0 ? nr_raise(err, "%s:%d: %s", host, port, nr__errname(err))
                     : nr_raise(err, "%s: %s", host, nr__errname(err));
  }
  struct stat st;
  if (sa->sa_family == AF_UNIX &&
      (su->unix_path = strdup(((const struct sockaddr_un *)sa)->sun_path)) &&
      lstat(su->unix_path, &st) == 0 && S_ISSOCK(st.st_mode)) {
    su->unix_dev = st.st_dev;
    su->unix_ino = st.st_ino;
    ch->st |= NR__UNLINK_PATH;
  }
  nr__channel_set_active(ch);
  if (p)
    nr_promise_set_success(p, nr_channel_retain(ch),
                           (void (*)(void *))nr_channel_release);
  return 0;
}

static int head_connect(nr_ctx_t *ctx, const struct sockaddr *sa,
                        socklen_t len, nr_promise_t *p) {
  nr_channel_t *ch = nr_ctx_channel(ctx);
  nr_setup_t *su = nr__channel_setup(ch);
  if (su == NULL || nr__channel_set_raddr(ch, sa, len) < 0) {
    nr__channel_close(ch, true);
    return nr_raise(-ENOMEM, "connect: out of memory");
  }
  socklen_t first_len;
  if (su->attempts && (memcmp(nr__attempts_first(su->attempts, &first_len), sa,
                              len) != 0 || first_len != len))
    nr__attempts_end(ch);        /* a handler changed the address: that one */
  if (nr_sys_connect(ch->io.fd, sa, len) == 0) {
    connected(ch, p);
    return 0;
  }
  int err = -errno;
  if (err != -EINPROGRESS && su->attempts == NULL) {
    int port = 0;
    char host[128];
    nr_format_addr(peer(ch), len, host, sizeof host, &port);
    nr__channel_close(ch, true);
    return port >= 0 ? nr_raise(err, "%s:%d: %s", host, port, nr__errname(err))
                     : nr_raise(err, "%s: %s", host, nr__errname(err));
  }
  ch->st |= NR__CONNECTING;
  su->connect_promise = p ? nr_promise_retain(p) : NULL;
  nr__channel_update_interest(ch);
  if (su->connect_timeout)
    su->connect_timer = nr_loop_schedule(ch->loop, su->connect_timeout, 0,
                                         connect_timed_out, NULL, ch);
  if (su->attempts && err == -EINPROGRESS)
    nr__attempts_arm(ch);        /* the next address in a while, */
  else if (su->attempts)
    nr__attempt_failed(ch, err); /* or now */
  return 0;
}

static void complete_on_close(nr_promise_t *f, void *arg) {
  (void)f;
  nr_promise_t *p = arg;
  nr_promise_set_success(p, NULL, NULL);
  nr_promise_release(p);
}

static int head_close(nr_ctx_t *ctx, nr_promise_t *p) {
  nr_channel_t *ch = nr_ctx_channel(ctx);
  if (p)
    nr_promise_add_listener(nr_channel_close_future(ch), NULL,
                            complete_on_close, nr_promise_retain(p));
  nr__channel_close(ch, false);
  return 0;
}

void nr_channel_hold_reads(nr_channel_t *ch, bool held) {
  assert(nr_loop_in_thread(ch->loop));
  if (held == ((ch->st & NR__READS_HELD) != 0))
    return;
  ch->st ^= NR__READS_HELD;
  nr__channel_update_interest(ch);
}

static int head_read(nr_ctx_t *ctx) {
  nr_channel_t *ch = nr_ctx_channel(ctx);
  ch->st |= NR__READ_REQ;
  nr__channel_update_interest(ch);
  return 0;
}

static nr_msg_describe_fn describer;

void nr_set_msg_describer(nr_msg_describe_fn fn) {
  if (describer != fn)                 /* every Lua state sets the same one */
    describer = fn;
}

/* What a channel of this kind takes, and what it was given instead: a
 * message that reaches the head unencoded is a programmer's mistake. */
static int unwritable(nr_channel_t *ch, void *msg) {
  char what[96], where[128] = "";
  int type = nr_msg_type(msg);
  if (type == NR_MSG_BYTES || type == NR_MSG_SLICES)
    snprintf(what, sizeof what, "%s", type == NR_MSG_BYTES
             ? "a string" : "an array of strings");
  else if (type == NR_MSG_DATAGRAM)
    snprintf(what, sizeof what, "a datagram");
  else if (describer != NULL)
    describer(msg, what, sizeof what, where, sizeof where);
  else
    nr_msg_describe(type, what, sizeof what);
  const char *sep = where[0] ? ": " : "";     /* "app.lua:12: cannot write" */
  if (ch->kind == NR__DGRAM)
    return nr_raise(-EINVAL, "%s%scannot write %s to a datagram channel: it "
                    "takes { data = ..., host = ..., port = ... }", where, sep, what);
  return nr_raise(-EINVAL, "%s%scannot write %s to a stream channel: it takes "
                  "a string or an array of strings (no handler encoded it)",
                  where, sep, what);
}

static int head_write(nr_ctx_t *ctx, void *msg, nr_promise_t *p) {
  nr_channel_t *ch = nr_ctx_channel(ctx);
  if (!(pub(ch) & NR__OPEN))
    return nr_raise(NR_ECLOSED, "write on a closed channel");
  int rc;
  int type = nr_msg_type(msg);
  if (ch->kind == NR__DGRAM && type == NR_MSG_DATAGRAM) {
    rc = nr__out_append_dgram(&ch->out, msg, p);
  } else if (ch->kind == NR__STREAM && type == NR_MSG_BYTES) {
    const nr_bytes_t *b = msg;
    rc = nr__out_append(ch->loop, &ch->out, b->data, b->len, p);
  } else if (ch->kind == NR__STREAM && type == NR_MSG_SLICES) {
    const nr_slices_t *s = msg;
    rc = 0;
    for (size_t i = 0; rc == 0 && i < s->n; i++)   /* the promise: last part */
      rc = nr__out_append(ch->loop, &ch->out, s->v[i].data, s->v[i].len,
                          i + 1 == s->n ? p : NULL);
    if (s->n == 0 && p)
      nr_promise_set_success(p, NULL, NULL);
  } else if (ch->kind == NR__STREAM && type == NR_MSG_FILE) {
    rc = nr__out_append_file(ch->loop, &ch->out, msg, p);
  } else if (ch->kind != NR__LISTEN) {
    rc = unwritable(ch, msg);
  } else {
    rc = nr_raise(-EOPNOTSUPP, "a server channel cannot be written to");
  }
  if (rc == 0)
    check_writability(ch);
  return rc;
}

/* Writes in place (netrun.h): only when the next handler out is this head
 * of an open stream channel, so nothing would have seen the message. The
 * caller is a handler's write, so the pipeline is entered already, as
 * head_write's would be, when check_writability fires an event. */
char *nr_ctx_write_reserve(nr_ctx_t *ctx, size_t n) {
  nr_ctx_t *c = ctx->prev;
  while (!(c->mask & NR_OP_WRITE))
    c = c->prev;
  if (c->h != &nr__head_handler)
    return NULL;
  nr_channel_t *ch = c->pipe->ch;
  if (ch->kind != NR__STREAM || !(pub(ch) & NR__OPEN))
    return NULL;
  return nr__out_reserve(ch->loop, &ch->out, n);
}

void nr_ctx_write_commit(nr_ctx_t *ctx, size_t m) {
  nr_channel_t *ch = ctx->pipe->ch;
  nr__out_commit(&ch->out, m);
  check_writability(ch);
}

static int head_flush(nr_ctx_t *ctx) {
  nr_channel_t *ch = nr_ctx_channel(ctx);
  nr__out_flush(&ch->out);
  if (!(ch->st & (NR__WAIT_OUT | NR__CLOSED)))
    do_write(ch);
  return 0;
}

const nr_handler_t nr__head_handler = {
    .type = "head", .bind = head_bind, .connect = head_connect,
    .disconnect = head_close, .close = head_close, .read = head_read,
    .write = head_write, .flush = head_flush};

/* ---- any-thread entry points ----------------------------------------------------- */

typedef struct write_job_s {
  nr_channel_t *ch;
  nr_promise_t *p;
  bool flush;
  size_t len;
  char data[];
} write_job_t;

static int write_task(void *arg) {
  write_job_t *j = arg;
  nr_bytes_t b = NR_BYTES(j->data, j->len);
  if (j->len > 0 || j->p)
    nr_pipeline_write(&j->ch->pipe, &b, j->p);
  if (j->flush)
    nr_pipeline_flush(&j->ch->pipe);
  nr_promise_release(j->p);
  nr_channel_release(j->ch);
  free(j);
  return 0;
}

int nr_channel_write(nr_channel_t *ch, const void *data, size_t len,
                     bool flush, nr_promise_t *p) {
  if (ch->loop && nr__in_loop(ch->loop)) {
    nr_bytes_t b = NR_BYTES(data, len);
    int rc = nr_pipeline_write(&ch->pipe, &b, p);
    if (flush)
      nr_pipeline_flush(&ch->pipe);
    return rc;
  }
  write_job_t *j = malloc(sizeof *j + len);
  if (j == NULL)
    return -ENOMEM;
  j->ch = nr_channel_retain(ch);
  j->p = p ? nr_promise_retain(p) : NULL;
  j->flush = flush;
  j->len = len;
  memcpy(j->data, data, len);
  if (ch->loop == NULL || nr_loop_execute(ch->loop, write_task, j) < 0) {
    if (p)
      nr_promise_set_failure(p, NR_ECLOSED, "write on a closed channel");
    nr_promise_release(j->p);
    nr_channel_release(ch);
    free(j);
    return NR_ECLOSED;
  }
  return 0;
}

static int flush_pipeline_task(void *arg) {
  nr_channel_t *ch = arg;
  nr_pipeline_flush(&ch->pipe);
  nr_channel_release(ch);
  return 0;
}

/* Run fn(ch) on the channel's loop, now if already there. */
static int on_loop(nr_channel_t *ch, nr_task_fn fn) {
  nr_channel_retain(ch);
  if (ch->loop && nr__in_loop(ch->loop))
    return fn(ch);
  if (ch->loop == NULL || nr_loop_execute(ch->loop, fn, ch) < 0) {
    nr_channel_release(ch);
    return NR_ECLOSED;
  }
  return 0;
}

int nr_channel_flush(nr_channel_t *ch) {
  return on_loop(ch, flush_pipeline_task);
}

typedef struct close_job_s {
  nr_channel_t *ch;
  nr_promise_t *p;
} close_job_t;

static int close_pipeline_task(void *arg) {
  close_job_t *j = arg;
  nr_pipeline_close(&j->ch->pipe, j->p);
  nr_promise_release(j->p);
  nr_channel_release(j->ch);
  free(j);
  return 0;
}

int nr_channel_close(nr_channel_t *ch, nr_promise_t *p) {
  close_job_t *j = malloc(sizeof *j);
  if (j == NULL)
    return -ENOMEM;
  j->ch = nr_channel_retain(ch);
  j->p = p ? nr_promise_retain(p) : NULL;
  if (ch->loop && nr__in_loop(ch->loop))
    return close_pipeline_task(j);
  if (ch->loop == NULL || nr_loop_execute(ch->loop, close_pipeline_task, j) < 0) {
    /* The loop is gone, so the channel is closed already. */
    if (p)
      nr_promise_set_success(p, NULL, NULL);
    nr_promise_release(j->p);
    nr_channel_release(ch);
    free(j);
  }
  return 0;
}

static int abort_task(void *arg) {
  nr_channel_t *ch = arg;
  nr__channel_close(ch, true);
  nr_channel_release(ch);
  return 0;
}

int nr_channel_abort(nr_channel_t *ch) { return on_loop(ch, abort_task); }

static int read_task(void *arg) {
  nr_channel_t *ch = arg;
  if (!(ch->st & NR__CLOSED))
    nr_ctx_read(&ch->pipe.tail);
  nr_channel_release(ch);
  return 0;
}

int nr_channel_read(nr_channel_t *ch) { return on_loop(ch, read_task); }

static int auto_read_on(void *arg) {
  nr_channel_t *ch = arg;
  ch->opts.auto_read = 1;
  nr__channel_update_interest(ch);
  nr_channel_release(ch);
  return 0;
}

static int auto_read_off(void *arg) {
  nr_channel_t *ch = arg;
  ch->opts.auto_read = 0;
  nr__channel_update_interest(ch);
  nr_channel_release(ch);
  return 0;
}

int nr_channel_set_auto_read(nr_channel_t *ch, bool on) {
  return on_loop(ch, on ? auto_read_on : auto_read_off);
}

int nr_channel_set_option(nr_channel_t *ch, const char *name, int v) {
  NR_ASSERT_CHANNEL_LOOP(ch);
  nr_channel_opts_t *o = &ch->opts;
  if (strcmp(name, "auto_read") == 0) {
    o->auto_read = v;
    nr__channel_update_interest(ch);
    return 0;
  }
  if (strcmp(name, "write_buffer_low") == 0 && v >= 0)
    o->write_buffer_low = (size_t)v;
  else if (strcmp(name, "write_buffer_high") == 0 && v > 0)
    ch->out.high = o->write_buffer_high = (size_t)v;
  else if (strcmp(name, "allow_half_closure") == 0)
    o->allow_half_closure = v;
  else if (strcmp(name, "tcp_nodelay") == 0)
    o->tcp_nodelay = v;
  else if (strcmp(name, "keepalive") == 0)
    o->keepalive = v;
  else if (strcmp(name, "sndbuf") == 0)
    o->sndbuf = v;
  else if (strcmp(name, "rcvbuf") == 0)
    o->rcvbuf = v;
  else
    return -ENOENT;
  if (!(ch->st & NR__CLOSED))
    nr__apply_opts(ch->io.fd, ch->family, o);
  return 0;
}
