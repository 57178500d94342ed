/*
 * promise.c -- thread-safe, reference-counted promises (Netty's
 * DefaultPromise).
 *
 * A promise completes once. Completion takes the lock only to swap the state
 * and detach the listener list; listeners then run outside the lock, each on
 * the loop it asked for (queued there as a task) or on the completing thread.
 * Waiters block on a condition variable; a thread that owns an external loop
 * (the main thread) keeps running that loop's tasks while it waits, so work
 * sent to it by other threads cannot deadlock the wait.
 *
 * Locks and condition variables are striped: a promise hashes to one of 64
 * shared pairs, so a promise is a few words with nothing to initialise --
 * every channel has one (its close future) and every write may.
 */
#include <stdio.h>
#include <time.h>

#include "internal.h"
#include "sim/sim.h"

enum { PENDING, SUCCESS, FAILURE, CANCELLED };

typedef struct listener_s {
  struct listener_s *next;
  nr_listener_fn fn;
  void *arg;
  nr_loop_t *on;
  nr_promise_t *p;                 /* set when dispatched as a task */
  bool owns_arg;                   /* free(arg) if the promise never completes */
} listener_t;

struct nr_promise_s {
  _Atomic int refs;
  _Atomic int state;
  int waiters;                     /* under the stripe's lock */
  listener_t *listeners, **ltail;
  void *value;
  void (*free_fn)(void *);
  int code;
  char *msg;
};

#define STRIPES 64

static struct stripe_s {
  pthread_mutex_t lock;
  pthread_cond_t cond;
} stripes[STRIPES];
static pthread_once_t stripes_once = PTHREAD_ONCE_INIT;

static void stripes_init(void) {
  pthread_condattr_t ca;
  pthread_condattr_init(&ca);
  pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
  for (int i = 0; i < STRIPES; i++) {
    pthread_mutex_init(&stripes[i].lock, NULL);
    pthread_cond_init(&stripes[i].cond, &ca);
  }
  pthread_condattr_destroy(&ca);
}

static inline struct stripe_s *stripe(const nr_promise_t *p) {
  uintptr_t h = (uintptr_t)p;
  return &stripes[(h >> 6 ^ h >> 12) % STRIPES];
}

nr_promise_t *nr_promise_new(void) {
  pthread_once(&stripes_once, stripes_init);
  nr_promise_t *p = calloc(1, sizeof *p);
  if (p == NULL)
    return NULL;
  atomic_init(&p->refs, 1);
  atomic_init(&p->state, PENDING);
  p->ltail = &p->listeners;
  return p;
}

/* The void promise (Netty's voidPromise): one static promise that stands
 * for "no promise" where an API wants one. It never completes, takes no
 * listeners and cannot be waited on; it is never freed. Whoever accepts
 * promises from users treats it as none: a write given it reports its
 * failure to exception_caught, as a write without a promise does. */
static nr_promise_t void_promise = {
    .refs = 1, .state = PENDING, .ltail = &void_promise.listeners};

nr_promise_t *nr_promise_void(void) { return &void_promise; }

bool nr_promise_is_void(const nr_promise_t *p) { return p == &void_promise; }

nr_promise_t *nr_promise_retain(nr_promise_t *p) {
  if (p != &void_promise)
    atomic_fetch_add_explicit(&p->refs, 1, memory_order_relaxed);
  return p;
}

static void listener_free(listener_t *l) {
  if (l->on != NULL)
    nr__loop_release(l->on);
  free(l);
}

void nr_promise_release(nr_promise_t *p) {
  if (p == NULL || p == &void_promise ||
      atomic_fetch_sub(&p->refs, 1) != 1)
    return;
  for (listener_t *l = p->listeners, *n; l; l = n) {  /* never completed */
    n = l->next;
    if (l->owns_arg)
      free(l->arg);
    listener_free(l);
  }
  if (p->free_fn)
    p->free_fn(p->value);
  free(p->msg);
  free(p);
}

static int run_listener_task(void *arg) {
  listener_t *l = arg;
  l->fn(l->p, l->arg);
  nr_promise_release(l->p);
  listener_free(l);
  return 0;
}

/* Run l now if it may run on this thread, else queue it to its loop. */
static void dispatch(nr_promise_t *p, listener_t *l) {
  if (l->on != NULL && !nr__in_loop(l->on)) {
    l->p = nr_promise_retain(p);
    if (nr_loop_execute(l->on, run_listener_task, l) == 0)
      return;
    nr_promise_release(p);
    nr_log(NR_LOG_WARN, "listener's loop %s is shut down: running it on %s",
           nr_loop_name(l->on), nr_thread_name());
  }
  l->fn(p, l->arg);
  listener_free(l);
}

static int complete(nr_promise_t *p, int state, void *value,
                    void (*free_fn)(void *), int code, const char *msg) {
  if (p == &void_promise) {
    if (free_fn)
      free_fn(value);
    return -EINVAL;
  }
  /* Hold a reference while completing: a waiter that sees the new state
   * may drop what it believed was the last one. */
  nr_promise_retain(p);
  struct stripe_s *st = stripe(p);
  pthread_mutex_lock(&st->lock);
  if (atomic_load_explicit(&p->state, memory_order_relaxed) != PENDING) {
    pthread_mutex_unlock(&st->lock);
    nr_promise_release(p);
    if (free_fn)
      free_fn(value);
    return -EALREADY;
  }
  p->value = value;
  p->free_fn = free_fn;
  p->code = code;
  p->msg = msg ? strdup(msg) : NULL;
  atomic_store_explicit(&p->state, state, memory_order_release);
  listener_t *l = p->listeners;
  p->listeners = NULL;
  p->ltail = &p->listeners;
  if (p->waiters)
    pthread_cond_broadcast(&st->cond);
  pthread_mutex_unlock(&st->lock);
  for (listener_t *n; l; l = n) {
    n = l->next;
    dispatch(p, l);
  }
  nr_promise_release(p);
  return 0;
}

