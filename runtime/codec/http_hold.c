/*
 * http_hold.c -- the answers the HTTP/1.1 server codec holds back until
 * the answers owed before them are out (see http_hold.h). Loop thread
 * only.
 *
 * Invariant: a queue's segments are in write order; only the last one
 * may be without a promise (a write with a promise ends its segment), so
 * each promise completes when its own bytes, and nothing after them, have
 * been written.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "codec/http_hold.h"

struct nr__http_hold_seg {
  struct nr__http_hold_seg *next;
  nr_promise_t *p;            /* completes when data has been written */
  char *data;
  size_t len, cap;
};
typedef struct nr__http_hold_seg seg_t;

/* The last segment of q when it can take n more bytes (no promise ends
 * it), grown to fit; else a new one at its end. NULL: out of memory. */
static seg_t *room(struct nr__http_hold_q *q, size_t n) {
  seg_t *s = q->last;
  if (s != NULL && s->p == NULL) {
    if (s->len + n <= s->cap)
      return s;
    size_t cap = s->cap * 2 > s->len + n ? s->cap * 2 : s->len + n;
    char *d = realloc(s->data, cap);
    if (d == NULL)
      return NULL;
    s->data = d;
    s->cap = cap;
    return s;
  }
  if ((s = calloc(1, sizeof *s)) == NULL)
    return NULL;
  if (n > 0 && (s->data = malloc(n)) == NULL) {
    free(s);
    return NULL;
  }
  s->cap = n;
  *(q->last ? &q->last->next : &q->first) = s;
  q->last = s;
  return s;
}

/* A file region is read into the hold (what is held is bytes, counted
 * toward the water marks like any held answer, so the writer stops at
 * the high mark). A file shorter than its region: -ENODATA. */
static ptrdiff_t hold_file(struct nr__http_hold_q *q, const nr_file_region_t *r,
                           nr_promise_t *p) {
  seg_t *s = room(q, r->len);
  if (s == NULL)
    return -ENOMEM;
  size_t got = 0;
  while (got < r->len) {
    ssize_t k = pread(r->fd, s->data + s->len + got, r->len - got,
                      (off_t)(r->offset + got));
    if (k < 0 && errno == EINTR)
      continue;
    if (k <= 0)
      return k < 0 ? -errno : -ENODATA;
    got += (size_t)k;
  }
  s->len += got;
  if (p != NULL)
    s->p = nr_promise_retain(p);
  return (ptrdiff_t)got;
}

ptrdiff_t nr__http_hold_add(nr__http_hold_t **h, unsigned i, const void *msg,
                            nr_promise_t *p) {
  if (*h == NULL && (*h = calloc(1, sizeof **h)) == NULL)
    return -ENOMEM;
  nr_slice_t one;
  const nr_slice_t *v = &one;
  size_t n = 1, total = 0;
  if (nr_msg_type(msg) == NR_MSG_FILE)
    return hold_file(&(*h)->q[i], msg, p);
  if (nr_msg_type(msg) == NR_MSG_BYTES) {
    one = (nr_slice_t){((const nr_bytes_t *)msg)->data,
                       ((const nr_bytes_t *)msg)->len};
  } else {
    v = ((const nr_slices_t *)msg)->v;
    n = ((const nr_slices_t *)msg)->n;
  }
  for (size_t k = 0; k < n; k++)
    total += v[k].len;
  seg_t *s = room(&(*h)->q[i], total);
  if (s == NULL)
    return -ENOMEM;
  for (size_t k = 0; k < n; k++) {
    if (v[k].len > 0)
      memcpy(s->data + s->len, v[k].data, v[k].len);
    s->len += v[k].len;
  }
  if (p != NULL)
    s->p = nr_promise_retain(p);
  return (ptrdiff_t)total;
}

static seg_t *unlink_first(struct nr__http_hold_q *q) {
  seg_t *s = q->first;
  q->first = s->next;
  if (q->first == NULL)
    q->last = NULL;
  return s;
}

static void seg_free(seg_t *s) {
  free(s->data);
  free(s);
}

int nr__http_hold_pop(nr__http_hold_t *h, unsigned i, nr_ctx_t *ctx,
                      size_t *n) {
  seg_t *s = unlink_first(&h->q[i]);
  *n = s->len;
  nr_bytes_t b = NR_BYTES(s->data, s->len);
  int rc = nr_ctx_write(ctx, &b, s->p);
  if (s->p != NULL)
    nr_promise_release(s->p);
  seg_free(s);
  return rc;
}

bool nr__http_hold_empty(const nr__http_hold_t *h) {
  for (unsigned i = 0; h != NULL && i < NR_HTTP_HOLD_SLOTS; i++)
    if (h->q[i].first != NULL)
      return false;
  return true;
}

size_t nr__http_hold_drop(nr__http_hold_t *h, unsigned i) {
  size_t n = 0;
  while (h != NULL && h->q[i].first != NULL) {
    seg_t *s = unlink_first(&h->q[i]);
    n += s->len;
    if (s->p != NULL) {
      nr_promise_set_failure(s->p, NR_ECLOSED, "http_server: the connection "
                             "closed before the answers owed before this one");
      nr_promise_release(s->p);
    }
    seg_free(s);
  }
  return n;
}

size_t nr__http_hold_free(nr__http_hold_t *h) {
  size_t n = 0;
  if (h == NULL)
    return 0;
  for (unsigned i = 0; i < NR_HTTP_HOLD_SLOTS; i++)
    n += nr__http_hold_drop(h, i);
  free(h);
  return n;
}
