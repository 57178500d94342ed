/*
 * test_pipeline.c -- the handler pipeline (runtime/pipeline.c) without
 * sockets: skip masks, a handler removed while an event is passing through
 * it, where an error a handler raises goes, and nr_ctx_writes_to_head.
 *
 * Handlers here are tiny C vtables that append "<name>:<event>" to one log
 * and pass the event on; each test drives an embedded channel on the
 * test's own external loop and checks the log, the counters and what
 * reached the tail. Every test ends by freeing its channels and its loop
 * (ASan in the sanitizer build proves nothing is touched after).
 */
#include "internal.h"
#include "test.h"

/* ---- a logging handler ------------------------------------------------------- */

static char elog[1024];                  /* "a:read b:read ..." */

static void note(const char *name, const char *event) {
  size_t n = strlen(elog);
  snprintf(elog + n, sizeof elog - n, "%s%s:%s", n ? " " : "", name, event);
}

typedef struct th_s {
  const char *name;
  int reads, events, exceptions, removed, writes;
  int raise_on_read;                     /* nr_raise this code from read */
  const char *remove_on_read;            /* remove this handler from read */
  int last_code;
  char last_msg[128];
} th_t;

static th_t *th_new(const char *name) {
  th_t *t = calloc(1, sizeof *t);
  t->name = name;
  return t;
}

static int th_read(nr_ctx_t *ctx, void *msg) {
  th_t *t = nr_ctx_state(ctx);
  t->reads++;
  note(t->name, "read");
  if (t->raise_on_read)
    return nr_raise(t->raise_on_read, "%s refused the message", t->name);
  /* removed() frees the state at once, even our own: touch t no more. The
   * ctx stays valid until this call returns. */
  if (t->remove_on_read)
    CHECK_EQ(nr_pipeline_remove(nr_ctx_pipeline(ctx), t->remove_on_read), 0);
  nr_ctx_fire_read(ctx, msg);
  return 0;
}

static int th_event(nr_ctx_t *ctx, void *evt) {
  th_t *t = nr_ctx_state(ctx);
  t->events++;
  note(t->name, "event");
  nr_ctx_fire_user_event(ctx, evt);
  return 0;
}

static int th_exception(nr_ctx_t *ctx, const nr_err_t *err) {
  th_t *t = nr_ctx_state(ctx);
  (void)ctx;
  t->exceptions++;
  t->last_code = err->code;
  snprintf(t->last_msg, sizeof t->last_msg, "%s", err->msg ? err->msg : "");
  note(t->name, "exception");
  return 0;                              /* handled: it goes no further */
}

static int th_write(nr_ctx_t *ctx, void *msg, nr_promise_t *p) {
  th_t *t = nr_ctx_state(ctx);
  t->writes++;
  note(t->name, "write");
  return nr_ctx_write(ctx, msg, p);
}

/* The pipeline frees the state once the handler is out and no call is in
 * progress: the count of removals is kept outside it. */
static int removed_total;
static void th_removed(nr_ctx_t *ctx) {
  th_t *t = nr_ctx_state(ctx);
  t->removed++;
  removed_total++;
  note(t->name, "removed");
  free(t);
}

static const nr_handler_t reader = {
    .type = "reader", .channel_read = th_read, .removed = th_removed};
static const nr_handler_t evented = {
    .type = "evented", .user_event = th_event, .removed = th_removed};
static const nr_handler_t catcher = {
    .type = "catcher", .channel_read = th_read, .exception = th_exception,
    .removed = th_removed};
static const nr_handler_t writer = {
    .type = "writer", .write = th_write, .removed = th_removed};
static const nr_handler_t sync_writer = {
    .type = "sync_writer", .write = th_write, .removed = th_removed,
    .flags = NR_HANDLER_SYNC_WRITE};

/* Implements read and user_event but asks, through mask(), for user events
 * only: its read must never be called. */
static unsigned events_only(const nr_handler_t *h, void *state) {
  (void)h, (void)state;
  return NR_EV_USER_EVENT;
}
static const nr_handler_t masked = {
    .type = "masked", .channel_read = th_read, .user_event = th_event,
    .removed = th_removed, .mask = events_only};

/* ---- helpers ------------------------------------------------------------------ */

static nr_loop_t *loop_new(void) {
  elog[0] = 0;
  removed_total = 0;
  return nr_loop_new(&(nr_loop_opts_t){.name = "main", .external = true});
}

static nr_pipeline_t *pipe_of(nr_embedded_t *e) {
  return nr_channel_pipeline(nr_embedded_channel(e));
}

