/*
 * lmsg.c -- messages converted between Lua values and C pipeline
 * messages: lnr_push_msg makes the Lua value of a message (a string for
 * bytes, a table for a datagram, the value itself for NR_MSG_LUA, a
 * registered converter's value for the codecs' types), lnr_to_msg the
 * message of a Lua value (bytes, slices, a datagram, a native message, or
 * the value as NR_MSG_LUA) in a struct its caller owns.
 *
 * Invariants: a message made by lnr_to_msg lives until lnr_msg_done (it
 * points into Lua strings the stack anchors); every message type a
 * binding hands to Lua has its converter registered before any loop runs,
 * and registering one more than the table holds aborts at start-up rather
 * than dropping it.
 *
 * Threads: any loop thread, on the state it runs; the converter table is
 * written before the loops start and only read after.
 */
#include <arpa/inet.h>
#include <assert.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "lnr.h"

static void push_addr(lua_State *L, const struct sockaddr_storage *ss,
                      socklen_t len, const char *hf, const char *pf) {
  char host[128];
  int port = 0;
  if (nr_format_addr(ss, len, host, sizeof host, &port) == 0) {
    lua_pushstring(L, host);
    lua_setfield(L, -2, hf);
    lua_pushinteger(L, port);
    lua_setfield(L, -2, pf);
  }
}

/* The converters of the message types lnr_push_msg does not know itself,
 * one table for every type, the core's and the codecs' alike: open
 * addressing from type % NCONV, so a core type or one of netrun's own
 * handlers' (netrun.h: below NR_MSG_NATIVE + 16 == NCONV) is found at its
 * own index by one compare. A type must be registered (nr_msg_register)
 * before it has a converter. Filled once per type before any loop runs
 * (the bindings register from pthread_once), read by every loop thread. */
#define NCONV 32
static struct {
  int type;                   /* 0: free */
  lnr_msg_push_fn push;
} converters[NCONV];

void lnr_register_msg(int type, lnr_msg_push_fn push) {
  if (nr_msg_name(type) == NULL) {     /* its handler declares it first */
    fprintf(stderr, "netrun: message type %d: a converter for a type no "
            "handler registered (nr_msg_declare)\n", type);
    abort();
  }
  for (int i = 0; i < NCONV; i++) {
    int k = (int)(((unsigned)type + (unsigned)i) % NCONV);
    if (converters[k].type == 0 || converters[k].type == type) {
      if (converters[k].type == type && converters[k].push != push) {
        fprintf(stderr, "netrun: message type %d: two converters\n", type);
        abort();
      }
      converters[k].push = push;
      converters[k].type = type;
      return;
    }
  }
  /* A binding's mistake netrun cannot run with: its messages would reach
   * Lua as "(message of type N)". */
  fprintf(stderr, "netrun: message type %d: no room for its converter "
          "(%d types registered): raise NCONV in lmsg.c\n", type, NCONV);
  abort();
}

/* The converter of type, or NULL. */
static inline lnr_msg_push_fn converter(int type) {
  for (int i = 0; i < NCONV; i++) {
    int k = (int)(((unsigned)type + (unsigned)i) % NCONV);
    if (converters[k].type == type)
      return converters[k].push;
    if (converters[k].type == 0)
      return NULL;
  }
  return NULL;
}

/* Out of line: its address buffer would make every message pay for a
 * stack frame. */
static __attribute__((noinline)) void push_datagram(lua_State *L,
                                                    const nr_datagram_t *d) {
  lua_createtable(L, 0, 3);
  lua_pushlstring(L, d->data, d->len);
  lua_setfield(L, -2, "data");
  push_addr(L, &d->addr, d->addrlen, "host", "port");
}

/* A Lua value's index is one in the stack of the thread that wrote it
 * (m->L), which need not be L: a write from a coroutine -- netrun.spawn,
 * coroutine.wrap -- reaches handlers that run on the state's main thread,
 * and a read that waits in a batch is pushed on the batch's thread. All of
 * them are threads of the state running this loop, so the value is copied
 * across (lua_xmove). */
