/*
 * lpipeline_ctx.c -- the ctx objects Lua handlers are called with: what a
 * handler may do at its place in the pipeline (fire the next handler,
 * write, flush, close, read), and its fields channel, pipeline, name and
 * handler.
 *
 * Invariants: a ctx table's [1] is a handle retaining the C context
 * (released by its __gc), so a ctx kept past its handler's removal is
 * safe to call (the core passes such calls on or fails them). The ctx of
 * the handler being called is told by its table's address (check_ctx):
 * see there why no forgery can have it.
 *
 * Threads: loop thread only; a ctx is used on its channel's loop, and
 * check_ctx raises elsewhere.
 */

/***
@module netrun
*/

/***
A handler's context in its pipeline (Netty's ChannelHandlerContext), the
first argument of every handler method: one per handler per channel.
Events fired from a ctx start at the NEXT handler (inbound: toward the
tail; outbound: toward the head). A ctx is a table: it keeps the fields
and methods it was asked for, and may hold a handler's own per-channel
fields. A handler on an executor group gets a ctx with the same methods
but `void_promise`, whose calls go to the channel's loop as tasks.
@type ctx
@field channel the channel
@field pipeline the channel's pipeline
@field name the handler's name
@field handler the handler
*/
#include <stdlib.h>
#include <string.h>

#include "lpipeline.h"

#define CTX "netrun.ctx"

typedef struct lctx_s {
  const void *tag;             /* &CTX_TAG: proves the userdata is a ctx */
  nr_ctx_t *ctx;
} lctx_t;
static const char CTX_TAG = 0;

/* A ctx is a table, made when its handler is first called or asked for
 * (p:context): [1] holds the handle (a userdata that retains the C
 * context, released by its __gc), and the shared metatable's __index finds
 * methods and the fields channel, pipeline, name and handler, then stores
 * them in the table, so the next ctx:write is a plain table read, not a
 * metamethod call. Both metatables are kept under pointer keys. The
 * table is made with room for four such names (write, flush, close,
 * channel: what most handlers use), so the first ones stored -- on every
 * connection, for a ctx lives as long as its channel -- grow no table. */
#define CTX_HANDLE "netrun.ctx.handle"
static const char CTX_KEY = 0, CTX_HANDLE_KEY = 0;

