/*
 * pipeline.c -- handler pipelines (Netty's DefaultChannelPipeline and
 * AbstractChannelHandlerContext). Loop thread only.
 *
 * Contexts form a doubly linked list between an embedded head (which does
 * the channel's outbound work) and tail (which logs what nobody handled).
 * Inbound events travel head -> tail, outbound operations tail -> head, each
 * hop skipping contexts whose mask lacks the event, so a handler pays
 * nothing for what it does not implement.
 *
 * Removal while events flow: a removed context keeps its prev/next (and a
 * reference on each), so an event already past it carries on; if a handler
 * call is in progress (depth > 0) the context is parked on `zombies` and
 * freed when the outermost call returns.
 *
 * A close never takes the handlers away under a handler's feet. A handler
 * may close its channel indirectly (its flush meets a peer that reset, and
 * the failed write closes) and then go on using its own state; so, as
 * Netty fires channelInactive and deregisters "later", a close made while a
 * handler call is in progress only notes the teardown, and the outermost
 * call runs it as it returns (nr__pipeline_teardown, unwound).
 */
#include <stdio.h>

#include "internal.h"

unsigned nr_handler_mask(const nr_handler_t *h) {
  unsigned m = 0;
#define BIT(field, bit) if (h->field) m |= (bit)
  BIT(registered, NR_EV_REGISTERED); BIT(unregistered, NR_EV_UNREGISTERED);
  BIT(active, NR_EV_ACTIVE); BIT(inactive, NR_EV_INACTIVE);
  BIT(channel_read, NR_EV_READ);
  BIT(channel_read_complete, NR_EV_READ_COMPLETE);
  BIT(user_event, NR_EV_USER_EVENT);
  BIT(writability_changed, NR_EV_WRITABILITY);
  BIT(exception, NR_EV_EXCEPTION); BIT(bind, NR_OP_BIND);
  BIT(connect, NR_OP_CONNECT); BIT(disconnect, NR_OP_DISCONNECT);
  BIT(close, NR_OP_CLOSE); BIT(read, NR_OP_READ); BIT(write, NR_OP_WRITE);
  BIT(flush, NR_OP_FLUSH);
#undef BIT
  return m;
}

/* ---- context lifetime ----------------------------------------------------- */

nr_ctx_t *nr_ctx_retain(nr_ctx_t *c) {
  c->refs++;
  if (!c->embedded)
    nr_channel_retain(c->pipe->ch);
  return c;
}

static void ctx_unref(nr_ctx_t *c) {
  if (c->embedded || --c->refs > 0)
    return;
  nr_ctx_t *prev = c->prev, *next = c->next;
  free(c->name);
  free(c);
  if (prev)
    ctx_unref(prev);
  if (next)
    ctx_unref(next);
}

void nr_ctx_release(nr_ctx_t *c) {
  nr_channel_t *ch = c->pipe->ch;
  bool embedded = c->embedded;
  ctx_unref(c);
  if (!embedded)
    nr_channel_release(ch);
}

/* "Loop thread only" (netrun.h): a pipeline is used on its channel's
 * loop, or anywhere before the channel is registered, while its creator
 * sets it up. Every public entry point asserts it (OWNED), as does every
 * handler call (enter); free under NDEBUG. */
static bool owned_here(const nr_pipeline_t *p) {
  nr_loop_t *l = p->ch != NULL ? nr_channel_loop(p->ch) : NULL;
  return l == NULL || !(p->ch->st & NR__REGISTERED) || nr_loop_in_thread(l);
}
#define OWNED(p) assert(owned_here(p))

static inline void enter(nr_pipeline_t *p) {
  assert(p->ch == NULL || p->ch->loop == NULL ||
         nr_loop_in_thread(p->ch->loop));
  p->depth++;
}

static void unwound(nr_pipeline_t *p);

static inline void leave(nr_pipeline_t *p) {
  if (--p->depth > 0 || (p->zombies == NULL && p->teardown == 0))
    return;
  unwound(p);
}

/* ---- invocation ----------------------------------------------------------- */

static inline nr_ctx_t *next_in(const nr_ctx_t *c, unsigned bit) {
  do
    c = c->next;
  while (!(c->mask & bit));
  return (nr_ctx_t *)c;
}

static inline nr_ctx_t *next_out(const nr_ctx_t *c, unsigned bit) {
  do
    c = c->prev;
  while (!(c->mask & bit));
  return (nr_ctx_t *)c;
}

