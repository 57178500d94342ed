/*
 * channel_any.c -- the channel's entry points for any thread: writes,
 * flushes, closes, reads and options, run on the channel's loop (now when
 * called there, else as a task that holds a reference). Options are set
 * on the loop thread.
 */
#include <stdio.h>

#include "channel_internal.h"

/* ---- any-thread entry points ----------------------------------------------------- */

typedef struct write_job_s {
  nr_channel_t *ch;
  nr_promise_t *p;
  bool flush;
  size_t len;
  char data[];
} write_job_t;

static int write_task(void *arg) {
  write_job_t *j = arg;
  nr_bytes_t b = NR_BYTES(j->data, j->len);
  if (j->len > 0 || j->p)
    nr_pipeline_write(&j->ch->pipe, &b, j->p);
  if (j->flush)
    nr_pipeline_flush(&j->ch->pipe);
  nr_promise_release(j->p);
  nr_channel_release(j->ch);
  free(j);
  return 0;
}

int nr_channel_write(nr_channel_t *ch, const void *data, size_t len,
                     bool flush, nr_promise_t *p) {
  if (ch->loop && nr__in_loop(ch->loop)) {
    nr_bytes_t b = NR_BYTES(data, len);
    int rc = nr_pipeline_write(&ch->pipe, &b, p);
    if (flush)
      nr_pipeline_flush(&ch->pipe);
    return rc;
  }
  write_job_t *j = malloc(sizeof *j + len);
  if (j == NULL)
    return -ENOMEM;
  j->ch = nr_channel_retain(ch);
  j->p = p ? nr_promise_retain(p) : NULL;
  j->flush = flush;
  j->len = len;
  memcpy(j->data, data, len);
  if (ch->loop == NULL || nr_loop_execute(ch->loop, write_task, j) < 0) {
    if (p)
      nr_promise_set_failure(p, NR_ECLOSED, "write on a closed channel");
    nr_promise_release(j->p);
    nr_channel_release(ch);
    free(j);
    return NR_ECLOSED;
  }
  return 0;
}

static int flush_pipeline_task(void *arg) {
  nr_channel_t *ch = arg;
  nr_pipeline_flush(&ch->pipe);
  nr_channel_release(ch);
  return 0;
}

/* Run fn(ch) on the channel's loop, now if already there. */
static int on_loop(nr_channel_t *ch, nr_task_fn fn) {
  nr_channel_retain(ch);
  if (ch->loop && nr__in_loop(ch->loop))
    return fn(ch);
  if (ch->loop == NULL || nr_loop_execute(ch->loop, fn, ch) < 0) {
    nr_channel_release(ch);
    return NR_ECLOSED;
  }
  return 0;
}

int nr_channel_flush(nr_channel_t *ch) {
  return on_loop(ch, flush_pipeline_task);
}

typedef struct close_job_s {
  nr_channel_t *ch;
  nr_promise_t *p;
} close_job_t;

static int close_pipeline_task(void *arg) {
  close_job_t *j = arg;
  nr_pipeline_close(&j->ch->pipe, j->p);
  nr_promise_release(j->p);
  nr_channel_release(j->ch);
  free(j);
  return 0;
}

int nr_channel_close(nr_channel_t *ch, nr_promise_t *p) {
  close_job_t *j = malloc(sizeof *j);
  if (j == NULL)
    return -ENOMEM;
  j->ch = nr_channel_retain(ch);
  j->p = p ? nr_promise_retain(p) : NULL;
  if (ch->loop && nr__in_loop(ch->loop))
    return close_pipeline_task(j);
  if (ch->loop == NULL || nr_loop_execute(ch->loop, close_pipeline_task, j) < 0) {
    /* The loop is gone, so the channel is closed already. */
    if (p)
      nr_promise_set_success(p, NULL, NULL);
    nr_promise_release(j->p);
    nr_channel_release(ch);
    free(j);
  }
  return 0;
}

static int abort_task(void *arg) {
  nr_channel_t *ch = arg;
  nr__channel_close(ch, true);
  nr_channel_release(ch);
  return 0;
}

int nr_channel_abort(nr_channel_t *ch) { return on_loop(ch, abort_task); }

static int read_task(void *arg) {
  nr_channel_t *ch = arg;
  if (!(ch->st & NR__CLOSED))
    nr_ctx_read(&ch->pipe.tail);
  nr_channel_release(ch);
  return 0;
}

int nr_channel_read(nr_channel_t *ch) { return on_loop(ch, read_task); }

static int auto_read_on(void *arg) {
  nr_channel_t *ch = arg;
  ch->opts.auto_read = 1;
  nr__channel_update_interest(ch);
  nr_channel_release(ch);
  return 0;
}

static int auto_read_off(void *arg) {
  nr_channel_t *ch = arg;
  ch->opts.auto_read = 0;
  nr__channel_update_interest(ch);
  nr_channel_release(ch);
  return 0;
}

int nr_channel_set_auto_read(nr_channel_t *ch, bool on) {
  return on_loop(ch, on ? auto_read_on : auto_read_off);
}

int nr_channel_set_option(nr_channel_t *ch, const char *name, int v) {
  NR_ASSERT_CHANNEL_LOOP(ch);
  nr_channel_opts_t *o = &ch->opts;
  if (strcmp(name, "auto_read") == 0) {
    o->auto_read = v;
    nr__channel_update_interest(ch);
    return 0;
  }
  if (strcmp(name, "write_buffer_low") == 0 && v >= 0)
    o->write_buffer_low = (size_t)v;
  else if (strcmp(name, "write_buffer_high") == 0 && v > 0)
    ch->out.high = o->write_buffer_high = (size_t)v;
  else if (strcmp(name, "allow_half_closure") == 0)
    o->allow_half_closure = v;
  else if (strcmp(name, "tcp_nodelay") == 0)
    o->tcp_nodelay = v;
  else if (strcmp(name, "keepalive") == 0)
    o->keepalive = v;
  else if (strcmp(name, "sndbuf") == 0)
    o->sndbuf = v;
  else if (strcmp(name, "rcvbuf") == 0)
    o->rcvbuf = v;
  else
    return -ENOENT;
  if (!(ch->st & NR__CLOSED))
    nr__apply_opts(ch->io.fd, ch->family, o);
  return 0;
}
