/*
 * test_sim.c -- the simulation (runtime/sim/) through the C API alone:
 * loops of a world stepped on one thread in virtual time, TCP between
 * hosts with its latency, refusal, timeouts, partitions, backpressure,
 * half-close and resets, UDP with loss and duplication, the same trace
 * for the same seed, and a world left clean.
 *
 * Each test enters a world on its (forked) thread and makes an external
 * loop there: the main context, whose waits run the scheduler. Every
 * timeout a test waits on is virtual: the wall clock is checked to show
 * that none is waited for.
 */
#include <arpa/inet.h>
#include <time.h>

#include "test.h"

/* ---- a world with a main loop ------------------------------------------------------ */

typedef struct world_s {
  nr_sim_t *w;
  nr_loop_t *main;
  nr_sim_host_t *a, *b;
} world_t;

static world_t world(uint64_t seed) {
  world_t t;
  t.w = nr_sim_new(&(nr_sim_opts_t){.seed = seed, .latency = NR_MS(5)});
  CHECK(t.w != NULL);
  CHECK_EQ(nr_sim_enter(t.w), 0);
  t.main = nr_loop_new(&(nr_loop_opts_t){.name = "main", .external = true});
  CHECK(t.main != NULL);
  CHECK(nr_loop_is_simulated(t.main));
  t.a = nr_sim_host(t.w, "a");
  t.b = nr_sim_host(t.w, "b");
  return t;
}

static void world_end(world_t *t) {
  nr_loop_free(t->main);
  nr_sim_leave(t->w);
  nr_sim_release(t->w);
  CHECK(nr_sim_current() == NULL);
}

static nr_group_t *group_on(world_t *t, nr_sim_host_t *h, const char *name) {
  nr_sim_host_t *old = nr_sim_set_host(t->w, h);
  nr_group_t *g = nr_group_new(&(nr_group_opts_t){.name = name, .threads = 1});
  nr_sim_set_host(t->w, old);
  CHECK(g != NULL);
  CHECK(nr_loop_is_simulated(nr_group_loop(g, 0)));
  CHECK(nr_sim_loop_host(nr_group_loop(g, 0)) == h);
  return g;
}

