/*
 * static.c -- the static file handler (static.h): requests in, files out.
 * Loop thread only.
 *
 * A request is judged in its channel_read (static_path.c, the cache, the
 * RFC 9110 rules of static_http.c) and answered there: the head always
 * (so it answers that very request, whatever else the connection has in
 * flight), a small body with it (read whole into the loop's buffer). A
 * larger body becomes a job in the connection's queue, sent in order
 * after the jobs before it, each piece written with its request's token
 * as the pipeline's reading one (nr_ctx_set_reading), so the codec puts
 * it in that request's answer.
 *
 * Pacing (the attacker who never reads): a job writes only while the
 * channel is writable, and at most max_chunk bytes per loop turn; then it
 * waits for writability_changed, or a task after the iteration. What a
 * connection holds is its jobs (a few words each and a reference to an
 * open file) plus what the water marks allow: a file region costs no
 * memory, a pread piece at most 64 KiB above the high mark.
 *
 * A file that turns out shorter than its response says (truncated while
 * it was being sent) closes the connection: the client sees a short body
 * with its connection closed, never a short response passing as whole.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

#include "codec/http.h"
#include "handler/static_internal.h"

#define PIECE NR__SCACHE_BUF         /* a pread piece (TLS, HTTP/2) */
_Static_assert(NR__SCACHE_BUF >= NR_STATIC_SMALL, "a small body fits");
#define BOUNDARY "00000000netrun_static"

void nr_static_cfg_init(nr_static_cfg_t *c) {
  memset(c, 0, sizeof *c);
  strcpy(c->root, ".");
  strcpy(c->index, "index.html");
  c->precompressed = true;
  c->cache_max = NR_STATIC_CACHE_MAX;
  c->cache_valid = NR_STATIC_CACHE_VALID;
  c->max_chunk = NR_STATIC_MAX_CHUNK;
  c->max_ranges = NR_STATIC_MAX_RANGES;
}

/* A body being sent: its parts (a range each, one for a whole file) and
 * how far it has got. */
typedef struct job_s job_t;
struct job_s {
  job_t *next;
  nr__sfile_t *f;
  uint64_t token;             /* its request's */
  const char *type;           /* (multipart) each part's Content-Type */
  int nparts, part;           /* part: the one being sent */
  bool multi, prefixed;       /* multipart; this part's header went */
  bool region;                /* file regions (sendfile), else pread */
  bool h2;                    /* on an HTTP/2 stream */
  uint64_t pos;               /* bytes of this part sent */
  nr_static_range_t r[];      /* nparts */
};

typedef struct conn_s {
  nr_ctx_t *ctx;
  nr__scache_t *cache;
  const nr_static_cfg_t *cfg; /* the cache's */
  job_t *jobs, **tail;
  uint64_t budget;            /* left this turn */
  bool task;                  /* a turn's task is queued (holds ctx) */
  bool removed;
  bool pumping;
  unsigned busy;              /* calls under way: a removal inside one
                                 (a close) leaves the freeing to it */
} conn_t;

/* Enter and leave a call that may see the handler removed. leave: true
 * when it was, and c is gone. */
static void enter(conn_t *c) { c->busy++; }
static bool leave(conn_t *c) {
  if (--c->busy > 0 || !c->removed || c->task)
    return false;
  free(c);
  return true;
}

/* ---- headers of a request ---- */

static const nr_http_header_t *header(const nr_http_request_t *q,
                                      const char *name) {
  size_t n = strlen(name);
  for (size_t i = 0; i < q->nheaders; i++)
    if (q->headers[i].name_len == n &&
        strncasecmp(q->headers[i].name, name, n) == 0)
      return &q->headers[i];
  return NULL;
}

/* ---- writing ---- */

static int write_as(conn_t *c, uint64_t token, void *msg) {
  uint64_t old = nr_ctx_set_reading(c->ctx, token);
  int rc = nr_ctx_write(c->ctx, msg, NULL);
  nr_ctx_set_reading(c->ctx, old);
  return rc;
}

typedef struct head_s {
  nr_http_header_t h[12];
  size_t n;
  char len[24];
} head_t;

