/*
 * test_tls.c -- the TLS handler against an OpenSSL client that does what
 * no stock client offers: TLS 1.3 KeyUpdate messages, sent as fast as the
 * wire takes them (a flood) or now and then (a peer rotating its keys).
 *
 * The server is a C echo behind nr_tls_handler on one loop; the client is
 * a blocking OpenSSL connection on the test thread. What the server
 * spends is the process's CPU time less the test thread's own.
 */
#include <arpa/inet.h>
#include <libgen.h>
#include <netinet/in.h>
#include <pthread.h>
#include <sys/resource.h>
#include <time.h>

#include <openssl/err.h>
#include <openssl/ssl.h>

#include "test.h"
#include "tls/tls.h"

/* ---- the server --------------------------------------------------------------- */

static char certs[64];

/* Fresh certificates (spec/fixtures/tls/make_certs.sh, beside this file). */
static void make_certs(void) {
  char src[512], cmd[1024];
  snprintf(src, sizeof src, "%s", __FILE__);   /* .../spec/c/test_tls.c */
  snprintf(certs, sizeof certs, "/tmp/netrun-test-tls.XXXXXX");
  CHECK(mkdtemp(certs) != NULL);
  snprintf(cmd, sizeof cmd, "bash %s/../fixtures/tls/make_certs.sh %s",
           dirname(src), certs);
  CHECK_EQ(system(cmd), 0);
}

static void remove_certs(void) {
  char cmd[128];
  snprintf(cmd, sizeof cmd, "rm -rf %s", certs);
  CHECK_EQ(system(cmd), 0);
}

static nr_tls_config_t *server_config(void) {
  char crt[128], key[128], err[256];
  snprintf(crt, sizeof crt, "%s/server.crt", certs);
  snprintf(key, sizeof key, "%s/server.key", certs);
  nr_tls_opts_t o = {.server = true, .cert = {.cert = crt, .key = key},
                     .session_tickets = true};
  nr_tls_config_t *c = nr_tls_config_new(&o, err, sizeof err);
  if (c == NULL)
    FAIL("tls config: %s", err);
  return c;
}

static int echo_read(nr_ctx_t *ctx, void *msg) { return nr_ctx_write(ctx, msg, NULL); }
static int echo_flush(nr_ctx_t *ctx) { return nr_ctx_flush(ctx); }
static _Atomic int exceptions;
static char last_error[256];
static int echo_exception(nr_ctx_t *ctx, const nr_err_t *err) {
  (void)ctx;
  snprintf(last_error, sizeof last_error, "%s", err->msg);
  atomic_fetch_add(&exceptions, 1);
  return 0;
}
static const nr_handler_t echo = {.type = "echo", .channel_read = echo_read,
                                  .channel_read_complete = echo_flush,
                                  .exception = echo_exception};

static void tls_echo_init(nr_channel_t *ch, void *arg) {
  nr_pipeline_t *p = nr_channel_pipeline(ch);
  CHECK_EQ(nr_pipeline_add_last(p, "tls", &nr_tls_handler, nr_tls_new(arg)), 0);
  CHECK_EQ(nr_pipeline_add_last(p, "echo", &echo, NULL), 0);
}

typedef struct server_s {
  nr_group_t *g;
  nr_channel_t *listener;
  nr_tls_config_t *config;
  int port;
} server_t;

static server_t start_server(void) {
  make_certs();
  server_t s = {.config = server_config()};
  s.g = nr_group_new(&(nr_group_opts_t){.name = "tls", .threads = 1});
  nr_promise_t *f = nr_server_bind(&(nr_server_opts_t){
      .group = s.g, .host = "127.0.0.1", .child_init = tls_echo_init,
      .arg = s.config});
  AWAIT_OK(f);
  s.listener = nr_channel_retain(nr_promise_value(f));
  nr_promise_release(f);
  char host[64];
  CHECK_EQ(nr_channel_local_address(s.listener, host, sizeof host, &s.port), 0);
  return s;
}

static void stop_server(server_t *s) {
  nr_promise_t *p = nr_promise_new();
  CHECK_EQ(nr_channel_close(s->listener, p), 0);
  AWAIT_OK(p);
  nr_promise_release(p);
  nr_channel_release(s->listener);
  SHUTDOWN_GROUP(s->g);
  nr_tls_config_release(s->config);
  remove_certs();
}

/* ---- the client --------------------------------------------------------------- */

