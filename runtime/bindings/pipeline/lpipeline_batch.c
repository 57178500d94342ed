/*
 * lpipeline_batch.c -- read batches: channel_read and
 * channel_read_complete of a Lua handler, the reads it takes later, and
 * those it holds while its channel is unwritable.
 *
 * Invariants: one batch per state (the pipeline module's part), owned by
 * one handler at a time; while it holds messages (n > 0) nothing else
 * reaches a Lua handler of the state before they are delivered
 * (lnr_lh_enter); while it drains, reads arriving go straight in and no
 * batch is opened or settled again (the batch's protected call is not
 * reentrant). A handler's held reads (lh_t.held, message and token pairs)
 * are delivered in order before any newer read. A read enters by one
 * path (lnr_lh_channel_read): it waits (defer_read) or is called now.
 *
 * Threads: loop thread only; the batch and its thread belong to the
 * state of the loop.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "lpipeline.h"

/* A read its producer lets wait (nr_ctx_fire_read_deferrable: the HTTP
 * codec's requests, the RESP codec's commands, a socket's last read)
 * reaching a Lua handler while its state runs nothing is converted at
 * once and kept; the read's
 * channel_read_complete then calls channel_read for each, in order, and
 * channel_read_complete itself, in one protected call -- one where there
 * were as many as the read had messages (the method lookups, the protected
 * call and its message handler are paid once per read, not per message). An
 * error skips only the message that raised it: it goes to
 * exception_caught, as from a call of its own, and the next message goes
 * on. Nothing else reaches the handler meanwhile: every Lua handler takes
 * the waiting reads first, and a handler with channel_read sees every
 * inbound event (passing on those it has no method for). When the channel
 * closes, the rest are dropped, as the producers drop what follows a
 * close; when the handler leaves its pipeline, the rest go on to the next
 * handler. BATCH_MAX bounds a batch, below the HTTP codec's limit of
 * unanswered requests.
 *
 * Writability is honoured inside a batch, as the codecs honour it between
 * the requests they parse: when an answer turns the channel unwritable
 * (a peer that pipelines and does not read), the handler gets
 * channel_read_complete at once (it flushes there) and the rest of the
 * batch is held for it (lh_t.held) until the channel is writable again,
 * in order: reads arriving meanwhile queue behind them, any other event
 * takes them first. So a batch never answers more than the channel takes
 * (with 1 MiB answers, 32 of them per read were 32 MiB). */
#define BATCH_MAX 32
#define BATCH_TOKENS LNR_BATCH_TOKENS

void lnr_batch_close(lnr_batch_t *b) {
  if (b->ctx != NULL)
    nr_ctx_release(b->ctx);    /* reads left waiting (none should be) */
  b->ctx = NULL;
}

static lnr_batch_t *batch_of(const lnr_state_t *S) {
  return &lnr_pipe_part(S)->batch;
}

static bool state_idle(lua_State *L) {
  lua_Debug ar;
  return lua_getstack(L, 0, &ar) == 0;
}

/* Fire the Lua value on top of L on from ctx, as read `token` (0: none). */
static void fire_lua(lua_State *L, nr_ctx_t *ctx, uint64_t token) {
  lnr_lmsg_t m = {NR_MSG_LUA, L, lua_gettop(L)};
  if (token != 0)
    nr_ctx_fire_read_tokened(ctx, &m, token, false);
  else
    nr_ctx_fire_read(ctx, &m);
}

/* ---- the batch: reads waiting for their read_complete -------------------- */

/* Start a batch for handler h at ctx: false if it cannot. */
static bool batch_open(lnr_state_t *S, lnr_batch_t *b, lh_t *h, nr_ctx_t *ctx) {
  if (b->Q == NULL) {
    b->Q = lua_newthread(S->L);
    b->q_ref = luaL_ref(S->L, LUA_REGISTRYINDEX);
    S->call_thread = b->Q;
  }
  if (!lua_checkstack(b->Q, BATCH_MAX + LUA_MINSTACK))
    return false;
  if (h->ctx_ref == LUA_NOREF)
    lnr_ensure_ctx(ctx);
  b->owner = h;
  b->ctx = nr_ctx_retain(ctx);
  return true;
}

/* msg, converted, waits as the batch's next message (n < BATCH_MAX). */
static void batch_add(lnr_batch_t *b, nr_ctx_t *ctx, void *msg) {
  lnr_push_msg(b->Q, msg);
  b->tokens[b->n++] = nr_ctx_read_token(ctx, msg);
}

