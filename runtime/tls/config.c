/*
 * config.c -- TLS configurations (tls.h): SSL_CTX built once per config
 * and shared by every loop.
 *
 * A config owns a copy of its options (for reloads) and its current
 * bundle: the main SSL_CTX, one per SNI name, and what their callbacks
 * read (the ALPN list, the SNI table). An SSL_CTX is safe to share for
 * SSL_new once configured, so a bundle is immutable after it is built;
 * a handler retains the bundle its SSL came from, so a reload (which
 * swaps the config's pointer under `lock`) never frees contexts that a
 * live connection -- or its SNI callback -- still reads.
 *
 * Each bundle also carries the identity of what it was built from
 * (nr_tls_config_identity): a digest of the options and of the files'
 * stat, made as it is built, read under `lock` like the bundle pointer.
 *
 * Errors: every failure says what it was loading and OpenSSL's reason
 * (ERR_error_string_n of the earliest error queued), then clears the
 * thread's error queue so the next call starts clean.
 */
#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include <sys/stat.h>

#include <openssl/err.h>
#include <openssl/evp.h>
#include <openssl/pem.h>
#include <openssl/ssl.h>

#include "tls/tls_internal.h"

struct nr_tls_config_s {
  _Atomic int refs;
  bool server;
  pthread_mutex_t lock;           /* guards cur (held for a pointer swap) */
  pthread_mutex_t reload_lock;    /* one reload at a time; guards opts */
  nr_tls_bundle_t *cur;
  _Atomic unsigned generation;
  nr_tls_opts_t opts;             /* a deep copy: strings owned */
};

/* ---- errors ------------------------------------------------------------------ */

/* "<what>: <OpenSSL's reason>" into err; the queue is emptied. */
static int ssl_fail(char *err, size_t n, const char *what) {
  char reason[256] = "unknown error";
  unsigned long e = ERR_peek_error();
  if (e != 0)
    ERR_error_string_n(e, reason, sizeof reason);
  snprintf(err, n, "%s: %s", what, reason);
  ERR_clear_error();
  return -EINVAL;
}

/* ---- copying options ---------------------------------------------------------- */

static char *dup(const char *s, bool *ok) {
  if (s == NULL)
    return NULL;
  char *d = strdup(s);
  if (d == NULL)
    *ok = false;
  return d;
}

static void cert_copy(nr_tls_cert_t *d, const nr_tls_cert_t *s, bool *ok) {
  d->name = dup(s->name, ok);
  d->cert = dup(s->cert, ok);
  d->cert_pem = dup(s->cert_pem, ok);
  d->key = dup(s->key, ok);
  d->key_pem = dup(s->key_pem, ok);
}

static void cert_free(nr_tls_cert_t *c) {
  free((char *)c->name);
  free((char *)c->cert);
  free((char *)c->cert_pem);
  free((char *)c->key);
  free((char *)c->key_pem);
}

static void opts_free(nr_tls_opts_t *o) {
  cert_free(&o->cert);
  for (int i = 0; i < o->nsni; i++)
    cert_free(&o->sni[i]);
  free(o->sni);
  for (int i = 0; i < o->nalpn; i++)
    free((char *)o->alpn[i]);
  free((void *)o->alpn);
  free((char *)o->ca);
  free((char *)o->server_name);
  free((char *)o->ciphersuites);
  free((char *)o->ciphers);
  free((char *)o->groups);
  memset(o, 0, sizeof *o);
}

