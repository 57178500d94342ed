/*
 * http_hold.h -- the answers the HTTP/1.1 server codec holds back
 * (http_server.c, "answering in order"): the bytes of a response written
 * for a pipelined request while an earlier request's answer is still
 * owed, kept per ring slot in the order they were written, each write
 * with its promise, until the earlier answers are out. Loop thread only:
 * a hold belongs to one connection.
 *
 * A segment holds the bytes of consecutive writes; a write with a promise
 * ends its segment, so the promise completes when the last of its bytes
 * has left (the bytes before it leave first, in the same write). Memory:
 * nothing until a connection first holds an answer; then a table of
 * NR_HTTP_HOLD_SLOTS queues (1 KiB) and the held bytes, which the codec
 * counts toward the channel's water marks (nr_channel_hold_bytes).
 */
#ifndef NR_CODEC_HTTP_HOLD_H
#define NR_CODEC_HTTP_HOLD_H

#include <stdbool.h>
#include <stddef.h>

#include "netrun.h"

#define NR_HTTP_HOLD_SLOTS 64   /* http_server.c's RING */

typedef struct nr__http_hold_s nr__http_hold_t;

/* Keep a copy of msg's bytes (NR_MSG_BYTES or NR_MSG_SLICES; a file
 * region's are read: -ENODATA if the file is shorter) for slot i,
 * after what it holds; p (or NULL) is retained and completes when they
 * are written. *h is made at the first use. The bytes kept, or -ENOMEM
 * (p untouched: the caller fails it). */
ptrdiff_t nr__http_hold_add(nr__http_hold_t **h, unsigned i, const void *msg,
                            nr_promise_t *p);
/* Whether slot i holds bytes. */
static inline bool nr__http_hold_has(const nr__http_hold_t *h, unsigned i);
/* Write slot i's oldest segment to ctx (nr_ctx_write, with its promise),
 * unlinked first: what is written for slot i meanwhile (a handler that
 * writes from the write's events) queues behind the rest. *n gets its
 * length. The write's result. */
int nr__http_hold_pop(nr__http_hold_t *h, unsigned i, nr_ctx_t *ctx,
                      size_t *n);
/* Whether h holds nothing (NULL: true). */
bool nr__http_hold_empty(const nr__http_hold_t *h);
/* Drop what slot i holds, failing its promises (NR_ECLOSED): its answer
 * will never be sent. The bytes dropped. */
size_t nr__http_hold_drop(nr__http_hold_t *h, unsigned i);
/* Drop everything and free h (NULL: nothing). The bytes dropped. */
size_t nr__http_hold_free(nr__http_hold_t *h);

/* ---- inline ---- */

struct nr__http_hold_q {
  struct nr__http_hold_seg *first, *last;
};
struct nr__http_hold_s {
  struct nr__http_hold_q q[NR_HTTP_HOLD_SLOTS];
};

static inline bool nr__http_hold_has(const nr__http_hold_t *h, unsigned i) {
  return h != NULL && h->q[i].first != NULL;
}

#endif /* NR_CODEC_HTTP_HOLD_H */