static void add(nr_pipeline_t *p, const char *name, const nr_handler_t *h,
                th_t *t) {
  CHECK_EQ(nr_pipeline_add_last(p, name, h, t), 0);
}

static void send_text(nr_embedded_t *e, const char *s) {
  nr_bytes_t b = NR_BYTES(s, strlen(s));
  nr_embedded_write_inbound(e, &b, false);
}

/* The next message that reached the tail, as a string ("" when none). */
static const char *tail_text(nr_embedded_t *e) {
  static char buf[256];
  size_t n = 0;
  char *m = nr_embedded_read_inbound(e, &n);
  snprintf(buf, sizeof buf, "%.*s", (int)n, m ? m : "");
  free(m);
  return buf;
}

/* ---- skip masks ---------------------------------------------------------------- */

TEST(a_handler_sees_only_the_events_its_mask_names) {
  CHECK_EQ(nr_handler_mask(&reader), NR_EV_READ);
  CHECK_EQ(nr_handler_mask(&catcher), NR_EV_READ | NR_EV_EXCEPTION);
  CHECK_EQ(nr_handler_mask(&writer), NR_OP_WRITE);
  nr_loop_t *loop = loop_new();
  nr_embedded_t *e = nr_embedded_new(loop, NULL);
  nr_pipeline_t *p = pipe_of(e);
  th_t *r = th_new("r"), *v = th_new("v"), *m = th_new("m");
  add(p, "r", &reader, r);
  add(p, "v", &evented, v);
  add(p, "m", &masked, m);
  nr_embedded_start(e);
  send_text(e, "one");
  nr_event_t ev = {NR_MSG_EVENT, 0};
  nr_pipeline_fire_user_event(p, &ev);
  send_text(e, "two");
  /* r reads, v is skipped by reads, m's read is masked out. */
  CHECK_STR(elog, "r:read v:event m:event r:read");
  CHECK_EQ(r->reads, 2);
  CHECK_EQ(r->events, 0);
  CHECK_EQ(v->reads, 0);
  CHECK_EQ(v->events, 1);
  CHECK_EQ(m->reads, 0);
  CHECK_EQ(m->events, 1);
  CHECK_STR(tail_text(e), "one");
  CHECK_STR(tail_text(e), "two");
  CHECK_STR(tail_text(e), "");
  nr_embedded_free(e);
  CHECK_EQ(removed_total, 3);              /* each handler told once */
  nr_loop_free(loop);
}

/* ---- removal while an event passes ----------------------------------------------- */

/* A handler that removes itself in read and then passes the message on:
 * the message still reaches the rest through the removed ctx, which stays
 * valid until the call returns (it is parked, then freed: ASan would see
 * a use after free otherwise), and the handler hears removed once. */
TEST(a_handler_removing_itself_mid_read_still_passes_the_message_on) {
  nr_loop_t *loop = loop_new();
  nr_embedded_t *e = nr_embedded_new(loop, NULL);
  nr_pipeline_t *p = pipe_of(e);
  th_t *a = th_new("a"), *b = th_new("b");
  a->remove_on_read = "a";
  add(p, "a", &reader, a);
  add(p, "b", &reader, b);
  nr_embedded_start(e);
  send_text(e, "x");
  CHECK_STR(elog, "a:read a:removed b:read");
  CHECK_STR(tail_text(e), "x");
  CHECK(nr_pipeline_context(p, "a") == NULL);
  CHECK(nr_pipeline_first(p) == nr_pipeline_context(p, "b"));
  send_text(e, "y");                       /* straight to b now */
  CHECK_STR(elog, "a:read a:removed b:read b:read");
  CHECK_STR(tail_text(e), "y");
  CHECK_EQ(removed_total, 1);
  nr_embedded_free(e);
  CHECK_EQ(removed_total, 2);
  nr_loop_free(loop);
}

/* A handler that removes the one after it: the message it passes on goes
 * to the one after that, as Netty's would. */
TEST(a_handler_removing_the_next_one_mid_read_skips_it) {
  nr_loop_t *loop = loop_new();
  nr_embedded_t *e = nr_embedded_new(loop, NULL);
  nr_pipeline_t *p = pipe_of(e);
  th_t *a = th_new("a"), *b = th_new("b"), *c = th_new("c");
  a->remove_on_read = "b";
  add(p, "a", &reader, a);
  add(p, "b", &reader, b);
  add(p, "c", &reader, c);
  nr_embedded_start(e);
  send_text(e, "x");
  CHECK_STR(elog, "a:read b:removed c:read");
  CHECK_STR(tail_text(e), "x");
  CHECK_EQ(c->reads, 1);
  nr_embedded_free(e);
  CHECK_EQ(removed_total, 3);
  nr_loop_free(loop);
}

