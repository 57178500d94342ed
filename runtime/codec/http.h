/*
 * http.h -- the HTTP/1.1 server codec: an incremental request parser, a
 * response encoder and the native pipeline handler built from them.
 *
 * The parser is a plain function over bytes (no channel, no Lua), so tests
 * and the fuzzer drive it directly. A request is parsed straight from the
 * bytes it is fed; only an incomplete tail is cumulated (nr_buf_t), so an
 * idle keep-alive connection holds no buffer. Parsed requests point into
 * the fed bytes or the cumulation: they are borrowed, valid only during the
 * callback that receives them (the pipeline's message convention).
 *
 * The handler (nr_http_server_*) is loop thread only, like every handler.
 * Inbound it turns bytes into NR_MSG_HTTP_REQUEST messages; outbound it
 * encodes NR_MSG_HTTP_RESPONSE messages (status line, Server, Date,
 * Content-Length or chunked, Connection: close when closing) and, while a
 * streamed response is open, turns byte writes into chunks (a zero-length
 * write ends the stream).
 */
#ifndef NR_CODEC_HTTP_H
#define NR_CODEC_HTTP_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "codec/buf.h"
#include "codec/h2.h"
#include "netrun.h"

/* Its messages (registered by http_parse.c as the program loads). */
#define NR_MSG_HTTP_REQUEST (NR_MSG_NATIVE + 1)
#define NR_MSG_HTTP_RESPONSE (NR_MSG_NATIVE + 2)
#define NR_MSG_HTTP_PREPARED (NR_MSG_NATIVE + 3)  /* a response encoded ahead */

/* Header lines per request, trailers included: max_headers by default,
 * and the most it may be (the parser's header array lives on the stack of
 * nr_http_feed, not in the connection). More is answered with 431. */
#define NR_HTTP_DEFAULT_MAX_HEADERS 64
#define NR_HTTP_MAX_HEADERS 512

typedef struct nr_http_header_s {
  const char *name, *value;       /* as received: names keep their case */
  size_t name_len, value_len;
} nr_http_header_t;

typedef struct nr_http_request_s {
  int type;                       /* NR_MSG_HTTP_REQUEST */
  /* path: as handlers should judge it -- an absolute-form target's path
   * ("GET http://a.example/x" is "/x"; its Host is then the target's
   * authority, RFC 9112 3.2.2), normalized as nginx does (dot segments
   * resolved, "//" merged, %XX of an unreserved byte decoded, other
   * %XX in upper case); "*" (OPTIONS) and a CONNECT's authority as they
   * came. query: after '?', NULL if none, as it came. target: the
   * request-target as it came (path and query included). */
  const char *method, *path, *query, *target;
  size_t method_len, path_len, query_len, target_len;
  int minor;                      /* HTTP/1.<minor>: 0 or 1 (higher reads as 1) */
  int32_t stream;                 /* HTTP/2: its stream (minor is 1); 0 for
                                     HTTP/1.x */
  bool keep_alive;                /* HTTP/1.0 and 1.1 rules with Connection */
  bool expect_continue;           /* Expect: 100-continue */
  bool chunked;                   /* the body came chunked */
  bool head;                      /* method HEAD: the response has no body */
  bool switches;                  /* CONNECT, or an Upgrade header: what
                                     follows may not be HTTP */
  bool streaming;                 /* a streaming parser's head: its body
                                     follows as NR_HTTP_EV_BODY pieces */
  bool last;                      /* NR_HTTP_EV_BODY: the body's last piece */
  bool rewritten;                 /* a field is not where the request's
                                     bytes have it: the path normalized,
                                     or Host taken from an absolute-form
                                     target (or added, for HTTP/1.0): copy
                                     fields one by one */
  const char *body;               /* never NULL; "" when there is none */
  size_t body_len;
  size_t nheaders;                /* the head's fields: headers[0 .. n) */
  size_t ntrailers;               /* a chunked body's trailer fields, kept
                                     apart: trailers[0 .. n), never merged
                                     into the headers */
  const nr_http_header_t *trailers;    /* == headers + nheaders */
  /* Set by the server codec as it fires the request: its read token
   * (nr_ctx_fire_read_tokened) and the pipeline it was read on, which a
   * binding keeps with a copy of the request, so that a handler that
   * raises on that copy fired on later is answered for (a 500). */
  uint64_t token;
  const void *pipeline;
  /* A streamed head's: the server codec's context, for whoever takes its
   * body (nr_http_server_claim_body), and the body's framing. */
  nr_ctx_t *codec;
  uint64_t content_length;        /* (of a body not chunked) */
  nr_http_header_t headers[NR_HTTP_MAX_HEADERS];
} nr_http_request_t;

