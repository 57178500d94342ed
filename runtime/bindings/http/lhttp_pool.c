/*
 * lhttp_pool.c -- netrun.http's connection pools (DESIGN.md §8.3), in C.
 *
 * lua/netrun/http.lua reads a request's options (URL, method, headers,
 * redirects, the main thread's daemon loop) and hands each request to the
 * pool of its client and origin on this loop; the pool does the rest:
 *
 *   local P = core.http.pool { max = 64, keepalive = 60, max_waiting = 1024,
 *                              h2 = false,  -- its connections may be HTTP/2
 *                              connect = function(P, tls, timeout) end,
 *                              empty = function(P) end,
 *                              tls = config }     -- https: its TLS config
 *   P:send(target, method, path, headers, body, forward, host, url,
 *          timeout, tls)        -- target: a callback(res, err) or a promise
 *                               -- --> false when the pool is retired
 *   ch:pipeline():add_last("client", P)     -- in a new connection's init,
 *                                           -- after the client codec
 *   P:connected(ch)  P:connect_failed(message)     -- connect's outcome
 *   P:stats() --> { idle, total, waiting }
 *   core.http.lane { Client, pools, urls, slow } --> Client.request
 *   core.http.forwarder(client, pools, key, host, headers, url, slow)
 *     --> forward(req, cb)                  -- client:forwarder's
 *
 * A request takes an idle connection (the one used last), or opens one
 * while the pool has fewer than max (connect: http.lua's, which calls
 * connected or connect_failed when the connect ends), or waits in line
 * (at most max_waiting: past it, it fails at once).
 * A keep-alive response puts its connection back: to the first request
 * waiting, or idle (closed after keepalive seconds unused). A request's
 * timeout (0: none) bounds it from send to response: one timer per pool
 * watches every deadline, kept in order. A request sent on a reused
 * connection that the server closed before answering (its keep-alive ran
 * out then) is sent once more when its method is idempotent. The pool
 * empties when it has no connection and no request; empty is told then
 * (http.lua forgets it).
 *
 * TLS: http.lua keys pools by origin and the identity of the TLS config
 * (nr_tls_config_identity), so a request never takes a connection made
 * under other settings (verification, CA, certificate, server_name,
 * ALPN). An https pool keeps the config it was made for, and checks its
 * generation as each request comes (an atomic read): after a reload that
 * changed the identity the pool retires (stale), and the request goes to
 * a new pool.
 *
 * A request is a userdata whose uservalues are its Lua values (in
 * lnr_http_write_call's order: 1 target, 2 method, 3 path, 4 headers,
 * 5 body, 6 forward, 7 host; then 8 url, 9 tls), anchored by a registry
 * reference until it is settled (then kept, cleared, for the pool's
 * next: at most 32); a connection is a handler state (malloc'd, freed
 * when the handler leaves); a pool is a userdata, anchored while it has a
 * connection or a request. Loop thread only: a pool lives in its loop's
 * state.
 *
 * Client.request (core.http.lane) checks the options and, for the usual
 * request (a callback, a URL parsed before, no redirects, TLS config,
 * limit or timeout of its own, its pool made), sends it without a Lua
 * function call; any other goes to http.lua's `slow`, checked. A
 * forwarder does the same for a proxy's forward(req, cb) with options
 * checked when it was made. (What Lua calls -- core.http.pool and the
 * pool's methods -- is in lhttp_pool_lua.c.)
 */
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "codec/h2.h"
#include "lhttp_pool.h"

static void fail_request(lua_State *L, hreq_t *q, const char *err, bool retry);
static lua_State *state_of(hpool_t *P);

static double secs(uint64_t ns) { return (double)ns / 1e9; }

/* ---- lists ---------------------------------------------------------------- */

static void wait_push(hpool_t *P, hreq_t *q, bool front) {
  q->waiting = true;
  P->nwait++;
  if (front) {
    q->wprev = NULL;
    q->wnext = P->whead;
    if (P->whead) P->whead->wprev = q; else P->wtail = q;
    P->whead = q;
  } else {
    q->wnext = NULL;
    q->wprev = P->wtail;
    if (P->wtail) P->wtail->wnext = q; else P->whead = q;
    P->wtail = q;
  }
}

