/*
 * lhttp_pool.h -- what lhttp_pool.c (pools, connections, requests) and
 * lhttp_lane.c (the lane and the forwarder) share: the pool's structures
 * and the calls that make and send a request. Private to the http_pool
 * module; loop thread only.
 */
#ifndef LNR_HTTP_POOL_H
#define LNR_HTTP_POOL_H

#include "codec/http_client.h"
#include "lnr.h"
#include "tls/tls.h"

#define POOL_CLASS "netrun.http.pool"
#define REQ_CLASS "netrun.http.call"

/* A request's uservalues. */
enum { UV_TARGET = 1, UV_METHOD, UV_PATH, UV_HEADERS, UV_BODY, UV_FORWARD,
       UV_HOST, UV_URL, UV_TLS, UV_N = UV_TLS };

typedef struct hpool hpool_t;
typedef struct hconn hconn_t;
typedef struct hreq hreq_t;
typedef struct hxfer hxfer_t;   /* a streamed exchange (lhttp_xfer.c) */

struct hreq {
  hpool_t *pool;
  hconn_t *conn;              /* in flight on it, or NULL */
  uint64_t seq;               /* HTTP/2: the tag its reply carries */
  hreq_t *fprev, *fnext;      /* HTTP/2: its connection's requests in flight */
  hreq_t *wprev, *wnext;      /* the pool's line of waiting requests */
  hreq_t *dprev, *dnext;      /* the pool's deadlines, earliest first */
  uint64_t deadline;          /* nr_now() ns; 0: none */
  double timeout;             /* s, for the message */
  int ref;                    /* anchors the userdata until settled */
  bool callback;              /* the target is a function (else a promise) */
  bool waiting, timed, retried, done;
  bool gone;                  /* a streamed exchange's client side is over:
                                 its callback gets false, not nil */
  bool streamed;              /* a streamed exchange's (a failure's callback
                                 gets a third value, below) */
  bool taken;                 /* ... whose request body was claimed: not to
                                 be sent again (cb(nil, err, false)) */
  bool cut;                   /* ... whose backend failed after its head went
                                 to the client (cb(false, err, true)) */
  hxfer_t *x;                 /* streamed (a stream forwarder's), or NULL */
};

struct hconn {
  hpool_t *pool;              /* NULL: detached (the pool's state closed) */
  nr_ctx_t *ctx;
  hreq_t *req;                /* in flight, or NULL */
  hconn_t *inext, *iprev;     /* the idle list */
  hconn_t *anext, *aprev;     /* all the pool's connections */
  uint64_t since;             /* idle since (nr_now) */
  bool ready;                 /* connected: counted in total until gone */
  bool idle, dead, gone, used, reused;
  bool h2, goaway;            /* HTTP/2 (the codec said so); no new streams */
  bool upgraded;              /* a tunnel's now (lhttp_tunnel.c): out of
                                 the pool, its bytes passed on */
  unsigned nflight, max_streams;   /* HTTP/2: requests in flight, at most */
  hreq_t *flight;             /* HTTP/2: those requests */
  char err[200];              /* the first error met */
};

struct hpool {
  lnr_state_t *S;
  nr_loop_t *loop;
  int self_ref;               /* anchors the pool while it has anything */
  int connect_ref, empty_ref; /* http.lua's functions */
  hconn_t *idle, *all;
  int nidle, total, connecting, max, nwait, max_wait;
  hreq_t *whead, *wtail;
  hreq_t *dhead, *dtail;
  uint64_t keepalive;         /* ns */
  nr_timer_t *dtimer, *sweeper;
  uint64_t dat;               /* the deadline dtimer is set for */
  int depth;                  /* entry points running (see enter) */
  hreq_t *spare[32];          /* settled requests, kept (anchored) for reuse */
  int nspare;
  hconn_t *h2c;               /* its HTTP/2 connection (one: requests are
                                 multiplexed on it), or NULL */
  bool maybe_h2;              /* its connections may speak HTTP/2: one is
                                 opened until the first says which */
  bool h1_seen;               /* ... and one said HTTP/1.1 */
  uint64_t seq;               /* the last tag given */
  /* https: the TLS config its connections are made with (retained), and
   * the identity and generation of that config when last looked at; a
   * reload that changed the identity retires the pool (see stale) */
  nr_tls_config_t *tls;
  unsigned tls_gen;
  char tls_id[NR_TLS_ID_LEN + 1];
  bool retired;
};

/* P's TLS config was reloaded with another identity: retire P (true).
 * Out of line: stale's usual answer costs one atomic read. */
