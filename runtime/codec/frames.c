/*
 * frames.c -- the core frame codecs of codec.h: line, delimiter,
 * length_field and fixed_length decoders (pure finders plus one step
 * function on the decoder base) and the length_prepender encoder.
 * Loop thread only, like every handler.
 *
 * Limits never let memory grow: a line or delimited frame that passes its
 * limit is reported at once and its bytes are discarded up to the next
 * delimiter (fail fast, nothing oversized is cumulated); a length-field
 * frame over max_frame is skipped by count.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "codec/codec.h"

uint64_t nr_get_be(const char *p, size_t n) {
  uint64_t v = 0;
  for (size_t i = 0; i < n; i++)
    v = v << 8 | (unsigned char)p[i];
  return v;
}

void nr_put_be(char *p, size_t n, uint64_t v) {
  for (size_t i = n; i-- > 0; v >>= 8)
    p[i] = (char)(v & 0xff);
}

/* ---- line ------------------------------------------------------------------ */

int nr_line_find(nr_line_t *st, const char *data, size_t len, nr_frame_t *f) {
  *f = (nr_frame_t){0};
  size_t from = st->scanned <= len ? st->scanned : 0;
  const char *nl = memchr(data + from, '\n', len - from);
  if (st->discarding) {                /* the rest of a too-long line */
    st->scanned = 0;
    f->consumed = nl ? (size_t)(nl - data) + 1 : len;
    if (nl)
      st->discarding = false;
    return NR_FRAME_MORE;
  }
  if (nl == NULL) {
    /* A line of exactly max_length may still end with "\r\n". */
    bool cr = len > 0 && data[len - 1] == '\r';
    if (len - cr > st->max_length) {
      st->discarding = true;
      st->scanned = 0;
      f->consumed = len;
      return nr_raise(NR_ETOOLONG, "line: frame of more than %zu bytes",
                      st->max_length);
    }
    st->scanned = len;
    return NR_FRAME_MORE;
  }
  size_t end = (size_t)(nl - data);    /* index of the "\n" */
  size_t dlen = end > 0 && data[end - 1] == '\r' ? 2 : 1;
  size_t flen = end + 1 - dlen;
  st->scanned = 0;
  f->consumed = end + 1;
  if (flen > st->max_length)
    return nr_raise(NR_ETOOLONG, "line: frame of more than %zu bytes",
                    st->max_length);
  f->len = st->strip ? flen : end + 1;
  return NR_FRAME_OK;
}

/* ---- delimiter --------------------------------------------------------------- */

/* Could delimiter i start at s and complete with bytes still to come? */
static bool partial_at(const nr_delim_t *st, int i, const char *data,
                       size_t len, size_t s) {
  return s + st->delim_lens[i] > len &&
         memcmp(data + s, st->delims[i], len - s) == 0;
}

/* Where the current frame ends. The delimiter giving the shortest frame
 * wins (ties: the first listed). Returns 1 with *pos and *dlen when that is
 * decided; 0 when it is not (none seen yet, or one that would win may
 * still complete with the next bytes), with *pos set to the first byte at
 * which a delimiter could start: bytes before it surely belong to the
 * frame. So the outcome never depends on how the stream was split. */
static int delim_search(nr_delim_t *st, const char *data, size_t len,
                        size_t *pos, size_t *dlen) {
  size_t keep = st->longest - 1;
  size_t from = st->scanned > keep ? st->scanned - keep : 0;
  if (from > len)
    from = 0;                /* a caller that broke the contract: rescan */
  size_t best = len;
  int k = -1;
  for (int i = 0; i < st->ndelims; i++) {
    const char *p = memmem(data + from, len - from, st->delims[i],
                           st->delim_lens[i]);
    if (p && (size_t)(p - data) < best) {
      best = (size_t)(p - data);
      k = i;
    }
  }
  size_t horizon = best;                 /* partial matches at the end */
  for (int i = 0; i < st->ndelims; i++) {
    size_t dl = st->delim_lens[i];
    for (size_t s = len >= dl ? len - dl + 1 : 0; s < len && s <= horizon; s++)
      if ((s < horizon || (k >= 0 && s == best && i < k)) &&
          partial_at(st, i, data, len, s)) {
        horizon = s;
        k = k >= 0 && s == best && i < k ? -1 : k;
        break;
      }
  }
  if (horizon < best)
    k = -1;
  st->scanned = len;
  *pos = horizon;
  if (k < 0)
    return 0;
  *dlen = st->delim_lens[k];
  st->scanned = 0;
  return 1;
}

