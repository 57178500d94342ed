/*
 * http_server.c -- the HTTP/1.1 server codec of http.h as a pipeline
 * handler: it feeds what it reads to the parser (http_parse.c), delivers
 * the requests, and encodes the responses written to it (http_encode.c),
 * in request order. Loop thread only.
 *
 * Answering. Responses go out in request order (RFC 9112 9.3.2): the
 * handler keeps a ring of what it must remember about each delivered,
 * unanswered request (HEAD, HTTP/1.0, "close the connection after it") and
 * the state of its answer. A response written while a request is being
 * handled (its channel_read, through handlers that pass it on: the
 * pipeline's reading token, nr_ctx_reading) answers that request; one
 * written later answers the oldest request still owed one (what a handler
 * that answers in order expects). An answer for a request behind one
 * still owed is encoded at once but held (http_hold.c) until the answers
 * before it are out, then written in order ("answering in order" below).
 * Once a request that ends the connection is delivered nothing more is
 * parsed. A protocol error waits for the responses still owed, then is
 * answered and the channel closed (after a half-close that lets the
 * client stop sending: close_after_error).
 *
 * Encoding. When the codec's writes go straight to the channel's head (no
 * handler between, no promise), a response is encoded in place at the end
 * of the outbound buffer (nr_ctx_write_reserve), so its bytes are written
 * once; a prepared response's usual answer is then one copy and the date.
 * Otherwise the status line and headers are built in a per-thread scratch
 * buffer (no allocation per response) and handed to the next handler as
 * one write. A body up to SMALL_BODY goes with the head; a larger one
 * follows as a second write (in place) or slice (of the same gathered
 * write).
 */
#include <assert.h>
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "codec/codec.h"
#include "codec/h2.h"
#include "codec/http.h"
#include "codec/http_encode.h"
#include "codec/http_hold.h"
#include "codec/http_parse.h"
#include "tls/tls.h"

/* ---- the handler ------------------------------------------------------------------------ */

#define RING NR_HTTP_HOLD_SLOTS
/* A ring slot's flags: its request's (HEAD, "close after it", HTTP/1.0),
 * F_FAILED (a handler raised on it), F_BODY (its streamed body is not all
 * read), and its answer's state: A_OWED (none begun), a streamed answer
 * open (A_CHUNKED, A_RAW for HTTP/1.0, A_DISCARD for a body nobody may
 * see), or A_DONE (whole, held behind an earlier one); F_ACLOSE: the
 * connection closes after that answer. */
enum { F_HEAD = 1, F_CLOSE = 2, F_HTTP10 = 4, F_FAILED = 8, F_BODY = 16,
       F_ACLOSE = 0x100 };
enum { A_OWED = 0, A_CHUNKED = 0x20, A_RAW = 0x40, A_DISCARD = 0x60,
       A_DONE = 0x80, A_MASK = 0xE0 };
/* A streamed body (body = "stream"): none; its head delivered, the body
 * waiting to be read; flowing; paused (its sink is full). */
enum { B_NONE, B_WAIT, B_FLOW, B_PAUSED };

/* What the connection waits for, as its timeouts see it: W_NONE for the
 * server (a request is being answered, or the codec holds input until the
 * client reads: no timeout runs), the client's first request (W_FRESH),
 * its next one (W_IDLE), the rest of a request head (W_HEAD), the next
 * bytes of a body (W_BODY). */
enum { W_NONE, W_FRESH, W_IDLE, W_HEAD, W_BODY, NWAITS };

typedef struct wait_list_s wait_list_t;
typedef struct profile_s profile_t;
typedef struct budget_s budget_t;

struct nr_http_server_s {
  nr_http_parser_t parser;
  nr_ctx_t *ctx;
  uint64_t delivered;         /* requests delivered: the last one's token */
  unsigned outstanding;       /* delivered, not yet answered */
  unsigned oldest;            /* ring index of the oldest of those */
  uint16_t flags[RING];
  int pending_error;          /* status to answer once nothing is owed */
  unsigned streams;           /* streamed answers open */
  unsigned to;                /* the slot the write in progress answers */
  size_t held_out;            /* answer bytes held (counted by the channel) */
  nr__http_hold_t *hold;      /* what they are, by slot (NULL: none yet) */
  bool closing;               /* answered the last request: read nothing */
  bool continue_owed;         /* a "100 Continue" waits for responses */
  bool overflow;              /* too many unanswered requests */
  nr_inbound_t in;            /* re-entrancy (reads, expiries), backpressure */
  bool started;               /* the first wait (W_FRESH) began */
  bool idle;                  /* nr_channel_set_idle said so (mark_idle) */
  uint8_t wait;               /* W_*: what the connection waits for */
  uint64_t timeout[3];        /* header, body, keep-alive (ns; 0: none) */
  profile_t *prof;            /* its loop's wait lists for those timeouts */
  wait_list_t *list;          /* the list it is in, or NULL */
  nr_http_server_t *prev, *next;   /* in that list */
  uint64_t since;             /* when it joined it (coarse_now) */
  nr_h2_server_t *h2;         /* the connection speaks HTTP/2 (h2.h) */
  bool tls;                   /* TLS was agreed under the codec */
  bool sniffed;               /* the start was checked for the preface */
  uint8_t nsniff;             /* preface bytes seen so far */
  nr_http_server_opts_t o;    /* (HTTP/2 limits and switch) */
  /* the body budget (below) */
  uint64_t budget_limit;      /* its loop's budget (0: none) */
  uint64_t conn_limit;        /* its own (0: none) */
  budget_t *budget;           /* its loop's (in its profile), from start() */
  uint64_t held;              /* body bytes it holds (admitted + delivered) */
  uint64_t admitted;          /* reserved for the body being read (0: none) */
  uint64_t *resv;             /* per unanswered request (ring), made at the
                                 first body */
  nr_http_server_t *bprev, *bnext;   /* in the budget's line */
  bool bwaiting;              /* in it */
  bool reads_held;            /* nr_channel_hold_reads: by the budget */
  bool budget_held;           /* (the budget's part) */
  /* streamed bodies (below) */
  bool stream_bodies;         /* the option */
  bool body_held;             /* reads held: a body waits or is paused */
  bool body_continue;         /* its client waits for "100 Continue" */
  uint8_t body;               /* B_*: the streamed body under way */
  int fail_status;            /* a failed request's answer (0: 500) */
  uint64_t body_token;        /* its request */
  nr_http_sink_t *sink;       /* a C consumer that claimed it, or NULL */
  nr_chwatch_t watch;         /* where the handlers write it: pause while
                                 it is unwritable */
  nr_codec_resume_t *body_resume;   /* a task parses on */
  bool halted;                /* given up inside a feed: stop it */
};

nr_http_server_t *nr_http_server_new(const nr_http_server_opts_t *o) {
  nr_http_server_t *s = calloc(1, sizeof *s);
  if (s == NULL)
    return NULL;
  nr_http_parser_init(&s->parser, o->max_header, o->max_body, o->max_headers);
  s->timeout[0] = o->header_timeout;
  s->timeout[1] = o->body_timeout;
  s->timeout[2] = o->keepalive_timeout;
  s->o = *o;
  s->sniffed = !o->h2;
  s->budget_limit = o->body_budget;
  s->conn_limit = o->conn_body_budget;
  s->stream_bodies = o->stream_bodies;
  s->parser.stream = o->stream_bodies;
  return s;
}

/* ---- timeouts ----
 *
 * No connection has a timer of its own. Connections that wait for their
 * clients are kept in FIFO lists, one per kind of wait and timeout value
 * on each loop (a profile: the lists of the loops' connections that share
 * header, body and keep-alive timeouts -- usually all of them). A
 * connection joins the tail of its list when its wait begins (watch), so
 * each list is in deadline order: it needs one loop timer, armed for its
 * head's deadline. When that fires, the heads whose deadline passed are
 * answered 408 (a head or body) or closed silently (an idle connection),
 * and the timer is armed again for the next head.
 *
 * Activity touches no timer: a connection that stops waiting (a request
 * delivered: W_NONE) stays in its list until it waits again -- when it
 * moves to the tail of a list -- or until its old deadline passes, when
 * the timer finds it waiting for something else and drops it. A timer
 * armed for a head that has since left merely fires early.
 *
 * So a pipelined keep-alive connection costs, per read: a byte store per
 * request (deliver), and when its answers are all written and nothing is
 * buffered, one read of the coarse clock (vDSO, no TSC) and a move to the
 * tail of the idle list (a few pointer stores). No allocation, no heap
 * operation: the loop's timer heap holds one timer per list, not one per
 * connection, and each fires about once per timeout while the list is
 * busy.
 *
 * A profile also holds its loop's body budget (below), for the codecs
 * configured with that budget value.
 *
 * Lifetime: a profile is counted by the connections using it, and by a
 * list timer while it runs (an expiry may free connections); the last
 * one cancels its timers (on the loop thread: they cannot fire
 * afterwards) and frees it. A connection leaves its list before it is
 * freed, and when its channel goes inactive. An expiry runs with the
 * connection's `in.depth` raised, as a read does, so a removal meanwhile
 * frees it only once the expiry is done with it. */

struct wait_list_s {
  nr_http_server_t *head, *tail;   /* oldest first: by deadline */
  uint64_t limit;             /* each waits this long (0: none) */
  nr_timer_t *timer;          /* armed while not empty, maybe early */
  profile_t *prof;
  uint8_t wait;               /* W_* of its members */
};

/* A loop's body budget (see "the body budget" below). */
struct budget_s {
  uint64_t limit, held;
  nr_http_server_t *head, *tail;   /* connections waiting for room, in order */
};

struct profile_s {
  nr_loop_t *loop;
  uint64_t timeout[3];        /* as nr_http_server_t's */
  unsigned refs;
  wait_list_t list[NWAITS];   /* by W_* (W_NONE's is unused) */
  budget_t budget;            /* its limit is part of the profile's key */
  profile_t *next;            /* the thread's profiles */
};

static _Thread_local profile_t *profiles;

/* The monotonic clock to within the kernel's tick (a few ms, and never
 * ahead of nr_now): cheap enough to read once per read burst. Timeouts
 * may so end up to one tick early. */
