/*
 * lpipeline_handler.c -- a Lua handler in the C pipeline: one vtable
 * (lnr_lua_vt) whose skip mask comes from the handler table's methods
 * (looked up through metatables, once per table and state, and cached in
 * an hrec_t), so an absent method costs nothing. Methods are called as
 * h:method(ctx, ...) in protected mode (lnr_lh_begin, lnr_lh_finish); an
 * error goes to that same handler's exception_caught (with its
 * traceback), or on down the pipeline (lnr_lh_route_error).
 *
 * Invariants: every callback but handler_added/removed enters through
 * lnr_lh_enter (lpipeline_batch.c), so reads waiting for the handler are
 * delivered before anything else reaches it; channel_read and
 * channel_read_complete live with the batches they feed. Every call
 * leaves the state's stack as it found it (LNR_STACK_MARK/UNMARK).
 *
 * Threads: loop thread only. A handler's lh_t, its ctx table and its
 * hrec_t belong to the state of the channel's loop.
 */
#include <stdlib.h>
#include <string.h>

#include "lpipeline.h"

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

const char *lnr_event_method(size_t i) {
  size_t n = sizeof methods / sizeof methods[0];
  return i < 2 ? (i ? "handler_removed" : "handler_added")
               : i - 2 < n ? methods[i - 2].name : NULL;
}

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
 * is computed once per handler, as Netty computes it once per class);
 * *made tells whether it was made now. */
