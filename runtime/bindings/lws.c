/*
 * lws.c -- WebSocket (runtime/codec/ws.c) as Lua sees it. Loop thread
 * only. The upgrade and the client's connect are Lua (netrun/websocket.lua);
 * this file gives them:
 *
 *   core.codec.websocket { max_message = 1 << 20, max_frame = max_message,
 *                          close_timeout = 5, frame_timeout = 60,
 *                          inflate_ratio = 64 (0: none) }
 *     -- a server's codec config
 *     (client = true, request = "GET ...", accept = "...",
 *      handshake_timeout = 10: a client's, made by websocket.connect)
 *   core.ws.accept(key)   --> the Sec-WebSocket-Accept of a key
 *   core.ws.key()         --> a fresh Sec-WebSocket-Key
 *   core.ws.switch(ch, config, response)
 *     -- write the 101 response from the HTTP codec's place and put the
 *     -- WebSocket codec there instead: bytes the client sent after its
 *     -- upgrade request (a first frame in the same packet) go to it.
 *     -- The 101 is flushed once the handler call that upgraded returns
 *     -- (a tail task: at the end of the loop's turn, with no turn of
 *     -- its own), not at once: until the client has it, it cannot send,
 *     -- nor count on anything, so what that call does after `upgrade`
 *     -- (adding the socket to a channel group) is done before the client
 *     -- can act -- else a broadcast the client expects, sent between the
 *     -- 101 and the add, would never reach it.
 *
 * Messages: the codec's text and binary messages reach Lua handlers as
 * { type = "text" | "binary", data = "..." }, the peer's close as the
 * user event { type = "close", code = 1000, reason = "" } (code 1005: the
 * close had no status; the codec's own protocol errors show their status
 * and reason the same way). Handlers write a string (a text frame) or
 * { type = "text" | "binary" | "ping" | "pong" | "close", data = "...",
 *   code = 1000, reason = "..." }  (code and reason: close only).
 */

/***
@module netrun
*/

/***
Codecs: `netrun.codec`.
@section codec
*/
#include <openssl/evp.h>
#include <openssl/rand.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>

#include "codec/codec.h"
#include "codec/ws.h"
#include "lnr.h"

#define CLASS "netrun.codec.websocket"
#define MAX_REQUEST 4096

/* A configuration: plain bytes, copied between states. */
typedef struct conf_s {
  bool client;
  bool deflate;              /* client: the request offers permessage-deflate */
  size_t max_message, max_frame;
  uint32_t inflate_ratio;    /* as nr_ws_opts_t's */
  uint64_t close_timeout, handshake_timeout, frame_timeout;
  char accept[32];
  size_t request_len;
  char request[MAX_REQUEST];
} conf_t;

static const char *const OPCODES[] = {"continuation", "text", "binary", NULL,
                                      NULL, NULL, NULL, NULL, "close",
                                      "ping", "pong"};

/* ---- messages -------------------------------------------------------------------- */

static void push_msg(lua_State *L, void *msg) {
  const nr_ws_msg_t *m = msg;
  lua_createtable(L, 0, m->opcode == NR_WS_CLOSE ? 3 : 2);
  lua_pushstring(L, OPCODES[m->opcode]);
  lua_setfield(L, -2, "type");
  lua_pushlstring(L, m->data, m->len);
  if (m->opcode == NR_WS_CLOSE) {
    lua_setfield(L, -2, "reason");
    lua_pushinteger(L, m->code);
    lua_setfield(L, -2, "code");
  } else {
    lua_setfield(L, -2, "data");
  }
}

static int opcode_of(const char *s) {
  for (int i = 1; i < (int)(sizeof OPCODES / sizeof *OPCODES); i++)
    if (OPCODES[i] != NULL && strcmp(OPCODES[i], s) == 0)
      return i;
  return -1;
}

/* A message table into m (borrowing its strings): 0 or -EINVAL with the
 * reason in err. */
