/*
 * lchgroup.c -- channel groups (netrun.channel_group, Netty's
 * ChannelGroup): a set of channels, each leaving it when it closes, that
 * writes to or closes them all with one future for the lot.
 *
 * Threads: a group is a handle, used from any thread; its list is under
 * its lock, and the channels' own operations hop to their loops.
 */
/***
@module netrun
*/
#include <pthread.h>
#include <stdlib.h>

#include "lnr.h"

typedef struct chgroup_s {
  _Atomic int refs;
  pthread_mutex_t lock;
  nr_channel_t **v;
  size_t n, cap;
} chgroup_t;

void lnr_chgroup_retain(void *p) { atomic_fetch_add(&((chgroup_t *)p)->refs, 1); }

void lnr_chgroup_release(void *p) {
  chgroup_t *g = p;
  if (atomic_fetch_sub(&g->refs, 1) != 1)
    return;
  for (size_t i = 0; i < g->n; i++)
    nr_channel_release(g->v[i]);
  free(g->v);
  pthread_mutex_destroy(&g->lock);
  free(g);
}

static bool cg_remove(chgroup_t *g, nr_channel_t *ch) {
  bool found = false;
  pthread_mutex_lock(&g->lock);
  for (size_t i = 0; i < g->n; i++)
    if (g->v[i] == ch) {
      g->v[i] = g->v[--g->n];
      found = true;
      break;
    }
  pthread_mutex_unlock(&g->lock);
  if (found)
    nr_channel_release(ch);
  return found;
}

typedef struct membership_s {
  chgroup_t *g;
  nr_channel_t *ch;
} membership_t;

static void left_on_close(nr_promise_t *p, void *arg) {
  (void)p;
  membership_t *m = arg;
  cg_remove(m->g, m->ch);
  lnr_chgroup_release(m->g);
  free(m);
}

/***
A new channel group (Netty's ChannelGroup): a thread-safe set of channels
that may be written to or closed together, from any thread. A closed
channel leaves by itself.
@function channel_group
@treturn channel_group
@usage local room = netrun.channel_group()
room:add(ctx.channel)
room:write_and_flush("hello all\n")
*/
static int l_channel_group(lua_State *L) {
  chgroup_t *g = calloc(1, sizeof *g);
  if (g == NULL)
    return luaL_error(L, "out of memory");
  atomic_init(&g->refs, 1);
  pthread_mutex_init(&g->lock, NULL);
  lnr_push_handle(L, LNR_CHGROUP, g);
  lnr_chgroup_release(g);
  return 1;
}

/***
A thread-safe set of channels, made by `channel_group`; `#members` is how
many it holds.
@type channel_group
*/
/***
Add a channel; a closed one leaves by itself.
@function channel_group:add
@tparam channel ch the channel
@treturn bool whether it was added (false if it was a member already)
*/
static int l_cg_add(lua_State *L) {
  chgroup_t *g = lnr_check_handle(L, 1, LNR_CHGROUP);
  nr_channel_t *ch = lnr_check_handle(L, 2, LNR_CHANNEL);
  pthread_mutex_lock(&g->lock);
  bool dup = false;
  for (size_t i = 0; i < g->n && !dup; i++)
    dup = g->v[i] == ch;
  if (!dup && g->n == g->cap) {
    size_t cap = g->cap ? g->cap * 2 : 16;
    nr_channel_t **v = realloc(g->v, cap * sizeof *v);
    if (v == NULL) {
      pthread_mutex_unlock(&g->lock);
      return luaL_error(L, "out of memory");
    }
    g->v = v;
    g->cap = cap;
  }
  if (!dup)
    g->v[g->n++] = nr_channel_retain(ch);
  pthread_mutex_unlock(&g->lock);
  if (!dup) {
    membership_t *m = malloc(sizeof *m);
    m->g = g;
    m->ch = ch;
    lnr_chgroup_retain(g);
    nr_promise_add_listener(nr_channel_close_future(ch), NULL, left_on_close, m);
  }
  lua_pushboolean(L, !dup);
  return 1;
}

/***
Remove a channel.
@function channel_group:remove
@tparam channel ch the channel
@treturn bool whether it was a member
*/
static int l_cg_remove(lua_State *L) {
  chgroup_t *g = lnr_check_handle(L, 1, LNR_CHGROUP);
  lua_pushboolean(L, cg_remove(g, lnr_check_handle(L, 2, LNR_CHANNEL)));
  return 1;
}

