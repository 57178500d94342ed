/*
 * outbound.c -- a channel's outbound buffer (Netty's ChannelOutboundBuffer).
 * Loop thread only.
 *
 * Stream writes are copied into a list of chunks (16 KiB from the loop's
 * cache, or one exact chunk for a larger write, or for a write near the
 * channel's high water mark: new_chunk) and tracked as offsets in
 * one byte stream: `appended` (written by handlers), `flushed` (handed to
 * the socket by flush), `written` (accepted by the kernel). A write's
 * promise completes when `written` passes its end offset; writes without a
 * promise cost no bookkeeping. Datagrams are kept whole, one entry each.
 * Empty buffers hold no memory, so idle connections cost no buffer space.
 * A file region is a chunk of its own with no bytes (outfile.c): the
 * iovecs stop at it, and it goes out by sendfile when it is the head.
 */
#include <sys/uio.h>
#include <unistd.h>

#include "internal.h"

#define CHUNK_CACHE_MAX 64

nr_chunk_t *nr__chunk_get(nr_loop_t *l, size_t need, bool exact) {
  NR_ASSERT_LOOP(l);                  /* the cache is the loop thread's */
  nr_chunk_t *c;
  if (exact && need < NR_CHUNK_SIZE) {
    if ((c = malloc(sizeof *c + need)) == NULL)
      return NULL;
    c->cap = need;
  } else if (need <= NR_CHUNK_SIZE && l->chunk_cache != NULL) {
    c = l->chunk_cache;
    l->chunk_cache = c->next;
    l->chunk_cached--;
  } else {
    size_t cap = need <= NR_CHUNK_SIZE ? NR_CHUNK_SIZE : need;
    if ((c = malloc(sizeof *c + cap)) == NULL)
      return NULL;
    c->cap = cap;
  }
  c->next = NULL;
  c->start = c->end = 0;
  c->fd = -1;
  return c;
}

void nr__chunk_put(nr_loop_t *l, nr_chunk_t *c) {
  NR_ASSERT_LOOP(l);
  if (c->fd >= 0) {                   /* a file region (outfile.c) */
    close(c->fd);
    free(c);
  } else if (c->cap == NR_CHUNK_SIZE && l->chunk_cached < CHUNK_CACHE_MAX) {
    c->next = l->chunk_cache;
    l->chunk_cache = c;
    l->chunk_cached++;
  } else {
    free(c);
  }
}

void nr__out_init(nr_outbound_t *o) {
  memset(o, 0, sizeof *o);
  o->dq_tail = &o->dq;
  o->dropped_from = UINT64_MAX;
}

/* A chunk for the next `need` bytes of o. Within a quarter chunk of the
 * high water mark, it is exactly their size: a peer that takes nothing
 * leaves the buffer at the mark for as long as it takes nothing (the
 * codecs stop there), and the write that crossed it should not keep a
 * chunk's room past it meanwhile. */
static nr_chunk_t *new_chunk(nr_loop_t *l, const nr_outbound_t *o,
                             size_t need) {
  return nr__chunk_get(l, need,
                       o->high != 0 && o->pending + NR_CHUNK_SIZE / 4 >= o->high);
}

static void note_drop(nr_outbound_t *o, uint64_t from, int code) {
  if (from < o->dropped_from) {
    o->dropped_from = from;
    o->drop_code = code;
  }
}

static int push_entry(nr_outbound_t *o, nr_promise_t *p, uint64_t end) {
  if (o->ecount == o->ecap) {
    if (o->ecap > UINT32_MAX / 2)
      return -ENOMEM;
    uint32_t cap = o->ecap ? o->ecap * 2 : 8;
    nr_wentry_t *e = malloc(cap * sizeof *e);
    if (e == NULL)
      return -ENOMEM;
    for (size_t i = 0; i < o->ecount; i++)      /* unroll the ring */
      e[i] = o->ents[(o->ehead + i) % o->ecap];
    free(o->ents);
    o->ents = e;
    o->ehead = 0;
    o->ecap = cap;
  }
  o->ents[(o->ehead + o->ecount++) % o->ecap] =
      (nr_wentry_t){nr_promise_retain(p), end};
  return 0;
}