static int to_msg(lua_State *L, int t, nr_ws_msg_t *m, char *err, size_t n) {
  *m = (nr_ws_msg_t){NR_MSG_WEBSOCKET, NR_WS_TEXT, NR_WS_NORMAL, "", 0};
  if (lua_getfield(L, t, "type") != LUA_TSTRING ||
      (m->opcode = opcode_of(lua_tostring(L, -1))) < 1) {
    snprintf(err, n, "websocket: a message's type must be \"text\", "
             "\"binary\", \"ping\", \"pong\" or \"close\", got %s",
             lua_type(L, -1) == LUA_TSTRING ? lua_tostring(L, -1)
                                            : luaL_typename(L, -1));
    return -EINVAL;
  }
  bool close = m->opcode == NR_WS_CLOSE;
  int ft = lua_getfield(L, t, close ? "reason" : "data");
  if (ft != LUA_TNIL && ft != LUA_TSTRING) {
    snprintf(err, n, "websocket: %s must be a string, got a %s",
             close ? "reason" : "data", luaL_typename(L, -1));
    return -EINVAL;
  }
  if (ft == LUA_TSTRING)
    m->data = lua_tolstring(L, -1, &m->len);
  if (close && lua_getfield(L, t, "code") != LUA_TNIL) {
    lua_Integer c = lua_tointeger(L, -1);
    if (!lua_isinteger(L, -1) || !nr_ws_valid_code((int)c) ||
        (c >= 1004 && c <= 1006) || c == 1015) {
      snprintf(err, n, "websocket: close code must be 1000-1003, 1007-1014 "
               "or 3000-4999, got %s", luaL_tolstring(L, -1, NULL));
      return -EINVAL;
    }
    m->code = (int)c;
  }
  return 0;
}

/* The codec's write behind a Lua front: message tables are converted,
 * everything else goes to the core as it is. */
static int lwrite(nr_ctx_t *ctx, void *msg, nr_promise_t *p) {
  if (nr_msg_type(msg) != NR_MSG_LUA)
    return nr_ws_write(ctx, msg, p);
  const lnr_lmsg_t *lm = msg;
  lua_State *L = lm->L;
  if (lua_type(L, lm->idx) != LUA_TTABLE)
    return nr_ws_write(ctx, msg, p);
  int top = lua_gettop(L);
  if (!lua_checkstack(L, 8))
    return nr_raise(-ENOMEM, "websocket: Lua stack overflow");
  nr_ws_msg_t m;
  char err[200];
  int rc = to_msg(L, lm->idx, &m, err, sizeof err);
  if (rc == 0) {
    rc = nr_ws_write(ctx, &m, p);
  } else {
    if (p != NULL)           /* without one, the pipeline reports the error */
      nr_ctx_fire_exception(ctx, &(nr_err_t){rc, err});
    rc = nr_raise(rc, "%s", err);
  }
  lua_settop(L, top);
  return rc;
}

static const nr_handler_t lua_ws_vt = {
    .type = "websocket", .added = nr_ws_handler_added,
    .removed = nr_decoder_removed, .active = nr_ws_active,
    .inactive = nr_ws_inactive, .channel_read = nr_decoder_channel_read,
    .user_event = nr_ws_user_event,
    .writability_changed = nr_decoder_writability,
    .write = lwrite, .close = nr_ws_close, .flags = NR_HANDLER_SYNC_WRITE};

/* ---- configuration ------------------------------------------------------------------ */

/* A handler state; a server's with the permessage-deflate agreed (bits 0:
 * none). */
static void *new_state(const conf_t *c, int deflate_bits) {
  nr_ws_opts_t o = {c->client, c->max_message, c->max_frame,
                    c->close_timeout, c->handshake_timeout, c->frame_timeout,
                    c->request, c->request_len, c->accept,
                    {deflate_bits, false}, c->deflate, c->inflate_ratio};
  return nr_ws_new(&o);
}

static const nr_handler_t *make(lua_State *L, int idx, void **state) {
  const conf_t *c = luaL_checkudata(L, idx, CLASS);
  if ((*state = new_state(c, 0)) == NULL)
    luaL_error(L, "netrun.codec.websocket: out of memory");
  return &lua_ws_vt;
}

/***
The WebSocket codec's configuration (RFC 6455). `netrun.websocket.upgrade`
and `netrun.websocket.connect` put it in place for you; handlers after it
read `{ type = "text" | "binary", data = "..." }`, get the peer's close as
the user event `{ type = "close", code, reason }`, and write a string (a
text frame) or `{ type = "text" | "binary" | "ping" | "pong" | "close",
data, code, reason }`.
@function codec.websocket
@tparam[opt] table opts
@int[opt=1048576] opts.max_message one message, fragments summed (past it: close 1009)
@int[opt] opts.max_frame one frame's payload (default: max_message)
@number[opt=5] opts.close_timeout seconds to wait for the peer's close (0: none)
@number[opt=60] opts.frame_timeout seconds from a frame's first byte to its last (0: none)
@int[opt=64] opts.inflate_ratio what permessage-deflate may inflate, times the compressed bytes (0: none)
@return a codec configuration
*/

