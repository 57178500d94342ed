/*
 * lrun.c -- how long a process lives, and its end: netrun.run() (the main
 * thread runs its own loop while anything keeps the process alive, as
 * Node does), the teardown that shuts every group down and names a loop
 * that does not terminate, and core.shutdown_all / the signal thread's
 * shutdown (event-loop groups first, executors after them).
 *
 * Threads: netrun.run and the teardown run on the main thread;
 * lnr_shutdown_groups_async on any (the signal thread). The live list is
 * read under lnr_live_lock.
 */
/***
@module netrun
*/
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>

#include "lgroup.h"
#include "lmain.h"

/* ---- netrun.run: how long a process lives ------------------------------------ */

/* The first group of the live list, retained; NULL if none. */
static lnr_group_t *live_first(void) {
  pthread_mutex_lock(&lnr_live_lock);
  lnr_group_t *g = lnr_live;
  if (g)
    lnr_group_retain(g);
  pthread_mutex_unlock(&lnr_live_lock);
  return g;
}

/* Set once a shutdown of every group was asked (SIGTERM, SIGINT, a
 * terminal's hangup, core.shutdown_all): from then on the main thread's
 * own timers (a coroutine of the main chunk in netrun.sleep) keep no
 * process alive. Any thread sets it, then wakes the main thread. */
static atomic_bool stop_asked;

static int wake_task(void *arg) {
  (void)arg;
  return 0;
}

static void ask_stop(void) {
  atomic_store(&stop_asked, true);
  nr_loop_t *m = lnr_main_loop();          /* NULL before the state is open */
  if (m != NULL)
    nr_loop_execute(m, wake_task, NULL);   /* it looks again */
}

/* One look at everything that may keep the process alive: the main
 * thread's own queue and timers, and every loop of the groups that are
 * not daemons (nr_loop_is_alive). *sum adds their marks, which only grow:
 * two looks with the same sum saw nothing run in between. */
static bool alive_once(nr_loop_t *m, uint64_t *sum) {
  uint64_t mark;
  bool alive = nr_loop_is_alive(m, &mark);
  *sum = mark;
  pthread_mutex_lock(&lnr_live_lock);
  for (lnr_group_t *g = lnr_live; g; g = g->next) {
    if (g->daemon)
      continue;
    for (int i = 0; i < nr_group_size(g->g); i++) {
      alive |= nr_loop_is_alive(nr_group_loop(g->g, i), &mark);
      *sum += mark;
    }
  }
  pthread_mutex_unlock(&lnr_live_lock);
  return alive;
}

/* Whether anything keeps the process alive: a task queued or running, a
 * timer of the program (schedule*, netrun.sleep), a channel open (a
 * server, a connection, a stream; not an idle pooled HTTP connection), or
 * work a loop is owed. Looked at twice, so that a task passing from one
 * loop to another between two loops' looks is not missed. */
static bool process_alive(nr_loop_t *m) {
  uint64_t a, b;
  if (alive_once(m, &a) || alive_once(m, &b))
    return true;
  return a != b;
}

/* The first group of the live list that keeps the process alive (not a
 * daemon), retained; NULL if none. */
static lnr_group_t *first_kept(void) {
  pthread_mutex_lock(&lnr_live_lock);
  lnr_group_t *g = lnr_live;
  while (g && g->daemon)
    g = g->next;
  if (g)
    lnr_group_retain(g);
  pthread_mutex_unlock(&lnr_live_lock);
  return g;
}

static void shutdown_listed(bool daemons, uint64_t timeout) {
  pthread_mutex_lock(&lnr_live_lock);
  for (lnr_group_t *g = lnr_live; g; g = g->next)
    if (daemons || !g->daemon)
      nr_group_shutdown_gracefully(g->g, 0, timeout);
  pthread_mutex_unlock(&lnr_live_lock);
}

/* netrun.run(): run the main thread's work while anything of the process
 * is alive (process_alive, as Node lives while its event loop has ref'd
 * handles); then shut its groups down (gracefully: nothing is left to
 * wait for), and the daemons, and wait until they have terminated. A
 * shutdown asked meanwhile (SIGTERM, shutdown_gracefully) ends it too,
 * once the groups have terminated. Loops that block with nothing alive
 * wake the main thread (nr_loop_watch_idle), so it looks again. */
