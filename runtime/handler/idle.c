/*
 * idle.c -- idle-state detection (Netty's IdleStateHandler). Loop thread
 * only: the state, its timers and the context all belong to the channel's
 * loop.
 *
 * Activity does not touch the timers: a read or write only records the
 * time, and each timer, when it fires, computes how long the channel has
 * really been idle. Either it fires the user event and re-arms for a full
 * period, or it re-arms for the time left. So a busy channel costs one
 * clock read per read burst and per write, never a timer operation.
 *
 * A read is "in progress" from channel_read to channel_read_complete; a
 * timer that fires meanwhile treats the channel as not idle.
 *
 * Lifetime: timers run only between start (channel_active, or handler_added
 * on an active channel) and stop (channel_inactive, handler_removed); each
 * holds the state as its argument and is cancelled (on this loop, so it
 * cannot run afterwards) before the state is freed.
 */
#include <stdlib.h>

#include "handler.h"

/* Its event, registered as the program loads (netrun.h). */
__attribute__((constructor)) static void declare_types(void) {
  nr_msg_declare(NR_MSG_IDLE, "idle");
}

enum { ST_NEW, ST_RUNNING, ST_STOPPED };

typedef struct idle_s {
  nr_ctx_t *ctx;                    /* borrowed: valid until removed */
  uint64_t timeout[3];              /* by NR_IDLE_*; 0 = off */
  nr_timer_t *timer[3];
  bool first[3];
  uint64_t last_read, last_write;
  bool reading;
  int st;
} idle_t;

/* A timer's argument: the state and which kind it watches. The three live
 * inside the state so arming allocates nothing beyond the timer itself. */
typedef struct idle_arg_s {
  idle_t *s;
  int kind;
} idle_arg_t;

typedef struct idle_full_s {
  idle_t s;
  idle_arg_t args[3];
} idle_full_t;

const char *nr_idle_state_name(int state) {
  static const char *const names[] = {"reader", "writer", "all"};
  return state >= 0 && state <= NR_IDLE_ALL ? names[state] : "?";
}

void *nr_idle_new(uint64_t reader, uint64_t writer, uint64_t all) {
  idle_full_t *f = calloc(1, sizeof *f);
  if (f == NULL)
    return NULL;
  f->s.timeout[NR_IDLE_READER] = reader;
  f->s.timeout[NR_IDLE_WRITER] = writer;
  f->s.timeout[NR_IDLE_ALL] = all;
  for (int k = 0; k < 3; k++) {
    f->s.first[k] = true;
    f->args[k] = (idle_arg_t){&f->s, k};
  }
  return f;
}

static int on_timer(void *arg);

static void arm(idle_t *s, int kind, uint64_t delay) {
  idle_full_t *f = (idle_full_t *)s;
  nr_loop_t *loop = nr_channel_loop(nr_ctx_channel(s->ctx));
  s->timer[kind] = nr_loop_schedule(loop, delay, 0, on_timer, NULL,
                                    &f->args[kind]);
  if (s->timer[kind] == NULL)
    nr_log(NR_LOG_WARN, "idle_state: cannot schedule the %s timer of '%s'",
           nr_idle_state_name(kind), nr_ctx_name(s->ctx));
}

/* When the channel was last active, as this kind of idleness counts it. */
static uint64_t last_activity(const idle_t *s, int kind) {
  switch (kind) {
  case NR_IDLE_READER: return s->last_read;
  case NR_IDLE_WRITER: return s->last_write;
  default: return s->last_read > s->last_write ? s->last_read : s->last_write;
  }
}

static int on_timer(void *arg) {
  idle_arg_t *a = arg;
  idle_t *s = a->s;
  int kind = a->kind;
  nr_timer_release(s->timer[kind]);          /* this timer; the loop holds it */
  s->timer[kind] = NULL;
  if (s->st != ST_RUNNING)
    return 0;
  uint64_t now = nr_now(), t = s->timeout[kind];
  uint64_t idle = (kind != NR_IDLE_WRITER && s->reading)
                      ? 0 : now - last_activity(s, kind);
  if (idle < t) {
    arm(s, kind, t - idle);
    return 0;
  }
  arm(s, kind, t);
  nr_idle_event_t evt = {NR_MSG_IDLE, kind, s->first[kind]};
  s->first[kind] = false;
  /* Last: a handler may close the channel, which stops and frees s. */
  nr_ctx_fire_user_event(s->ctx, &evt);
  return 0;
}

static void start(idle_t *s) {
  if (s->st != ST_NEW)
    return;
  s->st = ST_RUNNING;
  s->last_read = s->last_write = nr_now();
  for (int k = 0; k < 3; k++)
    if (s->timeout[k] > 0)
      arm(s, k, s->timeout[k]);
}

static void stop(idle_t *s) {
  s->st = ST_STOPPED;
  for (int k = 0; k < 3; k++)
    if (s->timer[k]) {
      nr_timer_cancel(s->timer[k]);
      nr_timer_release(s->timer[k]);
      s->timer[k] = NULL;
    }
}

static void idle_added(nr_ctx_t *ctx) {
  idle_t *s = nr_ctx_state(ctx);
  s->ctx = ctx;
  if (nr_channel_is_active(nr_ctx_channel(ctx)))
    start(s);
}

static void idle_removed(nr_ctx_t *ctx) {
  idle_t *s = nr_ctx_state(ctx);
  stop(s);
  free(s);
}

static int idle_active(nr_ctx_t *ctx) {
  start(nr_ctx_state(ctx));
  nr_ctx_fire_active(ctx);
  return 0;
}

static int idle_inactive(nr_ctx_t *ctx) {
  stop(nr_ctx_state(ctx));
  nr_ctx_fire_inactive(ctx);
  return 0;
}

static int idle_channel_read(nr_ctx_t *ctx, void *msg) {
  idle_t *s = nr_ctx_state(ctx);
  s->reading = true;
  s->first[NR_IDLE_READER] = s->first[NR_IDLE_ALL] = true;
  nr_ctx_fire_read(ctx, msg);
  return 0;
}

static int idle_channel_read_complete(nr_ctx_t *ctx) {
  idle_t *s = nr_ctx_state(ctx);
  if (s->reading) {
    s->last_read = nr_now();
    s->reading = false;
  }
  nr_ctx_fire_read_complete(ctx);
  return 0;
}

/* A write counts when it is made, not when the socket takes it: simpler,
 * and what a slow reader on the other end cannot delay. */
static int idle_write(nr_ctx_t *ctx, void *msg, nr_promise_t *p) {
  idle_t *s = nr_ctx_state(ctx);
  s->last_write = nr_now();
  s->first[NR_IDLE_WRITER] = s->first[NR_IDLE_ALL] = true;
  nr_ctx_write(ctx, msg, p);     /* its failure is reported further on */
  return 0;
}

const nr_handler_t nr_idle_handler = {
    .type = "idle_state",
    .added = idle_added,
    .removed = idle_removed,
    .active = idle_active,
    .inactive = idle_inactive,
    .channel_read = idle_channel_read,
    .channel_read_complete = idle_channel_read_complete,
    .write = idle_write,
};
