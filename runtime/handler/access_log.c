/*
 * access_log.c -- an HTTP access log (nginx's ngx_http_log_module): a
 * handler after the HTTP/1.1 server codec that writes one line per
 * answer, in a format of nginx's variables, through the log thread
 * (log.c's log files) so that a loop never waits for a disk.
 *
 * The format is parsed once (nr_access_format) into a list of pieces --
 * literal text, variables -- kept for the process's life, so a
 * configuration may be plain bytes that cross states. Per connection:
 * - each request the codec delivers is noted (its token, its start, and
 *   the values of the variables it alone knows: $request, $http_*, ...,
 *   escaped) in a FIFO, and passed on with its token and deferrability
 *   untouched;
 * - the codec tells of every answer it encodes (nr_http_server_observe),
 *   its own included (500 for a handler that raised, 400 for a request
 *   it could not parse), with the token of the request answered: the
 *   line is made then (a streamed answer at its end, its pieces summed);
 * - requests still unanswered when the channel goes inactive (the client
 *   went away) are logged with status 499, as nginx does.
 * Values are escaped as nginx's escape=default: '"', '\' and bytes below
 * 0x20 or from 0x7f as \xXX; an empty or unknown value is "-". Lines reach
 * the file within about a second (log.c's tick), sooner under load. A line is
 * at most LINE_MAX bytes (each value at most VALUE_MAX). Loop thread.
 */
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>

#include "codec/http.h"
#include "handler.h"

#define MAX_OPS 48
#define VALUE_MAX 4096
#define LINE_MAX_ 16384
#define MAX_PENDING 1024             /* > the codec's unanswered requests */

enum {
  V_LIT, V_REMOTE_ADDR, V_REMOTE_PORT, V_REQUEST, V_METHOD, V_URI, V_STATUS,
  V_BODY_BYTES, V_BYTES_SENT, V_REQUEST_TIME, V_TIME_ISO, V_TIME_LOCAL,
  V_MSEC, V_HTTP, V_UPSTREAM_ADDR, V_PROTOCOL, V_PIPE
};

static const struct { const char *name; int kind; } VARS[] = {
    {"remote_addr", V_REMOTE_ADDR}, {"remote_port", V_REMOTE_PORT},
    {"request", V_REQUEST}, {"request_method", V_METHOD},
    {"request_uri", V_URI}, {"status", V_STATUS},
    {"body_bytes_sent", V_BODY_BYTES}, {"bytes_sent", V_BYTES_SENT},
    {"request_time", V_REQUEST_TIME}, {"time_iso8601", V_TIME_ISO},
    {"time_local", V_TIME_LOCAL}, {"msec", V_MSEC},
    {"upstream_addr", V_UPSTREAM_ADDR}, {"server_protocol", V_PROTOCOL},
    {"pipe", V_PIPE}, {NULL, 0}};

typedef struct op_s {
  uint8_t kind;
  uint16_t off, len;                 /* V_LIT: text; V_HTTP: header name */
} op_t;

struct nr_access_format_s {
  struct nr_access_format_s *next;
  size_t len;                        /* of the format as given */
  int nops;
  op_t ops[MAX_OPS];
  char text[];                       /* the format; header names lowered */
};

static pthread_mutex_t formats_lock = PTHREAD_MUTEX_INITIALIZER;
static nr_access_format_t *formats;

/* Whether op is a value of the request (noted when it comes). */
static bool of_request(int kind) {
  return kind == V_REQUEST || kind == V_METHOD || kind == V_URI ||
         kind == V_HTTP || kind == V_PROTOCOL;
}

/* ---- the format ------------------------------------------------------------ */

static bool name_char(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ||
         (c >= '0' && c <= '9') || c == '_';
}

static int var_kind(const char *s, size_t n) {
  for (int i = 0; VARS[i].name; i++)
    if (strlen(VARS[i].name) == n && memcmp(VARS[i].name, s, n) == 0)
      return VARS[i].kind;
  if (n > 5 && memcmp(s, "http_", 5) == 0)
    return V_HTTP;
  return -1;
}

