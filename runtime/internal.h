/*
 * internal.h -- structures and cross-file helpers of the runtime core.
 *
 * Only the runtime/ sources include this. Ownership rules:
 *  - a loop's heap, ready list, channel list, chunk cache and read buffer
 *    belong to its thread; only the MPSC queues, the state and the wakeup
 *    word are touched by other threads (atomics).
 *  - channels and promises are reference counted and may be released on any
 *    thread; everything else about a channel is loop-thread only.
 */
#ifndef NR_INTERNAL_H
#define NR_INTERNAL_H

#include <assert.h>
#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <stdatomic.h>
#include <netinet/in.h>
#include <sys/epoll.h>
#include <sys/stat.h>

#include "error.h"
#include "netrun.h"
#include "sys.h"

#define NR_CACHELINE 64

/* What netrun.h promises of "loop thread only" functions: the caller runs
 * on loop l, or l is NULL (an object not on a loop yet is its creator's).
 * An assert, so debug builds check it and NDEBUG builds (RelWithDebInfo,
 * Release) pay nothing. */
#define NR_ASSERT_LOOP(l) assert((l) == NULL || nr_loop_in_thread(l))
#define NR_ASSERT_CHANNEL_LOOP(ch) NR_ASSERT_LOOP((ch)->loop)

/* ---- the clock seam (clock.c) -------------------------------------------- */

/* A simulation's clocks and entropy (runtime/sim/): set in nr__clock while
 * it exists; owns() says whether the calling thread runs on it. */
typedef struct nr_clock_s {
  bool (*owns)(void);
  uint64_t (*now)(void);             /* monotonic ns */
  uint64_t (*wall)(void);            /* ns since the Unix epoch */
  void (*random)(void *buf, size_t n);
} nr_clock_t;
extern const nr_clock_t *_Atomic nr__clock
    __attribute__((visibility("hidden")));

/* ---- MPSC queue (Vyukov's intrusive list): wait-free producers --------- */

typedef struct nr_mpsc_s {
  _Alignas(NR_CACHELINE) nr_task_t *_Atomic head;  /* producers swap here */
  _Alignas(NR_CACHELINE) nr_task_t *tail;          /* consumer only */
  nr_task_t stub;
} nr_mpsc_t;

void nr__mpsc_init(nr_mpsc_t *q);
void nr__mpsc_push(nr_mpsc_t *q, nr_task_t *t);
/* Consumer only. NULL when empty, or when a producer is mid-push (then
 * nr__mpsc_empty is false and the caller retries later). */
nr_task_t *nr__mpsc_pop(nr_mpsc_t *q);
bool nr__mpsc_empty(nr_mpsc_t *q);

/* ---- timer heap --------------------------------------------------------- */

typedef struct nr_heap_entry_s {
  uint64_t deadline, seq;
  nr_timer_t *timer;
} nr_heap_entry_t;

typedef struct nr_heap_s {
  nr_heap_entry_t *v;
  size_t n, cap;
} nr_heap_t;

int nr__heap_push(nr_heap_t *h, nr_timer_t *t, uint64_t seq);
nr_timer_t *nr__heap_peek(const nr_heap_t *h);
nr_timer_t *nr__heap_pop(nr_heap_t *h);
void nr__heap_remove(nr_heap_t *h, nr_timer_t *t);
void nr__heap_free(nr_heap_t *h);

enum { NR_TIMER_PENDING, NR_TIMER_DONE, NR_TIMER_CANCELLED };

struct nr_timer_s {
  nr_task_t task;            /* carries cross-thread add, ready-list links */
  nr_loop_t *loop;
  uint64_t deadline;
  int64_t period;
  nr_task_fn fn, cancel_fn;
  void *arg;
  uint32_t idx;              /* heap index, NR_NOT_IN_HEAP when not in it */
  _Atomic int refs;
  _Atomic int state;
  bool keeps_alive;          /* nr_loop_schedule_ref: counted in timer_refs */
};
#define NR_NOT_IN_HEAP UINT32_MAX

/* ---- I/O watchers -------------------------------------------------------- */