/* Removing a handler from outside any event frees it at once; removing an
 * unknown one is -ENOENT and changes nothing. */
TEST(removal_outside_an_event_and_of_an_unknown_name) {
  nr_loop_t *loop = loop_new();
  nr_embedded_t *e = nr_embedded_new(loop, NULL);
  nr_pipeline_t *p = pipe_of(e);
  add(p, "a", &reader, th_new("a"));
  CHECK_EQ(nr_pipeline_add_last(p, "a", &reader, NULL), -EEXIST);
  nr_embedded_start(e);
  CHECK_EQ(nr_pipeline_remove(p, "nope"), -ENOENT);
  CHECK_EQ(nr_pipeline_remove(p, "a"), 0);
  CHECK_EQ(removed_total, 1);
  CHECK(nr_pipeline_first(p) == NULL);
  send_text(e, "z");
  CHECK_STR(tail_text(e), "z");
  nr_embedded_free(e);
  nr_loop_free(loop);
}

/* A closed channel's pipeline has had its handlers removed: one added now
 * would never be removed (nor its state freed), so the add is refused and
 * the caller keeps the state. */
TEST(adding_to_a_closed_channels_pipeline_is_refused) {
  nr_loop_t *loop = loop_new();
  nr_embedded_t *e = nr_embedded_new(loop, NULL);
  nr_pipeline_t *p = pipe_of(e);
  add(p, "a", &reader, th_new("a"));
  nr_embedded_start(e);
  nr_embedded_close(e);
  CHECK_EQ(removed_total, 1);
  CHECK_EQ(nr_pipeline_add_last(p, "b", &reader, NULL), -ESHUTDOWN);
  CHECK_EQ(nr_pipeline_add_first(p, "b", &reader, NULL), -ESHUTDOWN);
  CHECK(nr_pipeline_first(p) == NULL);
  nr_embedded_free(e);
  nr_loop_free(loop);
}

/* ---- exception routing ---------------------------------------------------------- */

/* An outbound handler that refuses every write, and a handler that answers
 * each exception with a write (an error response): that write fails at
 * once, inside exception_caught. */
static int refuse_write(nr_ctx_t *ctx, void *msg, nr_promise_t *p) {
  (void)ctx, (void)msg, (void)p;
  return nr_raise(-EPIPE, "refused");
}
static const nr_handler_t refuser = {.type = "refuser", .write = refuse_write};

static int answer_exception(nr_ctx_t *ctx, const nr_err_t *err) {
  th_t *t = nr_ctx_state(ctx);
  (void)err;
  if (++t->exceptions > 3)               /* without the guard: stop somewhere */
    return 0;
  nr_bytes_t b = NR_BYTES("error", 5);
  nr_ctx_write(ctx, &b, NULL);
  return 0;
}
static const nr_handler_t answerer = {
    .type = "answerer", .exception = answer_exception, .removed = th_removed};

/* The write's failure goes past the handler whose exception_caught is
 * running, to the tail, instead of into that exception_caught again (and
 * again: a peer's reset spun a loop that way). */
TEST(an_exception_raised_inside_exception_caught_goes_past_it) {
  nr_loop_t *loop = loop_new();
  nr_embedded_t *e = nr_embedded_new(loop, NULL);
  nr_pipeline_t *p = pipe_of(e);
  CHECK_EQ(nr_pipeline_add_last(p, "refuser", &refuser, NULL), 0);
  th_t *t = th_new("answerer");
  add(p, "answerer", &answerer, t);
  nr_embedded_start(e);
  nr_pipeline_fire_exception(p, &(nr_err_t){-ECONNRESET, "reset"});
  CHECK_EQ(t->exceptions, 1);
  nr_err_t tail = nr_embedded_error(e);
  CHECK_EQ(tail.code, -EPIPE);
  CHECK_STR(tail.msg, "refused");
  nr_pipeline_fire_exception(p, &(nr_err_t){-ECONNRESET, "again"});
  CHECK_EQ(t->exceptions, 2);            /* the next one reaches it again */
  nr_embedded_free(e);
  nr_loop_free(loop);
}

/* An error raised in read goes to the raising handler's own
 * exception_caught, with the message it raised. */