/* The token of the batch's message i (1-based), 0 past what it records. */
static uint64_t batch_token(const lnr_batch_t *b, int i) {
  return i <= BATCH_TOKENS ? b->tokens[i - 1] : 0;
}

/* ---- delivery: one protected call for the batch -------------------------- */

/* The batch's channel_reads, from b->next on, with channel_read (1), the
 * handler (2) and its ctx table (3) on L while it has an owner: dropped
 * once the channel closed; passed on once the handler left its pipeline;
 * cut short when a read's answer turned the channel unwritable and the
 * rest may wait (b->stalled). */
static void deliver_reads(lua_State *L, lnr_state_t *S, lnr_batch_t *b) {
  nr_ctx_t *ctx = b->ctx;
  nr_channel_t *ch = nr_ctx_channel(ctx);
  const lh_t *h = b->owner;
  LNR_STACK_BEGIN(L);                  /* each read leaves it so */
  b->method = "channel_read";
  while (b->next < b->n) {
    int i = ++b->next;
    if (!nr_channel_is_open(ch)) {
      b->next = b->n;
      break;
    }
    lua_pushvalue(b->Q, i);
    if (b->owner == NULL) {
      lua_xmove(b->Q, L, 1);
      fire_lua(L, ctx, batch_token(b, i));
      lua_pop(L, 1);
      continue;
    }
    lua_pushvalue(L, 1);
    lua_pushvalue(L, 2);
    lua_pushvalue(L, 3);
    lua_xmove(b->Q, L, 1);
    S->ctx_table = h->ctx_table;       /* the current call: see check_ctx */
    S->ctx = ctx;
    S->read_ctx = ctx;                 /* restored by batch_settle */
    S->read_token = batch_token(b, i);
    nr_ctx_set_reading(ctx, S->read_token);   /* (the HTTP codec answers
                                                  it: also restored there) */
    lua_call(L, 3, 0);
    if (b->next < b->n && b->may_hold && !nr_channel_is_writable(ch)) {
      b->stalled = true;               /* read_complete now: it flushes */
      break;
    }
  }
  LNR_STACK_END(L, 0);
}

/* The batch's channel_read_complete (the handler's, its flush, or passed
 * on once it left), owed once. */
static void deliver_complete(lua_State *L, lnr_state_t *S, lnr_batch_t *b) {
  const lh_t *h = b->owner;
  b->complete = false;
  nr_ctx_set_reading(b->ctx, 0);       /* no read is being handled */
  if (h == NULL) {
    nr_ctx_fire_read_complete(b->ctx);
  } else if (h->rec->read_complete_ref == LUA_NOREF) {
    lnr_read_complete_flushing(b->ctx);
  } else {
    b->method = "channel_read_complete";
    lua_rawgeti(L, LUA_REGISTRYINDEX, h->rec->read_complete_ref);
    lua_pushvalue(L, 2);
    lua_pushvalue(L, 3);
    S->ctx_table = h->ctx_table;
    S->ctx = b->ctx;
    S->read_ctx = NULL;
    lua_call(L, 2, 0);
  }
}

/* Protected: deliver what waits, then read_complete when owed. The
 * owner's pointer is read anew after every call: a handler that leaves
 * its pipeline in one is forgotten there (lnr_batch_forget). */
static int batch_run(lua_State *L) {
  lnr_state_t *S = lnr_state(L);
  lnr_batch_t *b = batch_of(S);
  S->converting = false;               /* protected from here on */
  const lh_t *h = b->owner;
  if (h != NULL) {
    lua_rawgeti(L, LUA_REGISTRYINDEX, h->rec->read_ref);     /* 1 */
    lua_rawgeti(L, LUA_REGISTRYINDEX, h->ref);               /* 2 */
    lua_rawgeti(L, LUA_REGISTRYINDEX, h->ctx_ref);           /* 3 */
  }
  deliver_reads(L, S, b);
  if (b->complete || b->stalled)
    deliver_complete(L, S, b);
  return 0;
}

/* The error on top of L, raised by the batch's call: to the owner's
 * exception_caught (and a read's producer told, which answers for it),
 * or on down the pipeline once the owner left. */
static void batch_error(lua_State *L, lnr_batch_t *b) {
  if (b->owner == NULL) {
    nr_err_t err = {NR_EHANDLER, lua_tostring(L, -1)};
    nr_ctx_fire_exception(b->ctx, &err);
    lua_pop(L, 1);
    return;
  }
  bool read = strcmp(b->method, "channel_read") == 0;
  lnr_lh_route_error(b->ctx, L, b->method);          /* pops the message */
  if (read && batch_token(b, b->next) != 0)
    nr_ctx_read_failed(b->ctx, batch_token(b, b->next));
}

