/*
 * handler.c -- the TLS handler (Netty's SslHandler) on OpenSSL 3. Loop
 * thread only: a state belongs to one context of one channel.
 *
 * OpenSSL never touches the socket: its BIOs are memory BIOs of our own
 * (a BIO_s_mem would copy every read once more and keep its largest size
 * for the connection's life). Reading, SSL takes ciphertext straight from
 * the read being handled (`in`), and SSL_read's plaintext is fired onward
 * in chunks of up to PLAIN_CHUNK bytes; writing, what SSL produces
 * (records, alerts, handshake messages) lands at the end of the channel's
 * outbound buffer (out_write), committed as each SSL call returns. A read is
 * decrypted within that read: SSL keeps an incomplete record in its own
 * buffer (released once empty, SSL_MODE_RELEASE_BUFFERS), nothing else
 * waits here, so the channel's auto_read, read batches and the codecs'
 * throttling (codec/inbound.h) bound memory as without TLS.
 *
 * Handshake: a client starts it when the channel becomes active (or at
 * once when added to an active one); a server answers the ClientHello.
 * Until it completes, channel_active is held back from the handlers after
 * this one, writes wait in `queue` (with a flush noted), and with
 * auto_read off the handler asks for reads itself. Once it completes, the
 * queued writes are encrypted and flushed, then the handlers after this
 * one see channel_active and the nr_tls_event_t user event. A server
 * whose first bytes are a plain HTTP request line answers a plain 400
 * instead of handing them to SSL (refuse_plain), as nginx does.
 *
 * Failures (a handshake refused, a record that does not decrypt) fire
 * exception_caught with OpenSSL's reason to the handlers after this one,
 * send the alert SSL produced, and close the channel. A close from the
 * handlers sends close_notify after everything they wrote before it. The
 * peer's close_notify ends the input, like a FIN: the channel closes (ours
 * sent) once the answers to what came before it are out, or, when it
 * allows half-closure, stays open for writing until the handlers close.
 *
 * Writes made while this handler dispatches a read (its channel_read and
 * channel_read_complete) are gathered, after the first, into one record
 * (see "gathering"); any other write is encrypted at once. Flushes asked
 * meanwhile (the handshake's, the handlers') happen once, as the callback
 * ends or at a close (flush_out).
 *
 * Re-entrancy: handlers fired from inside a read may write, close, or
 * remove this handler. SSL's output is committed between SSL calls, never
 * inside one; a removal during a read only marks the state, which the
 * read frees as it unwinds (`busy`, `gather`).
 */
#include <arpa/inet.h>
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <openssl/err.h>
#include <openssl/x509v3.h>

#include "codec/buf.h"
#include "codec/http.h"
#include "tls/handler.h"

/* Its event, registered as the program loads (netrun.h). */
__attribute__((constructor)) static void declare_types(void) {
  nr_msg_declare(NR_MSG_TLS_EVENT, "tls_event");
}

static int drain(tls_t *s);

/* Flush the channel; inside a read's callbacks (`gather`), at their end:
 * the tickets SSL writes as a handshake completes, the answer to the
 * request that came with the client's Finished and, on a close, the
 * close_notify then leave in one write (one syscall, not three). */
void nr__tls_flush_out(tls_t *s) {
  if (s->gather > 0) {
    s->flush_owed = true;
    return;
  }
  s->flush_owed = false;
  nr_ctx_flush(s->ctx);
}

/* ---- the BIOs --------------------------------------------------------------- */

static BIO_METHOD *bio_method;
static pthread_once_t bio_once = PTHREAD_ONCE_INIT;

/* SSL reads what `in_rest` holds, then the current read. */
static int in_read(BIO *b, char *dst, size_t n, size_t *got) {
  tls_t *s = BIO_get_data(b);
  BIO_clear_retry_flags(b);
  size_t rest = nr_buf_len(&s->in_rest);
  if (rest > 0) {
    *got = n < rest ? n : rest;
    memcpy(dst, nr_buf_peek(&s->in_rest), *got);
    nr_buf_consume(&s->in_rest, *got);
  } else if (s->in_len > 0) {
    *got = n < s->in_len ? n : s->in_len;
    memcpy(dst, s->in, *got);
    s->in += *got;
    s->in_len -= *got;
  } else {
    BIO_set_retry_read(b);       /* "want read": not an end of stream */
    *got = 0;
    return 0;
  }
  return 1;
}

