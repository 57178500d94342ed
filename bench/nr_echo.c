/*
 * nr_echo.c -- the echo server of the benchmarks built on netrun's C core:
 * one loop that accepts and serves, a C echo handler in the pipeline.
 *
 * Usage: nr_echo PORT [loops, default 1]
 */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>

#include "netrun.h"

static int echo_read(nr_ctx_t *ctx, void *msg) { return nr_ctx_write(ctx, msg, NULL); }
static int echo_flush(nr_ctx_t *ctx) { return nr_ctx_flush(ctx); }
static const nr_handler_t echo = {.type = "echo", .channel_read = echo_read,
                                  .channel_read_complete = echo_flush};

static void init(nr_channel_t *ch, void *arg) {
  (void)arg;
  nr_pipeline_add_last(nr_channel_pipeline(ch), "echo", &echo, NULL);
}

int main(int argc, char **argv) {
  if (argc < 2) {
    fprintf(stderr, "usage: nr_echo PORT [loops]\n");
    return 2;
  }
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGINT);
  sigaddset(&set, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &set, NULL);        /* loops inherit the mask */
  signal(SIGPIPE, SIG_IGN);
  nr_group_t *g = nr_group_new(&(nr_group_opts_t){
      .name = "echo", .threads = argc > 2 ? atoi(argv[2]) : 1});
  nr_promise_t *f = nr_server_bind(&(nr_server_opts_t){
      .group = g, .host = "127.0.0.1", .port = atoi(argv[1]),
      .child_init = init});
  nr_promise_wait(f, UINT64_MAX);
  if (!nr_promise_is_success(f)) {
    fprintf(stderr, "nr_echo: %s\n", nr_promise_message(f));
    return 1;
  }
  char host[64];
  int port;
  nr_channel_local_address(nr_promise_value(f), host, sizeof host, &port);
  printf("listening on %d\n", port);
  fflush(stdout);
  int sig;
  sigwait(&set, &sig);
  nr_promise_wait(nr_group_shutdown_gracefully(g, 0, NR_SEC(2)), UINT64_MAX);
  nr_promise_release(f);
  nr_group_free(g);
  return 0;
}
