/*
 * lcodec.c -- the frame codecs in Lua (netrun.codec.line, delimiter,
 * length_field, length_prepender, fixed_length) and embedded channels
 * (netrun.embedded) for testing handlers without sockets.
 *
 * A codec value is a small userdata holding its validated options; its
 * metatable's __netrun_native builds a fresh C handler state for every
 * pipeline it is added to, so one value may serve many channels. Options
 * are checked when the value is made: a mistake raises there, naming the
 * option.
 *
 * An embedded channel lives on the caller's loop (the main thread's
 * external loop on the main thread) and is used only there. What reaches
 * its tail and its head is converted to Lua values at once (messages are
 * borrowed) and queued in a table held by the object.
 */

/***
@module netrun
*/

/***
Codecs: `netrun.codec`.
Native frame decoders and encoders (they cost no Lua time). A constructor
returns a configuration -- plain data, copied like any value, so it may be
an upvalue of `init` -- and adding it to a pipeline makes a fresh codec for
that channel; make it once, outside `init`. A frame over its limit reaches
`exception_caught` with a clear error and is discarded; a decoder holds no
memory between frames, and stops reading while its channel is unwritable.
@section codec
*/
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "codec/codec.h"
#include "lnr.h"

#define CODEC "netrun.codec"
#define EMBEDDED "netrun.embedded"

enum { C_LINE, C_DELIM, C_LENFIELD, C_PREPENDER, C_FIXED };
static const char *const kind_names[] = {"line", "delimiter", "length_field",
                                         "length_prepender", "fixed_length"};

typedef struct lcodec_s {
  int kind;
  size_t max_length;
  bool strip;
  nr_lenfield_t lenfield;
  nr_prepender_t prepender;
  size_t fixed;
  int ndelims;
  size_t delim_lens[NR_MAX_DELIMITERS];
  size_t delim_off[NR_MAX_DELIMITERS];
  char delims[];             /* the delimiters, back to back */
} lcodec_t;

/* ---- building handlers ------------------------------------------------------- */

static const nr_handler_t *make_handler(lua_State *L, int idx, void **state) {
  const lcodec_t *c = luaL_checkudata(L, idx, CODEC);
  const nr_handler_t *vt = NULL;
  void *st = NULL;
  switch (c->kind) {
  case C_LINE:
    st = nr_line_new(c->max_length, c->strip);
    vt = &nr_line_handler;
    break;
  case C_DELIM: {
    const char *v[NR_MAX_DELIMITERS];
    for (int i = 0; i < c->ndelims; i++)
      v[i] = c->delims + c->delim_off[i];
    st = nr_delim_new(v, c->delim_lens, c->ndelims, c->max_length, c->strip);
    vt = &nr_delim_handler;
    break;
  }
  case C_LENFIELD:
    st = nr_lenfield_new(&c->lenfield);
    vt = &nr_lenfield_handler;
    break;
  case C_PREPENDER:
    st = nr_prepender_new(&c->prepender);
    vt = &nr_prepender_handler;
    break;
  default:
    st = nr_fixed_new(c->fixed);
    vt = &nr_fixed_handler;
  }
  if (st == NULL)
    luaL_error(L, "netrun.codec.%s: out of memory", kind_names[c->kind]);
  *state = st;
  return vt;
}

/* ---- options ------------------------------------------------------------------- */

/* length: the bytes of a length field. */
static size_t opt_field_length(const lnr_opts_t *o) {
  lua_State *L = o->L;
  lua_Integer n = 4;
  if (o->t && lua_getfield(L, o->t, "length") != LUA_TNIL) {
    int ok = 0;
    n = lua_tointegerx(L, -1, &ok);
    if (!ok || (n != 1 && n != 2 && n != 3 && n != 4 && n != 8))
      lnr_opt_bad(o, "length", -1, "1, 2, 3, 4 or 8");
  }
  if (o->t)
    lua_pop(L, 1);
  return (size_t)n;
}

static lcodec_t *new_codec(lua_State *L, int kind, size_t extra) {
  lcodec_t *c = lua_newuserdatauv(L, sizeof *c + extra, 0);
  memset(c, 0, sizeof *c);
  c->kind = kind;
  luaL_setmetatable(L, CODEC);
  return c;
}

#define MAXLEN LNR_OPT_SIZE_MAX