/* SSL's records go straight to the end of the channel's outbound buffer
 * when this handler is next to the head (the usual case): reserved there
 * and committed by settle() as the SSL call returns -- not here, since a
 * commit can fire writability_changed, and a handler must not run inside
 * an SSL call. A run of records that outgrows the tail chunk moves to a
 * new one; elsewhere (a handler in between, a closed channel) they wait
 * in `out`, after any run reserved before, for pass_out. */
static int out_write(BIO *b, const char *data, size_t len, size_t *written) {
  tls_t *s = BIO_get_data(b);
  BIO_clear_retry_flags(b);      /* a failure here is no "want read" */
  char *w = nr_buf_len(&s->out) == 0
                ? nr_ctx_write_reserve(s->ctx, s->direct_len + len)
                : NULL;
  if (w != NULL) {
    if (s->direct_len > 0 && w != s->direct)
      memcpy(w, s->direct, s->direct_len);
    memcpy(w + s->direct_len, data, len);
    s->direct = w;
    s->direct_len += len;
  } else {
    if (s->direct_len > 0 &&
        nr_buf_append(&s->out, s->direct, s->direct_len) < 0)
      return 0;
    s->direct_len = 0;
    if (nr_buf_append(&s->out, data, len) < 0)
      return 0;
  }
  *written = len;
  return 1;
}

bool nr__tls_h2_follows(SSL *ssl) {
  BIO *b = SSL_get_rbio(ssl);
  tls_t *s = b != NULL ? BIO_get_data(b) : NULL;
  if (s == NULL || s->ctx == NULL)
    return false;
  for (nr_ctx_t *c = nr_ctx_next(s->ctx); c != NULL; c = nr_ctx_next(c))
    if (nr_http_server_speaks_h2(c))
      return true;
  return false;
}

static long bio_ctrl(BIO *b, int cmd, long num, void *ptr) {
  (void)num, (void)ptr;
  tls_t *s = BIO_get_data(b);
  if (cmd == BIO_CTRL_PENDING)
    return (long)(nr_buf_len(&s->in_rest) + s->in_len);
  return cmd == BIO_CTRL_FLUSH;     /* SSL flushes after each flight */
}

static int bio_create(BIO *b) {
  BIO_set_init(b, 1);
  return 1;
}

static void make_bio_method(void) {
  bio_method = BIO_meth_new(BIO_get_new_index() | BIO_TYPE_SOURCE_SINK,
                            "netrun tls");
  if (bio_method) {
    BIO_meth_set_read_ex(bio_method, in_read);
    BIO_meth_set_write_ex(bio_method, out_write);
    BIO_meth_set_ctrl(bio_method, bio_ctrl);
    BIO_meth_set_create(bio_method, bio_create);
  }
}

/* ---- state ------------------------------------------------------------------- */

void nr__tls_fail_queue(tls_t *s, const char *why) {
  for (pw_t *w = s->queue, *n; w; w = n) {
    n = w->next;
    if (w->p) {
      nr_promise_set_failure(w->p, NR_ECLOSED, why);
      nr_promise_release(w->p);
    }
    free(w);
  }
  s->queue = NULL;
  s->qtail = &s->queue;
}

void nr__tls_settle_hs(tls_t *s, int code, const char *msg) {
  if (s->hs == NULL)
    return;
  if (code == 0)
    nr_promise_set_success(s->hs, NULL, NULL);
  else
    nr_promise_set_failure(s->hs, code, msg);
  nr_promise_release(s->hs);
  s->hs = NULL;
}

/* Why the handshake failed when the channel closed: before it connected
 * (no handshake began: the connect's own failure says why, and
 * netrun.connect reports that one), or during the handshake. */
static const char *closed_why(const tls_t *s) {
  return s->active_seen ? "channel closed before the TLS handshake completed"
                        : "channel closed before it connected";
}

void nr__tls_stop_timer(tls_t *s) {
  if (s->timer) {
    nr_timer_cancel(s->timer);           /* on this loop: it cannot run now */
    nr_timer_release(s->timer);
    s->timer = NULL;
  }
}

