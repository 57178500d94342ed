/*
 * test_nats.c -- the NATS protocol parser and reader (runtime/codec/nats.c):
 * every operation a server sends, every prefix of each, malformed input
 * and the limits; then the reader fed one stream of operations whole, cut
 * at every byte boundary (in two and in three pieces) and byte by byte,
 * which must all give the same operations; and the publication encoder.
 */
#include "codec/nats.h"
#include "test.h"

static const nr_nats_limits_t LIM = {NR_NATS_MAX_CONTROL_LINE,
                                     NR_NATS_MAX_MESSAGE};

/* Append a rendering of op to out: "MSG s|sid|reply|hdr|data;" etc. */
static void render(char *out, size_t cap, const nr_nats_op_t *op) {
  static const char *names[] = {"?", "MSG", "HMSG", "PING", "PONG",
                                "OK", "ERR", "INFO"};
  size_t o = strlen(out);
  snprintf(out + o, cap - o, "%s %.*s|%llu|%.*s|%.*s|%.*s;", names[op->kind],
           (int)op->subject.len, op->subject.data ? op->subject.data : "",
           (unsigned long long)op->sid, (int)op->reply.len,
           op->reply.data ? op->reply.data : "", (int)op->hdr.len,
           op->hdr.data ? op->hdr.data : "", (int)op->data.len,
           op->data.data ? op->data.data : "");
}

/* Parse s alone: expect `used` bytes (0: incomplete, with need) and,
 * when complete, the rendering want. */
static void expect(const char *s, long used, size_t need, const char *want) {
  nr_nats_op_t op;
  size_t got_need;
  const char *why = NULL;
  long r = nr_nats_parse(s, strlen(s), &LIM, &op, &got_need, &why);
  if (r != used)
    FAIL("parse of \"%s\": got %ld (%s), want %ld", s, r, why ? why : "-",
         used);
  if (r == 0)
    CHECK_EQ(got_need, need);
  if (r > 0) {
    char out[512] = "";
    render(out, sizeof out, &op);
    CHECK_STR(out, want);
  }
}

static void expect_error(const char *s, const char *why_part) {
  nr_nats_op_t op;
  size_t need;
  const char *why = NULL;
  long r = nr_nats_parse(s, strlen(s), &LIM, &op, &need, &why);
  if (r >= 0)
    FAIL("parse of \"%s\": got %ld, want an error", s, r);
  CHECK_CONTAINS(why, why_part);
}

TEST(parses_every_operation_a_server_sends) {
  expect("MSG foo.bar 9 11\r\nhello world\r\n", 31, 0,
         "MSG foo.bar|9|||hello world;");
  expect("MSG foo 1 _INBOX.x.1 2\r\nhi\r\n", 28, 0,
         "MSG foo|1|_INBOX.x.1||hi;");
  expect("MSG foo 1 0\r\n\r\n", 15, 0, "MSG foo|1|||;");
  expect("HMSG a 3 24 29\r\nNATS/1.0\r\nA: b\r\nC: d\r\n\r\nhello\r\n", 47, 0,
         "HMSG a|3||NATS/1.0\r\nA: b\r\nC: d\r\n\r\n|hello;");
  expect("HMSG a 3 r 16 16\r\nNATS/1.0 503\r\n\r\n\r\n", 36, 0,
         "HMSG a|3|r|NATS/1.0 503\r\n\r\n|;");
  expect("PING\r\n", 6, 0, "PING |0|||;");
  expect("PONG\r\n", 6, 0, "PONG |0|||;");
  expect("+OK\r\n", 5, 0, "OK |0|||;");
  expect("-ERR 'Authorization Violation'\r\n", 32, 0,
         "ERR |0|||Authorization Violation;");
  expect("INFO {\"max_payload\":1024}\r\n", 27, 0,
         "INFO |0|||{\"max_payload\":1024};");
  /* what the Go client's parser also takes: any case, tabs, a bare LF */
  expect("msg\tfoo\t\t7  3\nabc\r\n", 19, 0, "MSG foo|7|||abc;");
  expect("ping\n", 5, 0, "PING |0|||;");
  expect("-ERR unquoted text \r\n", 21, 0, "ERR |0|||unquoted text;");
}

TEST(every_prefix_is_incomplete) {
  const char *ops[] = {
      "MSG foo.bar 9 _INBOX.abc 11\r\nhello world\r\n",
      "HMSG a 3 24 29\r\nNATS/1.0\r\nA: b\r\nC: d\r\n\r\nhello\r\n",
      "PING\r\n", "-ERR 'x'\r\n", "INFO {}\r\n"};
  for (size_t i = 0; i < sizeof ops / sizeof *ops; i++) {
    size_t n = strlen(ops[i]);
    const char *lf = strchr(ops[i], '\n');
    size_t line = (size_t)(lf - ops[i]) + 1;
    for (size_t k = 0; k < n; k++) {
      nr_nats_op_t op;
      size_t need;
      const char *why = NULL;
      long r = nr_nats_parse(ops[i], k, &LIM, &op, &need, &why);
      if (r != 0)
        FAIL("\"%s\" cut at %zu: got %ld (%s)", ops[i], k, r, why ? why : "-");
      /* once the line is whole, a message says how much it needs */
      CHECK_EQ(need, k >= line ? n : 0);
    }
  }
}