static void wait_remove(hpool_t *P, hreq_t *q) {
  if (!q->waiting)
    return;
  q->waiting = false;
  P->nwait--;
  if (q->wprev) q->wprev->wnext = q->wnext; else P->whead = q->wnext;
  if (q->wnext) q->wnext->wprev = q->wprev; else P->wtail = q->wprev;
  q->wprev = q->wnext = NULL;
}

/* An idle connection keeps no process alive (Node's agent unrefs its idle
 * sockets): a script that made a request ends once it is answered. */
static void idle_push(hpool_t *P, hconn_t *c) {
  nr_channel_set_ref(nr_ctx_channel(c->ctx), false);
  c->idle = true;
  c->since = nr_now();
  c->iprev = NULL;
  c->inext = P->idle;
  if (P->idle) P->idle->iprev = c;
  P->idle = c;
  P->nidle++;
}

static void idle_remove(hpool_t *P, hconn_t *c) {
  if (!c->idle)
    return;
  c->idle = false;
  nr_channel_set_ref(nr_ctx_channel(c->ctx), true);
  P->nidle--;
  if (c->iprev) c->iprev->inext = c->inext; else P->idle = c->inext;
  if (c->inext) c->inext->iprev = c->iprev;
  c->inext = c->iprev = NULL;
}

static void all_remove(hpool_t *P, hconn_t *c) {
  if (c->aprev) c->aprev->anext = c->anext; else if (P->all == c) P->all = c->anext;
  if (c->anext) c->anext->aprev = c->aprev;
  c->anext = c->aprev = NULL;
}

/* HTTP/2: a connection carries up to its server's stream limit at once. */
static bool has_room(const hconn_t *c) {
  return c->h2 && !c->goaway && !c->dead && c->pool &&
         c->nflight < c->max_streams;
}

static void flight_push(hconn_t *c, hreq_t *q) {
  q->fprev = NULL;
  q->fnext = c->flight;
  if (c->flight) c->flight->fprev = q;
  c->flight = q;
  c->nflight++;
}

static void flight_remove(hconn_t *c, hreq_t *q) {
  if (q->fprev) q->fprev->fnext = q->fnext; else c->flight = q->fnext;
  if (q->fnext) q->fnext->fprev = q->fprev;
  q->fprev = q->fnext = NULL;
  c->nflight--;
}

/* ---- timers ------------------------------------------------------------------ */

static int on_deadline(void *arg);
static int on_sweep(void *arg);

void lnr_pool_drop_timer(nr_timer_t **t) {
  if (*t) {
    nr_timer_cancel(*t);
    nr_timer_release(*t);
    *t = NULL;
  }
}

static void arm_deadline(hpool_t *P) {
  if (P->dhead == NULL || (P->dtimer && P->dat <= P->dhead->deadline))
    return;
  lnr_pool_drop_timer(&P->dtimer);
  uint64_t now = nr_now(), at = P->dhead->deadline;
  P->dat = at;
  P->dtimer = nr_loop_schedule(P->loop, at > now ? at - now : 0, 0, on_deadline,
                               NULL, P);
}

/* In deadline order; from the tail: most requests have the client's
 * timeout and come last. */
void lnr_pool_deadline_insert(hpool_t *P, hreq_t *q) {
  hreq_t *after = P->dtail;
  while (after && after->deadline > q->deadline)
    after = after->dprev;
  q->timed = true;
  q->dprev = after;
  q->dnext = after ? after->dnext : P->dhead;
  if (q->dnext) q->dnext->dprev = q; else P->dtail = q;
  if (after) after->dnext = q; else P->dhead = q;
  arm_deadline(P);
}

static void deadline_remove(hpool_t *P, hreq_t *q) {
  if (!q->timed)
    return;
  q->timed = false;
  if (q->dprev) q->dprev->dnext = q->dnext; else P->dhead = q->dnext;
  if (q->dnext) q->dnext->dprev = q->dprev; else P->dtail = q->dprev;
  q->dprev = q->dnext = NULL;     /* (the timer stays: it finds nothing due) */
}

static void arm_sweeper(hpool_t *P, uint64_t delay) {
  if (P->sweeper == NULL && P->nidle > 0)
    P->sweeper = nr_loop_schedule(P->loop, delay, 0, on_sweep, NULL, P);
}

/* ---- the pool's life ----------------------------------------------------------- */

static bool busy(const hpool_t *P) {
  return P->total > 0 || P->nwait > 0 || P->dhead != NULL;
}