static bool batch_hold(lnr_state_t *S, lnr_batch_t *b);

/* Deliver the waiting reads (and read_complete after them if `complete`);
 * if `may_hold`, what the channel cannot take yet waits (batch_hold). An
 * error skips only the call that raised it: the next protected call goes
 * on from there. */
static void batch_settle(lnr_state_t *S, bool complete, bool may_hold) {
  lnr_batch_t *b = batch_of(S);
  lua_State *L = S->L;
  nr_ctx_t *ctx = b->ctx;
  bool converting = S->converting;     /* may be called from a handler */
  const void *read_ctx = S->read_ctx;  /* and within one's read */
  uint64_t read_token = S->read_token;
  uint64_t reading = nr_ctx_reading(ctx);
  LNR_STACK_BEGIN(L);
  S->converting = true;                /* what is made here, unprotected */
  b->draining = true;
  b->complete = complete;
  b->may_hold = may_hold;
  lua_pushcfunction(L, lnr_msgh);      /* below every call: lnr_pcall's, */
  int msgh = lua_gettop(L);            /* without moving it in and out */
  while (b->next < b->n || b->complete) {
    lua_pushcfunction(L, batch_run);
    if (lua_pcall(L, 0, 0, msgh) != LUA_OK)
      batch_error(L, b);
    S->converting = true;
    if (b->stalled) {
      b->stalled = false;
      if (batch_hold(S, b))
        break;
      b->complete = true;              /* drained already: go on */
    }
  }
  lua_pop(L, 1);                       /* msgh */
  LNR_STACK_END(L, 0);
  lua_settop(b->Q, 0);
  b->n = b->next = 0;
  b->owner = NULL;
  b->ctx = NULL;
  b->draining = false;
  S->converting = converting;
  S->read_ctx = read_ctx;
  S->read_token = read_token;
  nr_ctx_set_reading(ctx, reading);
  nr_ctx_release(ctx);
}

/* Before a handler's own reads or events go, the state's batch (another
 * handler's, or its own from an earlier read) is delivered: true when
 * ctx left its pipeline meanwhile. */
static bool settle_batch_first(lnr_state_t *S, lnr_batch_t *b, nr_ctx_t *ctx) {
  if (b->n == 0)
    return false;
  batch_settle(S, false, false);
  return nr_ctx_is_removed(ctx);
}

/* ---- holding: what waits for writability --------------------------------- */

/* The batch stalled: hold the rest for its handler while the channel is
 * still unwritable (false: it drained meanwhile, or closed, and the rest
 * goes on now). */
static bool batch_hold(lnr_state_t *S, lnr_batch_t *b) {
  lh_t *h = b->owner;
  nr_channel_t *ch = nr_ctx_channel(b->ctx);
  int k = b->n - b->next;
  if (h == NULL || nr_channel_is_writable(ch) || !nr_channel_is_open(ch))
    return false;
  if (h->held == NULL) {
    h->held = lua_newthread(S->L);
    h->held_ref = luaL_ref(S->L, LUA_REGISTRYINDEX);
  }
  if (!lua_checkstack(h->held, 2 * k + LUA_MINSTACK))
    return false;
  for (int i = b->next + 1; i <= b->n; i++) {   /* the last k, in order, */
    lua_pushvalue(b->Q, i);
    lua_xmove(b->Q, h->held, 1);
    lua_pushinteger(h->held, (lua_Integer)batch_token(b, i));  /* + token */
  }
  lua_settop(b->Q, b->next);
  b->n = b->next;
  return true;
}

/* h->held is set only while it holds reads. */
static void drop_held(lh_t *h) {
  luaL_unref(h->S->L, LUA_REGISTRYINDEX, h->held_ref);
  h->held = NULL;
}

/* A read arriving while h holds reads queues behind them: false when
 * there is no room (it is called now, after them). */
static bool hold_read(lh_t *h, nr_ctx_t *ctx, void *msg) {
  if (!lua_checkstack(h->held, 2 + LUA_MINSTACK))
    return false;
  lnr_push_msg(h->held, msg);
  lua_pushinteger(h->held, (lua_Integer)nr_ctx_read_token(ctx, msg));
  return true;
}

/* What h holds becomes the (empty) batch, h its owner: false when it
 * cannot (it stays held). */
