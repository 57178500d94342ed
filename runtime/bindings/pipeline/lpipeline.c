/*
 * lpipeline.c -- the pipeline objects Lua sees (ch:pipeline()): adding,
 * removing and finding handlers, and firing events or writing from either
 * end. A handler given as a table or object becomes a Lua handler
 * (lpipeline_handler.c), one given with an executor group a proxy
 * (lpipeline_exec.c), a native one (__netrun_native) what it makes.
 *
 * Threads: a pipeline object may be held anywhere in its state, but used
 * only on its channel's loop (check_pipe raises elsewhere); through its
 * channel handle it retains the channel, not the pipeline.
 */

/***
@module netrun
*/

/***
A channel's pipeline (`channel:pipeline()`, `ctx.pipeline`): its handlers
in order, each under a name. A handler is a Lua table (or an object whose
methods come through its metatable) with any of the inbound methods
`handler_added`, `handler_removed`, `channel_registered`,
`channel_unregistered`, `channel_active`, `channel_inactive`,
`channel_read(ctx, msg)`, `channel_read_complete`,
`user_event_triggered(ctx, evt)`, `channel_writability_changed`,
`exception_caught(ctx, err)`, and the outbound methods
`bind(ctx, host, port, promise)`, `connect(ctx, host, port, promise)`,
`disconnect(ctx, promise)`, `close(ctx, promise)`, `read(ctx)`,
`write(ctx, msg, promise)`, `flush(ctx)`; netrun calls them as methods
(`h:channel_read(ctx, msg)`), and an absent method passes the event on at
no cost. A native codec or handler (`netrun.codec.*`, `netrun.handler.*`,
a `tls` config) may be added as well. An error raised in a handler method
goes to that handler's `exception_caught`; an exception that reaches the
tail is logged, an inbound message that reaches it is dropped. Use a
pipeline on its channel's loop.
@type pipeline
*/
#include <stdlib.h>
#include <string.h>

#include "lpipeline.h"

#define PIPELINE "netrun.pipeline"

typedef struct lpipe_s {
  const void *tag;             /* &PIPE_TAG: proves the userdata is ours */
  nr_channel_t *ch;
} lpipe_t;

/* A pipeline object carries the address of PIPE_TAG, and its metatable is
 * kept under a pointer key: init's ch:pipeline():add_last(...) runs per
 * connection, and neither making the object nor checking it (each method
 * call) looks a metatable up by name. */
static const char PIPE_TAG = 0, PIPE_MT = 0;

/* Push the pipeline object of the channel handle at idx. There is one per
 * handle, kept in the handle's user value, so ch:pipeline() ==
 * ch:pipeline(). It keeps the handle in its own user value, and the handle
 * retains the channel: p->ch is valid as long as the object is, with no
 * finalizer of its own (the pair is collected together). */
static void push_pipeline_of(lua_State *L, int idx) {
  idx = lua_absindex(L, idx);
  if (lua_getiuservalue(L, idx, 1) == LUA_TUSERDATA)
    return;
  lua_pop(L, 1);
  lpipe_t *p = lua_newuserdatauv(L, sizeof *p, 1);
  p->tag = &PIPE_TAG;
  p->ch = lnr_check_handle(L, idx, LNR_CHANNEL);
  lnr_push_keyed(L, &lnr_pipe_part(lnr_state(L))->pipe_mt_ref, &PIPE_MT);
  lua_setmetatable(L, -2);
  lua_pushvalue(L, idx);
  lua_setiuservalue(L, -2, 1);                 /* pipeline -> handle */
  lua_pushvalue(L, -1);
  lua_setiuservalue(L, idx, 1);                /* handle -> pipeline */
}

void lnr_push_pipeline(lua_State *L, nr_channel_t *ch) {
  lnr_push_handle(L, LNR_CHANNEL, ch);
  push_pipeline_of(L, -1);
  lua_remove(L, -2);
}