static double wall(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

/* ---- handlers ----------------------------------------------------------------------- */

/* A client that collects what it reads until `want` bytes came. */
typedef struct sink_s {
  char buf[1 << 20];
  size_t len, want;
  nr_promise_t *full;          /* want bytes came */
  int error;                   /* the first exception's code */
} sink_t;

static int sink_read(nr_ctx_t *ctx, void *msg) {
  sink_t *s = nr_ctx_state(ctx);
  const nr_bytes_t *b = msg;
  size_t n = b->len < sizeof s->buf - s->len ? b->len : sizeof s->buf - s->len;
  memcpy(s->buf + s->len, b->data, n);
  s->len += n;
  if (s->len >= s->want)
    nr_promise_set_success(s->full, NULL, NULL);
  return 0;
}

/* The end of a test of a client (ch on ga) and a server (srv on gb):
 * both released, both groups shut down, the sink (if any) freed, the
 * world ended. */
static void end_pair(world_t *t, nr_channel_t *ch, nr_channel_t *srv,
                     nr_group_t *ga, nr_group_t *gb, sink_t *s) {
  nr_channel_release(ch);
  nr_channel_release(srv);
  SHUTDOWN_GROUP(ga);
  SHUTDOWN_GROUP(gb);
  if (s != NULL) {
    nr_promise_release(s->full);
    free(s);
  }
  world_end(t);
}

static int sink_error(nr_ctx_t *ctx, const nr_err_t *err) {
  sink_t *s = nr_ctx_state(ctx);
  if (s->error == 0)
    s->error = err->code;
  return 0;
}

static const nr_handler_t sink_h = {.type = "sink", .channel_read = sink_read,
                                    .exception = sink_error};

static void sink_init(nr_channel_t *ch, void *arg) {
  CHECK_EQ(nr_pipeline_add_last(nr_channel_pipeline(ch), "sink", &sink_h, arg), 0);
}


static nr_channel_t *echo_server(nr_group_t *g, int port) {
  return test_take_channel(nr_server_bind(&(nr_server_opts_t){
      .group = g, .host = "0.0.0.0", .port = port, .child_init = test_echo_init}));
}

static nr_promise_t *connect_to(nr_group_t *g, const char *host, int port,
                                sink_t *s, uint64_t timeout) {
  return nr_connect(&(nr_connect_opts_t){.group = g, .host = host, .port = port,
                                         .init = sink_init, .arg = s,
                                         .timeout = timeout});
}

/* ---- tests -------------------------------------------------------------------------------- */

TEST(echo_between_two_hosts_takes_the_latency_in_virtual_time) {
  world_t t = world(1);
  nr_group_t *ga = group_on(&t, t.a, "a"), *gb = group_on(&t, t.b, "b");
  nr_channel_t *srv = echo_server(gb, 7);
  CHECK_EQ(test_local_port(srv), 7);
  sink_t *s = calloc(1, sizeof *s);
  s->want = 5;
  s->full = nr_promise_new();
  uint64_t t0 = nr_now();
  nr_channel_t *ch = test_take_channel(connect_to(ga, nr_sim_host_addr(t.b), 7, s, 0));
  uint64_t connected = nr_now() - t0;
  CHECK_GE(connected, NR_MS(10));          /* SYN there, SYN-ACK back */
  CHECK_LT(connected, NR_MS(11));
  char host[64];
  int port;
  CHECK_EQ(nr_channel_remote_address(ch, host, sizeof host, &port), 0);
  CHECK_STR(host, nr_sim_host_addr(t.b));
  CHECK_EQ(port, 7);
  t0 = nr_now();
  CHECK_EQ(nr_channel_write(ch, "hello", 5, true, NULL), 0);
  AWAIT_OK(s->full);
  CHECK_EQ(s->len, 5);
  CHECK(memcmp(s->buf, "hello", 5) == 0);
  CHECK_GE(nr_now() - t0, NR_MS(10));      /* there and back */
  CHECK_LT(nr_now() - t0, NR_MS(11));
  end_pair(&t, ch, srv, ga, gb, s);
}

TEST(a_host_name_resolves_to_its_address) {
  world_t t = world(2);
  nr_promise_t *p = nr_resolve("B", AF_UNSPEC, 0);
  CHECK(nr_promise_is_done(p));
  CHECK(nr_promise_is_success(p));
  const nr_addrs_t *a = nr_promise_value(p);
  CHECK_EQ(a->n, 1);
  CHECK_STR(a->addr[0], nr_sim_host_addr(t.b));
  nr_promise_release(p);
  p = nr_resolve("nowhere.example", AF_UNSPEC, 0);
  CHECK(nr_promise_is_done(p) && !nr_promise_is_success(p));
  CHECK_EQ(nr_promise_code(p), -ENOENT);
  nr_promise_release(p);
  world_end(&t);
}

TEST(a_port_nobody_listens_on_refuses_after_a_round_trip) {
  world_t t = world(3);
  nr_group_t *ga = group_on(&t, t.a, "a");
  group_on(&t, t.b, "b");
  sink_t s = {0};
  uint64_t t0 = nr_now();
  nr_promise_t *f = connect_to(ga, nr_sim_host_addr(t.b), 9, &s, 0);
  CHECK_EQ(nr_promise_wait(f, NR_SEC(10)), 0);
  CHECK(!nr_promise_is_success(f));
  CHECK_EQ(nr_promise_code(f), -ECONNREFUSED);
  CHECK_GE(nr_now() - t0, NR_MS(10));
  nr_promise_release(f);
  SHUTDOWN_GROUP(ga);
  world_end(&t);
}

TEST(a_partition_times_connects_out_and_its_heal_lets_data_through) {
  world_t t = world(4);
  nr_group_t *ga = group_on(&t, t.a, "a"), *gb = group_on(&t, t.b, "b");
  nr_channel_t *srv = echo_server(gb, 80);
  nr_sim_partition(t.w, t.a, t.b);
  sink_t *s = calloc(1, sizeof *s);
  s->want = 3;
  s->full = nr_promise_new();
  double w0 = wall();
  uint64_t t0 = nr_now();
  nr_promise_t *f = connect_to(ga, nr_sim_host_addr(t.b), 80, s, NR_SEC(30));
  CHECK_EQ(nr_promise_wait(f, NR_SEC(60)), 0);
  CHECK_EQ(nr_promise_code(f), NR_ETIMEDOUT);
  CHECK_GE(nr_now() - t0, NR_SEC(30));
  CHECK_LT(wall() - w0, 5.0);              /* the 30 s were virtual */
  nr_promise_release(f);
  /* connected first, then cut: the bytes wait for the heal, not lost */
  nr_sim_heal(t.w);
  nr_channel_t *ch = test_take_channel(connect_to(ga, nr_sim_host_addr(t.b), 80, s, 0));
  nr_sim_partition(t.w, t.a, NULL);
  CHECK_EQ(nr_channel_write(ch, "abc", 3, true, NULL), 0);
  CHECK_EQ(nr_promise_wait(s->full, NR_SEC(60)), NR_ETIMEDOUT);
  CHECK_EQ(s->len, 0);
  nr_sim_heal(t.w);
  AWAIT_OK(s->full);
  CHECK(memcmp(s->buf, "abc", 3) == 0);
  end_pair(&t, ch, srv, ga, gb, s);
}

/* A server that reads nothing. */
static void mute_init(nr_channel_t *ch, void *arg) {
  (void)arg;
  nr_channel_set_auto_read(ch, false);
}

static int writable_count;
static int count_writability(nr_ctx_t *ctx) {
  (void)ctx;
  writable_count++;
  return 0;
}
static const nr_handler_t watch_h = {.type = "watch",
                                     .writability_changed = count_writability};
static void watch_init(nr_channel_t *ch, void *arg) {
  (void)arg;
  CHECK_EQ(nr_pipeline_add_last(nr_channel_pipeline(ch), "watch", &watch_h, NULL), 0);
}

TEST(a_peer_that_reads_nothing_fills_the_buffers_and_backpressure_holds) {
  world_t t = world(5);
  nr_group_t *ga = group_on(&t, t.a, "a"), *gb = group_on(&t, t.b, "b");
  nr_channel_t *srv = test_take_channel(nr_server_bind(&(nr_server_opts_t){
      .group = gb, .port = 81, .child_init = mute_init}));
  nr_channel_t *ch = test_take_channel(nr_connect(&(nr_connect_opts_t){
      .group = ga, .host = nr_sim_host_addr(t.b), .port = 81, .init = watch_init}));
  static char big[1 << 20];
  nr_promise_t *done = nr_promise_new();
  CHECK_EQ(nr_channel_write(ch, big, sizeof big, true, done), 0);
  CHECK_EQ(nr_promise_wait(done, NR_SEC(30)), NR_ETIMEDOUT);   /* never all */
  CHECK(!nr_channel_is_writable(ch));
  CHECK_GE(writable_count, 1);
  CHECK(nr_channel_is_open(ch));
  nr_promise_release(done);
  end_pair(&t, ch, srv, ga, gb, NULL);
}

TEST(a_reset_reaches_both_ends_and_closes_them) {
  world_t t = world(6);
  nr_group_t *ga = group_on(&t, t.a, "a"), *gb = group_on(&t, t.b, "b");
  nr_channel_t *srv = echo_server(gb, 82);
  sink_t *s = calloc(1, sizeof *s);
  s->want = 1;
  s->full = nr_promise_new();
  nr_channel_t *ch = test_take_channel(connect_to(ga, nr_sim_host_addr(t.b), 82, s, 0));
  CHECK_EQ(nr_channel_write(ch, "x", 1, true, NULL), 0);
  AWAIT_OK(s->full);
  CHECK_EQ(nr_sim_reset(t.w, t.a, t.b), 2);
  AWAIT_OK(nr_channel_close_future(ch));
  CHECK_EQ(s->error, -ECONNRESET);
  nr_sim_stats_t st;
  nr_sim_stats(t.w, &st);
  CHECK_EQ(st.resets, 2);
  end_pair(&t, ch, srv, ga, gb, s);
}

/* A server that half-closes once it read 4 bytes: the client reads the
 * answer, then EOF. */
static int half_read(nr_ctx_t *ctx, void *msg) {
  (void)msg;
  nr_channel_t *ch = nr_ctx_channel(ctx);
  nr_channel_write(ch, "bye", 3, true, NULL);
  CHECK_EQ(nr_channel_shutdown_output(ch), 0);
  return 0;
}
static const nr_handler_t half_h = {.type = "half", .channel_read = half_read};
static void half_init(nr_channel_t *ch, void *arg) {
  (void)arg;
  CHECK_EQ(nr_pipeline_add_last(nr_channel_pipeline(ch), "half", &half_h, NULL), 0);
}

TEST(a_half_close_delivers_the_answer_then_eof) {
  world_t t = world(7);
  nr_group_t *ga = group_on(&t, t.a, "a"), *gb = group_on(&t, t.b, "b");
  nr_channel_t *srv = test_take_channel(nr_server_bind(&(nr_server_opts_t){
      .group = gb, .port = 83, .child_init = half_init}));
  sink_t *s = calloc(1, sizeof *s);
  s->want = 3;
  s->full = nr_promise_new();
  nr_channel_t *ch = test_take_channel(connect_to(ga, nr_sim_host_addr(t.b), 83, s, 0));
  CHECK_EQ(nr_channel_write(ch, "ping", 4, true, NULL), 0);
  AWAIT_OK(s->full);
  CHECK(memcmp(s->buf, "bye", 3) == 0);
  AWAIT_OK(nr_channel_close_future(ch));    /* EOF closes it */
  CHECK_EQ(s->error, 0);
  end_pair(&t, ch, srv, ga, gb, s);
}

/* UDP: count what arrives. */
static _Atomic int dgrams;
static nr_promise_t *dgram_done;
static int dgram_read(nr_ctx_t *ctx, void *msg) {
  (void)ctx;
  (void)msg;
  if (++dgrams >= 100)
    nr_promise_set_success(dgram_done, NULL, NULL);
  return 0;
}
static const nr_handler_t dgram_h = {.type = "count", .channel_read = dgram_read};
static void dgram_init(nr_channel_t *ch, void *arg) {
  (void)arg;
  CHECK_EQ(nr_pipeline_add_last(nr_channel_pipeline(ch), "count", &dgram_h, NULL), 0);
}

typedef struct send_job_s {
  nr_channel_t *ch;
  nr_datagram_t *d;
} send_job_t;

static int send_1000(void *arg) {
  send_job_t *j = arg;
  nr_pipeline_t *p = nr_channel_pipeline(j->ch);
  for (int i = 0; i < 1000; i++)
    CHECK_EQ(nr_pipeline_write(p, j->d, NULL), 0);
  nr_pipeline_flush(p);
  return 0;
}

static int udp_case(uint64_t seed, double loss, double dup) {
  world_t t = world(seed);
  nr_sim_loss(t.w, loss);
  nr_sim_duplicate(t.w, dup);
  nr_group_t *ga = group_on(&t, t.a, "a"), *gb = group_on(&t, t.b, "b");
  dgrams = 0;
  dgram_done = nr_promise_new();
  nr_channel_t *rx = test_take_channel(nr_udp_bind(&(nr_udp_opts_t){
      .group = gb, .port = 53, .init = dgram_init}));
  nr_channel_t *tx = test_take_channel(nr_udp_bind(&(nr_udp_opts_t){.group = ga}));
  nr_datagram_t *d = calloc(1, sizeof *d);
  d->type = NR_MSG_DATAGRAM;
  d->data = "q";
  d->len = 1;
  struct sockaddr_in *to = (struct sockaddr_in *)&d->addr;
  to->sin_family = AF_INET;
  to->sin_port = htons(53);
  inet_pton(AF_INET, nr_sim_host_addr(t.b), &to->sin_addr);
  d->addrlen = sizeof *to;
  send_job_t job = {tx, d};
  CHECK_EQ(nr_loop_execute(nr_channel_loop(tx), send_1000, &job), 0);
  nr_promise_wait(dgram_done, NR_SEC(5));
  nr_promise_t *idle = nr_promise_new();      /* let the rest arrive */
  CHECK_EQ(nr_promise_wait(idle, NR_SEC(5)), NR_ETIMEDOUT);
  nr_promise_release(idle);
  int got = dgrams;
  free(d);
  nr_channel_release(rx);
  nr_channel_release(tx);
  SHUTDOWN_GROUP(ga);
  SHUTDOWN_GROUP(gb);
  nr_promise_release(dgram_done);
  world_end(&t);
  return got;
}

TEST(udp_datagrams_are_lost_and_duplicated_as_asked) {
  CHECK_EQ(udp_case(8, 0, 0), 1000);
  int lossy = udp_case(8, 0.2, 0);
  CHECK_GT(lossy, 700);
  CHECK_LT(lossy, 900);
  int dup = udp_case(8, 0, 0.5);
  CHECK_GT(dup, 1400);
  CHECK_LT(dup, 1600);
}

/* The same traffic twice: the trace hash of a seed is the same. */
static uint64_t traffic(uint64_t seed) {
  world_t t = world(seed);
  nr_sim_latency(t.w, t.a, t.b, NR_MS(1));
  nr_sim_loss(t.w, 0.05);
  nr_group_t *ga = nr_group_new(&(nr_group_opts_t){.name = "a", .threads = 3});
  nr_sim_host_t *old = nr_sim_set_host(t.w, t.b);
  nr_group_t *gb = nr_group_new(&(nr_group_opts_t){.name = "b", .threads = 2});
  nr_sim_set_host(t.w, old);
  nr_channel_t *srv = echo_server(gb, 7);
  enum { N = 8 };
  sink_t *s[N];
  nr_channel_t *ch[N];
  for (int i = 0; i < N; i++) {
    s[i] = calloc(1, sizeof *s[i]);
    s[i]->want = 30000;
    s[i]->full = nr_promise_new();
    ch[i] = test_take_channel(connect_to(ga, "b", 7, s[i], 0));
  }
  char msg[1000];
  for (int k = 0; k < 30; k++)
    for (int i = 0; i < N; i++) {
      memset(msg, 'a' + (k + i) % 26, sizeof msg);
      CHECK_EQ(nr_channel_write(ch[i], msg, sizeof msg, true, NULL), 0);
    }
  for (int i = 0; i < N; i++) {
    AWAIT_OK(s[i]->full);
    CHECK_EQ(s[i]->len, 30000);
    nr_channel_release(ch[i]);
    nr_promise_release(s[i]->full);
    free(s[i]);
  }
  nr_channel_release(srv);
  SHUTDOWN_GROUP(ga);
  SHUTDOWN_GROUP(gb);
  uint64_t h = nr_sim_trace_hash(t.w);
  world_end(&t);
  return h;
}

TEST(a_seed_replays_the_same_trace_and_another_seed_differs) {
  uint64_t a = traffic(42), b = traffic(42), c = traffic(43);
  CHECK(a == b);
  CHECK(a != c);
}

TEST(a_wait_nothing_can_end_fails_instead_of_hanging) {
  world_t t = world(9);
  nr_promise_t *never = nr_promise_new();
  CHECK_EQ(nr_promise_wait(never, UINT64_MAX), NR_ESIMSTUCK);
  nr_promise_release(never);
  world_end(&t);
}

TEST(virtual_time_is_what_the_clocks_say_on_the_world_thread_only) {
  world_t t = world(10);
  uint64_t v0 = nr_now();
  int64_t wall0 = nr_wall_sec();
  CHECK_EQ(wall0, 1735689600);             /* the default epoch */
  nr_promise_t *never = nr_promise_new();
  CHECK_EQ(nr_promise_wait(never, NR_SEC(3600)), NR_ETIMEDOUT);
  CHECK_EQ(nr_now() - v0, NR_SEC(3600));
  CHECK_EQ(nr_wall_sec() - wall0, 3600);
  CHECK(nr_clock_is_virtual());
  nr_promise_release(never);
  world_end(&t);
  CHECK(!nr_clock_is_virtual());
  CHECK_GT(nr_wall_sec(), 1735689600 + 3600);  /* the real one again */
}