typedef struct nr_io_s nr_io_t;
/* Returns 1 if the event did work (counts against spurious wakeups). */
typedef int (*nr_io_cb)(nr_loop_t *loop, nr_io_t *io, uint32_t events);
struct nr_io_s {
  int fd;
  uint32_t events;           /* registered interest */
  nr_io_cb cb;
  nr_io_t *prev, *next;      /* loop's registration list, for rebuilds */
};

int nr__io_start(nr_loop_t *loop, nr_io_t *io, uint32_t events);
int nr__io_modify(nr_loop_t *loop, nr_io_t *io, uint32_t events);
void nr__io_stop(nr_loop_t *loop, nr_io_t *io);

/* ---- outbound chunk cache (per loop) ----------------------------------- */

typedef struct nr_chunk_s {
  struct nr_chunk_s *next;
  size_t cap, start, end;
  /* A file region (NR_MSG_FILE) instead of bytes: its own descriptor (a
   * dup, closed as the chunk goes) and the file offset of position 0;
   * cap == end (no room to append to), no data. -1 for bytes. */
  int fd;
  uint64_t foff;
  char data[];
} nr_chunk_t;

#define NR_CHUNK_SIZE 16384
#define NR_READ_BUF 65536
/* What one read() takes of a peer that is sent more than it takes (see
 * read_stream). */
#define NR_READ_LAGGING 4096

/* A chunk for `need` bytes: NR_CHUNK_SIZE (from the cache) or more for a
 * larger write; with exact, a smaller write gets exactly its size (not
 * cached). NULL when out of memory. */
nr_chunk_t *nr__chunk_get(nr_loop_t *loop, size_t need, bool exact);
void nr__chunk_put(nr_loop_t *loop, nr_chunk_t *c);

/* ---- loops --------------------------------------------------------------- */

#define NR_AWAKE UINT64_MAX     /* next_wakeup: loop awake, no write needed */
#define NR_NONE (UINT64_MAX - 1) /* next_wakeup: blocked with no deadline */

typedef struct nr_hook_s {
  struct nr_hook_s *next;
  nr_task_fn fn;
  void *arg;
} nr_hook_t;

struct nr_loop_s {
  /* Cache lines are grouped by writer, so producers and the loop do not
   * invalidate each other's lines on every task. */
  nr_mpsc_t tasks;
  nr_mpsc_t tail_tasks;
  /* written by producers (RMW) */
  _Alignas(NR_CACHELINE) _Atomic int producers;  /* inside execute() */
  _Atomic uint64_t enqueued;        /* tasks ever queued */
  _Atomic uint64_t wakeups;         /* eventfd writes */
  _Atomic uint64_t timer_count;     /* timers alive (schedule/discard) */
  _Atomic uint64_t timer_refs;      /* those that keep the loop alive */
  _Atomic int64_t held;             /* work owed to it (nr_loop_hold) */
  _Atomic int64_t waits;            /* requests it waits for (nr_loop_ref) */
  /* read by producers on every task, written rarely */
  _Alignas(NR_CACHELINE) _Atomic int state;
  _Atomic uint64_t next_wakeup;     /* written only around a blocking select */
  /* Set by the stall watchdog while it reports the loop stalled (from the
   * report until the run ends): group choosers pass it over. */
  _Atomic bool stalled;
  /* written by the loop, read by stats and bounded producers */
  _Alignas(NR_CACHELINE) _Atomic uint64_t dequeued;
  _Atomic uint64_t tasks_run, io_events, rebuilds, iterations, io_time,
      task_time, channel_count;
  _Atomic uint64_t channel_unrefs;  /* linked channels that keep it not alive */
  /* Stall detection: when the current stretch of work began (0: blocked in
   * the selector), stored once per iteration, and the task running (0: I/O
   * events). With tasks_run they tell the watchdog whether work moves. */
  _Atomic uint64_t busy_since;
  _Atomic uintptr_t task_fn;
  _Atomic uint64_t longest_run;     /* ns, timed on the loop (executor.c) */
  /* The lag (nr_loop_lag): at lag_at (ns), the longest run still owed,
   * run down by the time since (a run's events waited behind it; a stall
   * is felt until its length has passed again, not only one iteration
   * later). Written by the loop at each iteration's end. */
  _Atomic uint64_t lag, lag_at;
  /* written by the watchdog (stall.c), read by stats and the loop */
  _Atomic uint64_t stalls, max_busy, stall_claimed;
  /* Set when the watchdog sees a run in progress (see "the longest run",
   * executor.c): its previous sample's time, before which that run had not
   * begun; the loop takes it (exchange) and times the run. */
  _Atomic uint64_t wd_seen;
  _Atomic uint64_t shutdown_deadline;  /* when a shutdown asked is overdue */
  pthread_mutex_t hook_lock;
  nr_hook_t *hooks;
  uint64_t quiet, timeout;          /* graceful shutdown, under hook_lock */