/***
@type channel
*/

/***
The channel's pipeline. Use it on the channel's loop.
@function channel:pipeline
@treturn pipeline
*/

static int l_channel_pipeline(lua_State *L) {
  lnr_check_handle(L, 1, LNR_CHANNEL);
  push_pipeline_of(L, 1);
  return 1;
}

/* The pipeline object at idx; raises for anything else. */
static lpipe_t *to_pipe(lua_State *L, int idx) {
  lpipe_t *p = lua_touserdata(L, idx);   /* a light one has length 0 */
  if (p != NULL && lua_rawlen(L, idx) == sizeof *p && p->tag == &PIPE_TAG)
    return p;
  return luaL_checkudata(L, idx, PIPELINE);              /* raises */
}

static nr_pipeline_t *check_pipe(lua_State *L, int idx) {
  lpipe_t *p = to_pipe(L, idx);
  nr_loop_t *loop = nr_channel_loop(p->ch);
  if (loop == NULL || !nr_loop_in_thread(loop))
    luaL_error(L, "the pipeline of channel %d can only be used on its loop "
               "(%s): do it in init, or in a task on ch:loop()",
               (int)nr_channel_id(p->ch), loop ? nr_loop_name(loop) : "none");
  return nr_channel_pipeline(p->ch);
}

/* Find the context of a handler given by name or by value. */
static nr_ctx_t *find_ctx(lua_State *L, nr_pipeline_t *p, int idx) {
  if (lua_type(L, idx) == LUA_TSTRING)
    return nr_pipeline_context(p, lua_tostring(L, idx));
  for (nr_ctx_t *c = nr_pipeline_first(p); c; c = nr_ctx_next(c)) {
    if (nr_ctx_handler(c) != &lnr_lua_vt && nr_ctx_handler(c) != &lnr_exec_vt)
      continue;
    lnr_push_ctx_handler(L, c);
    bool same = lua_rawequal(L, -1, idx);
    lua_pop(L, 1);
    if (same)
      return c;
  }
  return NULL;
}

/* The maker of the native handler at idx (a userdata whose metatable has
 * __netrun_native), or NULL. Init adds the same kinds on every connection,
 * so the state remembers the metatable seen last and its maker: the next
 * lookup is a pointer compare, not a field read by name. The metatable is
 * anchored in a slot while remembered, so no other table takes its
 * address meanwhile. */
static lnr_native_fn native_maker(lua_State *L, int idx) {
  if (lua_type(L, idx) != LUA_TUSERDATA || !lua_getmetatable(L, idx))
    return NULL;
  lnr_pipe_part_t *P = lnr_pipe_part(lnr_state(L));
  if (P->native_mt == lua_topointer(L, -1)) {
    lua_pop(L, 1);
    return P->native_make;
  }
  lnr_native_fn make = NULL;
  lua_pushliteral(L, "__netrun_native");
  if (lua_rawget(L, -2) == LUA_TLIGHTUSERDATA)
    make = (lnr_native_fn)(uintptr_t)lua_touserdata(L, -1);
  lua_pop(L, 1);                                      /* mt */
  if (make != NULL) {
    P->native_mt = lua_topointer(L, -1);
    P->native_make = make;
    lnr_set_ref(L, &P->native_mt_ref);                /* pops mt */
  } else {
    lua_pop(L, 1);
  }
  return make;
}

/* Builds the C handler for the value at idx: a native handler (userdata
 * whose metatable has __netrun_native), or a Lua table or object. */
static const nr_handler_t *make_handler(lua_State *L, int idx,
                                        const char *name, void **state) {
  lnr_native_fn make = native_maker(L, idx);
  if (make != NULL)
    return make(L, idx, state);
  return lnr_make_lua_handler(L, idx, name, state);
}