/***
Lines ending in `\n` (or `\r\n`), each a string.
@function codec.line
@tparam[opt] table opts
@int[opt=8192] opts.max_length the longest line
@bool[opt=true] opts.strip drop the line ending
@return a codec configuration
@usage ch:pipeline():add_last("frame", netrun.codec.line { max_length = 8192 })
*/

static int l_line(lua_State *L) {
  static const char *const keys[] = {"max_length", "strip", NULL};
  lnr_opts_t o;
  lnr_opts_open(&o, L, 1, "netrun.codec.line", keys, false);
  size_t max = lnr_opt_size(&o, "max_length", 8192, 1, MAXLEN);
  bool strip = lnr_opt_boolean(&o, "strip", true);
  lcodec_t *c = new_codec(L, C_LINE, 0);
  c->max_length = max;
  c->strip = strip;
  return 1;
}

/***
Frames ending in any of up to 8 delimiters.
@function codec.delimiter
@tparam table opts
@tparam {string,...} opts.delimiters the delimiters, non-empty strings
@int[opt=8192] opts.max_length the longest frame
@bool[opt=true] opts.strip drop the delimiter
@return a codec configuration
*/

static int l_delimiter(lua_State *L) {
  static const char *const keys[] = {"delimiters", "max_length", "strip",
                                     NULL};
  lnr_opts_t o;
  lnr_opts_open(&o, L, 1, "netrun.codec.delimiter", keys, false);
  size_t max = lnr_opt_size(&o, "max_length", 8192, 1, MAXLEN);
  bool strip = lnr_opt_boolean(&o, "strip", true);
  if (o.t)
    lua_getfield(L, o.t, "delimiters");
  else
    lua_pushnil(L);
  int n = lnr_optv_strings(&o, "delimiters", -1, NR_MAX_DELIMITERS);
  size_t total = 0, lens[NR_MAX_DELIMITERS];
  for (int i = 0; i < n; i++) {
    lua_rawgeti(L, -1, i + 1);
    lua_tolstring(L, -1, &lens[i]);
    if (lens[i] == 0) {
      char k[32];
      snprintf(k, sizeof k, "delimiters[%d]", i + 1);
      lnr_opt_bad(&o, k, -1, "a non-empty string");
    }
    total += lens[i];
    lua_pop(L, 1);
  }
  lcodec_t *c = new_codec(L, C_DELIM, total);
  c->max_length = max;
  c->strip = strip;
  c->ndelims = n;
  size_t off = 0;
  for (int i = 0; i < n; i++) {
    lua_rawgeti(L, -2, i + 1);
    memcpy(c->delims + off, lua_tostring(L, -1), lens[i]);
    lua_pop(L, 1);
    c->delim_lens[i] = lens[i];
    c->delim_off[i] = off;
    off += lens[i];
  }
  return 1;
}

/***
Frames with a big-endian length field (Netty's
LengthFieldBasedFrameDecoder).
@function codec.length_field
@tparam[opt] table opts
@int[opt=0] opts.offset where the length field starts
@int[opt=4] opts.length its size in bytes: 1, 2, 3, 4 or 8
@int[opt=0] opts.adjustment added to the length to get what follows the field
@int[opt] opts.strip bytes dropped from a frame's start (default: offset + length, the header)
@int[opt=1048576] opts.max_frame the largest frame
@return a codec configuration
*/

static int l_length_field(lua_State *L) {
  static const char *const keys[] = {"offset", "length", "adjustment",
                                     "strip", "max_frame", NULL};
  lnr_opts_t o;
  lnr_opts_open(&o, L, 1, "netrun.codec.length_field", keys, false);
  nr_lenfield_t f = {0};
  f.offset = (size_t)lnr_opt_integer(&o, "offset", 0, 0, MAXLEN);
  f.length = opt_field_length(&o);
  f.adjustment = lnr_opt_integer(&o, "adjustment", 0, -MAXLEN, MAXLEN);
  /* By default the header is stripped: the handler after it sees bodies. */
  f.strip = (size_t)lnr_opt_integer(&o, "strip",
                                    (lua_Integer)(f.offset + f.length), 0,
                                    MAXLEN);
  f.max_frame = lnr_opt_size(&o, "max_frame", 1 << 20, 1, MAXLEN);
  if (f.max_frame < f.offset + f.length)
    lnr_opts_error(&o, "max_frame (%I) must be at least offset + length (%I)",
                   (lua_Integer)f.max_frame, (lua_Integer)(f.offset + f.length));
  lcodec_t *c = new_codec(L, C_LENFIELD, 0);
  c->lenfield = f;
  return 1;
}

