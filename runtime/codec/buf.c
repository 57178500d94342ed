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
    /* Twice the room, or at once what the bytes need (in 256s) if that
     * is more: the rest of a read appended to a few bytes held gets room
     * for it, not the next power of two (a rest often kept whole, while
     * the peer reads no answers); a head dripping in still doubles. */
    if (n > ((size_t)-1) / 2 - b->w || b->cap > ((size_t)-1) / 2)
      return -ENOMEM;
    size_t need = (b->w + n + 255) & ~(size_t)255, cap = b->cap * 2;
    if (cap < need)
      cap = need;
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

/* A buffer that grew for a burst keeps no more than four times what it
 * holds: a codec that holds a small rest of a large read for long (its
 * peer does not read the answers) must not keep the large read's room. */
#define SHRINK_FROM 4096

static void shrink(nr_buf_t *b) {
  size_t len = b->w - b->r, cap = b->cap;
  while (cap / 2 >= 256 && len <= cap / 4)
    cap /= 2;
  memmove(b->data, b->data + b->r, len);   /* (len <= cap / 4: cheap) */
  b->r = 0;
  b->w = len;
  char *d = realloc(b->data, cap);
  if (d != NULL) {                         /* else it keeps its room */
    b->data = d;
    b->cap = cap;
  }
}

void nr_buf_consume(nr_buf_t *b, size_t n) {
  b->r += n;
  if (b->r >= b->w)
    nr_buf_free(b);                        /* idle: hold no memory */
  else if (n > 0 && b->cap > SHRINK_FROM && b->w - b->r <= b->cap / 4)
    shrink(b);
}

void nr_buf_free(nr_buf_t *b) {
  free(b->data);
  *b = NR_BUF_INIT;
}