/* Parse fmt into f (text already copied into f->text). */
static int parse(nr_access_format_t *f, char *err, size_t errn) {
  char *t = f->text;
  size_t n = strlen(t), i = 0, lit = 0;
  while (i <= n) {
    if (i < n && t[i] != '$') {
      i++;
      continue;
    }
    if (i > lit) {                   /* the literal before */
      if (f->nops == MAX_OPS)
        goto many;
      f->ops[f->nops++] = (op_t){V_LIT, (uint16_t)lit, (uint16_t)(i - lit)};
    }
    if (i == n)
      break;
    bool brace = t[i + 1] == '{';
    size_t s = i + 1 + brace, e = s;
    while (e < n && name_char(t[e]))
      e++;
    if (e == s || (brace && t[e] != '}')) {
      snprintf(err, errn, "a '$' at %zu not followed by a variable name", i);
      return -1;
    }
    int kind = var_kind(t + s, e - s);
    if (kind < 0) {
      snprintf(err, errn, "unknown variable $%.*s", (int)(e - s), t + s);
      return -1;
    }
    if (f->nops == MAX_OPS)
      goto many;
    op_t op = {(uint8_t)kind, 0, 0};
    if (kind == V_HTTP) {            /* the name as headers are matched */
      op.off = (uint16_t)(s + 5);
      op.len = (uint16_t)(e - s - 5);
      for (size_t k = s + 5; k < e; k++)
        t[k] = t[k] == '_' ? '-' : (char)(t[k] | 0x20);
    }
    f->ops[f->nops++] = op;
    i = lit = e + brace;
  }
  return 0;
many:
  snprintf(err, errn, "more than %d pieces", MAX_OPS);
  return -1;
}

const nr_access_format_t *nr_access_format(const char *fmt, char *err,
                                           size_t errn) {
  size_t n = strlen(fmt);
  if (n > 4096) {
    snprintf(err, errn, "longer than 4096 bytes");
    return NULL;
  }
  pthread_mutex_lock(&formats_lock);
  nr_access_format_t *f = formats;
  for (; f; f = f->next)          /* interned: a copy's text is parsed */
    if (f->len == n && memcmp(f->text + n + 1, fmt, n) == 0)
      break;
  pthread_mutex_unlock(&formats_lock);
  if (f)
    return f;
  if ((f = calloc(1, sizeof *f + 2 * (n + 1))) == NULL) {
    snprintf(err, errn, "out of memory");
    return NULL;
  }
  f->len = n;
  memcpy(f->text, fmt, n + 1);
  memcpy(f->text + n + 1, fmt, n + 1);      /* as given, for interning */
  if (parse(f, err, errn) < 0) {
    free(f);
    return NULL;
  }
  pthread_mutex_lock(&formats_lock);
  f->next = formats;
  formats = f;
  pthread_mutex_unlock(&formats_lock);
  return f;
}

/* ---- a connection's state ---------------------------------------------------- */

typedef struct entry_s {
  struct entry_s *next;
  uint64_t token, start;
  int status;                        /* a streamed answer's, once begun */
  uint64_t head, body;
  size_t len;
  uint16_t vlen[MAX_OPS];            /* of_request values, in vals */
  char vals[];
} entry_t;

typedef struct alog_s {
  const nr_access_format_t *f;
  nr_log_file_t *file;
  nr_ctx_t *codec;                   /* retained; observed */
  entry_t *head, *tail;
  unsigned n;
  char addr[64];                     /* $remote_addr, found at first use */
  int port;
} alog_t;

void *nr_access_log_new(const nr_access_format_t *f, nr_log_file_t *file) {
  alog_t *a = calloc(1, sizeof *a);
  if (a) {
    a->f = f;
    a->file = file;
    a->port = -1;
  }
  return a;
}

/* Escaped (nginx's escape=default) s into out; returns the bytes put. */
static size_t escape(char *out, size_t room, const char *s, size_t n) {
  static const char hex[] = "0123456789ABCDEF";
  size_t o = 0;
  for (size_t i = 0; i < n && o + 4 <= room; i++) {
    unsigned char c = (unsigned char)s[i];
    if (c == '"' || c == '\\' || c < 0x20 || c >= 0x7f) {
      out[o++] = '\\';
      out[o++] = 'x';
      out[o++] = hex[c >> 4];
      out[o++] = hex[c & 15];
    } else {
      out[o++] = (char)c;
    }
  }
  return o;
}