static int opts_copy(nr_tls_opts_t *d, const nr_tls_opts_t *s) {
  bool ok = true;
  *d = *s;
  d->sni = NULL;
  d->alpn = NULL;
  d->nsni = d->nalpn = 0;
  cert_copy(&d->cert, &s->cert, &ok);
  d->ca = dup(s->ca, &ok);
  d->server_name = dup(s->server_name, &ok);
  d->ciphersuites = dup(s->ciphersuites, &ok);
  d->ciphers = dup(s->ciphers, &ok);
  d->groups = dup(s->groups, &ok);
  if (s->nsni > 0 && (d->sni = calloc((size_t)s->nsni, sizeof *d->sni)))
    for (; d->nsni < s->nsni; d->nsni++)
      cert_copy(&d->sni[d->nsni], &s->sni[d->nsni], &ok);
  char **alpn = s->nalpn > 0 ? calloc((size_t)s->nalpn, sizeof *alpn) : NULL;
  if (alpn)
    for (d->alpn = (const char *const *)alpn; d->nalpn < s->nalpn; d->nalpn++)
      alpn[d->nalpn] = dup(s->alpn[d->nalpn], &ok);
  if (!ok || (s->nsni > 0 && d->sni == NULL) || (s->nalpn > 0 && !alpn)) {
    opts_free(d);
    return -ENOMEM;
  }
  return 0;
}

/* ---- building a context -------------------------------------------------------- */

static int use_cert(SSL_CTX *ctx, const nr_tls_cert_t *c, char *err,
                    size_t n) {
  char what[512];
  if (c->cert) {
    if (SSL_CTX_use_certificate_chain_file(ctx, c->cert) != 1) {
      snprintf(what, sizeof what, "cert '%s'", c->cert);
      return ssl_fail(err, n, what);
    }
  } else {
    BIO *b = BIO_new_mem_buf(c->cert_pem, -1);
    X509 *x = b ? PEM_read_bio_X509(b, NULL, NULL, NULL) : NULL;
    int ok = x != NULL && SSL_CTX_use_certificate(ctx, x) == 1;
    X509_free(x);
    for (X509 *extra; ok && (extra = PEM_read_bio_X509(b, NULL, NULL, NULL));)
      if (SSL_CTX_add0_chain_cert(ctx, extra) != 1) {
        X509_free(extra);
        ok = 0;
      }
    ERR_clear_error();                /* the end of the chain is an "error" */
    BIO_free(b);
    if (!ok) {
      snprintf(err, n, "cert_pem: no PEM certificate could be read");
      return -EINVAL;
    }
  }
  if (c->key) {
    if (SSL_CTX_use_PrivateKey_file(ctx, c->key, SSL_FILETYPE_PEM) != 1) {
      snprintf(what, sizeof what, "key '%s'", c->key);
      return ssl_fail(err, n, what);
    }
  } else if (c->key_pem) {
    BIO *b = BIO_new_mem_buf(c->key_pem, -1);
    EVP_PKEY *k = b ? PEM_read_bio_PrivateKey(b, NULL, NULL, NULL) : NULL;
    int ok = k != NULL && SSL_CTX_use_PrivateKey(ctx, k) == 1;
    EVP_PKEY_free(k);
    BIO_free(b);
    if (!ok)
      return ssl_fail(err, n, "key_pem");
  } else {
    snprintf(err, n, "a certificate needs its key (key or key_pem)");
    return -EINVAL;
  }
  if (SSL_CTX_check_private_key(ctx) != 1) {
    snprintf(what, sizeof what, "key '%s' does not match cert '%s'",
             c->key ? c->key : "key_pem", c->cert ? c->cert : "cert_pem");
    return ssl_fail(err, n, what);
  }
  return 0;
}

/* Ciphers and key-exchange groups, ours or the caller's. */
static int set_algorithms(SSL_CTX *ctx, const nr_tls_opts_t *o, char *err,
                          size_t n) {
  char what[512];
  const char *v = o->ciphersuites ? o->ciphersuites : NR_TLS_CIPHERSUITES;
  if (SSL_CTX_set_ciphersuites(ctx, v) != 1) {
    snprintf(what, sizeof what, "ciphersuites '%s'", v);
    return ssl_fail(err, n, what);
  }
  v = o->ciphers ? o->ciphers : NR_TLS_CIPHERS;
  if (SSL_CTX_set_cipher_list(ctx, v) != 1) {
    snprintf(what, sizeof what, "ciphers '%s'", v);
    return ssl_fail(err, n, what);
  }
  v = o->groups ? o->groups : NR_TLS_GROUPS;
  if (SSL_CTX_set1_groups_list(ctx, v) != 1) {
    snprintf(what, sizeof what, "groups '%s'", v);
    return ssl_fail(err, n, what);
  }
  return 0;
}

