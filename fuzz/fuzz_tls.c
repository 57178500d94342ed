/*
 * fuzz_tls.c -- the TLS handler's record path (runtime/tls/handler.c)
 * after a good handshake.
 *
 * Two embedded channels, a client and a server each with the TLS handler
 * in its pipeline, complete a real TLS 1.3 handshake by passing each
 * other's bytes (a key and certificate made once, in memory: none is
 * committed). Then the input decides what the server reads, fed in pieces
 * (fuzz_chunk):
 *   mode 0 (first byte's low bits 00): the rest of the input as it is --
 *     garbage where records should be;
 *   mode 1 (odd): the client encrypts the input's plaintext (after a
 *     2-byte header: how many edit pairs follow, and with bit 0x80 of the
 *     second byte, whether the client closes after it: its close_notify
 *     follows the plaintext), and the edits (offset, xor) corrupt its
 *     ciphertext on the way;
 *   mode 2 (10): a fresh server gets the rest as its very first bytes, no
 *     handshake before (garbage, or plain HTTP on the TLS port).
 * Invariants: whatever plaintext the server fires is a prefix of what the
 * client wrote (AEAD: nothing forged, reordered or truncated inside a
 * record gets through); a failure reaches exception_caught with a message
 * starting "tls: "; after it nothing more is fired; ciphertext left
 * untouched is delivered whole, and after the client's close_notify the
 * server closes once its loop ran, its own close_notify last out. First
 * bytes that look like an HTTP request line are answered with a plain
 * 400; others fail the handshake; either way nothing is fired.
 */
#include <openssl/err.h>
#include <openssl/evp.h>
#include <openssl/pem.h>
#include <openssl/x509.h>

#include "common.h"
#include "tls/tls.h"

typedef struct got_s {
  char *plain;
  size_t len, cap;
  int errors;
} got_t;

static void on_inbound(void *ud, void *msg) {
  got_t *g = ud;
  if (nr_msg_type(msg) != NR_MSG_BYTES)
    return;                       /* the handshake event */
  FUZZ_ASSERT(g->errors == 0);    /* nothing after a failure */
  const nr_bytes_t *b = msg;
  fuzz_append(&g->plain, &g->len, &g->cap, b->data, b->len);
}

static void on_exception(void *ud, const nr_err_t *err) {
  got_t *g = ud;
  FUZZ_ASSERT(err->msg != NULL && strncmp(err->msg, "tls: ", 5) == 0);
  g->errors++;
}

/* PEM text of a bio's contents (malloc'd). */
static char *bio_text(BIO *b) {
  char *p;
  long n = BIO_get_mem_data(b, &p);
  char *s = malloc((size_t)n + 1);
  FUZZ_ASSERT(s != NULL);
  memcpy(s, p, (size_t)n);
  s[n] = '\0';
  return s;
}

/* A self-signed P-256 certificate for CN=localhost, made in memory. */
static void make_pair(char **cert, char **key) {
  EVP_PKEY *k = EVP_EC_gen("P-256");
  X509 *x = X509_new();
  FUZZ_ASSERT(k && x);
  ASN1_INTEGER_set(X509_get_serialNumber(x), 1);
  X509_gmtime_adj(X509_getm_notBefore(x), 0);
  X509_gmtime_adj(X509_getm_notAfter(x), 3600L * 24 * 365);
  X509_set_pubkey(x, k);
  X509_NAME *name = X509_get_subject_name(x);
  X509_NAME_add_entry_by_txt(name, "CN", MBSTRING_ASC,
                             (const unsigned char *)"localhost", -1, -1, 0);
  X509_set_issuer_name(x, name);
  FUZZ_ASSERT(X509_sign(x, k, EVP_sha256()) > 0);
  BIO *c = BIO_new(BIO_s_mem()), *p = BIO_new(BIO_s_mem());
  FUZZ_ASSERT(PEM_write_bio_X509(c, x) == 1);
  FUZZ_ASSERT(PEM_write_bio_PrivateKey(p, k, NULL, NULL, 0, NULL, NULL) == 1);
  *cert = bio_text(c);
  *key = bio_text(p);
  BIO_free(c);
  BIO_free(p);
  X509_free(x);
  EVP_PKEY_free(k);
}

static nr_tls_config_t *server_cfg, *client_cfg;

static void setup(void) {
  if (server_cfg != NULL)
    return;
  char *cert, *key, err[512];
  make_pair(&cert, &key);
  nr_tls_opts_t s = {.server = true, .cert = {.cert_pem = cert, .key_pem = key},
                     .session_tickets = true};
  nr_tls_opts_t c = {.server = false, .verify = NR_TLS_VERIFY_NONE};
  server_cfg = nr_tls_config_new(&s, err, sizeof err);
  client_cfg = nr_tls_config_new(&c, err, sizeof err);
  FUZZ_ASSERT(server_cfg && client_cfg);
  free(cert);
  free(key);
}

static nr_embedded_t *side(nr_tls_config_t *cfg, got_t *g) {
  nr_embedded_sink_t sink = {on_inbound, NULL, on_exception, g};
  nr_embedded_t *e = nr_embedded_new(fuzz_loop(), &sink);
  FUZZ_ASSERT(e != NULL);
  void *st = nr_tls_new(cfg);
  FUZZ_ASSERT(st != NULL);
  nr_pipeline_t *p = nr_channel_pipeline(nr_embedded_channel(e));
  FUZZ_ASSERT(nr_pipeline_add_last(p, "tls", &nr_tls_handler, st) == 0);
  return e;
}

