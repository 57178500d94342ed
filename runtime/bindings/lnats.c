/*
 * lnats.c -- core.nats: the byte-level half of netrun.nats
 * (lua/netrun/nats.lua). A connection's "wire" holds
 *   - its outbound bytes: publications (PUB/HPUB, encoded here) and the
 *     protocol lines the Lua side sends (SUB, UNSUB, PING, PONG), in call
 *     order, written to the connection's channel in one write per loop
 *     iteration (a tail task), or at once past WRITE_AT bytes;
 *   - its reader (runtime/codec/nats.h), which turns what the server sends
 *     into calls of two Lua functions: on_msg(sid, subject, reply, data,
 *     hdr) for each message and on_ctl(kind, text) for the rest.
 *
 * Buffering is where the client's promises live. While the wire is
 * detached (no connection: connecting, reconnecting) or its channel is
 * unwritable (the server does not read fast enough), bytes stay here, up
 * to `buffer` bytes; past that a publication fails ("full") and the Lua
 * side decides: wait (in a coroutine, for writability) or nil, err. Once
 * attached and writable again, everything held is written, in order.
 * Bytes that reached the channel are the channel's (netrun's outbound
 * buffer): a connection lost before the kernel took them loses them, as
 * with any NATS client (core NATS is at most once).
 *
 * Threads: a wire belongs to the loop state that made it; everything here
 * runs on that loop's thread. The struct is reference-counted by its
 * userdata and by a queued tail flush, so a collected wire whose flush is
 * still queued is freed by that flush.
 */
#include <stdlib.h>
#include <string.h>

#include "codec/nats.h"
#include "lnr.h"

#define WIRE_MT "netrun.nats.wire"
#define WRITE_AT ((size_t)64 << 10)    /* write through at this many bytes */
#define KEEP_CAP ((size_t)256 << 10)   /* free a larger buffer once empty */

typedef struct wire_s {
  nr_nats_reader_t rd;
  char *out;                  /* outbound bytes not yet written */
  size_t len, cap;
  nr_channel_t *ch;           /* attached: the connection (retained) */
  nr_loop_t *loop;            /* the state's loop: its tail task */
  size_t buffer;              /* bytes held at most while not writing */
  size_t max_payload;         /* the server's: headers and data */
  int refs;                   /* the userdata's; a queued tail flush's */
  bool tail;                  /* a tail flush is queued */
  bool feeding;               /* inside feed: a reset waits for its end */
  bool flushing;              /* inside write_out */
  bool reset_later;
  bool closed;
  uint64_t in_msgs, in_bytes, out_msgs, out_bytes;
} wire_t;

static void wire_unref(wire_t *w) {
  if (--w->refs > 0)
    return;
  if (w->ch)
    nr_channel_release(w->ch);
  nr_nats_reader_reset(&w->rd);
  free(w->out);
  free(w);
}

static wire_t *check(lua_State *L) {
  wire_t **u = luaL_checkudata(L, 1, WIRE_MT);
  if (*u == NULL)
    luaL_error(L, "netrun.nats: the wire is gone");
  return *u;
}


/* ---- outbound ------------------------------------------------------------ */

static bool reserve(wire_t *w, size_t n) {
  if (w->cap - w->len >= n)
    return true;
  size_t cap = w->cap ? w->cap : 4096;
  while (cap - w->len < n)
    cap *= 2;
  char *o = realloc(w->out, cap);
  if (o == NULL)
    return false;
  w->out = o;
  w->cap = cap;
  return true;
}

static bool writing(const wire_t *w) {
  return w->ch != NULL && nr_channel_is_writable(w->ch);
}

/* Hand everything held to the channel. On a channel that refuses it
 * (closed under us, its inactive event not seen yet), the bytes stay for
 * the next connection and the wire detaches. The bytes are copied into
 * the channel first and flushed after: a flush may run Lua (the
 * handler's channel_writability_changed, which flushes the wire, or a
 * publisher woken by it), which must find the wire empty and not in the
 * middle of a write. */