/* b's protocols without "h2" (wire format) into w; its length. */
static unsigned without_h2(const nr_tls_bundle_t *b, unsigned char *w) {
  unsigned n = 0;
  for (unsigned i = 0; i < b->alpn_len; i += 1u + b->alpn[i])
    if (!(b->alpn[i] == 2 && memcmp(b->alpn + i + 1, "h2", 2) == 0)) {
      memcpy(w + n, b->alpn + i, 1u + b->alpn[i]);
      n += 1u + b->alpn[i];
    }
  return n;
}

/* Servers: the first of the server's protocols the client also offers --
 * "h2" only where an HTTP/2 codec follows (a client that agreed it and
 * found HTTP/1.1 would see its preface dropped). */
static int alpn_select(SSL *ssl, const unsigned char **out,
                       unsigned char *outlen, const unsigned char *in,
                       unsigned inlen, void *arg) {
  nr_tls_bundle_t *b = arg;
  unsigned char *o = NULL;
  if (SSL_select_next_proto(&o, outlen, b->alpn, b->alpn_len, in, inlen) !=
      OPENSSL_NPN_NEGOTIATED)
    return SSL_TLSEXT_ERR_NOACK;      /* no common protocol: go on without */
  if (*outlen == 2 && memcmp(o, "h2", 2) == 0 && !nr__tls_h2_follows(ssl)) {
    unsigned char rest[sizeof b->alpn];
    unsigned n = without_h2(b, rest);
    if (n == 0 || SSL_select_next_proto(&o, outlen, rest, n, in, inlen) !=
                      OPENSSL_NPN_NEGOTIATED)
      return SSL_TLSEXT_ERR_NOACK;
    /* o may point into `rest`, which goes: the same bytes in b's list */
    for (unsigned i = 0; i < b->alpn_len; i += 1u + b->alpn[i])
      if (b->alpn[i] == *outlen && memcmp(b->alpn + i + 1, o, *outlen) == 0) {
        o = b->alpn + i + 1;
        break;
      }
  }
  *out = o;
  return SSL_TLSEXT_ERR_OK;
}

/* Servers: switch to the certificate of the name the client asked for. */
static int servername(SSL *ssl, int *alert, void *arg) {
  (void)alert;
  nr_tls_bundle_t *b = arg;
  const char *name = SSL_get_servername(ssl, TLSEXT_NAMETYPE_host_name);
  for (int i = 0; name && i < b->nsni; i++)
    if (strcasecmp(name, b->sni[i].name) == 0) {
      SSL_set_SSL_CTX(ssl, b->sni[i].ctx);
      break;
    }
  return SSL_TLSEXT_ERR_OK;
}

/* One SSL_CTX with the settings every context of the bundle shares (an SNI
 * switch keeps the first context's callbacks for some steps and takes the
 * new one's for others, so all are configured alike). */