static int add_error(lua_State *L, int rc, const char *name, const char *base) {
  if (rc == -EEXIST)
    return luaL_error(L, "duplicate handler name '%s'", name);
  if (rc == -ENOENT)
    return luaL_error(L, "no handler named '%s' in the pipeline", base);
  if (rc == -ESHUTDOWN)
    return luaL_error(L, "cannot add handler '%s': the channel is closed",
                      name);
  return luaL_error(L, "cannot add handler '%s': %s", name, nr_strerror(rc));
}

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
      exec ? lnr_make_exec_handler(L, exec, nr_pipeline_channel(p), name, arg, &state)
           : make_handler(L, arg, name, &state);
  int rc = add(p, base, name, vt, state);
  if (rc < 0) {
    if (vt == &lnr_exec_vt) {
      luaL_unref(L, LUA_REGISTRYINDEX, lnr_xh_home_ref(state));
      lnr_xh_release(state);
    } else if (vt == &lnr_lua_vt) {
      lnr_lh_free(L, state);
    } else if (vt->removed == NULL) {
      free(state);
    }
    return add_error(L, rc, name, base);
  }
  lua_settop(L, 1);
  return 1;
}

/***
@type pipeline
*/

/***
Add a handler at the head.
@function pipeline:add_first
@string name its name, unique in the pipeline (a duplicate raises)
@param h the handler: a table, a native codec or handler, a `tls` config
@treturn pipeline itself
*/
/***
Add a handler at the tail. Given an executor group first, the handler runs
on one executor of that group per channel, in its own state; what it does
with its ctx comes back to the channel's loop as tasks.
@function pipeline:add_last
@tparam[opt] group group an executor group to run the handler on
@string name its name
@param h the handler
@treturn pipeline itself
@usage ch:pipeline():add_last("frame", netrun.codec.line {})
ch:pipeline():add_last(blocking, "db", Db)
*/

static int p_add_first(lua_State *L) { return do_add(L, add_first, false); }
static int p_add_last(lua_State *L) { return do_add(L, add_last, false); }
/***
Add a handler before the one named `base` (an unknown base raises).
@function pipeline:add_before
@string base the handler to add before
@string name its name
@param h the handler
@treturn pipeline itself
*/

static int p_add_before(lua_State *L) {
  return do_add(L, nr_pipeline_add_before, true);
}
/***
Add a handler after the one named `base`.
@function pipeline:add_after
@string base the handler to add after
@string name its name
@param h the handler
@treturn pipeline itself
*/

static int p_add_after(lua_State *L) {
  return do_add(L, nr_pipeline_add_after, true);
}

/***
Remove a handler (its `handler_removed` runs); an unknown one raises.
@function pipeline:remove
@param name_or_handler its name, or the handler itself
@return the handler removed
*/

static int p_remove(lua_State *L) {
  nr_pipeline_t *p = check_pipe(L, 1);
  luaL_checkany(L, 2);
  nr_ctx_t *c = find_ctx(L, p, 2);
  if (c == NULL)
    return luaL_error(L, "no such handler in the pipeline: %s",
                      luaL_tolstring(L, 2, NULL));
  lnr_push_ctx_handler(L, c);
  nr_pipeline_remove(p, nr_ctx_name(c));
  return 1;
}

/***
Replace a handler by another, in its place.
@function pipeline:replace
@param old the old handler's name, or the handler
@string name the new one's name
@param h the new handler
@return the old handler
*/

static int p_replace(lua_State *L) {
  nr_pipeline_t *p = check_pipe(L, 1);
  nr_ctx_t *c = find_ctx(L, p, 2);
  const char *name = luaL_checkstring(L, 3);
  luaL_checkany(L, 4);
  if (c == NULL)
    return luaL_error(L, "no such handler in the pipeline: %s",
                      luaL_tolstring(L, 2, NULL));
  lnr_push_ctx_handler(L, c);
  int old = lua_gettop(L);
  void *state = NULL;
  const nr_handler_t *vt = make_handler(L, 4, name, &state);
  int rc = nr_pipeline_replace(p, nr_ctx_name(c), name, vt, state);
  if (rc < 0)
    return add_error(L, rc, name, NULL);
  lua_pushvalue(L, old);
  return 1;
}