/* Every entry point (a handler's event, a timer, a method) runs between
 * enter and leave; they nest (a close met inside one runs the handler's
 * inactive at once). As the outermost leaves, a pool with nothing left
 * lets go of itself (http.lua's empty forgets it; a request sent to it
 * later holds it again): never while an outer one still uses it. */
void lnr_pool_enter(hpool_t *P) { P->depth++; }

void lnr_pool_leave(lua_State *L, hpool_t *P) {
  if (--P->depth > 0 || busy(P) || P->self_ref == LUA_NOREF)
    return;
  lnr_pool_drop_timer(&P->dtimer);
  lnr_pool_drop_timer(&P->sweeper);
  int ref = P->self_ref;
  lua_rawgeti(L, LUA_REGISTRYINDEX, P->empty_ref);
  lua_rawgeti(L, LUA_REGISTRYINDEX, ref);
  if (lnr_pcall(L, 1, 0) != LUA_OK)
    lnr_log_error(L, "netrun.http: a pool's empty");
  if (!busy(P) && P->self_ref == ref) {   /* (unless used meanwhile) */
    P->self_ref = LUA_NOREF;
    luaL_unref(L, LUA_REGISTRYINDEX, ref);
    while (P->nspare > 0)
      luaL_unref(L, LUA_REGISTRYINDEX, P->spare[--P->nspare]->ref);
  }
}

/* ---- requests ------------------------------------------------------------------- */

/* Push the request's userdata. */
static void push_req(lua_State *L, const hreq_t *q) {
  lua_rawgeti(L, LUA_REGISTRYINDEX, q->ref);
}

static bool idempotent(const char *m) {
  static const char *const ok[] = {"GET", "HEAD", "OPTIONS", "PUT", "DELETE",
                                   "TRACE"};
  for (size_t i = 0; i < sizeof ok / sizeof ok[0]; i++)
    if (strcmp(m, ok[i]) == 0)
      return true;
  return false;
}

/* Push the request's method (a forwarded one's read from the request). */
static void push_method(lua_State *L, int u) {
  if (lua_getiuservalue(L, u, UV_METHOD) != LUA_TSTRING) {
    lua_pop(L, 1);
    lua_getiuservalue(L, u, UV_FORWARD);
    if (lua_type(L, -1) == LUA_TUSERDATA)
      lua_getfield(L, -1, "method");
    else
      lua_pushliteral(L, "?");
    lua_remove(L, -2);
  }
}

/* The request's end: its target gets (res) or (nil, message); the
 * response, if any, is on top of the stack (popped). An error in a
 * callback is logged: it never reaches a connection. */
static void settle(lua_State *L, hreq_t *q, const char *err) {
  int res = err ? 0 : lua_gettop(L);
  if (q->x != NULL) {                /* a streamed exchange's state goes */
    hxfer_t *x = q->x;
    q->x = NULL;
    lnr_xfer_free(x, err, false);
  }
  deadline_remove(q->pool, q);
  q->done = true;
  push_req(L, q);
  int u = lua_gettop(L);
  if (err) {
    push_method(L, u);
    lua_getiuservalue(L, u, UV_URL);
    lua_pushfstring(L, "netrun.http: %s %s: %s", lua_tostring(L, -2),
                    lua_tostring(L, -1), err);
    lua_replace(L, -3);
    lua_pop(L, 1);
    res = lua_gettop(L);
  }
  lua_pushcfunction(L, lnr_msgh);
  lua_getiuservalue(L, u, UV_TARGET);
  if (q->callback) {
    if (err && q->gone) lua_pushboolean(L, 0);
    else if (err) lua_pushnil(L);
    lua_pushvalue(L, res);
    int n = err ? 2 : 1;       /* streamed: may it go again, or was it cut */
    if (err && q->streamed && ++n)
      lua_pushboolean(L, q->gone ? q->cut : !q->taken);
    if (lua_pcall(L, n, 0, -2 - n) != LUA_OK)
      lnr_log_error(L, "netrun.http: a request's callback failed");
  } else {
    lua_getfield(L, -1, err ? "try_failure" : "try_success");
    lua_insert(L, -2);
    lua_pushvalue(L, res);
    if (lua_pcall(L, 2, 0, -4) != LUA_OK)
      lnr_log_error(L, "netrun.http: a request's future");
  }
  /* kept for the pool's next request (nothing refers to a settled one:
   * it left every list and its connection), or let go */
  hpool_t *P = q->pool;
  if (P->nspare < (int)(sizeof P->spare / sizeof P->spare[0]) &&
      P->self_ref != LUA_NOREF) {
    for (int i = 1; i <= UV_N; i++) {
      lua_pushnil(L);
      lua_setiuservalue(L, u, i);
    }
    P->spare[P->nspare++] = q;
  } else {
    luaL_unref(L, LUA_REGISTRYINDEX, q->ref);
    q->ref = LUA_NOREF;
  }
  lua_settop(L, u - (err ? 1 : 2));
}