  /* loop thread only */
  _Alignas(NR_CACHELINE) int epfd, wakefd;
  nr_io_t wake_io;
  nr_io_t *ios;                     /* registered watchers */
  nr_heap_t heap;
  uint64_t timer_seq;
  nr_task_t *ready, *ready_tail;    /* due timers' tasks, FIFO */
  uint64_t shutdown_start, last_execution;
  uint64_t run_once_deadline;       /* external loops: bound on blocking */
  int select_cnt;
  /* The iteration's wake-up, while one runs (0 between iterations): the
   * start of its I/O run, for the longest run (executor.c). */
  uint64_t run_from;
  bool spin;                        /* queued tasks ran last pass */
  bool held_seen;                   /* a shutdown waited for work owed */
  uint64_t dequeued_seen;
  nr_channel_t *channels;           /* registered channels, for close_all:
                                       newest first */
  nr_channel_t *channels_tail;      /* ... and the oldest */
  nr_channel_t *graveyard;          /* closed this pass, released after it */
  /* Channels blocked on EPOLLOUT with a send timeout, by deadline, and
   * the one timer for them: armed for send_at (<= the head's deadline). */
  nr_channel_t *send_head, *send_tail;
  nr_timer_t *send_timer;
  uint64_t send_at;
  nr_chunk_t *chunk_cache;
  int chunk_cached;
  char *rbuf;                       /* shared read buffer */
  struct epoll_event *events;
  int nevents;

  /* configuration */
  char *name;
  _Atomic int refs;          /* its group's, and each listener's queued to it */
  _Atomic size_t memory;     /* nr_loop_memory */
  int io_ratio, rebuild_threshold;
  size_t max_pending;
  bool external;
  void (*on_start)(nr_loop_t *, void *);
  void (*on_exit)(nr_loop_t *, void *);
  void *ud, *data;
  nr_group_t *group;
  pthread_t thread;
  bool thread_started;
  nr_promise_t *termination;
  /* The simulation running this loop (runtime/sim/), NULL for a real
   * one: set at creation, on the simulation's thread, for good. */
  struct nr_simloop_s *sim;
  uint64_t stall_threshold, stall_timeout;
  nr_stall_fn on_stall;
  /* watchdog thread only (under its lock) */
  struct nr_watch_s {
    nr_loop_t *next;
    bool listed, reported, asked, overdue;
    uint64_t mark, since, start, asked_at, interrupted_at;
    uint64_t sampled_at;             /* the last sample of this loop */
  } wd;
};


/* ---- pipelines ------------------------------------------------------------ */

struct nr_ctx_s {
  nr_ctx_t *prev, *next;     /* kept after removal so in-flight events go on */
  nr_pipeline_t *pipe;
  const nr_handler_t *h;
  void *state;
  char *name;
  unsigned mask;             /* skip mask: events this context handles */
  bool removed, embedded;    /* embedded: the pipeline's head or tail */
  bool catching;             /* inside its handler's exception callback */
  int refs;                  /* loop thread only */
  nr_ctx_t *zombie_next;
};

struct nr_pipeline_s {
  nr_channel_t *ch;
  nr_ctx_t head, tail;
  int depth;                 /* handler calls in progress */
  nr_ctx_t *zombies;         /* removed during a call: freed at depth 0 */
  unsigned teardown;         /* NR__TD_* of a close made during a call */
  unsigned auto_names;
  bool destroyed;             /* torn down: no handler may join it */
  const void *deferrable;    /* the read being fired may be taken later */
  const void *tokened;       /* the read being fired has a token: */
  uint64_t token;
};