/* What a handler that returned rc raised, else the code's description. */
static const char *raised_text(int rc) {
  const char *msg = nr__raised_msg(rc);
  return msg ? msg : nr_strerror(rc);
}

/* An exception raised while a handler's exception_caught runs (a response
 * it writes fails at once, say) goes past that handler: delivering it
 * there again would call it within itself without end -- a peer's reset
 * could make a handler that answers errors spin its loop. The tail, which
 * only logs, is never passed. */
static void invoke_exception(nr_ctx_t *c, const nr_err_t *err) {
  while (c->catching && c != &c->pipe->tail)
    c = next_in(c, NR_EV_EXCEPTION);
  nr_pipeline_t *p = c->pipe;
  enter(p);
  nr__raise_clear();
  bool was = c->catching;
  c->catching = true;
  int rc = c->h->exception(c, err);
  c->catching = was;
  if (rc != 0)
    nr_log(NR_LOG_WARN, "exception_caught of handler '%s' failed: %s "
           "(while handling: %s)", c->name, raised_text(rc), err->msg);
  leave(p);
}

/* Handler c returned rc from a callback: deliver it to c's own
 * exception_caught, or onwards if c has none. */
static void raise_from(nr_ctx_t *c, int rc) {
  const char *raised = nr__raised_msg(rc);
  nr_err_t err = {rc, nr_strerror(rc)};
  char copy[512];
  if (raised != NULL) {                /* the handler may raise again */
    snprintf(copy, sizeof copy, "%s", raised);
    err.msg = copy;
  }
  nr__raise_clear();
  invoke_exception(c->mask & NR_EV_EXCEPTION ? c : next_in(c, NR_EV_EXCEPTION),
                   &err);
}

#define INVOKE(c, call)                                                      \
  do {                                                                       \
    nr_pipeline_t *p_ = (c)->pipe;                                           \
    enter(p_);                                                               \
    int rc_ = (call);                                                        \
    if (rc_ != 0)                                                            \
      raise_from((c), rc_);                                                  \
    leave(p_);                                                               \
  } while (0)

/* Outbound failures fail the operation's promise; without one they are
 * delivered as exceptions, like Netty's void promise. */
/* The first error reported during the innermost nr_ctx_write_void. */
static _Thread_local int void_rc;

static int outbound_result(nr_ctx_t *c, int rc, nr_promise_t *prom) {
  if (rc == 0)
    return 0;
  if (void_rc == 0)
    void_rc = rc;
  if (prom != NULL) {
    nr_promise_set_failure(prom, rc, raised_text(rc));
    nr__raise_clear();
  } else {
    raise_from(c, rc);
  }
  return rc;
}

#define INVOKE_OUT(c, call, prom)                                            \
  do {                                                                       \
    nr_pipeline_t *p_ = (c)->pipe;                                           \
    enter(p_);                                                               \
    int rc_ = outbound_result((c), (call), (prom));                          \
    leave(p_);                                                               \
    return rc_;                                                              \
  } while (0)

void nr_ctx_fire_registered(nr_ctx_t *ctx) {
  OWNED(ctx->pipe);
  nr_ctx_t *c = next_in(ctx, NR_EV_REGISTERED);
  INVOKE(c, c->h->registered(c));
}
void nr_ctx_fire_unregistered(nr_ctx_t *ctx) {
  OWNED(ctx->pipe);
  nr_ctx_t *c = next_in(ctx, NR_EV_UNREGISTERED);
  INVOKE(c, c->h->unregistered(c));
}
void nr_ctx_fire_active(nr_ctx_t *ctx) {
  OWNED(ctx->pipe);
  nr_ctx_t *c = next_in(ctx, NR_EV_ACTIVE);
  INVOKE(c, c->h->active(c));
}
void nr_ctx_fire_inactive(nr_ctx_t *ctx) {
  OWNED(ctx->pipe);
  nr_ctx_t *c = next_in(ctx, NR_EV_INACTIVE);
  INVOKE(c, c->h->inactive(c));
}
void nr_ctx_fire_read(nr_ctx_t *ctx, void *msg) {
  OWNED(ctx->pipe);
  nr_ctx_t *c = next_in(ctx, NR_EV_READ);
  INVOKE(c, c->h->channel_read(c, msg));
}
void nr_ctx_fire_read_deferrable(nr_ctx_t *ctx, void *msg) {
  nr_pipeline_t *p = ctx->pipe;
  const void *outer = p->deferrable;
  p->deferrable = msg;
  nr_ctx_fire_read(ctx, msg);
  p->deferrable = outer;
}
bool nr_ctx_read_deferrable(const nr_ctx_t *ctx, const void *msg) {
  OWNED(ctx->pipe);
  return msg == ctx->pipe->deferrable;
}
void nr_ctx_fire_read_tokened(nr_ctx_t *ctx, void *msg, uint64_t token,
                              bool deferrable) {
  nr_pipeline_t *p = ctx->pipe;
  const void *outer = p->tokened, *outer_deferrable = p->deferrable;
  uint64_t outer_token = p->token;
  if (deferrable)
    p->deferrable = msg;
  p->tokened = msg;
  p->token = token;
  nr_ctx_fire_read(ctx, msg);
  p->deferrable = outer_deferrable;
  p->tokened = outer;
  p->token = outer_token;
}
uint64_t nr_ctx_read_token(const nr_ctx_t *ctx, const void *msg) {
  OWNED(ctx->pipe);
  return msg == ctx->pipe->tokened ? ctx->pipe->token : 0;
}
uint64_t nr_ctx_reading(const nr_ctx_t *ctx) {
  return ctx->pipe->token;
}
uint64_t nr_ctx_set_reading(nr_ctx_t *ctx, uint64_t token) {
  OWNED(ctx->pipe);
  uint64_t outer = ctx->pipe->token;
  ctx->pipe->token = token;
  return outer;
}
/* To the nearest handler before ctx that asked (a removed ctx keeps its
 * way back). */
