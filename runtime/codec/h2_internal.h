/*
 * h2_internal.h -- what the two halves of the HTTP/2 server share:
 * h2_server.c (the session, requests in, limits) and h2_out.c (responses
 * out, the pump). Loop thread only, like the session.
 *
 * A stream's record (h2s_t) lives from its first HEADERS to the later of
 * nghttp2 closing it and the handlers being done with it:
 *
 *   S_ARRIVING  headers and body coming in;
 *   S_READY     whole, in `ready` (delivered after nghttp2_session_mem_recv
 *               returns, in order);
 *   S_OWED      delivered: in `owed` (FIFO) until a response head is
 *               written for it;
 *   S_SENDING   its response's frames are going out (a streamed one is in
 *               `streaming` while open); freed once nghttp2 closes it.
 *
 * A stream the client resets while the handlers still owe it an answer
 * stays in its list, `gone`, so that answers written in request order
 * keep finding their own streams (its answer is dropped); those records
 * count against 2 x max_streams, past which new streams are refused.
 */
#ifndef NR_CODEC_H2_INTERNAL_H
#define NR_CODEC_H2_INTERNAL_H

#include <nghttp2/nghttp2.h>

#include "codec/buf.h"
#include "codec/h2.h"
#include "codec/http.h"

enum { S_ARRIVING, S_READY, S_OWED, S_SENDING };

typedef struct h2hdr_s {
  uint32_t name, name_len, value, value_len;   /* offsets into text */
} h2hdr_t;

/* A request's text and fields: inline for the usual request, on the heap
 * past that. */
#define TEXT_INLINE 320
#define HDR_INLINE 16

typedef struct h2text_s {
  char *p;                    /* small, or the heap */
  uint32_t len, cap;
} h2text_t;

/* A header block's fields as they are decoded (a request's, on the
 * server; a response's, on the client): names and values appended to
 * the text, offsets kept; trailers after the headers. */
typedef struct h2fields_s {
  h2text_t text;              /* the values of pseudo-fields and fields */
  h2hdr_t *hdr;
  uint16_t nhdr, ntrl, cap;   /* header and trailer fields in hdr */
  bool trailers;              /* the fields arriving are trailers */
  uint32_t list_bytes;        /* the header list's size, RFC 9113 6.5.2 */
  h2hdr_t hdr_small[HDR_INLINE];
  char text_small[TEXT_INLINE];
} h2fields_t;

/* h2_fields.c */
void nr__h2_fields_init(h2fields_t *f);
void nr__h2_fields_free(h2fields_t *f);       /* and init again */
/* Append p[0 .. n) (which may lie in the text itself); false: no memory. */
bool nr__h2_text_add(h2fields_t *f, const void *p, size_t n);
/* The same, returning the offset, or -1. */
int64_t nr__h2_keep(h2fields_t *f, const void *p, size_t n);
/* A field (a trailer once f->trailers): 0, 431 past max fields, or -1. */
int nr__h2_add_field(h2fields_t *f, const uint8_t *name, size_t nl,
                     const uint8_t *value, size_t vl, size_t max);

/* A body nghttp2 frames straight from its bytes (DATA with
 * NGHTTP2_DATA_FLAG_NO_COPY): the caller's, borrowed while its write
 * runs, then what the windows held back, copied into `copy` (own). */
typedef struct h2body_s {
  const char *data;           /* the bytes not yet framed */
  size_t len;
  nr_buf_t copy;              /* ... kept here once the write returned */
  bool own;                   /* `data` is in `copy`, else borrowed */
} h2body_t;

/* n bytes of b went into a DATA frame: past them (a copy drops them, and
 * may shrink, so moves: the rest is read from it afresh). */
void nr__h2_body_sent(h2body_t *b, size_t n);

/* What a request's fields were (h2_check.c). */
enum { HF_METHOD = 1, HF_SCHEME = 2, HF_PATH = 4, HF_AUTHORITY = 8,
       HF_HOST = 16, HF_REGULAR = 32, HF_CONNECT = 64, HF_OPTIONS = 128,
       HF_PATH_REGULAR = 256, HF_PATH_STAR = 512, HF_SCHEME_HTTP = 1024 };