void nr__pipeline_init(nr_pipeline_t *p, nr_channel_t *ch,
                       const nr_handler_t *head);
void nr__pipeline_destroy(nr_pipeline_t *p);   /* remove every handler */
/* What closing a channel does to its pipeline: inactive, unregistered,
 * then every handler removed -- at once, or once the handler calls in
 * progress have returned (see pipeline.c). */
enum { NR__TD_INACTIVE = 1, NR__TD_UNREGISTERED = 2, NR__TD_DESTROY = 4 };
void nr__pipeline_teardown(nr_pipeline_t *p, unsigned what);
int nr__pipeline_bind(nr_pipeline_t *p, const struct sockaddr *sa,
                      socklen_t len, nr_promise_t *prom);
int nr__pipeline_connect(nr_pipeline_t *p, const struct sockaddr *sa,
                         socklen_t len, nr_promise_t *prom);
void nr__pipeline_fire_registered(nr_pipeline_t *p);
void nr__pipeline_fire_unregistered(nr_pipeline_t *p);
void nr__pipeline_fire_active(nr_pipeline_t *p);
void nr__pipeline_fire_inactive(nr_pipeline_t *p);
void nr__pipeline_fire_read_complete(nr_pipeline_t *p);
void nr__pipeline_fire_writability(nr_pipeline_t *p);

/* ---- outbound buffer -------------------------------------------------------- */

typedef struct nr_wentry_s {
  nr_promise_t *p;
  uint64_t end;              /* stream offset at which the write completes */
} nr_wentry_t;

typedef struct nr_dgram_s {
  struct nr_dgram_s *next;
  nr_promise_t *p;
  struct sockaddr_storage addr;
  socklen_t addrlen;
  size_t len;
  char data[];
} nr_dgram_t;

typedef struct nr_outbound_s {
  nr_chunk_t *head, *tail;
  uint64_t appended, flushed, written;   /* stream offsets */
  nr_wentry_t *ents;                     /* ring of write promises */
  uint32_t ehead, ecount, ecap;          /* (32 bits: the channel's budget) */
  nr_dgram_t *dq, **dq_tail;             /* datagrams, in order */
  size_t dq_count, dq_unflushed;         /* all / trailing not yet flushed */
  size_t pending;                        /* bytes queued, for water marks */
  size_t high;                           /* the channel's write_buffer_high
                                            (0: none): chunks near it are
                                            sized to their writes */
  /* Offsets never go back, so a write is known by the offset where it
   * ends (its mark: nr_channel_write_mark). Bytes from dropped_from on were
   * dropped unwritten (close, write error) with drop_code; UINT64_MAX when
   * nothing was. */
  uint64_t dropped_from;
  int drop_code;
} nr_outbound_t;

void nr__out_init(nr_outbound_t *o);
int nr__out_append(nr_loop_t *l, nr_outbound_t *o, const void *data,
                   size_t len, nr_promise_t *p);
/* Room for n contiguous bytes at the end of the stream (NULL: out of
 * memory), then the appending of the 0 < m <= n bytes written there, with
 * nothing in between: an encoder writes in place instead of copying. */
char *nr__out_reserve_chunk(nr_loop_t *l, nr_outbound_t *o, size_t n);
static inline char *nr__out_reserve(nr_loop_t *l, nr_outbound_t *o,
                                    size_t n) {
  nr_chunk_t *t = o->tail;
  if (t != NULL && t->cap - t->end >= n)
    return t->data + t->end;
  return nr__out_reserve_chunk(l, o, n);
}
static inline void nr__out_commit(nr_outbound_t *o, size_t m) {
  o->tail->end += m;
  o->appended += m;
  o->pending += m;
}
int nr__out_append_dgram(nr_outbound_t *o, const nr_datagram_t *d,
                         nr_promise_t *p);
void nr__out_flush(nr_outbound_t *o);
/* Append a file region (outfile.c): a dup of r->fd, so the caller keeps
 * its own; counted in pending like bytes. 0 or -errno. */
int nr__out_append_file(nr_loop_t *l, nr_outbound_t *o,
                        const nr_file_region_t *r, nr_promise_t *p);
