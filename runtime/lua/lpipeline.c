/*
 * lpipeline.c -- Lua handlers in the C pipeline, and the ctx and pipeline
 * objects Lua sees. Loop thread only: a handler's state is the loop's.
 *
 * A Lua handler is one C vtable whose skip mask comes from the handler
 * table's methods (looked up through metatables, once per table and cached),
 * so an absent method costs nothing. Methods are called as h:method(ctx,
 * ...) in protected mode; an error goes to that same handler's
 * exception_caught (with its traceback), or on down the pipeline.
 */
#include <stdlib.h>
#include <string.h>

#include "lnr.h"

typedef struct lh_s {
  lnr_state_t *S;
  int ref;                   /* the handler (table or object) */
  int ctx_ref;               /* the ctx userdata */
} lh_t;

typedef struct lctx_s {
  nr_ctx_t *ctx;
} lctx_t;

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

static const char MASKS = 0;          /* handler -> mask, weak keys */

/* The skip mask of the handler at idx, computed once per handler. */
static unsigned handler_mask(lua_State *L, int idx) {
  idx = lua_absindex(L, idx);
  if (lua_rawgetp(L, LUA_REGISTRYINDEX, &MASKS) != LUA_TTABLE) {
    lua_pop(L, 1);
    lua_newtable(L);
    lua_newtable(L);
    lua_pushliteral(L, "k");
    lua_setfield(L, -2, "__mode");
    lua_setmetatable(L, -2);
    lua_pushvalue(L, -1);
    lua_rawsetp(L, LUA_REGISTRYINDEX, &MASKS);
  }
  lua_pushvalue(L, idx);
  if (lua_rawget(L, -2) == LUA_TNUMBER) {
    unsigned m = (unsigned)lua_tointeger(L, -1);
    lua_pop(L, 2);
    return m;
  }
  lua_pop(L, 1);
  unsigned m = 0;
  for (size_t i = 0; i < sizeof methods / sizeof methods[0]; i++) {
    lua_getfield(L, idx, methods[i].name);
    if (lua_isfunction(L, -1))
      m |= methods[i].bit;
    lua_pop(L, 1);
  }
  lua_pushvalue(L, idx);
  lua_pushinteger(L, m);
  lua_rawset(L, -3);
  lua_pop(L, 1);
  return m;
}

/* ---- calling handler methods ------------------------------------------------ */

static void ensure_ctx(nr_ctx_t *ctx);

/* Push method, self and ctx; returns the state. */
static lua_State *begin(nr_ctx_t *ctx, const char *method) {
  lh_t *h = nr_ctx_state(ctx);
  lua_State *L = h->S->L;
  if (h->ctx_ref == LUA_NOREF)
    ensure_ctx(ctx);
  lua_rawgeti(L, LUA_REGISTRYINDEX, h->ref);
  lua_getfield(L, -1, method);
  lua_insert(L, -2);
  lua_rawgeti(L, LUA_REGISTRYINDEX, h->ctx_ref);
  return L;
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
      if (lnr_pcall(L, 3, 0) != LUA_OK)
        lnr_log_error(L, "exception_caught raised");
      lua_pop(L, 1);
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
  if (lnr_pcall(L, nargs + 2, 0) != LUA_OK)
    route_error(ctx, L, method);
  return 0;
}

#define INBOUND0(cname, method)                                             \
  static int cname(nr_ctx_t *ctx) {                                         \
    lua_State *L = begin(ctx, method);                                      \
    return finish(ctx, L, 0, method);                                       \
  }
INBOUND0(lh_registered, "channel_registered")
INBOUND0(lh_unregistered, "channel_unregistered")
INBOUND0(lh_active, "channel_active")
INBOUND0(lh_inactive, "channel_inactive")
INBOUND0(lh_read_complete, "channel_read_complete")
INBOUND0(lh_writability, "channel_writability_changed")
INBOUND0(lh_flush, "flush")
INBOUND0(lh_do_read, "read")

static int lh_read(nr_ctx_t *ctx, void *msg) {
  lua_State *L = begin(ctx, "channel_read");
  lnr_push_msg(L, msg);
  return finish(ctx, L, 1, "channel_read");
}

static int lh_user_event(nr_ctx_t *ctx, void *evt) {
  lua_State *L = begin(ctx, "user_event_triggered");
  lnr_push_msg(L, evt);
  return finish(ctx, L, 1, "user_event_triggered");
}