void nr_ctx_read_failed(nr_ctx_t *ctx, uint64_t token) {
  OWNED(ctx->pipe);
  for (nr_ctx_t *c = ctx->prev; c != NULL && !c->embedded; c = c->prev)
    if (c->h->read_failed != NULL && !c->removed) {
      nr_pipeline_t *p = c->pipe;
      enter(p);
      c->h->read_failed(c, token);
      leave(p);
      return;
    }
}
void nr_ctx_fire_read_complete(nr_ctx_t *ctx) {
  OWNED(ctx->pipe);
  nr_ctx_t *c = next_in(ctx, NR_EV_READ_COMPLETE);
  INVOKE(c, c->h->channel_read_complete(c));
}
void nr_ctx_fire_user_event(nr_ctx_t *ctx, void *evt) {
  OWNED(ctx->pipe);
  nr_ctx_t *c = next_in(ctx, NR_EV_USER_EVENT);
  INVOKE(c, c->h->user_event(c, evt));
}
void nr_ctx_fire_writability_changed(nr_ctx_t *ctx) {
  OWNED(ctx->pipe);
  nr_ctx_t *c = next_in(ctx, NR_EV_WRITABILITY);
  INVOKE(c, c->h->writability_changed(c));
}
void nr_ctx_fire_exception(nr_ctx_t *ctx, const nr_err_t *err) {
  OWNED(ctx->pipe);
  invoke_exception(next_in(ctx, NR_EV_EXCEPTION), err);
}

/* The void promise stands for none (see nr_promise_void). */
static nr_promise_t *real(nr_promise_t *p) {
  return p != NULL && nr_promise_is_void(p) ? NULL : p;
}

int nr_ctx_bind(nr_ctx_t *ctx, const struct sockaddr *sa, socklen_t len,
                nr_promise_t *prom) {
  OWNED(ctx->pipe);
  prom = real(prom);
  nr_ctx_t *c = next_out(ctx, NR_OP_BIND);
  INVOKE_OUT(c, c->h->bind(c, sa, len, prom), prom);
}
int nr_ctx_connect(nr_ctx_t *ctx, const struct sockaddr *sa, socklen_t len,
                   nr_promise_t *prom) {
  OWNED(ctx->pipe);
  prom = real(prom);
  nr_ctx_t *c = next_out(ctx, NR_OP_CONNECT);
  INVOKE_OUT(c, c->h->connect(c, sa, len, prom), prom);
}
int nr_ctx_disconnect(nr_ctx_t *ctx, nr_promise_t *prom) {
  OWNED(ctx->pipe);
  prom = real(prom);
  nr_ctx_t *c = next_out(ctx, NR_OP_DISCONNECT);
  INVOKE_OUT(c, c->h->disconnect(c, prom), prom);
}
int nr_ctx_close(nr_ctx_t *ctx, nr_promise_t *prom) {
  OWNED(ctx->pipe);
  prom = real(prom);
  nr_ctx_t *c = next_out(ctx, NR_OP_CLOSE);
  INVOKE_OUT(c, c->h->close(c, prom), prom);
}
int nr_ctx_read(nr_ctx_t *ctx) {
  OWNED(ctx->pipe);
  nr_ctx_t *c = next_out(ctx, NR_OP_READ);
  INVOKE_OUT(c, c->h->read(c), NULL);
}
int nr_ctx_write(nr_ctx_t *ctx, void *msg, nr_promise_t *prom) {
  OWNED(ctx->pipe);
  prom = real(prom);
  nr_ctx_t *c = next_out(ctx, NR_OP_WRITE);
  INVOKE_OUT(c, c->h->write(c, msg, prom), prom);
}
int nr_ctx_flush(nr_ctx_t *ctx) {
  OWNED(ctx->pipe);
  nr_ctx_t *c = next_out(ctx, NR_OP_FLUSH);
  INVOKE_OUT(c, c->h->flush(c), NULL);
}
int nr_ctx_write_void(nr_ctx_t *ctx, void *msg) {
  int saved = void_rc;
  void_rc = 0;
  nr_ctx_write(ctx, msg, NULL);
  int rc = void_rc;
  void_rc = saved;
  return rc;
}