TEST(rejects_malformed_operations) {
  expect_error("HELLO\r\n", "unknown protocol operation");
  expect_error("\r\n", "unknown protocol operation");
  expect_error("MSGfoo 1 2\r\n", "unknown protocol operation");
  expect_error("PING extra\r\n", "unknown protocol operation");
  expect_error("MSG foo 1\r\n", "bad MSG arguments");
  expect_error("MSG foo 1 r x 3\r\n", "bad MSG arguments");
  expect_error("MSG foo x 3\r\nabc\r\n", "bad subscription id");
  expect_error("MSG foo 1 -3\r\n", "bad message size");
  expect_error("MSG foo 1 3x\r\n", "bad message size");
  expect_error("MSG foo 1 99999999999999999999\r\n", "bad message size");
  expect_error("MSG foo 1 3\r\nabcd\r\n", "not followed by CRLF");
  expect_error("HMSG foo 1 9 3\r\n", "bad header size");
  expect_error("HMSG foo 1 3\r\n", "bad HMSG arguments");
  expect_error("MSG foo 1 67108865\r\n", "larger than max_message");
  /* no line feed within max_control_line */
  nr_nats_limits_t small = {16, 64};
  nr_nats_op_t op;
  size_t need;
  const char *why;
  CHECK_EQ(nr_nats_parse("INFO {\"aaaaaaaaaaaaaa", 20, &small, &op, &need, &why),
           NR_ETOOLONG);
  CHECK_EQ(nr_nats_parse("INFO {\"aaaaa", 12, &small, &op, &need, &why), 0);
  CHECK_EQ(nr_nats_parse("MSG a 1 65\r\n", 12, &small, &op, &need, &why),
           NR_ETOOLONG);
}

/* ---- the reader ------------------------------------------------------- */

typedef struct seen_s {
  char text[8192];
  int ops;
  int stop_at;                 /* stop (return 7) at this op; 0: never */
} seen_t;

static int on_op(void *ud, const nr_nats_op_t *op) {
  seen_t *s = ud;
  render(s->text, sizeof s->text, op);
  return ++s->ops == s->stop_at ? 7 : 0;
}

static const char STREAM[] =
    "INFO {\"server_id\":\"x\",\"max_payload\":1048576}\r\n"
    "PING\r\n"
    "MSG chat.room 1 5\r\nhello\r\n"
    "MSG chat.room 1 _INBOX.q.7 0\r\n\r\n"
    "HMSG _INBOX.a.1 2 16 16\r\nNATS/1.0 503\r\n\r\n\r\n"
    "+OK\r\n"
    "HMSG x 3 r 12 15\r\nNATS/1.0\r\n\r\nabc\r\n"
    "msg\tx 4 2\nhi\r\n"
    "-ERR 'Permissions Violation for Publish to \"x\"'\r\n"
    "PONG\r\n";

/* Feed STREAM in pieces cut at `cuts` (ascending), all into one reader. */
static void feed_cut(const size_t *cuts, int ncuts, seen_t *s) {
  nr_nats_reader_t r;
  nr_nats_reader_init(&r, NULL);
  size_t n = sizeof STREAM - 1, at = 0;
  const char *why;
  for (int i = 0; i <= ncuts; i++) {
    size_t end = i < ncuts ? cuts[i] : n;
    CHECK_EQ(nr_nats_reader_feed(&r, STREAM + at, end - at, on_op, s, &why), 0);
    at = end;
  }
  CHECK_EQ(nr_buf_len(&r.acc), 0);     /* nothing held after the last op */
  CHECK(r.acc.data == NULL);
  nr_nats_reader_reset(&r);
}

TEST(the_reader_gives_the_same_operations_however_the_input_is_cut) {
  seen_t whole = {0};
  feed_cut(NULL, 0, &whole);
  CHECK_EQ(whole.ops, 10);
  size_t n = sizeof STREAM - 1;
  for (size_t k = 0; k <= n; k++) {
    seen_t s = {0};
    feed_cut(&k, 1, &s);
    if (strcmp(s.text, whole.text) != 0)
      FAIL("cut at %zu:\n%s\nvs\n%s", k, s.text, whole.text);
  }
  for (size_t i = 0; i <= n; i += 3)
    for (size_t j = i; j <= n; j++) {
      size_t cuts[2] = {i, j};
      seen_t s = {0};
      feed_cut(cuts, 2, &s);
      if (strcmp(s.text, whole.text) != 0)
        FAIL("cut at %zu and %zu", i, j);
    }
  size_t every[sizeof STREAM];
  for (size_t k = 0; k < n; k++)
    every[k] = k + 1;
  seen_t s = {0};
  feed_cut(every, (int)n - 1, &s);
  CHECK_STR(s.text, whole.text);
}

