/*
 * http_server_internal.h -- what the pieces of the HTTP/1.1 server codec
 * share: its state (nr_http_server_t), the ring of unanswered requests
 * and the small helpers of the per-request path, inlined where they are
 * used. The pieces:
 *
 *   http_server.c        the handler: lifetime, delivering requests
 *                        (deliver, feed), answering in order (release,
 *                        finished), the HTTP/2 hand-off (sniff, h2c);
 *   http_server_write.c  responses: encoding and writing them, the
 *                        codec's own answers (errors, 100 Continue);
 *   http_server_wait.c   timeouts (the loop's wait lists) and the body
 *                        budget;
 *   http_server_body.c   streamed request bodies (body = "stream").
 *
 * Names shared between them are nr__hs_*; the rest stay static in their
 * file. Loop thread only: a codec's state belongs to its channel's loop,
 * and the per-loop wait lists and budgets (profiles) to that loop's
 * thread.
 */
#ifndef NR_CODEC_HTTP_SERVER_INTERNAL_H
#define NR_CODEC_HTTP_SERVER_INTERNAL_H

#include <stdbool.h>
#include <stdint.h>

#include "codec/codec.h"
#include "codec/h2.h"
#include "codec/http.h"
#include "codec/http_encode.h"
#include "codec/http_hold.h"
#include "codec/http_parse.h"

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
  budget_t *budget;           /* its loop's (in its profile), from nr__hs_start() */
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
  nr_http_seen_fn seen;       /* an observer (an access log), or NULL */
  void *seen_arg;
};

/* Tell the observer, if any, of an answer for slot i (RING: none):
 * http_server_write.c. */
void nr__hs_tell(nr_http_server_t *s, unsigned i, int ev, int status,
                 uint64_t head, uint64_t body);
#define TELL(s, i, ev, status, head, body)                                    \
  do {                                                                        \
    if ((s)->seen != NULL)                                                    \
      nr__hs_tell(s, i, ev, status, head, body);                              \
  } while (0)

/* A loop's body budget (see "the body budget" below). */
struct budget_s {
  uint64_t limit, held;
  nr_http_server_t *head, *tail;   /* connections waiting for room, in order */
};

/* http_server.c */
void nr__hs_free(nr_http_server_t *s);
bool nr__hs_feed(nr_http_server_t *s, const char *data, size_t len);
void nr__hs_finished(nr_http_server_t *s, bool close);
void nr__hs_answer_failed(nr_http_server_t *s, unsigned i);

/* http_server_write.c */
void nr__hs_write_status(nr_http_server_t *s, unsigned i, int status,
                         bool close, bool head, nr_promise_t *p);
void nr__hs_send_error(nr_http_server_t *s, int status);
void nr__hs_send_continue(nr_http_server_t *s);

/* http_server_wait.c: timeouts */
void nr__hs_start(nr_http_server_t *s);
void nr__hs_settle(nr_http_server_t *s);
void nr__hs_unlist(nr_http_server_t *s);
void nr__hs_profile_put(profile_t *p);
/* the body budget */
void nr__hs_apply_holds(nr_http_server_t *s);
bool nr__hs_gate(nr_http_server_t *s);
void nr__hs_budget_wake(budget_t *b);
void nr__hs_budget_delivered(nr_http_server_t *s, unsigned i, size_t len);
void nr__hs_budget_answered(nr_http_server_t *s);
void nr__hs_budget_leave(nr_http_server_t *s);
void nr__hs_budget_off(nr_http_server_t *s);

/* http_server_body.c */
int nr__hs_streamed_head(nr_http_server_t *s, nr_http_request_t *req);
int nr__hs_deliver_piece(nr_http_server_t *s, const nr_http_request_t *req);
void nr__hs_stop_body(nr_http_server_t *s);
void nr__hs_body_gone(nr_http_server_t *s, const char *why);
void nr__hs_fail_body(nr_http_server_t *s, int status, const char *why);

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

/* Nothing for gate to do after a read: the connection holds no body,
 * none is being read (a body in progress keeps bytes in the parser), its
 * reads go on, and nobody waits (the usual, checked inline). */
static inline bool budget_idle(const nr_http_server_t *s) {
  return (s->held | s->admitted) == 0 && !s->budget_held &&
         nr_buf_len(&s->parser.in) == 0 && s->budget->head == NULL;
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

/* The oldest request's answer is out: forget it. True when more are
 * owed. */
static inline bool forget_oldest(nr_http_server_t *s) {
  if (s->resv != NULL && s->resv[s->oldest] != 0)
    nr__hs_budget_answered(s);
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
  nr__hs_finished(s, close);
}

/* Slot i's answer is whole: its request is forgotten when it is the
 * oldest, else its answer waits, whole, for its turn. */
static inline void answered(nr_http_server_t *s, unsigned i, bool close) {
  if (!holds(s, i))
    finish_response(s, close);
  else
    s->flags[i] = (uint16_t)((s->flags[i] & ~A_MASK) | A_DONE |
                             (close ? F_ACLOSE : 0));
}

#endif
