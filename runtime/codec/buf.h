/*
 * buf.h -- a cumulation buffer for decoders (Netty's cumulation in
 * ByteToMessageDecoder), loop thread only.
 *
 * Invariant: an empty buffer holds no memory, so an idle connection whose
 * last read ended on a frame boundary costs nothing; a buffer holds at most
 * four times its readable bytes once they are consumed down (or 4 KiB). Decoders parse straight
 * from the channel's read buffer when nothing is cumulated, and append only
 * the unconsumed tail of a read (nr_buf_append) when a frame is split.
 *
 *   data[0 .. r)     consumed, reclaimed by compaction
 *   data[r .. w)     readable bytes
 *   data[w .. cap)   free space
 */
#ifndef NR_CODEC_BUF_H
#define NR_CODEC_BUF_H

#include <stddef.h>

typedef struct nr_buf_s {
  char *data;
  size_t r, w, cap;
} nr_buf_t;

#define NR_BUF_INIT ((nr_buf_t){0})

static inline size_t nr_buf_len(const nr_buf_t *b) { return b->w - b->r; }
static inline const char *nr_buf_peek(const nr_buf_t *b) {
  return b->data + b->r;
}

/* Append n bytes; 0 or -ENOMEM. Compacts before growing. */
int nr_buf_append(nr_buf_t *b, const void *p, size_t n);
/* Room for `total` readable bytes in all, made at once (a message whose
 * size is known: its bytes are then copied once, into a buffer of its
 * size, rather than through doublings that end up to twice as big);
 * 0 or -ENOMEM. Compacts first. */
int nr_buf_reserve(nr_buf_t *b, size_t total);
/* Drop n readable bytes (n <= len). An emptied buffer frees its memory;
 * one left holding a quarter of its room or less (and over 4 KiB of it)
 * moves to a smaller one. */
void nr_buf_consume(nr_buf_t *b, size_t n);
/* Free everything. */
void nr_buf_free(nr_buf_t *b);

#endif /* NR_CODEC_BUF_H */