static uint64_t coarse_now(void) { return nr_now_coarse(); }

static profile_t *profile_get(nr_loop_t *loop, const uint64_t timeout[3],
                              uint64_t budget) {
  assert(nr_loop_in_thread(loop));
  profile_t *p;
  for (p = profiles; p != NULL; p = p->next)
    if (p->loop == loop && memcmp(p->timeout, timeout, sizeof p->timeout) == 0 &&
        p->budget.limit == budget)
      break;
  if (p == NULL && (p = calloc(1, sizeof *p)) != NULL) {
    p->loop = loop;
    memcpy(p->timeout, timeout, sizeof p->timeout);
    p->budget.limit = budget;
    static const int which[NWAITS] = {-1, 0, 2, 0, 1};  /* W_* -> timeout */
    for (int w = W_FRESH; w < NWAITS; w++)
      p->list[w] = (wait_list_t){.limit = timeout[which[w]], .prof = p,
                                 .wait = (uint8_t)w};
    p->next = profiles;
    profiles = p;
  }
  if (p != NULL)
    p->refs++;
  return p;
}

static void profile_put(profile_t *p) {
  if (--p->refs > 0)
    return;
  assert(p->budget.head == NULL && p->budget.held == 0);
  for (int w = W_FRESH; w < NWAITS; w++) {
    assert(p->list[w].head == NULL);
    if (p->list[w].timer != NULL) {
      nr_timer_cancel(p->list[w].timer);
      nr_timer_release(p->list[w].timer);
    }
  }
  profile_t **pp = &profiles;
  while (*pp != p)
    pp = &(*pp)->next;
  *pp = p->next;
  free(p);
}

static void unlist(nr_http_server_t *s) {
  wait_list_t *l = s->list;
  if (l == NULL)
    return;
  *(s->prev ? &s->prev->next : &l->head) = s->next;
  *(s->next ? &s->next->prev : &l->tail) = s->prev;
  s->list = NULL;
}

static int on_list_timer(void *arg);

static void arm(wait_list_t *l, uint64_t delay) {
  l->timer = nr_loop_schedule(l->prof->loop, delay, 0, on_list_timer, NULL, l);
}

/* Waiting for the client's next request, or in its head, after a first
 * one (the first one's head is the fresh mark's: nr_channel_established),
 * the connection owes nothing and may be shed when the server runs out of
 * descriptors. Told the channel at each change of s->wait. */
static inline void mark_idle(nr_http_server_t *s) {
  bool idle = s->delivered > 0 && (s->wait == W_IDLE || s->wait == W_HEAD);
  if (__builtin_expect(idle != s->idle, 0)) {
    s->idle = idle;
    nr_channel_set_idle(nr_ctx_channel(s->ctx), idle);
  }
}

/* The connection begins to wait for its client (w): it joins the tail of
 * its list, which then needs a timer if it has none. */
static void watch(nr_http_server_t *s, int w) {
  s->wait = (uint8_t)w;
  mark_idle(s);
  if (s->prof == NULL)
    return;                    /* no timeouts, or no loop */
  wait_list_t *l = &s->prof->list[w];
  unlist(s);
  if (l->limit == 0)
    return;
  s->since = coarse_now();
  s->prev = l->tail;
  s->next = NULL;
  *(l->tail ? &l->tail->next : &l->head) = s;
  l->tail = s;
  s->list = l;
  if (l->timer == NULL) {      /* (its head is s, or older during an expiry) */
    uint64_t end = l->head->since + l->limit;
    arm(l, end > s->since ? end - s->since : 0);
  }
}

/* What the connection waits for now that the server owes nothing more or
 * a read has been parsed: the rest of a request, or the next one. A head
 * is timed from its first byte (however slowly the rest drips in), a body
 * from its last read, an idle time from its start. */
static void settle_h2(nr_http_server_t *s) {
  int w = nr_h2_server_waiting(s->h2);
  if (s->closing || w == NR_H2_OWED)
    s->wait = W_NONE;
  else if (w == NR_H2_ARRIVING)
    watch(s, W_BODY);          /* timed between reads */
  else if (s->wait != W_IDLE)
    watch(s, W_IDLE);
}

static NOINLINE void settle(nr_http_server_t *s) {
  if (s->h2 != NULL) {
    settle_h2(s);
    return;
  }
  if (s->body == B_FLOW && !s->closing && !s->reads_held && !s->in.held) {
    watch(s, W_BODY);          /* the client's turn, timed between reads,
                                  whatever is owed */
  } else if (s->closing || s->outstanding > 0 || s->in.held ||
             s->pending_error || s->reads_held) {
    s->wait = W_NONE;
    mark_idle(s);
  } else if (nr_buf_len(&s->parser.in) == 0) {
    if (s->wait != W_IDLE && s->wait != W_FRESH)
      watch(s, W_IDLE);
  } else if (nr__http_parsing_head(&s->parser)) {
    if (s->wait != W_HEAD)
      watch(s, W_HEAD);
  } else {
    if (s->delivered == 0)     /* a whole head came: its upload is not */
      nr_channel_established(nr_ctx_channel(s->ctx));   /* shed */
    watch(s, W_BODY);
  }
}

static void send_error(nr_http_server_t *s, int status);
static void server_free(nr_http_server_t *s);
static void drop_held(nr_http_server_t *s);

/* ---- the body budget ----
 *
 * Request bodies are held whole -- in the parser while they arrive, then
 * by their request until it is answered -- so what a loop's connections
 * hold is counted in bytes. Each body is reserved from its loop's budget
 * (one per loop and budget value: in the profile, shared by the
 * connections of the codecs configured alike) and from its connection's
 * own, from its head on --
 * its Content-Length, or max_body when it is chunked (the excess is given
 * back once it is whole) -- until its answer has been written or the
 * connection closes. A body that does not fit holds its connection's reads
 * (nr_channel_hold_reads, which the application's auto_read cannot undo)
 * until answers free room: its own connection's answers for its own
 * budget, any connection's for the loop's, given to the waiting
 * connections in the order they began to wait (so a big body is not
 * starved by small ones). A connection between requests that holds
 * bodies reads nothing either while a budget is spent; one that holds
 * none reads on (a request without a body goes through, whatever the
 * others wait for). A body is always admitted when its connection, or the
 * loop, holds nothing else: one bigger than a budget passes, alone. A
 * connection that waits is not timed (the wait is the server's).
 *
 * So the bodies a loop holds stay within its budget (or one max_body),
 * plus, per connection, one read (64 KiB): the read that brought a head
 * whose body had to wait, or bodies that came whole in one read (counted
 * as they are delivered).
 */
static void bline_remove(nr_http_server_t *s) {
  if (!s->bwaiting)
    return;
  budget_t *b = s->budget;
  *(s->bprev ? &s->bprev->bnext : &b->head) = s->bnext;
  *(s->bnext ? &s->bnext->bprev : &b->tail) = s->bprev;
  s->bprev = s->bnext = NULL;
  s->bwaiting = false;
}

static void bline_push(nr_http_server_t *s) {
  if (s->bwaiting)
    return;
  budget_t *b = s->budget;
  s->bprev = b->tail;
  s->bnext = NULL;
  *(b->tail ? &b->tail->bnext : &b->head) = s;
  b->tail = s;
  s->bwaiting = true;
}

/* The channel's reads as the budget and a streamed body want them: held
 * while either holds them. */
static void apply_holds(nr_http_server_t *s) {
  bool held = s->budget_held || s->body_held;
  if (s->reads_held == held)
    return;
  s->reads_held = held;
  nr_channel_hold_reads(nr_ctx_channel(s->ctx), held);
  if (!held && !nr_inbound_busy(&s->in))
    settle(s);                 /* its timeouts run again */
}

/* Reads held while there is no room, or going on. */
static void hold_reads(nr_http_server_t *s, bool held) {
  s->budget_held = held;
  apply_holds(s);
}

/* Is there room for a body of n bytes (n == 0: for reading on between
 * requests)? *loop_full says whether the loop's budget (or bodies waiting
 * before s) is what stops it, rather than the connection's own. A
 * connection that holds nothing reads on between requests whatever the
 * loop holds: its next read adds at most that read (and a request
 * without a body, which may be what frees the others, gets through). */
static bool room(const nr_http_server_t *s, uint64_t n, bool *loop_full) {
  const budget_t *b = s->budget;
  *loop_full = false;
  if (n == 0 && s->held == 0)
    return true;
  if (s->conn_limit != 0 && s->held != 0 &&
      (n == 0 ? s->held >= s->conn_limit : s->held + n > s->conn_limit))
    return false;
  if (n == 0 ? b->held >= b->limit
             : (b->head != NULL && b->head != s) ||
                   (b->held != 0 && b->held + n > b->limit)) {
    *loop_full = true;
    return false;
  }
  return true;
}

static void take(nr_http_server_t *s, uint64_t n) {
  s->held += n;
  s->budget->held += n;
}

static bool gate(nr_http_server_t *s);

/* Room freed on the loop: the connections waiting for it, in order, as
 * long as each gets its room. One inside its own read is left to that
 * read's end, which gates it (and those after it). */
static void budget_wake(budget_t *b) {
  nr_http_server_t *w;
  while ((w = b->head) != NULL && !nr_inbound_busy(&w->in)) {
    gate(w);
    if (b->head == w)
      break;                   /* still first: no room for it yet */
  }
}

static void give(nr_http_server_t *s, uint64_t n) {
  s->held -= n;
  s->budget->held -= n;
  if (s->budget_held && !s->bwaiting && !nr_inbound_busy(&s->in))
    gate(s);                   /* it waited for its own answers */
  budget_wake(s->budget);
}

/* After a read was parsed (or room freed): admit the body being read, or
 * hold the reads until there is room; true when reads go on. */
