/*
 * buf.c -- the cumulation buffer of buf.h. Loop thread only.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "codec/buf.h"

int nr_buf_append(nr_buf_t *b, const void *p, size_t n) {
  if (n == 0)
    return 0;
  if (b->cap - b->w < n && b->r > 0) {     /* reclaim consumed bytes first */
    memmove(b->data, b->data + b->r, b->w - b->r);
    b->w -= b->r;
    b->r = 0;
  }
  if (b->cap - b->w < n) {
    size_t cap = b->cap ? b->cap : 256;
    while (cap - b->w < n) {
      if (cap > ((size_t)-1) / 2)
        return -ENOMEM;
      cap *= 2;
    }
    char *d = realloc(b->data, cap);
    if (d == NULL)
      return -ENOMEM;
    b->data = d;
    b->cap = cap;
  }
  memcpy(b->data + b->w, p, n);
  b->w += n;
  return 0;
}

int nr_buf_reserve(nr_buf_t *b, size_t total) {
  if (b->cap - b->r >= total)
    return 0;
  if (b->r > 0) {                          /* reclaim consumed bytes first */
    memmove(b->data, b->data + b->r, b->w - b->r);
    b->w -= b->r;
    b->r = 0;
  }
  if (b->cap >= total)
    return 0;
  char *d = realloc(b->data, total);
  if (d == NULL)
    return -ENOMEM;
  b->data = d;
  b->cap = total;
  return 0;
}

void nr_buf_consume(nr_buf_t *b, size_t n) {
  b->r += n;
  if (b->r >= b->w)
    nr_buf_free(b);                        /* idle: hold no memory */
}

void nr_buf_free(nr_buf_t *b) {
  free(b->data);
  *b = NR_BUF_INIT;
}