bool nr_ctx_writes_to_head(const nr_ctx_t *ctx) {
  OWNED(ctx->pipe);
  const nr_ctx_t *c = next_out(ctx, NR_OP_WRITE);
  while (!c->embedded && (c->h->flags & NR_HANDLER_SYNC_WRITE))
    c = next_out(c, NR_OP_WRITE);
  return c->embedded && c->h == &nr__head_handler && c->pipe->ch &&
         !nr_channel_is_datagram(c->pipe->ch) && !nr_channel_is_server(c->pipe->ch);
}

int nr_ctx_write_and_flush(nr_ctx_t *ctx, void *msg, nr_promise_t *prom) {
  int rc = nr_ctx_write(ctx, msg, prom);
  nr_ctx_flush(ctx);
  return rc;
}

/* Pipeline-level entry points: inbound from the head, outbound from the
 * tail. */
void nr_pipeline_fire_read(nr_pipeline_t *p, void *msg) {
  nr_ctx_fire_read(&p->head, msg);
}
void nr_pipeline_fire_read_deferrable(nr_pipeline_t *p, void *msg) {
  nr_ctx_fire_read_deferrable(&p->head, msg);
}
void nr_pipeline_fire_user_event(nr_pipeline_t *p, void *evt) {
  nr_ctx_fire_user_event(&p->head, evt);
}
void nr_pipeline_fire_exception(nr_pipeline_t *p, const nr_err_t *err) {
  nr_ctx_fire_exception(&p->head, err);
}
void nr__pipeline_fire_registered(nr_pipeline_t *p) {
  nr_ctx_fire_registered(&p->head);
}
void nr__pipeline_fire_unregistered(nr_pipeline_t *p) {
  nr_ctx_fire_unregistered(&p->head);
}
void nr__pipeline_fire_active(nr_pipeline_t *p) { nr_ctx_fire_active(&p->head); }
void nr__pipeline_fire_inactive(nr_pipeline_t *p) {
  nr_ctx_fire_inactive(&p->head);
}
void nr__pipeline_fire_read_complete(nr_pipeline_t *p) {
  nr_ctx_fire_read_complete(&p->head);
}
void nr__pipeline_fire_writability(nr_pipeline_t *p) {
  nr_ctx_fire_writability_changed(&p->head);
}
int nr_pipeline_write(nr_pipeline_t *p, void *msg, nr_promise_t *prom) {
  return nr_ctx_write(&p->tail, msg, prom);
}
int nr_pipeline_flush(nr_pipeline_t *p) { return nr_ctx_flush(&p->tail); }
int nr_pipeline_close(nr_pipeline_t *p, nr_promise_t *prom) {
  return nr_ctx_close(&p->tail, prom);
}
int nr__pipeline_bind(nr_pipeline_t *p, const struct sockaddr *sa,
                      socklen_t len, nr_promise_t *prom) {
  return nr_ctx_bind(&p->tail, sa, len, prom);
}
int nr__pipeline_connect(nr_pipeline_t *p, const struct sockaddr *sa,
                         socklen_t len, nr_promise_t *prom) {
  return nr_ctx_connect(&p->tail, sa, len, prom);
}

/* ---- the tail: what nobody handled ---------------------------------------- */