static void fail(lua_State *L, hreq_t *q, const char *err) {
  if (!q->done)
    settle(L, q, err);
}

/* Send q on c (idle or new, not dead): true when written (or failed
 * writing: exception_caught closes c, and its inactive fails q); false
 * when a field of q cannot be sent -- q failed, nothing written, c still
 * free unless q's callback took or closed it meanwhile. */
static bool start(lua_State *L, hconn_t *c, hreq_t *q) {
  if (q->x != NULL && c->h2) {
    fail(L, q, "a streamed exchange needs HTTP/1.1 to the backend");
    return false;
  }
  q->conn = c;
  if (c->h2) {
    q->seq = ++c->pool->seq;
    flight_push(c, q);
  } else {
    c->req = q;
  }
  c->reused = c->used;
  c->used = true;
  push_req(L, q);
  char err[200];
  nr_ctx_t *ctx = c->ctx;
  int rc = lnr_http_write_call(L, lua_gettop(L), ctx, q->seq, err, sizeof err);
  lua_pop(L, 1);
  if (rc == 1) {
    if (c->h2 && q->conn == c)
      flight_remove(c, q);
    c->req = NULL;
    q->conn = NULL;
    char msg[sizeof err + 32];
    snprintf(msg, sizeof msg, "http_client request: %s", err);
    fail(L, q, msg);
    return false;
  }
  nr_ctx_flush(ctx);
  const char *why = q->x != NULL && q->conn == c ? lnr_xfer_start(q->x, c) : NULL;
  if (why != NULL) {
    c->req = NULL;
    q->conn = NULL;
    c->dead = true;
    nr_ctx_close(ctx, NULL);         /* (its head went: not reusable) */
    fail(L, q, why);
  }
  return true;
}

static bool free_conn(const hconn_t *c) {
  return c->pool && !c->dead && !c->idle && c->req == NULL &&
         (!c->h2 || has_room(c));
}

/* A connection is free (its response came, it is new, or a request could
 * not be sent on it): to the first request waiting, or idle. An HTTP/2
 * one takes waiting requests while it has room, and is idle with none in
 * flight. */
void lnr_pool_release(lua_State *L, hconn_t *c) {
  hpool_t *P = c->pool;
  while (P->whead && free_conn(c)) {
    hreq_t *q = P->whead;
    wait_remove(P, q);
    if (start(L, c, q) && !c->h2)
      return;
  }
  if (c->pool != P || c->dead || c->idle || c->req != NULL ||
      c->nflight > 0 || c->goaway)
    return;                            /* (HTTP/2: streams still in flight) */
  if (P->retired) {                  /* made under settings since changed */
    c->dead = true;
    nr_ctx_close(c->ctx, NULL);      /* (inactive: gone) */
    return;
  }
  idle_push(P, c);
  arm_sweeper(P, P->keepalive);
}

/* Ask http.lua for a connection (counted in total and connecting before:
 * its outcome may come at once). tls and the time left: the request q's. */
static void open_connection(lua_State *L, hpool_t *P, hreq_t *q) {
  P->total++;
  P->connecting++;
  lua_rawgeti(L, LUA_REGISTRYINDEX, P->connect_ref);
  lua_rawgeti(L, LUA_REGISTRYINDEX, P->self_ref);
  push_req(L, q);
  lua_getiuservalue(L, -1, UV_TLS);
  lua_remove(L, -2);
  if (q->deadline) {
    uint64_t now = nr_now();
    lua_pushnumber(L, q->deadline > now ? secs(q->deadline - now) : 0.001);
  } else {
    lua_pushnil(L);
  }
  if (lnr_pcall(L, 3, 1) != LUA_OK) {
    lua_pushfstring(L, "connect: %s", lua_tostring(L, -1));
    lua_remove(L, -2);
  }
  if (lua_type(L, -1) == LUA_TSTRING) {   /* could not even start */
    P->total--;
    P->connecting--;
    hreq_t *w = P->whead;
    if (w) {
      wait_remove(P, w);
      fail(L, w, lua_tostring(L, -1));
    }
  }
  lua_pop(L, 1);
}

