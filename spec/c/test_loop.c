/*
 * test_loop.c -- the I/O loop: coalesced wakeups, no lost wakeup, timers
 * driving the select timeout, the spurious-wakeup rebuild with channels
 * still served, and io_ratio.
 */
#include <arpa/inet.h>
#include <netinet/in.h>
#include <pthread.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>

#include "test.h"

static int count(void *arg) {
  atomic_fetch_add((_Atomic long *)arg, 1);
  return 0;
}

/* A burst of cross-thread tasks costs far fewer eventfd writes than tasks:
 * a producer writes only when the loop is blocked or about to block. */
TEST(wakeups_are_coalesced) {
  nr_group_t *g = nr_group_new(&(nr_group_opts_t){.name = "wk", .threads = 1});
  nr_loop_t *l = nr_group_next(g);
  _Atomic long ran = 0;
  enum { N = 200000 };
  for (int i = 0; i < N; i++)
    while (nr_loop_execute(l, count, &ran) != 0)
      ;
  while (atomic_load(&ran) < N)
    sched_yield();
  nr_loop_stats_t st;
  nr_loop_stats(l, &st);
  fprintf(stderr, "  %d tasks, %llu eventfd writes\n", N,
          (unsigned long long)st.wakeups);
  CHECK_GE(st.tasks_run, N);
  CHECK_LT(st.wakeups, N / 4);
  SHUTDOWN_GROUP(g);
}

static int reply(void *arg) {
  nr_promise_set_success(arg, NULL, NULL);
  return 0;
}

/* Ping-pong with a loop that blocks between every task: each submission
 * must wake it (a lost wakeup would hang here). */
TEST(no_wakeup_is_lost) {
  nr_group_t *g = nr_group_new(&(nr_group_opts_t){.name = "pp", .threads = 1});
  nr_loop_t *l = nr_group_next(g);
  for (int i = 0; i < 20000; i++) {
    nr_promise_t *p = nr_promise_new();
    CHECK_EQ(nr_loop_execute(l, reply, p), 0);
    CHECK_EQ(nr_promise_wait(p, NR_SEC(5)), 0);
    nr_promise_release(p);
  }
  nr_loop_stats_t st;
  nr_loop_stats(l, &st);
  CHECK_GE(st.tasks_run, 20000);
  SHUTDOWN_GROUP(g);
}

/* ---- a small C echo server ------------------------------------------------ */

static int echo_read(nr_ctx_t *ctx, void *msg) { return nr_ctx_write(ctx, msg, NULL); }
static int echo_flush(nr_ctx_t *ctx) { return nr_ctx_flush(ctx); }
static const nr_handler_t echo = {.type = "echo", .channel_read = echo_read,
                                  .channel_read_complete = echo_flush};
static void echo_init(nr_channel_t *ch, void *arg) {
  (void)arg;
  CHECK_EQ(nr_pipeline_add_last(nr_channel_pipeline(ch), "echo", &echo, NULL), 0);
}

static nr_channel_t *start_echo(nr_group_t *g, int *port) {
  nr_promise_t *f = nr_server_bind(&(nr_server_opts_t){
      .group = g, .host = "127.0.0.1", .port = 0, .child_init = echo_init});
  AWAIT_OK(f);
  nr_channel_t *srv = nr_channel_retain(nr_promise_value(f));
  nr_promise_release(f);
  char host[64];
  CHECK_EQ(nr_channel_local_address(srv, host, sizeof host, port), 0);
  CHECK_STR(host, "127.0.0.1");
  return srv;
}

static int dial(int port) {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
  sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  CHECK_EQ(connect(fd, (struct sockaddr *)&sa, sizeof sa), 0);
  struct timeval tv = {5, 0};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  return fd;
}

static void roundtrip(int fd, const char *msg) {
  size_t n = strlen(msg);
  CHECK_EQ(write(fd, msg, n), (ssize_t)n);
  char buf[256];
  size_t got = 0;
  while (got < n) {
    ssize_t r = read(fd, buf + got, sizeof buf - got);
    CHECK_GT(r, 0);
    got += (size_t)r;
  }
  CHECK_EQ(memcmp(buf, msg, n), 0);
}

static uint64_t stat_of(nr_loop_t *l, int which) {
  nr_loop_stats_t st;
  nr_loop_stats(l, &st);
  return which ? st.iterations : st.selector_rebuilds;
}

/* A stale registration that is always ready (what a buggy selector or a
 * dup'd-then-closed fd does to epoll) makes every select return at once
 * with nothing to do. After the threshold the loop rebuilds its selector
 * exactly once; the storm ends and every channel is still served. */