static int tail_channel_read(nr_ctx_t *c, void *msg) {
  (void)msg;
  nr_log(NR_LOG_DEBUG, "channel %llu: an inbound message reached the tail "
         "of the pipeline and was discarded",
         (unsigned long long)nr_channel_id(c->pipe->ch));
  return 0;
}
static int tail_exception(nr_ctx_t *c, const nr_err_t *err) {
  nr_log(NR_LOG_WARN, "channel %llu: an exception reached the tail of the "
         "pipeline: %s", (unsigned long long)nr_channel_id(c->pipe->ch),
         err->msg ? err->msg : nr_strerror(err->code));
  return 0;
}
static int tail_ignore(nr_ctx_t *c) { (void)c; return 0; }
static int tail_ignore_evt(nr_ctx_t *c, void *e) { (void)c; (void)e; return 0; }

static const nr_handler_t tail_handler = {
    .type = "tail", .registered = tail_ignore, .unregistered = tail_ignore,
    .active = tail_ignore, .inactive = tail_ignore,
    .channel_read = tail_channel_read,
    .channel_read_complete = tail_ignore, .user_event = tail_ignore_evt,
    .writability_changed = tail_ignore, .exception = tail_exception};

void nr__pipeline_init(nr_pipeline_t *p, nr_channel_t *ch,
                       const nr_handler_t *head) {
  memset(p, 0, sizeof *p);
  p->ch = ch;
  p->head = (nr_ctx_t){.next = &p->tail, .pipe = p, .h = head,
                       .name = "head", .mask = NR_OP_ALL_OUTBOUND,
                       .embedded = true, .refs = 1};
  p->tail = (nr_ctx_t){.prev = &p->head, .pipe = p, .h = &tail_handler,
                       .name = "tail", .mask = NR_EV_ALL_INBOUND,
                       .embedded = true, .refs = 1};
}

/* ---- mutation ------------------------------------------------------------- */

static nr_ctx_t *find(nr_pipeline_t *p, const char *name) {
  for (nr_ctx_t *c = p->head.next; c != &p->tail; c = c->next)
    if (strcmp(c->name, name) == 0)
      return c;
  return NULL;
}

static int link_new(nr_pipeline_t *p, nr_ctx_t *prev, const char *name,
                    const nr_handler_t *h, void *state) {
  if (!owned_here(p))
    return -EPERM;
  if (p->destroyed)
    return -ESHUTDOWN;             /* nothing would ever remove it */
  char auto_name[64];
  if (name == NULL) {
    snprintf(auto_name, sizeof auto_name, "%s#%u", h->type ? h->type : "handler",
             p->auto_names++);
    name = auto_name;
  }
  if (find(p, name) != NULL)
    return -EEXIST;
  nr_ctx_t *c = calloc(1, sizeof *c);
  if (c == NULL || (c->name = strdup(name)) == NULL) {
    free(c);
    return -ENOMEM;
  }
  c->pipe = p;
  c->h = h;
  c->state = state;
  c->mask = h->mask ? h->mask(h, state) : nr_handler_mask(h);
  c->refs = 1;                             /* the pipeline's */
  c->prev = prev;
  c->next = prev->next;
  prev->next->prev = c;
  prev->next = c;
  if (h->added) {
    enter(p);
    h->added(c);
    leave(p);
  }
  return 0;
}

int nr_pipeline_add_first(nr_pipeline_t *p, const char *name,
                          const nr_handler_t *h, void *state) {
  return link_new(p, &p->head, name, h, state);
}
int nr_pipeline_add_last(nr_pipeline_t *p, const char *name,
                         const nr_handler_t *h, void *state) {
  return link_new(p, p->tail.prev, name, h, state);
}
int nr_pipeline_add_before(nr_pipeline_t *p, const char *base,
                           const char *name, const nr_handler_t *h,
                           void *state) {
  nr_ctx_t *b = find(p, base);
  return b ? link_new(p, b->prev, name, h, state) : -ENOENT;
}
int nr_pipeline_add_after(nr_pipeline_t *p, const char *base,
                          const char *name, const nr_handler_t *h,
                          void *state) {
  nr_ctx_t *b = find(p, base);
  return b ? link_new(p, b, name, h, state) : -ENOENT;
}