typedef struct nr_http_response_s {
  int type;                       /* NR_MSG_HTTP_RESPONSE */
  int status;                     /* 100..999 */
  const char *reason;             /* NULL: the standard phrase */
  const nr_http_header_t *headers;
  size_t nheaders;
  const char *body;
  size_t body_len;
  bool stream;                    /* body follows as chunks: byte writes
                                     (or file regions), ended by a
                                     zero-length write. Sized when the
                                     headers have Content-Length: the
                                     writes go as they are, and must add
                                     up to it (a static file's body) */
} nr_http_response_t;

/* A response encoded once, to be written many times: the status line,
 * Server, Date, Content-Length, the user's headers, the blank line and the
 * body are kept as bytes; each write fills in the date (unless the user's
 * headers have one), adds Connection as the request needs and leaves the
 * body out for HEAD. It is plain bytes, no pointers, so it may be copied
 * anywhere. */
typedef struct nr_http_prepared_s {
  int type;                       /* NR_MSG_HTTP_PREPARED */
  int status;
  unsigned user;                  /* what the user's headers set (private) */
  uint32_t head_len;              /* the head up to its blank line */
  uint32_t date_at;               /* where the Date value is; 0: no Date */
  uint32_t body_len;
  uint32_t plain_len;             /* bytes a keep-alive HTTP/1.1 GET gets
                                     as they are; 0: none do */
  char bytes[];                   /* head; CRLF; body */
} nr_http_prepared_t;

/* ---- streamed request bodies (the codec's body = "stream") ------------------- */

/* A piece of a streamed request body, as the codec hands it up (fired to
 * the handlers after it, or given to the sink that claimed the body). */
#define NR_MSG_HTTP_BODY (NR_MSG_NATIVE + 10)
typedef struct nr_http_body_s {
  int type;                       /* NR_MSG_HTTP_BODY */
  bool last;                      /* the body's end */
  const char *data;               /* borrowed: valid during the call */
  size_t len;                     /* never 0 but for the last */
  const nr_http_header_t *trailers;    /* with the last: a chunked body's */
  size_t ntrailers;
  uint64_t token;                 /* its request's read token */
  int32_t stream;                 /* HTTP/2: its request's stream; 0 for
                                     HTTP/1.x */
} nr_http_body_t;

/* A consumer of a streamed body in C (a forwarder), which takes it from
 * the codec instead of the handlers (nr_http_server_claim_body). Its
 * callbacks run on the loop, from inside the codec: they must not feed
 * the codec bytes, and may close channels. */
typedef struct nr_http_sink_s nr_http_sink_t;
struct nr_http_sink_s {
  /* A piece (b->last: the end, after which the codec forgets k). true:
   * go on; false: the codec reads nothing more until
   * nr_http_server_resume_body. */
  bool (*piece)(nr_http_sink_t *k, const nr_http_body_t *b);
  /* The body will not come whole -- the client left or sent garbage
   * (why) -- or the codec went away; the codec has forgotten k. */
  void (*abort)(nr_http_sink_t *k, const char *why);
};

/* ---- parser --------------------------------------------------------------- */

/* The parser's steps (http_parse.c) speak a local code space, apart from -errno
 * and NR_E*: a step returns a length or 0 (more input needed) when it
 * goes well, and the negative of the HTTP status the request earns when it
 * does not; a check returns the status itself, or NR_HTTP_NEED (-1) for
 * "not whole yet". nr_http_feed turns a failure into the positive status
 * it returns, so these codes never leave the parser. */