static int lh_exception(nr_ctx_t *ctx, const nr_err_t *err) {
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
  lua_State *L = begin(ctx, "write");
  lnr_push_msg(L, msg);
  push_opt_promise(L, p);
  return finish(ctx, L, 2, "write");
}

static int lh_close(nr_ctx_t *ctx, nr_promise_t *p) {
  lua_State *L = begin(ctx, "close");
  push_opt_promise(L, p);
  return finish(ctx, L, 1, "close");
}

static int lh_disconnect(nr_ctx_t *ctx, nr_promise_t *p) {
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
  lua_State *L = begin(ctx, "bind");
  push_sockaddr(L, sa, len);
  push_opt_promise(L, p);
  return finish(ctx, L, 3, "bind");
}

static int lh_connect(nr_ctx_t *ctx, const struct sockaddr *sa,
                      socklen_t len, nr_promise_t *p) {
  lua_State *L = begin(ctx, "connect");
  push_sockaddr(L, sa, len);
  push_opt_promise(L, p);
  return finish(ctx, L, 3, "connect");
}

static void lh_added(nr_ctx_t *ctx) {
  lua_State *L = begin(ctx, "handler_added");
  if (lua_isfunction(L, -3))
    finish(ctx, L, 0, "handler_added");
  else
    lua_pop(L, 3);
}

static void lh_removed(nr_ctx_t *ctx) {
  lh_t *h = nr_ctx_state(ctx);
  lua_State *L = begin(ctx, "handler_removed");
  if (lua_isfunction(L, -3))
    finish(ctx, L, 0, "handler_removed");
  else
    lua_pop(L, 3);
  luaL_unref(L, LUA_REGISTRYINDEX, h->ref);
  luaL_unref(L, LUA_REGISTRYINDEX, h->ctx_ref);
  free(h);
}

static unsigned lh_mask(const nr_handler_t *vt, void *state) {
  (void)vt;
  lh_t *h = state;
  lua_State *L = h->S->L;
  lua_rawgeti(L, LUA_REGISTRYINDEX, h->ref);
  unsigned m = handler_mask(L, -1);
  lua_pop(L, 1);
  return m;
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

static void push_ctx(lua_State *L, nr_ctx_t *ctx) {
  lctx_t *c = lua_newuserdatauv(L, sizeof *c, 0);
  c->ctx = nr_ctx_retain(ctx);
  luaL_setmetatable(L, CTX);
}

static nr_ctx_t *check_ctx(lua_State *L, int idx) {
  lctx_t *c = luaL_checkudata(L, idx, CTX);
  nr_loop_t *loop = nr_channel_loop(nr_ctx_channel(c->ctx));
  if (!nr_loop_in_thread(loop))
    luaL_error(L, "a ctx can only be used on its channel's loop (%s)",
               nr_loop_name(loop));
  return c->ctx;
}

static int ctx_gc(lua_State *L) {
  lctx_t *c = luaL_checkudata(L, 1, CTX);
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
  } else {
    lua_pushstring(L, nr_ctx_handler(ctx)->type);
  }
}

static int ctx_index(lua_State *L) {
  lctx_t *c = luaL_checkudata(L, 1, CTX);
  const char *k = luaL_checkstring(L, 2);
  if (luaL_getmetafield(L, 1, "methods") == LUA_TTABLE) {
    lua_getfield(L, -1, k);
    if (!lua_isnil(L, -1))
      return 1;
    lua_pop(L, 2);
  }
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
    lua_pushnil(L);
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
  lnr_push_promise(L, p);
  return p;
}

static int ctx_do_write(lua_State *L, bool flush) {
  nr_ctx_t *ctx = check_ctx(L, 1);
  luaL_checkany(L, 2);
  nr_promise_t *p = write_promise(L, 3);
  lnr_with_msg(L, 2, nr_ctx_channel(ctx), ctx_write_fn, ctx, p);
  if (flush)
    nr_ctx_flush(ctx);
  return 1;
}

static int c_write(lua_State *L) { return ctx_do_write(L, false); }
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

static int c_loop(lua_State *L) {
  lnr_push_handle(L, LNR_LOOP, nr_channel_loop(nr_ctx_channel(check_ctx(L, 1))));
  return 1;
}

