/*
 * tls.h -- TLS on OpenSSL 3 (Netty's SslHandler): a native handler that
 * encrypts a stream channel's bytes, and the shared configurations it is
 * made from.
 *
 * A configuration (nr_tls_config_t) is built once from nr_tls_opts_t and
 * shared by every loop: it is reference counted and holds the current
 * "bundle" -- the SSL_CTX (plus one per SNI name) -- behind a lock, so
 * that nr_tls_config_reload can swap certificates for new handshakes while
 * live connections keep the bundle they started with. Configurations may
 * be used from any thread; each handler state belongs to its channel's
 * loop, like every handler.
 *
 * The handler (nr_tls_handler, state from nr_tls_new) sits first in the
 * pipeline: inbound it takes bytes and fires plaintext; outbound it takes
 * bytes (nr_bytes_t, nr_slices_t) and writes ciphertext. Before the
 * handshake completes, channel_active is held back from the handlers
 * after it and writes are queued (flushed once it completes); then the
 * handlers see channel_active and the user event nr_tls_event_t. A failed
 * handshake or a bad record reaches exception_caught with OpenSSL's
 * reason and closes the channel. A close sends close_notify after
 * everything written before it.
 */
#ifndef NR_TLS_H
#define NR_TLS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "netrun.h"

/* The user events: after the handshake (NR_TLS_HANDSHAKE, every field
 * set), and when the peer's close_notify arrives (NR_TLS_CLOSE_NOTIFY,
 * just before the channel closes -- or, if it allows half-closure, as the
 * end of its input; Netty's SslCloseCompletionEvent).
 * Strings are borrowed: valid during the call; NULL when absent. */
#define NR_MSG_TLS_EVENT (NR_MSG_NATIVE + 9)   /* registered by handler.c */
enum { NR_TLS_HANDSHAKE, NR_TLS_CLOSE_NOTIFY };
typedef struct nr_tls_event_s {
  int type;                       /* NR_MSG_TLS_EVENT */
  int kind;                       /* NR_TLS_HANDSHAKE or _CLOSE_NOTIFY */
  const char *version;            /* "TLSv1.3" */
  const char *cipher;             /* "TLS_AES_256_GCM_SHA384" */
  const char *alpn;               /* the protocol agreed, or NULL */
  const char *server_name;        /* SNI: asked by the client / sent */
  const char *peer_subject;       /* the peer certificate's subject (RFC 2253) */
  const char *peer_issuer;
  const char *peer_error;         /* a certificate came, its names could not
                                     be read: subject and issuer are NULL */
  bool resumed;                   /* an abbreviated handshake (ticket) */
  bool server;
} nr_tls_event_t;

enum { NR_TLS_VERIFY_NONE, NR_TLS_VERIFY_OPTIONAL, NR_TLS_VERIFY_REQUIRED };

/* A certificate and its key: a PEM file path or PEM text for each. */
typedef struct nr_tls_cert_s {
  const char *name;               /* SNI name (only in nr_tls_opts_t.sni) */
  const char *cert, *cert_pem;
  const char *key, *key_pem;
} nr_tls_cert_t;

typedef struct nr_tls_opts_s {
  bool server;
  nr_tls_cert_t cert;             /* required for servers, optional for clients */
  nr_tls_cert_t *sni;             /* servers: extra certificates by name */
  int nsni;
  const char *ca;                 /* CA file; clients: NULL = system store */
  int verify;                     /* NR_TLS_VERIFY_*; clients: NONE or REQUIRED */
  const char *const *alpn;        /* protocols, in order of preference */
  int nalpn;
  bool session_tickets;           /* servers; default true */
  int tickets;                    /* TLS 1.3 tickets per handshake; 0 = 1 */
  int min_version;                /* TLS1_2_VERSION (default) or TLS1_3_VERSION */
  const char *server_name;        /* clients: SNI and the name verified */
  uint64_t handshake_timeout;     /* ns from channel_active; 0 = none */
  /* OpenSSL's syntax; NULL = the defaults below. Servers pick in their
   * own order (SSL_OP_CIPHER_SERVER_PREFERENCE). */
  const char *ciphersuites;       /* TLS 1.3 (SSL_CTX_set_ciphersuites) */
  const char *ciphers;            /* TLS 1.2 (SSL_CTX_set_cipher_list) */
  const char *groups;             /* key exchange (SSL_CTX_set1_groups_list) */
} nr_tls_opts_t;