TEST(an_error_raised_in_read_goes_to_the_raisers_exception_caught) {
  nr_loop_t *loop = loop_new();
  nr_embedded_t *e = nr_embedded_new(loop, NULL);
  nr_pipeline_t *p = pipe_of(e);
  th_t *a = th_new("a"), *b = th_new("b");
  a->raise_on_read = NR_ETOOLONG;
  add(p, "a", &catcher, a);
  add(p, "b", &catcher, b);
  nr_embedded_start(e);
  send_text(e, "x");
  CHECK_STR(elog, "a:read a:exception");
  CHECK_EQ(a->last_code, NR_ETOOLONG);
  CHECK_STR(a->last_msg, "a refused the message");
  CHECK_EQ(b->exceptions, 0);
  CHECK_EQ(nr_embedded_error(e).code, 0);   /* handled: not at the tail */
  nr_embedded_free(e);
  nr_loop_free(loop);
}

/* A raiser without exception_caught: the error goes on to the next
 * handler that has one; with none at all it reaches the tail, message
 * intact. A code raised without a message gets its description. */
TEST(an_error_goes_to_the_next_exception_caught_then_the_tail) {
  nr_loop_t *loop = loop_new();
  nr_embedded_t *e = nr_embedded_new(loop, NULL);
  nr_pipeline_t *p = pipe_of(e);
  th_t *a = th_new("a"), *b = th_new("b"), *c = th_new("c");
  a->raise_on_read = -EPROTO;
  add(p, "a", &reader, a);                 /* no exception_caught */
  add(p, "b", &reader, b);
  add(p, "c", &catcher, c);
  nr_embedded_start(e);
  send_text(e, "x");
  CHECK_STR(elog, "a:read c:exception");
  CHECK_EQ(c->last_code, -EPROTO);
  CHECK_STR(c->last_msg, "a refused the message");
  CHECK_EQ(b->reads, 0);
  nr_embedded_free(e);

  elog[0] = 0;
  e = nr_embedded_new(loop, NULL);
  p = pipe_of(e);
  a = th_new("a");
  a->raise_on_read = -EPROTO;
  add(p, "a", &reader, a);
  nr_embedded_start(e);
  send_text(e, "x");
  nr_err_t err = nr_embedded_error(e);
  CHECK_EQ(err.code, -EPROTO);
  CHECK_STR(err.msg, "a refused the message");
  CHECK_STR(tail_text(e), "");             /* the message went no further */
  nr_embedded_free(e);
  nr_loop_free(loop);
}

/* A failed outbound operation fails its promise with the raised message;
 * without a promise it is delivered as an exception (Netty's void
 * promise). An embedded channel's head cannot take a datagram without a
 * sink, which makes a handy failure. */
TEST(an_outbound_failure_fails_the_promise_or_goes_to_exception_caught) {
  nr_loop_t *loop = loop_new();
  nr_embedded_t *e = nr_embedded_new(loop, NULL);
  nr_pipeline_t *p = pipe_of(e);
  th_t *c = th_new("c");
  add(p, "c", &catcher, c);
  nr_embedded_start(e);
  nr_datagram_t d = {.type = NR_MSG_DATAGRAM};
  nr_promise_t *prom = nr_promise_new();
  CHECK_EQ(nr_pipeline_write(p, &d, prom), -EINVAL);
  CHECK(nr_promise_is_done(prom));
  CHECK_EQ(nr_promise_code(prom), -EINVAL);
  CHECK_CONTAINS(nr_promise_message(prom), "cannot capture a message");
  CHECK_EQ(c->exceptions, 0);
  nr_promise_release(prom);
  CHECK_EQ(nr_pipeline_write(p, &d, NULL), -EINVAL);
  CHECK_EQ(c->exceptions, 1);
  CHECK_EQ(c->last_code, -EINVAL);
  CHECK_CONTAINS(c->last_msg, "cannot capture a message");
  /* nr_ctx_write_void reports what a handler on the way returned. */
  CHECK_EQ(nr_ctx_write_void(nr_pipeline_tail(p), &d), -EINVAL);
  CHECK_EQ(c->exceptions, 2);
  nr_embedded_free(e);
  nr_loop_free(loop);
}

/* ---- writes_to_head ---------------------------------------------------------------- */

/* A stream channel's own head (no socket needed: the channel is never
 * registered, and nothing here flushes): a write from a ctx reaches it
 * through no outbound handler, or only through NR_HANDLER_SYNC_WRITE ones.
 * The write mark then tells where the write ended. */