/***
Encoder: prepends a big-endian length to each message written (gathered,
not copied).
@function codec.length_prepender
@tparam[opt] table opts
@int[opt=4] opts.length the field's size: 1, 2, 3, 4 or 8
@int[opt=0] opts.adjustment added to the length written
@bool[opt=false] opts.includes_length whether the length counts the field itself
@return a codec configuration
*/

static int l_length_prepender(lua_State *L) {
  static const char *const keys[] = {"length", "adjustment",
                                     "includes_length", NULL};
  lnr_opts_t o;
  lnr_opts_open(&o, L, 1, "netrun.codec.length_prepender", keys, false);
  nr_prepender_t p = {0};
  p.length = opt_field_length(&o);
  p.adjustment = lnr_opt_integer(&o, "adjustment", 0, -MAXLEN, MAXLEN);
  p.includes_length = lnr_opt_boolean(&o, "includes_length", false);
  lcodec_t *c = new_codec(L, C_PREPENDER, 0);
  c->prepender = p;
  return 1;
}

/***
Frames of a fixed length.
@function codec.fixed_length
@tparam table opts
@int opts.length the frame length (required)
@return a codec configuration
*/

static int l_fixed_length(lua_State *L) {
  static const char *const keys[] = {"length", NULL};
  lnr_opts_t o;
  lnr_opts_open(&o, L, 1, "netrun.codec.fixed_length", keys, true);
  lua_getfield(L, 1, "length");             /* required */
  size_t n = lnr_optv_size(&o, "length", -1, 1, MAXLEN);
  lua_pop(L, 1);
  lcodec_t *c = new_codec(L, C_FIXED, 0);
  c->fixed = n;
  return 1;
}

static int codec_tostring(lua_State *L) {
  const lcodec_t *c = luaL_checkudata(L, 1, CODEC);
  lua_pushfstring(L, "netrun.codec.%s", kind_names[c->kind]);
  return 1;
}

/***
How many bytes a decoder of a channel holds in its cumulation (0 on an idle
connection). On the channel's loop.
@function codec.buffered
@tparam channel ch the channel
@string name the decoder's name in its pipeline
@treturn int bytes
*/

/* netrun.codec.buffered(ch, name) --> bytes the decoder `name` holds in
 * its cumulation (0 on an idle connection). On the channel's loop. */
static int l_buffered(lua_State *L) {
  nr_channel_t *ch = lnr_check_handle(L, 1, LNR_CHANNEL);
  const char *name = luaL_checkstring(L, 2);
  if (!nr_loop_in_thread(nr_channel_loop(ch)))
    return luaL_error(L, "netrun.codec.buffered: only on the channel's loop");
  nr_ctx_t *ctx = nr_pipeline_context(nr_channel_pipeline(ch), name);
  if (ctx == NULL ||
      nr_ctx_handler(ctx)->channel_read != nr_decoder_channel_read)
    return luaL_error(L, "netrun.codec.buffered: no decoder named '%s'", name);
  lua_pushinteger(L, (lua_Integer)nr_decoder_buffered(nr_ctx_state(ctx)));
  return 1;
}

/* Gathered writes (length_prepender's output) reach Lua outbound handlers
 * as arrays of strings, which a write turns back into one gathered write. */
static void push_slices(lua_State *L, void *msg) {
  const nr_slices_t *s = msg;
  lua_createtable(L, (int)s->n, 0);
  for (size_t i = 0; i < s->n; i++) {
    lua_pushlstring(L, s->v[i].data, s->v[i].len);
    lua_rawseti(L, -2, (lua_Integer)i + 1);
  }
}

static pthread_once_t slices_once = PTHREAD_ONCE_INIT;
static void register_slices(void) {
  lnr_register_msg(NR_MSG_SLICES, push_slices);
}

/* ---- embedded channels ------------------------------------------------------------ */

typedef struct lemb_s {
  nr_embedded_t *e;
  lnr_state_t *S;
  int qref;                  /* { inbound = {...}, outbound = {...} } */
  lua_Integer in_head, in_tail, out_head, out_tail;
  int err_ref;               /* first exception not yet raised */
} lemb_t;

/* Push a captured message as a Lua value: bytes and gathered bytes become
 * one string (what the wire would carry), others as Lua handlers see them. */
