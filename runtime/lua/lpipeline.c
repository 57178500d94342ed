/*
 * lpipeline.c -- Lua handlers in the C pipeline, and the ctx and pipeline
 * objects Lua sees. Loop thread only: a handler's state is the loop's.
 *
 * A Lua handler is one C vtable whose skip mask comes from the handler
 * table's methods (looked up through metatables, once per table and cached),
 * so an absent method costs nothing. Methods are called as h:method(ctx,
 * ...) in protected mode; an error goes to that same handler's
 * exception_caught (with its traceback), or on down the pipeline.
 *
 * A handler added with an executor group (p:add_last(group, name, h)) runs
 * in that executor's state instead, behind a proxy handler; see "handlers
 * on an executor group" at the end of this file.
 */
#include <stdlib.h>
#include <string.h>

#include "lnr.h"

/* What netrun learns of a handler table (or object) the first time it is
 * added in a state, shared by every channel it serves: its skip mask and
 * the two methods called per message (LUA_NOREF when absent). A userdata,
 * kept in a weak-keyed table by the handler, so it lives as long as the
 * handler does; its __gc drops the references. */
typedef struct hrec_s {
  unsigned mask;             /* what reaches it (see read batches) */
  unsigned has;              /* the methods it has */
  bool added, removed;       /* has handler_added, handler_removed */
  int read_ref, read_complete_ref;
} hrec_t;

typedef struct lh_s {
  lnr_state_t *S;
  int ref;                   /* the handler (table or object) */
  int ctx_ref;               /* the ctx table */
  const void *ctx_table;     /* its address (lua_topointer) */
  const hrec_t *rec;         /* alive while ref is */
  lua_State *held;           /* reads waiting for writability, or NULL */
  int held_ref;              /* anchors held */
  bool unhold_queued;        /* a task delivers them */
} lh_t;

typedef struct lctx_s {
  const void *tag;             /* &CTX_TAG: proves the userdata is a ctx */
  nr_ctx_t *ctx;
} lctx_t;
static const char CTX_TAG = 0;

/* Handlers on an executor group (at the end of this file). */
typedef struct xh_s xh_t;
static const nr_handler_t exec_vt;
static int xh_home_ref(const xh_t *x);

static const struct {
  const char *name;
  unsigned bit;
} methods[] = {
    {"channel_registered", NR_EV_REGISTERED},
    {"channel_unregistered", NR_EV_UNREGISTERED},
    {"channel_active", NR_EV_ACTIVE}, {"channel_inactive", NR_EV_INACTIVE},
    {"channel_read", NR_EV_READ}, {"channel_read_complete", NR_EV_READ_COMPLETE},
    {"user_event_triggered", NR_EV_USER_EVENT},
    {"channel_writability_changed", NR_EV_WRITABILITY},
    {"exception_caught", NR_EV_EXCEPTION}, {"bind", NR_OP_BIND},
    {"connect", NR_OP_CONNECT}, {"disconnect", NR_OP_DISCONNECT},
    {"close", NR_OP_CLOSE}, {"read", NR_OP_READ}, {"write", NR_OP_WRITE},
    {"flush", NR_OP_FLUSH}};

static const char RECS = 0, REC_MT = 0;   /* handler -> hrec_t, weak keys */

static int rec_gc(lua_State *L) {
  hrec_t *r = lua_touserdata(L, 1);
  luaL_unref(L, LUA_REGISTRYINDEX, r->read_ref);
  luaL_unref(L, LUA_REGISTRYINDEX, r->read_complete_ref);
  r->read_ref = r->read_complete_ref = LUA_NOREF;
  return 0;
}

/* A registry reference to the handler's method, or LUA_NOREF. */
static int method_ref(lua_State *L, int idx, const char *name) {
  lua_getfield(L, idx, name);
  if (lua_isfunction(L, -1))
    return luaL_ref(L, LUA_REGISTRYINDEX);
  lua_pop(L, 1);
  return LUA_NOREF;
}

/* The record of the handler at idx, made the first time (the skip mask
 * is computed once per handler, as Netty computes it once per class). */
static const hrec_t *handler_rec(lua_State *L, int idx) {
  idx = lua_absindex(L, idx);
  lnr_push_weak(L, &RECS, "k");
  lua_pushvalue(L, idx);
  if (lua_rawget(L, -2) == LUA_TUSERDATA) {
    const hrec_t *r = lua_touserdata(L, -1);
    lua_pop(L, 2);                    /* still referenced by the table */
    return r;
  }
  lua_pop(L, 1);
  hrec_t *r = lua_newuserdatauv(L, sizeof *r, 0);
  r->mask = 0;
  r->added = r->removed = false;
  r->read_ref = r->read_complete_ref = LUA_NOREF;
  if (lua_rawgetp(L, LUA_REGISTRYINDEX, &REC_MT) != LUA_TTABLE) {
    lua_pop(L, 1);
    lua_newtable(L);
    lua_pushcfunction(L, rec_gc);
    lua_setfield(L, -2, "__gc");
    lua_pushvalue(L, -1);
    lua_rawsetp(L, LUA_REGISTRYINDEX, &REC_MT);
  }
  lua_setmetatable(L, -2);
  for (size_t i = 0; i < sizeof methods / sizeof methods[0]; i++) {
    lua_getfield(L, idx, methods[i].name);
    if (lua_isfunction(L, -1))
      r->mask |= methods[i].bit;
    lua_pop(L, 1);
  }
  lua_getfield(L, idx, "handler_added");
  r->added = lua_isfunction(L, -1);
  lua_getfield(L, idx, "handler_removed");
  r->removed = lua_isfunction(L, -1);
  lua_pop(L, 2);
  r->read_ref = method_ref(L, idx, "channel_read");
  r->read_complete_ref = method_ref(L, idx, "channel_read_complete");
  /* A handler that may take reads later sees every inbound event, so that
   * it takes them first: it passes on those it has no method for. */
  r->has = r->mask;
  if (r->mask & NR_EV_READ)
    r->mask |= NR_EV_ALL_INBOUND;
  lua_pushvalue(L, idx);
  lua_insert(L, -2);
  lua_rawset(L, -3);                  /* recs[handler] = r */
  lua_pop(L, 1);
  return r;
}

/* ---- misspelled methods ---------------------------------------------------- */

/* A method netrun never calls is silently an absent one; a misspelled
 * event name (channel_raed, channelRead) would leave the event passing by
 * unseen. So when a handler is added, its function fields that look like
 * an event but are none are logged once, with the closest event name.
 * Each table scanned (the object and the tables its __index chain reaches)
 * is remembered in a weak set of the state, so a class whose instances are
 * made per channel is reported once per loop state, not per connection. */
static const char CHECKED = 0;          /* tables already scanned, weak keys */

static bool is_event(const char *name) {
  if (strcmp(name, "handler_added") == 0 || strcmp(name, "handler_removed") == 0)
    return true;
  for (size_t i = 0; i < sizeof methods / sizeof methods[0]; i++)
    if (strcmp(name, methods[i].name) == 0)
      return true;
  return false;
}

/* The event closest to name, and its distance; channelRead is spelled
 * channel_read first (Netty's names translated). */
static const char *closest_event(const char *name, int *dist) {
  char snake[128];
  size_t n = 0;
  for (const char *c = name; *c && n + 2 < sizeof snake; c++) {
    if (*c >= 'A' && *c <= 'Z') {
      snake[n++] = '_';
      snake[n++] = (char)(*c - 'A' + 'a');
    } else {
      snake[n++] = *c;
    }
  }
  snake[n] = '\0';
  const char *best = "handler_added";
  *dist = 64;
  for (size_t i = 0; i < sizeof methods / sizeof methods[0] + 2; i++) {
    const char *m = i < 2 ? (i ? "handler_removed" : "handler_added")
                          : methods[i - 2].name;
    int d = strcmp(snake, m) == 0 ? 0 : lnr_edit_distance(name, m);
    if (d < *dist) {
      *dist = d;
      best = m;
    }
  }
  return best;
}

/* Whether a function field of this name is likely a misspelled event:
 * an event's prefix, or close to one of the long names (short ones --
 * read, write, bind -- are too like ordinary verbs to guess at). */
static const char *misspelled_event(const char *name) {
  static const char *const prefixes[] = {"channel_", "handler_", "user_",
                                         "exception"};
  if (is_event(name))
    return NULL;
  int d;
  const char *best = closest_event(name, &d);
  if (d == 0)
    return best;
  for (size_t i = 0; i < sizeof prefixes / sizeof prefixes[0]; i++)
    if (strncmp(name, prefixes[i], strlen(prefixes[i])) == 0)
      return best;
  return d <= 2 && strlen(name) >= 6 && strlen(best) >= 8 ? best : NULL;
}

/* Warn about the misspelled events among the function fields of the
 * table at t (not scanned before in this state). */
static void check_table(lua_State *L, int t, const char *handler) {
  lnr_push_weak(L, &CHECKED, "k");
  lua_pushvalue(L, t);
  bool seen = lua_rawget(L, -2) != LUA_TNIL;
  lua_pop(L, 1);
  if (seen) {
    lua_pop(L, 1);
    return;
  }
  lua_pushvalue(L, t);
  lua_pushboolean(L, 1);
  lua_rawset(L, -3);
  lua_pop(L, 1);
  lua_pushnil(L);
  while (lua_next(L, t)) {
    const char *best;
    if (lua_type(L, -2) == LUA_TSTRING && lua_isfunction(L, -1) &&
        (best = misspelled_event(lua_tostring(L, -2))) != NULL)
      nr_log(NR_LOG_WARN, "handler '%s': method '%s' is not a netrun event "
             "and is never called (did you mean %s?)", handler,
             lua_tostring(L, -2), best);
    lua_pop(L, 1);
  }
}

/* The handler at idx and the tables its metatables' __index lead to. */
static void check_method_names(lua_State *L, int idx, const char *handler) {
  lua_pushvalue(L, idx);
  for (int depth = 0; depth < 8 && lua_istable(L, -1); depth++) {
    check_table(L, lua_gettop(L), handler);
    if (!lua_getmetatable(L, -1))
      break;
    lua_pushliteral(L, "__index");            /* as Lua reads it: raw */
    lua_rawget(L, -2);                        /* obj, mt, __index */
    lua_remove(L, -2);
    lua_remove(L, -2);
  }
  lua_pop(L, 1);
}

/* ---- calling handler methods ------------------------------------------------ */

static void ensure_ctx(nr_ctx_t *ctx);

/* Push the message handler, the method, self and ctx, in that order (no
 * stack rotation: this runs twice per message); returns the state. */
static lua_State *begin(nr_ctx_t *ctx, const char *method) {
  lh_t *h = nr_ctx_state(ctx);
  lua_State *L = h->S->L;
  LNR_STACK_MARK(h->S);                          /* checked as it ends */
  h->S->converting = true;                       /* until call() */
  if (h->ctx_ref == LUA_NOREF)
    ensure_ctx(ctx);
  h->S->ctx_table = h->ctx_table;                /* see check_ctx */
  h->S->ctx = ctx;
  lua_pushcfunction(L, lnr_msgh);
  lua_pushnil(L);                                /* the method goes here */
  lua_rawgeti(L, LUA_REGISTRYINDEX, h->ref);
  lua_getfield(L, -1, method);
  lua_replace(L, -3);                            /* msgh method self */
  lua_rawgeti(L, LUA_REGISTRYINDEX, h->ctx_ref);
  return L;
}

