/*
 * http_client.h -- the HTTP/1.1 client codec: a request encoder, an
 * incremental response parser and the native pipeline handler built from
 * them (Netty's HttpClientCodec, with aggregation: one message per whole
 * response).
 *
 * The parser is a plain function over bytes (no channel, no Lua), so tests
 * and the fuzzer drive it directly. It knows which responses it waits for
 * (nr_http_client_expect, one per request sent, in order): a response to
 * HEAD has no body, nor has a 204, a 304 or a 1xx; 1xx other than 101 are
 * skipped, at most NR_HTTPC_MAX_INFO before a final response (more: a
 * malformed response -- a peer sending "100 Continue" without end would
 * hold the loop parsing them). A body is framed by Transfer-Encoding:
 * chunked, else by Content-Length, else it runs until the server closes
 * (nr_http_client_end delivers it then). Responses point into the fed bytes or the parser's
 * buffers: borrowed, valid only during the callback that receives them.
 *
 * The handler (nr_http_client_handler) is loop thread only. Outbound it
 * encodes NR_MSG_HTTP_CALL messages (other messages pass); inbound it
 * turns bytes into NR_MSG_HTTP_REPLY messages. A malformed or oversized
 * response, or a close in the middle of one, is reported to
 * exception_caught of the handlers after it with a message saying which
 * ("http_client: ...") and the channel is closed: what follows on that
 * connection cannot be trusted.
 */
#ifndef NR_CODEC_HTTP_CLIENT_H
#define NR_CODEC_HTTP_CLIENT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "codec/http.h"

/* Its messages (registered by http_client.c as the program loads). */
#define NR_MSG_HTTP_CALL (NR_MSG_NATIVE + 4)      /* a request to send */
#define NR_MSG_HTTP_REPLY (NR_MSG_NATIVE + 5)     /* a response received */

/* Requests sent and not yet answered, at most (a write past it fails). */
#define NR_HTTPC_RING 64

/* A request to encode. Host is the caller's to give (it knows the URL);
 * Content-Length is added when there is a body and neither it nor
 * Transfer-Encoding is among the headers. */
typedef struct nr_http_call_s {
  int type;                       /* NR_MSG_HTTP_CALL */
  uint64_t tag;                   /* HTTP/2: echoed in the reply (the
                                     connection answers in any order) */
  bool cancel;                    /* HTTP/2: reset the stream of `tag`
                                     (the other fields unused) */
  const char *method, *target;    /* "GET", "/a?b=1" */
  size_t method_len, target_len;
  const nr_http_header_t *headers;
  size_t nheaders;
  const char *body;               /* NULL: none */
  size_t body_len;
} nr_http_call_t;

/* A response, whole. */
typedef struct nr_http_reply_s {
  int type;                       /* NR_MSG_HTTP_REPLY */
  uint64_t tag;                   /* HTTP/2: its request's; 0 on HTTP/1.x */
  const char *error;              /* HTTP/2: the stream failed (reset, too
                                     large): why; the rest is unset */
  bool retry;                     /* ... and the server did not process it
                                     (REFUSED_STREAM, past a GOAWAY) */
  bool h2;                        /* came over HTTP/2 */
  int status;                     /* 100..999 */
  int minor;                      /* HTTP/1.<minor> */
  bool keep_alive;                /* the connection may carry another */
  bool chunked;
  bool raw;                       /* the codec's raw option (for its binding) */
  bool head;                      /* the answer to a HEAD: its Content-Length
                                     is the one a GET would have had */
  /* Streamed responses (the parser's stream): the head of one whose
   * body follows in pieces (streaming: body ""), or one of those pieces
   * (piece: body and body_len, last on the last one, which carries a
   * chunked body's trailers in trailers/ntrailers; no other field set). */
  bool streaming, piece, last;
  const char *reason;
  size_t reason_len;
  const char *body;               /* never NULL */
  size_t body_len;
  size_t nheaders, ntrailers;
  const nr_http_header_t *trailers;    /* == headers + nheaders */
  nr_http_header_t headers[NR_HTTP_MAX_HEADERS];
} nr_http_reply_t;

/* ---- parser --------------------------------------------------------------- */

/* Receives each whole response; a non-zero return stops the parser (the
 * rest of the input is discarded). */
typedef int (*nr_http_reply_cb)(void *arg, nr_http_reply_t *r);

typedef struct nr_http_client_parser_s {
  nr_http_parser_t base;          /* limits, cumulation, chunked state */
  int phase;                      /* what the bytes at base.in are (private) */
  uint64_t length;                /* Content-Length of the body in hand */
  uint8_t sent[NR_HTTPC_RING];    /* per request sent: NR_HTTPC_HEAD */
  unsigned nsent, oldest;
  unsigned info;                  /* 1xx skipped since the last final response */
  bool stopped;
  bool upgraded;                  /* stopped after a 101: not an error */
  nr_buf_t rest;                  /* after a 101: the bytes that followed
                                     it in its read, for the next protocol
                                     (the handler passes them on) */
  bool stream;                    /* bodies in pieces (set after init) */
  bool sclose;                    /* the streamed body runs to the close */
  const char *why;                /* the error's cause, for its message */
} nr_http_client_parser_t;

