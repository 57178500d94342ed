/*
 * test_resp_reply.c -- the RESP reply scanner and tokenizer
 * (runtime/codec/resp_reply.c): RESP2 and RESP3 replies scanned whole,
 * fed a byte at a time and cut at every split point (the resumable scan
 * must give the same answer as a whole one, never an error on a prefix),
 * malformed replies refused with their reason, each limit refused as
 * soon as its header is seen, and the cluster key slot against the
 * values Redis's specification gives.
 */
#include "codec/resp_reply.h"
#include "test.h"

#include <errno.h>

static const nr_resp_reply_limits_t LIM = {NR_RESP_REPLY_MAX,
                                           NR_RESP_REPLY_MAX_DEPTH,
                                           NR_RESP_REPLY_MAX_LINE};

/* Render the tokens of a scanned reply: "type:payload" joined by spaces
 * (aggregates "*2", nulls "$nil"). */
static void render(const char *p, size_t n, char *out, size_t cap) {
  size_t off = 0, o = 0;
  out[0] = '\0';
  while (off < n && o < cap) {
    nr_resp_token_t t;
    size_t len = nr_resp_reply_token(p + off, n - off, &t);
    if (len == 0)
      FAIL("token at %zu of \"%.*s\" does not parse", off, (int)n, p);
    off += len;
    const char *sep = o ? " " : "";
    if (t.null)
      o += (size_t)snprintf(out + o, cap - o, "%s%cnil", sep, t.type);
    else if (strchr("*~>%|", t.type) || t.type == ':' || t.type == '#')
      o += (size_t)snprintf(out + o, cap - o, "%s%c%lld", sep, t.type, (long long)t.n);
    else
      o += (size_t)snprintf(out + o, cap - o, "%s%c%.*s", sep, t.type,
                            (int)t.len, t.data);
  }
}

/* One reply, scanned whole: its length and its tokens. */
static void expect_reply(const char *s, const char *want) {
  size_t n = strlen(s);
  nr_resp_scan_t st = NR_RESP_SCAN_INIT;
  const char *why = NULL;
  long r = nr_resp_reply_scan(&st, s, n, &LIM, &why);
  if (r != (long)n)
    FAIL("scan of \"%s\": got %ld (%s), want %zu", s, r, why ? why : "-", n);
  char got[512];
  render(s, n, got, sizeof got);
  CHECK_STR(got, want);
}

TEST(scans_resp2_replies) {
  expect_reply("+OK\r\n", "+OK");
  expect_reply("-ERR unknown command\r\n", "-ERR unknown command");
  expect_reply(":-42\r\n", ":-42");
  expect_reply(":9223372036854775807\r\n", ":9223372036854775807");
  expect_reply(":-9223372036854775808\r\n", ":-9223372036854775808");
  expect_reply("$5\r\nhello\r\n", "$hello");
  expect_reply("$0\r\n\r\n", "$");
  expect_reply("$4\r\na\r\nb\r\n", "$a\r\nb");          /* binary safe */
  expect_reply("$-1\r\n", "$nil");
  expect_reply("*-1\r\n", "*nil");
  expect_reply("*0\r\n", "*0");
  expect_reply("*3\r\n$1\r\na\r\n$-1\r\n:7\r\n", "*3 $a $nil :7");
  expect_reply("*2\r\n*1\r\n+x\r\n*0\r\n", "*2 *1 +x *0");
}

TEST(scans_resp3_replies) {
  expect_reply("_\r\n", "_nil");
  expect_reply("#t\r\n", "#1");
  expect_reply("#f\r\n", "#0");
  expect_reply(",3.25\r\n", ",3.25");
  expect_reply(",-inf\r\n", ",-inf");
  expect_reply(",1e+30\r\n", ",1e+30");
  expect_reply(",.5\r\n", ",.5");
  expect_reply("(3492890328409238509324850943850943825024385\r\n",
               "(3492890328409238509324850943850943825024385");
  expect_reply("!9\r\nERR oops!\r\n", "!ERR oops!");
  expect_reply("=15\r\ntxt:Some string\r\n", "=Some string");
  expect_reply("%2\r\n+a\r\n:1\r\n+b\r\n_\r\n", "%4 +a :1 +b _nil");
  expect_reply("~2\r\n+a\r\n+b\r\n", "~2 +a +b");
  expect_reply(">3\r\n+message\r\n+ch\r\n$2\r\nhi\r\n", ">3 +message +ch $hi");
  /* An attribute is not an element: the value after it is. */
  expect_reply("|1\r\n+ttl\r\n:3\r\n$1\r\nv\r\n", "|2 +ttl :3 $v");
  expect_reply("*2\r\n|1\r\n+a\r\n+b\r\n:1\r\n:2\r\n", "*2 |2 +a +b :1 :2");
  expect_reply("|0\r\n:5\r\n", "|0 :5");
}