static bool batch_take_held(lnr_state_t *S, lnr_batch_t *b, lh_t *h,
                            nr_ctx_t *ctx) {
  int k = lua_gettop(h->held) / 2;     /* message, token; ... */
  bool converting = S->converting;
  S->converting = true;                /* the batch's thread may be made */
  bool opened = batch_open(S, b, h, ctx);
  S->converting = converting;
  if (!opened)
    return false;
  if (!lua_checkstack(b->Q, k + LUA_MINSTACK)) {
    nr_ctx_release(b->ctx);
    b->owner = NULL;
    b->ctx = NULL;
    return false;
  }
  for (int i = 1; i <= k; i++) {
    lua_pushvalue(h->held, 2 * i - 1);
    lua_xmove(h->held, b->Q, 1);
    if (i <= BATCH_TOKENS)
      b->tokens[i - 1] = (uint64_t)lua_tointeger(h->held, 2 * i);
  }
  b->n = k;
  drop_held(h);
  return true;
}

/* Deliver what h holds (then read_complete) in a batch of its own, once
 * the state's batch is settled; if `may_hold`, what the channel cannot
 * take yet is held again. Not while a batch drains: the caller queues a
 * task then (unhold_later). */
static void unhold(nr_ctx_t *ctx, bool may_hold) {
  lh_t *h = nr_ctx_state(ctx);
  lnr_state_t *S = h->S;
  lnr_batch_t *b = batch_of(S);
  if (b->draining || settle_batch_first(S, b, ctx) ||
      !batch_take_held(S, b, h, ctx))
    return;
  batch_settle(S, true, may_hold);
}

static int unhold_task(void *arg) {
  nr_ctx_t *ctx = arg;
  if (!nr_ctx_is_removed(ctx)) {
    lh_t *h = nr_ctx_state(ctx);
    h->unhold_queued = false;
    if (h->held != NULL && nr_channel_is_writable(nr_ctx_channel(ctx)))
      unhold(ctx, true);
  }
  nr_ctx_release(ctx);
  return 0;
}

/* The channel is writable again: what h holds goes on, now or (inside a
 * batch, whose call cannot be entered again) from a task. */
static void unhold_later(nr_ctx_t *ctx) {
  lh_t *h = nr_ctx_state(ctx);
  if (!batch_of(h->S)->draining) {
    unhold(ctx, true);
  } else if (!h->unhold_queued) {
    h->unhold_queued = true;
    if (nr_loop_execute(nr_channel_loop(nr_ctx_channel(ctx)), unhold_task,
                        nr_ctx_retain(ctx)) < 0) {
      h->unhold_queued = false;
      nr_ctx_release(ctx);
    }
  }
}

/* A handler leaving its pipeline passes on what it holds (dropped if the
 * channel closed, as the codecs drop what follows a close). */
static void pass_held(nr_ctx_t *ctx) {
  lh_t *h = nr_ctx_state(ctx);
  lua_State *L = h->S->L, *Q = h->held;
  int k = lua_gettop(Q);                        /* message, token; ... */
  for (int i = 1; i <= k && nr_channel_is_open(nr_ctx_channel(ctx)); i += 2) {
    uint64_t token = (uint64_t)lua_tointeger(Q, i + 1);
    lua_pushvalue(Q, i);
    lua_xmove(Q, L, 1);
    fire_lua(L, ctx, token);
    lua_pop(L, 1);
  }
  drop_held(h);
}

/* ---- entry points ---------------------------------------------------------- */

/* Before anything else reaches a Lua handler, what waits is delivered:
 * the state's batch, then what the handler holds. True when ctx left its
 * pipeline meanwhile: its handler is gone, and the caller passes the
 * event on. */
static inline bool settle_first(nr_ctx_t *ctx) {
  lh_t *h = nr_ctx_state(ctx);
  lnr_batch_t *b = batch_of(h->S);
  if (b->draining)
    return false;
  if (settle_batch_first(h->S, b, ctx))
    return true;
  if (h->held != NULL) {
    unhold(ctx, false);
    return nr_ctx_is_removed(ctx);
  }
  return false;
}

bool lnr_lh_enter(nr_ctx_t *ctx, unsigned bit) {
  return !settle_first(ctx) &&
         (((const lh_t *)nr_ctx_state(ctx))->rec->has & bit);
}

bool lnr_lh_enter_writability(nr_ctx_t *ctx) {
  lh_t *h = nr_ctx_state(ctx);
  if (h->held == NULL)
    return lnr_lh_enter(ctx, NR_EV_WRITABILITY);
  if (nr_channel_is_writable(nr_ctx_channel(ctx)))
    unhold_later(ctx);
  if (nr_ctx_is_removed(ctx))
    return false;                      /* h is gone */
  return h->held != NULL ? (h->rec->has & NR_EV_WRITABILITY) != 0
                         : lnr_lh_enter(ctx, NR_EV_WRITABILITY);
}