enum {
  NR_HTTP_NEED = -1,              /* incomplete: feed more */
  NR_HTTP_E_BAD = -400,           /* malformed (see nr_http_feed) */
  NR_HTTP_E_TOO_LARGE = -413,     /* body, or chunk framing, too large */
  NR_HTTP_E_HEADERS = -431,       /* header block or field count too large */
  NR_HTTP_E_NOMEM = -500,         /* out of memory */
  NR_HTTP_E_CODING = -501,        /* unsupported transfer coding */
  NR_HTTP_E_VERSION = -505,       /* HTTP version not supported */
};

enum { NR_HTTP_EV_REQUEST, NR_HTTP_EV_CONTINUE, NR_HTTP_EV_BODY };

/* Receives each complete request (EV_REQUEST) and, for a request with
 * Expect: 100-continue whose body has not all arrived, EV_CONTINUE once
 * (req then holds the request line and headers, no body). A streaming
 * parser (p->stream) gives a request with a body as its head (EV_REQUEST
 * with req->streaming, no body: no EV_CONTINUE) as soon as the head is
 * whole, then the body in pieces as they arrive (EV_BODY: req->body and
 * body_len a piece -- borrowed, and never empty but for the last --,
 * req->last on the last one, which carries a chunked body's trailers in
 * req->trailers; no other field is set). Chunked framing is decoded;
 * what one feed brings of a body is one piece. A return of
 * NR_HTTP_PAUSE after a request keeps the rest of the input for a later
 * feed (one of 0 bytes resumes); any other non-zero return stops the
 * parser: the rest of the input is discarded. */
#define NR_HTTP_PAUSE 2
/* A return of NR_HTTP_SWITCHED after a request stops the parser too, but
 * keeps the bytes after that request in p->in (they belong to the
 * protocol the connection switched to): the caller hands them over. */
#define NR_HTTP_SWITCHED 3
typedef int (*nr_http_cb)(void *arg, int ev, nr_http_request_t *req);

typedef struct nr_http_parser_s {
  size_t max_header, max_body;
  nr_buf_t in;                    /* cumulation, from a request's first byte */
  nr_buf_t body;                  /* the decoded chunked body so far */
  int phase;
  size_t scan;                    /* header search resumes at this line */
  size_t head_len;                /* request line + headers + blank line */
  size_t pos;                     /* chunked: raw input parsed up to here */
  uint64_t chunk_left;
  uint64_t content_length;
  uint16_t max_headers;           /* fields per request, trailers included */
  bool continue_sent;
  bool line_ok;                   /* the request line was checked already */
  bool stopped;                   /* the callback stopped it, or an error */
  /* Streaming (the server's body = "stream"): bodies go to the callback
   * in pieces, never held whole (see nr_http_cb). */
  bool stream;                    /* set by the caller after init */
  bool sbody;                     /* a body is being streamed: then
                                     content_length counts what is left
                                     of a known length, or what came of a
                                     chunked one */
  uint32_t piece_at, piece_len;   /* a chunked piece's data while it is
                                     one run of the input (no copy): its
                                     offset there; 0 bytes: none */
  char *norm;                     /* a normalized path (request.path), kept
                                     until nr_http_feed returns */
  size_t norm_cap;
} nr_http_parser_t;

/* max_headers is clamped to 1 .. NR_HTTP_MAX_HEADERS. */
void nr_http_parser_init(nr_http_parser_t *p, size_t max_header,
                         size_t max_body, size_t max_headers);
void nr_http_parser_free(nr_http_parser_t *p);
/* Feed bytes. Returns 0 (all consumed or cumulated), an HTTP status for bad
 * input (400 malformed, 413 body too large, 431 header block over
 * max_header or more than max_headers fields, 501 unsupported transfer
 * coding, 505 version; 500 out of memory) after which the parser accepts
 * nothing more, or 1 when the callback stopped it. 400 covers, besides
 * syntax (a request line is refused at its first bad byte): an HTTP/1.1
 * request without exactly one valid Host, a second Host in any version,
 * Transfer-Encoding in HTTP/1.0, a repeated Transfer-Encoding, a
 * Content-Length or chunk size beyond 2^63 - 1, Content-Length with
 * Transfer-Encoding, a trailer naming a field that frames, routes or
 * authorises the message (trailer_forbidden), and a request-target that
 * is none of origin-form, absolute-form (userinfo refused), "*" for
 * OPTIONS, authority-form for CONNECT, or whose path has '#', a bad or
 * NUL %XX, climbs above the root, or has a dot segment behind an encoded
 * slash ("/a/..%2Fb": normalize_path). */