/* AES-128-GCM first: as safe as AES-256 against anything practical and
 * cheaper per record, and its SHA-256 key schedule is cheaper per
 * handshake than AES-256's SHA-384. X25519 first: the cheapest key share,
 * and the one clients send first. */
#define NR_TLS_CIPHERSUITES \
  "TLS_AES_128_GCM_SHA256:TLS_AES_256_GCM_SHA384:TLS_CHACHA20_POLY1305_SHA256"
#define NR_TLS_CIPHERS                                                    \
  "ECDHE-ECDSA-AES128-GCM-SHA256:ECDHE-RSA-AES128-GCM-SHA256:"            \
  "ECDHE-ECDSA-AES256-GCM-SHA384:ECDHE-RSA-AES256-GCM-SHA384:"            \
  "ECDHE-ECDSA-CHACHA20-POLY1305:ECDHE-RSA-CHACHA20-POLY1305"
#define NR_TLS_GROUPS "X25519:P-256:X448:P-384:P-521"

typedef struct nr_tls_config_s nr_tls_config_t;

/* Build a configuration (the options are copied). NULL on failure, with a
 * message in err naming the file and OpenSSL's reason. Any thread. */
nr_tls_config_t *nr_tls_config_new(const nr_tls_opts_t *o, char *err,
                                   size_t errlen);
nr_tls_config_t *nr_tls_config_retain(nr_tls_config_t *c);
void nr_tls_config_release(nr_tls_config_t *c);
bool nr_tls_config_is_server(const nr_tls_config_t *c);
/* Rebuild the contexts -- from `o` (then kept for the next reload), or
 * from the options already held (re-reading their files) when o is NULL
 * -- and use them for every new handshake. Live connections keep theirs.
 * 0, or -EINVAL with a message in err (the old contexts stay). Any thread. */
int nr_tls_config_reload(nr_tls_config_t *c, const nr_tls_opts_t *o,
                         char *err, size_t errlen);
/* How many times the contexts were built (1 + successful reloads). */
unsigned nr_tls_config_generation(const nr_tls_config_t *c);

/* The identity of what the current contexts were built from: every
 * option, and for each file named its device, inode, size and
 * modification time -- 32 hex digits of a SHA-256 of them. Two configs
 * made from the same options and the same files have the same identity;
 * any other setting (verification, CA, certificate, server_name, ALPN,
 * versions, ciphers), or a file changed since, gives another. A
 * connection pool keys its connections by it (lhttp_pool.c): a request
 * never takes a connection made under other settings. Into out (NUL
 * terminated). Any thread. */
#define NR_TLS_ID_LEN 32
void nr_tls_config_identity(nr_tls_config_t *c, char out[NR_TLS_ID_LEN + 1]);

extern const nr_handler_t nr_tls_handler;

/* A handler state for a channel (its SSL takes the config's current
 * contexts). NULL on out of memory. */
void *nr_tls_new(nr_tls_config_t *c);
/* Clients: the host connected to, checked against the certificate (a DNS
 * name or an IP address) and sent as SNI unless the config names a
 * server_name. Before the handshake starts; 0 or -EINVAL. */
int nr_tls_set_host(void *state, const char *host);
/* A future of the handshake: success once it completed, failure when it
 * failed or the channel closed first. A new reference. Loop thread. */
nr_promise_t *nr_tls_handshake_future(nr_ctx_t *ctx);

/* While on, OpenSSL's randomness is nr_random_bytes (a simulation's
 * seeded generator on its thread): runtime/sim/ turns it on while a world
 * is entered (rand.c). Any thread. */
void nr_tls_simulated_random(bool on);

#endif /* NR_TLS_H */
