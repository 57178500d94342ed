/*
 * embedded.c -- embedded channels (Netty's EmbeddedChannel): a channel with
 * no socket whose head captures outbound writes and whose tail captures
 * the inbound messages and exceptions nobody handled, so handlers and codecs
 * are tested without the network. Loop thread only (the channel's loop;
 * the main thread's external loop serves the Lua REPL and specs).
 *
 * The channel is an ordinary nr_channel_t with fd -1 that is never added
 * to the selector or to the loop's channel list: its own head and tail
 * handlers replace the socket ones, and the nr_embedded_t travels as their
 * context state. nr_embedded_free clears that state, so a channel kept
 * alive by a handle after the free acts as closed.
 */
#include <assert.h>
#include <stdio.h>

#include "internal.h"

typedef struct emsg_s {
  struct emsg_s *next;
  size_t len;
  char data[];
} emsg_t;

typedef struct equeue_s {
  emsg_t *head, **tail;
} equeue_t;

struct nr_embedded_s {
  nr_channel_t *ch;
  nr_embedded_sink_t sink;
  equeue_t in, out;
  int err_code;
  char *err_msg;
};

/* ---- default queues ------------------------------------------------------- */

/* Copy bytes or slices onto q; other messages cannot be copied here. */
static int enqueue(equeue_t *q, void *msg) {
  int type = nr_msg_type(msg);
  size_t len = 0;
  if (type == NR_MSG_BYTES)
    len = ((nr_bytes_t *)msg)->len;
  else if (type == NR_MSG_SLICES)
    for (size_t i = 0; i < ((nr_slices_t *)msg)->n; i++)
      len += ((nr_slices_t *)msg)->v[i].len;
  else
    return nr_raise(-EINVAL, "embedded channel: cannot capture a message of "
                    "type %d without a sink", type);
  emsg_t *m = malloc(sizeof *m + len);
  if (m == NULL)
    return -ENOMEM;
  m->next = NULL;
  m->len = len;
  if (type == NR_MSG_BYTES) {
    memcpy(m->data, ((nr_bytes_t *)msg)->data, len);
  } else {
    const nr_slices_t *s = msg;
    char *p = m->data;
    for (size_t i = 0; i < s->n; p += s->v[i].len, i++)
      memcpy(p, s->v[i].data, s->v[i].len);
  }
  *q->tail = m;
  q->tail = &m->next;
  return 0;
}

static char *dequeue(equeue_t *q, size_t *len) {
  emsg_t *m = q->head;
  if (m == NULL)
    return NULL;
  q->head = m->next;
  if (q->head == NULL)
    q->tail = &q->head;
  *len = m->len;
  memmove(m, m->data, m->len);       /* hand out one allocation */
  return (char *)m;
}

static void queue_free(equeue_t *q) {
  for (emsg_t *m = q->head, *n; m; m = n) {
    n = m->next;
    free(m);
  }
  q->head = NULL;
  q->tail = &q->head;
}

/* ---- the head: outbound operations are captured ------------------------------ */

static nr_embedded_t *of(nr_ctx_t *ctx) { return nr_ctx_state(ctx); }

static int head_write(nr_ctx_t *ctx, void *msg, nr_promise_t *p) {
  nr_embedded_t *e = of(ctx);
  if (e == NULL || !nr_channel_is_open(e->ch))
    return nr_raise(NR_ECLOSED, "write on a closed channel");
  int rc = 0;
  if (e->sink.outbound)
    e->sink.outbound(e->sink.ud, msg);
  else
    rc = enqueue(&e->out, msg);
  if (rc == 0 && p)
    nr_promise_set_success(p, NULL, NULL);
  return rc;
}

static int head_flush(nr_ctx_t *ctx) {
  (void)ctx;
  return 0;
}

static int head_read(nr_ctx_t *ctx) {
  (void)ctx;
  return 0;
}

static int head_close(nr_ctx_t *ctx, nr_promise_t *p) {
  nr_embedded_t *e = of(ctx);
  if (e)
    nr_embedded_close(e);
  if (p)
    nr_promise_set_success(p, NULL, NULL);
  return 0;
}

static int head_bind(nr_ctx_t *ctx, const struct sockaddr *sa, socklen_t len,
                     nr_promise_t *p) {
  (void)ctx, (void)sa, (void)len, (void)p;
  return nr_raise(-EOPNOTSUPP, "an embedded channel has no socket to bind");
}

static int head_connect(nr_ctx_t *ctx, const struct sockaddr *sa,
                        socklen_t len, nr_promise_t *p) {
  (void)ctx, (void)sa, (void)len, (void)p;
  return nr_raise(-EOPNOTSUPP, "an embedded channel has no socket to connect");
}

static const nr_handler_t embedded_head = {
    .type = "head", .bind = head_bind, .connect = head_connect,
    .disconnect = head_close, .close = head_close, .read = head_read,
    .write = head_write, .flush = head_flush};

/* ---- the tail: what nobody handled is captured ------------------------------- */

static int tail_channel_read(nr_ctx_t *ctx, void *msg) {
  nr_embedded_t *e = of(ctx);
  if (e == NULL)
    return 0;
  if (e->sink.inbound) {
    e->sink.inbound(e->sink.ud, msg);
    return 0;
  }
  int rc = enqueue(&e->in, msg);
  if (rc < 0)                /* the tail has no exception_caught to raise to */
    nr_log(NR_LOG_WARN, "embedded channel: %s", nr__raised(rc));
  return 0;
}