void lnr_pool_acquire(lua_State *L, hpool_t *P, hreq_t *q) {
  hconn_t *c = P->h2c;
  if (c && has_room(c)) {            /* HTTP/2: multiplexed on it */
    idle_remove(P, c);
    if (!start(L, c, q) && free_conn(c))
      lnr_pool_release(L, c);
    return;
  }
  c = P->idle;
  if (c) {
    idle_remove(P, c);
    if (!start(L, c, q) && free_conn(c))
      lnr_pool_release(L, c);
    return;
  }
  if ((P->h2c && !P->h2c->goaway) ||  /* full: wait for a stream of it */
      (P->maybe_h2 && !P->h1_seen && P->connecting > 0)) {  /* or for the
                                           connection opening: HTTP/2? */
    wait_push(P, q, q->retried);
    return;
  }
  /* waiting: beyond those the connections being opened will take, when
   * no other may be opened (a retry was let in before) */
  if (P->total >= P->max && P->nwait - P->connecting >= P->max_wait &&
      !q->retried) {
    char msg[96];
    snprintf(msg, sizeof msg, "no connection free and %d requests waiting "
             "(max_waiting)", P->nwait - P->connecting);
    fail(L, q, msg);
    return;
  }
  wait_push(P, q, q->retried);       /* a retried one goes first, as its
                                        deadline is earliest */
  if (P->total < P->max)
    open_connection(L, P, q);
}

/* Requests waiting beyond the connections being opened get some. */
void lnr_pool_lost(lua_State *L, hpool_t *P) {
  if (P->h2c != NULL || (P->maybe_h2 && !P->h1_seen && P->connecting > 0))
    return;                  /* (they wait for a stream, or for HTTP/2) */
  while (P->nwait > P->connecting && P->total < P->max && P->self_ref != LUA_NOREF) {
    hreq_t *q = P->whead;
    for (int i = 0; i < P->connecting && q; i++)
      q = q->wnext;
    if (q == NULL)
      break;
    open_connection(L, P, q);
  }
}

static void fail_request(lua_State *L, hreq_t *q, const char *err, bool retry) {
  if (q->done)
    return;
  if (retry && !q->retried) {
    push_req(L, q);
    push_method(L, lua_gettop(L));
    bool again = lua_type(L, -1) == LUA_TSTRING && idempotent(lua_tostring(L, -1));
    lua_pop(L, 2);
    if (again) {
      q->retried = true;
      q->conn = NULL;
      lnr_pool_acquire(L, q->pool, q);
      return;
    }
  }
  fail(L, q, err);
}

/* The first request waiting fails with msg (a connect that failed). */
void lnr_pool_fail_first(lua_State *L, hpool_t *P, const char *msg) {
  hreq_t *q = P->whead;
  if (q) {
    wait_remove(P, q);
    fail(L, q, msg);
  }
}

/* A ready connection is gone: no longer counted. */
void lnr_pool_conn_gone(lua_State *L, hconn_t *c) {
  hpool_t *P = c->pool;
  idle_remove(P, c);
  if (P->h2c == c)
    P->h2c = NULL;
  if (c->ready && !c->gone) {      /* (one not ready yet stays known to
                                        the pool: connected counts it) */
    c->gone = true;
    P->total--;
    all_remove(P, c);
    c->pool = NULL;
    lnr_pool_lost(L, P);
  }
}

/* ---- streamed exchanges (lhttp_xfer.c) ------------------------------------------ */