static void write_out(wire_t *w) {
  if (w->len == 0 || w->flushing || !writing(w))
    return;
  nr_channel_t *ch = nr_channel_retain(w->ch);
  w->flushing = true;
  int rc = nr_channel_write(ch, w->out, w->len, false, NULL);
  w->flushing = false;
  if (rc < 0) {
    if (w->ch == ch) {
      nr_channel_release(w->ch);
      w->ch = NULL;
    }
    nr_channel_release(ch);
    return;
  }
  w->len = 0;
  if (w->cap > KEEP_CAP) {
    free(w->out);
    w->out = NULL;
    w->cap = 0;
  }
  nr_channel_flush(ch);
  nr_channel_release(ch);
}

static int tail_flush(void *arg) {
  wire_t *w = arg;
  w->tail = false;
  if (w->refs > 1)
    write_out(w);
  wire_unref(w);
  return 0;
}

/* After appending: write now past WRITE_AT, else once this iteration ends. */
static void appended(wire_t *w) {
  if (!writing(w))
    return;
  if (w->len >= WRITE_AT) {
    write_out(w);
  } else if (!w->tail) {
    w->tail = true;
    w->refs++;
    if (nr_loop_after_iteration(w->loop, tail_flush, w) < 0) {
      w->tail = false;        /* the loop is shutting down: write now */
      w->refs--;
      write_out(w);
    }
  }
}

static int fail(lua_State *L, const char *why) {
  lua_pushboolean(L, 0);
  lua_pushstring(L, why);
  return 2;
}

static size_t digits(size_t v) {
  size_t n = 1;
  while (v >= 10) {
    v /= 10;
    n++;
  }
  return n;
}

/* The exact bytes of a publication: the buffer's bound is exact. */
static size_t pub_size(size_t sl, size_t rl, size_t hl, size_t dl) {
  size_t n = (hl > 0 ? 5 + digits(hl) + 1 : 4) + sl + 1 + digits(hl + dl) + 2;
  return n + (rl > 0 ? rl + 1 : 0) + hl + dl + 2;
}

/* Encode a publication from the arguments at 2..5 (subject, data, reply,
 * hdr: the header block, encoded, or nil): NULL once held or written,
 * else why not ("closed", "max_payload", "full"). A bad subject raises at
 * the caller's line (nc.publish is this C function itself). */
static const char *publish(lua_State *L, wire_t *w) {
  size_t sl, dl = 0, rl = 0, hl = 0;
  const char *s = luaL_checklstring(L, 2, &sl);
  const char *d = lua_isnoneornil(L, 3) ? "" : luaL_checklstring(L, 3, &dl);
  const char *r = lua_isnoneornil(L, 4) ? NULL : luaL_checklstring(L, 4, &rl);
  const char *h = lua_isnoneornil(L, 5) ? NULL : luaL_checklstring(L, 5, &hl);
  if (!nr_nats_valid_subject(s, sl))
    luaL_error(L, "netrun.nats: publish: the subject must be a non-empty "
                  "string without spaces, tabs or line breaks");
  if (r != NULL && !nr_nats_valid_subject(r, rl))
    luaL_error(L, "netrun.nats: publish: the reply subject must be a "
                  "non-empty string without spaces, tabs or line breaks");
  if (w->closed)
    return "closed";
  if (hl + dl > w->max_payload)
    return "max_payload";
  size_t need = nr_nats_pub_line_max(sl, rl) + hl + dl + 2;
  if (!writing(w) && w->len + pub_size(sl, rl, hl, dl) > w->buffer)
    return "full";
  if (!reserve(w, need))
    luaL_error(L, "netrun.nats: out of memory");
  char *o = w->out + w->len;
  o += nr_nats_pub_line(o, s, sl, r, rl, hl, dl);
  if (hl > 0)
    memcpy(o, h, hl);
  memcpy(o + hl, d, dl);
  o += hl + dl;
  *o++ = '\r';
  *o++ = '\n';
  w->len = (size_t)(o - w->out);
  w->out_msgs++;
  w->out_bytes += dl;
  appended(w);
  return NULL;
}

/* w:pub(subject, data, reply, hdr) --> true | false, "closed" |
 * "max_payload" | "full". */