int nr_http_feed(nr_http_parser_t *p, const char *data, size_t len,
                 nr_http_cb cb, void *arg);

/* ---- encoder -------------------------------------------------------------- */

/* RFC 9110 token (header names, methods) and field-value checks. */
bool nr_http_is_token(const char *s, size_t n);
bool nr_http_is_field_value(const char *s, size_t n);
/* The standard reason phrase of a status ("Unknown" if none). */
const char *nr_http_reason(int status);
/* The size of r prepared (header included), and the preparing of r into
 * out, which has that many bytes; r must be checked (statuses 100..999,
 * tokens, field values: what a Lua binding checks) and not a stream. */
size_t nr_http_prepared_size(const nr_http_response_t *r);
void nr_http_prepare(const nr_http_response_t *r, nr_http_prepared_t *out);
/* The current time as an IMF-fixdate, cached per second, per thread. */
const char *nr_http_date(void);

/* ---- the handler ------------------------------------------------------------ */

typedef struct nr_http_server_s nr_http_server_t;

/* The handler's options. Timeouts are in ns, 0 = off (nginx's defaults:
 * NR_HTTP_*_TIMEOUT). header_timeout: from the first byte of a request
 * head to its end (and from the connection's start to its first request's
 * first byte, closed silently then), answered with 408 and a close;
 * body_timeout: between two reads of a body, 408 and a close;
 * keepalive_timeout: an idle connection between requests, closed
 * silently. None runs while a request is being answered. */
typedef struct nr_http_server_opts_s {
  size_t max_header, max_body, max_headers;
  uint64_t header_timeout, body_timeout, keepalive_timeout;
  /* Request body bytes held at once (http_server.c's body budget): by the
   * codec's connections on one loop (body_budget, shared by the codecs
   * configured alike) and by one connection (conn_body_budget); 0: none. */
  uint64_t body_budget, conn_body_budget;
  /* Bodies as streams (the Lua option body = "stream"): a request with a
   * body is handed up as its head (req->streaming), its body in pieces
   * (nr_http_body_t) once someone reads it -- a handler's read
   * (nr_ctx_read: the outbound read passes the codec), or a sink's claim
   * -- and not faster than where it goes takes it. */
  bool stream_bodies;
  /* HTTP/2 (h2.h): when TLS agreed ALPN "h2", on the client preface
   * (h2c by prior knowledge) and on `Upgrade: h2c`; off: HTTP/1.1 only.
   * Its limits; the fields above bound each stream's request as they
   * bound an HTTP/1.1 request, and time the connection (idle, a request
   * arriving). */
  bool h2;
  nr_h2_opts_t h2o;
} nr_http_server_opts_t;

#define NR_HTTP_HEADER_TIMEOUT NR_SEC(60)
#define NR_HTTP_BODY_TIMEOUT NR_SEC(60)
#define NR_HTTP_KEEPALIVE_TIMEOUT NR_SEC(75)

/* A handler state for nr_http_server_handler; freed by its removed(). */
nr_http_server_t *nr_http_server_new(const nr_http_server_opts_t *o);
extern const nr_handler_t nr_http_server_handler;

/* The handler's members, for bindings that wrap its vtable (lhttp.c puts
 * a Lua-aware write in front of nr_http_server_write). */
void nr_http_server_added(nr_ctx_t *ctx);
void nr_http_server_removed(nr_ctx_t *ctx);
void nr_http_server_read_failed(nr_ctx_t *ctx, uint64_t token);
int nr_http_server_active(nr_ctx_t *ctx);
int nr_http_server_inactive(nr_ctx_t *ctx);
int nr_http_server_read_complete(nr_ctx_t *ctx);
int nr_http_server_channel_read(nr_ctx_t *ctx, void *msg);
int nr_http_server_write(nr_ctx_t *ctx, void *msg, nr_promise_t *p);
int nr_http_server_writability(nr_ctx_t *ctx);
int nr_http_server_user_event(nr_ctx_t *ctx, void *evt);