void lnr_pool_xfer_end(hreq_t *q, bool keep, const char *err) {
  hpool_t *P = q->pool;
  hconn_t *c = q->conn != NULL && q->conn->req == q ? q->conn : NULL;
  if (c != NULL) {
    c->req = NULL;
    q->conn = NULL;
  }
  lua_State *L = P ? state_of(P) : NULL;
  bool reuse = c != NULL && keep && err == NULL && L != NULL && c->pool != NULL;
  if (c != NULL && !reuse) {
    c->dead = true;                  /* closed by the exchange as it goes */
    c = NULL;                        /* (and maybe freed meanwhile) */
  }
  hxfer_t *x = q->x;                 /* freed first: c may go to another */
  q->x = NULL;
  if (x != NULL)
    lnr_xfer_free(x, err, reuse);
  if (L == NULL || q->done)
    return;
  lnr_pool_enter(P);
  wait_remove(P, q);
  if (c != NULL)
    lnr_pool_release(L, c);
  if (err != NULL) {
    fail(L, q, err);
  } else {
    lua_pushboolean(L, 1);
    settle(L, q, NULL);
  }
  lnr_pool_leave(L, P);
}

void lnr_pool_xfer_retime(hreq_t *q) {
  if (!q->timed || q->timeout <= 0 || q->timeout >= 1e9)
    return;
  deadline_remove(q->pool, q);
  q->deadline = nr_now() + (uint64_t)(q->timeout * 1e9);
  lnr_pool_deadline_insert(q->pool, q);
}

void lnr_pool_xfer_gone(hreq_t *q) { q->gone = true; }

void lnr_pool_xfer_detach(hreq_t *q) {
  hconn_t *c = q->conn;
  if (c == NULL || c->req != q)
    return;
  c->req = NULL;
  q->conn = NULL;
  c->upgraded = true;
  hpool_t *P = c->pool;
  lua_State *L = P ? state_of(P) : NULL;
  if (L != NULL) {
    lnr_pool_enter(P);
    lnr_pool_conn_gone(L, c);
    lnr_pool_leave(L, P);
  }
  c->pool = NULL;
}

/* ---- TLS settings that changed ----------------------------------------------------- */

/* The pool's TLS config was reloaded with other settings (another
 * identity): its connections were made under the old ones, so it takes no
 * more requests -- http.lua gives its key a new pool -- its idle
 * connections close now, and busy ones once no request that came before
 * the reload waits for them (release). */
bool lnr_pool_reloaded(lua_State *L, hpool_t *P) {
  unsigned g = nr_tls_config_generation(P->tls);
  char id[NR_TLS_ID_LEN + 1];
  nr_tls_config_identity(P->tls, id);       /* (read after g: at least as new) */
  if (memcmp(id, P->tls_id, sizeof id) == 0) {
    P->tls_gen = g;                          /* rebuilt alike: nothing changed */
    return false;
  }
  lnr_pool_enter(P);
  P->retired = true;
  for (hconn_t *c; (c = P->idle) != NULL;) {
    idle_remove(P, c);
    c->dead = true;
    nr_ctx_close(c->ctx, NULL);
  }
  lnr_pool_leave(L, P);
  return true;
}

/* ---- timers' work ------------------------------------------------------------------ */

static lua_State *state_of(hpool_t *P) {
  return P->S && !P->S->closing ? P->S->L : NULL;
}

/* A timer of P's ran: its handle let go; the state to work in (entered),
 * or NULL when it is closing. */
static lua_State *timer_ran(hpool_t *P, nr_timer_t **t) {
  nr_timer_release(*t);
  *t = NULL;
  lua_State *L = state_of(P);
  if (L)
    lnr_pool_enter(P);
  return L;
}

static int on_deadline(void *arg) {
  hpool_t *P = arg;
  lua_State *L = timer_ran(P, &P->dtimer);
  if (L == NULL)
    return 0;
  uint64_t now = nr_now();
  while (P->dhead && P->dhead->deadline <= now) {
    hreq_t *q = P->dhead;
    deadline_remove(P, q);
    wait_remove(P, q);
    hconn_t *c = q->conn;
    if (c && c->h2) {                /* its stream reset, the connection kept */
      flight_remove(c, q);
      q->conn = NULL;
      nr_http_call_t cancel = {.type = NR_MSG_HTTP_CALL, .tag = q->seq,
                               .cancel = true};
      nr_ctx_write(c->ctx, &cancel, NULL);
      if (c->pool)
        lnr_pool_release(L, c);
    } else if (c && c->req == q) {   /* its answer may still come: dropped */
      c->req = NULL;
      q->conn = NULL;
      c->dead = true;
      nr_ctx_close(c->ctx, NULL);
    }
    char msg[64];
    snprintf(msg, sizeof msg, "timeout after %g s", q->timeout);
    fail(L, q, msg);
  }
  arm_deadline(P);
  lnr_pool_leave(L, P);
  return 0;
}

