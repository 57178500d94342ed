/*
 * lchannel_handle.c -- channel handles in Lua (netrun.channel): writes,
 * flushes, closes and reads, accessors, options, and per-channel
 * attributes. (Messages are converted between Lua and the C pipeline in
 * lmsg.c; servers, clients and UDP are made in lchannel.c.)
 *
 * Channel handles work from any thread: on the channel's loop a write goes
 * straight into the pipeline; from elsewhere the message is packed and the
 * write runs on the loop. Options and attributes are the loop's own
 * (require_loop raises elsewhere).
 */
/***
@module netrun
*/
#include <stdlib.h>
#include <string.h>

#include "lnr.h"

static nr_channel_t *check(lua_State *L, int idx) {
  return lnr_check_handle(L, idx, LNR_CHANNEL);
}

/* ---- writes --------------------------------------------------------------- */

typedef struct xwrite_s {
  nr_channel_t *ch;
  nr_promise_t *p;
  lnr_blob_t *b;
  bool flush;
} xwrite_t;

static int xwrite_p(lua_State *L) {
  xwrite_t *w = lua_touserdata(L, 1);
  lua_settop(L, 0);
  lnr_unpack(L, w->b);
  lnr_msgbuf_t m;
  nr_pipeline_write(nr_channel_pipeline(w->ch), lnr_to_msg(L, 1, w->ch, &m), w->p);
  lnr_msg_done(&m);
  if (w->flush)
    nr_pipeline_flush(nr_channel_pipeline(w->ch));
  return 0;
}

/* On the channel's loop: a write that came from another thread. */
static int xwrite_task(void *arg) {
  xwrite_t *w = arg;
  lnr_state_t *S = lnr_current_state();
  if (S && !S->closing) {
    lua_State *L = S->L;
    LNR_STACK_BEGIN(L);
    lua_pushcfunction(L, xwrite_p);
    lua_pushlightuserdata(L, w);
    if (lnr_pcall(L, 1, 0) != LUA_OK) {
      if (w->p)
        nr_promise_set_failure(w->p, NR_EHANDLER, lua_tostring(L, -1));
      lua_pop(L, 1);
    }
    LNR_STACK_END(L, 0);
  } else if (w->p) {
    nr_promise_set_failure(w->p, NR_ECLOSED, "channel closed");
  }
  if (w->p)
    nr_promise_release(w->p);
  lnr_blob_free(w->b);
  nr_channel_release(w->ch);
  free(w);
  return 0;
}

/* A write from another thread is encoded on the channel's loop; check the
 * shape of an array of strings here, so the mistake raises in the caller
 * like it does on the loop. */
static void check_array(lua_State *L, int idx) {
  if (lua_type(L, idx) != LUA_TTABLE || lua_rawgeti(L, idx, 1) != LUA_TSTRING) {
    if (lua_type(L, idx) == LUA_TTABLE)
      lua_pop(L, 1);
    return;
  }
  lua_pop(L, 1);
  lua_Integer n = (lua_Integer)lua_rawlen(L, idx);
  for (lua_Integer i = 2; i <= n; i++) {
    int t = lua_rawgeti(L, idx, i);
    lua_pop(L, 1);
    if (t != LUA_TSTRING)
      luaL_error(L, "write: element %d of the array is a %s, not a string",
                 (int)i, lua_typename(L, t));
  }
}

static int do_write(lua_State *L, bool flush) {
  nr_channel_t *ch = check(L, 1);
  luaL_checkany(L, 2);
  nr_promise_t *p = nr_promise_new();
  lnr_push_promise(L, p);
  int fut = lua_gettop(L);
  nr_loop_t *loop = nr_channel_loop(ch);
  if (loop && nr_loop_in_thread(loop)) {
    lnr_msgbuf_t m;
    nr_pipeline_write(nr_channel_pipeline(ch), lnr_to_msg(L, 2, ch, &m), p);
    lnr_msg_done(&m);
    if (flush)
      nr_pipeline_flush(nr_channel_pipeline(ch));
    lua_pushvalue(L, fut);
    return 1;
  }
  if (!nr_channel_is_datagram(ch))
    check_array(L, 2);
  lnr_blob_t *b = lnr_pack(L, 2, 1, "message");   /* may raise: first */
  xwrite_t *w = malloc(sizeof *w);
  if (w == NULL) {
    lnr_blob_free(b);
    return luaL_error(L, "out of memory");
  }
  w->b = b;
  w->ch = nr_channel_retain(ch);
  w->p = nr_promise_retain(p);
  w->flush = flush;
  int rc = loop == NULL ? NR_ECLOSED : nr_loop_execute(loop, xwrite_task, w);
  if (rc < 0) {
    if (rc == NR_EFULL)      /* a write is an asynchronous failure */
      nr_promise_set_failure(p, NR_EFULL, "channel's loop: task queue full "
                             "(max_pending_tasks): write rejected");
    else
      nr_promise_set_failure(p, NR_ECLOSED, "channel closed");
    nr_promise_release(p);
    lnr_blob_free(w->b);
    nr_channel_release(ch);
    free(w);
  }
  lua_pushvalue(L, fut);
  return 1;
}