int nr_delim_find(nr_delim_t *st, const char *data, size_t len,
                  nr_frame_t *f) {
  *f = (nr_frame_t){0};
  size_t pos = 0, dlen = 0;
  if (delim_search(st, data, len, &pos, &dlen)) {
    f->consumed = pos + dlen;
    if (st->discarding) {                /* the end of a too-long frame */
      st->discarding = false;
      return NR_FRAME_MORE;
    }
    if (pos > st->max_length)
      return nr_raise(NR_ETOOLONG, "delimiter: frame of more than %zu bytes",
                      st->max_length);
    f->len = st->strip ? pos : pos + dlen;
    return NR_FRAME_OK;
  }
  /* Undecided: data[0 .. pos) is frame content for sure. */
  if (st->discarding || pos > st->max_length) {
    f->consumed = pos;                   /* drop it, keep the maybe-delimiter */
    st->scanned = len - pos;
    if (!st->discarding) {
      st->discarding = true;
      return nr_raise(NR_ETOOLONG, "delimiter: frame of more than %zu bytes",
                      st->max_length);
    }
  }
  return NR_FRAME_MORE;
}

/* ---- length_field -------------------------------------------------------------- */

int nr_lenfield_find(nr_lenfield_t *st, const char *data, size_t len,
                     nr_frame_t *f) {
  *f = (nr_frame_t){0};
  if (st->discard > 0) {               /* skipping a too-long frame */
    size_t n = st->discard < len ? (size_t)st->discard : len;
    st->discard -= n;
    f->consumed = n;
    return NR_FRAME_MORE;
  }
  size_t hdr = st->offset + st->length;
  if (len < hdr)
    return NR_FRAME_MORE;
  uint64_t v = nr_get_be(data + st->offset, st->length);
  /* The whole frame: header + value + adjustment, computed without
   * overflow (values past 2^62 are too long for any max_frame anyway). */
  if (v > (1ull << 62)) {
    st->discard = UINT64_MAX;
    f->consumed = len;
    st->discard -= len;
    return nr_raise(NR_ETOOLONG, "length_field: frame of %llu bytes is "
                    "longer than max_frame (%zu)", (unsigned long long)v,
                    st->max_frame);
  }
  int64_t total = (int64_t)v + st->adjustment + (int64_t)hdr;
  if (total < (int64_t)hdr) {
    f->consumed = hdr;                 /* corrupt: skip the header, like Netty */
    return nr_raise(-EBADMSG, "length_field: frame length %lld is shorter "
                    "than its %zu-byte header", (long long)total, hdr);
  }
  if ((uint64_t)total > st->max_frame || (size_t)total < st->strip) {
    size_t n = (uint64_t)total < len ? (size_t)total : len;
    st->discard = (uint64_t)total - n;
    f->consumed = n;
    if ((size_t)total < st->strip)
      return nr_raise(-EBADMSG, "length_field: frame of %lld bytes is "
                      "shorter than strip (%zu)", (long long)total, st->strip);
    return nr_raise(NR_ETOOLONG, "length_field: frame of %lld bytes is "
                    "longer than max_frame (%zu)", (long long)total,
                    st->max_frame);
  }
  if (len < (size_t)total)
    return NR_FRAME_MORE;
  f->off = st->strip;
  f->len = (size_t)total - st->strip;
  f->consumed = (size_t)total;
  return NR_FRAME_OK;
}

/* ---- fixed_length ---------------------------------------------------------------- */

int nr_fixed_find(nr_fixed_t *st, const char *data, size_t len,
                  nr_frame_t *f) {
  (void)data;
  *f = (nr_frame_t){0};
  if (len < st->length)
    return NR_FRAME_MORE;
  f->len = f->consumed = st->length;
  return NR_FRAME_OK;
}

/* ---- the frame decoders as handlers ------------------------------------------------ */

enum { LINE, DELIM, LENFIELD, FIXED };

typedef struct framer_s {
  nr_decoder_t base;         /* first: the base frees the whole struct */
  int kind;
  union {
    nr_line_t line;
    nr_delim_t delim;
    nr_lenfield_t lenfield;
    nr_fixed_t fixed;
  } u;
  char store[];              /* the delimiter codec's delimiters */
} framer_t;

/* One step: find a frame, fire it as bytes borrowed from the input. */
static int framer_step(nr_decoder_t *d, nr_ctx_t *ctx, const char *data,
                       size_t len, size_t *consumed) {
  framer_t *fr = (framer_t *)d;
  nr_frame_t f;
  int rc;
  switch (fr->kind) {
  case LINE: rc = nr_line_find(&fr->u.line, data, len, &f); break;
  case DELIM: rc = nr_delim_find(&fr->u.delim, data, len, &f); break;
  case LENFIELD: rc = nr_lenfield_find(&fr->u.lenfield, data, len, &f); break;
  default: rc = nr_fixed_find(&fr->u.fixed, data, len, &f); break;
  }
  *consumed = f.consumed;
  if (rc == NR_FRAME_OK) {
    nr_bytes_t b = NR_BYTES(data + f.off, f.len);
    nr_ctx_fire_read(ctx, &b);
  }
  return rc < 0 ? rc : 0;
}

static framer_t *framer_new(const char *name, int kind, size_t extra) {
  framer_t *fr = calloc(1, sizeof *fr + extra);
  if (fr == NULL)
    return NULL;
  nr_decoder_init(&fr->base, name, framer_step);
  fr->kind = kind;
  return fr;
}

