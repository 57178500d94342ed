/*
 * handshake.c -- the TLS handler's handshake (handler.c is the rest):
 * driving SSL_do_handshake as ciphertext arrives, its deadline, its
 * completion (the handshake future, the event fired, writes made before
 * it sent), and refusing a peer that speaks plain HTTP to a TLS port.
 * Loop thread only, on the handler's channel.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <openssl/err.h>
#include <openssl/ssl.h>

#include "tls/handler.h"

/* ---- the handshake ----------------------------------------------------------------- */

int nr__tls_encrypt(tls_t *s, const char *data, size_t len, nr_promise_t *p);

/* The peer certificate's subject and issuer (RFC 2253), each whole: both
 * printed into one memory BIO (*m, the caller frees it), each followed by
 * a NUL, so that neither is cut nor runs into the other, whatever their
 * length (a certificate's size is bounded by SSL's max_cert_list). The
 * RFC 2253 flags escape control characters, so a name holds no NUL of its
 * own; checked anyway, as an application may authorize on these strings.
 * 0, or -1 when either could not be printed (out of memory). */
static int peer_names(X509 *peer, BIO **m, const char **subject,
                      const char **issuer) {
  char *data;
  if ((*m = BIO_new(BIO_s_mem())) == NULL ||
      X509_NAME_print_ex(*m, X509_get_subject_name(peer), 0,
                         XN_FLAG_RFC2253) < 0 ||
      BIO_write(*m, "", 1) != 1)
    goto fail;
  long at = BIO_get_mem_data(*m, NULL);     /* where the issuer begins */
  if (X509_NAME_print_ex(*m, X509_get_issuer_name(peer), 0,
                         XN_FLAG_RFC2253) < 0 ||
      BIO_write(*m, "", 1) != 1)
    goto fail;
  long len = BIO_get_mem_data(*m, &data);   /* the data moves as it grows */
  if (strlen(data) != (size_t)at - 1 || strlen(data + at) != (size_t)(len - at) - 1)
    goto fail;
  *subject = data;
  *issuer = data + at;
  return 0;
fail:
  ERR_clear_error();
  return -1;
}

/* ---- key updates ------------------------------------------------------------- */

/* A TLS 1.3 peer may update its keys (KeyUpdate, RFC 8446 4.6.3) when it
 * likes, and SSL derives a new key for each: ~30 us for a ~40-byte
 * record, a thousand times what the same bytes of data cost. A peer
 * sending one byte of data between them (to pass OpenSSL's own count of
 * key updates with nothing between, as Go's and BoringSSL's) could keep a
 * loop busy for seconds. Real peers update after gigabytes (AES-GCM's
 * limit is 2^24.5 records) or hours, so past NR_TLS_KU_BURST at once and
 * one per NR_TLS_KU_EVERY after (a token bucket, kept as the time the next
 * update is due: the generic cell rate algorithm) the connection fails
 * (handler.c's decrypt), as OpenSSL plans to (one per 100 ms). Counted by
 * SSL's info callback, set once a TLS 1.3 handshake completed: it runs as
 * SSL's state machine moves, so a record of data costs nothing more; a
 * key update about seven calls. */
static void count_key_update(const SSL *ssl, int where, int ret) {
  (void)ret;
  if (!(where & SSL_CB_LOOP))
    return;
  OSSL_HANDSHAKE_STATE st = SSL_get_state(ssl);
  if (st != TLS_ST_SR_KEY_UPDATE && st != TLS_ST_CR_KEY_UPDATE)
    return;                        /* (once per key update received) */
  tls_t *s = BIO_get_data(SSL_get_rbio(ssl));
  uint64_t now = nr_now();
  s->ku_tat = (s->ku_tat > now ? s->ku_tat : now) + NR_TLS_KU_EVERY;
  if (s->ku_tat - now > NR_TLS_KU_BURST * NR_TLS_KU_EVERY)
    s->ku_over = true;             /* decrypt() fails the connection */
}