static SSL_CTX *ctx_new(const nr_tls_opts_t *o, nr_tls_bundle_t *b,
                        const nr_tls_cert_t *cert, char *err, size_t n) {
  SSL_CTX *ctx = SSL_CTX_new(o->server ? TLS_server_method()
                                       : TLS_client_method());
  if (ctx == NULL) {
    ssl_fail(err, n, "SSL_CTX_new");
    return NULL;
  }
  SSL_CTX_set_min_proto_version(ctx, o->min_version ? o->min_version
                                                    : TLS1_2_VERSION);
  SSL_CTX_set_mode(ctx, SSL_MODE_RELEASE_BUFFERS);   /* idle: no buffers */
  if (o->server && !o->session_tickets)
    SSL_CTX_set_options(ctx, SSL_OP_NO_TICKET);
  if (o->server) {
    static const unsigned char sid[] = "netrun";
    SSL_CTX_set_session_id_context(ctx, sid, sizeof sid - 1);
    SSL_CTX_set_options(ctx, SSL_OP_CIPHER_SERVER_PREFERENCE);
    /* TLS 1.3 tickets sent per handshake: OpenSSL's 2 cost 6% of a full
     * handshake more than 1, and one ticket serves a client's parallel
     * connections as well (it may be used again). */
    SSL_CTX_set_num_tickets(ctx, o->tickets > 0 ? (size_t)o->tickets : 1);
  }
  int rc = set_algorithms(ctx, o, err, n);
  if (rc == 0 && (cert->cert || cert->cert_pem))
    rc = use_cert(ctx, cert, err, n);
  if (rc == 0 && o->ca) {
    if (SSL_CTX_load_verify_locations(ctx, o->ca, NULL) != 1) {
      char what[512];
      snprintf(what, sizeof what, "ca '%s'", o->ca);
      rc = ssl_fail(err, n, what);
    } else if (o->server) {
      SSL_CTX_set_client_CA_list(ctx, SSL_load_client_CA_file(o->ca));
      ERR_clear_error();
    }
  } else if (rc == 0 && !o->server && o->verify != NR_TLS_VERIFY_NONE &&
             SSL_CTX_set_default_verify_paths(ctx) != 1) {
    rc = ssl_fail(err, n, "the system CA store");
  }
  if (rc < 0) {
    SSL_CTX_free(ctx);
    return NULL;
  }
  int mode = o->verify == NR_TLS_VERIFY_NONE ? SSL_VERIFY_NONE
             : o->verify == NR_TLS_VERIFY_OPTIONAL
                 ? SSL_VERIFY_PEER
                 : SSL_VERIFY_PEER | SSL_VERIFY_FAIL_IF_NO_PEER_CERT;
  SSL_CTX_set_verify(ctx, mode, NULL);
  if (b->alpn_len > 0 && o->server)
    SSL_CTX_set_alpn_select_cb(ctx, alpn_select, b);
  else if (b->alpn_len > 0)
    SSL_CTX_set_alpn_protos(ctx, b->alpn, b->alpn_len);
  if (o->server && b->nsni > 0) {
    SSL_CTX_set_tlsext_servername_callback(ctx, servername);
    SSL_CTX_set_tlsext_servername_arg(ctx, b);
  }
  return ctx;
}

/* ---- identity ------------------------------------------------------------------- */

/* A field into the digest: its tag, length and bytes (NULL: absent), so
 * that no two option sets encode alike. */
static void id_str(EVP_MD_CTX *md, char tag, const char *v) {
  uint64_t n = v ? strlen(v) : UINT64_MAX;
  EVP_DigestUpdate(md, &tag, 1);
  EVP_DigestUpdate(md, &n, sizeof n);
  if (v)
    EVP_DigestUpdate(md, v, strlen(v));
}

static void id_int(EVP_MD_CTX *md, char tag, int64_t v) {
  EVP_DigestUpdate(md, &tag, 1);
  EVP_DigestUpdate(md, &v, sizeof v);
}

/* A file option: its path and what stat says of the file now (a file
 * replaced or rewritten since gives another identity). */
static void id_file(EVP_MD_CTX *md, char tag, const char *path) {
  id_str(md, tag, path);
  struct stat st;
  if (path == NULL || stat(path, &st) != 0)
    memset(&st, 0, sizeof st);
  int64_t v[5] = {(int64_t)st.st_dev, (int64_t)st.st_ino, (int64_t)st.st_size,
                  (int64_t)st.st_mtim.tv_sec, (int64_t)st.st_mtim.tv_nsec};
  EVP_DigestUpdate(md, v, sizeof v);
}

static void id_cert(EVP_MD_CTX *md, const nr_tls_cert_t *c) {
  id_str(md, 'n', c->name);
  id_file(md, 'c', c->cert);
  id_str(md, 'C', c->cert_pem);
  id_file(md, 'k', c->key);
  id_str(md, 'K', c->key_pem);
}

/* nr_tls_config_identity's digest of o, into b->id. Files are looked at
 * before they are read (bundle_new): one changed in between makes an
 * identity no other build shares, never a shared one. */