static void free_state(tls_t *s) {
  nr__tls_stop_timer(s);
  nr__tls_fail_queue(s, "channel closed before the TLS handshake completed");
  nr__tls_settle_hs(s, NR_ECLOSED, closed_why(s));
  SSL_free(s->ssl);
  nr_tls_bundle_release(s->bundle);
  nr_buf_free(&s->out);
  nr_buf_free(&s->in_rest);
  s->st = ST_DONE;
  drain(s);                        /* fails what is still gathered */
  nr_buf_free(&s->pend);
  free(s);
}

/* The SSL and its BIO; 0 or -ENOMEM. One BIO reads and writes (its read
 * and write methods touch different fields, and each clears the retry
 * flags first), as a socket BIO does, so a connection makes and frees one
 * BIO, not a pair. */
int nr__tls_make_ssl(tls_t *s) {
  s->ssl = SSL_new(s->bundle->ctx);
  BIO *b = BIO_new(bio_method);
  if (s->ssl == NULL || b == NULL) {
    BIO_free(b);
    SSL_free(s->ssl);
    s->ssl = NULL;
    ERR_clear_error();
    return -ENOMEM;
  }
  BIO_set_data(b, s);
  SSL_set_bio(s->ssl, b, b);               /* ssl owns it (one reference) */
  if (s->bundle->server) {
    SSL_set_accept_state(s->ssl);
  } else {
    SSL_set_connect_state(s->ssl);
    const char *name = s->bundle->server_name;
    if (name && (SSL_set_tlsext_host_name(s->ssl, name) != 1 ||
                 SSL_set1_host(s->ssl, name) != 1))
      ERR_clear_error();                   /* checked at the handshake */
  }
  return 0;
}

/* A server's SSL (~9 KiB resident) is made when the first bytes arrive,
 * as nginx does: a connection that sends nothing costs no more than a
 * plaintext one. A client's is made at once (nr_tls_set_host needs it). */
void *nr_tls_new(nr_tls_config_t *c) {
  pthread_once(&bio_once, make_bio_method);
  tls_t *s = calloc(1, sizeof *s);
  if (s == NULL || bio_method == NULL) {
    free(s);
    errno = ENOMEM;
    return NULL;
  }
  s->qtail = &s->queue;
  s->bundle = nr__tls_config_bundle(c);
  if (!s->bundle->server && nr__tls_make_ssl(s) < 0) {
    free_state(s);
    errno = ENOMEM;
    return NULL;
  }
  return s;
}

int nr_tls_set_host(void *state, const char *host) {
  tls_t *s = state;
  if (s->bundle->server || s->bundle->server_name || s->started)
    return 0;                              /* the config's name wins */
  unsigned char addr[16];
  int rc;
  if (inet_pton(AF_INET, host, addr) == 1 || inet_pton(AF_INET6, host, addr) == 1)
    rc = X509_VERIFY_PARAM_set1_ip_asc(SSL_get0_param(s->ssl), host);
  else
    rc = SSL_set_tlsext_host_name(s->ssl, host) == 1 &&
         SSL_set1_host(s->ssl, host) == 1;
  ERR_clear_error();
  return rc ? 0 : -EINVAL;
}

/* ---- passing ciphertext on ------------------------------------------------------ */

/* Commit what the last SSL call wrote in place (out_write); whether it
 * wrote anything. */
static bool settle(tls_t *s) {
  if (s->direct_len == 0)
    return false;
  size_t n = s->direct_len;
  s->direct_len = 0;
  nr_ctx_write_commit(s->ctx, n);
  return true;
}

bool nr__tls_has_out(const tls_t *s) {
  return s->direct_len > 0 || nr_buf_len(&s->out) > 0;
}

/* Pass what SSL wrote to the next outbound handler, with p (which then
 * completes when those bytes are written, at once if there are none). */
int nr__tls_pass_out(tls_t *s, nr_promise_t *p) {
  settle(s);
  size_t n = nr_buf_len(&s->out);
  if (n == 0 && p == NULL)
    return 0;
  /* n == 0: only p, completed once the bytes committed before it are */
  nr_bytes_t b = NR_BYTES(n > 0 ? nr_buf_peek(&s->out) : "", n);
  int rc = nr_ctx_write(s->ctx, &b, p);
  nr_buf_consume(&s->out, n);
  return rc;
}

