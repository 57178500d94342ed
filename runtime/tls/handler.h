/*
 * handler.h -- what the TLS handler's files share (handler.c: state,
 * reads, writes, lifetime; handshake.c: the handshake and its deadline):
 * a handler's state. Private to runtime/tls/; loop thread only.
 */
#ifndef NR_TLS_HANDLER_H
#define NR_TLS_HANDLER_H

#include "codec/buf.h"
#include "tls/tls_internal.h"

#define PLAIN_CHUNK 32768     /* plaintext fired per message, at most */
#define WRITE_CHUNK 65536     /* plaintext encrypted per pass of a write */

enum { ST_HANDSHAKE, ST_OPEN, ST_DONE };   /* DONE: failed or shut down */

/* A write made before the handshake completed. */
typedef struct pw_s {
  struct pw_s *next;
  nr_promise_t *p;
  size_t len;
  char data[];
} pw_t;

typedef struct tls_s {
  nr_ctx_t *ctx;                  /* set when added */
  nr_tls_bundle_t *bundle;        /* the contexts ssl came from */
  SSL *ssl;
  const char *in;                 /* ciphertext of the read being handled */
  size_t in_len;
  nr_buf_t in_rest;               /* ciphertext SSL has not taken yet */
  char *direct;                   /* ciphertext SSL wrote in place at the end */
  size_t direct_len;              /* of the outbound buffer, not committed */
  nr_buf_t out;                   /* ciphertext out, not yet passed on */
  nr_buf_t pend;                  /* plaintext gathered (see "gathering") */
  nr_promise_t **pp;              /* the promises of the writes gathered */
  size_t npp, cpp;
  pw_t *queue, **qtail;
  nr_promise_t *hs;               /* the handshake future, once asked */
  nr_timer_t *timer;              /* the handshake's deadline */
  int st;
  bool started;                   /* the handshake has begun */
  bool active_seen;               /* channel_active reached this handler */
  bool active_fired;              /* ... and the handlers after it */
  bool flush_req;                 /* a flush came during the handshake */
  bool fired;                     /* plaintext fired in this read batch */
  bool shut_sent;                 /* close_notify written */
  bool peer_shut;                 /* the peer's close_notify came: input is
                                     over, the channel open for writing */
  bool handshaken;                /* the handshake completed (once) */
  bool shedding;                  /* nr_channel_set_handshaking(true) said */
  bool ku_over;                   /* the peer updated its keys too often */
  uint64_t ku_tat;                /* key updates: when the next is due */
  bool removed;                   /* removed during a call: free at its end */
  bool wrote_one;                 /* a write was encrypted in this gather */
  bool flush_owed;                /* a flush waits for the gather's end */
  bool hold;                      /* ... or for the read's read_complete */
  int busy;
  int gather;                     /* inside tls_channel_read(_complete) */
} tls_t;

/* Key updates a peer may send: this many at once, then one per
 * NR_TLS_KU_EVERY (handshake.c's count_key_update). */
#define NR_TLS_KU_BURST 32
#define NR_TLS_KU_EVERY NR_MS(100)

/* handler.c's, for the handshake. */
void nr__tls_flush_out(tls_t *s);
void nr__tls_fail_queue(tls_t *s, const char *why);
void nr__tls_settle_hs(tls_t *s, int code, const char *msg);
void nr__tls_stop_timer(tls_t *s);
int nr__tls_make_ssl(tls_t *s);
bool nr__tls_has_out(const tls_t *s);
int nr__tls_pass_out(tls_t *s, nr_promise_t *p);
void nr__tls_fail(tls_t *s, int e);
int nr__tls_encrypt(tls_t *s, const char *data, size_t len, nr_promise_t *p);
/* A server's handshake under way (on), or over: the channel may be shed
 * meanwhile when accept finds no free descriptor. */
void nr__tls_mark_handshaking(tls_t *s, bool on);
/* handshake.c's: a step of the handshake (false: it failed, or is not
 * done), a read asked for when SSL wants bytes, the deadline armed. */
bool nr__tls_handshake(tls_t *s);
void nr__tls_read_if_needed(tls_t *s);
void nr__tls_start_timer(tls_t *s);

#endif /* NR_TLS_HANDLER_H */