static void add(head_t *hd, const char *name, const char *value) {
  hd->h[hd->n++] = (nr_http_header_t){name, value, strlen(name), strlen(value)};
}

/* A short answer of ours (301, 412, 416): its reason as the body. */
static int answer_short(conn_t *c, const nr_http_request_t *q, int status,
                        head_t *hd) {
  char body[64];
  int n = snprintf(body, sizeof body, "%s\n", nr_http_reason(status));
  add(hd, "Content-Type", "text/plain");
  nr_http_response_t r = {.type = NR_MSG_HTTP_RESPONSE, .status = status,
                          .headers = hd->h, .nheaders = hd->n,
                          .body = body, .body_len = (size_t)n};
  int rc = nr_ctx_write(c->ctx, &r, NULL);
  (void)q;
  return rc;
}

/* ---- the body's bytes ---- */

/* The multipart header of part k into out (room for 256). */
static size_t part_head(const job_t *j, int k, uint64_t size, char *out) {
  return (size_t)snprintf(out, 256,
                          "\r\n--" BOUNDARY "\r\nContent-Type: %s\r\n"
                          "Content-Range: bytes %llu-%llu/%llu\r\n\r\n",
                          j->type, (unsigned long long)j->r[k].first,
                          (unsigned long long)j->r[k].last,
                          (unsigned long long)size);
}
#define EPILOGUE "\r\n--" BOUNDARY "--\r\n"

static uint64_t body_length(const job_t *j, uint64_t size) {
  uint64_t n = 0;
  char tmp[256];
  for (int k = 0; k < j->nparts; k++) {
    n += j->r[k].last - j->r[k].first + 1;
    if (j->multi)
      n += part_head(j, k, size, tmp);
  }
  return j->multi ? n + sizeof EPILOGUE - 1 : n;
}

/* pread exactly n bytes, or false (the file is shorter now, or failed). */
static bool read_all(int fd, char *to, size_t n, uint64_t off) {
  while (n > 0) {
    ssize_t k = pread(fd, to, n, (off_t)off);
    if (k < 0 && errno == EINTR)
      continue;
    if (k <= 0)
      return false;
    to += k;
    n -= (size_t)k;
    off += (uint64_t)k;
  }
  return true;
}

/* The whole body of a small job into b (its length fits). */
static bool assemble(const job_t *j, char *b, size_t *len) {
  size_t w = 0;
  for (int k = 0; k < j->nparts; k++) {
    if (j->multi)
      w += part_head(j, k, j->f->size, b + w);
    size_t n = (size_t)(j->r[k].last - j->r[k].first + 1);
    if (!read_all(j->f->fd, b + w, n, j->r[k].first))
      return false;
    w += n;
  }
  if (j->multi) {
    memcpy(b + w, EPILOGUE, sizeof EPILOGUE - 1);
    w += sizeof EPILOGUE - 1;
  }
  *len = w;
  return true;
}

/* The connection cannot go on: its answer would be short. */
static void fail(conn_t *c, nr__sfile_t *f) {
  nr__scache_forget(c->cache, f);
  nr_log(NR_LOG_WARN, "static: %s changed while it was sent: closing the "
         "connection", f->key);
  nr_ctx_close(c->ctx, NULL);
}

/* One step of job j: a part's header, a piece of its bytes, or the
 * epilogue. 1: j is done; 0: go on; -1: failed (closed). */