/* The head chunk is a file region: send its flushed part to the socket
 * (sendfile(2); a simulated socket gets it through a buffer). The bytes
 * sent, or -1 and errno; a file that ends before its region does (it was
 * truncated) is -1 with ENODATA, for the caller to fail the channel: its
 * peer was promised those bytes. */
ssize_t nr__out_sendfile(nr_outbound_t *o, int sock);
/* The socket took no more (EAGAIN), and its peer may take nothing for
 * long: a head chunk (16 KiB or more) written past its half keeps its room
 * for the bytes left in it, so they move to a chunk of their size (and a
 * 16 KiB one goes back to the loop's cache). */
void nr__out_trim_head(nr_loop_t *l, nr_outbound_t *o);
/* Fill iov with flushed, unwritten bytes; returns the count. */
int nr__out_iov(nr_outbound_t *o, struct iovec *iov, int max);
/* n bytes were written: drop them, complete finished writes. */
void nr__out_consume(nr_loop_t *l, nr_outbound_t *o, size_t n);
/* Fail writes not yet flushed and drop their bytes. */
void nr__out_fail_unflushed(nr_loop_t *l, nr_outbound_t *o, int code);
/* Fail everything and free the buffer. */
void nr__out_fail_all(nr_loop_t *l, nr_outbound_t *o, int code,
                      const char *msg);
/* Complete p once the stream bytes up to `mark` are written: now if they
 * are, failed if they were dropped, else from the promise ring. */
int nr__out_watch(nr_outbound_t *o, uint64_t mark, nr_promise_t *p);

/* ---- channels -------------------------------------------------------------- */

enum { NR__STREAM, NR__LISTEN, NR__DGRAM };

/* Bits of nr_channel_t.pub, readable from any thread. */
enum { NR__OPEN = 1, NR__ACTIVE = 2, NR__WRITABLE = 4 };

/* Bits of nr_channel_t.st, loop thread only. */
enum {
  NR__REGISTERED = 1u << 0, NR__CONNECTING = 1u << 1, NR__CLOSING = 1u << 2,
  NR__CLOSED = 1u << 3, NR__INPUT_SHUT = 1u << 4, NR__READ_REQ = 1u << 5,
  NR__WAIT_OUT = 1u << 6, NR__FLUSH_TASK = 1u << 7, NR__WAS_ACTIVE = 1u << 8,
  NR__UNLINK_PATH = 1u << 9, NR__ACCEPT_PAUSED = 1u << 10,
  NR__LINGER = 1u << 11,          /* closed; the fd waits for the peer's FIN */
  NR__CLOSE_IDLE = 1u << 12,      /* shutting down: close once nothing is held */
  NR__LINGER_WANTED = 1u << 13,   /* nr_channel_linger: a close lingers */
  NR__SEND_LISTED = 1u << 14,     /* on the loop's send-timeout list */
  NR__SEND_TIMED_OUT = 1u << 15,  /* the send timeout ran out: closes reset */
  NR__SHUTDOWN_TOLD = 1u << 16,   /* NR_EVT_SHUTDOWN was fired on it */
  NR__CLOSE_IDLE_PIPE = 1u << 17, /* CLOSE_IDLE's close goes through the
                                     pipeline (nr_channel_close_when_idle) */
  NR__UNREF = 1u << 18,           /* linked, and keeps its loop not alive */
  NR__LAGGING = 1u << 19,         /* its peer is sent more than it takes:
                                     reads are NR_READ_LAGGING at most */
  NR__FRESH = 1u << 20,           /* accepted, and its peer has shown
                                     nothing yet (nr_channel_established) */
  NR__FRESH_TO_MESSAGE = 1u << 21, /* a byte does not end NR__FRESH: a
                                     codec's first message does */
  NR__READS_HELD = 1u << 22,      /* nr_channel_hold_reads: read nothing */
  NR__IDLE = 1u << 23,            /* a codec waits for the peer, owing it
                                     nothing (nr_channel_set_idle) */
  NR__HANDSHAKING = 1u << 24      /* a TLS server handshake under way
                                     (nr_channel_set_handshaking) */
};