static void push_captured(lua_State *L, void *msg) {
  int type = nr_msg_type(msg);
  if (type == NR_MSG_SLICES) {
    const nr_slices_t *s = msg;
    luaL_Buffer b;
    luaL_buffinit(L, &b);
    for (size_t i = 0; i < s->n; i++)
      luaL_addlstring(&b, s->v[i].data, s->v[i].len);
    luaL_pushresult(&b);
  } else {
    lnr_push_msg(L, msg);
  }
}

static void capture(lemb_t *o, void *msg, const char *queue,
                    lua_Integer *tail) {
  lua_State *L = o->S->L;
  lua_rawgeti(L, LUA_REGISTRYINDEX, o->qref);
  lua_getfield(L, -1, queue);
  push_captured(L, msg);
  lua_rawseti(L, -2, ++*tail);
  lua_pop(L, 2);
}

static void sink_inbound(void *ud, void *msg) {
  lemb_t *o = ud;
  capture(o, msg, "inbound", &o->in_tail);
}

static void sink_outbound(void *ud, void *msg) {
  lemb_t *o = ud;
  capture(o, msg, "outbound", &o->out_tail);
}

static void sink_exception(void *ud, const nr_err_t *err) {
  lemb_t *o = ud;
  if (o->err_ref != LUA_NOREF)
    return;                  /* keep the first, as Netty does */
  lua_State *L = o->S->L;
  lua_pushstring(L, err->msg ? err->msg : nr_strerror(err->code));
  o->err_ref = luaL_ref(L, LUA_REGISTRYINDEX);
}

static lemb_t *check_emb(lua_State *L) {
  lemb_t *o = luaL_checkudata(L, 1, EMBEDDED);
  if (o->e == NULL)
    luaL_error(L, "embedded channel: used after close");
  return o;
}

/* Raise the first exception that reached the tail (Netty's
 * checkException), once. */
static void check_exception(lua_State *L, lemb_t *o) {
  if (o->err_ref == LUA_NOREF)
    return;
  lua_rawgeti(L, LUA_REGISTRYINDEX, o->err_ref);
  luaL_unref(L, LUA_REGISTRYINDEX, o->err_ref);
  o->err_ref = LUA_NOREF;
  lua_error(L);
}

/*** @section end */

/***
An embedded channel, made by `embedded`: a pipeline without a socket
(Netty's EmbeddedChannel), for testing handlers and codecs. What reaches
the tail inbound and the head outbound is queued for reading; an error
that reaches the tail is raised by the next call.
@type embedded
*/

/***
Feed messages in at the head, as if read from the socket.
@function embedded:write_inbound
@param ... the messages (strings for a decoder)
@treturn bool whether something reached the tail
*/

/* ch:write_inbound(msg, ...) --> true if something reached the tail. */
static int e_write_inbound(lua_State *L) {
  lemb_t *o = check_emb(L);
  int n = lua_gettop(L);
  for (int i = 2; i <= n; i++) {
    lnr_msgbuf_t m;
    nr_embedded_write_inbound(o->e, lnr_to_msg(L, i, nr_embedded_channel(o->e), &m),
                              false);
    lnr_msg_done(&m);
  }
  nr_channel_t *ch = nr_embedded_channel(o->e);
  if (nr_channel_is_open(ch))
    nr_ctx_fire_read_complete(nr_pipeline_head(nr_channel_pipeline(ch)));
  check_exception(L, o);
  lua_pushboolean(L, o->in_head < o->in_tail);
  return 1;
}

/***
Write messages from the tail, and flush.
@function embedded:write_outbound
@param ... the messages
@treturn bool whether something reached the head
*/

/* ch:write_outbound(msg, ...) --> true if something reached the head. */
static int e_write_outbound(lua_State *L) {
  lemb_t *o = check_emb(L);
  nr_channel_t *ch = nr_embedded_channel(o->e);
  int n = lua_gettop(L);
  for (int i = 2; i <= n; i++) {
    lnr_msgbuf_t m;
    nr_pipeline_write(nr_channel_pipeline(ch), lnr_to_msg(L, i, ch, &m), NULL);
    lnr_msg_done(&m);
  }
  nr_pipeline_flush(nr_channel_pipeline(ch));
  check_exception(L, o);
  lua_pushboolean(L, o->out_head < o->out_tail);
  return 1;
}

