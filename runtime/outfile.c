/*
 * outfile.c -- file regions in a channel's outbound buffer (netrun.h's
 * nr_file_region_t, Netty's FileRegion). Loop thread only.
 *
 * A region is a chunk with no bytes (internal.h: fd >= 0, cap == end ==
 * its length): it takes its place in the stream's offsets like the bytes
 * around it, counts toward the water marks by its length, and holds a dup
 * of the writer's descriptor until it is sent or dropped (nr__chunk_put
 * closes it). So a peer that reads nothing costs a descriptor and a few
 * words, never the file's bytes; sendfile(2) moves them as the socket
 * drains. A file shorter than its region (truncated while queued or being
 * sent) fails the channel with ENODATA rather than leave the peer waiting
 * for bytes that will never come.
 */
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <sys/sendfile.h>

#include "internal.h"
#include "sys.h"

int nr__out_append_file(nr_loop_t *l, nr_outbound_t *o,
                        const nr_file_region_t *r, nr_promise_t *p) {
  if (r->len == 0) {
    if (p != NULL)
      nr_promise_set_success(p, NULL, NULL);
    return 0;
  }
  nr_chunk_t *c = malloc(sizeof *c);
  if (c == NULL)
    return -ENOMEM;
  if ((c->fd = fcntl(r->fd, F_DUPFD_CLOEXEC, 0)) < 0) {
    int err = -errno;
    free(c);
    return err;
  }
  c->next = NULL;
  c->start = 0;
  c->cap = c->end = r->len;
  c->foff = r->offset;
  if (o->tail)
    o->tail->next = c;
  else
    o->head = c;
  o->tail = c;
  /* nr__out_append of no bytes: the offsets, pending and the promise */
  o->appended += r->len;
  o->pending += r->len;
  return nr__out_append(l, o, NULL, 0, p);
}

/* sendfile(2) raises SIGPIPE on a socket the peer closed (it has no
 * MSG_NOSIGNAL). The netrun command catches it with a no-op handler; an
 * embedding program (a Lua interpreter loading the module) may not: one
 * is installed there too, once, if SIGPIPE is at its default action. */
static void no_op(int sig) { (void)sig; }
static void catch_sigpipe(void) {
  struct sigaction sa;
  if (sigaction(SIGPIPE, NULL, &sa) == 0 && sa.sa_handler == SIG_DFL &&
      !(sa.sa_flags & SA_SIGINFO)) {
    sa.sa_handler = no_op;
    sa.sa_flags = SA_RESTART;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGPIPE, &sa, NULL);
  }
}
static pthread_once_t sigpipe_once = PTHREAD_ONCE_INIT;

/* A simulated socket has no sendfile: the region goes through a buffer. */
static ssize_t copy_out(int sock, int fd, off_t off, size_t n) {
  char buf[16384];
  ssize_t r = pread(fd, buf, n < sizeof buf ? n : sizeof buf, off);
  if (r <= 0)
    return r;
  return nr_sys_send(sock, buf, (size_t)r);
}

ssize_t nr__out_sendfile(nr_outbound_t *o, int sock) {
  nr_chunk_t *c = o->head;
  uint64_t left = o->flushed - o->written;
  size_t n = c->end - c->start;
  if (n > left)
    n = (size_t)left;
  off_t off = (off_t)(c->foff + c->start);
  ssize_t w;
  if (nr__simfd(sock)) {
    w = copy_out(sock, c->fd, off, n);
  } else {
    pthread_once(&sigpipe_once, catch_sigpipe);
    w = sendfile(sock, c->fd, &off, n);
  }
  if (w == 0 && n > 0) {      /* the file ends before the region does */
    errno = ENODATA;
    return -1;
  }
  return w;
}