static void unlink_ctx(nr_pipeline_t *p, nr_ctx_t *c) {
  c->prev->next = c->next;
  c->next->prev = c->prev;
  c->removed = true;
  c->mask = 0;               /* an event or write still headed this way (from a
                                removed ctx's stale links) passes it by: its
                                handler's state is freed just below */
  c->prev->refs++;                         /* keep the way on alive */
  c->next->refs++;
  if (c->h->removed) {
    enter(p);
    c->h->removed(c);
    leave(p);
  }
  if (p->depth > 0) {
    c->zombie_next = p->zombies;           /* the pipeline's ref moves here */
    p->zombies = c;
  } else {
    ctx_unref(c);
  }
}

int nr_pipeline_remove(nr_pipeline_t *p, const char *name) {
  OWNED(p);
  nr_ctx_t *c = find(p, name);
  if (c == NULL)
    return -ENOENT;
  unlink_ctx(p, c);
  return 0;
}

int nr_pipeline_replace(nr_pipeline_t *p, const char *old_name,
                        const char *new_name, const nr_handler_t *h,
                        void *state) {
  OWNED(p);
  nr_ctx_t *c = find(p, old_name);
  if (c == NULL)
    return -ENOENT;
  nr_ctx_t *other = find(p, new_name);
  if (other != NULL && other != c)
    return -EEXIST;
  char tmp[64];
  snprintf(tmp, sizeof tmp, "\x01replacing#%u", p->auto_names++);
  int rc = link_new(p, c, tmp, h, state);   /* in place, after the old one */
  if (rc < 0)
    return rc;
  nr_ctx_t *n = c->next;
  unlink_ctx(p, c);
  char *name = strdup(new_name);
  if (name != NULL) {
    free(n->name);
    n->name = name;
  }
  return 0;
}

void nr__pipeline_destroy(nr_pipeline_t *p) {
  p->destroyed = true;
  while (p->tail.prev != &p->head)
    unlink_ctx(p, p->tail.prev);
}

static void teardown_now(nr_pipeline_t *p, unsigned what) {
  if (what & NR__TD_INACTIVE)
    nr__pipeline_fire_inactive(p);
  if (what & NR__TD_UNREGISTERED)
    nr__pipeline_fire_unregistered(p);
  if (what & NR__TD_DESTROY)
    nr__pipeline_destroy(p);
}

void nr__pipeline_teardown(nr_pipeline_t *p, unsigned what) {
  if (p->depth == 0) {
    teardown_now(p, what);
  } else if (p->teardown == 0) {
    p->teardown = what;
    nr_channel_retain(p->ch);          /* for unwound */
  }
}

/* The outermost handler call returned: free what was removed during it,
 * then carry out a close made during it (last: it may free the channel
 * and with it p). */
static void unwound(nr_pipeline_t *p) {
  nr_ctx_t *z = p->zombies;
  p->zombies = NULL;
  for (nr_ctx_t *n; z; z = n) {
    n = z->zombie_next;
    ctx_unref(z);
  }
  unsigned what = p->teardown;
  if (what != 0) {
    nr_channel_t *ch = p->ch;
    p->teardown = 0;
    teardown_now(p, what);
    nr_channel_release(ch);
  }
}

nr_ctx_t *nr_pipeline_context(nr_pipeline_t *p, const char *name) {
  OWNED(p);
  return find(p, name);
}
nr_ctx_t *nr_pipeline_first(nr_pipeline_t *p) {
  OWNED(p);
  return p->head.next == &p->tail ? NULL : p->head.next;
}
nr_ctx_t *nr_pipeline_last(nr_pipeline_t *p) {
  OWNED(p);
  return p->tail.prev == &p->head ? NULL : p->tail.prev;
}
nr_channel_t *nr_pipeline_channel(nr_pipeline_t *p) { return p->ch; }

const char *nr_ctx_name(const nr_ctx_t *c) { return c->name; }
void *nr_ctx_state(const nr_ctx_t *c) { return c->state; }
const nr_handler_t *nr_ctx_handler(const nr_ctx_t *c) { return c->h; }
nr_channel_t *nr_ctx_channel(const nr_ctx_t *c) { return c->pipe->ch; }
nr_pipeline_t *nr_ctx_pipeline(const nr_ctx_t *c) { return c->pipe; }
bool nr_ctx_is_removed(const nr_ctx_t *c) { return c->removed; }
nr_ctx_t *nr_ctx_next(const nr_ctx_t *c) {
  return c->removed || c->next == &c->pipe->tail ? NULL : c->next;
}

nr_ctx_t *nr_pipeline_head(nr_pipeline_t *p) { return &p->head; }
nr_ctx_t *nr_pipeline_tail(nr_pipeline_t *p) { return &p->tail; }