static bool gate(nr_http_server_t *s) {
  if (s->closing) {            /* (it leaves the line, and lets others on) */
    bline_remove(s);
    return true;
  }
  bool loop_full, ok = true;
  uint64_t need = s->admitted ? 0 : nr__http_body_bound(&s->parser);
  if (need > 0) {              /* a body begins: its reservation */
    if ((ok = room(s, need, &loop_full))) {
      take(s, need);
      s->admitted = need;
      nr__http_reserve_body(&s->parser);   /* (no memory: it grows as before) */
    }
  } else if (s->admitted == 0) {
    ok = room(s, 0, &loop_full);   /* between requests, or in a head */
  }
  if (ok) {
    bline_remove(s);
  } else if (loop_full) {
    bline_push(s);
  } else {
    bline_remove(s);           /* its own answers will free its room */
  }
  hold_reads(s, !ok);
  return ok;
}

/* Nothing for gate to do after a read: the connection holds no body,
 * none is being read (a body in progress keeps bytes in the parser), its
 * reads go on, and nobody waits (the usual, checked inline). */
static inline bool budget_idle(const nr_http_server_t *s) {
  return (s->held | s->admitted) == 0 && !s->budget_held &&
         nr_buf_len(&s->parser.in) == 0 && s->budget->head == NULL;
}

/* A request with a body was delivered into ring slot i: what it holds is
 * its body's length from now until its answer (the reservation made at
 * its head, adjusted; or taken now, when it came whole in one read). */
static NOINLINE void budget_delivered(nr_http_server_t *s, unsigned i,
                                      size_t len) {
  if (s->resv == NULL && (s->resv = calloc(RING, sizeof *s->resv)) == NULL) {
    if (s->admitted)           /* (no memory: this one goes uncounted) */
      give(s, s->admitted);
    s->admitted = 0;
    return;
  }
  if (s->admitted > len) {
    s->held -= s->admitted - len;       /* (give's waking comes at the */
    s->budget->held -= s->admitted - len;   /* read's end: gate) */
  } else if (len > s->admitted) {
    take(s, len - s->admitted);
  }
  s->admitted = 0;
  s->resv[i] = len;
}

/* Its answer was written: the body's room is free. */
static NOINLINE void budget_answered(nr_http_server_t *s) {
  uint64_t n = s->resv[s->oldest];
  s->resv[s->oldest] = 0;
  give(s, n);
}

/* The connection ends (or the codec leaves it): all it holds is free. */
static void budget_leave(nr_http_server_t *s) {
  if (s->budget == NULL)
    return;
  bline_remove(s);
  if (s->resv != NULL)
    memset(s->resv, 0, RING * sizeof *s->resv);
  s->admitted = 0;
  if (s->held > 0) {
    s->budget->held -= s->held;
    s->held = 0;
    budget_wake(s->budget);
  }
}

/* The wait ran out: a request half sent gets 408, an idle connection is
 * closed silently (nginx does both). */
static void fail_body(nr_http_server_t *s, int status, const char *why);

static void expire(nr_http_server_t *s) {
  nr_inbound_enter_quiet(&s->in);
  if (s->h2 != NULL) {
    nr_h2_server_expire(s->h2);   /* GOAWAY, then the close */
  } else if (s->body != B_NONE) {
    fail_body(s, 408, "http_server: the request body timed out "
              "(body_timeout)");
  } else if (s->wait == W_HEAD || s->wait == W_BODY) {
    send_error(s, 408);
  } else {
    s->closing = true;
    nr_ctx_close(s->ctx, NULL);
  }
  if (nr_inbound_leave(&s->in))
    server_free(s);
}

/* A list's timer: expire the heads whose deadline passed (dropping those
 * that wait for something else now), then arm for the next one. */
static int on_list_timer(void *arg) {
  wait_list_t *l = arg;
  profile_t *p = l->prof;
  nr_timer_release(l->timer);  /* this one: the loop holds its own */
  l->timer = NULL;
  p->refs++;                   /* an expiry may free the last connection */
  uint64_t now = nr_now();
  nr_http_server_t *s;
  while ((s = l->head) != NULL && s->since + l->limit <= now) {
    unlist(s);
    if (s->wait == l->wait && !s->closing && !nr_inbound_busy(&s->in) &&
        nr_channel_is_open(nr_ctx_channel(s->ctx)))
      expire(s);
  }
  if (l->head != NULL && l->timer == NULL)
    arm(l, l->head->since + l->limit - now);
  profile_put(p);
  return 0;
}

/* The first wait, for the first request: from when the channel is
 * active, on its loop's lists. */
static void start(nr_http_server_t *s) {
  nr_channel_t *ch = nr_ctx_channel(s->ctx);
  if (s->started || !nr_channel_is_active(ch))
    return;
  s->started = true;
  nr_loop_t *loop = nr_channel_loop(ch);
  if (loop != NULL &&
      (s->timeout[0] | s->timeout[1] | s->timeout[2] | s->budget_limit) != 0)
    s->prof = profile_get(loop, s->timeout, s->budget_limit);
  if (s->prof != NULL && s->budget_limit != 0)
    s->budget = &s->prof->budget;
  watch(s, W_FRESH);
}

static void server_free(nr_http_server_t *s) {
  nr_channel_unwatch(&s->watch);
  nr_codec_resume_cancel(s->body_resume);
  nr_h2_server_free(s->h2);
  unlist(s);
  budget_leave(s);
  if (s->prof != NULL)
    profile_put(s->prof);
  free(s->resv);
  nr__http_hold_free(s->hold);   /* (dropped with the channel's count first) */
  nr_inbound_free(&s->in);
  nr_http_parser_free(&s->parser);
  free(s);
}

void nr_http_server_added(nr_ctx_t *ctx) {
  nr_http_server_t *s = nr_ctx_state(ctx);
  s->ctx = ctx;
  /* A head dripping in a byte at a time does not make a connection
   * established: its first whole request head does (settle, deliver).
   * Until then it is among the first closed when the descriptors run
   * out (bootstrap.c). */
  nr_channel_fresh_until_message(nr_ctx_channel(ctx));
  start(s);
}

static void body_gone(nr_http_server_t *s, const char *why);

void nr_http_server_removed(nr_ctx_t *ctx) {
  nr_http_server_t *s = nr_ctx_state(ctx);
  if (s->body != B_NONE)
    body_gone(s, "http_server: the codec left the pipeline in the middle "
              "of a request body");
  if (s->outstanding > 0)     /* nobody will answer them through us */
    nr_channel_unhold(nr_ctx_channel(ctx));
  drop_held(s);
  budget_leave(s);            /* (an upgrade: the next protocol reads on) */
  if (s->idle) {
    s->idle = false;
    nr_channel_set_idle(nr_ctx_channel(ctx), false);
  }
  if (s->reads_held) {
    s->reads_held = s->budget_held = s->body_held = false;
    nr_channel_hold_reads(nr_ctx_channel(ctx), false);
  }
  if (nr_inbound_removed(&s->in, ctx))
    server_free(s);
}

int nr_http_server_active(nr_ctx_t *ctx) {
  start(nr_ctx_state(ctx));
  nr_ctx_fire_active(ctx);
  return 0;
}

int nr_http_server_inactive(nr_ctx_t *ctx) {
  nr_http_server_t *s = nr_ctx_state(ctx);
  if (s->body != B_NONE)
    body_gone(s, "http_server: the connection closed in the middle of a "
              "request body");
  s->closing = true;          /* nothing more to read, nothing to time */
  s->wait = W_NONE;
  unlist(s);
  budget_leave(s);
  drop_held(s);
  nr_ctx_fire_inactive(ctx);
  return 0;
}

static int emit(nr_http_server_t *s, unsigned i, void *msg, nr_promise_t *p);

/* The encoded answer for slot i, and the body after it: on to the next
 * handler, or held. */
static int write_out(nr_http_server_t *s, unsigned i, out_t *o,
                     const char *body, size_t blen, nr_promise_t *p) {
  int rc;
  if (o->direct) {            /* in place: a body too big to copy follows */
    nr_ctx_write_commit(s->ctx, o->len);
    if (blen == 0)
      return 0;
    nr_bytes_t b = NR_BYTES(body, blen);
    return emit(s, i, &b, p);
  }
  if (o->failed) {
    rc = nr_raise(-ENOMEM, "http_server: out of memory encoding a response");
  } else if (blen == 0) {
    nr_bytes_t b = NR_BYTES(o->p, o->len);
    rc = emit(s, i, &b, p);
  } else {
    nr_slice_t v[2] = {{o->p, o->len}, {body, blen}};
    nr_slices_t sl = {NR_MSG_SLICES, v, 2};
    rc = emit(s, i, &sl, p);
  }
  nr__http_out_done(o);
  return rc;
}

/* How long a connection that got an error response may go on sending
 * before it is closed anyway. */
#define ERROR_LINGER NR_SEC(2)

static int linger_done(void *arg) {
  nr_channel_close(arg, NULL);
  nr_channel_release(arg);
  return 0;
}

static int linger_cancelled(void *arg) {
  nr_channel_release(arg);
  return 0;
}

/* The error response left (the write's promise succeeded): half-close;
 * or it cannot: close. */
static void error_sent(nr_promise_t *p, void *arg) {
  nr_channel_t *ch = arg;
  if (!nr_promise_is_success(p) ||
      (nr_channel_is_open(ch) && nr_channel_shutdown_output(ch) != 0))
    nr_channel_close(ch, NULL);
  nr_channel_release(ch);
}

/* Closing a socket with unread input makes the kernel send a reset, which
 * can destroy the error response before the client reads it (a client
 * still uploading a body it was refused). So once the response has left
 * -- at once, or when the socket takes the rest of it (p, the write's
 * promise) -- half-close instead: the client sees the response and EOF,
 * and closes; its EOF closes the channel (what is still read meanwhile is
 * discarded). ERROR_LINGER after the error the channel closes anyway,
 * whether the response left or not (a client that reads nothing). Takes
 * p. */