static int l_pub(lua_State *L) {
  const char *why = publish(L, check(L));
  if (why != NULL)
    return fail(L, why);
  lua_pushboolean(L, 1);
  return 1;
}

/* After slow returned (or yielded and was resumed): its results. */
static int publish_k(lua_State *L, int status, lua_KContext ctx) {
  (void)status;
  (void)ctx;
  return lua_gettop(L);
}

/* The function core.nats.publisher(w, slow) makes: nc.publish(nc,
 * subject, data, reply, headers) --> true, in C, for a publication
 * without headers that the wire takes; anything else (headers to encode,
 * a refusal to explain or wait on) goes to slow(nc, subject, data, reply,
 * headers, why), whose results it returns (slow may yield: a coroutine
 * waits there for the server to read). The wire is upvalue 1. */
static int l_publish(lua_State *L) {
  wire_t **u = lua_touserdata(L, lua_upvalueindex(1));
  const char *why = NULL;
  if (lua_isnoneornil(L, 5)) {
    lua_settop(L, 4);
    why = publish(L, *u);
    if (why == NULL) {
      lua_pushboolean(L, 1);
      return 1;
    }
  }
  lua_settop(L, 5);
  lua_pushstring(L, why);             /* nil when headers were given */
  lua_pushvalue(L, lua_upvalueindex(2));
  lua_insert(L, 1);
  /* with a continuation: slow may wait (yield) for the server to read */
  lua_callk(L, 6, LUA_MULTRET, 0, publish_k);
  return lua_gettop(L);
}

/* core.nats.valid_subject(s) --> whether s may be sent as a subject
 * (nr_nats_valid_subject; a Lua pattern did the same at several times
 * the cost, on every request). */
static int l_valid_subject(lua_State *L) {
  size_t n;
  const char *s = lua_tolstring(L, 1, &n);
  lua_pushboolean(L, s != NULL && lua_type(L, 1) == LUA_TSTRING &&
                         nr_nats_valid_subject(s, n));
  return 1;
}

/* core.nats.abort(ch): reset the connection now, dropping what it holds.
 * For a server the client gives up on (stale, hostile, broken): a
 * graceful close would wait up to the close linger for it to read. */
static int l_abort(lua_State *L) {
  nr_channel_abort(lnr_check_handle(L, 1, LNR_CHANNEL));
  return 0;
}

/* core.nats.publisher(w, slow) --> nc.publish (see l_publish). */
static int l_publisher(lua_State *L) {
  wire_t **u = luaL_checkudata(L, 1, WIRE_MT);
  luaL_argcheck(L, *u != NULL, 1, "the wire is gone");
  luaL_checktype(L, 2, LUA_TFUNCTION);
  lua_settop(L, 2);
  lua_pushcclosure(L, l_publish, 2);
  return 1;
}

/* w:send(line [, bounded]) --> true | false: protocol bytes (SUB, UNSUB,
 * PING, PONG), held or written as publications are. What the client
 * decides to send is never refused; with bounded (the PONG a server's
 * PING asks for: the server sets the pace), false once `buffer` bytes
 * are held and not being written -- a server that sends PINGs and reads
 * nothing would otherwise grow the wire without bound. */
static int l_send(lua_State *L) {
  wire_t *w = check(L);
  size_t n;
  const char *s = luaL_checklstring(L, 2, &n);
  if (lua_toboolean(L, 3) && !writing(w) && w->len + n > w->buffer) {
    lua_pushboolean(L, 0);
    return 1;
  }
  if (!reserve(w, n))
    return luaL_error(L, "netrun.nats: out of memory");
  memcpy(w->out + w->len, s, n);
  w->len += n;
  appended(w);
  lua_pushboolean(L, 1);
  return 1;
}

/* w:attach(ch): write to ch from now on, beginning with what is held. */
static int l_attach(lua_State *L) {
  wire_t *w = check(L);
  nr_channel_t *ch = lnr_check_handle(L, 2, LNR_CHANNEL);
  if (w->ch)
    nr_channel_release(w->ch);
  w->ch = nr_channel_retain(ch);
  write_out(w);
  return 0;
}