#define NR_HTTPC_HEAD 1
/* Informational responses (100 Continue, 103 Early Hints) taken before a
 * final one, at most: Go's http.Transport allows 5 too. */
#define NR_HTTPC_MAX_INFO 5

/* Errors: the kind of a failed feed or end (the parser accepts nothing
 * more after one; p->why says what exactly). */
enum {
  NR_HTTPC_STOPPED = 1,           /* the callback stopped it */
  NR_HTTPC_MALFORMED,             /* not HTTP/1.x, bad framing */
  NR_HTTPC_TOO_LARGE,             /* body over max_body */
  NR_HTTPC_HEADER_TOO_LARGE,      /* head over max_header or max_headers */
  NR_HTTPC_UNEXPECTED,            /* a response to no request */
  NR_HTTPC_TRUNCATED,             /* input ended inside a response */
  NR_HTTPC_NOMEM,
};

void nr_http_client_parser_init(nr_http_client_parser_t *p, size_t max_header,
                                size_t max_body, size_t max_headers);
void nr_http_client_parser_free(nr_http_client_parser_t *p);
/* A request was sent: expect its response (flags: NR_HTTPC_HEAD). 0, or
 * -EBUSY with NR_HTTPC_RING requests unanswered. */
int nr_http_client_expect(nr_http_client_parser_t *p, unsigned flags);
/* Feed bytes: 0 (all consumed or kept), or one of the errors above. */
int nr_http_client_feed(nr_http_client_parser_t *p, const char *data,
                        size_t len, nr_http_reply_cb cb, void *arg);
/* End of input: delivers a body that runs until the close; 0, or
 * NR_HTTPC_TRUNCATED when a response had begun and not ended (or a
 * request sent had no response at all: p->why tells them apart). */
int nr_http_client_end(nr_http_client_parser_t *p, nr_http_reply_cb cb,
                       void *arg);
/* Is a response under way (bytes of it received)? */
bool nr_http_client_busy(const nr_http_client_parser_t *p);

/* ---- encoder -------------------------------------------------------------- */

/* The bytes of c's head (request line, headers, any Content-Length, blank
 * line) and the encoding of it into out, which has that many. c must be
 * checked (tokens, field values, a target without controls or spaces). */
size_t nr_http_call_head_size(const nr_http_call_t *c);
size_t nr_http_call_encode_head(const nr_http_call_t *c, char *out);

/* ---- the handler ------------------------------------------------------------ */

/* HTTP/2: off; where TLS agrees ALPN "h2" (the TLS config must offer it);
 * always (h2c by prior knowledge on a plain connection; over TLS, a
 * server that does not agree "h2" fails the connection). */
enum { NR_H2C_OFF, NR_H2C_AUTO, NR_H2C_ON };

typedef struct nr_http_client_opts_s {
  size_t max_header, max_body, max_headers;
  bool raw;                       /* replies marked raw (see nr_http_reply_t) */
  /* Bodies as streams: a response with a body comes as its head
   * (streaming), then its body as NR_MSG_HTTP_BODY pieces (nr_http_body_t
   * of codec/http.h, token 0), one per read at most; max_body still
   * bounds the whole. Whoever reads them paces the connection (its
   * auto_read): the codec holds no piece. */
  bool stream;
  int h2;                         /* NR_H2C_* */
} nr_http_client_opts_t;

/* A handler state for nr_http_client_handler; freed by its removed(). */
void *nr_http_client_new(const nr_http_client_opts_t *o);
extern const nr_handler_t nr_http_client_handler;

/* The handler's members, for a binding that puts a Lua-aware write in
 * front (lhttp_client.c). */
void nr_http_client_removed(nr_ctx_t *ctx);
int nr_http_client_channel_read(nr_ctx_t *ctx, void *msg);
int nr_http_client_inactive(nr_ctx_t *ctx);
int nr_http_client_write(nr_ctx_t *ctx, void *msg, nr_promise_t *p);
int nr_http_client_user_event(nr_ctx_t *ctx, void *evt);
int nr_http_client_active(nr_ctx_t *ctx);
/* Loop thread. The connection's next responses come streamed (on) or
 * whole, whatever the option said: a forwarder that streams one exchange
 * on a pooled connection (lhttp_xfer.c) turns it on for that exchange.
 * ctx: the codec's context. False when the codec speaks HTTP/2 or can
 * carry no more responses. */
bool nr_http_client_set_stream(nr_ctx_t *ctx, bool on);

#endif /* NR_CODEC_HTTP_CLIENT_H */
