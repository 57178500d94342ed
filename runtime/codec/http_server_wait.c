/*
 * http_server_wait.c -- the HTTP/1.1 server codec's timeouts (header,
 * body, keep-alive: one FIFO wait list per kind and value on each loop,
 * one timer each) and its body budget (what request bodies a loop's
 * connections, and each connection, may hold). Both live in a per-loop
 * profile shared by the loop's connections configured alike; profiles
 * are the loop thread's (a _Thread_local list), as is every connection's
 * state. The sections below state each one's invariants.
 */
#include <assert.h>
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "codec/http_server_internal.h"

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

void nr__hs_profile_put(profile_t *p) {
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

void nr__hs_unlist(nr_http_server_t *s) {
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

/* The connection begins to wait for its client (w): it joins the tail of
 * its list, which then needs a timer if it has none. */
static void watch(nr_http_server_t *s, int w) {
  s->wait = (uint8_t)w;
  mark_idle(s);
  if (s->prof == NULL)
    return;                    /* no timeouts, or no loop */
  wait_list_t *l = &s->prof->list[w];
  nr__hs_unlist(s);
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

NOINLINE void nr__hs_settle(nr_http_server_t *s) {
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
void nr__hs_apply_holds(nr_http_server_t *s) {
  bool held = s->budget_held || s->body_held;
  if (s->reads_held == held)
    return;
  s->reads_held = held;
  nr_channel_hold_reads(nr_ctx_channel(s->ctx), held);
  if (!held && !nr_inbound_busy(&s->in))
    nr__hs_settle(s);                 /* its timeouts run again */
}

/* Reads held while there is no room, or going on. */
static void hold_reads(nr_http_server_t *s, bool held) {
  s->budget_held = held;
  nr__hs_apply_holds(s);
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


/* Room freed on the loop: the connections waiting for it, in order, as
 * long as each gets its room. One inside its own read is left to that
 * read's end, which gates it (and those after it). */
void nr__hs_budget_wake(budget_t *b) {
  nr_http_server_t *w;
  while ((w = b->head) != NULL && !nr_inbound_busy(&w->in)) {
    nr__hs_gate(w);
    if (b->head == w)
      break;                   /* still first: no room for it yet */
  }
}

static void give(nr_http_server_t *s, uint64_t n) {
  s->held -= n;
  s->budget->held -= n;
  if (s->budget_held && !s->bwaiting && !nr_inbound_busy(&s->in))
    nr__hs_gate(s);                   /* it waited for its own answers */
  nr__hs_budget_wake(s->budget);
}

/* After a read was parsed (or room freed): admit the body being read, or
 * hold the reads until there is room; true when reads go on. */
bool nr__hs_gate(nr_http_server_t *s) {
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

/* A request with a body was delivered into ring slot i: what it holds is
 * its body's length from now until its answer (the reservation made at
 * its head, adjusted; or taken now, when it came whole in one read). */
NOINLINE void nr__hs_budget_delivered(nr_http_server_t *s, unsigned i,
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
NOINLINE void nr__hs_budget_answered(nr_http_server_t *s) {
  uint64_t n = s->resv[s->oldest];
  s->resv[s->oldest] = 0;
  give(s, n);
}

/* The connection ends (or the codec leaves it): all it holds is free. */
void nr__hs_budget_leave(nr_http_server_t *s) {
  if (s->budget == NULL)
    return;
  bline_remove(s);
  if (s->resv != NULL)
    memset(s->resv, 0, RING * sizeof *s->resv);
  s->admitted = 0;
  if (s->held > 0) {
    s->budget->held -= s->held;
    s->held = 0;
    nr__hs_budget_wake(s->budget);
  }
}

/* The wait ran out: a request half sent gets 408, an idle connection is
 * closed silently (nginx does both). */

static void expire(nr_http_server_t *s) {
  nr_inbound_enter_quiet(&s->in);
  if (s->h2 != NULL) {
    nr_h2_server_expire(s->h2);   /* GOAWAY, then the close */
  } else if (s->body != B_NONE) {
    nr__hs_fail_body(s, 408, "http_server: the request body timed out "
              "(body_timeout)");
  } else if (s->wait == W_HEAD || s->wait == W_BODY) {
    nr__hs_send_error(s, 408);
  } else {
    s->closing = true;
    nr_ctx_close(s->ctx, NULL);
  }
  if (nr_inbound_leave(&s->in))
    nr__hs_free(s);
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
    nr__hs_unlist(s);
    if (s->wait == l->wait && !s->closing && !nr_inbound_busy(&s->in) &&
        nr_channel_is_open(nr_ctx_channel(s->ctx)))
      expire(s);
  }
  if (l->head != NULL && l->timer == NULL)
    arm(l, l->head->since + l->limit - now);
  nr__hs_profile_put(p);
  return 0;
}

/* The first wait, for the first request: from when the channel is
 * active, on its loop's lists. */
void nr__hs_start(nr_http_server_t *s) {
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

/* HTTP/2 bounds its request bodies itself (h2_server.c): the connection
 * leaves HTTP/1.1's body budget. */
void nr__hs_budget_off(nr_http_server_t *s) {
  nr__hs_budget_leave(s);
  s->budget = NULL;
  hold_reads(s, false);
}