static int on_sweep(void *arg) {
  hpool_t *P = arg;
  lua_State *L = timer_ran(P, &P->sweeper);
  if (L == NULL)
    return 0;
  uint64_t now = nr_now();
  for (hconn_t *c = P->idle; c;) {
    if (now - c->since < P->keepalive) {
      c = c->inext;
      continue;
    }
    idle_remove(P, c);
    c->dead = true;
    nr_ctx_close(c->ctx, NULL);      /* (inactive: gone) */
    c = P->idle;                     /* (the list may have changed) */
  }
  arm_sweeper(P, P->keepalive / 2 + 10000000);
  lnr_pool_leave(L, P);
  return 0;
}

/* ---- the connection handler -------------------------------------------------------- */

static void h_added(nr_ctx_t *ctx) {
  hconn_t *c = nr_ctx_state(ctx);
  c->ctx = ctx;
}

static int h2_reply(nr_ctx_t *ctx, hconn_t *c, hpool_t *P, lua_State *L,
                    const nr_http_reply_t *r);

static int h_channel_read(nr_ctx_t *ctx, void *msg) {
  hconn_t *c = nr_ctx_state(ctx);
  if (c->upgraded) {                 /* a tunnel's bytes */
    nr_ctx_fire_read(ctx, msg);
    return 0;
  }
  hpool_t *P = c->pool;
  lua_State *L = P ? state_of(P) : NULL;
  if (L == NULL)
    return 0;
  if (nr_msg_type(msg) != NR_MSG_HTTP_REPLY) {
    if (c->req != NULL && c->req->x != NULL) {   /* its body's pieces */
      lnr_pool_enter(P);
      lnr_xfer_read(c->req->x, msg);
      lnr_pool_leave(L, P);
    }
    return 0;
  }
  const nr_http_reply_t *r = msg;
  if (r->h2)
    return h2_reply(ctx, c, P, L, r);
  hreq_t *q = c->req;
  if (q != NULL && q->x != NULL) {   /* a streamed exchange's */
    lnr_pool_enter(P);
    lnr_xfer_read(q->x, msg);
    lnr_pool_leave(L, P);
    return 0;
  }
  if (q == NULL) {                   /* nobody asked: a handler someone added */
    c->dead = true;
    nr_ctx_close(ctx, NULL);
    return 0;
  }
  lnr_pool_enter(P);
  if (!q->done)                      /* (borrowed: made a value before the */
    lnr_push_msg(L, msg);            /* close below ends the codec's input) */
  c->req = NULL;
  q->conn = NULL;
  if (!r->keep_alive) {
    c->dead = true;
    nr_ctx_close(ctx, NULL);         /* (inactive: gone) */
  } else {
    lnr_pool_release(L, c);
  }
  if (!q->done)
    settle(L, q, NULL);
  lnr_pool_leave(L, P);
  return 0;
}

/* An HTTP/2 reply: to its request by tag; its stream free for the next.
 * A stream the server refused (or left past its GOAWAY) is sent again,
 * once, elsewhere; another failure fails its request. */
static int h2_reply(nr_ctx_t *ctx, hconn_t *c, hpool_t *P, lua_State *L,
                    const nr_http_reply_t *r) {
  hreq_t *q = c->flight;
  while (q && q->seq != r->tag)
    q = q->fnext;
  if (q == NULL)
    return 0;                        /* (a request that timed out) */
  lnr_pool_enter(P);
  flight_remove(c, q);
  q->conn = NULL;
  if (r->error == NULL && !q->done)
    lnr_push_msg(L, (void *)r);      /* (borrowed: a value before we go on) */
  lnr_pool_release(L, c);
  if (r->error != NULL)
    fail_request(L, q, r->error, r->retry);
  else if (!q->done)
    settle(L, q, NULL);
  lnr_pool_leave(L, P);
  (void)ctx;
  return 0;
}

