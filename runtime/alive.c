/*
 * alive.c -- what a loop is owed and what keeps it alive.
 *
 * Work owed (nr_loop_hold): a task a loop sent to another loop whose
 * outcome comes back to it -- a future's listener, a task queued back, a
 * name lookup. A graceful shutdown waits for it before closing the loop's
 * channels (Netty would close them and lose the answer); the channels stop
 * reading meanwhile, and the shutdown's timeout bounds the wait. The
 * holder releases its hold after queueing what comes back, so once the
 * count is 0 the loop runs what is queued before closing (held_seen).
 *
 * A request under way elsewhere (nr_loop_ref: a name lookup) keeps the
 * loop alive as work owed does, without holding its shutdown.
 *
 * Alive (libuv's uv_loop_alive, with Node's ref/unref): a loop that has a
 * task queued or running, a pending timer that keeps it alive
 * (nr_loop_schedule_ref), a linked channel that is not unref'd, work owed
 * to it or a request it waits for. netrun.run() lets a process end once no loop of its groups
 * is alive; loops tell it when they block with nothing alive
 * (nr_loop_watch_idle).
 *
 * Threads: hold, unhold, is_alive and watch_idle from any thread (atomics
 * only); held_seen and the idle check before blocking on the loop's.
 */
#include "internal.h"

static _Atomic(nr_loop_t *) idle_watcher;

void nr_loop_hold(nr_loop_t *l) {
  nr__loop_retain(l);
  atomic_fetch_add(&l->held, 1);
}

static int noop(void *arg) {
  (void)arg;
  return 0;
}

static bool keeps_alive(const nr_loop_t *cl);

/* The last hold gone: a loop that waits for it in a shutdown looks again,
 * and so does the watcher of idle loops if nothing else keeps the loop
 * alive (a loop serving channels is not even looked at). A task, not the
 * eventfd: a loop past its shutdown rejects the task, while its eventfd
 * may be closed by then. */
void nr_loop_unhold(nr_loop_t *l) {
  if (atomic_fetch_sub(&l->held, 1) == 1) {
    nr_loop_t *w = atomic_load(&idle_watcher);
    if (nr_loop_is_shutting_down(l))
      nr_loop_execute(l, noop, NULL);
    else if (w != NULL && !keeps_alive(l))
      nr_loop_execute(w, noop, NULL);
  }
  nr__loop_release(l);
}

void nr_loop_ref(nr_loop_t *l) {
  nr__loop_retain(l);
  atomic_fetch_add(&l->waits, 1);
}

void nr_loop_unref(nr_loop_t *l) {
  nr_loop_t *w = atomic_load(&idle_watcher);
  if (atomic_fetch_sub(&l->waits, 1) == 1 && w != NULL && !keeps_alive(l))
    nr_loop_execute(w, noop, NULL);
  nr__loop_release(l);
}

/* Loop thread, in a shutdown: whether to keep the channels open for work
 * owed. Once none is, what came back (queued before the last unhold) runs
 * before they close. */
bool nr__loop_held(nr_loop_t *l) {
  if (atomic_load(&l->held) > 0) {
    l->held_seen = true;
    return true;
  }
  if (l->held_seen && nr__loop_has_tasks(l))
    return true;
  l->held_seen = false;
  return false;
}

/* Timers, channels and work owed (what the loop's thread cannot see
 * change while it blocks: tasks and being busy are checked apart). */
static bool keeps_alive(const nr_loop_t *cl) {
  nr_loop_t *l = (nr_loop_t *)cl;
  return atomic_load(&l->timer_refs) > 0 || atomic_load(&l->held) > 0 ||
         atomic_load(&l->waits) > 0 ||
         atomic_load(&l->channel_count) > atomic_load(&l->channel_unrefs);
}

bool nr_loop_is_alive(const nr_loop_t *cl, uint64_t *mark) {
  nr_loop_t *l = (nr_loop_t *)cl;
  uint64_t enq = atomic_load(&l->enqueued);
  if (mark != NULL)
    *mark = atomic_load(&l->iterations) + enq;
  int st = atomic_load(&l->state);
  if (st == NR_TERMINATED)
    return false;
  if (st >= NR_SHUTTING_DOWN)
    return true;                     /* on its way: it will terminate */
  return enq != atomic_load(&l->dequeued) ||
         (!l->external && atomic_load(&l->busy_since) != 0) ||
         keeps_alive(l);
}

void nr_loop_watch_idle(nr_loop_t *watcher) {
  atomic_store(&idle_watcher, watcher);
}

/* Loop thread, about to block (busy_since is 0 already, so a watcher
 * that looks after this task sees the loop idle). */
void nr__loop_blocking(nr_loop_t *l) {
  nr_loop_t *w = atomic_load_explicit(&idle_watcher, memory_order_relaxed);
  if (w != NULL && w != l && !keeps_alive(l))
    nr_loop_execute(w, noop, NULL);
}