/***
The handler of that name.
@function pipeline:get
@string name the name
@return the handler, or nil
*/

static int p_get(lua_State *L) {
  nr_pipeline_t *p = check_pipe(L, 1);
  nr_ctx_t *c = nr_pipeline_context(p, luaL_checkstring(L, 2));
  if (c == NULL)
    lua_pushnil(L);
  else
    lnr_push_ctx_handler(L, c);
  return 1;
}

/***
The ctx of the handler of that name.
@function pipeline:context
@string name the name
@treturn ctx|nil
*/

static int p_context(lua_State *L) {
  nr_pipeline_t *p = check_pipe(L, 1);
  nr_ctx_t *c = find_ctx(L, p, 2);
  if (c == NULL) {
    lua_pushnil(L);
  } else if (nr_ctx_handler(c) == &lnr_lua_vt) {
    lh_t *h = nr_ctx_state(c);
    lnr_ensure_ctx(c);
    lua_rawgeti(L, LUA_REGISTRYINDEX, h->ctx_ref);
  } else {
    lnr_push_ctx(L, c);
  }
  return 1;
}

/***
The handlers' names, head to tail.
@function pipeline:names
@treturn {string,...}
*/

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

/***
The first handler.
@function pipeline:first
@return the handler, or nil if the pipeline is empty
*/

static int p_first(lua_State *L) {
  nr_ctx_t *c = nr_pipeline_first(check_pipe(L, 1));
  c ? lnr_push_ctx_handler(L, c) : lua_pushnil(L);
  return 1;
}

/***
The last handler.
@function pipeline:last
@return the handler, or nil
*/

static int p_last(lua_State *L) {
  nr_ctx_t *c = nr_pipeline_last(check_pipe(L, 1));
  c ? lnr_push_ctx_handler(L, c) : lua_pushnil(L);
  return 1;
}

/***
The pipeline's channel.
@function pipeline:channel
@treturn channel
*/

static int p_channel(lua_State *L) {
  lpipe_t *p = to_pipe(L, 1);
  lnr_push_handle(L, LNR_CHANNEL, p->ch);
  return 1;
}

/* p:fire_*: the event from the head, as ctx:fire_* from a context. */
#define PIPE_FIRE(cname, event)                                             \
  static int cname(lua_State *L) {                                          \
    return lnr_fire(L, nr_pipeline_head(check_pipe(L, 1)), event);          \
  }
/***
Fire `channel_registered` from the head of the pipeline.
@function pipeline:fire_channel_registered
@treturn pipeline itself
*/
/***
Fire `channel_unregistered` from the head.
@function pipeline:fire_channel_unregistered
@treturn pipeline itself
*/
/***
Fire `channel_active` from the head.
@function pipeline:fire_channel_active
@treturn pipeline itself
*/
/***
Fire `channel_inactive` from the head.
@function pipeline:fire_channel_inactive
@treturn pipeline itself
*/
/***
Fire `channel_read(msg)` from the head, as if the socket had read it.
@function pipeline:fire_channel_read
@param msg the message
@treturn pipeline itself
*/
/***
Fire `channel_read_complete` from the head.
@function pipeline:fire_channel_read_complete
@treturn pipeline itself
*/
/***
Fire `user_event_triggered(evt)` from the head.
@function pipeline:fire_user_event_triggered
@param evt the event
@treturn pipeline itself
*/
/***
Fire `channel_writability_changed` from the head.
@function pipeline:fire_channel_writability_changed
@treturn pipeline itself
*/
/***
Fire `exception_caught(err)` from the head.
@function pipeline:fire_exception_caught
@param err the error
@treturn pipeline itself
*/