static void close_after_error(nr_http_server_t *s, nr_promise_t *p) {
  nr_channel_t *ch = nr_ctx_channel(s->ctx);
  nr_timer_t *t = p == NULL ? NULL
                  : nr_loop_schedule(nr_channel_loop(ch), ERROR_LINGER, 0,
                                     linger_done, linger_cancelled,
                                     nr_channel_retain(ch));
  if (t == NULL) {
    if (p != NULL)
      nr_channel_release(ch);          /* the timer's reference */
    nr_ctx_close(s->ctx, NULL);
  } else {
    nr_timer_release(t);
    if (nr_promise_add_listener(p, NULL, error_sent, nr_channel_retain(ch)) < 0)
      nr_channel_release(ch);          /* the timer closes it */
  }
  if (p != NULL)
    nr_promise_release(p);
}

/* An answer of the codec's own for slot i: status, its reason as the
 * plain-text body (none to HEAD); p (or NULL) learns when it has left. */
static void write_status(nr_http_server_t *s, unsigned i, int status,
                         bool close, bool head, nr_promise_t *p) {
  out_t o;
  nr__http_out_init(&o);
  const char *reason = nr_http_reason(status);
  nr_http_count_status(status);
  char *w = out_reserve(&o, status_room(NULL));
  if (w != NULL)
    o.len = (size_t)(nr__http_put_status(w, status, NULL, 0) - o.p);
  OUT_LIT(&o, "Content-Type: text/plain\r\nContent-Length: ");
  nr__http_out_uint(&o, strlen(reason) + 1, 10);
  if (close)
    OUT_LIT(&o, "\r\nConnection: close");
  OUT_LIT(&o, "\r\n\r\n");
  if (!head) {
    nr__http_out_str(&o, reason);
    OUT_LIT(&o, "\n");
  }
  write_out(s, i, &o, NULL, 0, p);
}

static void send_error(nr_http_server_t *s, int status) {
  s->closing = true;
  nr_promise_t *p = nr_promise_new();
  write_status(s, s->oldest, status, true, false, p);   /* (none owed) */
  nr_ctx_flush(s->ctx);
  close_after_error(s, p);
}

/* "100 Continue" for the request whose body is awaited. */
static void send_continue(nr_http_server_t *s) {
  static const char cont[] = "HTTP/1.1 100 Continue\r\n\r\n";
  nr_bytes_t b = NR_BYTES(cont, sizeof cont - 1);
  s->continue_owed = false;
  nr_ctx_write(s->ctx, &b, NULL);
  nr_ctx_flush(s->ctx);
}

/* ---- answering in order ----
 *
 * Each delivered request's ring slot says how far its answer has got
 * (A_*). A response goes to the request being handled now -- the
 * pipeline's reading token (nr_ctx_reading: set while the request is
 * fired, and by the Lua read batch while its channel_read runs), when no
 * answer of its own has begun -- else to the oldest request still owed
 * one (target); a chunk to the streamed answer of the request being
 * handled, else to the oldest one open (stream_slot). What is written for
 * the oldest request goes on at once (the usual case, and the only one
 * without pipelining); what is written for a later one is held, in write
 * order, with its promises (emit, http_hold.c), and counted toward the
 * channel's water marks (nr_channel_hold_bytes), so that a channel
 * holding answers past write_buffer_high turns unwritable: the codec
 * parses no further request (deliver: nr_inbound_hold), reads nothing,
 * and handlers that watch writability stop producing. When the oldest
 * answer is whole (finish_response), the held answers behind it are sent
 * in order (release), up to one not yet whole (an open stream then goes
 * straight on) or still owed. A close after an answer drops what is held
 * behind it (drop_held), failing the promises of its writes: those
 * requests were never to be answered.
 *
 * A handler that raises on a request (read_failed) gets a 500 written
 * for that very request, held behind earlier answers like any other; one
 * whose streamed answer had begun cannot end well: the connection closes
 * when that answer's turn comes. */

/* Whether what is written for slot i now must wait: i is behind the
 * oldest request owed, or bytes held for i go first (a write made from
 * the events of their sending). */
static inline bool holds(const nr_http_server_t *s, unsigned i) {
  return i != s->oldest || nr__http_hold_has(s->hold, i);
}

/* The slot of request `token` while it is owed an answer, else RING. */
static inline unsigned slot_owed(const nr_http_server_t *s, uint64_t token) {
  uint64_t k = token - (s->delivered - s->outstanding + 1);
  return token != 0 && k < s->outstanding ? (s->oldest + (unsigned)k) % RING
                                          : RING;
}

static inline bool streaming(uint16_t f) {
  unsigned a = f & A_MASK;
  return a != A_OWED && a != A_DONE;
}

/* The slot a response written now answers (see above), RING when none
 * may be answered; *open_own: the request being handled has a streamed
 * answer open (a response written over it is a mistake). */
static unsigned target(const nr_http_server_t *s, uint64_t token,
                       bool *open_own) {
  unsigned i = slot_owed(s, token);
  *open_own = i != RING && streaming(s->flags[i]);
  if (i != RING && (s->flags[i] & A_MASK) == A_OWED)
    return i;
  for (unsigned k = 0; k < s->outstanding; k++) {
    i = (s->oldest + k) % RING;
    if ((s->flags[i] & A_MASK) == A_OWED)
      return i;
  }
  return RING;
}

/* The slot of the streamed answer a chunk written now belongs to
 * (s->streams > 0). */
static unsigned stream_slot(const nr_http_server_t *s, uint64_t token) {
  unsigned i = slot_owed(s, token);
  if (i != RING && streaming(s->flags[i]))
    return i;
  for (unsigned k = 0; k < s->outstanding; k++) {
    i = (s->oldest + k) % RING;
    if (streaming(s->flags[i]))
      return i;
  }
  return s->oldest;            /* (not reached while streams > 0) */
}

/* Bytes of slot i's answer: on to the next handler, or held. */
static int emit(nr_http_server_t *s, unsigned i, void *msg, nr_promise_t *p) {
  if (!holds(s, i))
    return nr_ctx_write(s->ctx, msg, p);
  ptrdiff_t n = nr__http_hold_add(&s->hold, i, msg, p);
  if (n < 0)
    return nr_raise((int)n, n == -ENOMEM ? "http_server: out of memory "
                    "holding an answer" : "http_server: a file region ended "
                    "early, or could not be read");
  s->held_out += (size_t)n;
  nr_channel_hold_bytes(nr_ctx_channel(s->ctx), n);
  return 0;
}

/* Room to encode slot i's answer in: in place when it goes on at once. */
static inline char *begin(nr_http_server_t *s, unsigned i, out_t *o,
                          size_t need, nr_promise_t *p) {
  if (!holds(s, i))
    return out_start(o, s->ctx, need, p);
  nr__http_out_init(o);
  return out_reserve(o, need);
}

/* Everything held is dropped (a close): never to be sent. */
static void drop_held(nr_http_server_t *s) {
  nr__http_hold_t *h = s->hold;
  if (h == NULL)
    return;
  s->hold = NULL;              /* (failed promises' listeners may write) */
  size_t n = nr__http_hold_free(h);
  s->held_out -= n;
  nr_channel_hold_bytes(nr_ctx_channel(s->ctx), -(ptrdiff_t)n);
}

static inline void finish_response(nr_http_server_t *s, bool close);

/* Slot i's answer is whole: its request is forgotten when it is the
 * oldest, else its answer waits, whole, for its turn. */
static inline void answered(nr_http_server_t *s, unsigned i, bool close) {
  if (!holds(s, i))
    finish_response(s, close);
  else
    s->flags[i] = (uint16_t)((s->flags[i] & ~A_MASK) | A_DONE |
                             (close ? F_ACLOSE : 0));
}

/* A handler raised on the request in slot i (or its body failed:
 * fail_status), whose answer has not begun: a 500 (or that status)
 * answers it, in its turn. */
static void answer_failed(nr_http_server_t *s, unsigned i) {
  uint16_t f = s->flags[i];
  int status = s->fail_status ? s->fail_status : 500;
  bool close = (f & (F_CLOSE | F_HTTP10 | F_BODY)) != 0 ||  /* 1.0: no */
               s->fail_status != 0;              /* keep-alive header */
  s->fail_status = 0;
  write_status(s, i, status, close, f & F_HEAD, NULL);
  if (!holds(s, i))
    nr_ctx_flush(s->ctx);
  answered(s, i, close);
}

/* An answer begun cannot end well: close (what is held is dropped). */
static void abort_answer(nr_http_server_t *s) {
  s->closing = true;
  drop_held(s);
  nr_ctx_close(s->ctx, NULL);
}

static void stop_body(nr_http_server_t *s);

/* nr_handler_t.read_failed: the handlers raised on request `token`. */
void nr_http_server_read_failed(nr_ctx_t *ctx, uint64_t token) {
  nr_http_server_t *s = nr_ctx_state(ctx);
  if (s->h2 != NULL) {
    nr_h2_server_read_failed(s->h2, token);
    return;
  }
  unsigned i = slot_owed(s, token);
  if (i == RING || s->closing || (s->flags[i] & A_MASK) == A_DONE)
    return;                   /* answered already (exception_caught did) */
  if (s->body != B_NONE && token == s->body_token)
    stop_body(s);             /* its body goes nowhere now */
  if ((s->flags[i] & A_MASK) == A_OWED)
    answer_failed(s, i);
  else if (holds(s, i))
    s->flags[i] |= F_FAILED;  /* its stream is held: closed in its turn */
  else
    abort_answer(s);
}

static NOINLINE void finished(nr_http_server_t *s, bool close);

/* The oldest request's answer is out: forget it. True when more are
 * owed. */
static inline bool forget_oldest(nr_http_server_t *s) {
  if (s->resv != NULL && s->resv[s->oldest] != 0)
    budget_answered(s);
  s->oldest = (s->oldest + 1) % RING;
  if (--s->outstanding > 0)
    return true;
  nr_channel_unhold(nr_ctx_channel(s->ctx));  /* (a close it brings waits
                                                  for our return) */
  return false;
}

static inline void finish_response(nr_http_server_t *s, bool close) {
  if (forget_oldest(s) && !close &&
      !(s->flags[s->oldest] & (F_FAILED | A_MASK)))
    return;                    /* the usual when pipelined: more are owed */
  finished(s, close);
}

/* The oldest request owed has (part of) its answer held: send it, and
 * the whole answers after it, up to one still owed or open (which goes
 * on straight from now). 1: the connection closes after the last one
 * sent; 0: go on; -1: the codec went away or closed meanwhile. */
