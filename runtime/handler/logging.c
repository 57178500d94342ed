/*
 * logging.c -- a handler that logs every event and operation passing
 * through it, then passes it on unchanged (Netty's LoggingHandler). Loop
 * thread only.
 *
 * Lines read "channel 7 'log': READ 5B "ping\n"" so that one grep follows a
 * connection; payloads are shown escaped and cut at 64 bytes. The level is
 * checked first, so a handler left in a pipeline at a level that is off
 * costs a comparison per event.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "handler.h"

typedef struct logging_s {
  int level;
} logging_t;

void *nr_logging_new(int level) {
  logging_t *s = malloc(sizeof *s);
  if (s)
    s->level = level;
  return s;
}

static bool enabled(nr_ctx_t *ctx) {
  logging_t *s = nr_ctx_state(ctx);
  return s->level >= nr_log_level() && s->level < NR_LOG_OFF;
}

static void say(nr_ctx_t *ctx, const char *what, const char *detail) {
  logging_t *s = nr_ctx_state(ctx);
  nr_log(s->level, "channel %llu '%s': %s%s%s",
         (unsigned long long)nr_channel_id(nr_ctx_channel(ctx)),
         nr_ctx_name(ctx), what, detail ? " " : "", detail ? detail : "");
}

/* Up to 64 bytes as a quoted, escaped string. */
static void preview(char *out, size_t n, const char *p, size_t len) {
  size_t o = 0, show = len < 64 ? len : 64;
  out[o++] = '"';
  for (size_t i = 0; i < show && o + 6 < n; i++) {
    unsigned char c = (unsigned char)p[i];
    if (c == '\n') o += (size_t)snprintf(out + o, n - o, "\\n");
    else if (c == '\r') o += (size_t)snprintf(out + o, n - o, "\\r");
    else if (c == '"' || c == '\\') o += (size_t)snprintf(out + o, n - o, "\\%c", c);
    else if (c < 32 || c >= 127) o += (size_t)snprintf(out + o, n - o, "\\x%02x", c);
    else out[o++] = (char)c;
  }
  snprintf(out + o, n - o, "\"%s", show < len ? "..." : "");
}

/* A description of a message: bytes with their size and a preview, other
 * kinds by type. */
static void describe(char *out, size_t n, const void *msg) {
  char pv[300];
  switch (nr_msg_type(msg)) {
  case NR_MSG_BYTES: {
    const nr_bytes_t *b = msg;
    preview(pv, sizeof pv, b->data, b->len);
    snprintf(out, n, "%zuB %s", b->len, pv);
    return;
  }
  case NR_MSG_SLICES: {
    const nr_slices_t *s = msg;
    size_t total = 0;
    for (size_t i = 0; i < s->n; i++)
      total += s->v[i].len;
    snprintf(out, n, "%zuB in %zu slices", total, s->n);
    return;
  }
  case NR_MSG_DATAGRAM: {
    const nr_datagram_t *d = msg;
    char host[64];
    int port = 0;
    nr_format_addr(&d->addr, d->addrlen, host, sizeof host, &port);
    preview(pv, sizeof pv, d->data, d->len);
    snprintf(out, n, "%zuB %s from/to %s:%d", d->len, pv, host, port);
    return;
  }
  case NR_MSG_EVENT:
    snprintf(out, n, "%s", ((const nr_event_t *)msg)->name);
    return;
  case NR_MSG_IDLE: {
    const nr_idle_event_t *e = msg;
    snprintf(out, n, "idle %s%s", nr_idle_state_name(e->state),
             e->first ? " (first)" : "");
    return;
  }
  case NR_MSG_LUA:
    snprintf(out, n, "(a Lua value)");
    return;
  default: {
    const char *name = nr_msg_name(nr_msg_type(msg));
    if (name != NULL)
      snprintf(out, n, "(%s message)", name);
    else
      snprintf(out, n, "(message of type %d)", nr_msg_type(msg));
  }
  }
}

static void say_msg(nr_ctx_t *ctx, const char *what, const void *msg) {
  char d[512];
  describe(d, sizeof d, msg);
  say(ctx, what, d);
}