void lnr_batch_handler_removed(nr_ctx_t *ctx) {
  lh_t *h = nr_ctx_state(ctx);
  lnr_batch_t *b = batch_of(h->S);
  if (b->n > 0 && !b->draining)
    batch_settle(h->S, false, false);
  if (h->held != NULL)
    pass_held(ctx);
}

void lnr_batch_forget(lh_t *h) {
  lnr_batch_t *b = batch_of(h->S);
  if (b->owner == h)
    b->owner = NULL;                   /* the rest of its batch goes on */
  if (h->held != NULL)
    drop_held(h);
}

int lnr_lh_channel_read_complete(nr_ctx_t *ctx) {
  lh_t *h = nr_ctx_state(ctx);
  lnr_batch_t *b = batch_of(h->S);
  if (!b->draining) {
    if (b->n > 0 && b->owner == h) {
      batch_settle(h->S, true, true);            /* with read_complete */
      return 0;
    }
    if (settle_batch_first(h->S, b, ctx)) {
      nr_ctx_fire_read_complete(ctx);
      return 0;
    }
    if (h->held != NULL) {             /* owed after what it holds: */
      if (nr_channel_is_writable(nr_ctx_channel(ctx)))
        unhold(ctx, true);             /* delivered with them */
      return 0;
    }
  }
  if (!(h->rec->has & NR_EV_READ_COMPLETE)) {
    if (h->rec->has & NR_EV_READ)
      lnr_read_complete_flushing(ctx);
    else
      nr_ctx_fire_read_complete(ctx);
    return 0;
  }
  lua_State *L = lnr_lh_begin_ref(ctx, h->rec->read_complete_ref,
                                  "channel_read_complete");
  return lnr_lh_finish(ctx, L, 0, "channel_read_complete");
}

/* A read its producer lets wait, reaching h while the state runs nothing
 * and no batch drains, waits for its read_complete: behind what h holds,
 * in h's batch, or in a new one (the state's batch, if free). False when
 * it is to be called now (lnr_lh_enter then delivers what waits first).
 * True also when h left its pipeline while what it held went: the read
 * went on. */
static bool defer_read(lh_t *h, nr_ctx_t *ctx, void *msg) {
  lnr_batch_t *b = batch_of(h->S);
  if (b->draining || !nr_ctx_read_deferrable(ctx, msg) || !state_idle(h->S->L))
    return false;
  if (h->held != NULL && nr_channel_is_writable(nr_ctx_channel(ctx))) {
    unhold(ctx, true);                 /* what the channel takes goes */
    if (nr_ctx_is_removed(ctx)) {      /* first; it may hold again */
      nr_ctx_fire_read(ctx, msg);
      return true;
    }
  }
  if (h->held != NULL)
    return hold_read(h, ctx, msg);
  if (b->owner != h && (b->n > 0 || !batch_open(h->S, b, h, ctx)))
    return false;
  batch_add(b, ctx, msg);
  if (b->n == BATCH_MAX)
    batch_settle(h->S, false, true);
  return true;
}

/* channel_read called now, in a protected call of its own. */
static int call_read(lh_t *h, nr_ctx_t *ctx, void *msg) {
  lnr_state_t *S = h->S;
  uint64_t token = nr_ctx_read_token(ctx, msg);
  lua_State *L = lnr_lh_begin_ref(ctx, h->rec->read_ref, "channel_read");
  lnr_push_msg(L, msg);
  const void *read_ctx = S->read_ctx;            /* calls nest */
  uint64_t read_token = S->read_token;
  S->read_ctx = ctx;
  S->read_token = token;
  int rc = lnr_lh_call(ctx, L, 1);
  S->read_ctx = read_ctx;
  S->read_token = read_token;
  if (rc != LUA_OK) {
    lnr_lh_route_error(ctx, L, "channel_read");         /* pops the message */
    if (token != 0)                              /* its producer answers */
      nr_ctx_read_failed(ctx, token);
  }
  lua_pop(L, 1);                                 /* msgh */
  LNR_STACK_UNMARK(S, 0);
  return 0;
}

int lnr_lh_channel_read(nr_ctx_t *ctx, void *msg) {
  lh_t *h = nr_ctx_state(ctx);
  if (defer_read(h, ctx, msg))
    return 0;
  if (!lnr_lh_enter(ctx, NR_EV_READ)) {          /* taken in order */
    nr_ctx_fire_read(ctx, msg);
    return 0;
  }
  return call_read(h, ctx, msg);
}