static int step(conn_t *c, job_t *j) {
  if (j->part == j->nparts) {
    nr_bytes_t b = NR_BYTES(EPILOGUE, j->multi ? sizeof EPILOGUE - 1 : 0);
    if (j->multi)
      write_as(c, j->token, &b);
    return 1;
  }
  const nr_static_range_t *r = &j->r[j->part];
  if (j->multi && !j->prefixed) {
    char h[256];
    nr_bytes_t b = NR_BYTES(h, part_head(j, j->part, j->f->size, h));
    j->prefixed = true;
    return write_as(c, j->token, &b) < 0 ? -1 : 0;
  }
  uint64_t left = r->last - r->first + 1 - j->pos;
  uint64_t n = left < c->budget ? left : c->budget;
  int rc;
  if (j->region) {
    nr_file_region_t fr = {NR_MSG_FILE, j->f->fd, r->first + j->pos, (size_t)n};
    rc = write_as(c, j->token, &fr);
  } else {
    char *b = nr__scache_buf(c->cache);
    if (n > PIECE)
      n = PIECE;
    if (b == NULL || !read_all(j->f->fd, b, (size_t)n, r->first + j->pos)) {
      fail(c, j->f);
      return -1;
    }
    nr_bytes_t by = NR_BYTES(b, (size_t)n);
    rc = write_as(c, j->token, &by);
  }
  if (rc < 0)
    return -1;
  c->budget -= n;
  j->pos += n;
  if (j->pos == r->last - r->first + 1) {
    j->part++;
    j->pos = 0;
    j->prefixed = false;
    if (j->part == j->nparts)
      return step(c, j);      /* the end at once: it needs no budget */
  }
  return 0;
}

static void job_free(job_t *j) {
  nr__sfile_release(j->f);
  free(j);
}

static void drop_jobs(conn_t *c) {
  while (c->jobs != NULL) {
    job_t *j = c->jobs;
    c->jobs = j->next;
    job_free(j);
  }
  c->tail = &c->jobs;
}

static int next_turn(void *arg);

/* Send what the jobs may this turn (see the file's comment). */
static void pump(conn_t *c) {
  nr_channel_t *ch = nr_ctx_channel(c->ctx);
  if (c->pumping)
    return;
  c->pumping = true;
  enter(c);
  /* the flush may drain the socket at once and make the channel writable
   * again -- its event, nested, finds us pumping: so ask again after it */
  bool defer = false;
  while (!defer && c->jobs != NULL && !c->removed && c->budget > 0 &&
         nr_channel_is_writable(ch)) {
    while (c->jobs != NULL && !c->removed && c->budget > 0 &&
           nr_channel_is_writable(ch)) {
      job_t *j = c->jobs;
      /* HTTP/2 gives a chunk to the stream whose request is being read
       * (the pipeline's token does not steer it): while another request
       * is, this job's bytes wait for the task */
      uint64_t now = nr_ctx_reading(c->ctx);
      if (j->h2 && now != 0 && now != j->token) {
        defer = true;
        break;
      }
      int rc = step(c, j);
      if (rc < 0 || c->removed) {
        drop_jobs(c);
        break;
      }
      if (rc == 1) {          /* the stream's end */
        nr_bytes_t end = NR_BYTES("", 0);
        c->jobs = j->next;
        if (c->jobs == NULL)
          c->tail = &c->jobs;
        uint64_t token = j->token;
        job_free(j);
        write_as(c, token, &end);
      }
    }
    if (!c->removed)
      nr_ctx_flush(c->ctx);
  }
  if (c->jobs != NULL && !c->removed && (c->budget == 0 || defer) &&
      !c->task) {
    nr_ctx_retain(c->ctx);
    if (nr_loop_execute(nr_channel_loop(ch), next_turn, c) == 0)
      c->task = true;
    else
      nr_ctx_release(c->ctx);
  }
  c->pumping = false;
  leave(c);
}

static int next_turn(void *arg) {
  conn_t *c = arg;
  nr_ctx_t *ctx = c->ctx;
  c->task = false;
  if (c->removed && c->busy == 0) {
    free(c);
  } else if (!c->removed) {
    c->budget = c->cfg->max_chunk;
    pump(c);                  /* (which frees c if it is removed meanwhile) */
  }
  nr_ctx_release(ctx);
  return 0;
}

/* ---- judging a request ---- */

/* What a request resolves to: the file (retained), or NULL to pass it
 * on; *redirect for a directory named without its slash. */
