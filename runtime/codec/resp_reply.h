/*
 * resp_reply.h -- the client side of RESP: a reply scanner and tokenizer
 * for RESP2 and RESP3 (what a Redis server sends back), and the cluster
 * key slot. resp.h is the server side (requests).
 *
 * Pure functions over bytes: no allocation, no I/O, nothing of Lua. The
 * bindings (runtime/bindings/lredis.c) cumulate a connection's bytes,
 * call nr_resp_reply_scan until a reply is complete, then walk that
 * reply's tokens with nr_resp_reply_token to build its value. Splitting
 * the work in two keeps the builder simple (it only ever sees whole,
 * checked replies) and the scanner resumable: it remembers how far it
 * got, so a reply arriving in many pieces (an LRANGE of a million
 * elements over a hundred reads) is scanned once, not once per piece;
 * only the header line of a bulk string whose data is still incomplete
 * is read again.
 *
 * Bounds (nr_resp_reply_limits_t), each checked as soon as the bytes
 * that break it are seen, never after buffering them: the size of one
 * reply (a bulk length over it fails at its header line, before a byte of
 * its data arrives), the nesting of aggregates, and the length of a
 * line (a simple string, an error, a number).
 *
 * Types: RESP2's + - : $ * and RESP3's _ # , ( ! = % ~ > | (null,
 * boolean, double, big number, bulk error, verbatim string, map, set,
 * push, attribute). An attribute (|) is metadata before a value and is
 * not itself an element: the scanner counts the value after it, and the
 * builder skips it. RESP3's streamed strings and aggregates ($?, *?) are
 * refused (no Redis sends them).
 */
#ifndef NR_CODEC_RESP_REPLY_H
#define NR_CODEC_RESP_REPLY_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define NR_RESP_REPLY_DEPTH 64                 /* the most max_depth may be */
#define NR_RESP_REPLY_MAX ((size_t)64 << 20)   /* max_reply's default */
#define NR_RESP_REPLY_MAX_DEPTH 32             /* max_depth's default */
#define NR_RESP_REPLY_MAX_LINE ((size_t)64 << 10)  /* max_line's default */

typedef struct nr_resp_reply_limits_s {
  size_t max_reply;   /* bytes of one reply, every header and datum */
  size_t max_depth;   /* aggregates open at once, 1..NR_RESP_REPLY_DEPTH */
  size_t max_line;    /* a line's bytes before its CRLF */
} nr_resp_reply_limits_t;

/* Where a scan stands in the reply it has not finished. Zero it (or use
 * NR_RESP_SCAN_INIT) before the first reply; a complete reply or an error
 * resets it. */
typedef struct nr_resp_scan_s {
  size_t off;                            /* bytes of the reply scanned */
  unsigned depth;                        /* aggregates open */
  int64_t left[NR_RESP_REPLY_DEPTH];     /* elements still due at each */
  uint64_t attr;                         /* bit d: depth d is an attribute */
} nr_resp_scan_t;

#define NR_RESP_SCAN_INIT ((nr_resp_scan_t){0})

/* Scan the reply that starts at p[0] (n bytes buffered, the same first
 * bytes as the previous call while it returned 0).
 *  > 0: the first reply is complete and that many bytes long; st is reset.
 *  0:   incomplete: call again with more bytes.
 *  < 0: malformed (-EPROTO) or over a limit (-EMSGSIZE); *why is a static
 *       message ("invalid bulk length", "reply too large", ...); st is
 *       reset. The connection cannot be trusted after it. */
long nr_resp_reply_scan(nr_resp_scan_t *st, const char *p, size_t n,
                        const nr_resp_reply_limits_t *lim, const char **why);

/* One token of a scanned reply. */
typedef struct nr_resp_token_s {
  char type;          /* the type byte: '+', '$', '*', ... */
  bool null;          /* $-1, *-1 or _ */
  const char *data;   /* strings, errors, doubles, big numbers: the bytes */
  size_t len;         /*   (a verbatim string's without its "txt:") */
  int64_t n;          /* ':' the integer; '#' 1 or 0; aggregates: the
                         elements that follow (a map's and an attribute's
                         count twice its pairs) */
} nr_resp_token_t;

/* Read the token at p (n bytes, inside a reply nr_resp_reply_scan
 * accepted): its length, or 0 if the bytes are not a whole token (which
 * cannot happen in a scanned reply). */
size_t nr_resp_reply_token(const char *p, size_t n, nr_resp_token_t *t);

/* The Redis Cluster slot of a key (0..16383): CRC16/XMODEM of the key,
 * or of the part between the first '{' and the next '}' when that part is
 * not empty (a hash tag), modulo 16384. */
unsigned nr_resp_key_slot(const char *key, size_t len);

#endif /* NR_CODEC_RESP_REPLY_H */
