/*
 * h2.h -- HTTP/2 (RFC 9113) on libnghttp2, for the HTTP codecs: the
 * server side that the HTTP server codec (http_server.c) switches to when
 * TLS agreed ALPN "h2", when a connection opens with the client preface
 * (h2c by prior knowledge) or when a request asks `Upgrade: h2c`; and the
 * allocator every nghttp2 session of netrun uses.
 *
 * The server hands the pipeline the same message as HTTP/1.1 -- an
 * nr_http_request_t, one per stream, with `stream` set -- and takes the
 * same responses (nr_http_response_t, nr_http_prepared_t, and byte writes
 * as the chunks of a streamed one), so handlers do not change. Which
 * stream a response answers: the one whose request is being delivered
 * when it is written (a handler answering in channel_read), else the
 * oldest stream still owed a response (what an HTTP/1.1 handler, which
 * answers in request order, expects). Chunks go to that stream's open
 * streamed response, else to the oldest one open.
 *
 * Loop thread only: a session belongs to its codec's channel. Nothing of
 * nghttp2 is called from inside nghttp2's callbacks but frame submission:
 * requests are delivered, and frames sent, once nghttp2_session_mem_recv
 * has returned (see h2_server.c).
 */
#ifndef NR_CODEC_H2_H
#define NR_CODEC_H2_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "codec/inbound.h"
#include "netrun.h"

/* The limits of an HTTP/2 connection (the server's; see docs/guide/limits.md). Zero fields take the defaults below. */
typedef struct nr_h2_opts_s {
  uint32_t max_streams;       /* SETTINGS_MAX_CONCURRENT_STREAMS */
  uint32_t window;            /* SETTINGS_INITIAL_WINDOW_SIZE: a request
                                 body's bytes in flight per stream */
  uint32_t reset_burst;       /* the client's RST_STREAMs: a token bucket */
  uint32_t reset_rate;        /* ... refilled this many a second */
  uint32_t flood_burst;       /* frames that do no work (PING, SETTINGS,
                                 empty DATA, WINDOW_UPDATE, PRIORITY) */
  uint32_t flood_rate;        /* ... refilled this many a second */
  uint32_t max_continuations; /* CONTINUATION frames a header block */
  uint64_t send_timeout;      /* ns a response may wait on a window the
                                 peer never opens (0: the default) */
} nr_h2_opts_t;

#define NR_H2_MAX_STREAMS 128
#define NR_H2_WINDOW 65535
#define NR_H2_RESET_BURST 1000
#define NR_H2_RESET_RATE 33
#define NR_H2_FLOOD_BURST 1000
#define NR_H2_FLOOD_RATE 100
#define NR_H2_MAX_CONTINUATIONS 8
#define NR_H2_SEND_TIMEOUT NR_SEC(60)

/* The client's connection preface (RFC 9113 3.4). */
#define NR_H2_PREFACE "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
#define NR_H2_PREFACE_LEN 24

/* ---- the server session ------------------------------------------------------ */

typedef struct nr_h2_server_s nr_h2_server_t;
struct nr_http_server_opts_s;

/* A session for the codec at ctx, whose re-entrancy and backpressure state
 * is `in` (the codec's: delivery stops when a handler removes the codec,
 * and while the channel is unwritable). It sends its SETTINGS at once.
 * NULL on out of memory. */
nr_h2_server_t *nr_h2_server_new(nr_ctx_t *ctx, nr_inbound_t *in,
                                 const struct nr_http_server_opts_s *o);
void nr_h2_server_free(nr_h2_server_t *h);
/* `Upgrade: h2c`: the HTTP2-Settings value (base64url), and whether the
 * request that asked was HEAD. Its request becomes stream 1, half-closed
 * by the client. 0, or -EINVAL (bad settings). */
int nr_h2_server_upgrade(nr_h2_server_t *h, const char *settings, size_t len,
                         bool head);
/* The request that asked for the upgrade, delivered as stream 1's. */
void nr_h2_server_deliver_upgraded(nr_h2_server_t *h, void *req);
/* Bytes read (none: go on with what was held). Requests are delivered
 * as they complete. 0, or < 0 when the session ended (its GOAWAY is
 * written and the channel closing): the caller reads nothing more. */
int nr_h2_server_feed(nr_h2_server_t *h, const char *data, size_t len);
/* A write from the handlers (see the header comment). 0 or an error
 * raised (nr_raise) for a misuse. */