static NOINLINE int release(nr_http_server_t *s) {
  nr_channel_t *ch = nr_ctx_channel(s->ctx);
  int rc = 0;
  nr_inbound_enter_quiet(&s->in);      /* a write's events may remove us */
  while (rc == 0 && s->outstanding > 0) {
    unsigned i = s->oldest;
    while (nr__http_hold_has(s->hold, i) && !s->in.removed) {
      size_t n;
      nr__http_hold_pop(s->hold, i, s->ctx, &n);
      s->held_out -= n;
      nr_channel_hold_bytes(ch, -(ptrdiff_t)n);
    }
    uint16_t f = s->flags[i];
    if (s->in.removed || s->closing || !nr_channel_is_open(ch)) {
      rc = -1;
    } else if ((f & A_MASK) != A_DONE) {  /* owed, or streaming on */
      if (streaming(f) && (f & F_FAILED))
        abort_answer(s);
      break;
    } else {                            /* whole: forgotten */
      forget_oldest(s);
      if (f & F_ACLOSE)
        rc = 1;
    }
  }
  if (!s->in.removed)
    nr_ctx_flush(s->ctx);
  if (s->held_out == 0 && nr__http_hold_empty(s->hold)) {
    nr__http_hold_free(s->hold);        /* (1 KiB a connection otherwise) */
    s->hold = NULL;
  }
  if (nr_inbound_leave(&s->in)) {
    server_free(s);
    return -1;
  }
  return rc;
}

/* The request just answered asked for the close (Connection: close, or
 * HTTP/1.0 without keep-alive), was read whole, and nothing came after
 * it: a client that asks to close sends no further request (RFC 9112
 * 9.6), so there is nothing in flight for a lingering close to wait for
 * (nginx lingers only on unread or pipelined input too). Bytes already
 * in the socket still make the close linger (start_linger's FIONREAD). */
static bool client_closes(const nr_http_server_t *s) {
  uint16_t f = s->flags[(s->oldest + RING - 1) % RING];
  return (f & F_CLOSE) && s->outstanding == 0 &&
         nr__http_parsing_head(&s->parser) && nr_buf_len(&s->parser.in) == 0;
}

/* What finish_response does besides forgetting the request. */
static NOINLINE void finished(nr_http_server_t *s, bool close) {
  if (!close && s->outstanding > 0 &&
      (s->flags[s->oldest] & (F_FAILED | A_MASK))) {
    int rc = release(s);       /* its turn came */
    if (rc < 0)
      return;
    close = rc;
  }
  if (close && s->body != B_NONE && s->body_token <= s->delivered - s->outstanding)
    stop_body(s);              /* answered before its body was all read */
  if (close) {
    s->closing = true;
    drop_held(s);              /* answers to requests after the close */
    /* a client may pipeline past the request that closes: what it sends
     * meanwhile must not turn our close into a reset that destroys the
     * answers it has not read yet -- unless the client closes itself */
    if (!client_closes(s))
      nr_channel_linger(nr_ctx_channel(s->ctx));
    nr_ctx_flush(s->ctx);
    nr_ctx_close(s->ctx, NULL);
  } else if (s->outstanding > 0) {
    return;                    /* an answer is owed, or streaming */
  } else if (s->pending_error) {
    send_error(s, s->pending_error);
  } else if (s->continue_owed) {
    send_continue(s);
  } else if (!nr_inbound_busy(&s->in)) {
    settle(s);                 /* (inside a read, feed settles at its end) */
  }
}

static bool feed(nr_http_server_t *s, const char *data, size_t len);

/* ---- streamed bodies ----
 *
 * With body = "stream" (the parser's p->stream) a request with a body is
 * handed up as its head; its body stays unread -- the parser paused, the
 * channel's reads held -- until someone reads it: a handler's outbound
 * read (nr_http_server_read), a C sink's claim, or read_body. Then the
 * pieces flow, fired to the handlers (tokened as their request, so that a
 * handler raising on one is answered for) or given to the sink, and the
 * codec stops after a piece while where the body goes cannot take more:
 * the sink says so, or the channel the handlers write it to (read_body's
 * sink) is unwritable, or this channel is (a handler echoing the body to
 * a client that reads nothing). It goes on from a task, as a read would,
 * when that channel (its watch), the sink, or this channel says so. So a
 * body holds at most one read here, however long it is, and a client
 * waiting for "100 Continue" gets it only once its body is read.
 *
 * An answer to a request whose body has not all been read closes the
 * connection after it (F_BODY; the rest is not read: the close lingers
 * over it). A body cut short -- the client closed, sent bad framing or
 * more than max_body, or stopped sending for body_timeout -- ends its
 * sink with the reason (abort), or reaches exception_caught of the
 * handlers, and is answered (400, 413, 408) in its turn unless its answer
 * has begun, when the connection closes after it. */

/* The ring slot of request `token` while it is owed, or -1. */
static int slot_of(const nr_http_server_t *s, uint64_t token) {
  uint64_t oldest = s->delivered - s->outstanding + 1;
  if (token < oldest || token > s->delivered)
    return -1;
  return (int)((s->oldest + (unsigned)(token - oldest)) % RING);
}

static void body_hold(nr_http_server_t *s, bool held) {
  s->body_held = held;
  apply_holds(s);
}

/* The body is over (read whole, or given up): its watch ends and its
 * request is free to be answered keep-alive (when read whole). */
static void body_over(nr_http_server_t *s, bool whole) {
  int i = slot_of(s, s->body_token);
  if (whole && i >= 0)
    s->flags[i] &= (uint16_t)~F_BODY;
  s->body = B_NONE;
  s->sink = NULL;
  s->body_continue = false;
  nr_channel_unwatch(&s->watch);
  if (s->body_held)
    body_hold(s, false);
}

/* Nothing more is parsed (the body is given up): from inside a feed the
 * parser is told to stop (deliver_piece returns 1 on `closing`); outside
 * one its input goes now. Reads stay held: what the client sends now is
 * left to the close that follows the answer. */
static void halt_parser(nr_http_server_t *s) {
  if (!nr_inbound_busy(&s->in)) {
    nr_http_parser_free(&s->parser);
    s->parser.stopped = true;
  } else {
    s->halted = true;
  }
}

/* The body is given up quietly (its request was answered first, or the
 * handlers failed on it): a sink is told. */
static void stop_body(nr_http_server_t *s) {
  nr_http_sink_t *k = s->sink;
  body_over(s, false);
  halt_parser(s);
  body_hold(s, true);
  if (k != NULL)
    k->abort(k, "http_server: the request was answered before its body "
             "was read");
}

/* The body is cut short (the client closed, or the codec left): its sink
 * or the handlers hear why. */
static void body_gone(nr_http_server_t *s, const char *why) {
  nr_http_sink_t *k = s->sink;
  body_over(s, false);
  if (k != NULL) {
    k->abort(k, why);
  } else {
    nr_err_t err = {-ECONNRESET, why};
    nr_ctx_fire_exception(s->ctx, &err);
  }
}

/* The body went wrong (bad framing, over max_body, a timeout): given up,
 * told, and its request answered `status` in its turn -- or, if its
 * answer has begun, the connection closes after it. */
static void fail_body(nr_http_server_t *s, int status, const char *why) {
  nr_http_sink_t *k = s->sink;
  int i = slot_of(s, s->body_token);
  body_over(s, false);
  halt_parser(s);
  body_hold(s, true);
  if (k != NULL) {
    k->abort(k, why);
  } else {
    nr_err_t err = {status == 413 ? NR_ETOOLONG : -EBADMSG, why};
    nr_ctx_fire_exception(s->ctx, &err);
  }
  if (i < 0 || s->closing)
    return;                    /* answered already: it closes after */
  s->flags[i] |= F_CLOSE;
  if ((s->flags[i] & A_MASK) != A_OWED) {
    s->flags[i] |= F_ACLOSE;   /* its answer is under way (or held): then
                                  the close */
    return;
  }
  s->fail_status = status;
  if (nr_channel_is_open(nr_ctx_channel(s->ctx)))
    answer_failed(s, (unsigned)i);   /* (held behind earlier answers) */
}

/* A streamed head: fired, and its body waits to be read (the parser is
 * told to pause) unless a handler read it meanwhile. */
static int streamed_head(nr_http_server_t *s, nr_http_request_t *req) {
  nr_channel_t *ch = nr_ctx_channel(s->ctx);
  s->body = B_WAIT;
  s->body_token = req->token;
  s->body_continue = req->expect_continue;
  req->codec = s->ctx;
  req->body = NULL;
  nr_ctx_fire_read_tokened(s->ctx, req, req->token, true);
  if (s->in.removed || s->closing || !nr_channel_is_open(ch) ||
      s->body == B_NONE)
    return 1;                  /* (B_NONE: given up meanwhile) */
  if (s->body == B_WAIT) {
    body_hold(s, true);
    return NR_HTTP_PAUSE;      /* until it is read */
  }
  return nr_inbound_hold(&s->in, ch) ? NR_HTTP_PAUSE : 0;
}

/* Whether where the body goes can take more. */
static bool sink_full(const nr_http_server_t *s) {
  return s->watch.ch != NULL && nr_channel_is_open(s->watch.ch) &&
         !nr_channel_is_writable(s->watch.ch);
}

/* A piece of the body: to the sink, or to the handlers; then stop if
 * where it goes is full. */
static int deliver_piece(nr_http_server_t *s, const nr_http_request_t *req) {
  nr_channel_t *ch = nr_ctx_channel(s->ctx);
  nr_http_body_t b = {NR_MSG_HTTP_BODY, req->last, req->body, req->body_len,
                      req->trailers, req->ntrailers, s->body_token};
  nr_http_sink_t *k = s->sink;
  int i = slot_of(s, s->body_token);
  bool go = true, close = i >= 0 && (s->flags[i] & F_CLOSE);
  if (req->last)
    body_over(s, true);        /* (the request may be answered keep-alive) */
  if (k != NULL)
    go = k->piece(k, &b);
  else
    nr_ctx_fire_read_tokened(s->ctx, &b, b.token, false);
  if (s->in.removed || s->closing || s->halted || !nr_channel_is_open(ch))
    return 1;
  if (req->last)
    return close ? 1 : nr_inbound_hold(&s->in, ch) ? NR_HTTP_PAUSE : 0;
  if (s->body == B_NONE)
    return 1;                  /* given up meanwhile (drop_sink) */
  if (!go || sink_full(s)) {
    s->body = B_PAUSED;
    body_hold(s, true);
    return NR_HTTP_PAUSE;
  }
  return nr_inbound_hold(&s->in, ch) ? NR_HTTP_PAUSE : 0;
}

