/*
 * timer.c -- a loop's timers (Netty's scheduled tasks): nr_loop_schedule,
 * nr_timer_cancel, and the heap (heap.c) that orders them by deadline, ties
 * broken by a sequence number so equal deadlines fire first-in first-out.
 * Due timers join the loop's ready list (nr__timers_fetch_due) and run as
 * tasks ahead of the queued ones (executor.c).
 *
 * Threads: the heap, the ready list and timer_seq are the loop thread's.
 * Any thread may schedule or cancel: a timer scheduled from another thread
 * reaches the heap through a task (add_timer_task); a cancel is a state
 * change (PENDING -> CANCELLED, compare-and-swap) that whoever holds the
 * timer acts on -- its loop removes it from the heap, or the add task, the
 * ready list or a running periodic timer discards it on seeing CANCELLED.
 * A timer is refcounted: the caller's reference and the loop's.
 */
#include <errno.h>

#include "internal.h"

static void timer_unref(nr_timer_t *t) {
  if (atomic_fetch_sub(&t->refs, 1) == 1)
    free(t);
}

void nr_timer_release(nr_timer_t *t) {
  if (t)
    timer_unref(t);
}

bool nr_timer_is_cancelled(const nr_timer_t *t) {
  return atomic_load(&((nr_timer_t *)t)->state) == NR_TIMER_CANCELLED;
}

/* Drop a timer the loop will not run again. */
static void discard(nr_loop_t *l, nr_timer_t *t, bool cancelled) {
  if (cancelled && t->cancel_fn)
    t->cancel_fn(t->arg);
  atomic_fetch_sub_explicit(&l->timer_count, 1, memory_order_relaxed);
  if (t->keeps_alive)
    atomic_fetch_sub(&l->timer_refs, 1);
  timer_unref(t);
}

static void add_timer(nr_loop_t *l, nr_timer_t *t) {
  if (atomic_load(&t->state) != NR_TIMER_PENDING) {
    discard(l, t, true);
    return;
  }
  if (nr__heap_push(&l->heap, t, l->timer_seq++) < 0) {
    nr_log(NR_LOG_ERROR, "%s: out of memory scheduling a timer", l->name);
    atomic_store(&t->state, NR_TIMER_CANCELLED);
    discard(l, t, true);
  }
}

static int add_timer_task(void *arg) {
  nr_timer_t *t = arg;
  add_timer(t->loop, t);
  return 0;
}

static int fire_timer(void *arg) {
  nr_timer_t *t = arg;
  nr_loop_t *l = t->loop;
  int expect = NR_TIMER_PENDING;
  if (t->period == 0 &&
      !atomic_compare_exchange_strong(&t->state, &expect, NR_TIMER_DONE)) {
    discard(l, t, true);
    return 0;
  }
  if (t->period != 0 && atomic_load(&t->state) != NR_TIMER_PENDING) {
    discard(l, t, true);
    return 0;
  }
  int rc = t->fn(t->arg);
  if (t->period == 0) {
    discard(l, t, false);
  } else if (atomic_load(&t->state) == NR_TIMER_PENDING &&
             !nr_loop_is_shutting_down(l)) {
    t->deadline = t->period > 0 ? t->deadline + (uint64_t)t->period
                                : nr_now() + (uint64_t)-t->period;
    add_timer(l, t);
  } else {
    atomic_store(&t->state, NR_TIMER_CANCELLED);
    discard(l, t, true);
  }
  return rc;
}

/* Move due timers to the ready list (Netty's fetchFromScheduledTaskQueue):
 * they run before the queued tasks, in deadline order, ties FIFO. */
void nr__timers_fetch_due(nr_loop_t *l, uint64_t now) {
  nr_timer_t *t;
  while ((t = nr__heap_peek(&l->heap)) != NULL && t->deadline <= now) {
    nr__heap_pop(&l->heap);
    t->task.fn = fire_timer;
    t->task.arg = t;
    t->task.flags = 0;
    atomic_store_explicit(&t->task.next, NULL, memory_order_relaxed);
    if (l->ready == NULL)
      l->ready = &t->task;
    else
      atomic_store_explicit(&l->ready_tail->next, &t->task,
                            memory_order_relaxed);
    l->ready_tail = &t->task;
  }
}