static void say_addr(nr_ctx_t *ctx, const char *what,
                     const struct sockaddr *sa, socklen_t len) {
  struct sockaddr_storage ss;
  char host[128], d[160];
  int port = 0;
  memset(&ss, 0, sizeof ss);
  memcpy(&ss, sa, len < sizeof ss ? len : sizeof ss);
  nr_format_addr(&ss, len, host, sizeof host, &port);
  snprintf(d, sizeof d, "%s:%d", host, port);
  say(ctx, what, d);
}

#define LOG0(cname, what, fire)                                             \
  static int cname(nr_ctx_t *ctx) {                                         \
    if (enabled(ctx))                                                       \
      say(ctx, what, NULL);                                                 \
    fire(ctx);                                                              \
    return 0;                                                               \
  }
LOG0(lg_registered, "REGISTERED", nr_ctx_fire_registered)
LOG0(lg_unregistered, "UNREGISTERED", nr_ctx_fire_unregistered)
LOG0(lg_active, "ACTIVE", nr_ctx_fire_active)
LOG0(lg_inactive, "INACTIVE", nr_ctx_fire_inactive)
LOG0(lg_channel_read_complete, "READ COMPLETE", nr_ctx_fire_read_complete)
LOG0(lg_writability, "WRITABILITY CHANGED", nr_ctx_fire_writability_changed)
LOG0(lg_read, "READ REQUEST", nr_ctx_read)
LOG0(lg_flush, "FLUSH", nr_ctx_flush)

static int lg_channel_read(nr_ctx_t *ctx, void *msg) {
  if (enabled(ctx))
    say_msg(ctx, "READ", msg);
  nr_ctx_fire_read(ctx, msg);
  return 0;
}

static int lg_user_event(nr_ctx_t *ctx, void *evt) {
  if (enabled(ctx))
    say_msg(ctx, "USER EVENT", evt);
  nr_ctx_fire_user_event(ctx, evt);
  return 0;
}

static int lg_exception(nr_ctx_t *ctx, const nr_err_t *err) {
  if (enabled(ctx))
    say(ctx, "EXCEPTION", err->msg ? err->msg : nr_strerror(err->code));
  nr_ctx_fire_exception(ctx, err);
  return 0;
}

/* Outbound operations report their own failures further on (through the
 * promise, or as an exception), so these return 0 whatever happened. */
static int lg_write(nr_ctx_t *ctx, void *msg, nr_promise_t *p) {
  if (enabled(ctx))
    say_msg(ctx, "WRITE", msg);
  nr_ctx_write(ctx, msg, p);
  return 0;
}

static int lg_close(nr_ctx_t *ctx, nr_promise_t *p) {
  if (enabled(ctx))
    say(ctx, "CLOSE", NULL);
  nr_ctx_close(ctx, p);
  return 0;
}

static int lg_disconnect(nr_ctx_t *ctx, nr_promise_t *p) {
  if (enabled(ctx))
    say(ctx, "DISCONNECT", NULL);
  nr_ctx_disconnect(ctx, p);
  return 0;
}

static int lg_bind(nr_ctx_t *ctx, const struct sockaddr *sa, socklen_t len,
                   nr_promise_t *p) {
  if (enabled(ctx))
    say_addr(ctx, "BIND", sa, len);
  nr_ctx_bind(ctx, sa, len, p);
  return 0;
}

static int lg_connect(nr_ctx_t *ctx, const struct sockaddr *sa,
                      socklen_t len, nr_promise_t *p) {
  if (enabled(ctx))
    say_addr(ctx, "CONNECT", sa, len);
  nr_ctx_connect(ctx, sa, len, p);
  return 0;
}

static void lg_added(nr_ctx_t *ctx) {
  if (enabled(ctx))
    say(ctx, "HANDLER ADDED", NULL);
}

static void lg_removed(nr_ctx_t *ctx) {
  if (enabled(ctx))
    say(ctx, "HANDLER REMOVED", NULL);
  free(nr_ctx_state(ctx));
}

const nr_handler_t nr_logging_handler = {
    .type = "logging", .added = lg_added, .removed = lg_removed,
    .registered = lg_registered, .unregistered = lg_unregistered,
    .active = lg_active, .inactive = lg_inactive,
    .channel_read = lg_channel_read,
    .channel_read_complete = lg_channel_read_complete,
    .user_event = lg_user_event,
    .writability_changed = lg_writability, .exception = lg_exception,
    .bind = lg_bind, .connect = lg_connect, .disconnect = lg_disconnect,
    .close = lg_close, .read = lg_read, .write = lg_write,
    .flush = lg_flush};