typedef struct h2s_s h2s_t;
struct h2s_s {
  int32_t id;
  uint8_t st;                 /* S_* */
  bool gone;                  /* nghttp2 closed it: answers are dropped */
  bool head;                  /* a HEAD request */
  bool streaming;             /* a streamed response is open (listed) */
  bool discard;               /* ... whose chunks are dropped (HEAD) */
  bool eof;                   /* the response body ends with `data` */
  bool deferred;              /* nghttp2 waits for data (resume it) */
  bool counted;               /* owed: counted in `owing` */
  bool pinned;                /* its request is being delivered */
  bool doomed;                /* ... and it was closed meanwhile */
  int16_t error;              /* answer this status instead of delivering */
  bool reset;                 /* malformed: reset, never delivered */
  uint16_t hf;                /* HF_*: what its fields were (h2_check.c) */
  int64_t clen;               /* its Content-Length, or -1 */
  uint64_t got;               /* body bytes received */
  uint32_t method, method_len, path, path_len, authority, authority_len;
  uint32_t unacked;           /* body bytes received, window not given back */
  uint64_t token;             /* its delivery's token */
  nr_buf_t body;              /* the request body */
  h2body_t b;                 /* the response body not yet framed */
  nr_promise_t *p;            /* the response's write promise */
  struct h2sb_s *sb;          /* its request body, streamed (h2_body.c) */
  h2s_t *prev, *next;         /* in ready, owed or streaming */
  h2fields_t f;               /* method, path and fields as received
                                 (last: memset before it) */
};

typedef struct list_s {
  h2s_t *head, *tail;
} list_t;

typedef struct bucket_s {
  double tokens;
  uint64_t at;                /* when last refilled (nr_now) */
} bucket_t;

#define RESET_RING 32

/* Where the frame scan is (h2_scan.c): in a payload, or in a header
 * carried across reads (with a PRIORITY's 5 bytes). */
typedef struct h2scan_s {
  uint32_t skip;              /* bytes before the next frame header */
  uint8_t n;                  /* header bytes carried in b */
  uint8_t b[14];
} h2scan_t;

struct nr_h2_server_s {
  nghttp2_session *ng;
  nr_ctx_t *ctx;
  nr_inbound_t *in;           /* the codec's */
  nr_h2_opts_t o;
  size_t max_header, max_body, max_headers;
  list_t arriving, ready, owed, streaming;
  h2s_t *cur;                 /* whose request is being delivered */
  h2s_t *hs;                  /* whose header block is being decoded */
  unsigned records;           /* h2s_t alive */
  unsigned owing;             /* delivered, answer not complete: holds */
  unsigned opened;            /* streams opened by the current read */
  int32_t max_id;             /* the highest stream the client opened */
  uint32_t die_code;          /* a callback's reason to end the session */
  uint64_t delivered;         /* tokens given */
  size_t buffered;            /* request body bytes held, undelivered */
  size_t budget;              /* ... past which only the oldest arriving
                                 stream is given window */
  uint64_t progress;          /* when DATA last went out (send timeout) */
  struct done_s *done;        /* promises to complete once out of nghttp2 */
  size_t ndone, cdone;
  nr_buf_t gather;            /* frames for a write through handlers */
  nr_buf_t rest;              /* input not yet given to nghttp2 */
  bucket_t resets_in, resets_out, flood;
  size_t held;                /* bytes counted by nr_channel_hold_bytes */
  nr_timer_t *window_timer;   /* send_timeout while the peer's window
                                 holds data back */
  int busy;                   /* in feed or pump: no re-entry */
  bool dead;                  /* the session ended: closing */
  bool shutting;              /* a graceful shutdown: GOAWAY sent */
  bool final_goaway;          /* ... the round trip is over */
  bool goaway2;               /* ... and the second one is sent */
  bool wrote;                 /* frames written since the last flush */
  bool calm;                  /* a limit was passed: ENHANCE_YOUR_CALM */
  bool pumping;               /* inside nr__h2_pump */
  nr_codec_resume_t *resume;  /* a task delivers what waited for
                                 writability */
  /* body = "stream" (h2_body.c): heads are delivered before their
   * bodies, which are listed here until their end is told */
  bool stream_bodies;
  bool bodies_busy;           /* in nr__h2_bodies_go: no re-entry */
  struct h2sb_s *bodies_head, *bodies_tail;
  nr_codec_resume_t *body_resume;
  uint64_t body_timeout;      /* ns a body read may wait on the client */
  nr_timer_t *body_timer;     /* ... armed while one does */
  int32_t reset[RESET_RING];  /* the streams the server reset last: */
  unsigned nreset;            /* their late frames are ignored */
  h2scan_t scan;              /* (starts past the client preface) */
};

/* h2_scan.c */
/* The server reset stream id (its late frames are not an error). */
void nr__h2_reset_sent(nr_h2_server_t *h, int32_t id);
/* nghttp2's on_begin_frame callback (HEADERS on closed streams). */
int nr__h2_on_begin_frame(nghttp2_session *ng, const nghttp2_frame_hd *hd,
                          void *ud);
/* Scan p[0 .. n) ahead of nghttp2: the bytes that may go to it; *code is
 * then 0, or the connection error the next frame is. */
size_t nr__h2_scan(nr_h2_server_t *h, const uint8_t *p, size_t n,
                   uint32_t *code);

