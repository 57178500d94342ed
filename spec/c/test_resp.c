/*
 * test_resp.c -- the RESP request decoder: the parser on its own (valid
 * requests, every split point, malformed input, limits), then the pipeline
 * handler on a real loopback channel, fed through its pipeline in chunks
 * cut at every byte boundary, with a protocol error answered on the wire
 * and the decoder removed in the middle of a read.
 *
 * Handler checks run on the loop thread (a failed CHECK exits the forked
 * test process); the test thread waits on a promise the loop completes.
 */
#include <arpa/inet.h>
#include <netinet/in.h>

#include "codec/resp.h"
#include "test.h"

static const nr_resp_limits_t LIM = {NR_RESP_MAX_BULK, NR_RESP_MAX_ARGS,
                                     NR_RESP_MAX_INLINE, NR_RESP_MAX_REQUEST};

/* Render a parsed request as "a|b|c" for comparisons. */
static void render(char *out, size_t n, const nr_slice_t *v, size_t argc) {
  size_t o = 0;
  out[0] = '\0';
  for (size_t i = 0; i < argc && o < n; i++)
    o += (size_t)snprintf(out + o, n - o, "%s%.*s", i ? "|" : "",
                          (int)v[i].len, v[i].data);
}

/* Parse one request from s, expecting `used` bytes and the rendering. */
static void expect_parse(const char *s, size_t n, long used, const char *want) {
  nr_slice_t v[64];
  size_t argc;
  const char *why;
  long r = nr_resp_parse(s, n, &LIM, v, 64, &argc, &why);
  if (r != used)
    FAIL("parse of \"%.*s\": got %ld (%s), want %ld", (int)n, s, r,
         why ? why : "-", used);
  if (used > 0) {
    char got[512];
    render(got, sizeof got, v, argc);
    CHECK_STR(got, want);
  }
}

#define PARSE(lit, used, want) expect_parse(lit, sizeof lit - 1, used, want)

TEST(parses_multibulk_and_inline) {
  PARSE("*1\r\n$4\r\nPING\r\n", 14, "PING");
  PARSE("*3\r\n$3\r\nSET\r\n$1\r\nk\r\n$5\r\nhello\r\n", 31, "SET|k|hello");
  PARSE("*2\r\n$4\r\nECHO\r\n$0\r\n\r\n", 20, "ECHO|");
  PARSE("*2\r\n$3\r\nGET\r\n$4\r\na\r\nb\r\n", 23, "GET|a\r\nb");  /* binary safe */
  PARSE("PING\r\n", 6, "PING");
  PARSE("PING\n", 5, "PING");
  PARSE("  SET  k \t v \r\n", 15, "SET|k|v");
  PARSE("*0\r\n", 4, "");                /* nothing to run, consumed */
  PARSE("*-1\r\n", 5, "");
  PARSE("\r\n", 2, "");
  /* Only the first of pipelined requests. */
  PARSE("*1\r\n$4\r\nPING\r\n*1\r\n$4\r\nPING\r\n", 14, "PING");
  PARSE("PING\r\nPING\r\n", 6, "PING");
}

/* Every proper prefix of a request is "incomplete", never an error, and
 * the whole gives the request. */
TEST(every_prefix_is_incomplete) {
  static const char *reqs[] = {
      "*3\r\n$3\r\nSET\r\n$10\r\n0123456789\r\n$2\r\nab\r\n",
      "*1\r\n$0\r\n\r\n", "GET key\r\n", "*2\r\n$4\r\nECHO\r\n$4\r\n\r\n\r\n\r\n"};
  for (size_t i = 0; i < sizeof reqs / sizeof *reqs; i++) {
    size_t n = strlen(reqs[i]);
    for (size_t k = 0; k < n; k++) {
      nr_slice_t v[8];
      size_t argc;
      const char *why;
      long r = nr_resp_parse(reqs[i], k, &LIM, v, 8, &argc, &why);
      if (r != 0)
        FAIL("request %zu cut at %zu: got %ld (%s)", i, k, r, why ? why : "-");
    }
    nr_slice_t v[8];
    size_t argc;
    const char *why;
    CHECK_EQ(nr_resp_parse(reqs[i], n, &LIM, v, 8, &argc, &why), (long)n);
  }
}