static int ctx_tostring(lua_State *L) {
  lctx_t *c = luaL_checkudata(L, 1, CTX);
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

static nr_pipeline_t *check_pipe(lua_State *L, int idx, bool mutate) {
  lpipe_t *p = luaL_checkudata(L, idx, PIPELINE);
  nr_loop_t *loop = nr_channel_loop(p->ch);
  if (mutate && (loop == NULL || !nr_loop_in_thread(loop)))
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
    if (nr_ctx_handler(c) != &lua_vt)
      continue;
    lh_t *h = nr_ctx_state(c);
    lua_rawgeti(L, LUA_REGISTRYINDEX, h->ref);
    bool same = lua_rawequal(L, -1, idx);
    lua_pop(L, 1);
    if (same)
      return c;
  }
  return NULL;
}

/* Builds the C handler for the value at idx: a Lua table or object, or a
 * native handler (userdata whose metatable has __netrun_native). */
static const nr_handler_t *make_handler(lua_State *L, int idx, void **state) {
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
  *state = h;
  return &lua_vt;
}

/* The ctx userdata exists once the context does: set it right after
 * linking (handler_added runs inside the link, so it is made there). */
static void attach_ctx(lua_State *L, nr_pipeline_t *p, const char *name) {
  nr_ctx_t *c = nr_pipeline_context(p, name);
  if (c && nr_ctx_handler(c) == &lua_vt) {
    lh_t *h = nr_ctx_state(c);
    if (h->ctx_ref == LUA_NOREF) {
      push_ctx(L, c);
      h->ctx_ref = luaL_ref(L, LUA_REGISTRYINDEX);
    }
  }
}

static int add_error(lua_State *L, int rc, const char *name, const char *base) {
  if (rc == -EEXIST)
    return luaL_error(L, "duplicate handler name '%s'", name);
  if (rc == -ENOENT)
    return luaL_error(L, "no handler named '%s' in the pipeline", base);
  return luaL_error(L, "cannot add handler '%s': %s", name, nr_strerror(rc));
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
    h->ctx_ref = luaL_ref(L, LUA_REGISTRYINDEX);
  }
}

static int do_add(lua_State *L, adder_fn add, bool with_base) {
  nr_pipeline_t *p = check_pipe(L, 1, true);
  int arg = 2;
  if (lnr_to_handle(L, arg, LNR_GROUP))
    return luaL_error(L, "handlers on an executor group are not supported "
                      "yet: run blocking work with group:submit() instead");
  const char *base = with_base ? luaL_checkstring(L, arg++) : NULL;
  const char *name = luaL_checkstring(L, arg++);
  luaL_checkany(L, arg);
  void *state = NULL;
  const nr_handler_t *vt = make_handler(L, arg, &state);
  int rc = add(p, base, name, vt, state);
  if (rc < 0) {
    if (vt == &lua_vt) {
      lh_t *h = state;
      luaL_unref(L, LUA_REGISTRYINDEX, h->ref);
      free(h);
    } else if (vt->removed == NULL) {
      free(state);
    }
    return add_error(L, rc, name, base);
  }
  attach_ctx(L, p, name);
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
  nr_pipeline_t *p = check_pipe(L, 1, true);
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
  nr_pipeline_t *p = check_pipe(L, 1, true);
  nr_ctx_t *c = find_ctx(L, p, 2);
  const char *name = luaL_checkstring(L, 3);
  luaL_checkany(L, 4);
  if (c == NULL)
    return luaL_error(L, "no such handler in the pipeline: %s",
                      luaL_tolstring(L, 2, NULL));
  push_handler(L, c);
  int old = lua_gettop(L);
  void *state = NULL;
  const nr_handler_t *vt = make_handler(L, 4, &state);
  int rc = nr_pipeline_replace(p, nr_ctx_name(c), name, vt, state);
  if (rc < 0)
    return add_error(L, rc, name, NULL);
  attach_ctx(L, p, name);
  lua_pushvalue(L, old);
  return 1;
}

static int p_get(lua_State *L) {
  nr_pipeline_t *p = check_pipe(L, 1, true);
  nr_ctx_t *c = nr_pipeline_context(p, luaL_checkstring(L, 2));
  if (c == NULL)
    lua_pushnil(L);
  else
    push_handler(L, c);
  return 1;
}