/***
A channel: a TCP, Unix or UDP socket with its pipeline, bound to one loop
for life (`netrun.server`'s children and the server channel itself,
`netrun.connect`, `netrun.udp`). A handle may be used from any thread: a
write or close from another thread is queued to the channel's loop with its
message copied. Stream channels take a string, or an array of strings
(gathered in one write); datagram messages are
`{ data = "...", host = "1.2.3.4", port = 1234 }`. `ch1 == ch2` compares
channels.
@type channel
*/
/***
Write a message through the whole pipeline, from its tail; it is sent at
the next flush.
@function channel:write
@param msg a string, an array of strings, or what the pipeline's encoders take
@tparam[opt] future promise a promise to complete instead of a new future (e.g. the void promise)
@treturn future completed once the bytes are written, failed if they cannot be
*/
/***
Write and flush.
@function channel:write_and_flush
@param msg the message
@tparam[opt] future promise a promise to complete instead of a new future
@treturn future
*/
static int l_write(lua_State *L) { return do_write(L, false); }
static int l_write_and_flush(lua_State *L) { return do_write(L, true); }

/***
Flush what was written.
@function channel:flush
@treturn channel itself
*/
static int l_flush(lua_State *L) {
  nr_channel_flush(check(L, 1));
  lua_settop(L, 1);
  return 1;
}

/***
Close the channel, after flushing what it accepted; idempotent.
@function channel:close
@treturn future completed once it is closed
*/
static int l_close(lua_State *L) {
  nr_channel_t *ch = check(L, 1);
  nr_promise_t *p = nr_promise_new();
  lnr_push_promise(L, p);
  nr_channel_close(ch, p);
  return 1;
}

/***
The future that completes when the channel closes.
@function channel:close_future
@treturn future
*/
static int l_close_future(lua_State *L) {
  lnr_push_promise(L, nr_promise_retain(nr_channel_close_future(check(L, 1))));
  return 1;
}

/***
Ask for one read, when `auto_read` is false.
@function channel:read
@treturn channel itself
*/
static int l_read(lua_State *L) {
  nr_channel_read(check(L, 1));
  lua_settop(L, 1);
  return 1;
}

/* ---- accessors ------------------------------------------------------------ */

static int push_address(lua_State *L, int remote) {
  nr_channel_t *ch = check(L, 1);
  char host[128];
  int port;
  int rc = remote ? nr_channel_remote_address(ch, host, sizeof host, &port)
                  : nr_channel_local_address(ch, host, sizeof host, &port);
  if (rc < 0) {
    lua_pushnil(L);
    return 1;
  }
  lua_pushstring(L, host);
  if (port < 0)
    return 1;
  lua_pushinteger(L, port);
  return 2;
}

/***
The local address (for a server bound to port 0, the port it got).
@function channel:local_address
@treturn string|nil host (a path for a Unix socket), nil once unknown
@treturn int port
*/
/***
The peer's address.
@function channel:remote_address
@treturn string|nil host, nil if not connected
@treturn int port
*/
static int l_local_address(lua_State *L) { return push_address(L, 0); }
static int l_remote_address(lua_State *L) { return push_address(L, 1); }

/***
The channel's id, unique in the process.
@function channel:id
@treturn int
*/
static int l_id(lua_State *L) {
  lua_pushinteger(L, (lua_Integer)nr_channel_id(check(L, 1)));
  return 1;
}
/***
The loop the channel lives on.
@function channel:loop
@treturn loop
*/
static int l_loop(lua_State *L) {
  lnr_push_handle(L, LNR_LOOP, nr_channel_loop(check(L, 1)));
  return 1;
}
/***
Whether the channel is open (not yet closed).
@function channel:is_open
@treturn bool
*/
static int l_is_open(lua_State *L) {
  lua_pushboolean(L, nr_channel_is_open(check(L, 1)));
  return 1;
}
/***
Whether the channel is active: connected (bound, for a server or UDP).
@function channel:is_active
@treturn bool
*/
static int l_is_active(lua_State *L) {
  lua_pushboolean(L, nr_channel_is_active(check(L, 1)));
  return 1;
}
/***
Whether the channel is writable: its outbound buffer is below
`write_buffer_high` (or has drained below `write_buffer_low` since).
@function channel:is_writable
@treturn bool
*/
static int l_is_writable(lua_State *L) {
  lua_pushboolean(L, nr_channel_is_writable(check(L, 1)));
  return 1;
}