static const nr_http_header_t *header(const nr_http_request_t *r,
                                      const char *name, size_t n) {
  for (size_t i = 0; i < r->nheaders; i++)
    if (r->headers[i].name_len == n &&
        strncasecmp(r->headers[i].name, name, n) == 0)
      return &r->headers[i];
  return NULL;
}

/* The escaped value of a request's variable into out. */
static size_t request_value(const nr_access_format_t *f, const op_t *op,
                            const nr_http_request_t *r, char *out) {
  char buf[VALUE_MAX];
  size_t n = 0;
  switch (op->kind) {
  case V_METHOD: return escape(out, VALUE_MAX, r->method, r->method_len);
  case V_URI: return escape(out, VALUE_MAX, r->target, r->target_len);
  case V_PROTOCOL:
    memcpy(out, "HTTP/1.0", 8);
    out[7] = (char)('0' + (r->minor == 0 ? 0 : 1));
    return 8;
  case V_REQUEST:
    n = escape(buf, VALUE_MAX - 16, r->method, r->method_len);
    buf[n++] = ' ';
    n += escape(buf + n, VALUE_MAX - 16 - n, r->target, r->target_len);
    memcpy(buf + n, " HTTP/1.0", 9);
    buf[n + 8] = (char)('0' + (r->minor == 0 ? 0 : 1));
    n += 9;
    memcpy(out, buf, n);
    return n;
  default: {                          /* V_HTTP */
    const nr_http_header_t *h = header(r, f->text + op->off, op->len);
    return h ? escape(out, VALUE_MAX, h->value, h->value_len) : 0;
  }
  }
}

/* Note a request: its values, escaped, in an entry at the FIFO's end
 * (one allocation: the values are made in a per-thread buffer first). */
static void note(alog_t *a, const nr_http_request_t *r) {
  static _Thread_local char vals[MAX_OPS * VALUE_MAX / 8 + VALUE_MAX];
  if (a->n >= MAX_PENDING)
    return;
  size_t total = 0;
  uint16_t vlen[MAX_OPS] = {0};
  for (int i = 0; i < a->f->nops; i++) {
    const op_t *op = &a->f->ops[i];
    if (!of_request(op->kind) || total + VALUE_MAX > sizeof vals)
      continue;                       /* (past the room: "-") */
    size_t n = request_value(a->f, op, r, vals + total);
    total += n;
    vlen[i] = (uint16_t)n;
  }
  entry_t *e = malloc(sizeof *e + total);
  if (e == NULL)
    return;
  *e = (entry_t){.token = r->token, .start = nr_now(), .len = total};
  memcpy(e->vlen, vlen, sizeof vlen);
  memcpy(e->vals, vals, total);
  if (a->tail)
    a->tail->next = e;
  else
    a->head = e;
  a->tail = e;
  a->n++;
}

/* The entry of token, taken out of the FIFO, or NULL. */
static entry_t *take(alog_t *a, uint64_t token) {
  entry_t **pp = &a->head, *prev = NULL;
  for (; *pp; prev = *pp, pp = &(*pp)->next)
    if ((*pp)->token == token && token != 0) {
      entry_t *e = *pp;
      *pp = e->next;
      if (a->tail == e)
        a->tail = prev;
      a->n--;
      return e;
    }
  return NULL;
}

static entry_t *find(alog_t *a, uint64_t token) {
  for (entry_t *e = a->head; e; e = e->next)
    if (e->token == token && token != 0)
      return e;
  return NULL;
}

/* ---- the line ------------------------------------------------------------------ */

typedef struct line_s {
  char *p;
  size_t n, room;
} line_t;

static void put(line_t *l, const char *s, size_t n) {
  if (n > l->room - l->n)
    n = l->room - l->n;
  memcpy(l->p + l->n, s, n);
  l->n += n;
}