static nr__sfile_t *resolve(conn_t *c, const nr_http_request_t *q, char *rel,
                            size_t cap, size_t *rlen, bool *redirect) {
  int n = nr_static_path(q->path, q->path_len, rel, cap);
  if (n < 0)
    return NULL;
  size_t len = (size_t)n;
  bool slash = len == 0 || rel[len - 1] == '/';
  nr__sfile_t *f = nr__scache_open(c->cache, rel, slash && len ? len - 1 : len);
  if (f == NULL || f->err != 0 || (f->dir && c->cfg->index[0] == '\0')) {
    nr__sfile_release(f);
    return NULL;
  }
  if (!f->dir) {
    if (slash) {              /* "file/": not a directory */
      nr__sfile_release(f);
      return NULL;
    }
    *rlen = len;
    return f;
  }
  nr__sfile_release(f);
  if (!slash) {
    *redirect = true;
    return NULL;
  }
  size_t ilen = strlen(c->cfg->index);
  if (len + ilen + 1 > cap)
    return NULL;
  memcpy(rel + len, c->cfg->index, ilen + 1);
  len += ilen;
  f = nr__scache_open(c->cache, rel, len);
  if (f == NULL || f->err != 0 || f->dir) {
    nr__sfile_release(f);
    return NULL;
  }
  *rlen = len;
  return f;
}

/* The .br or .gz sibling the client takes best, retained, or NULL;
 * *enc its coding. */
static nr__sfile_t *sibling(conn_t *c, const nr_http_request_t *q, char *rel,
                            size_t len, size_t cap, const char **enc) {
  const nr_http_header_t *ae = header(q, "accept-encoding");
  if (ae == NULL || len + 4 > cap)
    return NULL;
  int br = nr_static_accepts(ae->value, ae->value_len, "br");
  int gz = nr_static_accepts(ae->value, ae->value_len, "gzip");
  static const char *const exts[2] = {".br", ".gz"}, *const names[2] = {"br", "gzip"};
  int order[2] = {br >= gz ? 0 : 1, br >= gz ? 1 : 0};
  int q2[2] = {br, gz};
  for (int k = 0; k < 2; k++) {
    int e = order[k];
    if (q2[e] <= 0)
      continue;
    memcpy(rel + len, exts[e], 4);
    nr__sfile_t *f = nr__scache_open(c->cache, rel, len + 3);
    rel[len] = '\0';
    if (f != NULL && f->err == 0 && !f->dir) {
      *enc = names[e];
      return f;
    }
    nr__sfile_release(f);
  }
  return NULL;
}

/* RFC 9110 13.2.2's preconditions: 0 (go on), 304 or 412. */
static int preconditions(const nr_http_request_t *q, const nr__sfile_t *f) {
  const nr_http_header_t *h;
  if ((h = header(q, "if-match")) != NULL) {
    if (!nr_static_etag_match(h->value, h->value_len, f->etag, false))
      return 412;
  } else if ((h = header(q, "if-unmodified-since")) != NULL) {
    int64_t t = nr_static_parse_date(h->value, h->value_len);
    if (t >= 0 && f->mtime > t)
      return 412;
  }
  if ((h = header(q, "if-none-match")) != NULL) {
    if (nr_static_etag_match(h->value, h->value_len, f->etag, true))
      return 304;
  } else if ((h = header(q, "if-modified-since")) != NULL) {
    int64_t t = nr_static_parse_date(h->value, h->value_len);
    if (t >= 0 && f->mtime <= t)
      return 304;
  }
  return 0;
}

/* Whether the Range header applies (GET, and If-Range agrees). */
static bool range_applies(const nr_http_request_t *q, const nr__sfile_t *f) {
  if (q->head)
    return false;
  const nr_http_header_t *h = header(q, "if-range");
  if (h == NULL)
    return true;
  if (h->value_len > 0 && (h->value[0] == '"' || h->value[0] == 'W'))
    return h->value[0] == '"' &&
           nr_static_etag_match(h->value, h->value_len, f->etag, false);
  return nr_static_parse_date(h->value, h->value_len) == f->mtime;
}

/* Whether file regions may go down this pipeline: a plain connection
 * whose handlers before us pass them to the socket as they are. */