static SSL_CTX *client_ctx;

static SSL *dial_tls(int port) {
  if (client_ctx == NULL) {
    client_ctx = SSL_CTX_new(TLS_client_method());
    SSL_CTX_set_min_proto_version(client_ctx, TLS1_3_VERSION);
  }
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  CHECK_GE(fd, 0);
  struct sockaddr_in sa = {.sin_family = AF_INET,
                           .sin_port = htons((uint16_t)port)};
  sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  CHECK_EQ(connect(fd, (struct sockaddr *)&sa, sizeof sa), 0);
  struct timeval tv = {10, 0};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
  SSL *ssl = SSL_new(client_ctx);
  SSL_set_fd(ssl, fd);
  if (SSL_connect(ssl) != 1)
    FAIL("handshake failed: %s", ERR_error_string(ERR_get_error(), NULL));
  CHECK_STR(SSL_get_version(ssl), "TLSv1.3");
  return ssl;
}

static void hangup(SSL *ssl) {
  int fd = SSL_get_fd(ssl);
  SSL_free(ssl);
  close(fd);
}

/* The byte the echo sends back; -1 once the server closed or failed. */
static int echo_byte(SSL *ssl, char c) {
  char back;
  if (SSL_write(ssl, &c, 1) != 1)
    return -1;
  return SSL_read(ssl, &back, 1) == 1 ? back : -1;
}

/* KeyUpdate(update_requested) then one byte of data, n times, without
 * reading (OpenSSL's own limit counts key updates with no data between
 * them); how many were sent before a write failed. */
static int flood(SSL *ssl, int n) {
  for (int i = 0; i < n; i++) {
    if (SSL_key_update(ssl, SSL_KEY_UPDATE_REQUESTED) != 1 ||
        SSL_write(ssl, "x", 1) != 1) {
      ERR_clear_error();
      return i;
    }
  }
  return n;
}