__attribute__((noinline)) bool lnr_pool_reloaded(lua_State *L, hpool_t *P);

/* Whether P may take no request (its TLS settings changed): one atomic
 * read per https request, nothing for http. */
static inline bool stale(lua_State *L, hpool_t *P) {
  return P->retired || (P->tls != NULL &&
                        nr_tls_config_generation(P->tls) != P->tls_gen &&
                        lnr_pool_reloaded(L, P));
}

/* Push a new request (a spare of P's if it has one; its uservalues nil). */
hreq_t *lnr_pool_new_req(lua_State *L, hpool_t *P, bool callback,
                         double timeout);
/* Send the request userdata on top of the stack (popped) through P (at
 * stack index pidx). */
void lnr_pool_send_req(lua_State *L, hpool_t *P, int pidx, hreq_t *q);

/* Streamed exchanges (lhttp_xfer.c; see its header). The pool's side:
 * xfer_end ends q's exchange -- its connection back to the pool when
 * keep, else closed -- and settles q: cb(true), or (nil or false, err);
 * xfer_retime: q's timeout runs afresh from now (the exchange moved: its
 * timeout bounds each wait, for the head and between pieces);
 * xfer_gone: q's client side is over (cb gets false). */
void lnr_pool_xfer_end(hreq_t *q, bool keep, const char *err);
void lnr_pool_xfer_retime(hreq_t *q);
void lnr_pool_xfer_gone(hreq_t *q);
/* q's connection switched protocols: out of the pool (a tunnel's). */
void lnr_pool_xfer_detach(hreq_t *q);
/* lhttp_tunnel.c: the client's connection (its handler's ctx, after the
 * server codec, which the tunnel replaces) and the backend's (its pool
 * handler's ctx, after which the tunnel goes) tunnel bytes both ways.
 * 0 or -errno. */
int lnr_tunnel_start(nr_ctx_t *client, nr_ctx_t *backend);
/* The exchange's side: new (req, the client's ctx at those stack
 * indices; raises), the head's fields pushed (the forwarder's headers at
 * `headers`, with the body's framing), started on c once the head is
 * written (NULL, or why it cannot go on), a message of c, c writable,
 * whether q may be sent again elsewhere (nothing taken yet), freed as q
 * settles (err: failed, the backend connection reset, and the client's
 * closed if its answer had begun; else closed unless reuse). */
hxfer_t *lnr_xfer_new(lua_State *L, int req, int ctx, size_t buffer);
void lnr_xfer_push_headers(lua_State *L, hxfer_t *x, int req, int headers);
void lnr_xfer_bind(hxfer_t *x, hreq_t *q);      /* x is q's */
const char *lnr_xfer_start(hxfer_t *x, hconn_t *c);
void lnr_xfer_read(hxfer_t *x, void *msg);
void lnr_xfer_writable(hxfer_t *x);
void lnr_xfer_read_complete(hxfer_t *x);     /* what went to the client flushed */
bool lnr_xfer_may_retry(hxfer_t *x);
void lnr_xfer_free(hxfer_t *x, const char *err, bool reuse);

/* lhttp_pool.c's entry points for lhttp_pool_lua.c: an entry point runs
 * between enter and leave (the pool empties as the last one leaves); a
 * request to a connection or in line (acquire); waiting requests get
 * connections opened (lost); a free connection to a waiting request or
 * idle (release); a connection gone (conn_gone); a deadline kept in order;
 * a timer dropped; the pool connections' handler (make_conn: P:add_last). */
void lnr_pool_enter(hpool_t *P);
void lnr_pool_leave(lua_State *L, hpool_t *P);
void lnr_pool_acquire(lua_State *L, hpool_t *P, hreq_t *q);
void lnr_pool_lost(lua_State *L, hpool_t *P);
void lnr_pool_release(lua_State *L, hconn_t *c);
void lnr_pool_conn_gone(lua_State *L, hconn_t *c);
void lnr_pool_fail_first(lua_State *L, hpool_t *P, const char *msg);
void lnr_pool_deadline_insert(hpool_t *P, hreq_t *q);
void lnr_pool_drop_timer(nr_timer_t **t);
extern const nr_handler_t lnr_pool_conn_vt;
const nr_handler_t *lnr_pool_make_conn(lua_State *L, int idx, void **state);

/* core.http.lane and core.http.forwarder (lhttp_lane.c). */
int lnr_http_lane(lua_State *L);
int lnr_http_forwarder(lua_State *L);

#endif