int nr__out_append(nr_loop_t *l, nr_outbound_t *o, const void *data,
                   size_t len, nr_promise_t *p) {
  const char *src = data;
  size_t left = len;
  nr_chunk_t *t = o->tail;
  if (t != NULL && t->cap > t->end) {
    size_t n = t->cap - t->end < left ? t->cap - t->end : left;
    memcpy(t->data + t->end, src, n);
    t->end += n;
    src += n;
    left -= n;
  }
  if (left > 0) {
    nr_chunk_t *c = new_chunk(l, o, left);
    if (c == NULL)
      return -ENOMEM;       /* the first part stays: it is a prefix */
    memcpy(c->data, src, left);
    c->end = left;
    if (t)
      t->next = c;
    else
      o->head = c;
    o->tail = c;
  }
  o->appended += len;
  o->pending += len;
  if (p != NULL)
    return push_entry(o, p, o->appended);
  return 0;
}

/* In-place appends (internal.h): the tail had too little room for n bytes,
 * so a new chunk is linked for them (the tail's unused room stays unused:
 * less than n bytes). It stays empty until nr__out_commit, which follows
 * at once. */
char *nr__out_reserve_chunk(nr_loop_t *l, nr_outbound_t *o, size_t n) {
  nr_chunk_t *c = new_chunk(l, o, n);
  if (c == NULL)
    return NULL;
  if (o->tail)
    o->tail->next = c;
  else
    o->head = c;
  o->tail = c;
  return c->data;
}

int nr__out_append_dgram(nr_outbound_t *o, const nr_datagram_t *d,
                         nr_promise_t *p) {
  nr_dgram_t *g = malloc(sizeof *g + d->len);
  if (g == NULL)
    return -ENOMEM;
  g->next = NULL;
  g->p = p ? nr_promise_retain(p) : NULL;
  g->addr = d->addr;
  g->addrlen = d->addrlen;
  g->len = d->len;
  memcpy(g->data, d->data, d->len);
  *o->dq_tail = g;
  o->dq_tail = &g->next;
  o->dq_unflushed++;
  o->dq_count++;
  o->pending += g->len;
  return 0;
}

void nr__out_trim_head(nr_loop_t *l, nr_outbound_t *o) {
  nr_chunk_t *c = o->head;
  if (c == NULL || c->fd >= 0 || c->cap < NR_CHUNK_SIZE ||
      c->start < c->cap / 2)
    return;                   /* (an exact small one, or mostly unwritten;
                                 each move at least halves the room, so a
                                 large write is copied once at most) */
  size_t len = c->end - c->start;
  nr_chunk_t *t = nr__chunk_get(l, len, true);
  if (t == NULL)
    return;                   /* (it keeps its room) */
  memcpy(t->data, c->data + c->start, len);
  t->end = len;
  t->next = c->next;
  o->head = t;
  if (o->tail == c)
    o->tail = t;
  nr__chunk_put(l, c);
}

void nr__out_flush(nr_outbound_t *o) {
  o->flushed = o->appended;
  o->dq_unflushed = 0;
}

int nr__out_iov(nr_outbound_t *o, struct iovec *iov, int max) {
  uint64_t left = o->flushed - o->written;
  int n = 0;
  for (nr_chunk_t *c = o->head; c && left > 0 && n < max; c = c->next) {
    if (c->fd >= 0)
      break;                  /* a file region: sent by nr__out_sendfile */
    size_t len = c->end - c->start;
    if (len > left)
      len = (size_t)left;
    iov[n].iov_base = c->data + c->start;
    iov[n++].iov_len = len;
    left -= len;
  }
  return n;
}

static void complete_entries(nr_outbound_t *o) {
  while (o->ecount > 0) {
    nr_wentry_t *e = &o->ents[o->ehead];
    if (e->end > o->written)
      break;
    nr_promise_t *p = e->p;
    o->ehead = (o->ehead + 1) % o->ecap;
    o->ecount--;
    nr_promise_set_success(p, NULL, NULL);
    nr_promise_release(p);
  }
}

void nr__out_consume(nr_loop_t *l, nr_outbound_t *o, size_t n) {
  o->written += n;
  o->pending -= n;
  while (n > 0) {
    nr_chunk_t *c = o->head;
    size_t len = c->end - c->start;
    if (n < len) {
      c->start += n;
      break;
    }
    n -= len;
    o->head = c->next;
    if (o->head == NULL)
      o->tail = NULL;
    nr__chunk_put(l, c);
  }
  complete_entries(o);
  /* After the completions, which empty the ring when the last write
   * ends here: drained, an idle connection holds no memory. (A listener
   * run by a completion may have written again: then head is set.) */
  if (o->head == NULL && o->ecount == 0 && o->ents != NULL) {
    free(o->ents);
    o->ents = NULL;
    o->ehead = o->ecap = 0;
  }
}