typedef struct nr_server_s {
  nr_group_t *child_group;
  nr_loop_t *child_loop;        /* instead of child_group's next() */
  nr_channel_opts_t child;
  nr_init_fn child_init;
  nr_init_fn child_closed;
  void *arg;
  bool child_inherits;          /* TCP_NODELAY, SO_KEEPALIVE set on the
                                   listener: accept(2) copies them */
  uint64_t backoff;
  nr_timer_t *backoff_timer;
  nr_channel_t **siblings;      /* reuseport: the other loops' listeners */
  int nsiblings;
  /* Out of descriptors (bootstrap.c, "shedding"): the loops asked to close
   * fresh channels that have not answered yet, what they closed so far,
   * and when the last warning was logged. The listener's loop only. */
  int shed_waiting, shed_closed;
  uint64_t shed_logged;
} nr_server_t;

/* What only a channel made by the bootstrap uses -- a listener, a channel
 * of nr_connect or nr_udp_bind -- and an accepted connection never does:
 * allocated for those (nr__channel_setup), so an idle accepted connection
 * does not carry it. Written before registration, then on the loop. */
typedef struct nr_attempts_s nr_attempts_t;

typedef struct nr_setup_s {
  nr_promise_t *reg_promise;         /* bootstrap: the caller's future */
  nr_promise_t *connect_promise;
  nr_attempts_t *attempts;           /* a connect to several addresses */
  uint64_t swapped_at;               /* the loop iteration in which connect.c
                                        last gave the channel a new socket */
  nr_timer_t *connect_timer;
  uint64_t connect_timeout;
  char *unix_path;                   /* a listener's socket file, and */
  dev_t unix_dev;                    /* its identity: close unlinks only */
  ino_t unix_ino;                    /* the socket it bound */
  int backlog;
} nr_setup_t;

struct nr_channel_s {
  nr_io_t io;
  _Atomic int refs;
  _Atomic int pub;
  nr_loop_t *loop;
  uint64_t id;
  unsigned st;
  unsigned holds;            /* work owed (nr_channel_hold) */
  nr_pipeline_t pipe;
  nr_outbound_t out;
  nr_channel_opts_t opts;
  /* Made on first request (most channels are never asked for it: an idle
   * connection should not pay for a promise); `closed` is set when the
   * channel has closed, after which the future is completed by whoever
   * sees both. See nr_channel_close_future. */
  nr_promise_t *_Atomic close_future;
  _Atomic bool closed;
  uint8_t kind, family;              /* (in what `closed` leaves: a channel
                                        stays within 640 bytes) */
  nr_timer_t *linger_timer;
  uint64_t linger_until;     /* a lingering close ends by then (NR__LINGER) */
  uint64_t goodbye_until;    /* a shutdown leaves it open until then
                                (nr_channel_delay_shutdown_close) */
  nr_server_t *srv;
  nr_setup_t *setup;                 /* NULL for an accepted connection */
  nr_init_fn init;                   /* bootstrap: run at registration */
  nr_init_fn closed_hook;            /* run (with init_arg) as it closes */
  void *init_arg;
  /* The peer's address, inline when it is IPv4/IPv6 (the common, idle
   * case: a sockaddr_storage here would cost every connection 100 bytes
   * more), allocated for a unix path. The local address is asked of the
   * socket; only a unix listener keeps its path, which close unlinks. */
  union {
    struct sockaddr sa;
    struct sockaddr_in in;
    struct sockaddr_in6 in6;
    uint64_t align;
  } raddr;
  struct sockaddr_storage *raddr_big;
  socklen_t rlen;
  int send_outq;                     /* SIOCOUTQ when listed */
  nr_channel_t *lprev, *lnext;       /* loop's channel list / graveyard */
  nr_channel_t *sprev, *snext;       /* loop's send-timeout list */
  uint64_t send_deadline;            /* when listed: closed by then */
  nr_chwatch_t *watches;             /* nr_channel_watch: told of writability */
};

nr_channel_t *nr__channel_new(int kind, int family, int fd,
                              const nr_channel_opts_t *opts);
/* On the channel's loop: add to the selector and the loop's list, run init,
 * fire channel_registered. */
