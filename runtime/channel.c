/*
 * channel.c -- channels (Netty's AbstractNioChannel and its unsafe): the
 * head handler that turns outbound operations into syscalls, reads into
 * the loop's shared buffer, flushes with gathered writes, writability,
 * half-close, and the two-phase close. Loop thread only, except where a
 * public function says "any thread": those hop to the loop with a task.
 * The close, bind and connect, the send timeout, shedding and the
 * any-thread entry points are files of their own (channel_internal.h
 * lists them).
 *
 * Lifetime: the creator's reference becomes the loop's at registration. A
 * close unregisters the channel at once but parks it in the loop's
 * graveyard; the loop drops its reference only after the current pass, so
 * an event already fetched for it finds memory that says CLOSED.
 */
#include <assert.h>
#include <netinet/in.h>
#include <stdio.h>
#include <sys/uio.h>
#include <unistd.h>

#include "channel_internal.h"

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
const struct sockaddr_storage *nr__channel_raddr(const nr_channel_t *ch) {
  return peer(ch);
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

void nr__channel_tell_watches(nr_channel_t *ch) {
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
  nr__channel_tell_watches(ch);
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



static int flush_task(void *arg) {
  nr_channel_t *ch = arg;
  ch->st &= ~NR__FLUSH_TASK;
  if (!(ch->st & NR__CLOSED) && !(ch->st & NR__WAIT_OUT))
    nr__channel_do_write(ch);
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
  nr__channel_finish_close(ch, true);
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

void nr__channel_do_write(nr_channel_t *ch) {
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
  nr__channel_send_watch(ch, written);
  check_writability(ch);
  /* Ask again: a writability handler may have written, flushed and closed
   * meanwhile (its flush runs a nested do_write), and what it flushed must
   * still reach the peer before the close completes. */
  if ((ch->st & NR__CLOSING) && drained(ch))
    nr__channel_finish_close(ch, false);
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
          nr__channel_first_bytes(ch);
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
    nr__channel_finish_connect(ch);
    return 1;
  }
  if ((events & (EPOLLOUT | EPOLLERR)) && (ch->st & NR__WAIT_OUT))
    nr__channel_do_write(ch);
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
    nr__channel_do_write(ch);
  return 0;
}

const nr_handler_t nr__head_handler = {
    .type = "head", .bind = nr__head_bind, .connect = nr__head_connect,
    .disconnect = head_close, .close = head_close, .read = head_read,
    .write = head_write, .flush = head_flush};
