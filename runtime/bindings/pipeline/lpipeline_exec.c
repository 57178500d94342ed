/*
 * lpipeline_exec.c -- handlers on an executor group.
 *
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
 * While an event is on its way or being handled there, the channel's loop
 * is owed what h sends back (nr_loop_hold): a graceful shutdown waits for
 * it before closing the channel.
 *
 * Threads: the ctx is touched only on the channel's loop (retained in
 * added, released in removed); h and its xctx only in the executor's state
 * (registry, keyed by the proxy); the proxy itself is reference counted by
 * the pipeline, every event or operation in flight and every xctx.
 */
#include <stdlib.h>
#include <string.h>

#include "lpipeline.h"

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

void lnr_xh_release(xh_t *x) {
  if (atomic_fetch_sub(&x->refs, 1) != 1)
    return;
  lnr_blob_free(x->handler);
  nr_channel_release(x->ch);
  free(x);
}

/* Operations an xctx sends back to the channel's loop. */
enum { XOP_READ, XOP_READ_COMPLETE, XOP_ACTIVE, XOP_INACTIVE, XOP_REGISTERED,
       XOP_UNREGISTERED, XOP_WRITABILITY, XOP_USER_EVENT, XOP_EXCEPTION,
       XOP_WRITE, XOP_WRITE_FLUSH, XOP_FLUSH, XOP_CLOSE, XOP_DO_READ,
       XOP_READ_FAILED };

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
    S->read_ctx = x;                    /* b->token: a read's, else 0 */
    S->read_token = b->token;
    int rc = lnr_pcall(L, 1, 0);
    S->read_ctx = NULL;
    if (rc != LUA_OK) {
      xroute_error(L, x, method);
      if (b->token != 0) {              /* its producer answers for it */
        lua_pushinteger(L, (lua_Integer)b->token);
        xsend(L, x, XOP_READ_FAILED, 1, NULL);
      }
    }
    if (strcmp(method, "handler_removed") == 0)
      xforget(L, x);
    LNR_STACK_END(L, 0);
    lua_settop(L, top);
  }
  nr_loop_unhold(x->home);             /* after what h sent back */
  lnr_xh_release(x);
  lnr_blob_free(b);
  return 0;
}

/* ---- on the channel's loop: the proxy handler ------------------------------ */

/* Send the n values on top to h's executor, for h:method(); pops them.
 * `method` is a literal: it travels as a pointer. */
static void xdispatch_read(nr_ctx_t *ctx, int n, const char *method,
                           uint64_t token) {
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
  b->token = token;
  b->task.fn = xevent_task;
  b->task.arg = b;
  nr_loop_hold(x->home);               /* h's answers come back to it */
  if (nr_loop_execute_task(x->exec, &b->task) < 0) {
    nr_log(NR_LOG_WARN, "handler '%s': executor %s is shut down, %s dropped",
           x->name, nr_loop_name(x->exec), method);
    nr_loop_unhold(x->home);
    lnr_xh_release(x);
    lnr_blob_free(b);
  }
}