static void require_loop(lua_State *L, nr_channel_t *ch, const char *what) {
  nr_loop_t *loop = nr_channel_loop(ch);
  if (loop == NULL || !nr_loop_in_thread(loop))
    luaL_error(L, "%s of channel %d can only be used on its loop (%s)", what,
               (int)nr_channel_id(ch), loop ? nr_loop_name(loop) : "none");
}

/* Nanoseconds as seconds: an integer when whole (60, not 60.0). */
static void push_seconds(lua_State *L, uint64_t ns) {
  if (ns % 1000000000u == 0)
    lua_pushinteger(L, (lua_Integer)(ns / 1000000000u));
  else
    lua_pushnumber(L, (lua_Number)ns / 1e9);
}

/***
Get or set a channel option: `tcp_nodelay`, `keepalive`, `auto_read`,
`allow_half_closure`, `write_buffer_low`, `write_buffer_high`, `sndbuf`,
`rcvbuf`, `send_timeout` (seconds, 0: none). Options other than
`auto_read` are read and set on the channel's loop only; an unknown name
raises.
@function channel:option
@string name the option
@param[opt] value a new value
@return the value (getting), or the channel (setting)
*/
static int l_option(lua_State *L) {
  nr_channel_t *ch = check(L, 1);
  const char *name = luaL_checkstring(L, 2);
  if (!lua_isnoneornil(L, 3)) {
    if (strcmp(name, "auto_read") == 0) {
      nr_channel_set_auto_read(ch, lua_toboolean(L, 3));
      lua_settop(L, 1);
      return 1;
    }
    require_loop(L, ch, "options");
    if (strcmp(name, "send_timeout") == 0) {
      lua_Number s = luaL_checknumber(L, 3);
      if (!(s >= 0 && s <= 1e9))
        return luaL_error(L, "option 'send_timeout': expected seconds from 0 "
                          "(none) to 1e9, got %s", lua_tostring(L, 3));
      nr_channel_set_send_timeout(ch, lnr_ns(s));
      lua_settop(L, 1);
      return 1;
    }
    int v = lua_isboolean(L, 3) ? lua_toboolean(L, 3)
                                : (int)luaL_checkinteger(L, 3);
    int rc = nr_channel_set_option(ch, name, v);
    if (rc < 0)
      return luaL_error(L, "option '%s': %s", name, nr_strerror(rc));
    lua_settop(L, 1);
    return 1;
  }
  require_loop(L, ch, "options");
  const nr_channel_opts_t *o = nr_channel_options(ch);
  if (strcmp(name, "tcp_nodelay") == 0) lua_pushboolean(L, o->tcp_nodelay);
  else if (strcmp(name, "keepalive") == 0) lua_pushboolean(L, o->keepalive);
  else if (strcmp(name, "auto_read") == 0) lua_pushboolean(L, o->auto_read);
  else if (strcmp(name, "allow_half_closure") == 0) lua_pushboolean(L, o->allow_half_closure);
  else if (strcmp(name, "write_buffer_low") == 0) lua_pushinteger(L, (lua_Integer)o->write_buffer_low);
  else if (strcmp(name, "write_buffer_high") == 0) lua_pushinteger(L, (lua_Integer)o->write_buffer_high);
  else if (strcmp(name, "sndbuf") == 0) lua_pushinteger(L, o->sndbuf);
  else if (strcmp(name, "rcvbuf") == 0) lua_pushinteger(L, o->rcvbuf);
  else if (strcmp(name, "send_timeout") == 0) push_seconds(L, o->send_timeout);
  else return luaL_error(L, "unknown channel option '%s'", name);
  return 1;
}

/* Attributes live in the channel's loop state. As in Netty, where they
 * live as long as the channel, they stay readable through the whole close:
 * channel_inactive, channel_unregistered and handler_removed. They are
 * dropped after it. The close future completes before the pipeline's
 * teardown runs (at once, or when the handler call that closed returns:
 * pipeline.c, unwound), and the teardown never waits for a task; so the
 * future's listener queues the drop as a task, which runs after it. The
 * listener holds a reference on the channel until the drop, so that a new
 * channel cannot take its address (the key) meanwhile. */