/* Fire the event that tells the handlers what was agreed. */
static void fire_event(tls_t *s) {
  nr_tls_event_t ev = {
      .type = NR_MSG_TLS_EVENT, .kind = NR_TLS_HANDSHAKE,
      .version = SSL_get_version(s->ssl),
      .cipher = SSL_get_cipher_name(s->ssl),
      .server_name = SSL_get_servername(s->ssl, TLSEXT_NAMETYPE_host_name),
      .resumed = SSL_session_reused(s->ssl) == 1, .server = s->bundle->server};
  const unsigned char *a = NULL;
  unsigned alen = 0;
  char alpn[256];
  SSL_get0_alpn_selected(s->ssl, &a, &alen);
  if (alen > 0) {
    memcpy(alpn, a, alen);
    alpn[alen] = '\0';
    ev.alpn = alpn;
  }
  X509 *peer = SSL_get0_peer_certificate(s->ssl);
  BIO *m = NULL;
  if (peer != NULL &&
      peer_names(peer, &m, &ev.peer_subject, &ev.peer_issuer) < 0) {
    ev.peer_subject = ev.peer_issuer = NULL;
    ev.peer_error = "the certificate's subject or issuer could not be read";
  }
  nr_ctx_fire_user_event(s->ctx, &ev);
  BIO_free(m);
}

/* The handshake completed: encrypt what waited, then let the handlers
 * after this one see the channel (active, then the event). */
static void handshake_done(tls_t *s) {
  s->st = ST_OPEN;
  s->handshaken = true;
  nr__tls_mark_handshaking(s, false);
  nr__tls_stop_timer(s);
  if (SSL_version(s->ssl) == TLS1_3_VERSION)
    SSL_set_info_callback(s->ssl, count_key_update);
  pw_t *q = s->queue;
  s->queue = NULL;
  s->qtail = &s->queue;
  for (pw_t *n; q; q = n) {
    n = q->next;
    if (s->st == ST_OPEN)
      nr__tls_encrypt(s, q->data, q->len, q->p);
    else if (q->p)
      nr_promise_set_failure(q->p, NR_ECLOSED, "channel closed");
    if (q->p)
      nr_promise_release(q->p);
    free(q);
  }
  if (s->flush_req)
    nr__tls_flush_out(s);
  s->flush_req = false;
  nr__tls_settle_hs(s, 0, NULL);
  if (s->active_seen && !s->active_fired) {
    s->active_fired = true;
    nr_ctx_fire_active(s->ctx);
  }
  if (s->st == ST_OPEN && !s->removed)
    fire_event(s);
}

/* The handshake cannot go on: tell the handlers after this one, close. */
static void give_up(tls_t *s, int code, const char *msg) {
  s->st = ST_DONE;
  nr__tls_stop_timer(s);
  nr__tls_fail_queue(s, msg);
  nr__tls_settle_hs(s, code, msg);
  nr_ctx_fire_exception(s->ctx, &(nr_err_t){code, msg});
  nr_ctx_close(s->ctx, NULL);
}

/* What a server's first bytes d[0 .. n) are: the start of an HTTP/1
 * request line -- a method in capitals, a space, a target -- from a plain
 * HTTP client on the TLS port (PLAIN); something else, for SSL to judge
 * (OTHER: a TLS record begins with 0x16, 0x80 for an SSLv2 hello); or
 * what may still become such a line (UNSURE: capitals so far, at most a
 * space after them), when the line came split. */
enum { OTHER, PLAIN, UNSURE };
#define FIRST_PEEK 18             /* a 16-letter method, a space, a byte */

static int first_bytes(const char *d, size_t n) {
  size_t i = 0;
  while (i < n && i < 16 && d[i] >= 'A' && d[i] <= 'Z')
    i++;
  if (i == n || (i >= 3 && i + 1 == n && d[i] == ' '))
    return n < FIRST_PEEK ? UNSURE : OTHER;
  return i >= 3 && i + 1 < n && d[i] == ' ' && d[i + 1] > ' ' &&
                 d[i + 1] < 0x7f
             ? PLAIN
             : OTHER;
}

/* The first bytes of the input (what waits, then the read): how many. */
static size_t peek(const tls_t *s, char *d, size_t n) {
  size_t rest = nr_buf_len(&s->in_rest), k = rest < n ? rest : n;
  if (k > 0)
    memcpy(d, nr_buf_peek(&s->in_rest), k);
  size_t more = s->in_len < n - k ? s->in_len : n - k;
  if (more > 0)
    memcpy(d + k, s->in, more);
  return k + more;
}