/* Each reply followed by another: the scan takes the first alone, whether
 * it saw the bytes at once, a byte at a time, or cut at any point. */
TEST(every_split_gives_the_whole_answer) {
  static const char *replies[] = {
      "+OK\r\n", "$10\r\n0123456789\r\n", "$-1\r\n", ":123\r\n",
      "*3\r\n$1\r\na\r\n*2\r\n:1\r\n$3\r\n\r\n\r\r\n_\r\n",
      "%2\r\n$1\r\nk\r\n*1\r\n,2.5\r\n+x\r\n~1\r\n#t\r\n",
      "|1\r\n+a\r\n+b\r\n>2\r\n+pong\r\n$0\r\n\r\n",
      "=8\r\ntxt:abcd\r\n", "*0\r\n", "-ERR x\r\n"};
  for (size_t i = 0; i < sizeof replies / sizeof *replies; i++) {
    char buf[256];
    size_t n = strlen(replies[i]);
    int total = snprintf(buf, sizeof buf, "%s:1\r\n", replies[i]);
    const char *why = NULL;
    /* a byte at a time, one scan state throughout */
    nr_resp_scan_t st = NR_RESP_SCAN_INIT;
    for (size_t k = 0; k < n; k++) {
      long r = nr_resp_reply_scan(&st, buf, k, &LIM, &why);
      if (r != 0)
        FAIL("reply %zu fed to %zu bytes: got %ld (%s)", i, k, r, why ? why : "-");
    }
    CHECK_EQ(nr_resp_reply_scan(&st, buf, (size_t)total, &LIM, &why), (long)n);
    /* cut once at every point */
    for (size_t k = 0; k <= n; k++) {
      nr_resp_scan_t s2 = NR_RESP_SCAN_INIT;
      long r = nr_resp_reply_scan(&s2, buf, k, &LIM, &why);
      if (k < n && r != 0)
        FAIL("reply %zu cut at %zu: got %ld", i, k, r);
      if (r == 0)
        r = nr_resp_reply_scan(&s2, buf, (size_t)total, &LIM, &why);
      if (r != (long)n)
        FAIL("reply %zu cut at %zu: then got %ld, want %zu", i, k, r, n);
    }
  }
}

/* A reply of many elements in many pieces is scanned once: what was
 * scanned is not scanned again (the state's offset only moves on). */
TEST(a_long_reply_in_pieces_is_scanned_once) {
  enum { N = 20000 };
  size_t cap = (size_t)N * 16 + 32, n = 0;
  char *buf = malloc(cap);
  n += (size_t)snprintf(buf, cap, "*%d\r\n", N);
  for (int i = 0; i < N; i++)
    n += (size_t)snprintf(buf + n, cap - n, "$5\r\n%05d\r\n", i);
  nr_resp_scan_t st = NR_RESP_SCAN_INIT;
  const char *why;
  size_t last = 0;
  for (size_t k = 1000; k < n; k += 1000) {
    CHECK_EQ(nr_resp_reply_scan(&st, buf, k, &LIM, &why), 0);
    CHECK_GE(st.off, last);
    CHECK_LE(st.off, k);
    CHECK_GT(st.off + 16, k);             /* at most one token behind */
    last = st.off;
  }
  CHECK_EQ(nr_resp_reply_scan(&st, buf, n, &LIM, &why), (long)n);
  free(buf);
}

static void expect_error(const char *s, size_t n, const nr_resp_reply_limits_t *lim,
                         int code, const char *msg) {
  nr_resp_scan_t st = NR_RESP_SCAN_INIT;
  const char *why = NULL;
  long r = nr_resp_reply_scan(&st, s, n, lim, &why);
  if (r != -code)
    FAIL("scan of \"%.*s\": got %ld, want %d", (int)(n > 40 ? 40 : n), s, r, -code);
  CHECK_STR(why, msg);
  CHECK_EQ(st.off, 0);                    /* reset for whoever looks next */
  CHECK_EQ(st.depth, 0);
}

#define BAD(lit, msg) expect_error(lit, sizeof lit - 1, &LIM, EPROTO, msg)