TEST(more_arguments_than_room) {
  char req[2048];
  int o = snprintf(req, sizeof req, "*40\r\n");
  for (int i = 0; i < 40; i++)
    o += snprintf(req + o, sizeof req - (size_t)o, "$2\r\n%02d\r\n", i);
  nr_slice_t v[40];
  size_t argc;
  const char *why;
  CHECK_EQ(nr_resp_parse(req, (size_t)o, &LIM, v, 4, &argc, &why), o);
  CHECK_EQ(argc, 40);                      /* tells how much room it needs */
  CHECK_EQ(nr_resp_parse(req, (size_t)o, &LIM, v, 40, &argc, &why), o);
  CHECK_EQ(v[39].len, 2);
  CHECK_EQ(memcmp(v[39].data, "39", 2), 0);
}

static void expect_error(const char *s, size_t n, const nr_resp_limits_t *lim,
                         long code, const char *msg) {
  nr_slice_t v[8];
  size_t argc;
  const char *why = NULL;
  long r = nr_resp_parse(s, n, lim, v, 8, &argc, &why);
  if (r != code)
    FAIL("parse of \"%.*s\": got %ld, want error %ld", (int)(n > 40 ? 40 : n),
         s, r, code);
  CHECK_STR(why, msg);
}

#define BAD(lit, code, msg) expect_error(lit, sizeof lit - 1, &LIM, code, msg)

TEST(malformed_input) {
  BAD("*x\r\n", -EPROTO, "invalid multibulk length");
  BAD("*1x\r\n", -EPROTO, "invalid multibulk length");
  BAD("*\r\n", -EPROTO, "invalid multibulk length");
  BAD("*1\rx", -EPROTO, "invalid multibulk length");
  BAD("*1\r\n+PING\r\n", -EPROTO, "expected '$'");
  BAD("*1\r\n$-1\r\n", -EPROTO, "invalid bulk length");
  BAD("*1\r\n$abc\r\n", -EPROTO, "invalid bulk length");
  BAD("*1\r\n$4\r\nPINGxx", -EPROTO, "bulk data not followed by CRLF");
  BAD("*1\r\n$99999999999999999999\r\n", -EPROTO, "invalid bulk length");
  /* A header line that never ends is refused once it is too long. */
  BAD("*1\r\n$11111111111111111111111111111111111", -EPROTO,
      "invalid bulk length");
}

TEST(limits) {
  nr_resp_limits_t lim = {.max_bulk = 8, .max_args = 3, .max_inline = 16};
  const char *big = "*1\r\n$9\r\n";
  expect_error(big, strlen(big), &lim, NR_ETOOLONG, "bulk length over the limit");
  const char *ok = "*1\r\n$8\r\n01234567\r\n";
  nr_slice_t v[8];
  size_t argc;
  const char *why;
  CHECK_EQ(nr_resp_parse(ok, strlen(ok), &lim, v, 8, &argc, &why), (long)strlen(ok));
  /* max_request bounds the whole request, refused on the lengths alone. */
  nr_resp_limits_t req = lim;
  req.max_request = 30;
  CHECK_EQ(nr_resp_parse(ok, strlen(ok), &req, v, 8, &argc, &why), (long)strlen(ok));
  const char *two = "*3\r\n$8\r\n01234567\r\n$8\r\n";
  expect_error(two, strlen(two), &req, NR_ETOOLONG, "request size over the limit");
  const char *many = "*4\r\n";
  expect_error(many, strlen(many), &lim, NR_ETOOLONG,
               "too many arguments in a request");
  const char *inl = "a b c d\r\n";
  expect_error(inl, strlen(inl), &lim, NR_ETOOLONG,
               "too many arguments in a request");
  const char *line = "PING PING PING PING";   /* no newline within 16 bytes */
  expect_error(line, strlen(line), &lim, NR_ETOOLONG, "too big inline request");
  char hdr[64];
  memset(hdr, '1', sizeof hdr);
  hdr[0] = '*';
  expect_error(hdr, sizeof hdr, &lim, -EPROTO, "invalid multibulk length");
  /* A huge declared length is refused at once, before any data arrives. */
  const char *huge = "*1\r\n$1073741824\r\n";
  expect_error(huge, strlen(huge), &LIM, NR_ETOOLONG, "bulk length over the limit");
}