/* Answer a plain HTTP request with a plain 400 that says why, as nginx
 * does, and close (lingering: the client may still be sending). */
static void refuse_plain(tls_t *s, const char *line, size_t len) {
  static const char why[] = "The plain HTTP request was sent to HTTPS port\n";
  char head[160];
  int n = snprintf(head, sizeof head, "HTTP/1.1 400 Bad Request\r\n"
                   "Content-Type: text/plain\r\nContent-Length: %zu\r\n"
                   "Connection: close\r\n\r\n%s", sizeof why - 1,
                   len >= 5 && memcmp(line, "HEAD ", 5) == 0 ? "" : why);
  nr_bytes_t b = NR_BYTES(head, (size_t)n);
  nr_ctx_write(s->ctx, &b, NULL);
  nr_ctx_flush(s->ctx);
  nr_channel_linger(nr_ctx_channel(s->ctx));
  give_up(s, -EPROTO, "tls: handshake failed: a plain HTTP request on the "
          "TLS port (answered 400)");
}

/* Drive the handshake with what has arrived; false once it failed. */
bool nr__tls_handshake(tls_t *s) {
  s->started = true;
  if (s->ssl == NULL && s->bundle->server) {
    char d[FIRST_PEEK];
    size_t n = peek(s, d, sizeof d);
    int kind = first_bytes(d, n);
    if (kind == UNSURE)
      return true;                 /* feed keeps the bytes for the next */
    if (kind == PLAIN) {
      refuse_plain(s, d, n);
      return false;
    }
  }
  if (s->ssl == NULL && nr__tls_make_ssl(s) < 0) {
    give_up(s, -ENOMEM, "tls: out of memory for the handshake");
    return false;
  }
  int rc = SSL_do_handshake(s->ssl);
  int e = rc == 1 ? SSL_ERROR_NONE : SSL_get_error(s->ssl, rc);
  if (e != SSL_ERROR_NONE && e != SSL_ERROR_WANT_READ) {
    nr__tls_fail(s, e);
    return false;
  }
  if (nr__tls_has_out(s)) {
    nr__tls_pass_out(s, NULL);
    nr__tls_flush_out(s);
  }
  if (rc == 1)
    handshake_done(s);
  return true;
}

/* With auto_read off nobody else asks for the bytes the handshake (or an
 * incomplete record) needs. */
void nr__tls_read_if_needed(tls_t *s) {
  const nr_channel_opts_t *o = nr_channel_options(nr_ctx_channel(s->ctx));
  if (!o->auto_read && nr_channel_is_open(nr_ctx_channel(s->ctx)) &&
      (s->st == ST_HANDSHAKE || !s->fired))
    nr_ctx_read(s->ctx);
}

/* A peer that never completes the handshake holds a connection (and an
 * fd) for nothing: past the deadline it is told so and closed. */
static int timed_out(void *arg) {
  tls_t *s = arg;
  nr_timer_release(s->timer);            /* this timer; the loop holds it */
  s->timer = NULL;
  if (s->st != ST_HANDSHAKE)
    return 0;
  char msg[128];
  snprintf(msg, sizeof msg, "tls: handshake timed out after %g s",
           (double)s->bundle->handshake_timeout / 1e9);
  s->st = ST_DONE;
  nr__tls_fail_queue(s, msg);
  nr__tls_settle_hs(s, NR_ETIMEDOUT, msg);
  /* Outside any handler call: a handler that closes the channel from
   * exception_caught frees s as that call returns. */
  nr_ctx_t *ctx = nr_ctx_retain(s->ctx);
  nr_ctx_fire_exception(ctx, &(nr_err_t){NR_ETIMEDOUT, msg});
  nr_ctx_close(ctx, NULL);
  nr_ctx_release(ctx);
  return 0;
}

void nr__tls_start_timer(tls_t *s) {
  if (s->timer || s->bundle->handshake_timeout == 0 || s->st != ST_HANDSHAKE)
    return;
  s->timer = nr_loop_schedule(nr_channel_loop(nr_ctx_channel(s->ctx)),
                              s->bundle->handshake_timeout, 0, timed_out,
                              NULL, s);
}