/* w:detach(): hold bytes from now on (the connection is gone). */
static int l_detach(lua_State *L) {
  wire_t *w = check(L);
  if (w->ch)
    nr_channel_release(w->ch);
  w->ch = NULL;
  return 0;
}

/* w:flush(): write what is held, if the channel takes writes now. */
static int l_flush(lua_State *L) {
  write_out(check(L));
  return 0;
}

/* w:discard(): drop what is held (a close that does not flush). */
static int l_discard(lua_State *L) {
  wire_t *w = check(L);
  w->len = 0;
  return 0;
}

/* ---- inbound ------------------------------------------------------------- */

typedef struct feed_s {
  lua_State *L;
  wire_t *w;
  int on_msg, on_ctl;         /* stack indexes of the callbacks */
  bool failed;                /* a callback raised: its error is on top */
} feed_t;

static void push_slice(lua_State *L, nr_slice_t s) {
  if (s.data == NULL)
    lua_pushnil(L);
  else
    lua_pushlstring(L, s.data, s.len);
}

static int on_op(void *ud, const nr_nats_op_t *op) {
  static const char *const kinds[] = {NULL, NULL, NULL, "PING", "PONG",
                                      "OK", "ERR", "INFO"};
  feed_t *f = ud;
  lua_State *L = f->L;
  int nargs;
  if (op->kind == NR_NATS_MSG || op->kind == NR_NATS_HMSG) {
    f->w->in_msgs++;
    f->w->in_bytes += op->data.len;
    lua_pushvalue(L, f->on_msg);
    lua_pushinteger(L, (lua_Integer)op->sid);
    lua_pushlstring(L, op->subject.data, op->subject.len);
    push_slice(L, op->reply);
    lua_pushlstring(L, op->data.data, op->data.len);
    if (op->kind == NR_NATS_HMSG)
      lua_pushlstring(L, op->hdr.data, op->hdr.len);
    else
      lua_pushnil(L);
    nargs = 5;
  } else {
    lua_pushvalue(L, f->on_ctl);
    lua_pushstring(L, kinds[op->kind]);
    push_slice(L, op->data);
    nargs = 2;
  }
  if (lnr_pcall(L, nargs, 0) != LUA_OK) {
    f->failed = true;
    return 1;
  }
  return f->w->reset_later || f->w->closed ? 2 : 0;
}

/* w:feed(bytes) --> nothing, or an error: the server broke the protocol
 * ("NATS protocol error: <why>") or a callback raised (its message). The
 * reader is reset after an error: the connection is to be dropped. */
static int l_feed(lua_State *L) {
  wire_t *w = check(L);
  size_t n;
  const char *s = luaL_checklstring(L, 2, &n);
  lua_settop(L, 2);
  lua_getiuservalue(L, 1, 1);
  lua_getiuservalue(L, 1, 2);
  feed_t f = {L, w, 3, 4, false};
  const char *why = NULL;
  w->feeding = true;
  int rc = nr_nats_reader_feed(&w->rd, s, n, on_op, &f, &why);
  w->feeding = false;
  if (w->reset_later || f.failed || rc != 0) {
    w->reset_later = false;
    nr_nats_reader_reset(&w->rd);
  }
  if (f.failed)
    return 1;                 /* the callback's error, on top */
  if (rc < 0) {
    lua_pushfstring(L, "NATS protocol error: %s", why ? why : "?");
    return 1;
  }
  return 0;
}

/* Forget the reader's partial operation; inside a feed (a callback
 * reconnecting or closing), once the feed returns. */
static void reset_reader(wire_t *w) {
  if (w->feeding)
    w->reset_later = true;
  else
    nr_nats_reader_reset(&w->rd);
}

/* w:reset(): forget any partial operation (a new connection begins). */
static int l_reset(lua_State *L) {
  reset_reader(check(L));
  return 0;
}

/* ---- the rest ------------------------------------------------------------ */

/* w:set_max_payload(n): the server's limit, from its INFO. */
static int l_set_max_payload(lua_State *L) {
  wire_t *w = check(L);
  lua_Integer n = luaL_checkinteger(L, 2);
  w->max_payload = n > 0 ? (size_t)n : 0;
  return 0;
}