static int l_websocket(lua_State *L) {
  static const char *const known[] = {"max_message", "max_frame",
      "close_timeout", "handshake_timeout", "frame_timeout", "client",
      "request", "accept", "deflate", "inflate_ratio",
      NULL};
  lnr_opts_t t;
  lnr_opts_open(&t, L, 1, "netrun.codec.websocket", known, false);
  conf_t *c = lua_newuserdatauv(L, sizeof *c, 0);
  memset(c, 0, sizeof *c);
  c->max_message = lnr_opt_size(&t, "max_message", NR_WS_MAX_MESSAGE, 1,
                                LNR_OPT_SIZE_MAX);
  c->max_frame = lnr_opt_size(&t, "max_frame", c->max_message, 1,
                              LNR_OPT_SIZE_MAX);
  c->close_timeout = lnr_opt_seconds(&t, "close_timeout", NR_SEC(5));
  c->handshake_timeout = lnr_opt_seconds(&t, "handshake_timeout", NR_SEC(10));
  c->frame_timeout = lnr_opt_seconds(&t, "frame_timeout", NR_SEC(60));
  /* inflate_ratio: a positive integer, or 0 for none (absent: the default) */
  lua_Integer r = lnr_opt_integer(&t, "inflate_ratio", -1, 0,
                                  NR_WS_NO_RATIO - 1);
  c->inflate_ratio = r < 0 ? 0 : r == 0 ? NR_WS_NO_RATIO : (uint32_t)r;
  c->client = lnr_opt_boolean(&t, "client", false);
  c->deflate = c->client && lnr_opt_boolean(&t, "deflate", false);
  if (c->client) {               /* made by lua/netrun/websocket.lua */
    size_t rl, al;
    const char *r = lnr_opt_string(&t, "request", "", &rl);
    const char *a = lnr_opt_string(&t, "accept", "", &al);
    if (rl > MAX_REQUEST || al >= sizeof c->accept)
      lnr_opts_error(&t, "handshake request over %d bytes", MAX_REQUEST);
    memcpy(c->request, r, rl);
    c->request_len = rl;
    memcpy(c->accept, a, al);
  }
  luaL_setmetatable(L, CLASS);
  return 1;
}

static int l_tostring(lua_State *L) {
  const conf_t *c = luaL_checkudata(L, 1, CLASS);
  lua_pushfstring(L, CLASS "{ max_message = %I, max_frame = %I, "
                  "close_timeout = %f%s }", (lua_Integer)c->max_message,
                  (lua_Integer)c->max_frame, (double)c->close_timeout / 1e9,
                  c->client ? ", client = true" : "");
  return 1;
}

/* ---- the handshake's pieces ------------------------------------------------------------ */

static void push_base64(lua_State *L, const unsigned char *d, int n) {
  char out[64];
  int len = EVP_EncodeBlock((unsigned char *)out, d, n);
  lua_pushlstring(L, out, (size_t)len);
}

/* base64(SHA-1(key .. the RFC's GUID)) */
static int l_accept(lua_State *L) {
  static const char guid[] = "258EAFA5-E914-47DA-95CA-C5AB0DC85B11";
  size_t n;
  const char *key = luaL_checklstring(L, 1, &n);
  unsigned char md[EVP_MAX_MD_SIZE];
  unsigned int mdlen = 0;
  EVP_MD_CTX *m = EVP_MD_CTX_new();
  if (m == NULL || !EVP_DigestInit_ex(m, EVP_sha1(), NULL) ||
      !EVP_DigestUpdate(m, key, n) ||
      !EVP_DigestUpdate(m, guid, sizeof guid - 1) ||
      !EVP_DigestFinal_ex(m, md, &mdlen)) {
    EVP_MD_CTX_free(m);
    return luaL_error(L, "netrun.websocket: SHA-1 failed");
  }
  EVP_MD_CTX_free(m);
  push_base64(L, md, (int)mdlen);
  return 1;
}

static int l_key(lua_State *L) {
  unsigned char k[16];
  if (RAND_bytes(k, sizeof k) != 1)
    return luaL_error(L, "netrun.websocket: no random bytes for a key");
  push_base64(L, k, sizeof k);
  return 1;
}

