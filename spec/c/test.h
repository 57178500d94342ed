/*
 * test.h -- the C unit-test harness.
 *
 * Each TEST runs in its own forked child with an alarm, so a hang or crash
 * fails that test alone. Checks print both values. main() runs every test
 * (or those named on the command line) and ends with the line
 * "N passed, N failed" that CI reads.
 */
#ifndef NR_TEST_H
#define NR_TEST_H

#include <errno.h>
#include <inttypes.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "netrun.h"

typedef void (*test_fn)(void);
typedef struct test_s {
  const char *name;
  test_fn fn;
  int timeout;
} test_t;

#define TEST_MAX 128
static test_t tests_[TEST_MAX];
static int ntests_;

#define TEST_T(name, secs)                                                   \
  static void test_##name(void);                                             \
  __attribute__((constructor)) static void reg_##name(void) {                \
    tests_[ntests_++] = (test_t){#name, test_##name, secs};                  \
  }                                                                          \
  static void test_##name(void)
#define TEST(name) TEST_T(name, 30)

#define FAIL(...)                                                            \
  do {                                                                       \
    fprintf(stderr, "%s:%d: ", __FILE__, __LINE__);                          \
    fprintf(stderr, __VA_ARGS__);                                            \
    fputc('\n', stderr);                                                     \
    _exit(1);                                                                \
  } while (0)

#define CHECK(c)                                                             \
  do {                                                                       \
    if (!(c))                                                                \
      FAIL("check failed: %s", #c);                                          \
  } while (0)

#define CHECK_OP(a, op, b)                                                   \
  do {                                                                       \
    long long a_ = (long long)(a), b_ = (long long)(b);                      \
    if (!(a_ op b_))                                                         \
      FAIL("check failed: %s %s %s (%lld vs %lld)", #a, #op, #b, a_, b_);    \
  } while (0)
#define CHECK_EQ(a, b) CHECK_OP(a, ==, b)
#define CHECK_NE(a, b) CHECK_OP(a, !=, b)
#define CHECK_LT(a, b) CHECK_OP(a, <, b)
#define CHECK_LE(a, b) CHECK_OP(a, <=, b)
#define CHECK_GT(a, b) CHECK_OP(a, >, b)
#define CHECK_GE(a, b) CHECK_OP(a, >=, b)

#define CHECK_STR(a, b)                                                      \
  do {                                                                       \
    const char *a_ = (a), *b_ = (b);                                         \
    if (a_ == NULL || b_ == NULL || strcmp(a_, b_) != 0)                     \
      FAIL("check failed: %s == %s (\"%s\" vs \"%s\")", #a, #b,              \
           a_ ? a_ : "(null)", b_ ? b_ : "(null)");                          \
  } while (0)

#define CHECK_CONTAINS(hay, needle)                                          \
  do {                                                                       \
    const char *h_ = (hay), *n_ = (needle);                                  \
    if (h_ == NULL || strstr(h_, n_) == NULL)                                \
      FAIL("check failed: \"%s\" contains \"%s\"", h_ ? h_ : "(null)", n_);  \
  } while (0)

/* Wait for a future (bounded) and check it succeeded. */
#define AWAIT_OK(p)                                                          \
  do {                                                                       \
    nr_promise_t *p_ = (p);                                                  \
    CHECK_EQ(nr_promise_wait(p_, NR_SEC(10)), 0);                            \
    if (!nr_promise_is_success(p_))                                          \
      FAIL("future failed: %s", nr_promise_message(p_));                     \
  } while (0)

/* Shut a group down and wait for its termination (the clean-close proof
 * every test ends with). */
#define SHUTDOWN_GROUP(g)                                                    \
  do {                                                                       \
    nr_group_t *g_ = (g);                                                    \
    AWAIT_OK(nr_group_shutdown_gracefully(g_, 0, NR_SEC(5)));                \
    CHECK(nr_group_is_terminated(g_));                                       \
    nr_group_free(g_);                                                       \
  } while (0)

static int run_one_(const test_t *t) {
  fflush(NULL);
  pid_t pid = fork();
  if (pid == 0) {
    alarm((unsigned)t->timeout);
    t->fn();
    fflush(NULL);
    _exit(0);
  }
  int st = 0;
  waitpid(pid, &st, 0);
  if (WIFEXITED(st) && WEXITSTATUS(st) == 0)
    return 1;
  if (WIFSIGNALED(st))
    fprintf(stderr, "  %s: killed by signal %d%s\n", t->name, WTERMSIG(st),
            WTERMSIG(st) == SIGALRM ? " (timeout)" : "");
  return 0;
}

/* ---- helpers for channel tests ---------------------------------------------- */

/* The channel a successful future carries, retained for the caller. */
static inline nr_channel_t *test_take_channel(nr_promise_t *f) {
  AWAIT_OK(f);
  nr_channel_t *ch = nr_channel_retain(nr_promise_value(f));
  nr_promise_release(f);
  return ch;
}

static inline int test_local_port(nr_channel_t *ch) {
  char host[128];
  int port = 0;
  CHECK_EQ(nr_channel_local_address(ch, host, sizeof host, &port), 0);
  return port;
}

/* A child_init that makes the channel an echo. */
static inline int test_echo_read_(nr_ctx_t *ctx, void *msg) {
  return nr_ctx_write(ctx, msg, NULL);
}
static inline int test_echo_flush_(nr_ctx_t *ctx) { return nr_ctx_flush(ctx); }
static inline void test_echo_init(nr_channel_t *ch, void *arg) {
  static const nr_handler_t echo = {.type = "echo",
                                    .channel_read = test_echo_read_,
                                    .channel_read_complete = test_echo_flush_};
  (void)arg;
  CHECK_EQ(nr_pipeline_add_last(nr_channel_pipeline(ch), "echo", &echo, NULL), 0);
}

int main(int argc, char **argv) {
  int passed = 0, failed = 0;
  signal(SIGPIPE, SIG_IGN);
  for (int i = 0; i < ntests_; i++) {
    bool chosen = argc < 2;
    for (int j = 1; j < argc; j++)
      chosen |= strcmp(argv[j], tests_[i].name) == 0;
    if (!chosen)
      continue;
    int ok = run_one_(&tests_[i]);
    printf("%s %s\n", ok ? "ok  " : "FAIL", tests_[i].name);
    ok ? passed++ : failed++;
  }
  printf("%d passed, %d failed\n", passed, failed);
  return failed != 0;
}

#endif /* NR_TEST_H */