/* From the task body_go queued: parse what is held, as a read would. */
static void body_parse(void *state, nr_ctx_t *ctx) {
  nr_http_server_t *s = state;
  if (nr_inbound_busy(&s->in) || s->closing || s->body == B_PAUSED ||
      !nr_channel_is_open(nr_ctx_channel(ctx)))
    return;
  if (nr_buf_len(&s->parser.in) > 0 && feed(s, NULL, 0))
    nr_ctx_fire_read_complete(ctx);
}

/* The body may flow: first from its head's wait ("100 Continue" if the
 * client waits for it), or again after a pause. */
static void body_go(nr_http_server_t *s) {
  if (s->body == B_WAIT && s->body_continue) {
    s->body_continue = false;
    send_continue(s);
  }
  s->body = B_FLOW;
  body_hold(s, false);
  if (nr_buf_len(&s->parser.in) > 0)
    nr_codec_resume(s->ctx, s, &s->body_resume, body_parse);
  else if (!nr_inbound_busy(&s->in))
    settle(s);                 /* the client's turn: timed */
}

/* Where the body goes turned writable (or closed: the handlers' writes
 * fail there, and they hear it): on. */
static void sink_changed(nr_chwatch_t *w, nr_channel_t *ch) {
  nr_http_server_t *s = (nr_http_server_t *)((char *)w -
                                             offsetof(nr_http_server_t, watch));
  if (!nr_channel_is_open(ch))
    nr_channel_unwatch(w);
  if (s->body == B_PAUSED && !sink_full(s))
    body_go(s);
}

int nr_http_server_read(nr_ctx_t *ctx) {
  nr_http_server_t *s = nr_ctx_state(ctx);
  if (s->body == B_WAIT && s->sink == NULL)
    body_go(s);
  return nr_ctx_read(ctx);
}

int nr_http_server_claim_body(nr_ctx_t *ctx, uint64_t token, nr_http_sink_t *k) {
  nr_http_server_t *s = nr_ctx_state(ctx);
  if (s->body != B_WAIT || s->body_token != token || s->closing)
    return -ENOENT;
  s->sink = k;
  body_go(s);
  return 0;
}

void nr_http_server_drop_sink(nr_ctx_t *ctx, nr_http_sink_t *k) {
  nr_http_server_t *s = nr_ctx_state(ctx);
  if (s->sink != k || s->body == B_NONE)
    return;
  body_over(s, false);         /* (F_BODY stays: the answer closes) */
  halt_parser(s);
  body_hold(s, true);
}

void nr_http_server_resume_body(nr_ctx_t *ctx) {
  nr_http_server_t *s = nr_ctx_state(ctx);
  if (s->body == B_PAUSED)
    body_go(s);
}

int nr_http_server_read_body(nr_ctx_t *ctx, uint64_t token, nr_channel_t *sink) {
  nr_http_server_t *s = nr_ctx_state(ctx);
  if (s->body == B_NONE || s->body_token != token || s->sink != NULL ||
      s->closing)
    return -ENOENT;
  if (sink != NULL && sink != s->watch.ch) {
    nr_channel_unwatch(&s->watch);
    s->watch.fn = sink_changed;
    nr_channel_watch(sink, &s->watch);
  }
  if (s->body == B_WAIT)
    body_go(s);
  return 0;
}

static bool upgrade_h2c(nr_http_server_t *s, nr_http_request_t *req);

static int deliver(void *arg, int ev, nr_http_request_t *req) {
  nr_http_server_t *s = arg;
  nr_channel_t *ch = nr_ctx_channel(s->ctx);
  if (ev == NR_HTTP_EV_BODY)
    return deliver_piece(s, req);
  if (req->switches && ev == NR_HTTP_EV_REQUEST && s->o.h2 && !s->tls &&
      s->outstanding == 0 && upgrade_h2c(s, req))
    return NR_HTTP_SWITCHED;   /* the rest of the input is HTTP/2's */
  if (ev == NR_HTTP_EV_CONTINUE) {
    if (s->outstanding > 0)
      s->continue_owed = true;   /* after the responses owed before it */
    else
      send_continue(s);
    return !nr_channel_is_open(ch);
  }
  if (s->outstanding == RING) {
    s->overflow = true;
    return 1;
  }
  if (__builtin_expect(s->delivered == 0, 0))
    nr_channel_established(ch);
  uint8_t f = (req->head ? F_HEAD : 0) | (req->keep_alive ? 0 : F_CLOSE) |
              (req->minor == 0 ? F_HTTP10 : 0) | (req->streaming ? F_BODY : 0);
  unsigned slot = (s->oldest + s->outstanding) % RING;
  s->flags[slot] = f;
  if ((req->body_len | s->admitted) != 0 && s->budget != NULL)
    budget_delivered(s, slot, req->body_len);
  if (s->outstanding++ == 0)   /* a shutdown waits for the answers owed */
    nr_channel_hold(ch);
  s->wait = W_NONE;            /* the server's turn: no timeout runs */
  mark_idle(s);
  s->continue_owed = false;    /* it was for this request: its body came */
  /* Whether the handlers answer now or later, the next requests parse the
   * same, and a close stops them: they may take this one later -- unless
   * it may switch protocols, when what follows is theirs to read. */
  req->token = ++s->delivered;
  req->pipeline = nr_ctx_pipeline(s->ctx);
  if (req->streaming)
    return streamed_head(s, req);
  nr_ctx_fire_read_tokened(s->ctx, req, req->token, !req->switches);
  if (s->in.removed && req->switches && nr_channel_is_open(ch))
    return NR_HTTP_SWITCHED;   /* replaced by the new protocol's codec */
  if ((f & F_CLOSE) || s->in.removed || s->closing || !nr_channel_is_open(ch))
    return 1;
  if (nr_inbound_hold(&s->in, ch))
    return NR_HTTP_PAUSE;      /* the rest waits for the answers to drain */
  return 0;
}

/* A handler replaced the codec while it delivered an upgrade request
 * (a WebSocket, say): what the client sent after that request goes to the
 * codec that took its place, as Netty's decoders hand over their rest. */
static void handover(nr_http_server_t *s) {
  nr_buf_t *in = &s->parser.in;
  if (s->parser.stopped && nr_buf_len(in) > 0 &&
      nr_channel_is_open(nr_ctx_channel(s->ctx))) {
    nr_bytes_t b = NR_BYTES(nr_buf_peek(in), nr_buf_len(in));
    nr_ctx_fire_read(s->ctx, &b);
  }
}

/* Bytes for the HTTP/2 session (none: what it held); false if s was freed
 * meanwhile. */
static bool feed_h2(nr_http_server_t *s, const char *data, size_t len) {
  nr_inbound_enter(&s->in);
  if (nr_h2_server_feed(s->h2, data, len) < 0)
    s->closing = true;
  if (nr_inbound_leave(&s->in)) {
    server_free(s);
    return false;
  }
  if (!s->in.removed && !nr_inbound_busy(&s->in))
    settle(s);
  return !s->in.removed;
}

/* Parse bytes (none: what is held); false if s was freed meanwhile. */
static bool feed(nr_http_server_t *s, const char *data, size_t len) {
  nr_inbound_enter(&s->in);
  int rc = nr_http_feed(&s->parser, data, len, deliver, s);
  if (s->h2 != NULL && !s->in.removed && nr_buf_len(&s->parser.in) > 0) {
    nr_buf_t rest = s->parser.in;       /* after `Upgrade: h2c`: HTTP/2 */
    s->parser.in = NR_BUF_INIT;
    if (nr_h2_server_feed(s->h2, nr_buf_peek(&rest), nr_buf_len(&rest)) < 0)
      s->closing = true;
    nr_buf_free(&rest);
  }
  if (nr_inbound_leave(&s->in)) {
    handover(s);
    server_free(s);
    return false;
  }
  if (s->in.removed)
    return false;
  if (s->overflow)
    rc = 503;
  if (rc > 1 && s->body != B_NONE) {
    nr_inbound_enter_quiet(&s->in);    /* (its answer may close: s goes) */
    fail_body(s, rc, rc == 413 ? "http_server: the request body is over "
              "max_body" : "http_server: malformed request body");
    if (nr_inbound_leave(&s->in)) {
      server_free(s);
      return false;
    }
    if (s->in.removed)
      return false;
    rc = 0;                    /* (answered in its turn) */
  }
  if (rc > 1 && s->h2 == NULL && !s->closing &&
      nr_channel_is_open(nr_ctx_channel(s->ctx))) {
    if (s->outstanding > 0)
      s->pending_error = rc;
    else
      send_error(s, rc);
  }
  if (s->budget != NULL && !nr_inbound_busy(&s->in) && !budget_idle(s)) {
    gate(s);
    budget_wake(s->budget);    /* (room a delivery gave back) */
  } else if (s->budget == NULL && !nr__http_parsing_head(&s->parser)) {
    nr__http_reserve_body(&s->parser);     /* (no budget: at once) */
  }
  if (!nr_inbound_busy(&s->in))
    settle(s);
  return true;
}

/* HTTP/2 bounds its request bodies itself (h2_server.c): the connection
 * leaves HTTP/1.1's body budget. */
static void budget_off(nr_http_server_t *s) {
  budget_leave(s);
  s->budget = NULL;
  hold_reads(s, false);
}

/* The connection speaks HTTP/2 from now on; false if it failed (the
 * channel is closing). */