/* OpenSSL's reason for the failure `e` of the last SSL call. */
static void ssl_reason(tls_t *s, int e, char *buf, size_t n) {
  char reason[256] = "";
  unsigned long code = ERR_peek_error();
  if (code != 0)
    ERR_error_string_n(code, reason, sizeof reason);
  else if (e == SSL_ERROR_SYSCALL)
    snprintf(reason, sizeof reason, "unexpected end of the TLS stream");
  else
    snprintf(reason, sizeof reason, "SSL error %d", e);
  long v = SSL_get_verify_result(s->ssl);
  if (v != X509_V_OK && s->st == ST_HANDSHAKE)
    snprintf(buf, n, "tls: handshake failed: %s (certificate: %s)", reason,
             X509_verify_cert_error_string(v));
  else
    snprintf(buf, n, "tls: %s: %s",
             s->st == ST_HANDSHAKE ? "handshake failed" : "bad record", reason);
  ERR_clear_error();
}

/* A handshake refused or a record that does not decrypt: send SSL's
 * alert, tell the handlers after this one, close. The alert goes first:
 * it may sit in the outbound buffer uncommitted (written in place), and a
 * listener of the handshake's future may close the channel, which frees
 * that buffer. */
void nr__tls_fail(tls_t *s, int e) {
  char msg[512];
  ssl_reason(s, e, msg, sizeof msg);
  s->st = ST_DONE;
  nr__tls_stop_timer(s);
  nr__tls_pass_out(s, NULL);
  nr_ctx_flush(s->ctx);
  nr__tls_fail_queue(s, msg);
  nr__tls_settle_hs(s, -EPROTO, msg);
  nr_ctx_fire_exception(s->ctx, &(nr_err_t){-EPROTO, msg});
  nr_ctx_close(s->ctx, NULL);
}

/* ---- inbound ----------------------------------------------------------------------- */

/* The peer sent close_notify: it sends nothing more (RFC 8446 6.1), and
 * input past it is dropped. The handlers are told; then, as at a TCP
 * FIN, the channel closes -- once the answers to what came before it are
 * out: those written in this read and its read_complete, and those still
 * owed (nr_channel_hold: an HTTP request being answered). That close goes
 * through the pipeline, so ours follows the answers (nginx does the
 * same). With allow_half_closure the handlers get input_shutdown instead
 * and close when they are done. */
static void peer_closed(tls_t *s) {
  s->peer_shut = true;
  nr_channel_t *ch = nr_ctx_channel(s->ctx);
  if (s->active_fired) {
    nr_tls_event_t ev = {.type = NR_MSG_TLS_EVENT,
                         .kind = NR_TLS_CLOSE_NOTIFY,
                         .server = s->bundle->server};
    nr_ctx_fire_user_event(s->ctx, &ev);
  }
  if (!nr_channel_is_open(ch))
    return;
  if (s->active_fired && nr_channel_options(ch)->allow_half_closure)
    nr_ctx_fire_user_event(s->ctx, (void *)&NR_EVT_INPUT_SHUTDOWN);
  else
    nr_channel_close_when_idle(ch);
}

/* The peer updated its keys too often (handshake.c's count_key_update):
 * say so, close (SSL has no way to send an alert of our choosing). */
static void key_update_flood(tls_t *s) {
  char msg[160];
  snprintf(msg, sizeof msg, "tls: the peer updated its keys too often "
           "(KeyUpdate: more than %d at once or %d a second)", NR_TLS_KU_BURST,
           (int)(NR_SEC(1) / NR_TLS_KU_EVERY));
  s->st = ST_DONE;
  nr__tls_fail_queue(s, msg);
  nr_ctx_fire_exception(s->ctx, &(nr_err_t){-EPROTO, msg});
  nr_ctx_close(s->ctx, NULL);
}

/* Whether SSL has taken all the input there is: the next SSL_read could
 * only say "want read". */
static bool input_done(tls_t *s) {
  return nr_buf_len(&s->in_rest) + s->in_len == 0 && !SSL_has_pending(s->ssl);
}