static const hrec_t *handler_rec(lua_State *L, int idx, bool *made) {
  idx = lua_absindex(L, idx);
  lnr_push_weak_keyed(L, &lnr_pipe_part(lnr_state(L))->recs_ref, &RECS, "k");
  lua_pushvalue(L, idx);
  *made = false;
  if (lua_rawget(L, -2) == LUA_TUSERDATA) {
    const hrec_t *r = lua_touserdata(L, -1);
    lua_pop(L, 2);                    /* still referenced by the table */
    return r;
  }
  *made = true;
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
  const char *m;
  for (size_t i = 0; (m = lnr_event_method(i)) != NULL; i++) {
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
void lnr_check_method_names(lua_State *L, int idx, const char *handler) {
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

/* Push the message handler, the method, self and ctx, in that order (no
 * stack rotation: this runs twice per message); returns the state. */
lua_State *lnr_lh_begin(nr_ctx_t *ctx, const char *method) {
  lh_t *h = nr_ctx_state(ctx);
  lua_State *L = h->S->L;
  LNR_STACK_MARK(h->S);                          /* checked as it ends */
  h->S->converting = true;                       /* until call() */
  if (h->ctx_ref == LUA_NOREF)
    lnr_ensure_ctx(ctx);
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
lua_State *lnr_lh_begin_ref(nr_ctx_t *ctx, int fn_ref, const char *method) {
  lh_t *h = nr_ctx_state(ctx);
  lua_State *L = h->S->L;
  if (fn_ref == LUA_NOREF || h->ctx_ref == LUA_NOREF)
    return lnr_lh_begin(ctx, method);
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
int lnr_lh_call(nr_ctx_t *ctx, lua_State *L, int nargs) {
  ((lh_t *)nr_ctx_state(ctx))->S->converting = false;
  return lua_pcall(L, nargs + 2, 0, -(nargs + 4));
}

void lnr_lh_route_error(nr_ctx_t *ctx, lua_State *L, const char *method) {
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
      lnr_lh_begin(ctx, "exception_caught");
      lua_pushstring(L, msg);
      if (lnr_lh_call(ctx, L, 1) != LUA_OK)
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

int lnr_lh_finish(nr_ctx_t *ctx, lua_State *L, int nargs, const char *method) {
  if (lnr_lh_call(ctx, L, nargs) != LUA_OK)
    lnr_lh_route_error(ctx, L, method);                 /* pops the message */
  lua_pop(L, 1);                                 /* msgh */
  LNR_STACK_UNMARK(((lh_t *)nr_ctx_state(ctx))->S, 0);
  return 0;
}

/* The end of a read at a handler with channel_read but no
 * channel_read_complete: what it wrote (or anyone before it) and did not
 * flush is flushed, then the event goes on. Netty leaves such writes
 * unsent until some later flush, and the peer waits forever; a handler
 * that wants to gather writes across reads flushes in its own
 * channel_read_complete, which turns this off. */
void lnr_read_complete_flushing(nr_ctx_t *ctx) {
  nr_channel_t *ch = nr_ctx_channel(ctx);
  if (nr_channel_is_open(ch) && nr_channel_has_unflushed(ch))
    nr_ctx_flush(ctx);
  nr_ctx_fire_read_complete(ctx);
}

/* ---- the callbacks --------------------------------------------------------- */

/* Each enters through lnr_lh_enter (lpipeline_batch.c), which delivers the
 * reads waiting for the handler first, and passes the event on when the
 * handler left meanwhile or has no method for it (an inbound event: a
 * handler with channel_read sees them all, see read batches). */
#define INBOUND0(cname, method, bit, fire)                                  \
  static int cname(nr_ctx_t *ctx) {                                         \
    if (!lnr_lh_enter(ctx, (bit))) {                                        \
      fire(ctx);                                                            \
      return 0;                                                             \
    }                                                                       \
    return lnr_lh_finish(ctx, lnr_lh_begin(ctx, method), 0, method);        \
  }
INBOUND0(lh_registered, "channel_registered", NR_EV_REGISTERED,
         nr_ctx_fire_registered)
INBOUND0(lh_unregistered, "channel_unregistered", NR_EV_UNREGISTERED,
         nr_ctx_fire_unregistered)
INBOUND0(lh_active, "channel_active", NR_EV_ACTIVE, nr_ctx_fire_active)
INBOUND0(lh_inactive, "channel_inactive", NR_EV_INACTIVE, nr_ctx_fire_inactive)

/* Outbound operations reach the handler only if it has their method (its
 * mask): lnr_lh_enter passes one on only when the handler left. */
#define OUTBOUND0(cname, method, bit, pass)                                 \
  static int cname(nr_ctx_t *ctx) {                                         \
    if (!lnr_lh_enter(ctx, (bit)))                                          \
      return pass(ctx);                                                     \
    return lnr_lh_finish(ctx, lnr_lh_begin(ctx, method), 0, method);        \
  }
OUTBOUND0(lh_flush, "flush", NR_OP_FLUSH, nr_ctx_flush)
OUTBOUND0(lh_read, "read", NR_OP_READ, nr_ctx_read)

/* Writable again: what the handler holds goes on first. */
static int lh_writability(nr_ctx_t *ctx) {
  if (!lnr_lh_enter_writability(ctx)) {
    nr_ctx_fire_writability_changed(ctx);
    return 0;
  }
  lua_State *L = lnr_lh_begin(ctx, "channel_writability_changed");
  return lnr_lh_finish(ctx, L, 0, "channel_writability_changed");
}

static int lh_user_event(nr_ctx_t *ctx, void *evt) {
  if (!lnr_lh_enter(ctx, NR_EV_USER_EVENT)) {
    nr_ctx_fire_user_event(ctx, evt);
    return 0;
  }
  lua_State *L = lnr_lh_begin(ctx, "user_event_triggered");
  lnr_push_msg(L, evt);
  return lnr_lh_finish(ctx, L, 1, "user_event_triggered");
}

static int lh_exception(nr_ctx_t *ctx, const nr_err_t *err) {
  if (!lnr_lh_enter(ctx, NR_EV_EXCEPTION)) {
    nr_ctx_fire_exception(ctx, err);
    return 0;
  }
  lua_State *L = lnr_lh_begin(ctx, "exception_caught");
  lua_pushstring(L, err->msg ? err->msg : nr_strerror(err->code));
  return lnr_lh_finish(ctx, L, 1, "exception_caught");
}

void lnr_push_opt_promise(lua_State *L, nr_promise_t *p) {
  if (p)
    lnr_push_promise(L, nr_promise_retain(p));
  else
    lua_pushnil(L);
}

static int lh_write(nr_ctx_t *ctx, void *msg, nr_promise_t *p) {
  if (!lnr_lh_enter(ctx, NR_OP_WRITE))
    return nr_ctx_write(ctx, msg, p);
  lua_State *L = lnr_lh_begin(ctx, "write");
  lnr_push_msg(L, msg);
  lnr_push_opt_promise(L, p);
  return lnr_lh_finish(ctx, L, 2, "write");
}

static int lh_close(nr_ctx_t *ctx, nr_promise_t *p) {
  if (!lnr_lh_enter(ctx, NR_OP_CLOSE))
    return nr_ctx_close(ctx, p);
  lua_State *L = lnr_lh_begin(ctx, "close");
  lnr_push_opt_promise(L, p);
  return lnr_lh_finish(ctx, L, 1, "close");
}

static int lh_disconnect(nr_ctx_t *ctx, nr_promise_t *p) {
  if (!lnr_lh_enter(ctx, NR_OP_DISCONNECT))
    return nr_ctx_disconnect(ctx, p);
  lua_State *L = lnr_lh_begin(ctx, "disconnect");
  lnr_push_opt_promise(L, p);
  return lnr_lh_finish(ctx, L, 1, "disconnect");
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
  if (!lnr_lh_enter(ctx, NR_OP_BIND))
    return nr_ctx_bind(ctx, sa, len, p);
  lua_State *L = lnr_lh_begin(ctx, "bind");
  push_sockaddr(L, sa, len);
  lnr_push_opt_promise(L, p);
  return lnr_lh_finish(ctx, L, 3, "bind");
}

static int lh_connect(nr_ctx_t *ctx, const struct sockaddr *sa,
                      socklen_t len, nr_promise_t *p) {
  if (!lnr_lh_enter(ctx, NR_OP_CONNECT))
    return nr_ctx_connect(ctx, sa, len, p);
  lua_State *L = lnr_lh_begin(ctx, "connect");
  push_sockaddr(L, sa, len);
  lnr_push_opt_promise(L, p);
  return lnr_lh_finish(ctx, L, 3, "connect");
}

/* A handler without handler_added costs no ctx until it is first called:
 * idle connections hold none. */
static void lh_added(nr_ctx_t *ctx) {
  lh_t *h = nr_ctx_state(ctx);
  if (h->rec->added)
    lnr_lh_finish(ctx, lnr_lh_begin(ctx, "handler_added"), 0, "handler_added");
}

void lnr_lh_free(lua_State *L, lh_t *h) {
  lnr_batch_forget(h);
  if (h->ctx_table != NULL && h->S->ctx_table == h->ctx_table)
    h->S->ctx_table = NULL;          /* no longer anchored by ctx_ref */
  luaL_unref(L, LUA_REGISTRYINDEX, h->ref);
  luaL_unref(L, LUA_REGISTRYINDEX, h->ctx_ref);
  free(h);
}

static void lh_removed(nr_ctx_t *ctx) {
  lh_t *h = nr_ctx_state(ctx);
  lnr_batch_handler_removed(ctx);      /* it takes what waits for it first */
  if (h->rec->removed)
    lnr_lh_finish(ctx, lnr_lh_begin(ctx, "handler_removed"), 0, "handler_removed");
  lnr_lh_free(h->S->L, h);
}

/* Whether the handler at idx may lead to tables not yet scanned for
 * misspelled events. A table whose record was made before was scanned
 * then (CHECKED keeps it as long as it lives); with no metatable it leads
 * nowhere else, so a handler table shared by every connection is scanned
 * once, not per connection. One with a metatable may lead (through
 * __index) to tables not seen yet; an object (userdata) has nothing
 * scanned. */
static bool scan_needed(lua_State *L, int idx, bool made) {
  if (made)
    return true;
  if (!lua_istable(L, idx) || !lua_getmetatable(L, idx))
    return false;
  lua_pop(L, 1);
  return true;
}

/* The state of a Lua handler: its table (or object) anchored, its record
 * made, its misspelled methods reported. */
const nr_handler_t *lnr_make_lua_handler(lua_State *L, int idx,
                                         const char *name, void **state) {
  if (!lua_istable(L, idx) && !lua_isuserdata(L, idx))
    luaL_error(L, "a handler must be a table or an object, got a %s",
               luaL_typename(L, idx));
  lnr_state_t *S = lnr_state(L);
  lh_t *h = calloc(1, sizeof *h);
  if (h == NULL)
    luaL_error(L, "out of memory");
  h->S = S;
  lua_pushvalue(L, idx);
  h->ref = luaL_ref(L, LUA_REGISTRYINDEX);
  h->ctx_ref = LUA_NOREF;
  bool made;
  h->rec = handler_rec(L, idx, &made);
  if (scan_needed(L, idx, made))
    lnr_check_method_names(L, idx, name);
  *state = h;
  return &lnr_lua_vt;
}

static unsigned lh_mask(const nr_handler_t *vt, void *state) {
  (void)vt;
  lh_t *h = state;
  return h->rec->mask;
}

const nr_handler_t lnr_lua_vt = {
    .type = "lua", .added = lh_added, .removed = lh_removed,
    .registered = lh_registered, .unregistered = lh_unregistered,
    .active = lh_active, .inactive = lh_inactive,
    .channel_read = lnr_lh_channel_read,
    .channel_read_complete = lnr_lh_channel_read_complete,
    .user_event = lh_user_event,
    .writability_changed = lh_writability, .exception = lh_exception,
    .bind = lh_bind, .connect = lh_connect, .disconnect = lh_disconnect,
    .close = lh_close, .read = lh_read, .write = lh_write,
    .flush = lh_flush, .mask = lh_mask};