static int l_cg_len(lua_State *L) {
  chgroup_t *g = lnr_check_handle(L, 1, LNR_CHGROUP);
  pthread_mutex_lock(&g->lock);
  lua_pushinteger(L, (lua_Integer)g->n);
  pthread_mutex_unlock(&g->lock);
  return 1;
}

/* A future completed once every member's operation has. */
typedef struct gather_s {
  nr_promise_t *p;
  _Atomic int left, failed;
} gather_t;

static void gather_one(nr_promise_t *p, void *arg) {
  gather_t *g = arg;
  if (!nr_promise_is_success(p))
    atomic_fetch_add(&g->failed, 1);
  nr_promise_release(p);
  if (atomic_fetch_sub(&g->left, 1) != 1)
    return;
  int failed = atomic_load(&g->failed);
  if (failed)
    nr_promise_set_failure(g->p, NR_ECLOSED, "some channels of the group failed");
  else
    nr_promise_set_success(g->p, NULL, NULL);
  nr_promise_release(g->p);
  free(g);
}

static nr_channel_t **snapshot(chgroup_t *g, size_t *n) {
  pthread_mutex_lock(&g->lock);
  nr_channel_t **v = malloc((g->n + 1) * sizeof *v);
  *n = 0;
  for (size_t i = 0; v && i < g->n; i++)
    v[(*n)++] = nr_channel_retain(g->v[i]);
  pthread_mutex_unlock(&g->lock);
  return v;
}

static int l_cg_op(lua_State *L, bool close) {
  chgroup_t *g = lnr_check_handle(L, 1, LNR_CHGROUP);
  size_t len = 0;
  const char *data = NULL;
  if (!close && lua_type(L, 2) == LUA_TTABLE) {
    luaL_Buffer buf;                    /* an array of strings: gathered */
    luaL_buffinit(L, &buf);
    for (lua_Integer i = 1, n = (lua_Integer)lua_rawlen(L, 2); i <= n; i++) {
      if (lua_rawgeti(L, 2, i) != LUA_TSTRING)
        return luaL_error(L, "write_and_flush: element %d of the array is a "
                          "%s, not a string", (int)i, luaL_typename(L, -1));
      luaL_addvalue(&buf);
    }
    luaL_pushresult(&buf);
    lua_replace(L, 2);
  }
  if (!close)
    data = luaL_checklstring(L, 2, &len);
  size_t n;
  nr_channel_t **v = snapshot(g, &n);
  nr_promise_t *all = nr_promise_new();
  lnr_push_promise(L, nr_promise_retain(all));
  gather_t *gt = malloc(sizeof *gt);
  gt->p = all;
  atomic_init(&gt->left, (int)n + 1);
  atomic_init(&gt->failed, 0);
  for (size_t i = 0; i < n; i++) {
    nr_promise_t *p = nr_promise_new();
    nr_promise_add_listener(p, NULL, gather_one, gt);
    if (close)
      nr_channel_close(v[i], p);
    else
      nr_channel_write(v[i], data, len, true, p);
    nr_channel_release(v[i]);
  }
  free(v);
  nr_promise_t *self = nr_promise_new();   /* the +1: done dispatching */
  nr_promise_add_listener(self, NULL, gather_one, gt);
  nr_promise_set_success(self, NULL, NULL);
  return 1;
}

/***
Write and flush a message to every member (copied to each member's loop).
@function channel_group:write_and_flush
@param msg the message
@treturn future completed once every member's write has, failed if any failed
*/
/***
Close every member.
@function channel_group:close
@treturn future completed once every member has closed
*/
static int l_cg_write(lua_State *L) { return l_cg_op(L, false); }
static int l_cg_close(lua_State *L) { return l_cg_op(L, true); }

static int l_cg_tostring(lua_State *L) {
  l_cg_len(L);
  lua_pushfstring(L, "netrun.channel_group(%d channels)", (int)lua_tointeger(L, -1));
  return 1;
}

static void open_chgroup(lua_State *L) {
  static const luaL_Reg methods[] = {
      {"add", l_cg_add}, {"remove", l_cg_remove},
      {"write_and_flush", l_cg_write}, {"close", l_cg_close}, {NULL, NULL}};
  static const luaL_Reg meta[] = {{"__len", l_cg_len},
                                  {"__tostring", l_cg_tostring},
                                  {NULL, NULL}};
  lnr_new_class(L, lnr_kind_names[LNR_CHGROUP], methods, meta);
  lnr_handle_class(L, LNR_CHGROUP);
  lua_pushcfunction(L, l_channel_group);
  lua_setfield(L, -2, "channel_group");
}

lnr_module_t lnr_chgroup_module = {.name = "chgroup", .open = open_chgroup};