static bool plain(const conn_t *c, const nr_http_request_t *q) {
  if (c->cfg->no_sendfile || q->stream != 0 ||
      nr_loop_is_simulated(nr_channel_loop(nr_ctx_channel(c->ctx))))
    return false;
  for (nr_ctx_t *x = nr_pipeline_first(nr_ctx_pipeline(c->ctx));
       x != NULL && x != c->ctx; x = nr_ctx_next(x)) {
    const char *t = nr_ctx_handler(x)->type;
    if (t == NULL || (strcmp(t, "http_server") != 0 &&
                      strcmp(t, "idle_state") != 0 && strcmp(t, "logging") != 0))
      return false;
  }
  return true;
}

/* Answer q with f (its representation: enc, or identity). */
static int answer(conn_t *c, const nr_http_request_t *q, nr__sfile_t *f,
                  const char *type, const char *enc) {
  head_t hd = {.n = 0};
  add(&hd, "ETag", f->etag);
  add(&hd, "Last-Modified", f->lastmod);
  if (c->cfg->precompressed)
    add(&hd, "Vary", "Accept-Encoding");
  int pre = preconditions(q, f);
  if (pre == 304) {
    nr_http_response_t r = {.type = NR_MSG_HTTP_RESPONSE, .status = 304,
                            .headers = hd.h, .nheaders = hd.n};
    return nr_ctx_write(c->ctx, &r, NULL);
  }
  if (pre == 412)
    return answer_short(c, q, 412, &hd);
  add(&hd, "Accept-Ranges", "bytes");
  if (enc != NULL)
    add(&hd, "Content-Encoding", enc);
  int max = (int)c->cfg->max_ranges;
  job_t *j = calloc(1, sizeof *j + (size_t)(max > 0 ? max : 1) * sizeof j->r[0]);
  if (j == NULL)
    return nr_raise(-ENOMEM, "static: out of memory");
  j->f = f;
  f->refs++;
  j->type = type;
  const nr_http_header_t *rh = header(q, "range");
  int n = rh && max > 0 && range_applies(q, f)
              ? nr_static_ranges(rh->value, rh->value_len, f->size, j->r, max)
              : 0;
  char crange[80];
  int status = 200;
  if (n < 0) {
    snprintf(crange, sizeof crange, "bytes */%llu", (unsigned long long)f->size);
    add(&hd, "Content-Range", crange);
    job_free(j);
    return answer_short(c, q, 416, &hd);
  }
  if (n == 0) {
    j->nparts = f->size > 0 ? 1 : 0;
    j->r[0] = (nr_static_range_t){0, f->size ? f->size - 1 : 0};
    add(&hd, "Content-Type", type);
  } else {
    status = 206;
    j->nparts = n;
    j->multi = n > 1;
    if (j->multi) {
      add(&hd, "Content-Type", "multipart/byteranges; boundary=" BOUNDARY);
    } else {
      add(&hd, "Content-Type", type);
      snprintf(crange, sizeof crange, "bytes %llu-%llu/%llu",
               (unsigned long long)j->r[0].first,
               (unsigned long long)j->r[0].last, (unsigned long long)f->size);
      add(&hd, "Content-Range", crange);
    }
  }
  uint64_t len = body_length(j, f->size);
  snprintf(hd.len, sizeof hd.len, "%llu", (unsigned long long)len);
  add(&hd, "Content-Length", hd.len);
  nr_http_response_t r = {.type = NR_MSG_HTTP_RESPONSE, .status = status,
                          .headers = hd.h, .nheaders = hd.n};
  if (q->head || len <= NR_STATIC_SMALL) {
    char *b = q->head ? NULL : nr__scache_buf(c->cache);
    size_t blen = 0;
    int rc;
    if (!q->head && (b == NULL || !assemble(j, b, &blen))) {
      fail(c, f);
      rc = 0;
    } else {
      r.body = b;
      r.body_len = blen;
      rc = nr_ctx_write(c->ctx, &r, NULL);
    }
    job_free(j);
    return rc;
  }
  r.stream = true;
  int rc = nr_ctx_write(c->ctx, &r, NULL);
  if (rc < 0 || c->removed) {         /* (closed under the write) */
    job_free(j);
    return rc;
  }
  j->token = nr_ctx_reading(c->ctx);
  j->region = plain(c, q);
  j->h2 = q->stream != 0;
  *c->tail = j;
  c->tail = &j->next;
  if (c->jobs == j)
    pump(c);
  return 0;
}