static void push_lua_value(lua_State *L, const lnr_lmsg_t *m) {
  if (m->L == L) {
    lua_pushvalue(L, m->idx);
    return;
  }
  assert(lnr_state(m->L) == lnr_state(L));     /* never across states */
  if (!lua_checkstack(m->L, 1)) {              /* a writer at LUAI_MAXSTACK */
    nr_log(NR_LOG_ERROR, "a Lua message could not be copied: stack overflow");
    lua_pushnil(L);
    return;
  }
  lua_pushvalue(m->L, m->idx);
  lua_xmove(m->L, L, 1);
}

void lnr_push_msg(lua_State *L, void *msg) {
  int type = nr_msg_type(msg);
  switch (type) {
  case NR_MSG_BYTES: {
    nr_bytes_t *b = msg;
    lua_pushlstring(L, b->data, b->len);
    return;
  }
  case NR_MSG_DATAGRAM:
    push_datagram(L, msg);
    return;
  case NR_MSG_LUA:
    push_lua_value(L, msg);
    return;
  case NR_MSG_EVENT:
    lua_pushstring(L, ((nr_event_t *)msg)->name);
    return;
  default: {
    lnr_msg_push_fn push = converter(type);
    const char *name;
    if (push != NULL)
      push(L, msg);
    else if ((name = nr_msg_name(type)) != NULL)
      lua_pushfstring(L, "(%s message)", name);
    else
      lua_pushfstring(L, "(message of type %d)", type);
  }
  }
}

static int resolve(lua_State *L, const char *host, int port,
                   struct sockaddr_storage *ss, socklen_t *len) {
  memset(ss, 0, sizeof *ss);
  struct sockaddr_in *in = (struct sockaddr_in *)ss;
  struct sockaddr_in6 *in6 = (struct sockaddr_in6 *)ss;
  if (inet_pton(AF_INET, host, &in->sin_addr) == 1) {
    in->sin_family = AF_INET;
    in->sin_port = htons((uint16_t)port);
    *len = sizeof *in;
  } else if (inet_pton(AF_INET6, host, &in6->sin6_addr) == 1) {
    in6->sin6_family = AF_INET6;
    in6->sin6_port = htons((uint16_t)port);
    *len = sizeof *in6;
  } else {
    return luaL_error(L, "datagram host '%s' must be a numeric address", host);
  }
  return 0;
}

const char lnr_native_tag = 0;

/* Where the Lua value of m was written: the innermost Lua function on the
 * stack of the thread that wrote it (m->L; a coroutine's own), whose
 * current line is the ctx:write, ch:write or p:write call, or the line
 * of a handler's return that became the write. The describer runs while
 * that write has not returned (netrun.h), so the stack is the writer's.
 * A value written from another thread was copied and is written by a task
 * of netrun's own, in C: no Lua function, no where. Only on this error
 * path: writes that succeed never look at the stack. */
static void written_at(lua_State *L, char *where, size_t size) {
  lua_Debug ar;
  for (int level = 0; level < 8 && lua_getstack(L, level, &ar); level++) {
    if (lua_getinfo(L, "Sl", &ar) && ar.currentline > 0) {
      snprintf(where, size, "%s:%d", ar.short_src, ar.currentline);
      return;
    }
  }
}

/* What a Lua value no handler encoded is, for the head's error text (see
 * nr_set_msg_describer): its type, and a number's or a boolean's value;
 * and the Lua line that wrote it in where. A native message (a codec's)
 * is named by its type; where it was written is not known here. */
void lnr_describe_msg(const void *msg, char *buf, size_t size, char *where,
                      size_t wsize) {
  const lnr_lmsg_t *m = msg;
  if (nr_msg_type(msg) != NR_MSG_LUA) {
    nr_msg_describe(nr_msg_type(msg), buf, size);
    return;
  }
  lua_State *L = m->L;
  written_at(L, where, wsize);
  switch (lua_type(L, m->idx)) {
  case LUA_TNUMBER:
    if (lua_isinteger(L, m->idx))
      snprintf(buf, size, "a number (%lld)", (long long)lua_tointeger(L, m->idx));
    else
      snprintf(buf, size, "a number (%g)", (double)lua_tonumber(L, m->idx));
    break;
  case LUA_TBOOLEAN:
    snprintf(buf, size, "a boolean (%s)", lua_toboolean(L, m->idx) ? "true" : "false");
    break;
  case LUA_TTABLE:
    snprintf(buf, size, "a table that is not an array of strings");
    break;
  case LUA_TNIL:
    snprintf(buf, size, "nil");
    break;
  default:
    snprintf(buf, size, "a %s", luaL_typename(L, m->idx));
  }
}