static int dequeue(lua_State *L, lemb_t *o, const char *queue,
                   lua_Integer *head, lua_Integer tail) {
  if (*head >= tail) {
    lua_pushnil(L);
    return 1;
  }
  lua_rawgeti(L, LUA_REGISTRYINDEX, o->qref);
  lua_getfield(L, -1, queue);
  lua_rawgeti(L, -1, ++*head);
  lua_pushnil(L);
  lua_rawseti(L, -3, *head);           /* queue[head] = nil */
  return 1;
}

/***
The next message that reached the tail.
@function embedded:read_inbound
@return the message, or nil
*/

static int e_read_inbound(lua_State *L) {
  lemb_t *o = luaL_checkudata(L, 1, EMBEDDED);
  return dequeue(L, o, "inbound", &o->in_head, o->in_tail);
}

/***
The next message that reached the head (bytes as one string).
@function embedded:read_outbound
@return the message, or nil
*/

static int e_read_outbound(lua_State *L) {
  lemb_t *o = luaL_checkudata(L, 1, EMBEDDED);
  return dequeue(L, o, "outbound", &o->out_head, o->out_tail);
}

/* ch:read_all_inbound() / read_all_outbound(): every queued message, as
 * an array, emptying the queue. */
static int read_all(lua_State *L, int (*one)(lua_State *)) {
  luaL_checkudata(L, 1, EMBEDDED);
  lua_newtable(L);
  for (lua_Integer i = 1;; i++) {
    lua_pushcfunction(L, one);
    lua_pushvalue(L, 1);
    lua_call(L, 1, 1);
    if (lua_isnil(L, -1))
      break;
    lua_rawseti(L, -2, i);
  }
  lua_pop(L, 1);
  return 1;
}
/***
Every message queued at the tail, emptying the queue.
@function embedded:read_all_inbound
@treturn table an array
*/

static int e_read_all_inbound(lua_State *L) {
  return read_all(L, e_read_inbound);
}
/***
Every message queued at the head, emptying the queue.
@function embedded:read_all_outbound
@treturn table an array
*/

static int e_read_all_outbound(lua_State *L) {
  return read_all(L, e_read_outbound);
}

/***
Raise the first error that reached the tail and was not raised yet.
@function embedded:check_exception
*/

static int e_check_exception(lua_State *L) {
  check_exception(L, luaL_checkudata(L, 1, EMBEDDED));
  return 0;
}

/***
Close the channel (decoders report incomplete frames) and raise a pending
error.
@function embedded:finish
@treturn bool whether messages are left to read
*/

/* ch:finish() --> true if messages are left to read. Closes the channel
 * (channel_inactive: decoders report incomplete frames). */
static int e_finish(lua_State *L) {
  lemb_t *o = check_emb(L);
  nr_embedded_close(o->e);
  check_exception(L, o);
  lua_pushboolean(L, o->in_head < o->in_tail || o->out_head < o->out_tail);
  return 1;
}

/***
Close without raising; the queues stay readable.
@function embedded:close
*/

/* ch:close(): close without raising; the queues stay readable. */
static int e_close(lua_State *L) {
  lemb_t *o = luaL_checkudata(L, 1, EMBEDDED);
  if (o->e)
    nr_embedded_close(o->e);
  return 0;
}

/***
The embedded channel as a channel handle.
@function embedded:channel
@treturn channel
*/

static int e_channel(lua_State *L) {
  lemb_t *o = check_emb(L);
  lnr_push_handle(L, LNR_CHANNEL, nr_embedded_channel(o->e));
  return 1;
}

/***
Its pipeline.
@function embedded:pipeline
@treturn pipeline
*/

static int e_pipeline(lua_State *L) {
  e_channel(L);
  lua_getfield(L, -1, "pipeline");          /* ch:pipeline() */
  lua_insert(L, -2);
  lua_call(L, 1, 1);
  return 1;
}

static int e_gc(lua_State *L) {
  lemb_t *o = luaL_checkudata(L, 1, EMBEDDED);
  if (o->e) {
    nr_embedded_free(o->e);                   /* closes: sinks may still run */
    o->e = NULL;
    luaL_unref(L, LUA_REGISTRYINDEX, o->qref);
    luaL_unref(L, LUA_REGISTRYINDEX, o->err_ref);
    o->qref = o->err_ref = LUA_NOREF;
  }
  return 0;
}