/***
Run the main thread's work (listeners it added, results sent to it) while
anything keeps the process alive -- a task, a timer, an open channel --
then shut the groups down and wait until they terminated. What the
`netrun` executable does after the script; a script run by `lua5.4`
calls it at its end.
@function run
*/
int lnr_l_run(lua_State *L) {
  nr_loop_t *m = lnr_main_loop();
  if (nr_loop_current() != m)
    return luaL_error(L, "netrun.run: only the main thread can wait for groups");
  nr_loop_watch_idle(m);
  for (;;) {
    while (nr_loop_run_once(m, 0) > 0)
      ;                             /* the main thread's own work first */
    lnr_group_t *g = first_kept();
    if (g == NULL) {
      /* No group to wait for, but the main thread's own timers (a
       * coroutine the main chunk spawned, in netrun.sleep) keep it,
       * until a shutdown is asked. */
      if (atomic_load(&stop_asked) || !nr_loop_is_alive(m, NULL))
        break;
      nr_loop_run_once(m, UINT64_MAX);
      continue;
    }
    bool done = nr_group_is_terminated(g->g);
    if (done)
      lnr_group_unlist(g);                    /* do not wait for the queued task */
    lnr_group_release(g);
    if (done)
      continue;
    if (!process_alive(m))
      shutdown_listed(false, NR_SEC(2));
    nr_loop_run_once(m, UINT64_MAX);  /* until a task: a loop went idle,
                                         a group terminated, work for us */
    if (nr_sim_current() != NULL && nr_sim_is_stuck(nr_sim_current())) {
      shutdown_listed(false, NR_SEC(2));   /* a simulated world where */
      break;                               /* nothing can happen any more */
    }
  }
  nr_loop_watch_idle(NULL);
  shutdown_listed(true, NR_SEC(2));   /* the daemons, now */
  for (lnr_group_t *g; (g = live_first()) != NULL; ) {
    nr_promise_wait(nr_group_termination_future(g->g), UINT64_MAX);
    lnr_group_unlist(g);
    lnr_group_release(g);
  }
  while (nr_loop_run_once(m, 0) > 0)
    ;
  nr_log_flush();                 /* the groups' last lines, before what follows */
  return 0;
}

int lnr_log_unterminated(const char *why) {
  int n = 0;
  pthread_mutex_lock(&lnr_live_lock);
  for (lnr_group_t *g = lnr_live; g; g = g->next)
    for (int i = 0; i < nr_group_size(g->g); i++) {
      nr_loop_t *l = nr_group_loop(g->g, i);
      nr_loop_stats_t st;
      nr_loop_stats(l, &st);
      if (st.state == NR_TERMINATED || st.state == NR_NOT_STARTED)
        continue;
      nr_log(NR_LOG_ERROR, "%s: loop %s has not terminated (%s, busy for "
             "%.1f s)", why, st.name, lnr_loop_state_names[st.state],
             (double)st.busy_ns / 1e9);
      n++;
    }
  pthread_mutex_unlock(&lnr_live_lock);
  return n;
}

/* Shut everything down (the main state is closing, or the process ends).
 * A loop that does not terminate within the timeout plus a margin (stuck
 * in a task that never returns) is named and left behind, with its group:
 * returns false then, and the caller must not free what it may use. */
#define SHUTDOWN_ALL_TIMEOUT NR_SEC(5)
#define SHUTDOWN_MARGIN NR_SEC(1)

bool lnr_groups_teardown(lua_State *L) {
  (void)L;
  nr_loop_t *m = lnr_main_loop();
  lnr_state_t *S = m ? nr_loop_data(m) : NULL;
  if (S)
    S->closing = true;
  pthread_mutex_lock(&lnr_live_lock);
  for (lnr_group_t *g = lnr_live; g; g = g->next)
    nr_group_shutdown_gracefully(g->g, 0, SHUTDOWN_ALL_TIMEOUT);
  pthread_mutex_unlock(&lnr_live_lock);
  uint64_t deadline = nr_now() + SHUTDOWN_ALL_TIMEOUT + SHUTDOWN_MARGIN;
  for (;;) {
    pthread_mutex_lock(&lnr_live_lock);
    lnr_group_t *g = lnr_live;
    if (g)
      lnr_group_retain(g);
    pthread_mutex_unlock(&lnr_live_lock);
    if (g == NULL)
      break;
    uint64_t now = nr_now();
    if (nr_promise_wait(nr_group_termination_future(g->g),
                        deadline > now ? deadline - now : 0) != 0) {
      lnr_group_release(g);
      lnr_log_unterminated("shutdown timed out");
      return false;
    }
    lnr_group_unlist(g);
    lnr_group_release(g);
  }
  if (m)
    while (nr_loop_run_once(m, 0) > 0)
      ;
  return true;
}