/* Decrypt what has arrived and fire it, a chunk at a time. The last
 * message of a read its producer let wait (`last`) may wait too: nothing
 * this handler does after it depends on what the handlers do with it (a
 * Lua handler then takes the read in one call with its read_complete). */
static void decrypt(tls_t *s, bool last) {
  char buf[PLAIN_CHUNK];
  size_t have = 0;
  bool wrote = false;             /* SSL_read answered something itself */
  while (s->st == ST_OPEN && !s->removed && !s->peer_shut) {
    size_t n = 0;
    int rc = SSL_read_ex(s->ssl, buf + have, sizeof buf - have, &n);
    /* Now: the handlers fired below may write, and SSL_write resets what
     * SSL_get_error reads. */
    int e = rc == 1 ? SSL_ERROR_NONE : SSL_get_error(s->ssl, rc);
    wrote |= settle(s);           /* a key update's answer, an alert */
    if (s->ku_over) {
      key_update_flood(s);        /* what came with the updates is dropped */
      break;
    }
    bool done = rc == 1 && input_done(s);
    if (rc == 1) {
      have += n;
      if (have < sizeof buf && !done)
        continue;                 /* gather records into one message */
    }
    if (have > 0) {
      nr_bytes_t b = NR_BYTES(buf, have);
      have = 0;
      s->fired = true;
      if (done && last)
        nr_ctx_fire_read_deferrable(s->ctx, &b);
      else
        nr_ctx_fire_read(s->ctx, &b);
      if (!nr_channel_is_open(nr_ctx_channel(s->ctx)))
        break;
    }
    if (done)
      break;                      /* skip the SSL_read that says "want read" */
    if (rc == 1)
      continue;
    if (e == SSL_ERROR_ZERO_RETURN)
      peer_closed(s);
    else if (e != SSL_ERROR_WANT_READ && s->st == ST_OPEN)
      nr__tls_fail(s, e);
    break;
  }
  if ((wrote || nr__tls_has_out(s)) && s->st == ST_OPEN) {
    nr__tls_pass_out(s, NULL);            /* a key update's answer, tickets */
    nr__tls_flush_out(s);
  }
}

/* Keep what SSL has not taken of the current read, after what waits. */
static int keep_rest(tls_t *s) {
  int rc = s->in_len > 0 ? nr_buf_append(&s->in_rest, s->in, s->in_len) : 0;
  s->in = NULL;
  s->in_len = 0;
  return rc < 0 ? nr_raise(-ENOMEM, "tls: out of memory") : 0;
}

/* Decrypt one run of ciphertext. Nested inside another (a handler fed
 * the pipeline again from channel_read), it only queues behind it. */
static int feed(tls_t *s, const char *data, size_t len, bool last) {
  if (s->busy > 0) {
    int rc = keep_rest(s);
    if (rc == 0 && nr_buf_append(&s->in_rest, data, len) < 0)
      rc = nr_raise(-ENOMEM, "tls: out of memory");
    return rc;
  }
  s->in = data;
  s->in_len = len;
  s->busy++;
  if (s->st == ST_HANDSHAKE)
    nr__tls_handshake(s);
  if (s->st == ST_OPEN)
    decrypt(s, last);
  s->busy--;
  if (s->st == ST_DONE || s->removed || s->peer_shut) {
    s->in = NULL;     /* after a failure or close_notify, input is dropped */
    s->in_len = 0;
    nr_buf_free(&s->in_rest);
    return 0;
  }
  return keep_rest(s);             /* nothing, unless SSL stopped early */
}

/* ---- gathering small writes ------------------------------------------------------ */

/* Inside its own channel_read and channel_read_complete -- where a read's
 * answers are written, 16 of them for 16 pipelined requests -- the
 * handler gathers the writes after the first into one record of up to
 * GATHER_MAX bytes: an SSL_write's cost is per record far more than per
 * byte (bench/RESULTS.md). The first is encrypted at once, so the channel has unflushed
 * bytes exactly when it would without gathering (a read's end flushes
 * them for handlers that have no channel_read_complete). A flush, a
 * close, a removal, or the end of the callback encrypts what was
 * gathered, so nothing waits here past the callback; the writes' promises
 * complete once the record is written (their bytes are in it). */
#define GATHER_MAX 16384