static int flush_task(void *arg) {
  nr_channel_t *ch = arg;
  nr_channel_flush(ch);             /* on its loop: at once */
  nr_channel_release(ch);
  return 0;
}

/* The HTTP codec of ch's pipeline (the first handler of its type). */
static nr_ctx_t *http_ctx(nr_pipeline_t *p) {
  for (nr_ctx_t *c = nr_pipeline_first(p); c != NULL; c = nr_ctx_next(c)) {
    const nr_handler_t *h = nr_ctx_handler(c);
    if (h != NULL && h->type != NULL && strcmp(h->type, "http_server") == 0)
      return c;
  }
  return NULL;
}

static int l_switch(lua_State *L) {
  nr_channel_t *ch = lnr_check_handle(L, 1, LNR_CHANNEL);
  const conf_t *c = luaL_checkudata(L, 2, CLASS);
  size_t n;
  const char *resp = luaL_checklstring(L, 3, &n);
  lua_Integer bits = luaL_optinteger(L, 4, 0);
  luaL_argcheck(L, bits == 0 || (bits >= 9 && bits <= 15), 4,
                "window bits 9 .. 15, or 0");
  if (!nr_loop_in_thread(nr_channel_loop(ch)))
    return luaL_error(L, "netrun.websocket.upgrade: only on the channel's "
                      "loop");
  nr_pipeline_t *p = nr_channel_pipeline(ch);
  nr_ctx_t *hc = http_ctx(p);
  if (hc == NULL)
    return luaL_error(L, "netrun.websocket.upgrade: no http_server codec in "
                      "the pipeline");
  void *state = new_state(c, (int)bits);
  if (state == NULL)
    return luaL_error(L, "netrun.websocket.upgrade: out of memory");
  char name[64];
  snprintf(name, sizeof name, "%s", nr_ctx_name(hc));
  nr_bytes_t b = NR_BYTES(resp, n);
  nr_ctx_write(hc, &b, NULL);       /* from its place: past it */
  int rc = nr_pipeline_replace(p, name, "websocket", &lua_ws_vt, state);
  if (rc < 0) {
    free(state);       /* never added: nothing else refers to it */
    nr_ctx_flush(hc);
    return luaL_error(L, "netrun.websocket.upgrade: cannot replace the "
                      "http codec: %s", nr_strerror(rc));
  }
  if (nr_loop_after_iteration(nr_channel_loop(ch), flush_task,
                              nr_channel_retain(ch)) < 0) {
    nr_channel_release(ch);         /* (a loop shutting down) */
    nr_channel_flush(ch);
  }
  return 0;
}

/* core.ws.deflate_accept(offers) --> the Sec-WebSocket-Extensions answer
 * and our window bits, or nil: none of the offers is acceptable. */
static int l_deflate_accept(lua_State *L) {
  size_t n;
  const char *offer = luaL_checklstring(L, 1, &n);
  char resp[160];
  nr_ws_pmd_t agreed;
  if (!nr_ws_pmd_accept(offer, n, resp, sizeof resp, &agreed))
    return 0;
  lua_pushstring(L, resp);
  lua_pushinteger(L, agreed.bits);
  return 2;
}

static void register_converter(void) {
  lnr_register_msg(NR_MSG_WEBSOCKET, push_msg);
}

static void open_websocket(lua_State *L) {
  static pthread_once_t once = PTHREAD_ONCE_INIT;
  pthread_once(&once, register_converter);
  lnr_native_class(L, CLASS, make, l_tostring);
  luaL_getsubtable(L, -1, "codec");
  lua_pushcfunction(L, l_websocket);
  lua_setfield(L, -2, "websocket");
  lua_pop(L, 1);
  static const luaL_Reg fns[] = {{"accept", l_accept}, {"key", l_key},
                                 {"switch", l_switch},
                                 {"deflate_accept", l_deflate_accept},
                                 {NULL, NULL}};
  lua_newtable(L);
  luaL_setfuncs(L, fns, 0);
  lua_pushliteral(L, NR_WS_PMD_OFFER);
  lua_setfield(L, -2, "deflate_offer");
  lua_setfield(L, -2, "ws");      /* not "websocket": core's fields are
                                     netrun's, and that is websocket.lua */
}

lnr_module_t lnr_websocket_module = {.name = "websocket", .open = open_websocket};