/* From any thread (the signal thread): ask every group to shut down with
 * a short quiet period and the given timeout (ns). Every group stops at once,
 * so the quiet period only has to cover tasks already on their way between
 * loops; the answers a channel still owes hold it open by themselves
 * (nr_channel_hold), so an idle server stops at once. */
#define SIGNAL_QUIET NR_MS(200)

/* Executor groups stop after the event-loop groups (as a Netty program
 * shuts down its boss, then its workers, then the business executors):
 * a loop whose channels wait for an answer computed on an executor
 * (nr_loop_hold) may still send it work while it drains. */
typedef struct after_loops_s {
  _Atomic int left;                /* event-loop groups not terminated */
  uint64_t deadline;
} after_loops_t;

/* With the loops gone, an executor gets work only from another one: when
 * none has anything to do (nr_loop_is_alive), none will, and they stop
 * at once (no quiet period: an idle server exits in one). */
static void shutdown_executors(uint64_t deadline) {
  uint64_t now = nr_now();
  uint64_t timeout = deadline > now ? deadline - now : 0;
  pthread_mutex_lock(&lnr_live_lock);
  bool busy = false;
  for (lnr_group_t *g = lnr_live; g && !busy; g = g->next)
    for (int i = 0; g->executor && i < nr_group_size(g->g) && !busy; i++)
      busy = nr_loop_is_alive(nr_group_loop(g->g, i), NULL);
  for (lnr_group_t *g = lnr_live; g; g = g->next)
    if (g->executor)
      nr_group_shutdown_gracefully(g->g, busy ? SIGNAL_QUIET : 0, timeout);
  pthread_mutex_unlock(&lnr_live_lock);
}

static void loop_group_terminated(nr_promise_t *p, void *arg) {
  (void)p;
  after_loops_t *a = arg;
  if (atomic_fetch_sub(&a->left, 1) == 1) {
    shutdown_executors(a->deadline);
    free(a);
  }
}

void lnr_shutdown_groups_async(uint64_t timeout) {
  after_loops_t *a = malloc(sizeof *a);
  if (a != NULL) {
    atomic_init(&a->left, 1);             /* ours, dropped below */
    a->deadline = nr_now() + timeout;
  }
  pthread_mutex_lock(&lnr_live_lock);
  for (lnr_group_t *g = lnr_live; g; g = g->next) {
    if (g->executor && a != NULL)
      continue;
    nr_promise_t *t = nr_group_shutdown_gracefully(g->g, SIGNAL_QUIET, timeout);
    if (a != NULL) {
      atomic_fetch_add(&a->left, 1);
      nr_promise_add_listener(t, NULL, loop_group_terminated, a);
    }
  }
  pthread_mutex_unlock(&lnr_live_lock);
  nr_resolver_cancel_all();          /* nobody waits for a lookup to end */
  ask_stop();
  if (a != NULL)
    loop_group_terminated(NULL, a);       /* none, or all done already */
}

/* core.shutdown_all([quiet [, timeout]]): start shutting every group down
 * (what SIGTERM does; the REPL's :quit too). */
static double secs(lua_State *L, int idx) {
  return lnr_checkseconds(L, idx, "shutdown_gracefully");
}

int lnr_l_shutdown_all(lua_State *L) {
  double quiet = luaL_opt(L, secs, 1, 2.0), timeout = luaL_opt(L, secs, 2, 15.0);
  pthread_mutex_lock(&lnr_live_lock);
  for (lnr_group_t *g = lnr_live; g; g = g->next)
    nr_group_shutdown_gracefully(g->g, lnr_ns(quiet), lnr_ns(timeout));
  pthread_mutex_unlock(&lnr_live_lock);
  nr_resolver_cancel_all();
  ask_stop();
  return 0;
}