/* h2_check.c: the HTTP rules nghttp2's HTTP messaging (off) checked. */
void nr__h2_check_init(void);
/* A request's field: 0 (a field), the HF_* flag of a pseudo-field, or
 * -1 when it makes the request malformed. */
int nr__h2_check_field(h2s_t *s, const uint8_t *name, size_t nl,
                       const uint8_t *value, size_t vl);
/* The request's pseudo-fields once its header block ended: whether whole. */
bool nr__h2_check_request(const h2s_t *s);

/* A frame that does no work: a flood token (ENHANCE_YOUR_CALM past). */
void nr__h2_flood(nr_h2_server_t *h);
/* Useful work (a request, DATA with bytes) earns a flood token back. */
void nr__h2_earn(nr_h2_server_t *h);
/* Take a token from b (burst, rate a second): false when empty. */
bool nr__h2_take(bucket_t *b, uint32_t burst, uint32_t rate);

/* h2_server.c */
void nr__h2_list_push(list_t *l, h2s_t *s);
void nr__h2_list_remove(list_t *l, h2s_t *s);
void nr__h2_stream_free(nr_h2_server_t *h, h2s_t *s);
/* End the session: GOAWAY with `code`, then the close. */
void nr__h2_die(nr_h2_server_t *h, uint32_t code);
/* Whether the close may come now (shutting down, nothing open). */
void nr__h2_maybe_close(nr_h2_server_t *h);

/* Give back the window of the streams whose bodies arrive (when the
 * channel is writable and the budget allows, or to the oldest). */
void nr__h2_credit(nr_h2_server_t *h);

/* h2_out.c */
/* A field only HTTP/1.1 has (Connection, Upgrade, TE, ...), any case. */
bool nr__h2_connection_field(const char *name, size_t len);
/* Complete p (success if ok) once nghttp2 has returned; takes p. */
void nr__h2_complete(nr_h2_server_t *h, nr_promise_t *p, bool ok);
/* The session goes: every promise still to complete fails. */
void nr__h2_fail_done(nr_h2_server_t *h);
/* Serialise what nghttp2 has queued into the channel; false if the
 * session failed (then dead). Flushes when asked. */
bool nr__h2_pump(nr_h2_server_t *h, bool flush);
/* An answer of the server's own to stream s (400, 413, 431, 500). */
void nr__h2_answer_status(nr_h2_server_t *h, h2s_t *s, int status);
/* The response body bytes s holds: counted toward the channel's
 * writability while the peer's window keeps them. */
void nr__h2_held(nr_h2_server_t *h, ptrdiff_t delta);
/* A stream whose answer is complete or dropped: no longer owed. */
void nr__h2_settled(nr_h2_server_t *h, h2s_t *s);
void nr__h2_out_callbacks(nghttp2_session_callbacks *cb);
/* Timers of the send timeout: armed while data waits on the peer. */
void nr__h2_window_check(nr_h2_server_t *h);

/* h2_body.c: request bodies as streams (the codec's body = "stream").
 * A request whose HEADERS leave the stream open is delivered at once,
 * its body following in pieces once a handler reads it; the stream's
 * window is given back as the pieces are handed up, and not while where
 * they go (the sink, else the connection) is unwritable. A body's state
 * (h2sb_t) may outlive its record: its end, or its cut, is told after
 * nghttp2 has returned. */
typedef struct h2sb_s h2sb_t;
/* s's HEADERS left the stream open: its body will stream (false: no
 * memory, answered 500). */
bool nr__h2_body_open(nr_h2_server_t *h, h2s_t *s);
/* DATA of s, from nghttp2's callback: kept, bounded by the window. */
void nr__h2_body_data(nr_h2_server_t *h, h2s_t *s, const uint8_t *d,
                      size_t n);
/* END_STREAM on s (its trailers, if any, in s->f). */
void nr__h2_body_end(nr_h2_server_t *h, h2s_t *s);
/* s's record goes (nghttp2 closed the stream, or the session ends). */
void nr__h2_body_detach(nr_h2_server_t *h, h2s_t *s);
/* s was delivered with token: its body may be read from now on; r gets
 * the body's framing (content_length, else chunked) for a forwarder. */
void nr__h2_body_delivered(h2s_t *s, nr_http_request_t *r);
/* Hand up what may go (outside nghttp2, inside the codec's inbound
 * enter/leave); give back windows. */
void nr__h2_bodies_go(nr_h2_server_t *h);
/* Queue nr__h2_bodies_go from a task (writability changed). */
void nr__h2_bodies_later(nr_h2_server_t *h);
void nr__h2_bodies_free(nr_h2_server_t *h);
/* An answer's END_STREAM went out on s (h2_out.c). */
void nr__h2_body_answered(nr_h2_server_t *h, h2s_t *s);

#endif /* NR_CODEC_H2_INTERNAL_H */