static int e_tostring(lua_State *L) {
  lemb_t *o = luaL_checkudata(L, 1, EMBEDDED);
  if (o->e)
    lua_pushfstring(L, "netrun.embedded(channel %d)",
                    (int)nr_channel_id(nr_embedded_channel(o->e)));
  else
    lua_pushliteral(L, "netrun.embedded(closed)");
  return 1;
}

/*** @section end */

/***
An embedded channel on the caller's loop with the handlers added as
"handler1", "handler2", ...
@function embedded
@param ... handlers, codecs
@treturn embedded
@usage local ch = netrun.embedded(netrun.codec.line {})
ch:write_inbound("a\nb\n")
assert(ch:read_inbound() == "a")
*/

/* netrun.embedded(h1, h2, ...): an active embedded channel on the caller's
 * loop with the handlers added as "handler1", "handler2", ... */
static int l_embedded(lua_State *L) {
  int n = lua_gettop(L);
  lnr_state_t *S = lnr_state(L);
  if (S == NULL || S->loop == NULL)
    return luaL_error(L, "netrun.embedded: no loop on this thread");
  lemb_t *o = lua_newuserdatauv(L, sizeof *o, 0);
  memset(o, 0, sizeof *o);
  o->qref = o->err_ref = LUA_NOREF;
  luaL_setmetatable(L, EMBEDDED);
  int self = lua_gettop(L);
  lua_createtable(L, 0, 2);
  lua_newtable(L);
  lua_setfield(L, -2, "inbound");
  lua_newtable(L);
  lua_setfield(L, -2, "outbound");
  o->qref = luaL_ref(L, LUA_REGISTRYINDEX);
  o->S = S;
  nr_embedded_sink_t sink = {sink_inbound, sink_outbound, sink_exception, o};
  o->e = nr_embedded_new(S->loop, &sink);
  if (o->e == NULL)
    return luaL_error(L, "netrun.embedded: out of memory");
  lua_pushcfunction(L, e_pipeline);
  lua_pushvalue(L, self);
  lua_call(L, 1, 1);                        /* the pipeline */
  for (int i = 1; i <= n; i++) {
    lua_getfield(L, -1, "add_last");
    lua_pushvalue(L, -2);
    lua_pushfstring(L, "handler%d", i);
    lua_pushvalue(L, i);
    lua_call(L, 3, 0);
  }
  lua_pop(L, 1);
  nr_embedded_start(o->e);
  check_exception(L, o);
  return 1;
}

void lnr_native_class(lua_State *L, const char *name, lnr_native_fn make,
                      lua_CFunction tostring) {
  if (luaL_newmetatable(L, name)) {
    lua_pushlightuserdata(L, (void *)(uintptr_t)make);
    lua_setfield(L, -2, "__netrun_native");
    lua_pushcfunction(L, tostring);
    lua_setfield(L, -2, "__tostring");
  }
  lua_pop(L, 1);
}

static void open_codec(lua_State *L) {
  pthread_once(&slices_once, register_slices);
  lnr_native_class(L, CODEC, make_handler, codec_tostring);
  static const luaL_Reg codecs[] = {
      {"line", l_line}, {"delimiter", l_delimiter},
      {"length_field", l_length_field},
      {"length_prepender", l_length_prepender},
      {"fixed_length", l_fixed_length}, {"buffered", l_buffered},
      {NULL, NULL}};
  luaL_getsubtable(L, -1, "codec");
  luaL_setfuncs(L, codecs, 0);
  lua_pop(L, 1);
  static const luaL_Reg methods[] = {
      {"write_inbound", e_write_inbound}, {"write_outbound", e_write_outbound},
      {"read_inbound", e_read_inbound}, {"read_outbound", e_read_outbound},
      {"read_all_inbound", e_read_all_inbound},
      {"read_all_outbound", e_read_all_outbound},
      {"check_exception", e_check_exception}, {"finish", e_finish},
      {"channel", e_channel}, {"pipeline", e_pipeline}, {"close", e_close},
      {NULL, NULL}};
  static const luaL_Reg meta[] = {{"__gc", e_gc}, {"__close", e_close},
                                  {"__tostring", e_tostring}, {NULL, NULL}};
  lnr_new_class(L, EMBEDDED, methods, meta);
  lua_pushcfunction(L, l_embedded);
  lua_setfield(L, -2, "embedded");
}

lnr_module_t lnr_codec_module = {.name = "codec", .open = open_codec};