static int keep_promise(tls_t *s, nr_promise_t *p) {
  if (s->npp == s->cpp) {
    size_t cap = s->cpp ? s->cpp * 2 : 16;
    nr_promise_t **v = realloc(s->pp, cap * sizeof *v);
    if (v == NULL)
      return -ENOMEM;
    s->pp = v;
    s->cpp = cap;
  }
  s->pp[s->npp++] = nr_promise_retain(p);
  return 0;
}

static int gather(tls_t *s, const char *data, size_t len, nr_promise_t *p) {
  if (p != NULL && keep_promise(s, p) < 0)
    return nr_raise(-ENOMEM, "tls: out of memory");
  if (nr_buf_append(&s->pend, data, len) < 0) {
    if (p != NULL)
      nr_promise_release(s->pp[--s->npp]);
    return nr_raise(-ENOMEM, "tls: out of memory");
  }
  return 0;
}

/* Encrypt what was gathered, as one record, and pass its promises on. */
static int drain(tls_t *s) {
  if (nr_buf_len(&s->pend) == 0 && s->npp == 0)
    return 0;
  nr_buf_t b = s->pend;            /* writes made meanwhile gather anew */
  nr_promise_t **pp = s->pp;
  size_t n = s->npp;
  s->pend = NR_BUF_INIT;
  s->pp = NULL;
  s->npp = s->cpp = 0;
  int rc = NR_ECLOSED;
  if (s->st == ST_OPEN && !s->shut_sent)
    rc = nr_buf_len(&b) > 0 ? nr__tls_encrypt(s, nr_buf_peek(&b), nr_buf_len(&b), NULL)
                            : 0;
  for (size_t i = 0; i < n; i++) {
    if (rc == 0)
      nr__tls_pass_out(s, pp[i]);          /* completes once the record is written */
    else
      nr_promise_set_failure(pp[i], rc, rc == NR_ECLOSED
                             ? "channel closed before the write was encrypted"
                             : "tls: the write could not be encrypted");
    nr_promise_release(pp[i]);
  }
  free(pp);
  nr_buf_free(&b);
  return rc == NR_ECLOSED ? 0 : rc;
}

static void gather_enter(tls_t *s) { s->gather++; }

/* Leave a callback; false when s was freed (removed during it). */
static bool gather_leave(tls_t *s) {
  if (--s->gather > 0)
    return true;
  s->wrote_one = false;
  if (s->removed) {
    if (s->busy > 0)
      return true;
    free_state(s);
    return false;
  }
  if (drain(s) < 0)
    nr_ctx_fire_exception(s->ctx, &(nr_err_t){-EPROTO,
                          "tls: encrypting the writes of a read failed"});
  if (s->flush_owed && !s->hold)
    nr__tls_flush_out(s);
  return true;
}

static int tls_channel_read(nr_ctx_t *ctx, void *msg) {
  tls_t *s = nr_ctx_state(ctx);
  int type = nr_msg_type(msg), rc = 0;
  if (type != NR_MSG_BYTES && type != NR_MSG_SLICES) {
    nr_ctx_fire_read(ctx, msg);    /* not ours to decrypt */
    return 0;
  }
  if (s->st == ST_DONE || s->peer_shut)
    return 0;                      /* nothing is read past close_notify */
  bool last = nr_ctx_read_deferrable(ctx, msg);
  gather_enter(s);
  if (type == NR_MSG_BYTES) {
    rc = feed(s, ((nr_bytes_t *)msg)->data, ((nr_bytes_t *)msg)->len, last);
  } else {
    const nr_slices_t *v = msg;
    for (size_t i = 0; rc == 0 && i < v->n && !s->removed; i++)
      rc = feed(s, v->v[i].data, v->v[i].len, last && i + 1 == v->n);
  }
  /* A read its producer lets wait ends with channel_read_complete: what
   * the handshake flushed (a resumption's tickets) waits for the answer
   * written there, and both leave in one write. */
  s->hold = last;
  if (gather_leave(s))
    s->hold = false;
  return rc;
}

