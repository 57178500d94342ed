/*
 * lgroup.h -- what lgroup.c (groups, loops, their Lua classes),
 * lgroup_task.c (sending them work) and lrun.c (netrun.run, shutting
 * every group down) share: a group's proxy, the list of live groups, the
 * task methods. Private to the group module.
 */
#ifndef LGROUP_H
#define LGROUP_H

#include <pthread.h>

#include "lnr.h"

struct lnr_group_s {
  _Atomic int refs;
  nr_group_t *g;
  void *paths;
  bool listed;                /* in the live list (under live_lock) */
  bool daemon;                /* does not keep the process alive */
  bool executor;              /* task threads for blocking work */
  size_t max_pending;         /* tasks a loop may have queued */
  lnr_group_t *next;
};

/* The groups not yet terminated, newest first, under lnr_live_lock. */
extern pthread_mutex_t lnr_live_lock;
extern lnr_group_t *lnr_live;

/* netrun.run(), core.shutdown_all() and the module's teardown (lrun.c). */
int lnr_l_run(lua_State *L);
int lnr_l_shutdown_all(lua_State *L);
bool lnr_groups_teardown(lua_State *L);
/* Take g off the live list (it has terminated): the list's reference goes. */
void lnr_group_unlist(lnr_group_t *g);
/* The group's and loop's task methods (lgroup_task.c): execute, submit,
 * after_iteration, schedule, schedule_at_fixed_rate,
 * schedule_with_fixed_delay. */
int lnr_l_execute(lua_State *L);
int lnr_l_submit(lua_State *L);
int lnr_l_after_iteration(lua_State *L);
int lnr_l_schedule(lua_State *L);
int lnr_l_fixed_rate(lua_State *L);
int lnr_l_fixed_delay(lua_State *L);
/* nr_loop_state_t's names, as stats and logs show them. */
extern const char *const lnr_loop_state_names[];

#endif