void *nr_line_new(size_t max_length, bool strip) {
  framer_t *fr = framer_new("line", LINE, 0);
  if (fr)
    fr->u.line = (nr_line_t){.max_length = max_length, .strip = strip};
  return fr;
}

void *nr_delim_new(const char *const *delims, const size_t *lens, int n,
                   size_t max_length, bool strip) {
  if (n < 1 || n > NR_MAX_DELIMITERS) {
    errno = EINVAL;
    return NULL;
  }
  size_t total = 0;
  for (int i = 0; i < n; i++) {
    if (lens[i] == 0) {
      errno = EINVAL;
      return NULL;
    }
    total += lens[i];
  }
  framer_t *fr = framer_new("delimiter", DELIM, total);
  if (fr == NULL)
    return NULL;
  nr_delim_t *st = &fr->u.delim;
  *st = (nr_delim_t){.max_length = max_length, .strip = strip, .ndelims = n,
                     .longest = 1};
  char *p = fr->store;
  for (int i = 0; i < n; i++) {
    memcpy(p, delims[i], lens[i]);
    st->delims[i] = p;
    st->delim_lens[i] = lens[i];
    if (lens[i] > st->longest)
      st->longest = lens[i];
    p += lens[i];
  }
  return fr;
}

void *nr_lenfield_new(const nr_lenfield_t *cfg) {
  if (cfg->length < 1 || cfg->length > 8 || cfg->length == 5 ||
      cfg->length == 6 || cfg->length == 7) {
    errno = EINVAL;
    return NULL;
  }
  framer_t *fr = framer_new("length_field", LENFIELD, 0);
  if (fr) {
    fr->u.lenfield = *cfg;
    fr->u.lenfield.discard = 0;
  }
  return fr;
}

void *nr_fixed_new(size_t length) {
  if (length == 0) {
    errno = EINVAL;
    return NULL;
  }
  framer_t *fr = framer_new("fixed_length", FIXED, 0);
  if (fr)
    fr->u.fixed.length = length;
  return fr;
}

const nr_handler_t nr_line_handler = NR_DECODER_HANDLER("line");
const nr_handler_t nr_delim_handler = NR_DECODER_HANDLER("delimiter");
const nr_handler_t nr_lenfield_handler = NR_DECODER_HANDLER("length_field");
const nr_handler_t nr_fixed_handler = NR_DECODER_HANDLER("fixed_length");

/* ---- length_prepender ---------------------------------------------------------------- */

void *nr_prepender_new(const nr_prepender_t *cfg) {
  if (cfg->length < 1 || cfg->length > 8 || cfg->length == 5 ||
      cfg->length == 6 || cfg->length == 7) {
    errno = EINVAL;
    return NULL;
  }
  nr_prepender_t *st = malloc(sizeof *st);
  if (st)
    *st = *cfg;
  return st;
}

/* Prefix the message with its length as one gathered write, so the payload
 * is copied once, into the outbound buffer. Other messages pass through. */
static int prepender_write(nr_ctx_t *ctx, void *msg, nr_promise_t *p) {
  const nr_prepender_t *st = nr_ctx_state(ctx);
  int type = nr_msg_type(msg);
  if (type != NR_MSG_BYTES && type != NR_MSG_SLICES) {
    nr_ctx_write(ctx, msg, p);
    return 0;
  }
  nr_slice_t small[17], *v = small;
  size_t n = 1, total = 0;
  if (type == NR_MSG_BYTES) {
    const nr_bytes_t *b = msg;
    v[n++] = (nr_slice_t){b->data, b->len};
    total = b->len;
  } else {
    const nr_slices_t *s = msg;
    if (s->n + 1 > 17 && (v = malloc((s->n + 1) * sizeof *v)) == NULL)
      return nr_raise(-ENOMEM, "length_prepender: out of memory");
    for (size_t i = 0; i < s->n; i++, n++) {
      v[n] = s->v[i];
      total += s->v[i].len;
    }
  }
  int64_t value = (int64_t)total + st->adjustment +
                  (st->includes_length ? (int64_t)st->length : 0);
  int rc = 0;
  if (value < 0 || (st->length < 8 &&
                    (uint64_t)value >= 1ull << (8 * st->length))) {
    rc = nr_raise(NR_ETOOLONG, "length_prepender: a message of %zu bytes "
                  "does not fit a %zu-byte length field", total, st->length);
  } else {
    char hdr[8];
    nr_put_be(hdr, st->length, (uint64_t)value);
    v[0] = (nr_slice_t){hdr, st->length};
    nr_slices_t out = {NR_MSG_SLICES, v, n};
    nr_ctx_write(ctx, &out, p);     /* its failures are handled there */
  }
  if (v != small)
    free(v);
  return rc;
}

static void prepender_removed(nr_ctx_t *ctx) { free(nr_ctx_state(ctx)); }

const nr_handler_t nr_prepender_handler = {
    .type = "length_prepender", .removed = prepender_removed,
    .write = prepender_write, .flags = NR_HANDLER_SYNC_WRITE};