TEST(refuses_malformed_replies) {
  BAD("?\r\n", "unknown reply type");
  BAD("GARBAGE\r\n", "unknown reply type");
  BAD("\r\n", "line without CRLF");
  BAD("+OK\rX", "line without CRLF");
  BAD(":12a\r\n", "invalid integer");
  BAD(":\r\n", "invalid integer");
  BAD(":99999999999999999999\r\n", "invalid integer");
  BAD("$abc\r\n", "invalid bulk length");
  BAD("$-2\r\n", "invalid bulk length");
  BAD("$?\r\n", "invalid bulk length");             /* streamed: refused */
  BAD("!-1\r\n", "invalid bulk length");
  BAD("$3\r\nabcXY", "bulk string without CRLF");
  BAD("*-2\r\n", "invalid multibulk length");
  BAD("%-1\r\n", "invalid multibulk length");
  BAD("*?\r\n", "invalid multibulk length");
  BAD("*1\r\n$1\r\nab\r\n", "bulk string without CRLF");
  BAD("_x\r\n", "invalid null");
  BAD("#x\r\n", "invalid boolean");
  BAD(",1.2.3\r\n", "invalid double");
  BAD(",e5\r\n", "invalid double");
  BAD("(12x\r\n", "invalid big number");
  BAD("=3\r\ntxt\r\n", "invalid verbatim string");
  BAD("=5\r\ntxt-a\r\n", "invalid verbatim string");
  BAD("*2\r\n:1\r\nZ\r\n", "unknown reply type");  /* deep inside, too */
}

TEST(limits_hold_before_the_bytes_arrive) {
  nr_resp_reply_limits_t lim = {1000, 3, 16};
  /* a bulk length past max_reply: refused at its header alone */
  expect_error("$1001\r\n", 7, &lim, EMSGSIZE, "reply too large");
  expect_error("$9999999999999999\r\n", 19, &lim, EMSGSIZE, "reply too large");
  expect_error("*2\r\n$995\r\n", 10, &lim, EMSGSIZE, "reply too large");
  /* many small elements adding up past it */
  char big[1400];
  size_t n = (size_t)snprintf(big, sizeof big, "*300\r\n");
  for (int i = 0; i < 300; i++)
    n += (size_t)snprintf(big + n, sizeof big - n, ":1\r\n");
  expect_error(big, n, &lim, EMSGSIZE, "reply too large");
  /* nesting */
  expect_error("*1\r\n*1\r\n*1\r\n*1\r\n", 16, &lim, EMSGSIZE, "nesting too deep");
  expect_error("%1\r\n*1\r\n~1\r\n>1\r\n", 16, &lim, EMSGSIZE, "nesting too deep");
  /* a line without its end within max_line */
  expect_error("+0123456789abcdefgh", 19, &lim, EMSGSIZE, "line too long");
  /* at the limits, accepted */
  nr_resp_scan_t st = NR_RESP_SCAN_INIT;
  const char *why;
  CHECK_EQ(nr_resp_reply_scan(&st, "*1\r\n*1\r\n*1\r\n:1\r\n", 16, &lim, &why), 16);
  CHECK_EQ(nr_resp_reply_scan(&st, "+0123456789abcdef\r\n", 19, &lim, &why), 19);
  /* max_depth above the stack is held to it */
  nr_resp_reply_limits_t deep = {1 << 20, 1000, 64};
  char nest[600];
  for (int i = 0; i < 100; i++)
    memcpy(nest + i * 4, "*1\r\n", 4);
  memcpy(nest + 400, ":1\r\n", 4);
  expect_error(nest, 404, &deep, EMSGSIZE, "nesting too deep");
}

TEST(key_slots_follow_the_cluster_specification) {
  CHECK_EQ(nr_resp_key_slot("123456789", 9), 0x31c3 & 16383);  /* the CRC check value */
  CHECK_EQ(nr_resp_key_slot("", 0), 0);
  /* hash tags: the first {...} that is not empty */
  unsigned user = nr_resp_key_slot("user1000", 8);
  CHECK_EQ(nr_resp_key_slot("{user1000}.following", 20), user);
  CHECK_EQ(nr_resp_key_slot("{user1000}.followers", 20), user);
  CHECK_EQ(nr_resp_key_slot("foo{}{bar}", 10), nr_resp_key_slot("foo{}{bar}", 10));
  CHECK_NE(nr_resp_key_slot("foo{}{bar}", 10), nr_resp_key_slot("bar", 3));
  CHECK_EQ(nr_resp_key_slot("foo{{bar}}zap", 13), nr_resp_key_slot("{bar", 4));
  CHECK_EQ(nr_resp_key_slot("foo{bar}{zap}", 13), nr_resp_key_slot("bar", 3));
  CHECK_EQ(nr_resp_key_slot("{a", 2), nr_resp_key_slot("{a", 2));
  for (int i = 0; i < 1000; i++) {
    char k[16];
    int n = snprintf(k, sizeof k, "key:%d", i);
    CHECK_LT(nr_resp_key_slot(k, (size_t)n), 16384);
  }
}