TEST(writes_to_head_through_none_or_only_sync_write_handlers) {
  nr_loop_t *loop = loop_new();
  nr_channel_t *ch = nr__channel_new(NR__STREAM, AF_INET, -1, NULL);
  CHECK(ch != NULL);
  ch->loop = loop;
  nr_pipeline_t *p = nr_channel_pipeline(ch);
  th_t *r = th_new("r");
  add(p, "r", &reader, r);
  nr_ctx_t *rc = nr_pipeline_context(p, "r");
  CHECK(nr_ctx_writes_to_head(rc));
  CHECK(nr_ctx_writes_to_head(nr_pipeline_tail(p)));
  add(p, "s", &sync_writer, th_new("s"));
  CHECK(nr_ctx_writes_to_head(nr_pipeline_tail(p)));    /* through s */
  CHECK(nr_ctx_writes_to_head(rc));                     /* s is after r */
  nr_bytes_t b = NR_BYTES("hello", 5);
  CHECK_EQ(nr_pipeline_write(p, &b, NULL), 0);
  CHECK_EQ(nr_channel_write_mark(ch), 5);               /* landed at once */
  CHECK_STR(elog, "s:write");
  CHECK_EQ(nr_pipeline_add_first(p, "w", &writer, th_new("w")), 0);
  CHECK(!nr_ctx_writes_to_head(nr_pipeline_tail(p)));   /* w may hold it */
  CHECK(!nr_ctx_writes_to_head(rc));
  CHECK_EQ(nr_pipeline_remove(p, "w"), 0);
  CHECK(nr_ctx_writes_to_head(rc));
  nr__pipeline_destroy(p);              /* what a close would do */
  nr__out_fail_all(loop, &ch->out, NR_ECLOSED, NULL);
  nr_channel_release(ch);               /* never registered: freed here */
  CHECK_EQ(removed_total, 3);

  /* Not a stream: a datagram channel, an embedded one. */
  ch = nr__channel_new(NR__DGRAM, AF_INET, -1, NULL);
  ch->loop = loop;
  CHECK(!nr_ctx_writes_to_head(nr_pipeline_tail(nr_channel_pipeline(ch))));
  nr_channel_release(ch);
  nr_embedded_t *e = nr_embedded_new(loop, NULL);
  CHECK(!nr_ctx_writes_to_head(nr_pipeline_tail(pipe_of(e))));
  nr_embedded_free(e);
  nr_loop_free(loop);
}

/* ---- closing once the work held is done ---------------------------------------- */

static int th_close(nr_ctx_t *ctx, nr_promise_t *p) {
  note(((th_t *)nr_ctx_state(ctx))->name, "close");
  return nr_ctx_close(ctx, p);
}
static const nr_handler_t closer = {
    .type = "closer", .close = th_close, .removed = th_removed};

static void run_tasks(nr_loop_t *loop) {
  for (int i = 0; i < 8 && nr_loop_has_pending_tasks(loop); i++)
    nr_loop_run_once(loop, 0);
}

/* What TLS does at the peer's close_notify: the channel closes once the
 * answers owed are out -- after the current call, and after the last
 * hold -- and through its pipeline, so that a handler's close (TLS's own
 * close_notify) runs. */
TEST(close_when_idle_waits_for_the_call_and_the_holds_then_closes_through_the_pipeline) {
  nr_loop_t *loop = loop_new();
  for (int held = 0; held < 2; held++) {
    elog[0] = 0;
    nr_embedded_t *e = nr_embedded_new(loop, NULL);
    nr_channel_t *ch = nr_embedded_channel(e);
    add(pipe_of(e), "c", &closer, th_new("c"));
    nr_embedded_start(e);
    if (held)
      nr_channel_hold(ch);             /* an answer owed */
    nr_channel_close_when_idle(ch);
    CHECK(nr_channel_is_open(ch));      /* not inside the caller's call */
    run_tasks(loop);
    CHECK_EQ(nr_channel_is_open(ch), held == 1);
    if (held) {
      CHECK_STR(elog, "");
      nr_channel_unhold(ch);            /* the answer went out */
      CHECK(nr_channel_is_open(ch));
      run_tasks(loop);
      CHECK(!nr_channel_is_open(ch));
    }
    CHECK_STR(elog, "c:close c:removed");
    nr_channel_close_when_idle(ch);     /* closed: nothing more */
    run_tasks(loop);
    nr_embedded_free(e);
  }
  nr_loop_free(loop);
}