/* ---- the handler on a real channel ------------------------------------------ */

/* What reached the handler after the decoder, as "PING;SET|k|v;". */
static char seen[8192];
static size_t seen_len;
static char seen_err[256];
static bool remove_after_first;

static void note(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void note(const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  int n = vsnprintf(seen + seen_len, sizeof seen - seen_len, fmt, ap);
  va_end(ap);
  if (n > 0)
    seen_len += (size_t)n;
  CHECK_LT(seen_len, sizeof seen);
}

static int cap_read(nr_ctx_t *ctx, void *msg) {
  if (nr_msg_type(msg) == NR_MSG_BYTES) {
    const nr_bytes_t *b = msg;
    note("BYTES:%.*s;", (int)b->len, b->data);
    return 0;
  }
  CHECK_EQ(nr_msg_type(msg), NR_MSG_RESP);
  const nr_resp_cmd_t *c = msg;
  char r[1024];
  render(r, sizeof r, c->argv, c->argc);
  note("%s;", r);
  if (remove_after_first) {
    remove_after_first = false;
    CHECK_EQ(nr_pipeline_remove(nr_ctx_pipeline(ctx), "resp"), 0);
  }
  return 0;
}

static int cap_exception(nr_ctx_t *ctx, const nr_err_t *err) {
  (void)ctx;
  snprintf(seen_err, sizeof seen_err, "%s", err->msg);
  return 0;
}

static const nr_handler_t capture = {.type = "capture",
                                     .channel_read = cap_read,
                                     .exception = cap_exception};

static void add_handlers(nr_channel_t *ch, void *arg) {
  (void)arg;
  nr_pipeline_t *p = nr_channel_pipeline(ch);
  CHECK_EQ(nr_pipeline_add_last(p, "resp", &nr_resp_handler, nr_resp_new(NULL)), 0);
  CHECK_EQ(nr_pipeline_add_last(p, "capture", &capture, NULL), 0);
}

typedef struct job_s {
  nr_channel_t *ch;
  void (*fn)(nr_channel_t *ch);
  nr_promise_t *done;
} job_t;

static int run_job(void *arg) {
  job_t *j = arg;
  j->fn(j->ch);
  nr_promise_set_success(j->done, NULL, NULL);
  return 0;
}

static void on_loop(nr_channel_t *ch, void (*fn)(nr_channel_t *ch)) {
  job_t j = {ch, fn, nr_promise_new()};
  CHECK_EQ(nr_loop_execute(nr_channel_loop(ch), run_job, &j), 0);
  AWAIT_OK(j.done);
  nr_promise_release(j.done);
}

static void feed(nr_channel_t *ch, const char *p, size_t n) {
  nr_bytes_t b = NR_BYTES(p, n);
  nr_pipeline_fire_read(nr_channel_pipeline(ch), &b);
}

static const char PIPELINED[] =
    "*3\r\n$3\r\nSET\r\n$3\r\nkey\r\n$5\r\nva\r\nl\r\n"
    "PING\r\n"
    "*2\r\n$3\r\nGET\r\n$3\r\nkey\r\n"
    "*0\r\n"
    "*1\r\n$4\r\nPING\r\n";
static const char PIPELINED_SEEN[] = "SET|key|va\r\nl;PING;GET|key;PING;";

static void split_everywhere(nr_channel_t *ch) {
  size_t n = sizeof PIPELINED - 1;
  for (size_t k = 0; k <= n; k++) {
    seen_len = 0;
    seen[0] = '\0';
    feed(ch, PIPELINED, k);
    feed(ch, PIPELINED + k, n - k);
    if (strcmp(seen, PIPELINED_SEEN) != 0)
      FAIL("split at %zu: saw \"%s\"", k, seen);
  }
  seen_len = 0;                           /* one byte at a time */
  for (size_t i = 0; i < n; i++)
    feed(ch, PIPELINED + i, 1);
  CHECK_STR(seen, PIPELINED_SEEN);
  /* Many arguments (beyond the decoder's on-stack vector), split too. */
  char req[4096];
  int o = snprintf(req, sizeof req, "*100\r\n");
  for (int i = 0; i < 100; i++)
    o += snprintf(req + o, sizeof req - (size_t)o, "$3\r\n%03d\r\n", i);
  seen_len = 0;
  feed(ch, req, 77);
  feed(ch, req + 77, (size_t)o - 77);
  CHECK_EQ(seen_len, 100 * 4);
  CHECK_EQ(memcmp(seen, "000|001|", 8), 0);
  CHECK_EQ(memcmp(seen + seen_len - 5, "|099;", 5), 0);
  CHECK_STR(seen_err, "");
}

static void remove_mid_read(nr_channel_t *ch) {
  seen_len = 0;
  remove_after_first = true;
  feed(ch, "PING\r\n*1\r\n$4\r\nEC", 16);
  /* The decoder left after the first request: the rest came on as bytes. */
  CHECK_STR(seen, "PING;BYTES:*1\r\n$4\r\nEC;");
  CHECK(nr_pipeline_context(nr_channel_pipeline(ch), "resp") == NULL);
}

static void malformed(nr_channel_t *ch) {
  seen_len = 0;
  feed(ch, "PING\r\n*1\r\n$x\r\nPING\r\n", 20);
  CHECK_STR(seen, "PING;");                /* nothing after the error */
  CHECK_STR(seen_err, "RESP: Protocol error: invalid bulk length");
}

/* A plain listening socket for the channel to connect to, so the test can
 * read what the decoder answers. */
static int listener(int *port) {
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  struct sockaddr_in sa = {.sin_family = AF_INET};
  sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof sa;
  CHECK_EQ(bind(fd, (struct sockaddr *)&sa, sizeof sa), 0);
  CHECK_EQ(listen(fd, 4), 0);
  CHECK_EQ(getsockname(fd, (struct sockaddr *)&sa, &len), 0);
  *port = ntohs(sa.sin_port);
  return fd;
}

static nr_channel_t *connect_with_decoder(nr_group_t *g, int lfd, int port,
                                          int *peer) {
  nr_promise_t *f = nr_connect(&(nr_connect_opts_t){
      .group = g, .host = "127.0.0.1", .port = port, .init = add_handlers});
  AWAIT_OK(f);
  nr_channel_t *ch = nr_channel_retain(nr_promise_value(f));
  nr_promise_release(f);
  *peer = accept(lfd, NULL, NULL);
  CHECK_GE(*peer, 0);
  struct timeval tv = {10, 0};
  setsockopt(*peer, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  return ch;
}

TEST(handler_on_a_channel) {
  nr_group_t *g = nr_group_new(&(nr_group_opts_t){.name = "resp", .threads = 1});
  int port, peer, lfd = listener(&port);
  nr_channel_t *ch = connect_with_decoder(g, lfd, port, &peer);
  on_loop(ch, split_everywhere);
  on_loop(ch, remove_mid_read);
  nr_channel_release(ch);
  close(peer);
  ch = connect_with_decoder(g, lfd, port, &peer);
  on_loop(ch, malformed);
  /* The peer gets Redis's answer, then the connection closes. */
  const char want[] = "-ERR Protocol error: invalid bulk length\r\n";
  char got[sizeof want] = {0};
  size_t have = 0;
  while (have < sizeof want - 1) {
    ssize_t r = read(peer, got + have, sizeof want - 1 - have);
    if (r <= 0)
      FAIL("read the error reply: %s", r == 0 ? "EOF" : strerror(errno));
    have += (size_t)r;
  }
  CHECK_STR(got, want);
  char c;
  CHECK_EQ(read(peer, &c, 1), 0);
  AWAIT_OK(nr_channel_close_future(ch));
  nr_channel_release(ch);
  close(peer);
  close(lfd);
  SHUTDOWN_GROUP(g);
}