int nr_h2_server_write(nr_h2_server_t *h, void *msg, nr_promise_t *p);
/* Streamed request bodies (body = "stream", h2_body.c): the handlers
 * read the body of `token`, no faster than `sink` (a channel on this
 * loop, or NULL: the connection) takes: 0, or -ENOENT when no body of
 * that request waits. nr_h2_server_read (the outbound read, ctx:read()):
 * every body waiting begins to flow. */
int nr_h2_server_read_body(nr_h2_server_t *h, uint64_t token,
                           nr_channel_t *sink);
void nr_h2_server_read(nr_h2_server_t *h);
/* A C sink (nr_http_sink_t, http.h) claims the body of `token` (0, or
 * -ENOENT: none waits unread), takes more after it paused (resume), or
 * lets go before the end (drop: the stream is refused after its answer).
 * The stream's window goes back only as the sink takes its pieces. */
struct nr_http_sink_s;
int nr_h2_server_claim_body(nr_h2_server_t *h, uint64_t token,
                            struct nr_http_sink_s *k);
void nr_h2_server_resume_sink(nr_h2_server_t *h, struct nr_http_sink_s *k);
void nr_h2_server_drop_sink(nr_h2_server_t *h, struct nr_http_sink_s *k);
/* The handlers raised on the request of `token`: 500 on its stream. */
void nr_h2_server_read_failed(nr_h2_server_t *h, uint64_t token);
/* The channel's writability changed: held requests and window-blocked
 * data go on. */
void nr_h2_server_writability(nr_h2_server_t *h);
/* A graceful shutdown begins: GOAWAY twice (RFC 9113 6.8), the open
 * streams finished, then the close. */
void nr_h2_server_shutdown(nr_h2_server_t *h);
/* Idle or too slow (the codec's timeouts): GOAWAY, then the close. */
void nr_h2_server_expire(nr_h2_server_t *h);
/* What the connection waits for, for the codec's timeouts: streams owed
 * or being sent (the server's turn), streams arriving (the client's), or
 * nothing open (idle). */
enum { NR_H2_OWED, NR_H2_ARRIVING, NR_H2_IDLE };
int nr_h2_server_waiting(const nr_h2_server_t *h);

/* ---- the client session ------------------------------------------------------ */

/* What an HTTP/2 client connection tells the handlers after its codec
 * (a user event): that it speaks HTTP/2, how many streams the server
 * takes at once (its SETTINGS_MAX_CONCURRENT_STREAMS; nghttp2's 100
 * before they come), and whether the server said GOAWAY (no new
 * streams: the connection closes once the open ones end). Fired when
 * one of them changes. */
#define NR_MSG_H2_STATE (NR_MSG_NATIVE + 20)
typedef struct nr_h2_state_s {
  int type;                       /* NR_MSG_H2_STATE */
  uint32_t max_streams;
  bool goaway;
} nr_h2_state_t;

typedef struct nr_h2_client_s nr_h2_client_t;
struct nr_http_client_opts_s;
struct nr_http_call_s;

/* A session for the client codec at ctx (tls: the connection is TLS, its
 * requests' :scheme https). It sends the preface and SETTINGS at once.
 * NULL on out of memory. */
nr_h2_client_t *nr_h2_client_new(nr_ctx_t *ctx,
                                 const struct nr_http_client_opts_s *o,
                                 bool tls);
void nr_h2_client_free(nr_h2_client_t *h);
/* A request (its tag comes back in its reply), or with call->cancel the
 * stream of that tag reset. 0, or an error raised (a request that cannot
 * be sent: no Host, no stream left). */
int nr_h2_client_write(nr_h2_client_t *h, const struct nr_http_call_s *call,
                       nr_promise_t *p);
/* Bytes read: replies are fired as their streams end, each with its tag
 * (a stream that failed: a reply with `error` set). */
void nr_h2_client_feed(nr_h2_client_t *h, const char *data, size_t len);
/* The connection ended: every stream open gets an error reply. */
void nr_h2_client_end(nr_h2_client_t *h);

/* ---- nghttp2's allocator ---------------------------------------------------- */

/* Every nghttp2 session netrun makes allocates through this (nghttp2_mem):
 * small blocks come from per-thread free lists (nghttp2 allocates per
 * stream, per header block and per frame; glibc's malloc was 10 % of a
 * request). A block may be freed on another thread than the one that
 * allocated it; each list keeps at most a bounded number of blocks. */
void *nr_h2_mem(void);
void *nr_h2_alloc(size_t n);
void nr_h2_free(void *p);

#endif /* NR_CODEC_H2_H */
