/*
 * http_encode.h -- the HTTP/1.1 response encoder's pieces that the server
 * handler (http_server.c) assembles responses from; defined in
 * http_encode.c, but for the unchecked writes below, which are inline
 * because every response makes a dozen of them. Loop thread only: the
 * scratch buffer and the cached status prefix and date are per thread.
 */
#ifndef NR_CODEC_HTTP_ENCODE_H
#define NR_CODEC_HTTP_ENCODE_H

#include <stdbool.h>
#include <stdint.h>
#include <string.h>

#include "codec/http.h"

/* Kept out of a caller whose usual path is short, so that path does not
 * save and restore the registers the rest needs. */
#define NOINLINE __attribute__((noinline))

/* A body up to this size is copied after its head, so that the response
 * is one write; a larger one follows as a second write (in place) or slice
 * (of the same gathered write), not copied. */
#define SMALL_BODY 4096

#define DATE_LEN 29           /* an IMF-fixdate */

/* A response the handler should not have written (http_server.c, also
 * HTTP/2's h2_out.c): -EINVAL raised for the write; with a promise, which
 * only that fails, the misuse is fired to exception_caught as well. */
int nr__http_misuse(nr_ctx_t *ctx, nr_promise_t *p, const char *fmt, ...)
    __attribute__((format(printf, 3, 4), cold));

/* What the user's headers set that netrun would otherwise add. */
enum { U_SERVER = 1, U_DATE = 2, U_LENGTH = 4, U_CONN = 8, U_CLOSE = 16 };

/* An output buffer: the end of the channel's outbound buffer when the
 * codec's writes go straight there (nr_ctx_write_reserve: the bytes are
 * encoded in place, with no copy), else the thread's scratch when free
 * (encoding never nests in practice, but a handler between us and the head
 * could write again), else the heap. */
typedef struct out_s {
  char *p;
  size_t len, cap;
  bool scratch, failed;
  bool direct;                /* p is reserved room in the outbound buffer */
} out_t;

/* Start o on the scratch buffer (or empty, the heap, when it is busy). */
void nr__http_out_init(out_t *o);
/* Make room for n more bytes past o->len; o->failed when out of memory. */
void nr__http_out_grow(out_t *o, size_t n);
/* Give back what o holds (the scratch, or its heap copy). */
void nr__http_out_done(out_t *o);
void nr__http_out_str(out_t *o, const char *s);
/* v in base 10 or 16. */
void nr__http_out_uint(out_t *o, uint64_t v, unsigned base);

/* Room for n more bytes: where to write them (then set o->len past what
 * was written), or NULL when out of memory (o->failed). */
static inline char *out_reserve(out_t *o, size_t n) {
  if (o->len + n > o->cap) {
    nr__http_out_grow(o, n);
    if (o->failed)
      return NULL;
  }
  return o->p + o->len;
}

static inline void out_put(out_t *o, const char *s, size_t n) {
  char *w = out_reserve(o, n);
  if (w != NULL) {
    memcpy(w, s, n);
    o->len += n;
  }
}
#define OUT_LIT(o, lit) out_put((o), lit, sizeof lit - 1)

/* Room for a response of at most need bytes: in place when it can be (no
 * promise to attach), else in a buffer written on as one message. */
static inline char *out_start(out_t *o, nr_ctx_t *ctx, size_t need,
                              nr_promise_t *p) {
  char *w = p == NULL ? nr_ctx_write_reserve(ctx, need) : NULL;
  if (w != NULL) {
    *o = (out_t){.p = w, .cap = need, .direct = true};
    return w;
  }
  nr__http_out_init(o);
  return out_reserve(o, need);
}

/* Unchecked writes into reserved room: each returns the end of its bytes. */
static inline char *put(char *w, const void *s, size_t n) {
  memcpy(w, s, n);
  return w + n;
}
#define PUT_LIT(w, lit) put((w), lit, sizeof lit - 1)

/* v in base 10 or 16: at most 20 digits. */
static inline char *put_uint(char *w, uint64_t v, unsigned base) {
  size_t n = 1;
  for (uint64_t t = v; t >= base; t /= base)
    n++;
  for (size_t i = n; i-- > 0; v /= base)
    w[i] = "0123456789abcdef"[v % base];
  return w + n;
}

/* The room put_status needs for a reason (NULL: the standard one). */
static inline size_t status_room(const char *reason) {
  /* "HTTP/1.1 NNN " reason CRLF, Server, Date: 68 bytes besides the reason,
   * and no standard reason is longer than 31 */
  return 68 + (reason ? strlen(reason) : 31);
}

static inline bool bodyless_status(int status) {
  return status < 200 || status == 204 || status == 304;
}

/* The U_* flags of r's headers; *room gets the bytes they take in a head. */
unsigned nr__http_user_flags(const nr_http_response_t *r, size_t *room);
/* The status line plus Server and Date (each unless the user's headers
 * give it, `user`) at w, in room for status_room(reason) bytes; returns
 * the end. */
char *nr__http_put_status(char *w, int status, const char *reason,
                          unsigned user);
/* The user's header lines. */
char *nr__http_put_headers(char *w, const nr_http_response_t *r);

#endif /* NR_CODEC_HTTP_ENCODE_H */