TEST(the_reader_stops_at_an_error_and_holds_no_more_than_its_limits) {
  nr_nats_limits_t lim = {32, 100};
  nr_nats_reader_t r;
  nr_nats_reader_init(&r, &lim);
  seen_t s = {0};
  const char *why;
  /* a good op, then garbage: the op is delivered, the rest dropped */
  const char *in = "PING\r\nGARBAGE\r\nPONG\r\n";
  CHECK_EQ(nr_nats_reader_feed(&r, in, strlen(in), on_op, &s, &why), -EPROTO);
  CHECK_STR(why, "unknown protocol operation");
  CHECK_EQ(s.ops, 1);
  CHECK(r.acc.data == NULL);
  /* a line dripped a byte at a time past max_control_line */
  nr_nats_reader_init(&r, &lim);
  int rc = 0;
  size_t fed = 0;
  while (rc == 0 && fed < 1000) {
    rc = nr_nats_reader_feed(&r, "x", 1, on_op, &s, &why);
    fed++;
    CHECK_LE(nr_buf_len(&r.acc), 32);
  }
  CHECK_EQ(rc, NR_ETOOLONG);
  CHECK_EQ(fed, 32);
  /* a size over max_message fails before any payload is kept */
  nr_nats_reader_init(&r, &lim);
  in = "MSG a 1 101\r\n";
  CHECK_EQ(nr_nats_reader_feed(&r, in, strlen(in), on_op, &s, &why),
           NR_ETOOLONG);
  /* a message at the limit, dripped: kept whole, then delivered */
  nr_nats_reader_init(&r, &lim);
  char big[200];
  int hl = snprintf(big, sizeof big, "MSG a 1 100\r\n");
  memset(big + hl, 'z', 100);
  memcpy(big + hl + 100, "\r\n", 2);
  s.ops = 0;
  for (int i = 0; i < hl + 102; i++) {
    CHECK_EQ(nr_nats_reader_feed(&r, big + i, 1, on_op, &s, &why), 0);
    CHECK_LE(nr_buf_len(&r.acc), 32 + 100 + 2);
  }
  CHECK_EQ(s.ops, 1);
  CHECK(r.acc.data == NULL);
}

TEST(a_callback_that_stops_the_reader_drops_the_rest) {
  nr_nats_reader_t r;
  nr_nats_reader_init(&r, NULL);
  seen_t s = {.stop_at = 2};
  const char *why;
  const char *in = "PING\r\nPONG\r\nPING\r\n";
  CHECK_EQ(nr_nats_reader_feed(&r, in, strlen(in), on_op, &s, &why), 7);
  CHECK_EQ(s.ops, 2);
  /* the same when the op that stops was kept across reads */
  nr_nats_reader_reset(&r);
  s = (seen_t){.stop_at = 1};
  CHECK_EQ(nr_nats_reader_feed(&r, "MSG a 1 3\r\nab", 13, on_op, &s, &why), 0);
  CHECK_EQ(nr_nats_reader_feed(&r, "c\r\nPING\r\n", 9, on_op, &s, &why), 7);
  CHECK_EQ(s.ops, 1);
  CHECK(r.acc.data == NULL);
  nr_nats_reader_reset(&r);
}

/* ---- the encoder ------------------------------------------------------ */

TEST(encodes_publications) {
  char out[256];
  size_t n = nr_nats_pub_line(out, "foo.bar", 7, NULL, 0, 0, 11);
  CHECK_EQ(n, strlen("PUB foo.bar 11\r\n"));
  CHECK(memcmp(out, "PUB foo.bar 11\r\n", n) == 0);
  n = nr_nats_pub_line(out, "a", 1, "_INBOX.x.1", 10, 0, 0);
  CHECK(memcmp(out, "PUB a _INBOX.x.1 0\r\n", n) == 0);
  n = nr_nats_pub_line(out, "a", 1, "r", 1, 12, 5);
  CHECK(memcmp(out, "HPUB a r 12 17\r\n", n) == 0);
  CHECK_LE(n, nr_nats_pub_line_max(1, 1));
  n = nr_nats_pub_line(out, "s", 1, NULL, 0, 0, (size_t)-1);
  CHECK_LE(n, nr_nats_pub_line_max(1, 0));
  CHECK(nr_nats_valid_subject("a.b.>", 5));
  CHECK(nr_nats_valid_subject("\xc3\xa9t\xc3\xa9", 5));
  CHECK(!nr_nats_valid_subject("", 0));
  CHECK(!nr_nats_valid_subject("a b", 3));
  CHECK(!nr_nats_valid_subject("a\tb", 3));
  CHECK(!nr_nats_valid_subject("a\r\nPUB x 1", 10));
  CHECK(!nr_nats_valid_subject("a\0b", 3));
}