/* A directory named without its slash: 301 to it (nginx's answer). */
static int redirect(conn_t *c, const nr_http_request_t *q) {
  head_t hd = {.n = 0};
  size_t n = q->path_len + 2 + (q->query ? q->query_len + 1 : 0);
  char *loc = malloc(n);
  if (loc == NULL)
    return nr_raise(-ENOMEM, "static: out of memory");
  snprintf(loc, n, "%.*s/%s%.*s", (int)q->path_len, q->path,
           q->query ? "?" : "", q->query ? (int)q->query_len : 0,
           q->query ? q->query : "");
  add(&hd, "Location", loc);
  int rc = answer_short(c, q, 301, &hd);
  free(loc);
  return rc;
}

static int serve(conn_t *c, nr_ctx_t *ctx, const nr_http_request_t *q);

static int st_read(nr_ctx_t *ctx, void *msg) {
  conn_t *c = nr_ctx_state(ctx);
  if (nr_msg_type(msg) != NR_MSG_HTTP_REQUEST) {
    nr_ctx_fire_read(ctx, msg);
    return 0;
  }
  enter(c);
  int rc = serve(c, ctx, msg);
  leave(c);
  return rc;
}

/* A request: answered, or passed on. */
static int serve(conn_t *c, nr_ctx_t *ctx, const nr_http_request_t *q) {
  void *msg = (void *)q;
  bool get = q->method_len == 3 && memcmp(q->method, "GET", 3) == 0;
  if (!(get || q->head) || q->streaming) {
    nr_ctx_fire_read(ctx, msg);           /* not ours: the next handler's */
    return 0;
  }
  char rel[4096];
  size_t len = 0;
  bool redir = false;
  nr__sfile_t *f = resolve(c, q, rel, sizeof rel - 4, &len, &redir);
  if (f == NULL) {
    if (redir)
      return redirect(c, q);
    nr_ctx_fire_read(ctx, msg);
    return 0;
  }
  const char *type = nr_static_mime(rel, len), *enc = NULL;
  nr__sfile_t *use = f;
  if (c->cfg->precompressed) {
    nr__sfile_t *s = sibling(c, q, rel, len, sizeof rel, &enc);
    if (s != NULL) {
      nr__sfile_release(f);
      use = s;
    }
  }
  int rc = answer(c, q, use, type, enc);
  nr__sfile_release(use);
  return rc;
}

static int st_writability(nr_ctx_t *ctx) {
  conn_t *c = nr_ctx_state(ctx);
  if (c->jobs != NULL && nr_channel_is_writable(nr_ctx_channel(ctx)))
    pump(c);                  /* (c may be gone after it) */
  nr_ctx_fire_writability_changed(ctx);
  return 0;
}

static int st_inactive(nr_ctx_t *ctx) {
  drop_jobs(nr_ctx_state(ctx));
  nr_ctx_fire_inactive(ctx);
  return 0;
}

static void st_added(nr_ctx_t *ctx) {
  conn_t *c = nr_ctx_state(ctx);
  c->ctx = ctx;
}

static void st_removed(nr_ctx_t *ctx) {
  conn_t *c = nr_ctx_state(ctx);
  drop_jobs(c);
  nr__scache_release(c->cache);
  c->removed = true;
  if (!c->task && c->busy == 0)
    free(c);                  /* else the call under way, or the turn's
                                 task, frees it */
}

void *nr_static_new(const nr_static_cfg_t *cfg) {
  conn_t *c = calloc(1, sizeof *c);
  if (c == NULL)
    return NULL;
  int err = 0;
  if ((c->cache = nr__scache_get(cfg, &err)) == NULL) {
    free(c);
    errno = -err;
    return NULL;
  }
  c->cfg = nr__scache_cfg(c->cache);
  c->tail = &c->jobs;
  c->budget = cfg->max_chunk;
  return c;
}

const nr_handler_t nr_static_handler = {
    .type = "static", .added = st_added, .removed = st_removed,
    .channel_read = st_read, .writability_changed = st_writability,
    .inactive = st_inactive};