int nr__channel_register(nr_channel_t *ch, uint32_t events);
void nr__channel_update_interest(nr_channel_t *ch);
/* Record the peer's address; 0 or -ENOMEM. */
int nr__channel_set_raddr(nr_channel_t *ch, const void *sa, socklen_t len);
/* The channel's setup state, made (zeroed) on first call; NULL when out of
 * memory. Before registration or on the channel's loop. */
nr_setup_t *nr__channel_setup(nr_channel_t *ch);
void nr__accept_ready(nr_channel_t *ch);     /* bootstrap.c */
bool nr__server_closed(nr_channel_t *ch);    /* bootstrap.c */
void nr__server_free(nr_server_t *srv);      /* bootstrap.c */
void nr__channel_set_active(nr_channel_t *ch);
void nr__channel_close(nr_channel_t *ch, bool abort);
/* The channel has closed: complete its close future (if one was made). */
void nr__channel_closed(nr_channel_t *ch);
/* Take a channel off its loop's list, into the graveyard (its loop's
 * reference is dropped after the pass). */
void nr__channel_unlink(nr_channel_t *ch);
/* The lingering close (linger.c): start it for a stream channel being
 * closed gracefully (false: close the fd now); drain a lingering fd's
 * input (on_io); a shutting-down loop's turn ends it when due (abort:
 * now). */
bool nr__linger_start(nr_channel_t *ch);
void nr__linger_drain(nr_channel_t *ch);
void nr__linger_shutdown(nr_channel_t *ch, bool abort);
void nr__loop_reap(nr_loop_t *l);    /* release channels closed this pass */
/* Close the process's reserve descriptor, which lets a listener refuse
 * connections when the table is full and nothing can be freed (for tests:
 * the next listener made opens it again). */
void nr__accept_reserve_drop(void);
/* Close (reset) up to max of the loop's oldest sheddable channels --
 * accepted, and their peer silent or still short of a first message
 * (NR__FRESH), idle between requests (NR__IDLE) or in a TLS handshake
 * (NR__HANDSHAKING) --, oldest accepted first; returns how many. The
 * acceptor's answer to a descriptor table that is full. */
int nr__loop_shed_fresh(nr_loop_t *l, int max);
extern const nr_handler_t nr__head_handler;

/* connect.c: a connect to several addresses (RFC 8305). Loop thread only,
 * but for nr__attempts_new, nr__attempts_first, nr__attempts_skip_first
 * and nr__attempts_free_list (before the channel exists). */
/* The numeric addresses hosts (at most NR_MAX_ADDRS) with port, IPv6 and
 * IPv4 interleaved; 0, -ENOMEM, or -EINVAL (raised) for a host that is
 * not a numeric address. */
int nr__attempts_new(const char *const *hosts, int nhosts, int port,
                     nr_attempts_t **out);
const struct sockaddr_storage *nr__attempts_first(const nr_attempts_t *a,
                                                  socklen_t *len);
/* Drop the first address (no socket could be made for it: err) and
 * record why; false when none is left. */
bool nr__attempts_skip_first(nr_attempts_t *a, int err);
/* The failures recorded: "host:port: ENAME: reason; ..."; *code is the
 * first one's. */
const char *nr__attempts_message(const nr_attempts_t *a, int *code);
void nr__attempts_free_list(nr_attempts_t *a);
/* The channel's first connect is in flight: the next address starts
 * after the attempt delay if it has not answered. */
void nr__attempts_arm(nr_channel_t *ch);
/* The channel's own socket failed to connect with err: the next attempt
 * goes on, or the connect completes (nr__channel_connect_done) or fails
 * with every address's reason (nr__channel_connect_fail). */
void nr__attempt_failed(nr_channel_t *ch, int err);
/* The connect is over (connected, failed or closed): other attempts are
 * closed and the list freed. */
void nr__attempts_end(nr_channel_t *ch);
/* channel.c, for connect.c */
void nr__channel_connect_done(nr_channel_t *ch);
void nr__channel_connect_fail(nr_channel_t *ch, int err, const char *msg);
const struct sockaddr_storage *nr__channel_raddr(const nr_channel_t *ch);

/* socket.c */
/* "localhost" or a name under it, any case, a final dot allowed
 * (resolver.c). */