int nr_promise_set_success(nr_promise_t *p, void *value,
                           void (*free_fn)(void *)) {
  return complete(p, SUCCESS, value, free_fn, 0, NULL);
}

int nr_promise_set_failure(nr_promise_t *p, int code, const char *msg) {
  return complete(p, FAILURE, NULL, NULL, code ? code : NR_EHANDLER,
                  msg ? msg : nr_strerror(code));
}

int nr_promise_cancel(nr_promise_t *p) {
  return complete(p, CANCELLED, NULL, NULL, NR_ECANCELLED, "cancelled");
}

static int state_of(const nr_promise_t *p) {
  return atomic_load_explicit(&((nr_promise_t *)p)->state,
                              memory_order_acquire);
}

bool nr_promise_is_done(const nr_promise_t *p) { return state_of(p) != PENDING; }
bool nr_promise_is_success(const nr_promise_t *p) { return state_of(p) == SUCCESS; }
bool nr_promise_is_cancelled(const nr_promise_t *p) { return state_of(p) == CANCELLED; }
void *nr_promise_value(const nr_promise_t *p) {
  return state_of(p) == SUCCESS ? p->value : NULL;
}
void (*nr_promise_value_free_fn(const nr_promise_t *p))(void *) {
  return state_of(p) == SUCCESS ? p->free_fn : NULL;
}
int nr_promise_code(const nr_promise_t *p) {
  return state_of(p) == PENDING ? 0 : p->code;
}
const char *nr_promise_message(const nr_promise_t *p) {
  return state_of(p) == PENDING ? NULL : p->msg;
}

static int add_listener(nr_promise_t *p, nr_loop_t *on, nr_listener_fn fn,
                        void *arg, bool owns_arg) {
  if (p == &void_promise)
    return -EINVAL;
  listener_t *l = calloc(1, sizeof *l);
  if (l == NULL)
    return -ENOMEM;
  l->fn = fn;
  l->arg = arg;
  l->owns_arg = owns_arg;
  l->on = on != NULL ? nr__loop_retain(on) : NULL;  /* it may be freed first */
  struct stripe_s *st = stripe(p);
  pthread_mutex_lock(&st->lock);
  if (atomic_load_explicit(&p->state, memory_order_relaxed) == PENDING) {
    *p->ltail = l;
    p->ltail = &l->next;
    pthread_mutex_unlock(&st->lock);
    return 0;
  }
  pthread_mutex_unlock(&st->lock);
  dispatch(p, l);
  return 0;
}

int nr_promise_add_listener(nr_promise_t *p, nr_loop_t *on, nr_listener_fn fn,
                            void *arg) {
  return add_listener(p, on, fn, arg, false);
}

int nr_promise_add_listener_owning(nr_promise_t *p, nr_loop_t *on,
                                   nr_listener_fn fn, void *arg) {
  return add_listener(p, on, fn, arg, true);
}

static void wake_loop(nr_promise_t *p, void *arg) {
  (void)p;
  nr__loop_wakeup(arg);
}

/* The owner of an external loop waits by running it. */
static int wait_running(nr_promise_t *p, nr_loop_t *l, uint64_t deadline) {
  nr_promise_add_listener(p, NULL, wake_loop, l);
  while (!nr_promise_is_done(p)) {
    uint64_t now = nr_now();
    if (now >= deadline)
      return NR_ETIMEDOUT;
    nr_loop_run_once(l, deadline - now);
    if (l->sim != NULL && !nr_promise_is_done(p) && nr__sim_stuck(l))
      return NR_ESIMSTUCK;       /* a simulation in which nothing can end it */
  }
  return 0;
}

int nr_promise_wait(nr_promise_t *p, uint64_t timeout) {
  if (p == &void_promise)
    return -EINVAL;
  if (nr_promise_is_done(p))
    return 0;
  nr_loop_t *cur = nr_loop_current();
  if (cur != NULL && !cur->external)
    return NR_EDEADLOCK;
  uint64_t deadline = timeout == UINT64_MAX ? UINT64_MAX : nr_now() + timeout;
  if (cur != NULL)
    return wait_running(p, cur, deadline);
  struct timespec ts = {(time_t)(deadline / 1000000000ull),
                        (long)(deadline % 1000000000ull)};
  int rc = 0;
  struct stripe_s *st = stripe(p);
  pthread_mutex_lock(&st->lock);
  p->waiters++;
  while (atomic_load(&p->state) == PENDING && rc == 0) {
    if (timeout == UINT64_MAX)
      pthread_cond_wait(&st->cond, &st->lock);
    else if (pthread_cond_timedwait(&st->cond, &st->lock, &ts) == ETIMEDOUT)
      rc = atomic_load(&p->state) == PENDING ? NR_ETIMEDOUT : 0;
  }
  p->waiters--;
  pthread_mutex_unlock(&st->lock);
  return rc;
}

nr_promise_t *nr__promise_failed(int code, const char *fmt, ...) {
  char msg[512];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  nr_promise_t *p = nr_promise_new();
  if (p)
    nr_promise_set_failure(p, code, msg);
  return p;
}