static double cpu_s(clockid_t id) {
  struct timespec ts;
  clock_gettime(id, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

/* The server's CPU time so far: the process's less this thread's. */
static double server_cpu(void) {
  return cpu_s(CLOCK_PROCESS_CPUTIME_ID) - cpu_s(CLOCK_THREAD_CPUTIME_ID);
}

/* ---- tests -------------------------------------------------------------------- */

/* Before the limit, 20,000 updates cost the server ~1 CPU-s (2 cores
 * shared, ASan off) and every byte was echoed; now it stops after
 * KU_BURST and what the rate earns meanwhile. */
TEST_T(a_key_update_flood_fails_the_connection, 120) {
  server_t s = start_server();
  SSL *ssl = dial_tls(s.port);
  CHECK_EQ(echo_byte(ssl, 'a'), 'a');
  double before = server_cpu();
  int sent = flood(ssl, 20000);
  char buf[4096];
  int got = 0, r;
  while (got < sent && (r = SSL_read(ssl, buf, sizeof buf)) > 0)
    got += r;
  double spent = server_cpu() - before;
  fprintf(stderr, "  %d key updates sent, %d echoed, server CPU %.3f s\n",
          sent, got, spent);
  CHECK_LT(got, 1000);             /* 32 at once, 10 a second after */
  CHECK_EQ(atomic_load(&exceptions), 1);
  CHECK_CONTAINS(last_error, "updated its keys too often");
  hangup(ssl);
  stop_server(&s);
}

/* A peer rotating its keys now and then (even 32 at once) is served. */
TEST_T(key_updates_now_and_then_are_served, 60) {
  server_t s = start_server();
  SSL *ssl = dial_tls(s.port);
  for (int i = 0; i < 32; i++) {
    CHECK_EQ(SSL_key_update(ssl, i % 2 ? SSL_KEY_UPDATE_REQUESTED
                                       : SSL_KEY_UPDATE_NOT_REQUESTED), 1);
    CHECK_EQ(echo_byte(ssl, (char)('a' + i % 26)), 'a' + i % 26);
  }
  for (int i = 0; i < 8; i++) {    /* then one every 150 ms: below the rate */
    usleep(150 * 1000);
    CHECK_EQ(SSL_key_update(ssl, SSL_KEY_UPDATE_REQUESTED), 1);
    CHECK_EQ(echo_byte(ssl, 'z'), 'z');
  }
  CHECK_EQ(atomic_load(&exceptions), 0);
  hangup(ssl);
  stop_server(&s);
}

/* ---- a server that floods a netrun client ------------------------------------ */

typedef struct flooder_s {
  int lfd;
  int sent;
  pthread_t thread;
} flooder_t;

static void *flood_client(void *arg) {
  flooder_t *f = arg;
  char crt[128], key[128];
  snprintf(crt, sizeof crt, "%s/server.crt", certs);
  snprintf(key, sizeof key, "%s/server.key", certs);
  SSL_CTX *ctx = SSL_CTX_new(TLS_server_method());
  SSL_CTX_set_min_proto_version(ctx, TLS1_3_VERSION);
  CHECK_EQ(SSL_CTX_use_certificate_file(ctx, crt, SSL_FILETYPE_PEM), 1);
  CHECK_EQ(SSL_CTX_use_PrivateKey_file(ctx, key, SSL_FILETYPE_PEM), 1);
  int fd = accept(f->lfd, NULL, NULL);
  CHECK_GE(fd, 0);
  struct timeval tv = {10, 0};
  setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
  SSL *ssl = SSL_new(ctx);
  SSL_set_fd(ssl, fd);
  CHECK_EQ(SSL_accept(ssl), 1);
  f->sent = flood(ssl, 20000);
  SSL_free(ssl);
  close(fd);
  SSL_CTX_free(ctx);
  return NULL;
}

static _Atomic int client_bytes;
static nr_promise_t *client_failed;
static int count_bytes(nr_ctx_t *ctx, void *msg) {
  (void)ctx;
  if (nr_msg_type(msg) == NR_MSG_BYTES)
    atomic_fetch_add(&client_bytes, (int)((nr_bytes_t *)msg)->len);
  return 0;
}
static int client_exception(nr_ctx_t *ctx, const nr_err_t *err) {
  (void)ctx;
  nr_promise_set_failure(client_failed, err->code, err->msg);
  return 0;
}
static const nr_handler_t counter = {.type = "count", .channel_read = count_bytes,
                                     .exception = client_exception};

static void tls_client_init(nr_channel_t *ch, void *arg) {
  nr_pipeline_t *p = nr_channel_pipeline(ch);
  CHECK_EQ(nr_pipeline_add_last(p, "tls", &nr_tls_handler, nr_tls_new(arg)), 0);
  CHECK_EQ(nr_pipeline_add_last(p, "count", &counter, NULL), 0);
}

/* A malicious server (an upstream, a proxied backend) meets the same
 * limit: the netrun client fails the connection. */
TEST_T(a_server_flooding_key_updates_fails_the_client_connection, 120) {
  make_certs();
  flooder_t f = {.lfd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0)};
  struct sockaddr_in sa = {.sin_family = AF_INET};
  sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof sa;
  CHECK_EQ(bind(f.lfd, (struct sockaddr *)&sa, sizeof sa), 0);
  CHECK_EQ(listen(f.lfd, 4), 0);
  CHECK_EQ(getsockname(f.lfd, (struct sockaddr *)&sa, &len), 0);
  CHECK_EQ(pthread_create(&f.thread, NULL, flood_client, &f), 0);

  char err[256];
  nr_tls_config_t *c = nr_tls_config_new(
      &(nr_tls_opts_t){.verify = NR_TLS_VERIFY_NONE}, err, sizeof err);
  if (c == NULL)
    FAIL("tls config: %s", err);
  client_failed = nr_promise_new();
  nr_group_t *g = nr_group_new(&(nr_group_opts_t){.name = "cli", .threads = 1});
  nr_promise_t *cf = nr_connect(&(nr_connect_opts_t){
      .group = g, .host = "127.0.0.1", .port = ntohs(sa.sin_port),
      .init = tls_client_init, .arg = c});
  AWAIT_OK(cf);
  nr_channel_t *ch = nr_channel_retain(nr_promise_value(cf));
  nr_promise_release(cf);
  CHECK_EQ(nr_promise_wait(client_failed, NR_SEC(60)), 0);
  CHECK(!nr_promise_is_success(client_failed));
  CHECK_CONTAINS(nr_promise_message(client_failed), "updated its keys too often");
  AWAIT_OK(nr_channel_close_future(ch));
  CHECK_LT(atomic_load(&client_bytes), 1000);
  pthread_join(f.thread, NULL);
  nr_channel_release(ch);
  nr_promise_release(client_failed);
  SHUTDOWN_GROUP(g);
  nr_tls_config_release(c);
  close(f.lfd);
  remove_certs();
}
