/*
 * llimit.c -- the C half of netrun.limit (lua/netrun/limit.lua):
 * core.loop_lag(), the lag of the loop the calling state runs on, read
 * per request by netrun.limit.shed without building loop:stats()'s table.
 * (limit.req's leaky bucket is core.dict_leak, in ldict.c: it works on a
 * dict's entries under the dict's lock.)
 *
 * Threads: the calling state's loop; the lag is an atomic it stores once
 * per iteration (loop.c).
 */
#include "lnr.h"

/* core.loop_lag(): seconds; 0 on a state with no loop of its own. */
static int l_loop_lag(lua_State *L) {
  nr_loop_t *loop = nr_loop_current();
  lua_pushnumber(L, loop ? (double)nr_loop_lag(loop) / 1e9 : 0);
  return 1;
}

static void open_limit(lua_State *L) {
  lua_pushcfunction(L, l_loop_lag);
  lua_setfield(L, -2, "loop_lag");
}

lnr_module_t lnr_limit_module = {.name = "limit", .open = open_limit};