static void xdispatch(nr_ctx_t *ctx, int n, const char *method) {
  xdispatch_read(ctx, n, method, 0);
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
XINBOUND0(xh_channel_read_complete, "channel_read_complete")
XINBOUND0(xh_writability, "channel_writability_changed")
XINBOUND0(xh_flush, "flush")
XINBOUND0(xh_read, "read")

/* A read's token goes with it: h's failure on it, or the read h fires on
 * while handling it, names it to its producer on the channel's loop. */
static int xh_channel_read(nr_ctx_t *ctx, void *msg) {
  lnr_push_msg(lnr_current_state()->L, msg);
  xdispatch_read(ctx, 1, "channel_read", nr_ctx_read_token(ctx, msg));
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
  lnr_push_opt_promise(L, p);
  xdispatch(ctx, 2, "write");
  return 0;
}

static int xh_close(nr_ctx_t *ctx, nr_promise_t *p) {
  lnr_push_opt_promise(lnr_current_state()->L, p);
  xdispatch(ctx, 1, "close");
  return 0;
}

static void xh_added(nr_ctx_t *ctx) {
  xh_t *x = nr_ctx_state(ctx);
  x->ctx = nr_ctx_retain(ctx);
  xdispatch(ctx, 0, "handler_added");
}

int lnr_xh_home_ref(const xh_t *x) { return x->home_ref; }

static void xh_removed(nr_ctx_t *ctx) {
  xh_t *x = nr_ctx_state(ctx);
  xdispatch(ctx, 0, "handler_removed");
  luaL_unref(lnr_current_state()->L, LUA_REGISTRYINDEX, x->home_ref);
  x->home_ref = LUA_NOREF;
  if (x->ctx)
    nr_ctx_release(x->ctx);
  x->ctx = NULL;
  lnr_xh_release(x);                               /* the pipeline's reference */
}

static unsigned xh_mask(const nr_handler_t *vt, void *state) {
  (void)vt;
  return ((xh_t *)state)->mask;
}

const nr_handler_t lnr_exec_vt = {
    .type = "lua-executor", .added = xh_added, .removed = xh_removed,
    .registered = xh_registered, .unregistered = xh_unregistered,
    .active = xh_active, .inactive = xh_inactive,
    .channel_read = xh_channel_read,
    .channel_read_complete = xh_channel_read_complete,
    .user_event = xh_user_event,
    .writability_changed = xh_writability, .exception = xh_exception,
    .close = xh_close, .read = xh_read, .write = xh_write,
    .flush = xh_flush, .mask = xh_mask};

/* The proxy for handler h (at idx) on an executor of group g. */
const nr_handler_t *lnr_make_exec_handler(lua_State *L, nr_loop_t *exec,
                                             nr_channel_t *ch, const char *name,
                                             int idx, void **state) {
  if (!lua_istable(L, idx) && !lua_isuserdata(L, idx))
    luaL_error(L, "a handler must be a table or an object, got a %s",
               luaL_typename(L, idx));
  unsigned mask = X_INBOUND | X_OUTBOUND;      /* every event takes the hop */
  lnr_check_method_names(L, idx, name);
  /* Metatables do not cross states (DESIGN.md §3): send h with its methods
   * as found here, through __index. */
  idx = lua_absindex(L, idx);
  lua_pushvalue(L, idx);
  lua_newtable(L);
  const char *m;
  for (size_t i = 0; (m = lnr_event_method(i)) != NULL; i++) {
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
  return &lnr_exec_vt;
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
  case XOP_READ: {
    uint64_t token = (uint64_t)lua_tointeger(L, 3);     /* 0 when none */
    lnr_msgbuf_t m;
    void *msg = lnr_to_msg(L, 2, NULL, &m);
    if (token != 0)
      nr_ctx_fire_read_tokened(ctx, msg, token, false);
    else
      nr_ctx_fire_read(ctx, msg);
    lnr_msg_done(&m);
    break;
  }
  case XOP_READ_FAILED:
    nr_ctx_read_failed(ctx, (uint64_t)lua_tointeger(L, 2));
    break;
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
    {
      lnr_msgbuf_t m;
      nr_ctx_write(ctx, lnr_to_msg(L, 2, x->ch, &m), p);
      lnr_msg_done(&m);
    }
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
  lnr_xh_release(x);
  lnr_blob_free(b);
  return 0;
}

/* Queue (op, the nvals values on top) to the channel's loop; pops them.
 * Raises if a value cannot transfer (a mistake of the caller). */
static void xsend(lua_State *L, xh_t *x, int op, int nvals, nr_promise_t *p) {
  if (op == XOP_READ) {               /* fired while h handles a read */
    lnr_state_t *S = lnr_state(L);
    if (S != NULL && S->read_ctx == x && S->read_token != 0) {
      lua_pushinteger(L, (lua_Integer)S->read_token);
      nvals++;
    }
  }
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
    lnr_xh_release(x);
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
  nr_promise_t *p = lnr_opt_promise(L, pidx);      /* pushes the future */
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
    lnr_xh_release(*u);
  *u = NULL;
  return 0;
}

static int xctx_tostring(lua_State *L) {
  lua_pushfstring(L, "netrun.ctx(%s on %s)", check_xctx(L)->name,
                  nr_loop_name(check_xctx(L)->exec));
  return 1;
}

void lnr_open_xctx(lua_State *L) {
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