/* begin for a method looked up when the handler was added. */
static lua_State *begin_ref(nr_ctx_t *ctx, int fn_ref, const char *method) {
  lh_t *h = nr_ctx_state(ctx);
  lua_State *L = h->S->L;
  if (fn_ref == LUA_NOREF || h->ctx_ref == LUA_NOREF)
    return begin(ctx, method);
  LNR_STACK_MARK(h->S);
  h->S->converting = true;                       /* until call() */
  h->S->ctx_table = h->ctx_table;
  h->S->ctx = ctx;
  lua_pushcfunction(L, lnr_msgh);
  lua_rawgeti(L, LUA_REGISTRYINDEX, fn_ref);
  lua_rawgeti(L, LUA_REGISTRYINDEX, h->ref);
  lua_rawgeti(L, LUA_REGISTRYINDEX, h->ctx_ref);
  return L;
}

/* Call what begin pushed plus nargs arguments; the message handler stays
 * below (counted from the top: no lua_gettop): on error the message is on
 * top of it. The arguments are made: from here on, what the call
 * allocates counts against the state's memory limit. */
static int call(nr_ctx_t *ctx, lua_State *L, int nargs) {
  ((lh_t *)nr_ctx_state(ctx))->S->converting = false;
  return lua_pcall(L, nargs + 2, 0, -(nargs + 4));
}

static void route_error(nr_ctx_t *ctx, lua_State *L, const char *method) {
  const char *msg = lua_tostring(L, -1);
  if (msg == NULL)
    msg = "(error object is not a string)";
  if (strcmp(method, "exception_caught") != 0 &&
      (nr_handler_mask(nr_ctx_handler(ctx)) & NR_EV_EXCEPTION)) {
    lh_t *h = nr_ctx_state(ctx);
    lua_rawgeti(L, LUA_REGISTRYINDEX, h->ref);
    lua_getfield(L, -1, "exception_caught");
    bool has = lua_isfunction(L, -1);
    lua_pop(L, 2);
    if (has) {
      begin(ctx, "exception_caught");
      lua_pushstring(L, msg);
      if (call(ctx, L, 1) != LUA_OK)
        lnr_log_error(L, "exception_caught raised");
      lua_pop(L, 2);                             /* msgh, message */
      LNR_STACK_UNMARK(h->S, -1);                /* the message is gone */
      return;
    }
  }
  if (strcmp(method, "exception_caught") == 0) {
    nr_log(NR_LOG_WARN, "exception_caught of handler '%s' raised: %s",
           nr_ctx_name(ctx), msg);
  } else {
    nr_err_t err = {NR_EHANDLER, msg};
    nr_ctx_fire_exception(ctx, &err);
  }
  lua_pop(L, 1);
}

static int finish(nr_ctx_t *ctx, lua_State *L, int nargs, const char *method) {
  if (call(ctx, L, nargs) != LUA_OK)
    route_error(ctx, L, method);                 /* pops the message */
  lua_pop(L, 1);                                 /* msgh */
  LNR_STACK_UNMARK(((lh_t *)nr_ctx_state(ctx))->S, 0);
  return 0;
}

/* ---- read batches -------------------------------------------------------------- */

/* The end of a read at a handler with channel_read but no
 * channel_read_complete: what it wrote (or anyone before it) and did not
 * flush is flushed, then the event goes on. Netty leaves such writes
 * unsent until some later flush, and the peer waits forever; a handler
 * that wants to gather writes across reads flushes in its own
 * channel_read_complete, which turns this off. */
static void read_complete_flushing(nr_ctx_t *ctx) {
  nr_channel_t *ch = nr_ctx_channel(ctx);
  if (nr_channel_is_open(ch) && nr_channel_has_unflushed(ch))
    nr_ctx_flush(ctx);
  nr_ctx_fire_read_complete(ctx);
}

/* A read its producer lets wait (nr_ctx_fire_read_deferrable: the HTTP
 * codec's requests, the RESP codec's commands, a socket's last read) reaching a Lua handler while its
 * state runs nothing is converted at once and kept; the read's
 * channel_read_complete then calls channel_read for each, in order, and
 * channel_read_complete itself, in one protected call -- one where there
 * were as many as the read had messages (the method lookups, the protected
 * call and the message handler are a third of what a request costs). An
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
#define BATCH_MAX LNR_BATCH_MAX

static bool state_idle(lua_State *L) {
  lua_Debug ar;
  return lua_getstack(L, 0, &ar) == 0;
}

/* Start a batch for handler h at ctx: false if it cannot. */
static bool batch_open(lnr_state_t *S, lh_t *h, nr_ctx_t *ctx) {
  lnr_batch_t *b = &S->batch;
  if (b->Q == NULL) {
    b->Q = lua_newthread(S->L);
    b->q_ref = luaL_ref(S->L, LUA_REGISTRYINDEX);
  }
  if (!lua_checkstack(b->Q, BATCH_MAX + LUA_MINSTACK))
    return false;
  if (h->ctx_ref == LUA_NOREF)
    ensure_ctx(ctx);
  b->owner = h;
  b->ctx = nr_ctx_retain(ctx);
  return true;
}

/* Protected: deliver what waits, from b->next on. */
static int batch_run(lua_State *L) {
  lnr_state_t *S = lnr_state(L);
  lnr_batch_t *b = &S->batch;
  S->converting = false;               /* protected from here on */
  nr_ctx_t *ctx = b->ctx;
  nr_channel_t *ch = nr_ctx_channel(ctx);
  lh_t *h = b->owner;
  if (h != NULL) {
    lua_rawgeti(L, LUA_REGISTRYINDEX, h->rec->read_ref);     /* 1 */
    lua_rawgeti(L, LUA_REGISTRYINDEX, h->ref);               /* 2 */
    lua_rawgeti(L, LUA_REGISTRYINDEX, h->ctx_ref);           /* 3 */
  }
  LNR_STACK_BEGIN(L);                  /* each read leaves it so */
  b->method = "channel_read";
  while (b->next < b->n) {
    int i = ++b->next;
    if (!nr_channel_is_open(ch)) {
      b->next = b->n;                  /* closed: the rest is dropped */
      break;
    }
    lua_pushvalue(b->Q, i);
    if (b->owner == NULL) {            /* removed: the rest goes on */
      lua_xmove(b->Q, L, 1);
      lnr_lmsg_t m = {NR_MSG_LUA, L, lua_gettop(L)};
      nr_ctx_fire_read(ctx, &m);
      lua_pop(L, 1);
      continue;
    }
    lua_pushvalue(L, 1);
    lua_pushvalue(L, 2);
    lua_pushvalue(L, 3);
    lua_xmove(b->Q, L, 1);
    S->ctx_table = h->ctx_table;                  /* see check_ctx */
    S->ctx = ctx;
    lua_call(L, 3, 0);
    if (b->next < b->n && b->may_hold && !nr_channel_is_writable(ch)) {
      b->stalled = true;                /* read_complete now: it flushes */
      break;
    }
  }
  LNR_STACK_END(L, 0);
  if (b->complete || b->stalled) {
    b->complete = false;
    if (b->owner != NULL && h->rec->read_complete_ref != LUA_NOREF) {
      b->method = "channel_read_complete";
      lua_rawgeti(L, LUA_REGISTRYINDEX, h->rec->read_complete_ref);
      lua_pushvalue(L, 2);
      lua_pushvalue(L, 3);
      S->ctx_table = h->ctx_table;
      S->ctx = ctx;
      lua_call(L, 2, 0);
    } else if (b->owner != NULL) {
      read_complete_flushing(ctx);
    } else {
      nr_ctx_fire_read_complete(ctx);
    }
  }
  return 0;
}

/* The token of the batch's message i (1-based), 0 past what it records. */
static uint64_t batch_token(const lnr_batch_t *b, int i) {
  return i <= LNR_BATCH_TOKENS ? b->tokens[i - 1] : 0;
}

/* The batch stalled: hold the rest for its handler while the channel is
 * still unwritable (false: it drained meanwhile, or closed, and the rest
 * goes on now). */