static bool start_h2(nr_http_server_t *s) {
  s->sniffed = true;
  nr_channel_established(nr_ctx_channel(s->ctx));   /* it spoke: not shed */
  budget_off(s);
  s->h2 = nr_h2_server_new(s->ctx, &s->in, &s->o);
  if (s->h2 == NULL) {
    nr_log(NR_LOG_WARN, "http_server: out of memory starting HTTP/2");
    s->closing = true;
    nr_ctx_close(s->ctx, NULL);
    return false;
  }
  return true;
}

/* The first bytes of a connection, when HTTP/2 is on: the client preface
 * (h2c by prior knowledge) or HTTP/1.1. A preface split across reads
 * waits here (its bytes are known: only a count is kept). */
static int sniff(nr_http_server_t *s, const char *data, size_t len) {
  size_t want = NR_H2_PREFACE_LEN - s->nsniff, take = len < want ? len : want;
  if (s->delivered > 0 || nr_buf_len(&s->parser.in) > 0 ||
      memcmp(data, &NR_H2_PREFACE[s->nsniff], take) != 0) {
    s->sniffed = true;         /* HTTP/1.1 (with what matched before) */
    size_t had = s->nsniff;
    if (had > 0 && !feed(s, NR_H2_PREFACE, had))
      return 0;
    if (!s->closing && !s->parser.stopped)
      feed(s, data, len);
    return 0;
  }
  s->nsniff = (uint8_t)(s->nsniff + take);
  if (s->nsniff < NR_H2_PREFACE_LEN)
    return 0;
  if (start_h2(s) && feed_h2(s, NR_H2_PREFACE, NR_H2_PREFACE_LEN) &&
      len > take && !s->closing)
    feed_h2(s, data + take, len - take);
  return 0;
}

/* `Upgrade: h2c` with HTTP2-Settings (RFC 7540 3.2, kept by RFC 9113 as
 * deprecated): 101, then the request is stream 1's, answered in HTTP/2.
 * False when the request does not ask for it (or the switch failed: it
 * is then answered as HTTP/1.1). */
static bool upgrade_h2c(nr_http_server_t *s, nr_http_request_t *req) {
  const nr_http_header_t *settings = NULL;
  bool h2c = false;
  for (size_t i = 0; i < req->nheaders; i++) {
    const nr_http_header_t *h = &req->headers[i];
    if (nr__http_ieq(h->name, h->name_len, "upgrade", 7))
      h2c |= nr__http_has_token(h->value, h->value_len, "h2c", 3);
    else if (nr__http_ieq(h->name, h->name_len, "http2-settings", 14))
      settings = settings == NULL ? h : req->headers;   /* twice: none */
  }
  if (!h2c || settings == NULL || settings == req->headers)
    return false;
  nr_h2_server_t *h2 = nr_h2_server_new(s->ctx, &s->in, &s->o);
  if (h2 == NULL)
    return false;
  if (nr_h2_server_upgrade(h2, settings->value, settings->value_len,
                           req->head) < 0) {
    nr_h2_server_free(h2);
    return false;
  }
  static const char ok[] = "HTTP/1.1 101 Switching Protocols\r\n"
                           "Connection: Upgrade\r\nUpgrade: h2c\r\n\r\n";
  nr_channel_established(nr_ctx_channel(s->ctx));
  budget_off(s);
  nr_bytes_t b = NR_BYTES(ok, sizeof ok - 1);
  nr_ctx_write(s->ctx, &b, NULL);
  s->h2 = h2;
  s->sniffed = true;
  s->wait = W_NONE;
  nr_h2_server_deliver_upgraded(h2, req);
  return true;
}

int nr_http_server_channel_read(nr_ctx_t *ctx, void *msg) {
  nr_http_server_t *s = nr_ctx_state(ctx);
  if (nr_msg_type(msg) != NR_MSG_BYTES) {
    nr_ctx_fire_read(ctx, msg);
    return 0;
  }
  if (s->h2 != NULL) {
    const nr_bytes_t *b = msg;
    if (!s->closing)
      feed_h2(s, b->data, b->len);
    return 0;
  }
  if (s->closing || s->parser.stopped)
    return 0;                /* after the last request: ignore the rest */
  if (nr_inbound_busy(&s->in))
    return nr_raise(-EBUSY, "http_server: bytes fired into the codec while "
                    "it is delivering a request");
  const nr_bytes_t *b = msg;
  if (!s->sniffed)
    return sniff(s, b->data, b->len);
  feed(s, b->data, b->len);
  return 0;
}

/* A response written wrongly is a programmer mistake: besides failing the
 * write's future (which Lua code rarely watches) it is reported to the
 * handlers after the codec, so exception_caught sees it. */
/* A response the handler should not have written: an error for the
 * write, reported once. Without a promise the pipeline raises the returned
 * error to exception_caught; with one it only fails that promise, so the
 * misuse is fired here as well (a programming error should be heard). */
int nr__http_misuse(nr_ctx_t *ctx, nr_promise_t *p, const char *fmt, ...) {
  char msg[256];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  if (p != NULL) {
    nr_err_t err = {-EINVAL, msg};
    nr_ctx_fire_exception(ctx, &err);
  }
  return nr_raise(-EINVAL, "%s", msg);
}

/* Connection: close beside any Connection the user set (in a list, close
 * wins); keep-alive for an HTTP/1.0 client that keeps the connection. */
static char *put_connection(char *w, uint16_t f, unsigned user, bool close) {
  if (close && !(user & U_CLOSE))
    return PUT_LIT(w, "Connection: close\r\n");
  if (!close && !(user & U_CONN) && (f & F_HTTP10))
    return PUT_LIT(w, "Connection: keep-alive\r\n");
  return w;
}

/* The rest of the head after the status prefix, into room reserved for
 * it: framing, the user's headers, Connection, the blank line (the order
 * of a prepared response's bytes, so that a table and its prepared form
 * -- lhttp_memo.c sends one as the other -- give the same bytes). */
static char *put_head(char *w, const nr_http_response_t *r, uint16_t f,
                      unsigned user, bool bodyless, bool close) {
  if (r->stream && !(user & U_LENGTH)) {   /* (a sized stream: the user's) */
    if (!bodyless && !(f & F_HTTP10))
      w = PUT_LIT(w, "Transfer-Encoding: chunked\r\n");
  } else if (!bodyless && !(user & U_LENGTH)) {
    w = PUT_LIT(w, "Content-Length: ");
    w = put_uint(w, r->body_len, 10);
    w = PUT_LIT(w, "\r\n");
  }
  w = nr__http_put_headers(w, r);
  w = put_connection(w, f, user, close);
  return PUT_LIT(w, "\r\n");
}

/* Room for what put_head writes besides the user's headers, and a first
 * chunk's size line and CRLF: 38 + 24 + 2 + 20 bytes at most. */
#define HEAD_FIXED 128

/* Whether the response to the request with flags f closes the
 * connection: the request asked, its streamed body has not all been read
 * (what is left of it cannot be told from a next request), or the user's
 * headers say so. (An error answer waiting behind it follows it, and
 * closes.) */
static bool closes(uint16_t f, unsigned user) {
  return (f & (F_CLOSE | F_BODY)) || (user & U_CLOSE);
}

/* A response table for slot i (owed). */
static NOINLINE int write_response(nr_http_server_t *s, nr_ctx_t *ctx,
                                   unsigned i, const nr_http_response_t *r,
                                   nr_promise_t *p) {
  if (r->status < 100 || r->status > 999)
    return nr__http_misuse(ctx, p, "http_server: bad status %d", r->status);
  nr_http_count_status(r->status);
  uint16_t f = s->flags[i];
  size_t need;
  unsigned user = nr__http_user_flags(r, &need);
  /* a stream with the user's Content-Length is sized: its bytes go as
   * they are (a static file's body), and the length frames it */
  bool sized = r->stream && (user & U_LENGTH);
  bool close = closes(f, user) ||
               (r->stream && !sized && (f & F_HTTP10));  /* no chunked in
                                              1.0: the close ends the body */
  bool bodyless = bodyless_status(r->status);
  bool no_body = bodyless || (f & F_HEAD);
  const char *body = no_body ? NULL : r->body;
  size_t blen = no_body || body == NULL ? 0 : r->body_len;
  /* the body given with a stream goes as its first chunk; a small one is
   * copied (one copy now beats a second slice) */
  bool chunk = r->stream && blen > 0 && !(f & F_HTTP10) && !sized;
  size_t copy = chunk || blen <= SMALL_BODY ? blen : 0;
  need += status_room(r->reason) + HEAD_FIXED + copy;
  out_t o;
  char *w = begin(s, i, &o, need, p);
  if (w != NULL) {
    w = nr__http_put_status(w, r->status, r->reason, user);
    w = put_head(w, r, f, user, bodyless, close);
    if (chunk) {
      w = put_uint(w, blen, 16);
      w = PUT_LIT(w, "\r\n");
    }
    if (copy > 0)
      w = put(w, body, copy);
    if (chunk)
      w = PUT_LIT(w, "\r\n");
    o.len = (size_t)(w - o.p);
  }
  int rc = write_out(s, i, &o, body, blen - copy, p);
  if (rc < 0)
    return rc;
  if (r->stream) {
    s->flags[i] |= (uint16_t)((no_body ? A_DISCARD
                               : (f & F_HTTP10) || sized ? A_RAW : A_CHUNKED) |
                             (close ? F_ACLOSE : 0));
    s->streams++;
  } else {
    answered(s, i, close);
  }
  return 0;
}

/* A prepared response for slot i (owed): its bytes, with the date and a
 * Connection line put in, the body copied when small, left out for HEAD. */