void nr__out_fail_unflushed(nr_loop_t *l, nr_outbound_t *o, int code) {
  uint64_t drop = o->appended - o->flushed;
  if (drop == 0 && o->dq_unflushed == 0)
    return;
  /* Cut the chunk list at the flushed offset. */
  uint64_t keep = o->flushed - o->written;
  nr_chunk_t **pp = &o->head, *last = NULL;
  while (*pp && keep >= (*pp)->end - (*pp)->start) {
    keep -= (*pp)->end - (*pp)->start;
    last = *pp;
    pp = &(*pp)->next;
  }
  if (*pp && keep > 0) {
    (*pp)->end = (*pp)->start + keep;
    last = *pp;
    pp = &(*pp)->next;
  }
  for (nr_chunk_t *c = *pp, *n; c; c = n) {
    n = c->next;
    nr__chunk_put(l, c);
  }
  *pp = NULL;
  o->tail = last;
  o->pending -= drop;
  if (drop > 0)
    note_drop(o, o->flushed, code);
  o->appended = o->flushed;
  while (o->ecount > 0) {                /* the newest entries are unflushed */
    nr_wentry_t *e = &o->ents[(o->ehead + o->ecount - 1) % o->ecap];
    if (e->end <= o->flushed)
      break;
    o->ecount--;
    nr_promise_set_failure(e->p, code, nr_strerror(code));
    nr_promise_release(e->p);
  }
  /* Unflushed datagrams are the last dq_unflushed entries. */
  nr_dgram_t **gp = &o->dq;
  for (size_t i = 0; i + o->dq_unflushed < o->dq_count; i++)
    gp = &(*gp)->next;
  for (nr_dgram_t *g = *gp, *n; g; g = n) {
    n = g->next;
    o->pending -= g->len;
    if (g->p) {
      nr_promise_set_failure(g->p, code, nr_strerror(code));
      nr_promise_release(g->p);
    }
    free(g);
  }
  *gp = NULL;
  o->dq_tail = gp;
  o->dq_count -= o->dq_unflushed;
  o->dq_unflushed = 0;
}

void nr__out_fail_all(nr_loop_t *l, nr_outbound_t *o, int code,
                      const char *msg) {
  for (nr_chunk_t *c = o->head, *n; c; c = n) {
    n = c->next;
    nr__chunk_put(l, c);
  }
  for (; o->ecount > 0; o->ecount--) {
    nr_wentry_t *e = &o->ents[o->ehead];
    o->ehead = (o->ehead + 1) % o->ecap;
    nr_promise_set_failure(e->p, code, msg ? msg : nr_strerror(code));
    nr_promise_release(e->p);
  }
  free(o->ents);
  for (nr_dgram_t *g = o->dq, *n; g; g = n) {
    n = g->next;
    if (g->p) {
      nr_promise_set_failure(g->p, code, msg ? msg : nr_strerror(code));
      nr_promise_release(g->p);
    }
    free(g);
  }
  /* Keep the offsets (and what was dropped): marks stay meaningful. */
  uint64_t written = o->written, from = o->dropped_from;
  int dcode = o->drop_code;
  bool dropped = o->appended > written;
  size_t high = o->high;
  nr__out_init(o);
  o->high = high;
  o->written = o->flushed = o->appended = written;
  o->dropped_from = from;
  o->drop_code = dcode;
  if (dropped)
    note_drop(o, written, code);
}

int nr__out_watch(nr_outbound_t *o, uint64_t mark, nr_promise_t *p) {
  if (mark <= o->written) {
    nr_promise_set_success(p, NULL, NULL);
    return 0;
  }
  if (mark > o->dropped_from) {
    nr_promise_set_failure(p, o->drop_code, nr_strerror(o->drop_code));
    return 0;
  }
  int rc = push_entry(o, p, mark);
  if (rc < 0)
    return rc;
  /* Keep the ring sorted by end: this mark may precede later writes'. */
  size_t i = o->ecount - 1;
  while (i > 0) {
    nr_wentry_t *a = &o->ents[(o->ehead + i - 1) % o->ecap];
    nr_wentry_t *b = &o->ents[(o->ehead + i) % o->ecap];
    if (a->end <= b->end)
      break;
    nr_wentry_t t = *a;
    *a = *b;
    *b = t;
    i--;
  }
  return 0;
}
