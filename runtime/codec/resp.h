/*
 * resp.h -- a RESP (Redis serialization protocol) request decoder: turns
 * multibulk arrays ("*2\r\n$3\r\nGET\r\n$1\r\nk\r\n") and inline commands
 * ("PING\r\n") into argument vectors. Requests only: replies are plain bytes
 * written by the application.
 *
 * Two layers: nr_resp_parse, a pure function over a byte range (no state,
 * no allocation, so it can be tested and fuzzed on its own), and the
 * pipeline handler nr_resp_handler, which cumulates split requests in an
 * nr_buf_t (no memory held between complete requests) and fires one
 * nr_resp_cmd_t per request. While the channel is unwritable the handler
 * reads and decodes nothing more (a client that never reads its replies),
 * and goes on once they have drained. Loop thread only.
 */
#ifndef NR_CODEC_RESP_H
#define NR_CODEC_RESP_H

#include "netrun.h"

/* A decoded request, fired as a channel_read message. The slices point into
 * the read buffer (or the cumulation): borrowed for the call only. */
#define NR_MSG_RESP (NR_MSG_NATIVE + 6)   /* registered by resp.c */

typedef struct nr_resp_cmd_s {
  int type;                 /* NR_MSG_RESP */
  size_t argc;              /* >= 1 */
  const nr_slice_t *argv;
} nr_resp_cmd_t;

typedef struct nr_resp_limits_s {
  size_t max_bulk;          /* longest argument; default 1 MiB */
  size_t max_args;          /* most arguments in a request; default 1024 */
  size_t max_inline;        /* longest inline request or header line; 64 KiB */
  size_t max_request;       /* a whole request, headers and data; 64 MiB
                               (0: no bound, for the parser alone) */
} nr_resp_limits_t;

#define NR_RESP_MAX_BULK ((size_t)1 << 20)
#define NR_RESP_MAX_ARGS 1024
#define NR_RESP_MAX_INLINE ((size_t)64 << 10)
/* max_args * max_bulk would allow a request of 1 GiB to be cumulated. */
#define NR_RESP_MAX_REQUEST ((size_t)64 << 20)

/* Parse one request from p[0 .. n).
 *  > 0: a request of that many bytes; *argc is its argument count (0 for an
 *       empty inline line or "*0", which a server skips). If *argc <= cap,
 *       argv[0 .. *argc) are filled; otherwise call again with room for
 *       *argc slices.
 *  0:   the request is incomplete: call again with more bytes.
 *  < 0: malformed or over a limit (NR_ETOOLONG for limits, -EPROTO for bad
 *       syntax); *why is a static message such as "invalid bulk length"
 *       (Redis's wording, to follow "Protocol error: "). */
long nr_resp_parse(const char *p, size_t n, const nr_resp_limits_t *lim,
                   nr_slice_t *argv, size_t cap, size_t *argc,
                   const char **why);

extern const nr_handler_t nr_resp_handler;

/* State for nr_resp_handler (NULL on out of memory; zero limits take the
 * defaults). On a malformed request the handler delivers the error
 * ("RESP: Protocol error: <why>") to exception_caught, where a handler may
 * send the replies it holds for earlier requests; then, unless the channel
 * was closed there, writes "-ERR Protocol error: <why>\r\n", flushes and
 * closes. The rest of the input is discarded. */
void *nr_resp_new(const nr_resp_limits_t *lim);

#endif /* NR_CODEC_RESP_H */