static int tls_channel_read_complete(nr_ctx_t *ctx) {
  tls_t *s = nr_ctx_state(ctx);
  nr__tls_read_if_needed(s);
  bool fired = s->fired;
  s->fired = false;
  if (fired || s->active_fired) {
    gather_enter(s);
    nr_ctx_fire_read_complete(ctx);
    gather_leave(s);
  } else if (s->flush_owed) {
    nr__tls_flush_out(s);
  }
  return 0;
}

/* The handlers had input_shutdown at close_notify: not again at the FIN
 * that may follow it (allow_half_closure). */
static int tls_user_event(nr_ctx_t *ctx, void *evt) {
  tls_t *s = nr_ctx_state(ctx);
  if (evt != &NR_EVT_INPUT_SHUTDOWN || !s->peer_shut)
    nr_ctx_fire_user_event(ctx, evt);
  return 0;
}

static int tls_active(nr_ctx_t *ctx) {
  tls_t *s = nr_ctx_state(ctx);
  s->active_seen = true;
  nr__tls_start_timer(s);
  if (!s->bundle->server && !s->started && s->st == ST_HANDSHAKE)
    nr__tls_handshake(s);                  /* the ClientHello */
  if (s->st == ST_HANDSHAKE)
    nr__tls_read_if_needed(s);
  return 0;
}

static int tls_inactive(nr_ctx_t *ctx) {
  tls_t *s = nr_ctx_state(ctx);
  const char *why = "channel closed before the TLS handshake completed";
  nr__tls_stop_timer(s);
  if (s->st == ST_HANDSHAKE) {
    s->st = ST_DONE;
    nr__tls_fail_queue(s, why);
    nr__tls_settle_hs(s, NR_ECLOSED, closed_why(s));
  }
  if (s->active_fired)
    nr_ctx_fire_inactive(ctx);
  return 0;
}

/* ---- outbound ---------------------------------------------------------------------- */

/* Encrypt len bytes and pass the records on, p with the last of them. */
int nr__tls_encrypt(tls_t *s, const char *data, size_t len, nr_promise_t *p) {
  int rc = 0;
  do {
    size_t n = len < WRITE_CHUNK ? len : WRITE_CHUNK, done = 0;
    if (n > 0 && SSL_write_ex(s->ssl, data, n, &done) != 1) {
      char msg[512];
      ssl_reason(s, SSL_get_error(s->ssl, 0), msg, sizeof msg);
      if (p)
        nr_promise_set_failure(p, -EPROTO, msg);
      return nr_raise(-EPROTO, "%s", msg);
    }
    data += n;
    len -= n;
    rc = nr__tls_pass_out(s, len == 0 ? p : NULL);
  } while (len > 0 && rc == 0);
  return rc;
}

static int enqueue(tls_t *s, const char *data, size_t len, nr_promise_t *p) {
  pw_t *w = malloc(sizeof *w + len);
  if (w == NULL)
    return nr_raise(-ENOMEM, "tls: out of memory");
  w->next = NULL;
  w->p = p ? nr_promise_retain(p) : NULL;
  w->len = len;
  memcpy(w->data, data, len);
  *s->qtail = w;
  s->qtail = &w->next;
  return 0;
}

static int write_bytes(tls_t *s, const char *data, size_t len,
                       nr_promise_t *p) {
  if (s->st == ST_HANDSHAKE)
    return enqueue(s, data, len, p);
  if (s->gather > 0 && s->wrote_one &&
      nr_buf_len(&s->pend) + len <= GATHER_MAX)
    return gather(s, data, len, p);
  int rc = drain(s);
  s->wrote_one = s->gather > 0;
  return rc < 0 ? rc : nr__tls_encrypt(s, data, len, p);
}

static int tls_write(nr_ctx_t *ctx, void *msg, nr_promise_t *p) {
  tls_t *s = nr_ctx_state(ctx);
  int type = nr_msg_type(msg);
  if (s->st == ST_DONE || s->shut_sent)
    return nr_raise(NR_ECLOSED, "write on a closed TLS channel");
  if (type == NR_MSG_BYTES) {
    const nr_bytes_t *b = msg;
    return write_bytes(s, b->data, b->len, p);
  }
  if (type != NR_MSG_SLICES) {
    char what[96];
    nr_msg_describe(type, what, sizeof what);
    return nr_raise(-EINVAL, "tls: cannot encrypt %s (no handler after tls "
                    "encoded it to bytes)", what);
  }
  const nr_slices_t *v = msg;
  int rc = 0;
  for (size_t i = 0; rc == 0 && i < v->n; i++)
    rc = write_bytes(s, v->v[i].data, v->v[i].len, i + 1 == v->n ? p : NULL);
  if (v->n == 0 && p)
    nr_promise_set_success(p, NULL, NULL);
  return rc;
}