/* w:close(): publications fail with "closed" from now on; nothing held. */
static int l_close(lua_State *L) {
  wire_t *w = check(L);
  w->closed = true;
  w->len = 0;
  if (w->ch)
    nr_channel_release(w->ch);
  w->ch = NULL;
  reset_reader(w);
  return 0;
}

/* w:stats() --> in_msgs, in_bytes, out_msgs, out_bytes, bytes held. */
static int l_stats(lua_State *L) {
  wire_t *w = check(L);
  lua_pushinteger(L, (lua_Integer)w->in_msgs);
  lua_pushinteger(L, (lua_Integer)w->in_bytes);
  lua_pushinteger(L, (lua_Integer)w->out_msgs);
  lua_pushinteger(L, (lua_Integer)w->out_bytes);
  lua_pushinteger(L, (lua_Integer)w->len);
  return 5;
}

static int l_gc(lua_State *L) {
  wire_t **u = luaL_checkudata(L, 1, WIRE_MT);
  if (*u != NULL) {
    (*u)->closed = true;
    wire_unref(*u);
    *u = NULL;
  }
  return 0;
}

/* core.nats.wire(on_msg, on_ctl, { buffer, max_control_line, max_message })
 * on a loop: a new wire, detached, its max_payload 1 MiB until an INFO
 * says otherwise. */
static int l_wire(lua_State *L) {
  luaL_checktype(L, 1, LUA_TFUNCTION);
  luaL_checktype(L, 2, LUA_TFUNCTION);
  luaL_checktype(L, 3, LUA_TTABLE);
  lnr_state_t *S = lnr_state(L);
  if (S == NULL || S->main)
    return luaL_error(L, "netrun.nats: a connection lives on a loop");
  lua_Integer v[3];
  static const char *const keys[] = {"buffer", "max_control_line",
                                     "max_message"};
  for (int i = 0; i < 3; i++) {
    lua_getfield(L, 3, keys[i]);
    v[i] = luaL_checkinteger(L, -1);
    luaL_argcheck(L, v[i] > 0, 3, keys[i]);
    lua_pop(L, 1);
  }
  wire_t **u = lua_newuserdatauv(L, sizeof *u, 2);
  *u = NULL;
  luaL_setmetatable(L, WIRE_MT);
  wire_t *w = calloc(1, sizeof *w);
  if (w == NULL)
    return luaL_error(L, "netrun.nats: out of memory");
  nr_nats_reader_init(&w->rd, &(nr_nats_limits_t){(size_t)v[1], (size_t)v[2]});
  w->loop = S->loop;
  w->buffer = (size_t)v[0];
  w->max_payload = (size_t)1 << 20;
  w->refs = 1;
  *u = w;
  lua_pushvalue(L, 1);
  lua_setiuservalue(L, -2, 1);
  lua_pushvalue(L, 2);
  lua_setiuservalue(L, -2, 2);
  return 1;
}

static void open_nats(lua_State *L) {
  static const luaL_Reg methods[] = {
      {"pub", l_pub},       {"send", l_send},       {"attach", l_attach},
      {"detach", l_detach}, {"flush", l_flush},     {"discard", l_discard},
      {"feed", l_feed},     {"reset", l_reset},     {"close", l_close},
      {"stats", l_stats},   {"set_max_payload", l_set_max_payload},
      {NULL, NULL}};
  static const luaL_Reg meta[] = {{"__gc", l_gc}, {NULL, NULL}};
  lnr_new_class(L, WIRE_MT, methods, meta);
  lua_newtable(L);
  lua_pushcfunction(L, l_wire);
  lua_setfield(L, -2, "wire");
  lua_pushcfunction(L, l_publisher);
  lua_setfield(L, -2, "publisher");
  lua_pushcfunction(L, l_valid_subject);
  lua_setfield(L, -2, "valid_subject");
  lua_pushcfunction(L, l_abort);
  lua_setfield(L, -2, "abort");
  lua_setfield(L, -2, "nats");
}

lnr_module_t lnr_nats_module = {.name = "nats", .open = open_nats};