static nr_timer_t *schedule(nr_loop_t *l, uint64_t delay, int64_t period,
                            nr_task_fn fn, nr_task_fn cancel_fn, void *arg,
                            bool keeps_alive) {
  nr_timer_t *t = calloc(1, sizeof *t);
  if (t == NULL)
    return NULL;
  atomic_init(&t->refs, 2);               /* the caller's and the loop's */
  atomic_init(&t->state, NR_TIMER_PENDING);
  t->loop = l;
  t->deadline = nr_now() + delay;
  t->period = period;
  t->idx = NR_NOT_IN_HEAP;
  t->fn = fn;
  t->cancel_fn = cancel_fn;
  t->arg = arg;
  t->keeps_alive = keeps_alive;
  atomic_fetch_add_explicit(&l->timer_count, 1, memory_order_relaxed);
  if (keeps_alive)
    atomic_fetch_add(&l->timer_refs, 1);
  if (nr_loop_in_thread(l)) {
    add_timer(l, t);
    return t;
  }
  t->task.fn = add_timer_task;
  t->task.arg = t;
  int rc = nr_loop_execute_task(l, &t->task);
  if (rc < 0) {
    atomic_fetch_sub_explicit(&l->timer_count, 1, memory_order_relaxed);
    if (keeps_alive)
      atomic_fetch_sub(&l->timer_refs, 1);
    free(t);
    errno = rc == NR_EFULL ? EAGAIN : ESHUTDOWN;
    return NULL;
  }
  return t;
}

nr_timer_t *nr_loop_schedule(nr_loop_t *l, uint64_t delay, int64_t period,
                             nr_task_fn fn, nr_task_fn cancel_fn, void *arg) {
  return schedule(l, delay, period, fn, cancel_fn, arg, false);
}

nr_timer_t *nr_loop_schedule_ref(nr_loop_t *l, uint64_t delay, int64_t period,
                                 nr_task_fn fn, nr_task_fn cancel_fn,
                                 void *arg) {
  return schedule(l, delay, period, fn, cancel_fn, arg, true);
}

static int remove_timer_task(void *arg) {
  nr_timer_t *t = arg;
  if (t->idx != NR_NOT_IN_HEAP) {
    nr__heap_remove(&t->loop->heap, t);
    discard(t->loop, t, true);
  }
  timer_unref(t);
  return 0;
}

int nr_timer_cancel(nr_timer_t *t) {
  int expect = NR_TIMER_PENDING;
  if (!atomic_compare_exchange_strong(&t->state, &expect,
                                      NR_TIMER_CANCELLED))
    return -EALREADY;
  /* Whoever holds the timer outside the heap (the add task, the ready list,
   * a running periodic task) discards it on seeing CANCELLED; a timer in the
   * heap is removed by its loop. */
  atomic_fetch_add(&t->refs, 1);
  if (nr_loop_in_thread(t->loop))
    remove_timer_task(t);
  else if (nr_loop_execute(t->loop, remove_timer_task, t) < 0)
    timer_unref(t);     /* loop shut down: its shutdown discarded the heap */
  return 0;
}

void nr__timer_drop(nr_timer_t **t) {
  if (*t) {
    nr_timer_cancel(*t);
    nr_timer_release(*t);
    *t = NULL;
  }
}

uint64_t nr__next_deadline(nr_loop_t *l) {
  nr_timer_t *t = nr__heap_peek(&l->heap);
  return t ? t->deadline : NR_NONE;
}

void nr__cancel_timers(nr_loop_t *l) {
  nr_timer_t *t;
  while ((t = nr__heap_pop(&l->heap)) != NULL) {
    atomic_store(&t->state, NR_TIMER_CANCELLED);
    discard(l, t, true);
  }
}