PIPE_FIRE(p_fire_registered, LNR_FIRE_REGISTERED)
PIPE_FIRE(p_fire_unregistered, LNR_FIRE_UNREGISTERED)
PIPE_FIRE(p_fire_active, LNR_FIRE_ACTIVE)
PIPE_FIRE(p_fire_inactive, LNR_FIRE_INACTIVE)
PIPE_FIRE(p_fire_read, LNR_FIRE_READ)
PIPE_FIRE(p_fire_read_complete, LNR_FIRE_READ_COMPLETE)
PIPE_FIRE(p_fire_user_event, LNR_FIRE_USER_EVENT)
PIPE_FIRE(p_fire_writability, LNR_FIRE_WRITABILITY)
PIPE_FIRE(p_fire_exception, LNR_FIRE_EXCEPTION)

static int p_do_write(lua_State *L, bool flush) {
  nr_pipeline_t *p = check_pipe(L, 1);
  luaL_checkany(L, 2);
  nr_promise_t *pr = lnr_opt_promise(L, 3);
  lnr_msgbuf_t m;
  nr_ctx_write(nr_pipeline_tail(p), lnr_to_msg(L, 2, nr_pipeline_channel(p), &m),
               pr);
  lnr_msg_done(&m);
  if (flush)
    nr_ctx_flush(nr_pipeline_tail(p));
  return 1;
}

/***
Write a message from the tail (through every outbound handler).
@function pipeline:write
@param msg the message
@tparam[opt] future promise a promise to complete instead of a new future
@treturn future
*/
/***
Write and flush from the tail.
@function pipeline:write_and_flush
@param msg the message
@tparam[opt] future promise a promise to complete instead of a new future
@treturn future
*/

static int p_write(lua_State *L) { return p_do_write(L, false); }
static int p_write_and_flush(lua_State *L) { return p_do_write(L, true); }

/***
Flush from the tail.
@function pipeline:flush
@treturn pipeline itself
*/

static int p_flush(lua_State *L) {
  nr_ctx_flush(nr_pipeline_tail(check_pipe(L, 1)));
  lua_settop(L, 1);
  return 1;
}

/***
Close the channel from the tail.
@function pipeline:close
@tparam[opt] future promise a promise to complete instead of a new future
@treturn future
*/

static int p_close(lua_State *L) {
  nr_pipeline_t *p = check_pipe(L, 1);
  nr_promise_t *pr = lnr_opt_promise(L, 2);
  nr_ctx_close(nr_pipeline_tail(p), pr);
  return 1;
}

static int p_tostring(lua_State *L) {
  lpipe_t *p = to_pipe(L, 1);
  lua_pushfstring(L, "netrun.pipeline(channel %d)",
                  p->ch ? (int)nr_channel_id(p->ch) : -1);
  return 1;
}

static void open_pipeline(lua_State *L) {
  lnr_open_ctx(L);
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
  static const luaL_Reg pipe_meta[] = {{"__tostring", p_tostring},
                                       {NULL, NULL}};
  lnr_new_class(L, PIPELINE, pipe_methods, pipe_meta);
  luaL_getmetatable(L, PIPELINE);
  lua_rawsetp(L, LUA_REGISTRYINDEX, &PIPE_MT);
  lnr_open_xctx(L);
  /* ch:pipeline() */
  luaL_getmetatable(L, lnr_kind_names[LNR_CHANNEL]);
  lua_getfield(L, -1, "__index");
  lua_pushcfunction(L, l_channel_pipeline);
  lua_setfield(L, -2, "pipeline");
  lua_pop(L, 2);
}

static void close_part(lnr_state_t *S, void *part) {
  (void)S;
  lnr_batch_close(&((lnr_pipe_part_t *)part)->batch);
}

lnr_module_t lnr_pipeline_module = {
    .name = "pipeline", .open = open_pipeline,
    .part_size = sizeof(lnr_pipe_part_t), .close = close_part};