static void putf(line_t *l, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
static void putf(line_t *l, const char *fmt, ...) {
  char b[96];
  va_list ap;
  va_start(ap, fmt);
  int n = vsnprintf(b, sizeof b, fmt, ap);
  va_end(ap);
  if (n > 0)
    put(l, b, (size_t)n < sizeof b ? (size_t)n : sizeof b - 1);
}

/* v in decimal, at least `width` digits (a line per request: no printf). */
static void put_uint(line_t *l, uint64_t v, int width) {
  char b[24];
  int n = 0;
  do {
    b[sizeof b - 1 - n++] = (char)('0' + v % 10);
    v /= 10;
  } while (v > 0 || n < width);
  put(l, b + sizeof b - n, (size_t)n);
}

/* ns as seconds with milliseconds: "0.003". */
static void put_ms(line_t *l, uint64_t ns) {
  put_uint(l, ns / 1000000000ull, 1);
  put(l, ".", 1);
  put_uint(l, ns / 1000000ull % 1000, 3);
}

static void put_time(line_t *l, int kind, uint64_t wall) {
  static const char *mon[] = {"Jan", "Feb", "Mar", "Apr", "May", "Jun",
                              "Jul", "Aug", "Sep", "Oct", "Nov", "Dec"};
  time_t t = (time_t)(wall / 1000000000ull);
  struct tm tm;
  gmtime_r(&t, &tm);
  if (kind == V_TIME_ISO)
    putf(l, "%04d-%02d-%02dT%02d:%02d:%02d+00:00", tm.tm_year + 1900,
         tm.tm_mon + 1, tm.tm_mday, tm.tm_hour, tm.tm_min, tm.tm_sec);
  else if (kind == V_TIME_LOCAL)
    putf(l, "%02d/%s/%04d:%02d:%02d:%02d +0000", tm.tm_mday, mon[tm.tm_mon],
         tm.tm_year + 1900, tm.tm_hour, tm.tm_min, tm.tm_sec);
  else
    put_ms(l, wall);
}

static void put_remote(alog_t *a, nr_ctx_t *ctx, line_t *l, bool port) {
  if (a->port < 0 &&
      nr_channel_remote_address(nr_ctx_channel(ctx), a->addr, sizeof a->addr,
                                &a->port) < 0) {
    a->port = 0;
    strcpy(a->addr, "-");
  }
  if (port)
    put_uint(l, (uint64_t)a->port, 1);
  else
    put(l, a->addr, strlen(a->addr));
}

/* Write the line of an answer (e: its request's entry, or NULL). */
static void log_line(alog_t *a, nr_ctx_t *ctx, const entry_t *e, int status,
                     uint64_t head, uint64_t body, bool pipelined) {
  static _Thread_local char buf[LINE_MAX_];
  line_t l = {buf, 0, sizeof buf - 1};
  uint64_t now = e ? nr_now() : 0;
  const char *vals = e ? e->vals : NULL;
  for (int i = 0; i < a->f->nops; i++) {
    const op_t *op = &a->f->ops[i];
    size_t before = l.n;
    switch (op->kind) {
    case V_LIT: put(&l, a->f->text + op->off, op->len); continue;
    case V_REMOTE_ADDR: put_remote(a, ctx, &l, false); break;
    case V_REMOTE_PORT: put_remote(a, ctx, &l, true); break;
    case V_STATUS: put_uint(&l, (uint64_t)status, 3); break;
    case V_BODY_BYTES: put_uint(&l, body, 1); break;
    case V_BYTES_SENT: put_uint(&l, head + body, 1); break;
    case V_REQUEST_TIME: put_ms(&l, e ? now - e->start : 0); break;
    case V_TIME_ISO: case V_TIME_LOCAL: case V_MSEC:
      put_time(&l, op->kind, nr_wall_ns());
      break;
    case V_PIPE: put(&l, pipelined ? "p" : ".", 1); break;
    case V_UPSTREAM_ADDR: break;
    default:                          /* of the request: noted */
      if (vals) {
        put(&l, vals, e->vlen[i]);
        vals += e->vlen[i];
      }
      break;
    }
    if (l.n == before)
      put(&l, "-", 1);
  }
  buf[l.n++] = '\n';
  nr_log_file_write(a->file, buf, l.n);
}

/* ---- the codec's answers -------------------------------------------------------- */

static void seen(void *arg, int ev, uint64_t token, int status, uint64_t head,
                 uint64_t body) {
  nr_ctx_t *ctx = arg;
  alog_t *a = nr_ctx_state(ctx);
  entry_t *e;
  switch (ev) {
  case NR_HTTP_SEEN_HEAD:
    if ((e = find(a, token)) != NULL) {
      e->status = status;
      e->head = head;
      e->body = body;
      return;
    }
    log_line(a, ctx, NULL, status, head, body, false);
    return;
  case NR_HTTP_SEEN_CHUNK:
    if ((e = find(a, token)) != NULL)
      e->body += body;
    return;
  case NR_HTTP_SEEN_END:
    if ((e = take(a, token)) != NULL) {
      log_line(a, ctx, e, e->status, e->head, e->body, e != NULL && a->n > 0);
      free(e);
    }
    return;
  default:
    e = take(a, token);
    log_line(a, ctx, e, status, head, body, a->head != NULL);
    free(e);
  }
}

/* ---- the handler ----------------------------------------------------------------- */

/* Observe the nearest HTTP server codec before this handler. */
static void added(nr_ctx_t *ctx) {
  alog_t *a = nr_ctx_state(ctx);
  nr_ctx_t *codec = NULL;
  for (nr_ctx_t *c = nr_pipeline_first(nr_ctx_pipeline(ctx)); c && c != ctx;
       c = nr_ctx_next(c))
    if (nr_http_server_is(c))
      codec = c;
  if (codec == NULL) {
    nr_log(NR_LOG_WARN, "access_log: no HTTP server codec before '%s': "
           "nothing is logged", nr_ctx_name(ctx));
    return;
  }
  a->codec = nr_ctx_retain(codec);
  nr_http_server_observe(codec, seen, ctx);
}

static void forget_all(alog_t *a) {
  for (entry_t *e = a->head, *n; e; e = n) {
    n = e->next;
    free(e);
  }
  a->head = a->tail = NULL;
  a->n = 0;
}

static void removed(nr_ctx_t *ctx) {
  alog_t *a = nr_ctx_state(ctx);
  if (a->codec) {
    if (!nr_ctx_is_removed(a->codec))
      nr_http_server_observe(a->codec, NULL, NULL);
    nr_ctx_release(a->codec);
  }
  forget_all(a);
  free(a);
}

static int channel_read(nr_ctx_t *ctx, void *msg) {
  alog_t *a = nr_ctx_state(ctx);
  if (nr_msg_type(msg) == NR_MSG_HTTP_REQUEST && a->codec &&
      ((nr_http_request_t *)msg)->stream == 0)
    note(a, msg);
  /* on as it came: its token (a failure is answered by the codec) and
   * whether it may be taken later */
  uint64_t token = nr_ctx_read_token(ctx, msg);
  bool deferrable = nr_ctx_read_deferrable(ctx, msg);
  if (token != 0)
    nr_ctx_fire_read_tokened(ctx, msg, token, deferrable);
  else if (deferrable)
    nr_ctx_fire_read_deferrable(ctx, msg);
  else
    nr_ctx_fire_read(ctx, msg);
  return 0;
}

/* The client went away: what was not answered is logged as 499 (a
 * streamed answer under way with its status and the bytes so far). */
static int inactive(nr_ctx_t *ctx) {
  alog_t *a = nr_ctx_state(ctx);
  for (entry_t *e = a->head; e; e = e->next)
    log_line(a, ctx, e, e->status ? e->status : 499, e->head, e->body, false);
  forget_all(a);
  nr_ctx_fire_inactive(ctx);
  return 0;
}

const nr_handler_t nr_access_log_handler = {
    .type = "access_log", .added = added, .removed = removed,
    .channel_read = channel_read, .inactive = inactive};