void lnr_push_ctx(lua_State *L, nr_ctx_t *ctx) {
  lua_createtable(L, 1, 4);
  lnr_pipe_part_t *P = lnr_pipe_part(lnr_state(L));
  lctx_t *c = lua_newuserdatauv(L, sizeof *c, 0);
  c->tag = &CTX_TAG;
  c->ctx = nr_ctx_retain(ctx);
  lnr_push_keyed(L, &P->ctx_handle_mt_ref, &CTX_HANDLE_KEY);
  lua_setmetatable(L, -2);
  lua_rawseti(L, -2, 1);
  lnr_push_keyed(L, &P->ctx_mt_ref, &CTX_KEY);
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
 * (begin notes it in the state's current call), so its handle need not be
 * read out of the table. Invariant: while S->ctx_table is set, it is the
 * address of a live ctx table whose C context is S->ctx. The address
 * cannot be a forgery's: the table is anchored by its handler's ctx_ref,
 * and forgotten when that is dropped (lnr_lh_free), so no other table can
 * be made at that address meanwhile; the C context lives as long as the
 * handler is in its pipeline; and begin ran on this state's thread, which
 * is the channel's loop. */
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

nr_ctx_t *lnr_check_ctx(lua_State *L, int idx) { return check_ctx(L, idx); }

/* A Lua handler's ctx table is made when the handler is first called or
 * asked for (p:context), not when it is added: idle connections hold
 * none. */
void lnr_ensure_ctx(nr_ctx_t *ctx) {
  lh_t *h = nr_ctx_state(ctx);
  if (h->ctx_ref == LUA_NOREF) {
    lua_State *L = h->S->L;
    lnr_push_ctx(L, ctx);
    h->ctx_table = lua_topointer(L, -1);
    h->ctx_ref = luaL_ref(L, LUA_REGISTRYINDEX);
  }
}

/* __gc (once per connection): the tag tells a ctx handle, as in to_ctx,
 * which costs less than luaL_checkudata's metatable lookup by name; a
 * direct call with anything else does nothing. */
static int ctx_gc(lua_State *L) {
  lctx_t *c = lua_touserdata(L, 1);
  if (c == NULL || lua_rawlen(L, 1) != sizeof *c || c->tag != &CTX_TAG)
    return 0;
  if (c->ctx) {
    nr_ctx_release(c->ctx);
    c->ctx = NULL;
  }
  return 0;
}

/* The Lua value of a context's handler: the table, or the native type;
 * nil once the handler was removed (a ctx kept past that: its state is
 * freed). */
void lnr_push_ctx_handler(lua_State *L, nr_ctx_t *ctx) {
  if (nr_ctx_is_removed(ctx)) {
    lua_pushnil(L);
  } else if (nr_ctx_handler(ctx) == &lnr_lua_vt) {
    lh_t *h = nr_ctx_state(ctx);
    lua_rawgeti(L, LUA_REGISTRYINDEX, h->ref);
  } else if (nr_ctx_handler(ctx) == &lnr_exec_vt) {
    lua_rawgeti(L, LUA_REGISTRYINDEX, lnr_xh_home_ref(nr_ctx_state(ctx)));
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
      lnr_push_pipeline(L, nr_ctx_channel(c->ctx));
    else if (strcmp(k, "name") == 0)
      lua_pushstring(L, nr_ctx_name(c->ctx));
    else if (strcmp(k, "handler") == 0)
      lnr_push_ctx_handler(L, c->ctx);
    else
      return 0;
  }
  lua_pushvalue(L, 2);
  lua_pushvalue(L, -2);
  lua_rawset(L, 1);
  return 1;
}

/* ctx:write of the value at idx, as its message; a failure with no
 * promise given went to exception_caught. */
static int write_msg(lua_State *L, int idx, nr_ctx_t *ctx, nr_promise_t *p) {
  lnr_msgbuf_t m;
  int rc = nr_ctx_write(ctx, lnr_to_msg(L, idx, nr_ctx_channel(ctx), &m), p);
  lnr_msg_done(&m);
  return rc;
}

/* The token a read fired on from ctx `from` carries (0: none): the one of
 * the read its handler is handling now, else the one a request fired on
 * later keeps (a middleware that passes it on from a future's listener).
 * So a handler further on that raises on it is answered for (the HTTP
 * codec's 500), whatever stands between it and the codec. */
static uint64_t read_token(lua_State *L, nr_ctx_t *from) {
  lnr_state_t *S = lnr_state(L);
  if (S != NULL && S->read_ctx == from && S->read_token != 0)
    return S->read_token;
  return lnr_http_request_token(L, 2, nr_ctx_pipeline(from));
}

int lnr_fire(lua_State *L, nr_ctx_t *from, int event) {
  static void (*const fire0[])(nr_ctx_t *) = {
      [LNR_FIRE_REGISTERED] = nr_ctx_fire_registered,
      [LNR_FIRE_UNREGISTERED] = nr_ctx_fire_unregistered,
      [LNR_FIRE_ACTIVE] = nr_ctx_fire_active,
      [LNR_FIRE_INACTIVE] = nr_ctx_fire_inactive,
      [LNR_FIRE_READ_COMPLETE] = nr_ctx_fire_read_complete,
      [LNR_FIRE_WRITABILITY] = nr_ctx_fire_writability_changed};
  if (event == LNR_FIRE_READ) {
    luaL_checkany(L, 2);
    uint64_t token = read_token(L, from);
    lnr_msgbuf_t m;
    void *msg = lnr_to_msg(L, 2, NULL, &m);
    if (token != 0)
      nr_ctx_fire_read_tokened(from, msg, token, false);
    else
      nr_ctx_fire_read(from, msg);
    lnr_msg_done(&m);
  } else if (event == LNR_FIRE_USER_EVENT) {
    luaL_checkany(L, 2);
    lnr_lmsg_t m = {NR_MSG_LUA, L, 2};
    nr_ctx_fire_user_event(from, &m);
  } else if (event == LNR_FIRE_EXCEPTION) {
    nr_err_t err = {NR_EHANDLER, luaL_tolstring(L, 2, NULL)};
    nr_ctx_fire_exception(from, &err);
  } else {
    fire0[event](from);
  }
  lua_settop(L, 1);                      /* the ctx or pipeline: chaining */
  return 1;
}

#define CTX_FIRE(cname, event)                                              \
  static int cname(lua_State *L) {                                          \
    return lnr_fire(L, check_ctx(L, 1), event);                             \
  }
/***
Pass `channel_registered` to the next handler.
@function ctx:fire_channel_registered
@treturn ctx itself
*/
/***
Pass `channel_unregistered` on.
@function ctx:fire_channel_unregistered
@treturn ctx itself
*/
/***
Pass `channel_active` on.
@function ctx:fire_channel_active
@treturn ctx itself
*/
/***
Pass `channel_inactive` on.
@function ctx:fire_channel_inactive
@treturn ctx itself
*/
/***
Pass a message on to the next handler's `channel_read`.
@function ctx:fire_channel_read
@param msg the message
@treturn ctx itself
*/
/***
Pass `channel_read_complete` on.
@function ctx:fire_channel_read_complete
@treturn ctx itself
*/
/***
Pass a user event on (`user_event_triggered`).
@function ctx:fire_user_event_triggered
@param evt the event
@treturn ctx itself
*/
/***
Pass `channel_writability_changed` on.
@function ctx:fire_channel_writability_changed
@treturn ctx itself
*/
/***
Pass an error on to the next handler's `exception_caught`.
@function ctx:fire_exception_caught
@param err the error
@treturn ctx itself
*/

CTX_FIRE(c_fire_registered, LNR_FIRE_REGISTERED)
CTX_FIRE(c_fire_unregistered, LNR_FIRE_UNREGISTERED)
CTX_FIRE(c_fire_active, LNR_FIRE_ACTIVE)
CTX_FIRE(c_fire_inactive, LNR_FIRE_INACTIVE)
CTX_FIRE(c_fire_read, LNR_FIRE_READ)
CTX_FIRE(c_fire_read_complete, LNR_FIRE_READ_COMPLETE)
CTX_FIRE(c_fire_user_event, LNR_FIRE_USER_EVENT)
CTX_FIRE(c_fire_writability, LNR_FIRE_WRITABILITY)
CTX_FIRE(c_fire_exception, LNR_FIRE_EXCEPTION)

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
nr_promise_t *lnr_opt_promise(lua_State *L, int idx) {
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

/* A write's lazy future (see lhandle.c): it costs nothing unless used.
 * Pushed for a write of no given future on an open stream channel that
 * reaches its head at once (nr_ctx_writes_to_head); the write that failed
 * there was reported to exception_caught by the pipeline, and its future
 * is a failed one. */
static void push_written(lua_State *L, nr_channel_t *ch, int rc) {
  if (rc < 0) {
    nr_promise_t *p = nr_promise_new();
    if (p == NULL)
      luaL_error(L, "out of memory");
    nr_promise_set_failure(p, rc, nr_strerror(rc));
    lnr_push_new_handle_mt(L, LNR_FUTURE, p, FUTURE_MT);
  } else {
    lnr_push_lazy_write(L, ch, nr_channel_write_mark(ch), 1, LAZY_MT);
  }
}

/* A write to a datagram channel given no promise that fails at once (a
 * string instead of { data, host, port }) reaches exception_caught too, as
 * a stream channel's does on the lazy path: its future is rarely looked
 * at. (Stream writes that pass through a codec are reported by the
 * codec.) A write on a closed channel only fails its future. */
static void report_write_failure(nr_ctx_t *ctx, int rc, nr_promise_t *p) {
  if (rc == NR_ECLOSED || !nr_channel_is_datagram(nr_ctx_channel(ctx)))
    return;
  nr_err_t err = {rc, nr_promise_message(p)};
  nr_pipeline_fire_exception(nr_channel_pipeline(nr_ctx_channel(ctx)), &err);
}

/* ctx:write(msg [, future]) and ctx:write_and_flush(msg [, future]),
 * read top to bottom as luv's luv_write: the ctx, the message, the future
 * the write completes (none, lazy, given or new), the write and what its
 * failure becomes, the flush; the future is returned.
 *
 * The usual call, ctx:write(msg, VOID) by the handler being called, is
 * told by two addresses: its ctx table's (see check_ctx) and the void
 * promise's (lnr_is_void; a full userdata, so lua_touserdata gives the
 * address recorded, for less), and a string or a native message (a
 * prepared response, say) goes to the pipeline as it is. */
static int ctx_write(lua_State *L, bool flush) {
  const lnr_state_t *S = lnr_state(L);
  int top = lua_gettop(L);
  nr_ctx_t *ctx = S->ctx_table != NULL && lua_topointer(L, 1) == S->ctx_table
                      ? S->ctx : check_ctx(L, 1);
  if (top < 2)
    luaL_checkany(L, 2);                   /* raises: no message */
  if (top >= 3 && S->void_proxy != NULL && lua_touserdata(L, 3) == S->void_proxy) {
    /* VOID: no future; a failure went to exception_caught */
    void *native;
    if (lua_type(L, 2) == LUA_TSTRING) {   /* as lnr_to_msg does; first: */
      size_t n;                            /* the usual reply */
      const char *s = lua_tolstring(L, 2, &n);    /* anchored by the stack */
      nr_bytes_t b = NR_BYTES(s, n);
      nr_ctx_write(ctx, &b, NULL);
    } else if ((native = lnr_to_native(L, 2)) != NULL) {
      nr_ctx_write(ctx, native, NULL);
    } else {                               /* a response table, an array */
      write_msg(L, 2, ctx, NULL);
    }
    if (top != 3)
      lua_settop(L, 3);                    /* the void promise */
  } else if (lua_isnoneornil(L, 3) && nr_channel_is_open(nr_ctx_channel(ctx)) &&
             nr_ctx_writes_to_head(ctx)) {
    /* none given, straight to an open stream's head: a lazy future */
    nr_channel_t *ch = nr_ctx_channel(ctx);
    lnr_msgbuf_t m;
    int rc = nr_ctx_write_void(ctx, lnr_to_msg(L, 2, ch, &m));
    lnr_msg_done(&m);
    push_written(L, ch, rc);
  } else {
    /* the future given, or a new one */
    bool implicit = lua_isnoneornil(L, 3);
    nr_promise_t *p = write_promise(L, 3);
    int rc = write_msg(L, 2, ctx, p);
    if (rc < 0 && implicit)
      report_write_failure(ctx, rc, p);
  }
  if (flush)
    nr_ctx_flush(ctx);
  return 1;
}

static int c_write(lua_State *L) { return ctx_write(L, false); }
static int c_write_and_flush(lua_State *L) { return ctx_write(L, true); }

/***
Write a message toward the head, from this handler (the next outbound
handler encodes it); it is sent at the next flush. Without a promise the
future is lazy -- it costs nothing until a method is called on it -- and a
failure nobody listens to reaches `exception_caught`. A handler of the HTTP
server codec may instead return its response from `channel_read`.
@function ctx:write
@param msg the message (a string, an array of strings, a response table, a prepared response, ...)
@tparam[opt] future promise a promise to complete, or the void promise (no future at all)
@treturn future
*/
/***
Write and flush.
@function ctx:write_and_flush
@param msg the message
@tparam[opt] future promise a promise to complete, or the void promise
@treturn future
*/
/***
Flush, from this handler toward the head.
@function ctx:flush
@treturn ctx itself
*/

static int c_flush(lua_State *L) {
  nr_ctx_flush(check_ctx(L, 1));
  lua_settop(L, 1);
  return 1;
}

/***
Ask for a read (with `auto_read` off), from this handler toward the head.
@function ctx:read
@treturn ctx itself
*/

static int c_read(lua_State *L) {
  nr_ctx_read(check_ctx(L, 1));
  lua_settop(L, 1);
  return 1;
}

/***
Close the channel, from this handler toward the head.
@function ctx:close
@tparam[opt] future promise a promise to complete, or the void promise
@treturn future
*/

static int c_close(lua_State *L) {
  nr_ctx_t *ctx = check_ctx(L, 1);
  nr_promise_t *p = write_promise(L, 2);
  nr_ctx_close(ctx, p);
  return 1;
}

/***
The void promise, as `netrun.void_promise()`.
@function ctx:void_promise
@treturn future
*/

/* The void promise (see lfuture.c): ctx:write(msg, ctx:void_promise())
 * makes no future; a failure goes to exception_caught. */
static int c_void_promise(lua_State *L) {
  check_ctx(L, 1);
  lnr_push_handle(L, LNR_FUTURE, nr_promise_void());
  return 1;
}

/***
The channel's loop (a task scheduled there may capture `ctx`).
@function ctx:loop
@treturn loop
@usage ctx:loop():schedule(1, function() ctx:write_and_flush("late\n") end)
*/

static int c_loop(lua_State *L) {
  lnr_push_handle(L, LNR_LOOP, nr_channel_loop(nr_ctx_channel(check_ctx(L, 1))));
  return 1;
}

static int ctx_tostring(lua_State *L) {
  lctx_t *c = to_ctx(L, 1);
  lua_pushfstring(L, "netrun.ctx(%s)", c->ctx ? nr_ctx_name(c->ctx) : "released");
  return 1;
}

void lnr_open_ctx(lua_State *L) {
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
}
