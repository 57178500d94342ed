/*
 * h2_fields.c -- a header block's fields as HTTP/2 decodes them
 * (h2_internal.h's h2fields_t), for the server's requests and the
 * client's responses: names and values appended to one text, inline for
 * the usual block and on the heap past it, their offsets kept in an
 * array (inline too, then from nr_h2_alloc). Offsets, not pointers: the
 * text may move as it grows. And what the server's responses and the
 * client's requests share on the way out: a body framed from its bytes
 * (h2body_t). Loop thread only, like the session.
 */
#include <stdlib.h>
#include <string.h>

#include "codec/h2_internal.h"

void nr__h2_fields_init(h2fields_t *f) {
  f->text = (h2text_t){f->text_small, 0, TEXT_INLINE};
  f->hdr = f->hdr_small;
  f->cap = HDR_INLINE;
  f->nhdr = f->ntrl = 0;
  f->trailers = false;
  f->list_bytes = 0;
}

void nr__h2_fields_free(h2fields_t *f) {
  if (f->text.p != f->text_small)
    free(f->text.p);
  if (f->hdr != f->hdr_small)
    nr_h2_free(f->hdr);
  nr__h2_fields_init(f);
}

bool nr__h2_text_add(h2fields_t *f, const void *p, size_t n) {
  h2text_t *t = &f->text;
  if (n > UINT32_MAX / 2 - t->len)
    return false;
  if (t->len + n > t->cap) {
    uint32_t cap = t->cap * 2;
    while (cap < t->len + n)
      cap *= 2;
    char *d = malloc(cap);
    if (d == NULL)
      return false;
    memcpy(d, t->p, t->len);
    const char *from = p;
    if (from >= t->p && from < t->p + t->len)
      p = d + (from - t->p);   /* (appending its own bytes) */
    if (t->p != f->text_small)
      free(t->p);
    t->p = d;
    t->cap = cap;
  }
  memcpy(t->p + t->len, p, n);
  t->len += (uint32_t)n;
  return true;
}

int64_t nr__h2_keep(h2fields_t *f, const void *p, size_t n) {
  uint32_t at = f->text.len;
  if (n > 0 && !nr__h2_text_add(f, p, n))
    return -1;
  return at;
}

int nr__h2_add_field(h2fields_t *f, const uint8_t *name, size_t nl,
                     const uint8_t *value, size_t vl, size_t max) {
  if ((size_t)f->nhdr + f->ntrl >= max)
    return 431;
  if (f->nhdr + f->ntrl == f->cap) {
    uint16_t cap = (uint16_t)(f->cap * 2);
    h2hdr_t *v = nr_h2_alloc(cap * sizeof *v);
    if (v == NULL)
      return -1;
    memcpy(v, f->hdr, f->cap * sizeof *v);
    if (f->hdr != f->hdr_small)
      nr_h2_free(f->hdr);
    f->hdr = v;
    f->cap = cap;
  }
  int64_t n = nr__h2_keep(f, name, nl), v = nr__h2_keep(f, value, vl);
  if (n < 0 || v < 0)
    return -1;
  f->hdr[f->nhdr + f->ntrl] = (h2hdr_t){(uint32_t)n, (uint32_t)nl,
                                        (uint32_t)v, (uint32_t)vl};
  if (f->trailers)
    f->ntrl++;
  else
    f->nhdr++;
  return 0;
}

/* ---- bodies framed without copies ----------------------------------------------- */

void nr__h2_body_sent(h2body_t *b, size_t n) {
  b->data += n;
  b->len -= n;
  if (b->own) {
    nr_buf_consume(&b->copy, n);
    b->data = b->len > 0 ? nr_buf_peek(&b->copy) : NULL;
  }
}