TEST(spurious_wakeup_storm_rebuilds_selector_once) {
  nr_group_t *g = nr_group_new(&(nr_group_opts_t){.name = "st", .threads = 1});
  nr_loop_t *l = nr_group_next(g);
  int port;
  nr_channel_t *srv = start_echo(g, &port);
  int fd = dial(port);
  roundtrip(fd, "before the storm");

  int efd = eventfd(1, EFD_CLOEXEC);                 /* always readable */
  struct epoll_event ev = {.events = EPOLLIN, .data.ptr = NULL};
  CHECK_EQ(epoll_ctl(nr_loop_selector_fd(l), EPOLL_CTL_ADD, efd, &ev), 0);
  uint64_t deadline = nr_now() + NR_SEC(5);
  while (stat_of(l, 0) == 0 && nr_now() < deadline)
    usleep(1000);
  CHECK_EQ(stat_of(l, 0), 1);
  /* The storm is over: the loop idles instead of spinning. */
  uint64_t it0 = stat_of(l, 1);
  usleep(200000);
  CHECK_LT(stat_of(l, 1) - it0, 50);
  CHECK_EQ(stat_of(l, 0), 1);
  roundtrip(fd, "after the storm, same connection");
  int fd2 = dial(port);
  roundtrip(fd2, "after the storm, new connection");
  close(fd);
  close(fd2);
  close(efd);
  nr_channel_release(srv);
  SHUTDOWN_GROUP(g);
}

TEST(rebuild_can_be_turned_off) {
  nr_group_t *g = nr_group_new(&(nr_group_opts_t){
      .name = "off", .threads = 1, .rebuild_threshold = -1});
  nr_loop_t *l = nr_group_next(g);
  _Atomic long ran = 0;
  nr_loop_execute(l, count, &ran);                   /* start it */
  int efd = eventfd(1, EFD_CLOEXEC);
  struct epoll_event ev = {.events = EPOLLIN, .data.ptr = NULL};
  CHECK_EQ(epoll_ctl(nr_loop_selector_fd(l), EPOLL_CTL_ADD, efd, &ev), 0);
  uint64_t it0 = stat_of(l, 1);
  while (stat_of(l, 1) - it0 < 2000)
    sched_yield();
  CHECK_EQ(stat_of(l, 0), 0);
  epoll_ctl(nr_loop_selector_fd(l), EPOLL_CTL_DEL, efd, NULL);
  close(efd);
  SHUTDOWN_GROUP(g);
}

typedef struct at_s {
  uint64_t at;
  nr_promise_t *done;
} at_t;

static int stamp(void *arg) {
  at_t *a = arg;
  a->at = nr_now();
  nr_promise_set_success(a->done, NULL, NULL);
  return 0;
}

/* An idle loop blocks until its next timer, neither earlier nor much
 * later, and does not spin meanwhile. */
TEST(select_blocks_until_the_next_deadline) {
  nr_group_t *g = nr_group_new(&(nr_group_opts_t){.name = "dl", .threads = 1});
  nr_loop_t *l = nr_group_next(g);
  at_t a = {0, nr_promise_new()};
  uint64_t t0 = nr_now();
  nr_timer_t *t = nr_loop_schedule(l, NR_MS(150), 0, stamp, NULL, &a);
  AWAIT_OK(a.done);
  CHECK_GE(a.at - t0, NR_MS(150));
  CHECK_LT(a.at - t0, NR_MS(400));
  CHECK_LT(stat_of(l, 1), 20);
  nr_timer_release(t);
  nr_promise_release(a.done);
  SHUTDOWN_GROUP(g);
}

typedef struct self_s {
  nr_loop_t *l;
  _Atomic long n;
  _Atomic long limit;
} self_t;

static int resubmit(void *arg) {
  self_t *s = arg;
  if (atomic_fetch_add(&s->n, 1) < s->limit)
    nr_loop_execute(s->l, resubmit, s);
  return 0;
}

/* With io_ratio < 100 a task that keeps resubmitting itself cannot starve
 * I/O: channels are still served meanwhile. */
TEST(io_ratio_keeps_io_flowing_under_task_load) {
  nr_group_t *g = nr_group_new(&(nr_group_opts_t){.name = "ior", .threads = 1,
                                                  .io_ratio = 50});
  nr_loop_t *l = nr_group_next(g);
  int port;
  nr_channel_t *srv = start_echo(g, &port);
  int fd = dial(port);
  self_t s = {.l = l, .limit = 3000000};
  nr_loop_execute(l, resubmit, &s);
  for (int i = 0; i < 50; i++)
    roundtrip(fd, "served while tasks run");
  CHECK_LT(atomic_load(&s.n), s.limit);   /* the echoes did not wait for it */
  s.limit = 0;
  close(fd);
  nr_channel_release(srv);
  SHUTDOWN_GROUP(g);
}