static int p_context(lua_State *L) {
  nr_pipeline_t *p = check_pipe(L, 1, true);
  nr_ctx_t *c = find_ctx(L, p, 2);
  if (c == NULL) {
    lua_pushnil(L);
  } else if (nr_ctx_handler(c) == &lua_vt) {
    lh_t *h = nr_ctx_state(c);
    lua_rawgeti(L, LUA_REGISTRYINDEX, h->ctx_ref);
  } else {
    push_ctx(L, c);
  }
  return 1;
}

static int p_names(lua_State *L) {
  nr_pipeline_t *p = check_pipe(L, 1, true);
  lua_newtable(L);
  int i = 1;
  for (nr_ctx_t *c = nr_pipeline_first(p); c; c = nr_ctx_next(c)) {
    lua_pushstring(L, nr_ctx_name(c));
    lua_rawseti(L, -2, i++);
  }
  return 1;
}

static int p_first(lua_State *L) {
  nr_ctx_t *c = nr_pipeline_first(check_pipe(L, 1, true));
  c ? push_handler(L, c) : lua_pushnil(L);
  return 1;
}

static int p_last(lua_State *L) {
  nr_ctx_t *c = nr_pipeline_last(check_pipe(L, 1, true));
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
    fn(nr_pipeline_head(check_pipe(L, 1, true)));                           \
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
  nr_pipeline_t *p = check_pipe(L, 1, true);
  luaL_checkany(L, 2);
  lnr_with_msg(L, 2, NULL, fire_read_fn, nr_pipeline_head(p), NULL);
  lua_settop(L, 1);
  return 1;
}

static int p_fire_user_event(lua_State *L) {
  nr_pipeline_t *p = check_pipe(L, 1, true);
  lnr_lmsg_t m = {NR_MSG_LUA, L, 2};
  fire_event_fn(nr_pipeline_head(p), &m, NULL);
  lua_settop(L, 1);
  return 1;
}

static int p_fire_exception(lua_State *L) {
  nr_pipeline_t *p = check_pipe(L, 1, true);
  nr_err_t err = {NR_EHANDLER, luaL_tolstring(L, 2, NULL)};
  nr_ctx_fire_exception(nr_pipeline_head(p), &err);
  lua_settop(L, 1);
  return 1;
}

static int p_do_write(lua_State *L, bool flush) {
  nr_pipeline_t *p = check_pipe(L, 1, true);
  luaL_checkany(L, 2);
  nr_promise_t *pr = write_promise(L, 3);
  lnr_with_msg(L, 2, nr_pipeline_channel(p), ctx_write_fn, nr_pipeline_tail(p),
               pr);
  if (flush)
    nr_ctx_flush(nr_pipeline_tail(p));
  return 1;
}

static int p_write(lua_State *L) { return p_do_write(L, false); }
static int p_write_and_flush(lua_State *L) { return p_do_write(L, true); }

static int p_flush(lua_State *L) {
  nr_ctx_flush(nr_pipeline_tail(check_pipe(L, 1, true)));
  lua_settop(L, 1);
  return 1;
}

static int p_close(lua_State *L) {
  nr_pipeline_t *p = check_pipe(L, 1, true);
  nr_promise_t *pr = write_promise(L, 2);
  nr_ctx_close(nr_pipeline_tail(p), pr);
  return 1;
}

static int p_tostring(lua_State *L) {
  lpipe_t *p = luaL_checkudata(L, 1, PIPELINE);
  lua_pushfstring(L, "netrun.pipeline(channel %d)",
                  p->ch ? (int)nr_channel_id(p->ch) : -1);
  return 1;
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
      {"loop", c_loop}, {NULL, NULL}};
  luaL_newmetatable(L, CTX);
  lua_newtable(L);
  luaL_setfuncs(L, ctx_methods, 0);
  lua_setfield(L, -2, "methods");
  lua_pushcfunction(L, ctx_index);
  lua_setfield(L, -2, "__index");
  lua_pushcfunction(L, ctx_gc);
  lua_setfield(L, -2, "__gc");
  lua_pushcfunction(L, ctx_tostring);
  lua_setfield(L, -2, "__tostring");
  lua_pop(L, 1);
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
  /* ch:pipeline() */
  luaL_getmetatable(L, lnr_kind_names[LNR_CHANNEL]);
  lua_getfield(L, -1, "__index");
  lua_pushcfunction(L, l_channel_pipeline);
  lua_setfield(L, -2, "pipeline");
  lua_pop(L, 2);
}