static int identity(nr_tls_bundle_t *b, const nr_tls_opts_t *o, char *err,
                    size_t n) {
  EVP_MD_CTX *md = EVP_MD_CTX_new();
  unsigned char d[EVP_MAX_MD_SIZE];
  unsigned dn = 0;
  if (md == NULL || EVP_DigestInit_ex(md, EVP_sha256(), NULL) != 1) {
    EVP_MD_CTX_free(md);
    return ssl_fail(err, n, "SHA-256");
  }
  id_int(md, 's', o->server);
  id_int(md, 'v', o->verify);
  id_int(md, 'm', o->min_version);
  id_int(md, 't', o->session_tickets ? 1 + o->tickets : 0);
  id_int(md, 'h', (int64_t)o->handshake_timeout);
  id_str(md, 'S', o->server_name);
  id_file(md, 'a', o->ca);
  id_str(md, '3', o->ciphersuites);
  id_str(md, '2', o->ciphers);
  id_str(md, 'g', o->groups);
  id_int(md, 'A', o->nalpn);
  for (int i = 0; i < o->nalpn; i++)
    id_str(md, 'p', o->alpn[i]);
  id_cert(md, &o->cert);
  id_int(md, 'N', o->nsni);
  for (int i = 0; i < o->nsni; i++)
    id_cert(md, &o->sni[i]);
  EVP_DigestFinal_ex(md, d, &dn);
  EVP_MD_CTX_free(md);
  for (int i = 0; i < NR_TLS_ID_LEN / 2; i++)
    snprintf(b->id + 2 * i, 3, "%02x", d[i]);
  return 0;
}

/* ---- bundles -------------------------------------------------------------------- */

void nr_tls_bundle_release(nr_tls_bundle_t *b) {
  if (b == NULL || atomic_fetch_sub(&b->refs, 1) != 1)
    return;
  SSL_CTX_free(b->ctx);
  free(b->server_name);
  for (int i = 0; i < b->nsni; i++) {
    SSL_CTX_free(b->sni[i].ctx);
    free(b->sni[i].name);
  }
  free(b);
}

/* The ALPN wire format: each protocol prefixed by its length. */
static int alpn_wire(nr_tls_bundle_t *b, const nr_tls_opts_t *o, char *err,
                     size_t n) {
  for (int i = 0; i < o->nalpn; i++) {
    size_t len = strlen(o->alpn[i]);
    if (len == 0 || len > 255 || b->alpn_len + 1 + len > sizeof b->alpn) {
      snprintf(err, n, "alpn: '%s' is empty, too long or one too many",
               o->alpn[i]);
      return -EINVAL;
    }
    b->alpn[b->alpn_len++] = (unsigned char)len;
    memcpy(b->alpn + b->alpn_len, o->alpn[i], len);
    b->alpn_len += (unsigned)len;
  }
  return 0;
}

static nr_tls_bundle_t *bundle_new(const nr_tls_opts_t *o, char *err,
                                   size_t n) {
  nr_tls_bundle_t *b = calloc(1, sizeof *b + (size_t)o->nsni * sizeof b->sni[0]);
  if (b == NULL) {
    snprintf(err, n, "out of memory");
    return NULL;
  }
  atomic_init(&b->refs, 1);
  b->server = o->server;
  b->handshake_timeout = o->handshake_timeout;
  if (identity(b, o, err, n) < 0 || alpn_wire(b, o, err, n) < 0) {
    nr_tls_bundle_release(b);
    return NULL;
  }
  if (o->server_name && !(b->server_name = strdup(o->server_name))) {
    snprintf(err, n, "out of memory");
    nr_tls_bundle_release(b);
    return NULL;
  }
  /* SNI contexts first: the main one's callback reads the table. */
  for (int i = 0; i < o->nsni; i++, b->nsni++) {
    char sub[1024];
    b->sni[i].name = strdup(o->sni[i].name);
    b->sni[i].ctx = b->sni[i].name ? ctx_new(o, b, &o->sni[i], sub, sizeof sub)
                                   : NULL;
    if (b->sni[i].ctx == NULL) {
      snprintf(err, n, "sni '%s': %s", o->sni[i].name,
               b->sni[i].name ? sub : "out of memory");
      free(b->sni[i].name);
      nr_tls_bundle_release(b);
      return NULL;
    }
  }
  if ((b->ctx = ctx_new(o, b, &o->cert, err, n)) == NULL) {
    nr_tls_bundle_release(b);
    return NULL;
  }
  return b;
}