/* A datagram's field, checked: the mistake names the shape expected. */
static void datagram_field(lua_State *L, int idx, const char *field, int type) {
  if (lua_getfield(L, idx, field) != type)
    luaL_error(L, "write: a datagram is { data = string, host = string, "
               "port = integer }: %s is a %s", field, luaL_typename(L, -1));
}

/* {data, host, port}: a datagram; its fields stay on the stack (anchoring
 * data) until lnr_msg_done. */
static void *to_datagram(lua_State *L, int idx, lnr_msgbuf_t *m) {
  nr_datagram_t *d = &m->u.datagram;
  *d = (nr_datagram_t){.type = NR_MSG_DATAGRAM};
  datagram_field(L, idx, "data", LUA_TSTRING);
  datagram_field(L, idx, "host", LUA_TSTRING);
  datagram_field(L, idx, "port", LUA_TNUMBER);
  m->pushed = 3;
  d->data = lua_tolstring(L, -3, &d->len);
  const char *host = lua_tostring(L, -2);
  if (!lua_isinteger(L, -1) || lua_tointeger(L, -1) < 0 ||
      lua_tointeger(L, -1) > 65535)
    luaL_error(L, "write: a datagram's port must be an integer from "
               "0 to 65535");
  resolve(L, host, (int)lua_tointeger(L, -1), &d->addr, &d->addrlen);
  return d;
}

/* An array of strings: slices of them, gathered into one write. */
static void *to_slices(lua_State *L, int idx, lnr_msgbuf_t *m) {
  size_t n = lua_rawlen(L, idx);
  nr_slice_t *v = n <= LNR_MSG_SMALL ? m->small : malloc(n * sizeof *v);
  if (v == NULL)
    luaL_error(L, "out of memory");
  for (size_t i = 0; i < n; i++) {
    lua_rawgeti(L, idx, (lua_Integer)i + 1);   /* anchored by the table */
    if (lua_type(L, -1) != LUA_TSTRING) {
      if (v != m->small)
        free(v);
      luaL_error(L, "write: element %d of the array is a %s, not a "
                 "string", (int)i + 1, luaL_typename(L, -1));
    }
    v[i].data = lua_tolstring(L, -1, &v[i].len);
    lua_pop(L, 1);
  }
  m->heap = v != m->small ? v : NULL;
  m->u.slices = (nr_slices_t){NR_MSG_SLICES, v, n};
  return &m->u.slices;
}

void *lnr_to_msg(lua_State *L, int idx, nr_channel_t *ch, lnr_msgbuf_t *m) {
  idx = lua_absindex(L, idx);
  m->heap = NULL;
  m->L = L;
  m->pushed = 0;
  int t = lua_type(L, idx);
  if (t == LUA_TSTRING) {
    size_t n;
    const char *s = lua_tolstring(L, idx, &n);
    m->u.bytes = NR_BYTES(s, n);
    return &m->u.bytes;
  }
  void *native;
  if (t == LUA_TUSERDATA && (native = lnr_to_native(L, idx)) != NULL)
    return native;
  if (t == LUA_TTABLE && ch && nr_channel_is_datagram(ch))
    return to_datagram(L, idx, m);
  /* An array of strings? A table without [1] (its length is 0: a
   * response table, say) is not, and needs no probe. */
  if (t == LUA_TTABLE && lua_rawlen(L, idx) > 0) {
    if (lua_rawgeti(L, idx, 1) == LUA_TSTRING) {
      lua_pop(L, 1);
      return to_slices(L, idx, m);
    }
    lua_pop(L, 1);                       /* the rawgeti probe */
  }
  m->u.lua = (lnr_lmsg_t){NR_MSG_LUA, L, idx};   /* as it is */
  return &m->u.lua;
}

void lnr_msg_done(lnr_msgbuf_t *m) {
  free(m->heap);
  if (m->pushed > 0)
    lua_pop(m->L, m->pushed);
}