/* The codec speaks HTTP/2, or its server's limit or GOAWAY changed. */
static int h_user_event(nr_ctx_t *ctx, void *evt) {
  hconn_t *c = nr_ctx_state(ctx);
  hpool_t *P = c->pool;
  if (nr_msg_type(evt) != NR_MSG_H2_STATE || P == NULL) {
    nr_ctx_fire_user_event(ctx, evt);
    return 0;
  }
  const nr_h2_state_t *e = evt;
  c->h2 = true;
  c->max_streams = e->max_streams == 0 ? 1
                   : e->max_streams > 1000 ? 1000 : e->max_streams;
  c->goaway = e->goaway;
  if (c->goaway) {
    if (P->h2c == c)
      P->h2c = NULL;                 /* new requests: another connection */
    idle_remove(P, c);
  } else if (P->h2c == NULL) {
    P->h2c = c;
  }
  lua_State *L = state_of(P);
  if (L != NULL && c->ready) {       /* (before connected: it releases c) */
    lnr_pool_enter(P);
    if (!c->goaway)
      lnr_pool_release(L, c);
    lnr_pool_lost(L, P);
    lnr_pool_leave(L, P);
  }
  return 0;
}

static int h_exception(nr_ctx_t *ctx, const nr_err_t *err) {
  hconn_t *c = nr_ctx_state(ctx);
  if (c->err[0] == '\0')
    snprintf(c->err, sizeof c->err, "%s", err->msg ? err->msg : "error");
  c->dead = true;
  nr_ctx_close(ctx, NULL);
  return 0;
}

/* Gone: a request in flight fails (or, if the server closed a reused
 * connection before answering, is sent again when idempotent). */
static void conn_closed(hconn_t *c) {
  c->dead = true;
  hpool_t *P = c->pool;
  lua_State *L = P ? state_of(P) : NULL;
  if (L == NULL)
    return;
  lnr_pool_enter(P);
  hreq_t *q = c->req;
  c->req = NULL;
  if (q)
    q->conn = NULL;
  lnr_pool_conn_gone(L, c);
  const char *err = c->err[0] ? c->err : "the connection closed before the response";
  if (q)
    fail_request(L, q, err, c->reused && strstr(err, "closed before a response") &&
                 (q->x == NULL || lnr_xfer_may_retry(q->x)));
  while ((q = c->flight) != NULL) {  /* HTTP/2: every request in flight */
    flight_remove(c, q);
    q->conn = NULL;
    fail_request(L, q, err, false);
  }
  lnr_pool_leave(L, P);
}

/* A streamed exchange's pieces written to the client go out together. */
static int h_read_complete(nr_ctx_t *ctx) {
  hconn_t *c = nr_ctx_state(ctx);
  if (c->req != NULL && c->req->x != NULL)
    lnr_xfer_read_complete(c->req->x);
  nr_ctx_fire_read_complete(ctx);
  return 0;
}

/* A streamed exchange's body goes on when the backend drains. */
static int h_writability(nr_ctx_t *ctx) {
  hconn_t *c = nr_ctx_state(ctx);
  if (c->req != NULL && c->req->x != NULL)
    lnr_xfer_writable(c->req->x);
  nr_ctx_fire_writability_changed(ctx);
  return 0;
}

static int h_inactive(nr_ctx_t *ctx) {
  hconn_t *c = nr_ctx_state(ctx);
  conn_closed(c);
  if (c->upgraded)
    nr_ctx_fire_inactive(ctx);       /* (the tunnel's) */
  return 0;
}

static void h_removed(nr_ctx_t *ctx) {
  hconn_t *c = nr_ctx_state(ctx);
  if (c->pool && !c->gone && c->ready)
    conn_closed(c);                  /* (removed from a live channel) */
  if (c->pool) {
    idle_remove(c->pool, c);
    all_remove(c->pool, c);
  }
  free(c);
}

const nr_handler_t lnr_pool_conn_vt = {
    .type = "http_pool", .added = h_added, .removed = h_removed,
    .inactive = h_inactive, .channel_read = h_channel_read,
    .user_event = h_user_event, .exception = h_exception,
    .writability_changed = h_writability,
    .channel_read_complete = h_read_complete};

/* p:add_last("client", P): a connection of the pool. */
const nr_handler_t *lnr_pool_make_conn(lua_State *L, int idx, void **state) {
  hpool_t *P = luaL_checkudata(L, idx, POOL_CLASS);
  hconn_t *c = calloc(1, sizeof *c);
  if (c == NULL)
    luaL_error(L, POOL_CLASS ": out of memory");
  c->pool = P;
  c->anext = P->all;
  if (P->all) P->all->aprev = c;
  P->all = c;
  *state = c;
  return &lnr_pool_conn_vt;
}