static NOINLINE int write_prepared(nr_http_server_t *s, nr_ctx_t *ctx,
                                   unsigned i, const nr_http_prepared_t *pr,
                                   nr_promise_t *p) {
  (void)ctx;
  uint16_t f = s->flags[i];
  bool close = closes(f, pr->user);
  nr_http_count_status(pr->status);
  bool no_body = bodyless_status(pr->status) || (f & F_HEAD);
  size_t head = pr->head_len, blen = no_body ? 0 : pr->body_len;
  size_t copy = blen <= SMALL_BODY ? blen : 0;
  const char *body = pr->bytes + head + 2;
  out_t o;
  /* Connection: 26 at most */
  char *w = begin(s, i, &o, head + 26 + 2 + copy, p);
  if (w != NULL) {
    w = put(w, pr->bytes, head);
    w = put_connection(w, f, pr->user, close);
    w = put(w, pr->bytes + head, 2 + copy);
    if (pr->date_at != 0)
      memcpy(o.p + pr->date_at, nr_http_date(), DATE_LEN);
    o.len = (size_t)(w - o.p);
  }
  int rc = write_out(s, i, &o, body, blen - copy, p);
  if (rc < 0)
    return rc;
  answered(s, i, close);
  return 0;
}

/* A response (table or prepared): for the request it answers (target), or
 * a mistake. */
static NOINLINE int respond(nr_http_server_t *s, nr_ctx_t *ctx, void *msg,
                            nr_promise_t *p) {
  bool open_own;
  unsigned i = target(s, nr_ctx_reading(ctx), &open_own);
  if (open_own || (i == RING && s->streams > 0))
    return nr__http_misuse(ctx, p, "http_server: a response written while a streamed "
                  "one is open (end it with \"\" or false)");
  if (i == RING)
    return nr__http_misuse(ctx, p, "http_server: a response with no request to answer");
  if (nr_msg_type(msg) == NR_MSG_HTTP_PREPARED)
    return write_prepared(s, ctx, i, msg, p);
  return write_response(s, ctx, i, msg, p);
}

/* The usual case of write_prepared -- a keep-alive HTTP/1.1 GET's turn,
 * the oldest request owed (and the one being handled, if any), no error
 * waiting, no promise -- is the bytes as they are and the date, encoded in
 * place in the outbound buffer: straight-line code with nothing to
 * decide. 1 when it is not that case. */
static inline int write_plain(nr_http_server_t *s, nr_ctx_t *ctx,
                              const nr_http_prepared_t *pr, nr_promise_t *p) {
  if (s->outstanding == 0 || s->flags[s->oldest] != 0 ||
      s->pending_error || pr->plain_len == 0 || p != NULL)
    return 1;
  /* a later request being handled: its answer is held (k - 1 wraps for
   * the oldest, k = 0, and for none, token 0) */
  uint64_t k = nr_ctx_reading(ctx) - (s->delivered - s->outstanding + 1);
  if (k - 1 < (uint64_t)s->outstanding - 1)
    return 1;
  char *w = nr_ctx_write_reserve(ctx, pr->plain_len);
  if (w == NULL)
    return 1;
  memcpy(w, pr->bytes, pr->plain_len);
  if (pr->date_at != 0)
    memcpy(w + pr->date_at, nr_http_date(), DATE_LEN);
  nr_ctx_write_commit(ctx, pr->plain_len);
  nr_http_count_status(pr->status);
  finish_response(s, false);
  return 0;
}

/* A file region while a stream is open (a static file's body): as it is
 * in a sized or HTTP/1.0 stream, framed as one chunk in a chunked one,
 * dropped for HEAD. A region of no bytes is not the end. */
static NOINLINE int write_file_chunk(nr_http_server_t *s, unsigned i, int how,
                                     nr_file_region_t *r, nr_promise_t *p) {
  if (how == A_DISCARD || r->len == 0) {
    if (p)
      nr_promise_set_success(p, NULL, NULL);
    return 0;
  }
  if (how == A_RAW)
    return emit(s, i, r, p);
  char size[24];
  int sl = snprintf(size, sizeof size, "%zx\r\n", r->len);
  nr_bytes_t b = NR_BYTES(size, (size_t)sl);
  int rc = emit(s, i, &b, NULL);
  if (rc == 0)
    rc = emit(s, i, r, NULL);
  b = NR_BYTES("\r\n", 2);
  return rc == 0 ? emit(s, i, &b, p) : rc;
}

/* A byte write while a stream is open: one chunk, or the end. */
static NOINLINE int write_chunk(nr_http_server_t *s, nr_ctx_t *ctx,
                                void *msg, nr_promise_t *p) {
  unsigned i = stream_slot(s, nr_ctx_reading(ctx));
  int how = s->flags[i] & A_MASK;
  size_t total = 0, n = 1;
  nr_slice_t one, *parts = &one;
  if (nr_msg_type(msg) == NR_MSG_FILE)
    return write_file_chunk(s, i, how, msg, p);
  if (nr_msg_type(msg) == NR_MSG_BYTES) {
    one = (nr_slice_t){((nr_bytes_t *)msg)->data, ((nr_bytes_t *)msg)->len};
  } else {
    nr_slices_t *sl = msg;
    parts = (nr_slice_t *)sl->v;
    n = sl->n;
  }
  for (size_t k = 0; k < n; k++)
    total += parts[k].len;
  int rc = 0;
  if (total == 0) {
    s->flags[i] &= (uint16_t)~A_MASK;
    s->streams--;
    if (how == A_CHUNKED) {
      nr_bytes_t end = NR_BYTES("0\r\n\r\n", 5);
      rc = emit(s, i, &end, p);
    } else if (p) {
      nr_promise_set_success(p, NULL, NULL);
    }
    answered(s, i, s->flags[i] & F_ACLOSE);
    return rc;
  }
  if (how == A_DISCARD) {
    if (p)
      nr_promise_set_success(p, NULL, NULL);
    return 0;
  }
  if (how == A_RAW)
    return emit(s, i, msg, p);
  (void)ctx;
  char size[24];
  int sl = snprintf(size, sizeof size, "%zx\r\n", total);
  nr_slice_t small[18], *v = n + 2 <= 18 ? small : malloc((n + 2) * sizeof *v);
  if (v == NULL)
    return nr_raise(-ENOMEM, "http_server: out of memory");
  v[0] = (nr_slice_t){size, (size_t)sl};
  memcpy(v + 1, parts, n * sizeof *v);
  v[n + 1] = (nr_slice_t){"\r\n", 2};
  nr_slices_t out = {NR_MSG_SLICES, v, n + 2};
  rc = emit(s, i, &out, p);
  if (v != small)
    free(v);
  return rc;
}

static NOINLINE int write_h2(nr_http_server_t *s, void *msg,
                             nr_promise_t *p) {
  int rc = nr_h2_server_write(s->h2, msg, p);
  if (!nr_inbound_busy(&s->in))
    settle(s);                 /* the last answer out: idle from now */
  return rc;
}

int nr_http_server_write(nr_ctx_t *ctx, void *msg, nr_promise_t *p) {
  nr_http_server_t *s = nr_ctx_state(ctx);
  if (s->h2 != NULL)
    return write_h2(s, msg, p);
  int type = nr_msg_type(msg);
  if (type == NR_MSG_HTTP_PREPARED && write_plain(s, ctx, msg, p) == 0)
    return 0;
  if (type == NR_MSG_HTTP_PREPARED || type == NR_MSG_HTTP_RESPONSE)
    return respond(s, ctx, msg, p);
  if (s->streams != 0 &&
      (type == NR_MSG_BYTES || type == NR_MSG_SLICES || type == NR_MSG_FILE))
    return write_chunk(s, ctx, msg, p);
  return nr_ctx_write(ctx, msg, p);  /* raw bytes pass through */
}

/* A client that sends requests and does not read the answers: once the
 * channel turns unwritable (its outbound buffer above write_buffer_high)
 * the codec stops reading (auto_read off) and parses nothing past the
 * request just delivered (deliver); once the buffer has drained below
 * write_buffer_low it reads again, and a task parses what it held and
 * fires read_complete, as a read would. So the answers it owes cannot
 * grow without bound. Only an auto_read the codec finds on is turned off,
 * and back on. */
static void parse_held(void *state, nr_ctx_t *ctx) {
  nr_http_server_t *s = state;
  if (nr_inbound_resumable(&s->in, ctx) && !s->closing && feed(s, NULL, 0))
    nr_ctx_fire_read_complete(ctx);      /* as after a read: handlers flush */
}

int nr_http_server_writability(nr_ctx_t *ctx) {
  nr_http_server_t *s = nr_ctx_state(ctx);
  if (s->h2 != NULL) {         /* HTTP/2 reads on: WINDOW_UPDATEs unblock */
    nr_h2_server_writability(s->h2);
    nr_ctx_fire_writability_changed(ctx);
    return 0;
  }
  return nr_inbound_writability(&s->in, ctx, s, parse_held);
}

/* TLS agreed "h2": HTTP/2 from the first byte. A graceful shutdown:
 * HTTP/2 says GOAWAY. */
int nr_http_server_user_event(nr_ctx_t *ctx, void *evt) {
  nr_http_server_t *s = nr_ctx_state(ctx);
  if (nr_msg_type(evt) == NR_MSG_TLS_EVENT) {
    const nr_tls_event_t *e = evt;
    if (e->kind == NR_TLS_HANDSHAKE) {
      s->tls = true;
      if (s->o.h2 && s->h2 == NULL && e->alpn != NULL &&
          strcmp(e->alpn, "h2") == 0 && s->delivered == 0 && start_h2(s))
        feed_h2(s, NULL, 0);   /* our SETTINGS */
    }
  } else if (evt == &NR_EVT_SHUTDOWN && s->h2 != NULL) {
    nr_h2_server_shutdown(s->h2);
  }
  nr_ctx_fire_user_event(ctx, evt);
  return 0;
}

bool nr_http_server_speaks_h2(const nr_ctx_t *ctx) {
  const nr_handler_t *h = nr_ctx_handler(ctx);
  return h != NULL && h->type != NULL && strcmp(h->type, "http_server") == 0 &&
         ((const nr_http_server_t *)nr_ctx_state(ctx))->o.h2;
}

const nr_handler_t nr_http_server_handler = {
    .type = "http_server", .added = nr_http_server_added, .removed = nr_http_server_removed,
    .active = nr_http_server_active, .inactive = nr_http_server_inactive,
    .channel_read = nr_http_server_channel_read,
    .writability_changed = nr_http_server_writability, .read = nr_http_server_read,
    .user_event = nr_http_server_user_event,
    .write = nr_http_server_write, .read_failed = nr_http_server_read_failed};