static const char ATTRS = 0;

static void forget_attrs(lua_State *L, nr_channel_t *ch) {
  if (lua_rawgetp(L, LUA_REGISTRYINDEX, &ATTRS) == LUA_TTABLE) {
    lua_pushnil(L);
    lua_rawsetp(L, -2, ch);
  }
  lua_pop(L, 1);
}

static int drop_attrs_task(void *arg) {
  nr_channel_t *ch = arg;
  lnr_state_t *S = lnr_current_state();
  if (S != NULL && !S->closing)
    forget_attrs(S->L, ch);
  nr_channel_release(ch);
  return 0;
}

static void drop_attrs(nr_promise_t *p, void *arg) {
  (void)p;
  nr_channel_t *ch = arg;
  nr_loop_t *loop = nr_channel_loop(ch);
  if (!nr_loop_in_thread(loop)) {      /* its loop is gone, with the state */
    nr_channel_release(ch);
    return;
  }
  if (nr_loop_execute(loop, drop_attrs_task, ch) < 0)
    nr_channel_release(ch);  /* the loop is past shutdown: its state, and
                                the attributes with it, close after this */
}

/***
Get or set a per-channel attribute. Values live in the channel's loop
state (read and set them on that loop only), as long as the channel: they
stay readable through `channel_inactive` and `handler_removed`.
@function channel:attr
@param key the key
@param[opt] value a new value (an explicit nil clears it)
@return the value (getting), or the channel (setting)
*/
static int l_attr(lua_State *L) {
  nr_channel_t *ch = check(L, 1);
  luaL_checkany(L, 2);
  bool set = !lua_isnone(L, 3);            /* before the stack grows */
  lua_settop(L, set ? 3 : 2);
  require_loop(L, ch, "attributes");
  if (lua_rawgetp(L, LUA_REGISTRYINDEX, &ATTRS) != LUA_TTABLE) {
    lua_pop(L, 1);
    lua_newtable(L);
    lua_pushvalue(L, -1);
    lua_rawsetp(L, LUA_REGISTRYINDEX, &ATTRS);
  }
  if (lua_rawgetp(L, -1, ch) != LUA_TTABLE) {
    lua_pop(L, 1);
    if (!set) {
      lua_pushnil(L);
      return 1;
    }
    lua_newtable(L);
    lua_pushvalue(L, -1);
    lua_rawsetp(L, -3, ch);
    nr_promise_add_listener(nr_channel_close_future(ch), nr_channel_loop(ch),
                            drop_attrs, nr_channel_retain(ch));
  }
  if (!set) {
    lua_pushvalue(L, 2);
    lua_rawget(L, -2);
    return 1;
  }
  lua_pushvalue(L, 2);
  lua_pushvalue(L, 3);
  lua_rawset(L, -3);
  lua_settop(L, 1);
  return 1;
}

static int l_tostring(lua_State *L) {
  nr_channel_t *ch = check(L, 1);
  lua_pushfstring(L, "netrun.channel(%d%s)", (int)nr_channel_id(ch),
                  nr_channel_is_open(ch) ? "" : ", closed");
  return 1;
}

static int l_eq(lua_State *L) {
  lua_pushboolean(L, lnr_to_handle(L, 1, LNR_CHANNEL) ==
                         lnr_to_handle(L, 2, LNR_CHANNEL));
  return 1;
}

static void open_channel_handle(lua_State *L) {
  static const luaL_Reg methods[] = {
      {"id", l_id}, {"loop", l_loop}, {"remote_address", l_remote_address},
      {"local_address", l_local_address}, {"is_open", l_is_open},
      {"is_active", l_is_active}, {"is_writable", l_is_writable},
      {"write", l_write}, {"flush", l_flush},
      {"write_and_flush", l_write_and_flush}, {"read", l_read},
      {"option", l_option}, {"close", l_close},
      {"close_future", l_close_future}, {"attr", l_attr}, {NULL, NULL}};
  static const luaL_Reg meta[] = {{"__tostring", l_tostring}, {"__eq", l_eq},
                                  {NULL, NULL}};
  lnr_new_class(L, lnr_kind_names[LNR_CHANNEL], methods, meta);
  lnr_handle_class(L, LNR_CHANNEL);
  nr_set_msg_describer(lnr_describe_msg);
}

lnr_module_t lnr_channel_handle_module = {
    .name = "channel_handle", .open = open_channel_handle};
