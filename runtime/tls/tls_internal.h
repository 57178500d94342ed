/*
 * tls_internal.h -- what the TLS handler (handler.c) and configurations
 * (config.c) share. Not for other files.
 */
#ifndef NR_TLS_INTERNAL_H
#define NR_TLS_INTERNAL_H

#include <stdatomic.h>

#include <openssl/ssl.h>

#include "tls/tls.h"

/* The contexts of one build of a config: immutable once built, reference
 * counted (the config holds one, each SSL made from it another). */
typedef struct nr_tls_bundle_s {
  _Atomic int refs;
  SSL_CTX *ctx;
  unsigned char alpn[256];        /* wire format, read by the callbacks */
  unsigned alpn_len;
  bool server;
  char *server_name;              /* clients: SNI and the name verified */
  uint64_t handshake_timeout;     /* ns; 0 = none */
  char id[NR_TLS_ID_LEN + 1];     /* what it was built from (config.c) */
  int nsni;
  struct { char *name; SSL_CTX *ctx; } sni[];
} nr_tls_bundle_t;

/* The current bundle, retained for the caller. Any thread. */
nr_tls_bundle_t *nr__tls_config_bundle(nr_tls_config_t *c);
void nr_tls_bundle_release(nr_tls_bundle_t *b);

/* Servers choosing ALPN: whether a handler after the TLS handler of ssl
 * speaks HTTP/2 (an HTTP server codec with h2 on), so that "h2" may be
 * agreed. Loop thread, during the handshake. */
bool nr__tls_h2_follows(SSL *ssl);

#endif /* NR_TLS_INTERNAL_H */