/* An observer of an HTTP/1.1 connection's answers (an access log,
 * handler/access_log.c): told of every answer the codec encodes, the
 * handlers' and its own (a 500 for a handler that raised, a 400 for a
 * request it could not parse), at the time it is encoded, with the token
 * of the request it answers (0: none was delivered). ev is
 * NR_HTTP_SEEN_ANSWER for a whole answer (head and body bytes),
 * NR_HTTP_SEEN_HEAD for a streamed one's head, NR_HTTP_SEEN_CHUNK for
 * each of its pieces and NR_HTTP_SEEN_END for its end. HTTP/2 streams are
 * not observed. Loop thread. */
enum { NR_HTTP_SEEN_ANSWER, NR_HTTP_SEEN_HEAD, NR_HTTP_SEEN_CHUNK,
       NR_HTTP_SEEN_END };
typedef void (*nr_http_seen_fn)(void *arg, int ev, uint64_t token, int status,
                                uint64_t head_bytes, uint64_t body_bytes);
/* Whether ctx is an HTTP server codec's (C or Lua-wrapped). */
bool nr_http_server_is(const nr_ctx_t *ctx);
/* Set (fn NULL: clear) the observer of the codec at ctx. */
void nr_http_server_observe(nr_ctx_t *ctx, nr_http_seen_fn fn, void *arg);
/* Whether the codec at ctx speaks HTTP/2 (its h2 option): a TLS server
 * offers ALPN "h2" only where such a codec follows it. */
bool nr_http_server_speaks_h2(const nr_ctx_t *ctx);

/* The outbound read (nr_ctx_read from a handler after the codec): a
 * streamed body waiting for one begins to flow (a "100 Continue" goes out
 * if the client waits for it); the read passes on. */
int nr_http_server_read(nr_ctx_t *ctx);
/* Streamed bodies (see nr_http_server_opts_t.stream_bodies), loop thread:
 * claim_body gives the body of the request `token` of the codec at ctx
 * (req->codec) to k from now on, and reads it (as nr_http_server_read):
 * 0, or -ENOENT when that request has no body waiting (answered, gone,
 * read by a handler already). drop_sink: k lets go before the body ended
 * -- the rest is not read; the connection closes after the answer (an
 * HTTP/2 stream is refused after it, RST_STREAM NO_ERROR). resume_body:
 * k, which paused, takes more. An HTTP/2 request's body is claimed the
 * same way, its stream's window given back only as k takes the pieces.
 * read_body: the handlers read the body of `token`, and the codec reads
 * no faster than `sink` (a channel on this loop, or NULL) takes what they
 * write to it: while it is unwritable the codec reads nothing (Lua's
 * req:sink(ch)); 0 or -ENOENT. */
int nr_http_server_claim_body(nr_ctx_t *ctx, uint64_t token, nr_http_sink_t *k);
void nr_http_server_drop_sink(nr_ctx_t *ctx, nr_http_sink_t *k);
void nr_http_server_resume_body(nr_ctx_t *ctx, nr_http_sink_t *k);
int nr_http_server_read_body(nr_ctx_t *ctx, uint64_t token, nr_channel_t *sink);

/* Responses by status (http_stats.c), for the metrics. Each thread counts
 * in a stripe of its own: no lock-prefixed instruction per response (a
 * thread beyond the stripes shares the last one, with atomic adds). */
#define NR_HTTP_STATUS_MIN 100
#define NR_HTTP_STATUS_MAX 599
void nr_http_count_status(int status);        /* loop thread */
/* Any thread: out[status - 100] gets the sum of every stripe; out has
 * NR_HTTP_STATUS_MAX - NR_HTTP_STATUS_MIN + 1 entries. */
void nr_http_status_counts(uint64_t *out);

#endif /* NR_CODEC_HTTP_H */