static int tail_exception(nr_ctx_t *ctx, const nr_err_t *err) {
  nr_embedded_t *e = of(ctx);
  if (e == NULL)
    return 0;
  if (e->sink.exception) {
    e->sink.exception(e->sink.ud, err);
  } else if (e->err_code == 0) {
    e->err_code = err->code ? err->code : NR_EHANDLER;
    e->err_msg = strdup(err->msg ? err->msg : nr_strerror(err->code));
  }
  return 0;
}

static int tail_ignore(nr_ctx_t *c) { (void)c; return 0; }
static int tail_ignore_evt(nr_ctx_t *c, void *e) { (void)c, (void)e; return 0; }

static const nr_handler_t embedded_tail = {
    .type = "tail", .registered = tail_ignore, .unregistered = tail_ignore,
    .active = tail_ignore, .inactive = tail_ignore,
    .channel_read = tail_channel_read,
    .channel_read_complete = tail_ignore, .user_event = tail_ignore_evt,
    .writability_changed = tail_ignore, .exception = tail_exception};

/* ---- lifetime ---------------------------------------------------------------- */

nr_embedded_t *nr_embedded_new(nr_loop_t *loop,
                               const nr_embedded_sink_t *sink) {
  assert(nr_loop_in_thread(loop));
  nr_embedded_t *e = calloc(1, sizeof *e);
  if (e == NULL)
    return NULL;
  e->ch = nr__channel_new(NR__STREAM, AF_UNSPEC, -1, NULL);
  if (e->ch == NULL) {
    free(e);
    errno = ENOMEM;
    return NULL;
  }
  if (sink)
    e->sink = *sink;
  e->in.tail = &e->in.head;
  e->out.tail = &e->out.head;
  nr_channel_t *ch = e->ch;
  ch->loop = loop;
  ch->pipe.head.h = &embedded_head;
  ch->pipe.head.state = e;
  ch->pipe.tail.h = &embedded_tail;
  ch->pipe.tail.state = e;
  return e;
}

nr_channel_t *nr_embedded_channel(nr_embedded_t *e) { return e->ch; }

void nr_embedded_start(nr_embedded_t *e) {
  nr_channel_t *ch = e->ch;
  if (ch->st & (NR__REGISTERED | NR__CLOSED))
    return;
  ch->st |= NR__REGISTERED;
  nr__pipeline_fire_registered(&ch->pipe);
  if (ch->st & NR__CLOSED)
    return;
  atomic_fetch_or(&ch->pub, NR__ACTIVE);
  ch->st |= NR__WAS_ACTIVE;
  nr__pipeline_fire_active(&ch->pipe);
}

void nr_embedded_write_inbound(nr_embedded_t *e, void *msg, bool complete) {
  nr_channel_t *ch = e->ch;
  if (ch->st & NR__CLOSED)
    return;
  nr_pipeline_fire_read(&ch->pipe, msg);
  if (complete && !(ch->st & NR__CLOSED))
    nr__pipeline_fire_read_complete(&ch->pipe);
}

int nr_embedded_write_outbound(nr_embedded_t *e, void *msg) {
  int rc = nr_pipeline_write(&e->ch->pipe, msg, NULL);
  nr_pipeline_flush(&e->ch->pipe);
  return rc;
}

char *nr_embedded_read_inbound(nr_embedded_t *e, size_t *len) {
  return dequeue(&e->in, len);
}

char *nr_embedded_read_outbound(nr_embedded_t *e, size_t *len) {
  return dequeue(&e->out, len);
}

nr_err_t nr_embedded_error(nr_embedded_t *e) {
  static _Thread_local char last[512];
  nr_err_t err = {e->err_code, NULL};
  if (e->err_msg) {
    snprintf(last, sizeof last, "%s", e->err_msg);
    err.msg = last;
    free(e->err_msg);
  }
  e->err_code = 0;
  e->err_msg = NULL;
  return err;
}

/* The two-phase close of a socket channel collapses into one step: there
 * is nothing to drain. */
void nr_embedded_close(nr_embedded_t *e) {
  nr_channel_t *ch = e->ch;
  if (ch->st & NR__CLOSED)
    return;
  bool was_active = atomic_load(&ch->pub) & NR__ACTIVE;
  ch->st |= NR__CLOSED;
  atomic_store(&ch->pub, 0);
  unsigned td = NR__TD_DESTROY | (was_active ? NR__TD_INACTIVE : 0);
  if (ch->st & NR__REGISTERED) {
    td |= NR__TD_UNREGISTERED;
    ch->st &= ~NR__REGISTERED;
  }
  nr__channel_closed(ch);
  nr__pipeline_teardown(&ch->pipe, td);
}

void nr_embedded_free(nr_embedded_t *e) {
  if (e == NULL)
    return;
  nr_embedded_close(e);
  e->ch->pipe.head.state = NULL;
  e->ch->pipe.tail.state = NULL;
  nr_channel_release(e->ch);
  queue_free(&e->in);
  queue_free(&e->out);
  free(e->err_msg);
  free(e);
}