bool nr__is_localhost(const char *name);
int nr__resolve(const char *host, int port, int socktype, bool passive,
                struct sockaddr_storage *ss, socklen_t *len);
int nr__unix_addr(const char *path, struct sockaddr_storage *ss,
                  socklen_t *len);
/* Before binding a unix socket at ss: a socket file nobody answers on
 * (ECONNREFUSED) is removed; anything else that is not a socket is left
 * alone and fails with -EEXIST (raised). Returns 0 or -errno. */
int nr__unix_prepare(const struct sockaddr_storage *ss, socklen_t len);
/* Unlink path only if it is still the socket file (dev, ino) we bound. */
void nr__unlink_socket(const char *path, dev_t dev, ino_t ino);
/* A socket for loop l (nr_sys_socket), non-blocking; fd or -errno. */
int nr__socket(nr_loop_t *l, int family, int type);
void nr__apply_opts(int fd, int family, const nr_channel_opts_t *o);

/* executor.c */
int nr__loop_init(nr_loop_t *l, const nr_loop_opts_t *o);
void nr__loop_wakeup(nr_loop_t *l);
/* A loop's memory outlives nr_loop_free while a promise listener still
 * refers to it (a terminated loop rejects the listener's task). */
nr_loop_t *nr__loop_retain(nr_loop_t *l);
void nr__loop_release(nr_loop_t *l);
bool nr__loop_has_tasks(nr_loop_t *l);
/* Netty's runAllTasks(): due timers, then every queued task (timers that
 * fall due meanwhile join them), then tail tasks. */
bool nr__run_all_tasks(nr_loop_t *l);
/* Netty's runAllTasks(timeoutNanos): the same, stopping once timeout ns
 * have passed (checked every 64 tasks: 0 runs at most 64). Both return
 * whether any task ran. */
bool nr__run_tasks_for(nr_loop_t *l, uint64_t timeout);
bool nr__confirm_shutdown(nr_loop_t *l);
uint64_t nr__shutdown_poll_deadline(nr_loop_t *l, uint64_t deadline);
void nr__loop_set_current(nr_loop_t *l);

/* alive.c: work owed, in a shutdown (loop thread); about to block. */
bool nr__loop_held(nr_loop_t *l);
void nr__loop_blocking(nr_loop_t *l);

/* timer.c */
/* Cancel and release the timer at *t, if any, and forget it. */
void nr__timer_drop(nr_timer_t **t);
void nr__timers_fetch_due(nr_loop_t *l, uint64_t now);
uint64_t nr__next_deadline(nr_loop_t *l);     /* NR_NONE: no timer */
void nr__cancel_timers(nr_loop_t *l);         /* at shutdown */

/* A statistic of the loop (nr_loop_stats): only its thread writes it, so a
 * relaxed load and store add to it -- no read-modify-write -- and other
 * threads read a value that is at most late. */
static inline void nr__stat_add(_Atomic uint64_t *s, uint64_t v) {
  atomic_store_explicit(s, atomic_load_explicit(s, memory_order_relaxed) + v,
                        memory_order_relaxed);
}

/* loop.c */
int nr__selector_open(nr_loop_t *l);
void nr__selector_close(nr_loop_t *l);
int nr__loop_iteration(nr_loop_t *l);
void nr__loop_run(nr_loop_t *l);

/* stall.c: a loop with a stall_threshold is watched from its start (after
 * on_start) until it terminates (before on_exit); loop thread. */
void nr__watch_add(nr_loop_t *l);
void nr__watch_remove(nr_loop_t *l);
/* One sample of a simulated loop at `now`, on its own (the world's)
 * thread: runtime/sim/ calls it while a run spins on the virtual clock. */
void nr__watch_check(nr_loop_t *l, uint64_t now);

/* channel.c */
void nr__channels_close_all(nr_loop_t *l);
void nr__channels_abort_all(nr_loop_t *l);


/* log.c */
void nr__log_set_thread_name(const char *name);

/* promises: main-thread and loop listeners */
nr_promise_t *nr__promise_failed(int code, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

static inline bool nr__in_loop(const nr_loop_t *l) {
  return nr_loop_current() == l;
}

#endif /* NR_INTERNAL_H */