/* Everything `from` wrote, appended to *buf. */
static void drain(nr_embedded_t *from, char **buf, size_t *len, size_t *cap) {
  size_t n;
  for (char *b; (b = nr_embedded_read_outbound(from, &n)); free(b))
    fuzz_append(buf, len, cap, b, n);
}

/* Pass each side's bytes to the other until neither has more. */
static void handshake(nr_embedded_t *c, nr_embedded_t *s) {
  for (int round = 0; round < 8; round++) {
    char *b = NULL;
    size_t len = 0, cap = 0;
    drain(c, &b, &len, &cap);
    nr_bytes_t m = NR_BYTES(b, len);
    if (len > 0)
      nr_embedded_write_inbound(s, &m, true);
    size_t sent = len;
    len = 0;
    drain(s, &b, &len, &cap);
    m = NR_BYTES(b, len);
    if (len > 0)
      nr_embedded_write_inbound(c, &m, true);
    free(b);
    if (sent == 0 && len == 0)
      break;
  }
}

static bool done_ok(nr_embedded_t *e) {
  nr_ctx_t *ctx = nr_pipeline_context(nr_channel_pipeline(nr_embedded_channel(e)), "tls");
  nr_promise_t *p = nr_tls_handshake_future(ctx);
  bool ok = nr_promise_is_success(p);
  nr_promise_release(p);
  return ok;
}

static void feed(nr_embedded_t *s, const char *data, size_t len,
                 uint32_t seed) {
  for (size_t off = 0, n; off < len && nr_channel_is_open(nr_embedded_channel(s));
       off += n) {
    n = fuzz_chunk(&seed, len - off);
    nr_bytes_t b = NR_BYTES(data + off, n);
    nr_embedded_write_inbound(s, &b, true);
  }
}

/* Mode 2: a server that never had a handshake gets `data` first. */
static void first_bytes(const char *data, size_t len, uint32_t seed) {
  got_t g = {0};
  nr_embedded_t *s = side(server_cfg, &g);
  nr_embedded_start(s);
  feed(s, data, len, seed);
  FUZZ_ASSERT(g.len == 0);
  char *out = NULL;
  size_t n = 0, cap = 0;
  drain(s, &out, &n, &cap);
  if (n >= 9 && memcmp(out, "HTTP/1.1 ", 9) == 0)    /* plain HTTP: told */
    FUZZ_ASSERT(g.errors == 1 && memcmp(out, "HTTP/1.1 400 ", 13) == 0 &&
                !nr_channel_is_open(nr_embedded_channel(s)));
  free(out);
  nr_embedded_free(s);
  free(g.plain);
}

/* Run what the loop has queued (a close after close_notify). */
static void run_tasks(void) {
  for (int i = 0; i < 16 && nr_loop_has_pending_tasks(fuzz_loop()); i++)
    nr_loop_run_once(fuzz_loop(), 0);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (size < 1)
    return 0;
  setup();
  if ((data[0] & 3) == 2) {
    first_bytes((const char *)data + 1, size - 1, fuzz_seed(data, size));
    ERR_clear_error();
    return 0;
  }
  got_t cg = {0}, sg = {0};
  nr_embedded_t *c = side(client_cfg, &cg), *s = side(server_cfg, &sg);
  nr_embedded_start(s);
  nr_embedded_start(c);
  handshake(c, s);
  FUZZ_ASSERT(done_ok(c) && done_ok(s));
  uint32_t seed = fuzz_seed(data, size);
  const char *plain = NULL;
  size_t plain_len = 0;
  if ((data[0] & 1) == 0) {
    feed(s, (const char *)data + 1, size - 1, seed);
  } else if (size >= 2) {
    size_t edits = data[1] % 8;
    size_t head = 2 + 3 * edits;
    if (head > size)
      head = size, edits = (size - 2) / 3;
    plain = (const char *)data + head;
    plain_len = size - head;
    nr_bytes_t m = NR_BYTES(plain, plain_len);
    FUZZ_ASSERT(nr_embedded_write_outbound(c, &m) == 0);
    bool closes = data[1] & 0x80;
    if (closes)                   /* its close_notify follows */
      nr_channel_close(nr_embedded_channel(c), NULL);
    char *wire = NULL;
    size_t len = 0, cap = 0;
    drain(c, &wire, &len, &cap);
    for (size_t i = 0; i < edits && len > 0; i++) {
      const uint8_t *e = data + 2 + 3 * i;
      wire[((size_t)e[0] << 8 | e[1]) % len] ^= (char)e[2];
    }
    feed(s, wire, len, seed);
    FUZZ_ASSERT(sg.len <= plain_len);
    if (edits == 0)               /* untouched ciphertext arrives whole */
      FUZZ_ASSERT(sg.errors == 0 && sg.len == plain_len);
    run_tasks();
    if (edits == 0 && closes) {   /* answered with close_notify, closed */
      len = 0;
      drain(s, &wire, &len, &cap);
      FUZZ_ASSERT(len > 0 && !nr_channel_is_open(nr_embedded_channel(s)));
    }
    free(wire);
  }
  FUZZ_ASSERT(sg.len == 0 || (plain && memcmp(sg.plain, plain, sg.len) == 0));
  nr_embedded_free(c);
  nr_embedded_free(s);
  free(cg.plain);
  free(sg.plain);
  ERR_clear_error();
  return 0;
}