static bool batch_hold(lnr_state_t *S) {
  lnr_batch_t *b = &S->batch;
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

/* Deliver the waiting reads (and read_complete after them if `complete`);
 * if `may_hold`, what the channel cannot take yet waits (batch_hold). */
static void batch_settle(lnr_state_t *S, bool complete, bool may_hold) {
  lnr_batch_t *b = &S->batch;
  lua_State *L = S->L;
  nr_ctx_t *ctx = b->ctx;
  bool converting = S->converting;     /* may be called from a handler */
  LNR_STACK_BEGIN(L);
  S->converting = true;                /* what is made here, unprotected */
  b->draining = true;
  b->complete = complete;
  b->may_hold = may_hold;
  while (b->next < b->n || b->complete) {
    lua_pushcfunction(L, lnr_msgh);
    lua_pushcfunction(L, batch_run);
    if (lua_pcall(L, 0, 0, -2) != LUA_OK) {
      if (b->owner != NULL) {
        bool read = strcmp(b->method, "channel_read") == 0;
        route_error(ctx, L, b->method);          /* pops the message */
        if (read && batch_token(b, b->next) != 0)
          nr_ctx_read_failed(ctx, batch_token(b, b->next));
      } else {
        nr_err_t err = {NR_EHANDLER, lua_tostring(L, -1)};
        nr_ctx_fire_exception(ctx, &err);
        lua_pop(L, 1);
      }
    }
    lua_pop(L, 1);                               /* msgh */
    S->converting = true;
    if (b->stalled) {
      b->stalled = false;
      if (batch_hold(S))
        break;
      b->complete = true;              /* drained already: go on */
    }
  }
  LNR_STACK_END(L, 0);
  lua_settop(b->Q, 0);
  b->n = b->next = 0;
  b->owner = NULL;
  b->ctx = NULL;
  b->draining = false;
  S->converting = converting;
  nr_ctx_release(ctx);
}

static void unhold(nr_ctx_t *ctx, bool may_hold);

/* h->held is set only while it holds reads. */
static void drop_held(lh_t *h) {
  luaL_unref(h->S->L, LUA_REGISTRYINDEX, h->held_ref);
  h->held = NULL;
}

/* Before anything else reaches a Lua handler, what waits is delivered:
 * the state's batch, then what the handler holds. True when ctx left its
 * pipeline meanwhile: its handler is gone, and the caller passes the
 * event on. */
static bool settle_first(nr_ctx_t *ctx) {
  lh_t *h = nr_ctx_state(ctx);
  lnr_batch_t *b = &h->S->batch;
  if (b->draining)
    return false;
  if (b->n > 0) {
    batch_settle(h->S, false, false);
    if (nr_ctx_is_removed(ctx))
      return true;
  }
  if (h->held != NULL) {
    unhold(ctx, false);
    return nr_ctx_is_removed(ctx);
  }
  return false;
}

/* Deliver what h holds (then read_complete) in a batch of its own, once
 * the state's batch is settled; if `may_hold`, what the channel cannot
 * take yet is held again. Not while a batch drains: the caller queues a
 * task then (unhold_later). */
static void unhold(nr_ctx_t *ctx, bool may_hold) {
  lh_t *h = nr_ctx_state(ctx);
  lnr_state_t *S = h->S;
  lnr_batch_t *b = &S->batch;
  if (b->draining)
    return;
  if (b->n > 0) {
    batch_settle(S, false, false);
    if (nr_ctx_is_removed(ctx))
      return;
  }
  int k = lua_gettop(h->held) / 2;     /* message, token; ... */
  bool converting = S->converting;
  S->converting = true;                /* the batch's thread may be made */
  bool opened = batch_open(S, h, ctx);
  S->converting = converting;
  if (!opened)
    return;
  if (!lua_checkstack(b->Q, k + LUA_MINSTACK)) {   /* keep holding */
    nr_ctx_release(b->ctx);
    b->owner = NULL;
    b->ctx = NULL;
    return;
  }
  for (int i = 1; i <= k; i++) {
    lua_pushvalue(h->held, 2 * i - 1);
    lua_xmove(h->held, b->Q, 1);
    if (i <= LNR_BATCH_TOKENS)
      b->tokens[i - 1] = (uint64_t)lua_tointeger(h->held, 2 * i);
  }
  b->n = k;
  drop_held(h);
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
  if (!h->S->batch.draining) {
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

/* ---- inbound events ---------------------------------------------------------------- */

/* Whether an inbound event (bit) at ctx goes on past its Lua handler: the
 * handler left during settle_first, or has no method for it. */
static bool passes_on(nr_ctx_t *ctx, unsigned bit) {
  return settle_first(ctx) ||
         !(((const lh_t *)nr_ctx_state(ctx))->rec->has & bit);
}

#define INBOUND0(cname, method, bit, fire)                                  \
  static int cname(nr_ctx_t *ctx) {                                         \
    if (passes_on(ctx, (bit))) {                                            \
      fire(ctx);                                                            \
      return 0;                                                             \
    }                                                                       \
    lua_State *L = begin(ctx, method);                                      \
    return finish(ctx, L, 0, method);                                       \
  }
INBOUND0(lh_registered, "channel_registered", NR_EV_REGISTERED,
         nr_ctx_fire_registered)
INBOUND0(lh_unregistered, "channel_unregistered", NR_EV_UNREGISTERED,
         nr_ctx_fire_unregistered)
INBOUND0(lh_active, "channel_active", NR_EV_ACTIVE, nr_ctx_fire_active)
INBOUND0(lh_inactive, "channel_inactive", NR_EV_INACTIVE, nr_ctx_fire_inactive)

/* Writable again: what the handler holds goes on first. */
static int lh_writability(nr_ctx_t *ctx) {
  lh_t *h = nr_ctx_state(ctx);
  if (h->held != NULL) {
    if (nr_channel_is_writable(nr_ctx_channel(ctx)))
      unhold_later(ctx);
    if (nr_ctx_is_removed(ctx)) {
      nr_ctx_fire_writability_changed(ctx);
      return 0;
    }
  }
  /* What is still held stays held: this event does not force it out. */
  if (h->held != NULL ? !(h->rec->has & NR_EV_WRITABILITY)
                      : passes_on(ctx, NR_EV_WRITABILITY)) {
    nr_ctx_fire_writability_changed(ctx);
    return 0;
  }
  lua_State *L = begin(ctx, "channel_writability_changed");
  return finish(ctx, L, 0, "channel_writability_changed");
}

/* Outbound operations take the waiting reads first too; one whose handler
 * left meanwhile is passed on. */
#define OUTBOUND0(cname, method, pass)                                      \
  static int cname(nr_ctx_t *ctx) {                                         \
    if (settle_first(ctx))                                                  \
      return pass(ctx);                                                     \
    lua_State *L = begin(ctx, method);                                      \
    return finish(ctx, L, 0, method);                                       \
  }
OUTBOUND0(lh_flush, "flush", nr_ctx_flush)
OUTBOUND0(lh_do_read, "read", nr_ctx_read)

static int lh_read_complete(nr_ctx_t *ctx) {
  lh_t *h = nr_ctx_state(ctx);
  lnr_batch_t *b = &h->S->batch;
  if (b->n > 0 && !b->draining) {
    if (b->owner == h) {
      batch_settle(h->S, true, true);            /* with read_complete */
      return 0;
    }
    batch_settle(h->S, false, false);
    if (nr_ctx_is_removed(ctx)) {
      nr_ctx_fire_read_complete(ctx);
      return 0;
    }
  }
  if (h->held != NULL && !b->draining) {
    /* Owed after what it holds: delivered with them. */
    if (nr_channel_is_writable(nr_ctx_channel(ctx)))
      unhold(ctx, true);
    return 0;
  }
  if (!(h->rec->has & NR_EV_READ_COMPLETE)) {
    if (h->rec->has & NR_EV_READ)
      read_complete_flushing(ctx);
    else
      nr_ctx_fire_read_complete(ctx);
    return 0;
  }
  lua_State *L = begin_ref(ctx, h->rec->read_complete_ref, "channel_read_complete");
  return finish(ctx, L, 0, "channel_read_complete");
}

static int lh_read(nr_ctx_t *ctx, void *msg) {
  lh_t *h = nr_ctx_state(ctx);
  lnr_state_t *S = h->S;
  lnr_batch_t *b = &S->batch;
  if (b->owner == h && !b->draining) {           /* the usual: one more */
    if (nr_ctx_read_deferrable(ctx, msg) && state_idle(S->L)) {
      lnr_push_msg(b->Q, msg);
      b->tokens[b->n] = nr_ctx_read_token(ctx, msg);
      if (++b->n == BATCH_MAX)
        batch_settle(S, false, true);
      return 0;
    }
  } else if (h->held != NULL && !b->draining &&
             nr_ctx_read_deferrable(ctx, msg) && state_idle(S->L)) {
    if (nr_channel_is_writable(nr_ctx_channel(ctx)))
      unhold(ctx, true);                         /* may hold again */
    if (nr_ctx_is_removed(ctx)) {
      nr_ctx_fire_read(ctx, msg);
      return 0;
    }
    if (h->held != NULL &&                       /* queued behind them */
        lua_checkstack(h->held, 2 + LUA_MINSTACK)) {
      lnr_push_msg(h->held, msg);
      lua_pushinteger(h->held, (lua_Integer)nr_ctx_read_token(ctx, msg));
      return 0;
    }
  }
  if (b->n == 0 && h->held == NULL && !b->draining &&
      nr_ctx_read_deferrable(ctx, msg) && state_idle(S->L) &&
      batch_open(S, h, ctx)) {
    lnr_push_msg(b->Q, msg);
    b->tokens[0] = nr_ctx_read_token(ctx, msg);
    b->n = 1;
    return 0;
  }
  if (settle_first(ctx)) {                       /* taken in order */
    nr_ctx_fire_read(ctx, msg);
    return 0;
  }
  uint64_t token = nr_ctx_read_token(ctx, msg);
  lua_State *L = begin_ref(ctx, h->rec->read_ref, "channel_read");
  lnr_push_msg(L, msg);
  if (call(ctx, L, 1) != LUA_OK) {
    route_error(ctx, L, "channel_read");         /* pops the message */
    if (token != 0)                              /* its producer answers */
      nr_ctx_read_failed(ctx, token);
  }
  lua_pop(L, 1);                                 /* msgh */
  LNR_STACK_UNMARK(S, 0);
  return 0;
}

static int lh_user_event(nr_ctx_t *ctx, void *evt) {
  if (passes_on(ctx, NR_EV_USER_EVENT)) {
    nr_ctx_fire_user_event(ctx, evt);
    return 0;
  }
  lua_State *L = begin(ctx, "user_event_triggered");
  lnr_push_msg(L, evt);
  return finish(ctx, L, 1, "user_event_triggered");
}

static int lh_exception(nr_ctx_t *ctx, const nr_err_t *err) {
  if (passes_on(ctx, NR_EV_EXCEPTION)) {
    nr_ctx_fire_exception(ctx, err);
    return 0;
  }
  lua_State *L = begin(ctx, "exception_caught");
  lua_pushstring(L, err->msg ? err->msg : nr_strerror(err->code));
  return finish(ctx, L, 1, "exception_caught");
}

static void push_opt_promise(lua_State *L, nr_promise_t *p) {
  if (p)
    lnr_push_promise(L, nr_promise_retain(p));
  else
    lua_pushnil(L);
}

static int lh_write(nr_ctx_t *ctx, void *msg, nr_promise_t *p) {
  if (settle_first(ctx))
    return nr_ctx_write(ctx, msg, p);
  lua_State *L = begin(ctx, "write");
  lnr_push_msg(L, msg);
  push_opt_promise(L, p);
  return finish(ctx, L, 2, "write");
}

static int lh_close(nr_ctx_t *ctx, nr_promise_t *p) {
  if (settle_first(ctx))
    return nr_ctx_close(ctx, p);
  lua_State *L = begin(ctx, "close");
  push_opt_promise(L, p);
  return finish(ctx, L, 1, "close");
}

static int lh_disconnect(nr_ctx_t *ctx, nr_promise_t *p) {
  if (settle_first(ctx))
    return nr_ctx_disconnect(ctx, p);
  lua_State *L = begin(ctx, "disconnect");
  push_opt_promise(L, p);
  return finish(ctx, L, 1, "disconnect");
}

static int push_sockaddr(lua_State *L, const struct sockaddr *sa,
                         socklen_t len) {
  char host[128];
  int port = 0;
  struct sockaddr_storage ss;
  memcpy(&ss, sa, len);
  nr_format_addr(&ss, len, host, sizeof host, &port);
  lua_pushstring(L, host);
  lua_pushinteger(L, port);
  return 2;
}

static int lh_bind(nr_ctx_t *ctx, const struct sockaddr *sa, socklen_t len,
                   nr_promise_t *p) {
  if (settle_first(ctx))
    return nr_ctx_bind(ctx, sa, len, p);
  lua_State *L = begin(ctx, "bind");
  push_sockaddr(L, sa, len);
  push_opt_promise(L, p);
  return finish(ctx, L, 3, "bind");
}

static int lh_connect(nr_ctx_t *ctx, const struct sockaddr *sa,
                      socklen_t len, nr_promise_t *p) {
  if (settle_first(ctx))
    return nr_ctx_connect(ctx, sa, len, p);
  lua_State *L = begin(ctx, "connect");
  push_sockaddr(L, sa, len);
  push_opt_promise(L, p);
  return finish(ctx, L, 3, "connect");
}

/* A handler without handler_added costs no ctx until it is first called:
 * idle connections hold none. */
static void lh_added(nr_ctx_t *ctx) {
  lh_t *h = nr_ctx_state(ctx);
  if (h->rec->added)
    finish(ctx, begin(ctx, "handler_added"), 0, "handler_added");
}

static void lh_free(lua_State *L, lh_t *h) {
  if (h->S->batch.owner == h)
    h->S->batch.owner = NULL;        /* the rest of its batch goes on */
  if (h->held != NULL)
    drop_held(h);
  if (h->ctx_table != NULL && h->S->ctx_table == h->ctx_table)
    h->S->ctx_table = NULL;          /* no longer anchored by ctx_ref */
  luaL_unref(L, LUA_REGISTRYINDEX, h->ref);
  luaL_unref(L, LUA_REGISTRYINDEX, h->ctx_ref);
  free(h);
}

/* A handler leaving its pipeline passes on what it holds (dropped if the
 * channel closed, as the codecs drop what follows a close). */
static void pass_held(nr_ctx_t *ctx) {
  lh_t *h = nr_ctx_state(ctx);
  lua_State *L = h->S->L, *Q = h->held;
  int k = lua_gettop(Q);                        /* message, token; ... */
  for (int i = 1; i <= k && nr_channel_is_open(nr_ctx_channel(ctx)); i += 2) {
    lua_pushvalue(Q, i);
    lua_xmove(Q, L, 1);
    lnr_lmsg_t m = {NR_MSG_LUA, L, lua_gettop(L)};
    nr_ctx_fire_read(ctx, &m);
    lua_pop(L, 1);
  }
  drop_held(h);
}

static void lh_removed(nr_ctx_t *ctx) {
  lh_t *h = nr_ctx_state(ctx);
  lnr_batch_t *b = &h->S->batch;
  if (b->n > 0 && !b->draining)
    batch_settle(h->S, false, false);  /* it takes what waits for it first */
  if (h->held != NULL)
    pass_held(ctx);
  if (h->rec->removed)
    finish(ctx, begin(ctx, "handler_removed"), 0, "handler_removed");
  lh_free(h->S->L, h);
}

static unsigned lh_mask(const nr_handler_t *vt, void *state) {
  (void)vt;
  lh_t *h = state;
  return h->rec->mask;
}

static const nr_handler_t lua_vt = {
    .type = "lua", .added = lh_added, .removed = lh_removed,
    .registered = lh_registered, .unregistered = lh_unregistered,
    .active = lh_active, .inactive = lh_inactive, .read = lh_read,
    .read_complete = lh_read_complete, .user_event = lh_user_event,
    .writability_changed = lh_writability, .exception = lh_exception,
    .bind = lh_bind, .connect = lh_connect, .disconnect = lh_disconnect,
    .close = lh_close, .do_read = lh_do_read, .write = lh_write,
    .flush = lh_flush, .mask = lh_mask};

/* ---- ctx objects ---------------------------------------------------------------- */

#define CTX "netrun.ctx"
#define PIPELINE "netrun.pipeline"

/* A ctx is a table, made when its handler is first called or asked for
 * (p:context): [1] holds the handle (a userdata that retains the C
 * context, released by its __gc), and the shared metatable's __index finds
 * methods and the fields channel, pipeline, name and handler, then stores
 * them in the table, so the next ctx:write is a plain table read, not a
 * metamethod call. Both metatables are kept under pointer keys. */
#define CTX_HANDLE "netrun.ctx.handle"
static const char CTX_KEY = 0, CTX_HANDLE_KEY = 0;

static void push_ctx(lua_State *L, nr_ctx_t *ctx) {
  lua_createtable(L, 1, 0);
  lctx_t *c = lua_newuserdatauv(L, sizeof *c, 0);
  c->tag = &CTX_TAG;
  c->ctx = nr_ctx_retain(ctx);
  lua_rawgetp(L, LUA_REGISTRYINDEX, &CTX_HANDLE_KEY);
  lua_setmetatable(L, -2);
  lua_rawseti(L, -2, 1);
  lua_rawgetp(L, LUA_REGISTRYINDEX, &CTX_KEY);
  lua_setmetatable(L, -2);
}

/* ctx methods are closures whose upvalues are the future and lazy-future
 * metatables, so making a write's future needs no registry lookup; __index
 * has the methods as its upvalue. A ctx is checked by the tag in its
 * handle, which costs less than comparing metatables. */
#define FUTURE_MT lua_upvalueindex(1)
#define LAZY_MT lua_upvalueindex(2)
#define CTX_METHODS lua_upvalueindex(1)

static lctx_t *to_ctx(lua_State *L, int idx) {
  if (lua_type(L, idx) == LUA_TTABLE) {
    lua_rawgeti(L, idx, 1);
    lctx_t *c = lua_touserdata(L, -1);    /* a light one has length 0 */
    bool ok = c && lua_rawlen(L, -1) == sizeof *c && c->tag == &CTX_TAG;
    lua_pop(L, 1);                          /* still held by the table */
    if (ok)
      return c;
  }
  luaL_typeerror(L, idx, CTX);
  return NULL;
}

/* The ctx of the handler being called is known by its table's address
 * (begin notes it), which costs two API calls where reading the handle out
 * of the table costs five. The address cannot be a forgery's: the table is
 * anchored by its handler's ctx_ref, and forgotten when that is dropped,
 * so no other table can be made at that address meanwhile; the C context
 * lives as long as the handler is in its pipeline; and begin ran on this
 * state's thread, which is the channel's loop. */
static nr_ctx_t *check_ctx(lua_State *L, int idx) {
  if (lua_type(L, idx) == LUA_TTABLE) {
    const lnr_state_t *S = lnr_state(L);
    if (S != NULL && S->ctx_table != NULL &&
        lua_topointer(L, idx) == S->ctx_table)
      return S->ctx;
  }
  nr_ctx_t *ctx = to_ctx(L, idx)->ctx;
  nr_loop_t *loop = nr_channel_loop(nr_ctx_channel(ctx));
  if (!nr_loop_in_thread(loop))
    luaL_error(L, "a ctx can only be used on its channel's loop (%s)",
               nr_loop_name(loop));
  return ctx;
}

static int ctx_gc(lua_State *L) {
  lctx_t *c = luaL_checkudata(L, 1, CTX_HANDLE);
  if (c->ctx) {
    nr_ctx_release(c->ctx);
    c->ctx = NULL;
  }
  return 0;
}

static void push_pipeline(lua_State *L, nr_channel_t *ch);

/* The Lua value of a context's handler: the table, or the native type. */
static void push_handler(lua_State *L, nr_ctx_t *ctx) {
  if (nr_ctx_handler(ctx) == &lua_vt) {
    lh_t *h = nr_ctx_state(ctx);
    lua_rawgeti(L, LUA_REGISTRYINDEX, h->ref);
  } else if (nr_ctx_handler(ctx) == &exec_vt) {
    lua_rawgeti(L, LUA_REGISTRYINDEX, xh_home_ref(nr_ctx_state(ctx)));
  } else {
    lua_pushstring(L, nr_ctx_handler(ctx)->type);
  }
}

/* __index, with the methods table as upvalue: a method, or one of the
 * fields channel, pipeline, name and handler; either is stored in the ctx
 * table, where the next lookup finds it. */
static int ctx_index(lua_State *L) {
  lua_pushvalue(L, 2);
  if (lua_rawget(L, CTX_METHODS) == LUA_TNIL) {
    lua_pop(L, 1);
    lctx_t *c = to_ctx(L, 1);
    const char *k = luaL_checkstring(L, 2);
    if (c->ctx == NULL)
      return 0;
    if (strcmp(k, "channel") == 0)
      lnr_push_handle(L, LNR_CHANNEL, nr_ctx_channel(c->ctx));
    else if (strcmp(k, "pipeline") == 0)
      push_pipeline(L, nr_ctx_channel(c->ctx));
    else if (strcmp(k, "name") == 0)
      lua_pushstring(L, nr_ctx_name(c->ctx));
    else if (strcmp(k, "handler") == 0)
      push_handler(L, c->ctx);
    else
      return 0;
  }
  lua_pushvalue(L, 2);
  lua_pushvalue(L, -2);
  lua_rawset(L, 1);
  return 1;
}

static int fire_read_fn(void *target, void *msg, nr_promise_t *p) {
  (void)p;
  nr_ctx_fire_read(target, msg);
  return 0;
}

static int fire_event_fn(void *target, void *msg, nr_promise_t *p) {
  (void)p;
  nr_ctx_fire_user_event(target, msg);
  return 0;
}

static int ctx_write_void_fn(void *target, void *msg, nr_promise_t *p) {
  (void)p;
  return nr_ctx_write_void(target, msg);
}

static int ctx_write_fn(void *target, void *msg, nr_promise_t *p) {
  return nr_ctx_write(target, msg, p);
}

#define CTX_FIRE0(cname, fn)                                                \
  static int cname(lua_State *L) {                                          \
    fn(check_ctx(L, 1));                                                    \
    lua_settop(L, 1);                                                       \
    return 1;                                                               \
  }
CTX_FIRE0(c_fire_registered, nr_ctx_fire_registered)
CTX_FIRE0(c_fire_unregistered, nr_ctx_fire_unregistered)
CTX_FIRE0(c_fire_active, nr_ctx_fire_active)
CTX_FIRE0(c_fire_inactive, nr_ctx_fire_inactive)
CTX_FIRE0(c_fire_read_complete, nr_ctx_fire_read_complete)
CTX_FIRE0(c_fire_writability, nr_ctx_fire_writability_changed)

static int c_fire_read(lua_State *L) {
  nr_ctx_t *ctx = check_ctx(L, 1);
  luaL_checkany(L, 2);
  lnr_with_msg(L, 2, NULL, fire_read_fn, ctx, NULL);
  lua_settop(L, 1);
  return 1;
}

static int c_fire_user_event(lua_State *L) {
  nr_ctx_t *ctx = check_ctx(L, 1);
  luaL_checkany(L, 2);
  lnr_lmsg_t m = {NR_MSG_LUA, L, 2};
  fire_event_fn(ctx, &m, NULL);
  lua_settop(L, 1);
  return 1;
}

static int c_fire_exception(lua_State *L) {
  nr_ctx_t *ctx = check_ctx(L, 1);
  nr_err_t err = {NR_EHANDLER, luaL_tolstring(L, 2, NULL)};
  nr_ctx_fire_exception(ctx, &err);
  lua_settop(L, 1);
  return 1;
}

/* The promise argument at idx, or a new one; pushes its future. */
static nr_promise_t *write_promise(lua_State *L, int idx) {
  nr_promise_t *p = lua_isnoneornil(L, idx) ? NULL
                                            : lnr_check_handle(L, idx, LNR_FUTURE);
  if (p) {
    lua_pushvalue(L, idx);
    return p;
  }
  p = nr_promise_new();
  lnr_push_new_handle_mt(L, LNR_FUTURE, p, FUTURE_MT);
  return p;
}

/* write_promise for functions without the ctx methods' upvalues (the
 * pipeline's and the xctx's methods). */
static nr_promise_t *opt_promise(lua_State *L, int idx) {
  nr_promise_t *p = lua_isnoneornil(L, idx) ? NULL
                                            : lnr_check_handle(L, idx, LNR_FUTURE);
  if (p) {
    lua_pushvalue(L, idx);
    return p;
  }
  p = nr_promise_new();
  lnr_push_promise(L, p);
  return p;
}

/* A write to an open stream channel that reaches its head at once (see
 * nr_ctx_writes_to_head), with no promise given: its future is a lazy one
 * (see lhandle.c), which costs nothing unless it is used. A write that
 * fails was reported to exception_caught by the pipeline; its future is a
 * failed one. */
static bool write_lazily(lua_State *L, nr_ctx_t *ctx, bool flush) {
  if (!lua_isnoneornil(L, 3))
    return false;
  nr_channel_t *ch = nr_ctx_channel(ctx);
  if (!nr_channel_is_open(ch) || !nr_ctx_writes_to_head(ctx))
    return false;
  int rc = lnr_with_msg(L, 2, ch, ctx_write_void_fn, ctx, NULL);
  if (rc < 0) {
    nr_promise_t *p = nr_promise_new();
    if (p == NULL)
      luaL_error(L, "out of memory");
    nr_promise_set_failure(p, rc, nr_strerror(rc));
    lnr_push_new_handle_mt(L, LNR_FUTURE, p, FUTURE_MT);
  } else {
    lnr_push_lazy_write(L, ch, nr_channel_write_mark(ch), 1, LAZY_MT);
  }
  if (flush)
    nr_ctx_flush(ctx);
  return true;
}

/* A write to a datagram channel given no promise that fails at once (a
 * string instead of { data, host, port }) reaches exception_caught too, as
 * a stream channel's does on the lazy path above: its future is rarely
 * looked at. (Stream writes that pass through a codec are reported by the
 * codec.) A write on a closed channel only fails its future, as there. */
static void report_write_failure(nr_ctx_t *ctx, int rc, nr_promise_t *p) {
  if (rc == NR_ECLOSED || !nr_channel_is_datagram(nr_ctx_channel(ctx)))
    return;
  nr_err_t err = {rc, nr_promise_message(p)};
  nr_pipeline_fire_exception(nr_channel_pipeline(nr_ctx_channel(ctx)), &err);
}

static int ctx_do_write(lua_State *L, bool flush) {
  nr_ctx_t *ctx = check_ctx(L, 1);
  if (lua_gettop(L) < 2)
    luaL_checkany(L, 2);                   /* raises */
  if (lnr_is_void(L, 3)) {                 /* no future: a failure is raised */
    lnr_with_msg(L, 2, nr_ctx_channel(ctx), ctx_write_fn, ctx, NULL);
    if (lua_gettop(L) != 3)
      lua_settop(L, 3);
  } else if (write_lazily(L, ctx, flush)) {
    return 1;
  } else {
    bool implicit = lua_isnoneornil(L, 3);
    nr_promise_t *p = write_promise(L, 3);
    int rc = lnr_with_msg(L, 2, nr_ctx_channel(ctx), ctx_write_fn, ctx, p);
    if (rc < 0 && implicit)
      report_write_failure(ctx, rc, p);
  }
  if (flush)
    nr_ctx_flush(ctx);
  return 1;
}

/* The usual write, ctx:write(msg, VOID) by the handler being called, is
 * told by addresses: the ctx table's and the void promise's (see
 * check_ctx and lnr_is_void), in five API calls where the general path
 * makes a dozen; a native message (a prepared response, say) then goes to
 * the pipeline as it is. */
static int c_write(lua_State *L) {
  const lnr_state_t *S = lnr_state(L);
  if (lua_gettop(L) == 3 && S != NULL && S->ctx_table != NULL &&
      S->void_proxy != NULL && lua_topointer(L, 1) == S->ctx_table &&
      lua_topointer(L, 3) == S->void_proxy) {
    void *native = lnr_to_native(L, 2);
    if (native != NULL) {
      nr_ctx_write(S->ctx, native, NULL);  /* a failure went to exception_caught */
    } else if (lua_type(L, 2) == LUA_TSTRING) {   /* as lnr_with_msg does */
      size_t n;
      const char *s = lua_tolstring(L, 2, &n);    /* anchored by the stack */
      nr_bytes_t b = NR_BYTES(s, n);
      nr_ctx_write(S->ctx, &b, NULL);
    } else {                               /* a response table, an array */
      lnr_with_msg(L, 2, nr_ctx_channel(S->ctx), ctx_write_fn, S->ctx, NULL);
    }
    if (lua_gettop(L) != 3)
      lua_settop(L, 3);
    return 1;                              /* the void promise */
  }
  return ctx_do_write(L, false);
}
static int c_write_and_flush(lua_State *L) { return ctx_do_write(L, true); }

static int c_flush(lua_State *L) {
  nr_ctx_flush(check_ctx(L, 1));
  lua_settop(L, 1);
  return 1;
}

static int c_read(lua_State *L) {
  nr_ctx_read(check_ctx(L, 1));
  lua_settop(L, 1);
  return 1;
}

static int c_close(lua_State *L) {
  nr_ctx_t *ctx = check_ctx(L, 1);
  nr_promise_t *p = write_promise(L, 2);
  nr_ctx_close(ctx, p);
  return 1;
}

/* The void promise (see lfuture.c): ctx:write(msg, ctx:void_promise())
 * makes no future; a failure goes to exception_caught. */
static int c_void_promise(lua_State *L) {
  check_ctx(L, 1);
  lnr_push_handle(L, LNR_FUTURE, nr_promise_void());
  return 1;
}

static int c_loop(lua_State *L) {
  lnr_push_handle(L, LNR_LOOP, nr_channel_loop(nr_ctx_channel(check_ctx(L, 1))));
  return 1;
}

static int ctx_tostring(lua_State *L) {
  lctx_t *c = to_ctx(L, 1);
  lua_pushfstring(L, "netrun.ctx(%s)", c->ctx ? nr_ctx_name(c->ctx) : "released");
  return 1;
}

/* ---- pipelines -------------------------------------------------------------------- */

typedef struct lpipe_s {
  nr_channel_t *ch;
} lpipe_t;

static void push_pipeline(lua_State *L, nr_channel_t *ch) {
  lpipe_t *p = lua_newuserdatauv(L, sizeof *p, 0);
  p->ch = nr_channel_retain(ch);
  luaL_setmetatable(L, PIPELINE);
}

static int l_channel_pipeline(lua_State *L) {
  push_pipeline(L, lnr_check_handle(L, 1, LNR_CHANNEL));
  return 1;
}

static nr_pipeline_t *check_pipe(lua_State *L, int idx) {
  lpipe_t *p = luaL_checkudata(L, idx, PIPELINE);
  nr_loop_t *loop = nr_channel_loop(p->ch);
  if (loop == NULL || !nr_loop_in_thread(loop))
    luaL_error(L, "the pipeline of channel %d can only be used on its loop "
               "(%s): do it in init, or in a task on ch:loop()",
               (int)nr_channel_id(p->ch), loop ? nr_loop_name(loop) : "none");
  return nr_channel_pipeline(p->ch);
}

static int pipe_gc(lua_State *L) {
  lpipe_t *p = luaL_checkudata(L, 1, PIPELINE);
  if (p->ch) {
    nr_channel_release(p->ch);
    p->ch = NULL;
  }
  return 0;
}

/* Find the context of a handler given by name or by value. */
static nr_ctx_t *find_ctx(lua_State *L, nr_pipeline_t *p, int idx) {
  if (lua_type(L, idx) == LUA_TSTRING)
    return nr_pipeline_context(p, lua_tostring(L, idx));
  for (nr_ctx_t *c = nr_pipeline_first(p); c; c = nr_ctx_next(c)) {
    if (nr_ctx_handler(c) != &lua_vt && nr_ctx_handler(c) != &exec_vt)
      continue;
    push_handler(L, c);
    bool same = lua_rawequal(L, -1, idx);
    lua_pop(L, 1);
    if (same)
      return c;
  }
  return NULL;
}

/* Builds the C handler for the value at idx: a Lua table or object, or a
 * native handler (userdata whose metatable has __netrun_native). */
static const nr_handler_t *make_handler(lua_State *L, int idx,
                                        const char *name, void **state) {
  if (lua_type(L, idx) == LUA_TUSERDATA &&
      luaL_getmetafield(L, idx, "__netrun_native") == LUA_TLIGHTUSERDATA) {
    lnr_native_fn make = (lnr_native_fn)(uintptr_t)lua_touserdata(L, -1);
    lua_pop(L, 1);
    return make(L, idx, state);
  }
  if (!lua_istable(L, idx) && !lua_isuserdata(L, idx))
    luaL_error(L, "a handler must be a table or an object, got a %s",
               luaL_typename(L, idx));
  lh_t *h = calloc(1, sizeof *h);
  if (h == NULL)
    luaL_error(L, "out of memory");
  h->S = lnr_state(L);
  lua_pushvalue(L, idx);
  h->ref = luaL_ref(L, LUA_REGISTRYINDEX);
  h->ctx_ref = LUA_NOREF;
  h->rec = handler_rec(L, idx);
  check_method_names(L, idx, name);
  *state = h;
  return &lua_vt;
}

static int add_error(lua_State *L, int rc, const char *name, const char *base) {
  if (rc == -EEXIST)
    return luaL_error(L, "duplicate handler name '%s'", name);
  if (rc == -ENOENT)
    return luaL_error(L, "no handler named '%s' in the pipeline", base);
  return luaL_error(L, "cannot add handler '%s': %s", name, nr_strerror(rc));
}

static void xh_release(xh_t *x);
static const nr_handler_t *make_exec_handler(lua_State *L, nr_loop_t *exec,
                                             nr_channel_t *ch, const char *name,
                                             int idx, void **state);

/* The loop a handler given with a group (or a loop) runs on: the group's
 * next(), or that loop; NULL for none given. */
static nr_loop_t *exec_loop(lua_State *L, int idx) {
  lnr_group_t *g = lnr_to_handle(L, idx, LNR_GROUP);
  if (g)
    return nr_group_next(lnr_group_core(g));
  nr_loop_t *l = lnr_to_handle(L, idx, LNR_LOOP);
  if (l && lnr_group_of_loop(l) == NULL)
    luaL_error(L, "add: the main thread's loop runs no handlers; give a "
               "group or one of its loops");
  return l;
}

typedef int (*adder_fn)(nr_pipeline_t *, const char *, const char *,
                        const nr_handler_t *, void *);

static int add_first(nr_pipeline_t *p, const char *b, const char *n,
                     const nr_handler_t *h, void *s) {
  (void)b;
  return nr_pipeline_add_first(p, n, h, s);
}
static int add_last(nr_pipeline_t *p, const char *b, const char *n,
                    const nr_handler_t *h, void *s) {
  (void)b;
  return nr_pipeline_add_last(p, n, h, s);
}

/* Lua-handler contexts need their ctx userdata before handler_added runs:
 * lh_added makes it on demand. */
static void ensure_ctx(nr_ctx_t *ctx) {
  lh_t *h = nr_ctx_state(ctx);
  if (h->ctx_ref == LUA_NOREF) {
    lua_State *L = h->S->L;
    push_ctx(L, ctx);
    h->ctx_table = lua_topointer(L, -1);
    h->ctx_ref = luaL_ref(L, LUA_REGISTRYINDEX);
  }
}

static int do_add(lua_State *L, adder_fn add, bool with_base) {
  nr_pipeline_t *p = check_pipe(L, 1);
  int arg = 2;
  nr_loop_t *exec = exec_loop(L, arg);
  if (exec)
    arg++;                        /* p:add_last(group or loop, name, h) */
  const char *base = with_base ? luaL_checkstring(L, arg++) : NULL;
  const char *name = luaL_checkstring(L, arg++);
  luaL_checkany(L, arg);
  /* Check the names first: a native handler's state can only be freed
   * through its context, which a failed add never makes. */
  if (nr_pipeline_context(p, name))
    return add_error(L, -EEXIST, name, base);
  if (base && nr_pipeline_context(p, base) == NULL)
    return add_error(L, -ENOENT, name, base);
  void *state = NULL;
  const nr_handler_t *vt =
      exec ? make_exec_handler(L, exec, nr_pipeline_channel(p), name, arg, &state)
           : make_handler(L, arg, name, &state);
  int rc = add(p, base, name, vt, state);
  if (rc < 0) {
    if (vt == &exec_vt) {
      luaL_unref(L, LUA_REGISTRYINDEX, xh_home_ref(state));
      xh_release(state);
    } else if (vt == &lua_vt) {
      lh_free(L, state);
    } else if (vt->removed == NULL) {
      free(state);
    }
    return add_error(L, rc, name, base);
  }
  lua_settop(L, 1);
  return 1;
}

static int p_add_first(lua_State *L) { return do_add(L, add_first, false); }
static int p_add_last(lua_State *L) { return do_add(L, add_last, false); }
static int p_add_before(lua_State *L) {
  return do_add(L, nr_pipeline_add_before, true);
}
static int p_add_after(lua_State *L) {
  return do_add(L, nr_pipeline_add_after, true);
}

static int p_remove(lua_State *L) {
  nr_pipeline_t *p = check_pipe(L, 1);
  luaL_checkany(L, 2);
  nr_ctx_t *c = find_ctx(L, p, 2);
  if (c == NULL)
    return luaL_error(L, "no such handler in the pipeline: %s",
                      luaL_tolstring(L, 2, NULL));
  push_handler(L, c);
  nr_pipeline_remove(p, nr_ctx_name(c));
  return 1;
}

static int p_replace(lua_State *L) {
  nr_pipeline_t *p = check_pipe(L, 1);
  nr_ctx_t *c = find_ctx(L, p, 2);
  const char *name = luaL_checkstring(L, 3);
  luaL_checkany(L, 4);
  if (c == NULL)
    return luaL_error(L, "no such handler in the pipeline: %s",
                      luaL_tolstring(L, 2, NULL));
  push_handler(L, c);
  int old = lua_gettop(L);
  void *state = NULL;
  const nr_handler_t *vt = make_handler(L, 4, name, &state);
  int rc = nr_pipeline_replace(p, nr_ctx_name(c), name, vt, state);
  if (rc < 0)
    return add_error(L, rc, name, NULL);
  lua_pushvalue(L, old);
  return 1;
}

static int p_get(lua_State *L) {
  nr_pipeline_t *p = check_pipe(L, 1);
  nr_ctx_t *c = nr_pipeline_context(p, luaL_checkstring(L, 2));
  if (c == NULL)
    lua_pushnil(L);
  else
    push_handler(L, c);
  return 1;
}

static int p_context(lua_State *L) {
  nr_pipeline_t *p = check_pipe(L, 1);
  nr_ctx_t *c = find_ctx(L, p, 2);
  if (c == NULL) {
    lua_pushnil(L);
  } else if (nr_ctx_handler(c) == &lua_vt) {
    lh_t *h = nr_ctx_state(c);
    ensure_ctx(c);
    lua_rawgeti(L, LUA_REGISTRYINDEX, h->ctx_ref);
  } else {
    push_ctx(L, c);
  }
  return 1;
}

static int p_names(lua_State *L) {
  nr_pipeline_t *p = check_pipe(L, 1);
  lua_newtable(L);
  int i = 1;
  for (nr_ctx_t *c = nr_pipeline_first(p); c; c = nr_ctx_next(c)) {
    lua_pushstring(L, nr_ctx_name(c));
    lua_rawseti(L, -2, i++);
  }
  return 1;
}

static int p_first(lua_State *L) {
  nr_ctx_t *c = nr_pipeline_first(check_pipe(L, 1));
  c ? push_handler(L, c) : lua_pushnil(L);
  return 1;
}

static int p_last(lua_State *L) {
  nr_ctx_t *c = nr_pipeline_last(check_pipe(L, 1));
  c ? push_handler(L, c) : lua_pushnil(L);
  return 1;
}

static int p_channel(lua_State *L) {
  lpipe_t *p = luaL_checkudata(L, 1, PIPELINE);
  lnr_push_handle(L, LNR_CHANNEL, p->ch);
  return 1;
}

#define PIPE_FIRE0(cname, fn)                                               \
  static int cname(lua_State *L) {                                          \
    fn(nr_pipeline_head(check_pipe(L, 1)));                           \
    lua_settop(L, 1);                                                       \
    return 1;                                                               \
  }
PIPE_FIRE0(p_fire_registered, nr_ctx_fire_registered)
PIPE_FIRE0(p_fire_unregistered, nr_ctx_fire_unregistered)
PIPE_FIRE0(p_fire_active, nr_ctx_fire_active)
PIPE_FIRE0(p_fire_inactive, nr_ctx_fire_inactive)
PIPE_FIRE0(p_fire_read_complete, nr_ctx_fire_read_complete)
PIPE_FIRE0(p_fire_writability, nr_ctx_fire_writability_changed)

static int p_fire_read(lua_State *L) {
  nr_pipeline_t *p = check_pipe(L, 1);
  luaL_checkany(L, 2);
  lnr_with_msg(L, 2, NULL, fire_read_fn, nr_pipeline_head(p), NULL);
  lua_settop(L, 1);
  return 1;
}

static int p_fire_user_event(lua_State *L) {
  nr_pipeline_t *p = check_pipe(L, 1);
  lnr_lmsg_t m = {NR_MSG_LUA, L, 2};
  fire_event_fn(nr_pipeline_head(p), &m, NULL);
  lua_settop(L, 1);
  return 1;
}

static int p_fire_exception(lua_State *L) {
  nr_pipeline_t *p = check_pipe(L, 1);
  nr_err_t err = {NR_EHANDLER, luaL_tolstring(L, 2, NULL)};
  nr_ctx_fire_exception(nr_pipeline_head(p), &err);
  lua_settop(L, 1);
  return 1;
}

static int p_do_write(lua_State *L, bool flush) {
  nr_pipeline_t *p = check_pipe(L, 1);
  luaL_checkany(L, 2);
  nr_promise_t *pr = opt_promise(L, 3);
  lnr_with_msg(L, 2, nr_pipeline_channel(p), ctx_write_fn, nr_pipeline_tail(p),
               pr);
  if (flush)
    nr_ctx_flush(nr_pipeline_tail(p));
  return 1;
}

static int p_write(lua_State *L) { return p_do_write(L, false); }
static int p_write_and_flush(lua_State *L) { return p_do_write(L, true); }

static int p_flush(lua_State *L) {
  nr_ctx_flush(nr_pipeline_tail(check_pipe(L, 1)));
  lua_settop(L, 1);
  return 1;
}

static int p_close(lua_State *L) {
  nr_pipeline_t *p = check_pipe(L, 1);
  nr_promise_t *pr = opt_promise(L, 2);
  nr_ctx_close(nr_pipeline_tail(p), pr);
  return 1;
}

static int p_tostring(lua_State *L) {
  lpipe_t *p = luaL_checkudata(L, 1, PIPELINE);
  lua_pushfstring(L, "netrun.pipeline(channel %d)",
                  p->ch ? (int)nr_channel_id(p->ch) : -1);
  return 1;
}

/* ---- handlers on an executor group ------------------------------------------ */

/*
 * p:add_last(group, name, h): h lives in the state of one executor of the
 * group, chosen when it is added and kept for the channel's life, so its
 * events arrive in order. On the channel's loop a proxy handler copies each
 * event (its method name and values) to that executor as a task; there
 * h:method(xctx, ...) runs, and what it asks of its xctx -- fire the next
 * handler, write, flush, close, read -- is copied back to the channel's loop
 * as a task. The proxy does not pass an event on by itself: h does, with
 * xctx:fire_* (or ctx:write, ctx:flush...). An event h has no method for
 * is passed on too, but from the executor, so that nothing overtakes what h
 * is still doing (a flush its write, an inactive its reads): every event
 * takes the hop. bind, connect and disconnect are not offered to h.
 *
 * Threads: the ctx is touched only on the channel's loop (retained in
 * added, released in removed); h and its xctx only in the executor's state
 * (registry, keyed by the proxy); the proxy itself is reference counted by
 * the pipeline, every event or operation in flight and every xctx.
 */
struct xh_s {
  _Atomic int refs;
  nr_ctx_t *ctx;              /* channel's loop only; NULL once removed */
  nr_channel_t *ch;
  nr_loop_t *exec, *home;     /* h's executor; the channel's loop */
  lnr_blob_t *handler;        /* h, packed once, unpacked by exec */
  int home_ref;               /* h in the channel's state, for p:get() */
  bool loaded, broken;        /* executor only: h unpacked there, or failed */
  unsigned mask;
  char name[];
};

#define XCTX "netrun.xctx"
#define X_OUTBOUND (NR_OP_CLOSE | NR_OP_READ | NR_OP_WRITE | NR_OP_FLUSH)
#define X_INBOUND (NR_EV_REGISTERED | NR_EV_UNREGISTERED | NR_EV_ACTIVE |     \
                   NR_EV_INACTIVE | NR_EV_READ | NR_EV_READ_COMPLETE |        \
                   NR_EV_USER_EVENT | NR_EV_WRITABILITY | NR_EV_EXCEPTION)

static const char XHANDLERS = 0;  /* executor registry: proxy -> {h, xctx, methods} */

static xh_t *xh_retain(xh_t *x) {
  atomic_fetch_add(&x->refs, 1);
  return x;
}

static void xh_release(xh_t *x) {
  if (atomic_fetch_sub(&x->refs, 1) != 1)
    return;
  lnr_blob_free(x->handler);
  nr_channel_release(x->ch);
  free(x);
}

/* Operations an xctx sends back to the channel's loop. */
enum { XOP_READ, XOP_READ_COMPLETE, XOP_ACTIVE, XOP_INACTIVE, XOP_REGISTERED,
       XOP_UNREGISTERED, XOP_WRITABILITY, XOP_USER_EVENT, XOP_EXCEPTION,
       XOP_WRITE, XOP_WRITE_FLUSH, XOP_FLUSH, XOP_CLOSE, XOP_DO_READ };

/* Pack n values from the top of the stack in protected mode (a message may
 * not transfer); pops them. NULL with the error message pushed on failure. */
static int xpack_p(lua_State *L) {
  lnr_blob_t **out = lua_touserdata(L, -1);
  lua_pop(L, 1);
  *out = lnr_pack(L, 1, lua_gettop(L), "message");
  return 0;
}

static lnr_blob_t *xpack(lua_State *L, int n) {
  lnr_blob_t *b = NULL;
  lua_pushcfunction(L, xpack_p);
  lua_insert(L, -n - 1);
  lua_pushlightuserdata(L, &b);
  if (lua_pcall(L, n + 1, 0, 0) != LUA_OK)
    return NULL;
  return b;
}

/* ---- on the executor: run h's methods --------------------------------------- */

/* Push h, its xctx and its methods (made on first use), for the proxy x. */
static void push_xhandler(lua_State *L, xh_t *x) {
  if (lua_rawgetp(L, LUA_REGISTRYINDEX, &XHANDLERS) != LUA_TTABLE) {
    lua_pop(L, 1);
    lua_newtable(L);
    lua_pushvalue(L, -1);
    lua_rawsetp(L, LUA_REGISTRYINDEX, &XHANDLERS);
  }
  if (lua_rawgetp(L, -1, x) != LUA_TTABLE) {
    lua_pop(L, 1);
    lua_createtable(L, 3, 0);
    lnr_unpack(L, x->handler);                 /* h, methods */
    lua_rawseti(L, -3, 3);
    lua_rawseti(L, -2, 1);
    xh_t **u = lua_newuserdatauv(L, sizeof *u, 0);
    *u = xh_retain(x);
    luaL_setmetatable(L, XCTX);
    lua_rawseti(L, -2, 2);
    lua_pushvalue(L, -1);
    lua_rawsetp(L, -3, x);
  }
  lua_rawgeti(L, -1, 1);
  lua_rawgeti(L, -2, 2);
  lua_rawgeti(L, -3, 3);                       /* XH, entry, h, xctx, methods */
  lua_rotate(L, -5, 3);
  lua_pop(L, 2);                               /* h, xctx, methods */
}

static void xsend(lua_State *L, xh_t *x, int op, int nvals, nr_promise_t *p);

/* What an event h has no method for becomes: the xctx operation that
 * passes it on, with the number of values it carries (a write's and a
 * close's promise is not one of them). */
static const struct {
  const char *method;
  int op, nvals;
} xpass[] = {
    {"channel_registered", XOP_REGISTERED, 0},
    {"channel_unregistered", XOP_UNREGISTERED, 0},
    {"channel_active", XOP_ACTIVE, 0}, {"channel_inactive", XOP_INACTIVE, 0},
    {"channel_read", XOP_READ, 1}, {"channel_read_complete", XOP_READ_COMPLETE, 0},
    {"user_event_triggered", XOP_USER_EVENT, 1},
    {"channel_writability_changed", XOP_WRITABILITY, 0},
    {"exception_caught", XOP_EXCEPTION, 1}, {"write", XOP_WRITE, 1},
    {"flush", XOP_FLUSH, 0}, {"close", XOP_CLOSE, 0}, {"read", XOP_DO_READ, 0}};

/* Pass on an event whose values are the whole stack. */
static void xpass_on(lua_State *L, xh_t *x, const char *method) {
  for (size_t i = 0; i < sizeof xpass / sizeof xpass[0]; i++) {
    if (strcmp(xpass[i].method, method) != 0)
      continue;
    int nv = xpass[i].nvals;
    nr_promise_t *p = xpass[i].op == XOP_WRITE || xpass[i].op == XOP_CLOSE
                          ? lnr_to_handle(L, nv + 1, LNR_FUTURE) : NULL;
    lua_settop(L, nv + 1);                     /* values, promise (anchored) */
    lua_rotate(L, 1, 1);
    xsend(L, x, xpass[i].op, nv, p);
    return;
  }
}

/* Task body: the event's values from the blob, its method name in user2;
 * calls h:method(xctx, values...), or passes the event on. */
static int xevent_p(lua_State *L) {
  lnr_blob_t *b = lua_touserdata(L, 1);
  xh_t *x = b->user;
  lua_settop(L, 0);
  int n = lnr_unpack(L, b);                    /* values... */
  push_xhandler(L, x);                         /* values..., h, xctx, methods */
  if (lua_getfield(L, -1, b->user2) != LUA_TFUNCTION) {
    lua_settop(L, n);
    xpass_on(L, x, b->user2);                  /* not handler_added/removed */
    return 0;
  }
  lua_replace(L, -2);
  lua_rotate(L, -3, 1);                        /* values..., fn, h, xctx */
  lua_rotate(L, 1, 3);                         /* fn, h, xctx, values... */
  lua_call(L, n + 2, 0);
  return 0;
}

/* An error in h's method goes to h's exception_caught, else on down. */
static void xroute_error(lua_State *L, xh_t *x, const char *method) {
  if (strcmp(method, "exception_caught") != 0) {
    push_xhandler(L, x);                       /* err, h, xctx, methods */
    if (lua_getfield(L, -1, "exception_caught") == LUA_TFUNCTION) {
      lua_replace(L, -2);
      lua_rotate(L, -3, 1);                    /* err, fn, h, xctx */
      lua_pushvalue(L, -4);
      if (lnr_pcall(L, 3, 0) != LUA_OK)
        lnr_log_error(L, "exception_caught raised");
      lua_pop(L, 1);
      return;
    }
    lua_pop(L, 4);
    xsend(L, x, XOP_EXCEPTION, 1, NULL);       /* pops the error */
    return;
  }
  nr_log(NR_LOG_WARN, "exception_caught of handler '%s' raised: %s", x->name,
         lua_tostring(L, -1));
  lua_pop(L, 1);
}

static void xforget(lua_State *L, xh_t *x) {
  if (lua_rawgetp(L, LUA_REGISTRYINDEX, &XHANDLERS) == LUA_TTABLE) {
    lua_pushnil(L);
    lua_rawsetp(L, -2, x);
  }
  lua_pop(L, 1);
}

static int xload_p(lua_State *L) {
  push_xhandler(L, lua_touserdata(L, 1));
  return 0;
}

/* Unpack h in this state once; a handler that cannot be (a module it needs
 * is missing here, say) is reported once and its events are dropped. */
static bool xload(lua_State *L, xh_t *x) {
  if (x->loaded || x->broken)
    return x->loaded;
  lua_pushcfunction(L, xload_p);
  lua_pushlightuserdata(L, x);
  if (lnr_pcall(L, 1, 0) == LUA_OK) {
    x->loaded = true;
    return true;
  }
  x->broken = true;
  nr_log(NR_LOG_ERROR, "handler '%s' cannot be loaded on %s: %s", x->name,
         nr_loop_name(x->exec), lua_tostring(L, -1));
  xsend(L, x, XOP_EXCEPTION, 1, NULL);         /* pops the error */
  return false;
}

static int xevent_task(void *arg) {
  lnr_blob_t *b = arg;
  xh_t *x = b->user;
  const char *method = b->user2;
  lnr_state_t *S = lnr_current_state();
  if (S && !S->closing && xload(S->L, x)) {
    lua_State *L = S->L;
    int top = lua_gettop(L);
    LNR_STACK_BEGIN(L);
    lua_pushcfunction(L, xevent_p);
    lua_pushlightuserdata(L, b);
    if (lnr_pcall(L, 1, 0) != LUA_OK)
      xroute_error(L, x, method);
    if (strcmp(method, "handler_removed") == 0)
      xforget(L, x);
    LNR_STACK_END(L, 0);
    lua_settop(L, top);
  }
  xh_release(x);
  lnr_blob_free(b);
  return 0;
}

/* ---- on the channel's loop: the proxy handler ------------------------------ */

/* Send the n values on top to h's executor, for h:method(); pops them.
 * `method` is a literal: it travels as a pointer. */
static void xdispatch(nr_ctx_t *ctx, int n, const char *method) {
  xh_t *x = nr_ctx_state(ctx);
  lua_State *L = lnr_current_state()->L;
  lnr_blob_t *b = xpack(L, n);
  if (b == NULL) {                             /* the message did not transfer */
    nr_err_t err = {NR_EHANDLER, lua_tostring(L, -1)};
    if (x->ctx)
      nr_ctx_fire_exception(x->ctx, &err);
    lua_pop(L, 1);
    return;
  }
  b->user = xh_retain(x);
  b->user2 = (void *)method;
  b->task.fn = xevent_task;
  b->task.arg = b;
  if (nr_loop_execute_task(x->exec, &b->task) < 0) {
    nr_log(NR_LOG_WARN, "handler '%s': executor %s is shut down, %s dropped",
           x->name, nr_loop_name(x->exec), method);
    xh_release(x);
    lnr_blob_free(b);
  }
}

#define XINBOUND0(cname, method)                                            \
  static int cname(nr_ctx_t *ctx) {                                         \
    xdispatch(ctx, 0, method);                                              \
    return 0;                                                               \
  }
XINBOUND0(xh_registered, "channel_registered")
XINBOUND0(xh_unregistered, "channel_unregistered")
XINBOUND0(xh_active, "channel_active")
XINBOUND0(xh_inactive, "channel_inactive")
XINBOUND0(xh_read_complete, "channel_read_complete")
XINBOUND0(xh_writability, "channel_writability_changed")
XINBOUND0(xh_flush, "flush")
XINBOUND0(xh_do_read, "read")

static int xh_read(nr_ctx_t *ctx, void *msg) {
  lnr_push_msg(lnr_current_state()->L, msg);
  xdispatch(ctx, 1, "channel_read");
  return 0;
}

static int xh_user_event(nr_ctx_t *ctx, void *evt) {
  lnr_push_msg(lnr_current_state()->L, evt);
  xdispatch(ctx, 1, "user_event_triggered");
  return 0;
}

static int xh_exception(nr_ctx_t *ctx, const nr_err_t *err) {
  lua_pushstring(lnr_current_state()->L,
                 err->msg ? err->msg : nr_strerror(err->code));
  xdispatch(ctx, 1, "exception_caught");
  return 0;
}

static int xh_write(nr_ctx_t *ctx, void *msg, nr_promise_t *p) {
  lua_State *L = lnr_current_state()->L;
  lnr_push_msg(L, msg);
  push_opt_promise(L, p);
  xdispatch(ctx, 2, "write");
  return 0;
}

static int xh_close(nr_ctx_t *ctx, nr_promise_t *p) {
  push_opt_promise(lnr_current_state()->L, p);
  xdispatch(ctx, 1, "close");
  return 0;
}

static void xh_added(nr_ctx_t *ctx) {
  xh_t *x = nr_ctx_state(ctx);
  x->ctx = nr_ctx_retain(ctx);
  xdispatch(ctx, 0, "handler_added");
}

static int xh_home_ref(const xh_t *x) { return x->home_ref; }

static void xh_removed(nr_ctx_t *ctx) {
  xh_t *x = nr_ctx_state(ctx);
  xdispatch(ctx, 0, "handler_removed");
  luaL_unref(lnr_current_state()->L, LUA_REGISTRYINDEX, x->home_ref);
  x->home_ref = LUA_NOREF;
  if (x->ctx)
    nr_ctx_release(x->ctx);
  x->ctx = NULL;
  xh_release(x);                               /* the pipeline's reference */
}

static unsigned xh_mask(const nr_handler_t *vt, void *state) {
  (void)vt;
  return ((xh_t *)state)->mask;
}

static const nr_handler_t exec_vt = {
    .type = "lua-executor", .added = xh_added, .removed = xh_removed,
    .registered = xh_registered, .unregistered = xh_unregistered,
    .active = xh_active, .inactive = xh_inactive, .read = xh_read,
    .read_complete = xh_read_complete, .user_event = xh_user_event,
    .writability_changed = xh_writability, .exception = xh_exception,
    .close = xh_close, .do_read = xh_do_read, .write = xh_write,
    .flush = xh_flush, .mask = xh_mask};

/* The proxy for handler h (at idx) on an executor of group g. */
static const nr_handler_t *make_exec_handler(lua_State *L, nr_loop_t *exec,
                                             nr_channel_t *ch, const char *name,
                                             int idx, void **state) {
  if (!lua_istable(L, idx) && !lua_isuserdata(L, idx))
    luaL_error(L, "a handler must be a table or an object, got a %s",
               luaL_typename(L, idx));
  unsigned mask = X_INBOUND | X_OUTBOUND;      /* every event takes the hop */
  check_method_names(L, idx, name);
  /* Metatables do not cross states (DESIGN.md §3): send h with its methods
   * as found here, through __index. */
  idx = lua_absindex(L, idx);
  lua_pushvalue(L, idx);
  lua_newtable(L);
  for (size_t i = 0; i < sizeof methods / sizeof methods[0] + 2; i++) {
    const char *m = i < 2 ? (i ? "handler_removed" : "handler_added")
                          : methods[i - 2].name;
    if (lua_getfield(L, idx, m) == LUA_TFUNCTION)
      lua_setfield(L, -2, m);
    else
      lua_pop(L, 1);
  }
  lnr_blob_t *b = lnr_pack(L, -2, 2, "handler");    /* may raise: first */
  lua_pop(L, 2);
  xh_t *x = calloc(1, sizeof *x + strlen(name) + 1);
  if (x == NULL) {
    lnr_blob_free(b);
    luaL_error(L, "out of memory");
  }
  atomic_init(&x->refs, 1);
  strcpy(x->name, name);
  x->handler = b;
  x->mask = mask;
  lua_pushvalue(L, idx);
  x->home_ref = luaL_ref(L, LUA_REGISTRYINDEX);
  x->exec = exec;
  x->ch = nr_channel_retain(ch);
  x->home = nr_channel_loop(ch);
  *state = x;
  return &exec_vt;
}

/* ---- the xctx: what h may do, from its executor ------------------------------ */

static xh_t *check_xctx(lua_State *L) {
  return *(xh_t **)luaL_checkudata(L, 1, XCTX);
}

/* Runs on the channel's loop: the operation packed as (op, value). */
static int xop_p(lua_State *L) {
  lnr_blob_t *b = lua_touserdata(L, 1);
  xh_t *x = b->user;
  nr_promise_t *p = b->user2;
  lua_settop(L, 0);
  lnr_unpack(L, b);
  nr_ctx_t *ctx = x->ctx;
  switch ((int)lua_tointeger(L, 1)) {
  case XOP_READ: lnr_with_msg(L, 2, NULL, fire_read_fn, ctx, NULL); break;
  case XOP_READ_COMPLETE: nr_ctx_fire_read_complete(ctx); break;
  case XOP_ACTIVE: nr_ctx_fire_active(ctx); break;
  case XOP_INACTIVE: nr_ctx_fire_inactive(ctx); break;
  case XOP_REGISTERED: nr_ctx_fire_registered(ctx); break;
  case XOP_UNREGISTERED: nr_ctx_fire_unregistered(ctx); break;
  case XOP_WRITABILITY: nr_ctx_fire_writability_changed(ctx); break;
  case XOP_USER_EVENT: {
    lnr_lmsg_t m = {NR_MSG_LUA, L, 2};
    nr_ctx_fire_user_event(ctx, &m);
    break;
  }
  case XOP_EXCEPTION: {
    nr_err_t err = {NR_EHANDLER, luaL_tolstring(L, 2, NULL)};
    nr_ctx_fire_exception(ctx, &err);
    break;
  }
  case XOP_WRITE:
  case XOP_WRITE_FLUSH:
    lnr_with_msg(L, 2, x->ch, ctx_write_fn, ctx, p);
    if (lua_tointeger(L, 1) == XOP_WRITE_FLUSH)
      nr_ctx_flush(ctx);
    break;
  case XOP_FLUSH: nr_ctx_flush(ctx); break;
  case XOP_CLOSE: nr_ctx_close(ctx, p); break;
  case XOP_DO_READ: nr_ctx_read(ctx); break;
  }
  return 0;
}

static int xop_task(void *arg) {
  lnr_blob_t *b = arg;
  xh_t *x = b->user;
  nr_promise_t *p = b->user2;
  lnr_state_t *S = lnr_current_state();
  if (S == NULL || S->closing || x->ctx == NULL) {
    if (p)
      nr_promise_set_failure(p, NR_ECLOSED, "handler removed");
  } else {
    lua_State *L = S->L;
    LNR_STACK_BEGIN(L);
    lua_pushcfunction(L, xop_p);
    lua_pushlightuserdata(L, b);
    if (lnr_pcall(L, 1, 0) != LUA_OK) {
      if (p)
        nr_promise_set_failure(p, NR_EHANDLER, lua_tostring(L, -1));
      else
        nr_log(NR_LOG_ERROR, "handler '%s': %s", x->name, lua_tostring(L, -1));
      lua_pop(L, 1);
    }
    LNR_STACK_END(L, 0);
  }
  if (p)
    nr_promise_release(p);
  xh_release(x);
  lnr_blob_free(b);
  return 0;
}

/* Queue (op, the nvals values on top) to the channel's loop; pops them.
 * Raises if a value cannot transfer (a mistake of the caller). */
static void xsend(lua_State *L, xh_t *x, int op, int nvals, nr_promise_t *p) {
  lua_pushinteger(L, op);
  lua_insert(L, -nvals - 1);
  lnr_blob_t *b = xpack(L, nvals + 1);
  if (b == NULL)
    lua_error(L);
  b->user = xh_retain(x);
  b->user2 = p ? nr_promise_retain(p) : NULL;
  b->task.fn = xop_task;
  b->task.arg = b;
  if (nr_loop_execute_task(x->home, &b->task) < 0) {
    if (p) {
      nr_promise_set_failure(p, NR_ECLOSED, "channel closed");
      nr_promise_release(p);
    }
    xh_release(x);
    lnr_blob_free(b);
  }
}

#define XFIRE0(cname, op)                                                   \
  static int cname(lua_State *L) {                                          \
    xsend(L, check_xctx(L), op, 0, NULL);                                   \
    lua_settop(L, 1);                                                       \
    return 1;                                                               \
  }
XFIRE0(x_fire_registered, XOP_REGISTERED)
XFIRE0(x_fire_unregistered, XOP_UNREGISTERED)
XFIRE0(x_fire_active, XOP_ACTIVE)
XFIRE0(x_fire_inactive, XOP_INACTIVE)
XFIRE0(x_fire_read_complete, XOP_READ_COMPLETE)
XFIRE0(x_fire_writability, XOP_WRITABILITY)
XFIRE0(x_flush, XOP_FLUSH)
XFIRE0(x_read, XOP_DO_READ)

static int x_fire1(lua_State *L, int op) {
  xh_t *x = check_xctx(L);
  luaL_checkany(L, 2);
  lua_settop(L, 2);
  xsend(L, x, op, 1, NULL);
  return 1;
}

static int x_fire_read(lua_State *L) { return x_fire1(L, XOP_READ); }
static int x_fire_user_event(lua_State *L) { return x_fire1(L, XOP_USER_EVENT); }
static int x_fire_exception(lua_State *L) {
  luaL_tolstring(L, 2, NULL);
  lua_replace(L, 2);
  return x_fire1(L, XOP_EXCEPTION);
}

/* xctx:write(msg [, promise]) and the rest: a future completed on the
 * channel's loop. */
static int x_write_op(lua_State *L, int op, int nvals) {
  xh_t *x = check_xctx(L);
  int pidx = nvals + 2;
  nr_promise_t *p = opt_promise(L, pidx);      /* pushes the future */
  int fut = lua_gettop(L);
  for (int i = 2; i < 2 + nvals; i++)
    lua_pushvalue(L, i);
  xsend(L, x, op, nvals, p);
  lua_pushvalue(L, fut);
  return 1;
}

static int x_write(lua_State *L) {
  luaL_checkany(L, 2);
  return x_write_op(L, XOP_WRITE, 1);
}
static int x_write_and_flush(lua_State *L) {
  luaL_checkany(L, 2);
  return x_write_op(L, XOP_WRITE_FLUSH, 1);
}
static int x_close(lua_State *L) { return x_write_op(L, XOP_CLOSE, 0); }

static int x_loop(lua_State *L) {
  lnr_push_handle(L, LNR_LOOP, check_xctx(L)->exec);
  return 1;
}

static int xctx_index(lua_State *L) {
  xh_t *x = check_xctx(L);
  const char *k = luaL_checkstring(L, 2);
  if (luaL_getmetafield(L, 1, "methods") == LUA_TTABLE) {
    lua_getfield(L, -1, k);
    if (!lua_isnil(L, -1))
      return 1;
    lua_pop(L, 2);
  }
  if (strcmp(k, "channel") == 0)
    lnr_push_handle(L, LNR_CHANNEL, x->ch);
  else if (strcmp(k, "name") == 0)
    lua_pushstring(L, x->name);
  else if (strcmp(k, "handler") == 0)
    push_xhandler(L, x), lua_pop(L, 2);
  else
    lua_pushnil(L);
  return 1;
}

static int xctx_gc(lua_State *L) {
  xh_t **u = luaL_checkudata(L, 1, XCTX);
  if (*u)
    xh_release(*u);
  *u = NULL;
  return 0;
}

static int xctx_tostring(lua_State *L) {
  lua_pushfstring(L, "netrun.ctx(%s on %s)", check_xctx(L)->name,
                  nr_loop_name(check_xctx(L)->exec));
  return 1;
}

static void open_xctx(lua_State *L) {
  static const luaL_Reg methods[] = {
      {"fire_channel_registered", x_fire_registered},
      {"fire_channel_unregistered", x_fire_unregistered},
      {"fire_channel_active", x_fire_active},
      {"fire_channel_inactive", x_fire_inactive},
      {"fire_channel_read", x_fire_read},
      {"fire_channel_read_complete", x_fire_read_complete},
      {"fire_user_event_triggered", x_fire_user_event},
      {"fire_channel_writability_changed", x_fire_writability},
      {"fire_exception_caught", x_fire_exception},
      {"write", x_write}, {"write_and_flush", x_write_and_flush},
      {"flush", x_flush}, {"read", x_read}, {"close", x_close},
      {"loop", x_loop}, {NULL, NULL}};
  luaL_newmetatable(L, XCTX);
  lua_newtable(L);
  luaL_setfuncs(L, methods, 0);
  lua_setfield(L, -2, "methods");
  lua_pushcfunction(L, xctx_index);
  lua_setfield(L, -2, "__index");
  lua_pushcfunction(L, xctx_gc);
  lua_setfield(L, -2, "__gc");
  lua_pushcfunction(L, xctx_tostring);
  lua_setfield(L, -2, "__tostring");
  lua_pop(L, 1);
}

void lnr_open_pipeline(lua_State *L) {
  static const luaL_Reg ctx_methods[] = {
      {"fire_channel_registered", c_fire_registered},
      {"fire_channel_unregistered", c_fire_unregistered},
      {"fire_channel_active", c_fire_active},
      {"fire_channel_inactive", c_fire_inactive},
      {"fire_channel_read", c_fire_read},
      {"fire_channel_read_complete", c_fire_read_complete},
      {"fire_user_event_triggered", c_fire_user_event},
      {"fire_channel_writability_changed", c_fire_writability},
      {"fire_exception_caught", c_fire_exception},
      {"write", c_write}, {"write_and_flush", c_write_and_flush},
      {"flush", c_flush}, {"read", c_read}, {"close", c_close},
      {"loop", c_loop}, {"void_promise", c_void_promise}, {NULL, NULL}};
  luaL_newmetatable(L, CTX);
  lua_pushvalue(L, -1);
  lua_rawsetp(L, LUA_REGISTRYINDEX, &CTX_KEY);
  lua_newtable(L);                               /* mt methods */
  lnr_push_class(L, LNR_FUTURE);
  lnr_push_lazy_class(L);
  luaL_setfuncs(L, ctx_methods, 2);   /* upvalues: FUTURE_MT, LAZY_MT */
  lua_pushvalue(L, -1);
  lua_setfield(L, -3, "methods");     /* mt methods */
  lua_pushcclosure(L, ctx_index, 1);  /* upvalue: CTX_METHODS */
  lua_setfield(L, -2, "__index");
  lua_pushcfunction(L, ctx_tostring);
  lua_setfield(L, -2, "__tostring");
  lua_pop(L, 1);
  luaL_newmetatable(L, CTX_HANDLE);
  lua_pushcfunction(L, ctx_gc);
  lua_setfield(L, -2, "__gc");
  lua_rawsetp(L, LUA_REGISTRYINDEX, &CTX_HANDLE_KEY);
  static const luaL_Reg pipe_methods[] = {
      {"add_first", p_add_first}, {"add_last", p_add_last},
      {"add_before", p_add_before}, {"add_after", p_add_after},
      {"remove", p_remove}, {"replace", p_replace}, {"get", p_get},
      {"context", p_context}, {"names", p_names}, {"first", p_first},
      {"last", p_last}, {"channel", p_channel},
      {"fire_channel_registered", p_fire_registered},
      {"fire_channel_unregistered", p_fire_unregistered},
      {"fire_channel_active", p_fire_active},
      {"fire_channel_inactive", p_fire_inactive},
      {"fire_channel_read", p_fire_read},
      {"fire_channel_read_complete", p_fire_read_complete},
      {"fire_user_event_triggered", p_fire_user_event},
      {"fire_channel_writability_changed", p_fire_writability},
      {"fire_exception_caught", p_fire_exception},
      {"write", p_write}, {"write_and_flush", p_write_and_flush},
      {"flush", p_flush}, {"close", p_close}, {NULL, NULL}};
  static const luaL_Reg pipe_meta[] = {{"__gc", pipe_gc},
                                       {"__tostring", p_tostring},
                                       {NULL, NULL}};
  lnr_new_class(L, PIPELINE, pipe_methods, pipe_meta);
  open_xctx(L);
  /* ch:pipeline() */
  luaL_getmetatable(L, lnr_kind_names[LNR_CHANNEL]);
  lua_getfield(L, -1, "__index");
  lua_pushcfunction(L, l_channel_pipeline);
  lua_setfield(L, -2, "pipeline");
  lua_pop(L, 2);
}