static int tls_flush(nr_ctx_t *ctx) {
  tls_t *s = nr_ctx_state(ctx);
  if (s->st == ST_HANDSHAKE) {
    s->flush_req = true;           /* once the handshake completes */
    return 0;
  }
  int rc = drain(s);
  nr__tls_flush_out(s);
  return rc;
}

/* close_notify after everything written before the close. */
static int tls_close(nr_ctx_t *ctx, nr_promise_t *p) {
  tls_t *s = nr_ctx_state(ctx);
  drain(s);
  if (s->st == ST_OPEN && !s->shut_sent) {
    s->shut_sent = true;
    SSL_shutdown(s->ssl);
    ERR_clear_error();
    nr__tls_pass_out(s, NULL);
    s->flush_owed = true;
  } else if (s->st == ST_HANDSHAKE) {
    nr__tls_fail_queue(s, "channel closed before the TLS handshake completed");
  }
  if (s->flush_owed) {             /* what waited leaves before the close */
    s->flush_owed = false;
    nr_ctx_flush(ctx);
  }
  return nr_ctx_close(ctx, p);
}

/* ---- lifetime ---------------------------------------------------------------------- */

/* A server's handshake under way: the channel may be shed when accept
 * finds no free descriptor (a peer that drips its ClientHello holds one
 * as a slowloris does), until the handshake completes. */
void nr__tls_mark_handshaking(tls_t *s, bool on) {
  if (s->shedding != on && (s->bundle->server || !on)) {
    s->shedding = on;
    nr_channel_set_handshaking(nr_ctx_channel(s->ctx), on);
  }
}

static void tls_added(nr_ctx_t *ctx) {
  tls_t *s = nr_ctx_state(ctx);
  s->ctx = ctx;
  nr_channel_t *ch = nr_ctx_channel(ctx);
  if (s->st == ST_HANDSHAKE)
    nr__tls_mark_handshaking(s, true);
  if (nr_channel_is_active(ch) && nr_channel_fired_active(ch)) {
    /* Added by hand: the handlers after this one saw channel_active. */
    s->active_seen = s->active_fired = true;
    nr__tls_start_timer(s);
    if (!s->bundle->server)
      nr__tls_handshake(s);
    nr__tls_read_if_needed(s);
  }
}

static void tls_removed(nr_ctx_t *ctx) {
  tls_t *s = nr_ctx_state(ctx);
  nr__tls_mark_handshaking(s, false);
  drain(s);                        /* the way on stays: passed out */
  if (s->flush_owed) {
    s->flush_owed = false;
    nr_ctx_flush(ctx);
  }
  if (s->busy > 0 || s->gather > 0)
    s->removed = true;
  else
    free_state(s);
}

nr_promise_t *nr_tls_handshake_future(nr_ctx_t *ctx) {
  tls_t *s = nr_ctx_state(ctx);
  nr_promise_t *p = nr_promise_new();
  if (p == NULL)
    return NULL;
  if (s->handshaken) {
    nr_promise_set_success(p, NULL, NULL);
  } else if (s->st == ST_DONE) {
    nr_promise_set_failure(p, NR_ECLOSED, "the TLS handshake failed");
  } else {
    if (s->hs == NULL)
      s->hs = nr_promise_new();
    if (s->hs == NULL) {
      nr_promise_release(p);
      return NULL;
    }
    nr_promise_release(p);
    p = nr_promise_retain(s->hs);
  }
  return p;
}

const nr_handler_t nr_tls_handler = {
    .type = "tls",
    .added = tls_added,
    .removed = tls_removed,
    .active = tls_active,
    .inactive = tls_inactive,
    .user_event = tls_user_event,
    .channel_read = tls_channel_read,
    .channel_read_complete = tls_channel_read_complete,
    .write = tls_write,
    .flush = tls_flush,
    .close = tls_close,
};
