/*
 * nats.h -- the NATS client protocol, server to client: a parser of the
 * operations a server sends (MSG, HMSG, PING, PONG, +OK, -ERR, INFO) and a
 * reader that cumulates them across reads; and the encoder of the client's
 * PUB and HPUB lines. The client logic (handshake, subscriptions,
 * reconnects) is Lua: lua/netrun/nats.lua, through runtime/bindings/lnats.c.
 *
 * nr_nats_parse is a pure function over a byte range (no state, no
 * allocation), so it can be tested at every split point and fuzzed on its
 * own. The reader (nr_nats_reader_t) parses straight from each read and
 * keeps only the bytes of an operation split across reads, in an nr_buf_t
 * that holds no memory between complete operations. It never scans a byte
 * twice while waiting: a control line is searched for its end in the new
 * bytes only, and a payload whose length is known is waited for without
 * parsing. What it holds is bounded by
 * max_control_line + max_message + 2 bytes, whatever the server sends.
 *
 * Thread: none of its own; a reader belongs to whoever feeds it (a loop).
 */
#ifndef NR_CODEC_NATS_H
#define NR_CODEC_NATS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "buf.h"
#include "netrun.h"

enum {
  NR_NATS_MSG = 1,   /* subject, sid, reply (len 0: none), data */
  NR_NATS_HMSG,      /* the same, and hdr (the header block) */
  NR_NATS_PING,
  NR_NATS_PONG,
  NR_NATS_OK,
  NR_NATS_ERR,       /* text: the message, its quotes removed */
  NR_NATS_INFO       /* text: the JSON object */
};

typedef struct nr_nats_op_s {
  int kind;                   /* NR_NATS_* */
  nr_slice_t subject, reply;  /* MSG, HMSG */
  uint64_t sid;               /* MSG, HMSG */
  nr_slice_t hdr;             /* HMSG: header bytes ("NATS/1.0 ..."\r\n\r\n) */
  nr_slice_t data;            /* MSG, HMSG: payload; -ERR, INFO: text */
} nr_nats_op_t;

typedef struct nr_nats_limits_s {
  size_t max_control_line;    /* a line, CRLF included; default 64 KiB */
  size_t max_message;         /* a message's bytes (headers and payload) */
} nr_nats_limits_t;

#define NR_NATS_MAX_CONTROL_LINE ((size_t)64 << 10)
#define NR_NATS_MAX_MESSAGE ((size_t)64 << 20)   /* NATS's own ceiling */

/* Parse one operation from p[0 .. n).
 *  > 0: an operation of that many bytes, in *op (slices into p).
 *  0:   incomplete; *need is the number of bytes the operation needs in
 *       all when its control line is complete (a message waiting for its
 *       payload), else 0 (call again once a line feed arrives).
 *  < 0: malformed or over a limit (-EPROTO, or NR_ETOOLONG for limits);
 *       *why is a static message ("unknown protocol operation"). */
long nr_nats_parse(const char *p, size_t n, const nr_nats_limits_t *lim,
                   nr_nats_op_t *op, size_t *need, const char **why);

/* The reader. Zero limits take the defaults. */
typedef struct nr_nats_reader_s {
  nr_nats_limits_t lim;
  nr_buf_t acc;               /* an operation split across reads */
  size_t need;                /* bytes it needs in all (0: line incomplete) */
} nr_nats_reader_t;

/* Called for each operation in order; the slices are valid for the call
 * only. Return 0 to go on, anything else to stop: feed then returns that
 * value and drops the rest of its input (a connection being closed). It
 * must not feed or reset the reader. */
typedef int (*nr_nats_op_fn)(void *ud, const nr_nats_op_t *op);

void nr_nats_reader_init(nr_nats_reader_t *r, const nr_nats_limits_t *lim);
/* Feed n bytes: 0 when all were consumed or kept, the callback's non-zero
 * value when it stopped, or < 0 on a protocol error (*why set; the reader
 * is reset, and the rest of the input is dropped) or -ENOMEM. */
int nr_nats_reader_feed(nr_nats_reader_t *r, const char *p, size_t n,
                        nr_nats_op_fn fn, void *ud, const char **why);
/* Forget what is kept (a new connection starts afresh); frees memory. */
void nr_nats_reader_reset(nr_nats_reader_t *r);

/* A subject or reply subject a client may send: 1..max bytes with no
 * space, tab, CR, LF or NUL (the protocol's separators). */
bool nr_nats_valid_subject(const char *s, size_t n);

/* The control line of a publication, written at out (room for
 * nr_nats_pub_line_max(...) bytes): "PUB subject [reply] size\r\n", or
 * with hdr_len > 0 "HPUB subject [reply] hdr_len total\r\n" where total
 * is hdr_len + data_len. Returns its length. */
size_t nr_nats_pub_line(char *out, const char *subject, size_t slen,
                        const char *reply, size_t rlen, size_t hdr_len,
                        size_t data_len);
static inline size_t nr_nats_pub_line_max(size_t slen, size_t rlen) {
  return 5 + slen + 1 + rlen + 1 + 2 * 20 + 2 + 2;
}

#endif /* NR_CODEC_NATS_H */