/* ---- configs -------------------------------------------------------------------- */

static int check_opts(const nr_tls_opts_t *o, char *err, size_t n) {
  if (o->server && !o->cert.cert && !o->cert.cert_pem) {
    snprintf(err, n, "a server needs a certificate (cert or cert_pem)");
    return -EINVAL;
  }
  return 0;
}

nr_tls_config_t *nr_tls_config_new(const nr_tls_opts_t *o, char *err,
                                   size_t n) {
  if (check_opts(o, err, n) < 0)
    return NULL;
  nr_tls_config_t *c = calloc(1, sizeof *c);
  if (c == NULL || opts_copy(&c->opts, o) < 0) {
    free(c);
    snprintf(err, n, "out of memory");
    return NULL;
  }
  if ((c->cur = bundle_new(&c->opts, err, n)) == NULL) {
    opts_free(&c->opts);
    free(c);
    return NULL;
  }
  atomic_init(&c->refs, 1);
  atomic_init(&c->generation, 1);
  c->server = o->server;
  pthread_mutex_init(&c->lock, NULL);
  pthread_mutex_init(&c->reload_lock, NULL);
  return c;
}

nr_tls_config_t *nr_tls_config_retain(nr_tls_config_t *c) {
  atomic_fetch_add(&c->refs, 1);
  return c;
}

void nr_tls_config_release(nr_tls_config_t *c) {
  if (c == NULL || atomic_fetch_sub(&c->refs, 1) != 1)
    return;
  nr_tls_bundle_release(c->cur);
  opts_free(&c->opts);
  pthread_mutex_destroy(&c->lock);
  pthread_mutex_destroy(&c->reload_lock);
  free(c);
}

bool nr_tls_config_is_server(const nr_tls_config_t *c) { return c->server; }

unsigned nr_tls_config_generation(const nr_tls_config_t *c) {
  return atomic_load(&c->generation);
}

void nr_tls_config_identity(nr_tls_config_t *c, char out[NR_TLS_ID_LEN + 1]) {
  pthread_mutex_lock(&c->lock);
  memcpy(out, c->cur->id, NR_TLS_ID_LEN + 1);
  pthread_mutex_unlock(&c->lock);
}

nr_tls_bundle_t *nr__tls_config_bundle(nr_tls_config_t *c) {
  pthread_mutex_lock(&c->lock);
  nr_tls_bundle_t *b = c->cur;
  atomic_fetch_add(&b->refs, 1);
  pthread_mutex_unlock(&c->lock);
  return b;
}

int nr_tls_config_reload(nr_tls_config_t *c, const nr_tls_opts_t *o,
                         char *err, size_t n) {
  nr_tls_opts_t fresh = {0};
  if (o != NULL) {
    if (o->server != c->server) {
      snprintf(err, n, "a %s config cannot become a %s one",
               c->server ? "server" : "client", o->server ? "server" : "client");
      return -EINVAL;
    }
    if (check_opts(o, err, n) < 0)
      return -EINVAL;
    if (opts_copy(&fresh, o) < 0) {
      snprintf(err, n, "out of memory");
      return -ENOMEM;
    }
  }
  /* Files are read outside `lock`: handshakes starting on other loops
   * meanwhile take the old contexts without waiting. */
  pthread_mutex_lock(&c->reload_lock);
  nr_tls_bundle_t *b = bundle_new(o ? &fresh : &c->opts, err, n);
  nr_tls_bundle_t *old = NULL;
  if (b != NULL) {
    pthread_mutex_lock(&c->lock);
    old = c->cur;
    c->cur = b;
    pthread_mutex_unlock(&c->lock);
    if (o != NULL) {
      opts_free(&c->opts);
      c->opts = fresh;
    }
    atomic_fetch_add(&c->generation, 1);
  } else if (o != NULL) {
    opts_free(&fresh);
  }
  pthread_mutex_unlock(&c->reload_lock);
  nr_tls_bundle_release(old);
  return b ? 0 : -EINVAL;
}
