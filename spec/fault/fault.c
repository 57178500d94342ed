/*
 * fault.c -- a fault-injection shim for the socket specs (after OpenResty's
 * mockeagain), loaded with LD_PRELOAD. It wraps the socket calls netrun's
 * core makes -- read, recv, recvfrom, write, send, sendto, sendmsg,
 * accept, accept4, connect -- and turns some of them into what the kernel
 * may answer a program that uses non-blocking sockets:
 *
 *   short   a stream read or write moves fewer bytes than it could
 *           (one byte half the time);
 *   eagain  -1/EAGAIN although the socket is ready; a non-blocking connect
 *           that completed at once says EINPROGRESS instead;
 *   eintr   -1/EINTR, nothing moved.
 *
 * Only non-blocking sockets are touched (fstat S_ISSOCK and O_NONBLOCK or
 * MSG_DONTWAIT): never an eventfd, an epoll fd, a pipe or a file, and no
 * blocking call, for which a spurious EAGAIN is not legal. Datagrams are
 * never shortened (a short datagram read loses its tail). netrun's epoll
 * is level-triggered, so an EAGAIN on a ready socket only costs a turn of
 * the loop: the next epoll_wait reports the socket again, as mockeagain's
 * "ready again" does for edge-triggered loops.
 *
 * Environment:
 *   NETRUN_FAULT        kinds to inject, e.g. "short,eagain,eintr" (unset or
 *                       empty: the shim does nothing)
 *   NETRUN_FAULT_RATE   probability that a call is faulted (default 0.25)
 *   NETRUN_FAULT_SEED   seed of the per-thread generators (default 1)
 *   NETRUN_FAULT_PROGS  programs to fault, by name (default "netrun,lua5.4"):
 *                       others that inherit LD_PRELOAD (curl, redis-cli) are
 *                       left alone
 *   NETRUN_FAULT_STATS  if not empty, a line of counts on stderr at exit
 *
 * Any thread: the configuration is read once; each thread has its own
 * generator; the counters are atomic.
 */
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <sys/uio.h>
#include <unistd.h>

enum { F_SHORT = 1, F_EAGAIN = 2, F_EINTR = 4 };

static struct {
  unsigned kinds;             /* 0: inert */
  uint32_t threshold;         /* a call is faulted when rand32 < threshold */
  uint64_t seed;
} cfg;
static pthread_once_t once = PTHREAD_ONCE_INIT;
/* calls: those asked to move bytes, on any fd; then the faults made. */
static _Atomic uint64_t calls, shorts, eagains, eintrs, threads;

/* ---- configuration --------------------------------------------------------- */

static bool listed(const char *list, const char *name) {
  size_t n = strlen(name);
  for (const char *p = list; *p;) {
    size_t k = strcspn(p, ",");
    if (k == n && strncmp(p, name, n) == 0)
      return true;
    p += k + (p[k] == ',');
  }
  return false;
}

static void report(void) {
  fprintf(stderr, "netrun-fault: %s: %llu calls, %llu short, %llu EAGAIN, "
          "%llu EINTR\n", program_invocation_short_name,
          (unsigned long long)calls, (unsigned long long)shorts,
          (unsigned long long)eagains, (unsigned long long)eintrs);
}

static void configure(void) {
  const char *kinds = getenv("NETRUN_FAULT");
  const char *progs = getenv("NETRUN_FAULT_PROGS");
  if (kinds == NULL ||
      !listed(progs ? progs : "netrun,lua5.4", program_invocation_short_name))
    return;
  const char *rate = getenv("NETRUN_FAULT_RATE");
  const char *seed = getenv("NETRUN_FAULT_SEED");
  double r = rate ? atof(rate) : 0.25;
  r = r < 0 ? 0 : r > 1 ? 1 : r;
  cfg.threshold = (uint32_t)(r * 4294967295.0);
  cfg.seed = seed ? strtoull(seed, NULL, 0) : 1;
  cfg.kinds = (listed(kinds, "short") ? F_SHORT : 0) |
              (listed(kinds, "eagain") ? F_EAGAIN : 0) |
              (listed(kinds, "eintr") ? F_EINTR : 0);
  const char *stats = getenv("NETRUN_FAULT_STATS");
  if (cfg.kinds && stats && *stats)
    atexit(report);
}

/* ---- the dice ------------------------------------------------------------------ */

static _Thread_local uint64_t rng;

static uint32_t rand32(void) {
  if (rng == 0)               /* the seed, spread by the thread's number */
    rng = (cfg.seed + 0x9e3779b97f4a7c15ull * (atomic_fetch_add(&threads, 1) + 1)) | 1;
  rng ^= rng >> 12;           /* xorshift64* */
  rng ^= rng << 25;
  rng ^= rng >> 27;
  return (uint32_t)((rng * 0x2545f4914f6cdd1dull) >> 32);
}

/* Whether fd is a socket a fault may touch: non-blocking (or the call
 * says MSG_DONTWAIT); *stream tells a stream socket from the rest. */
static bool eligible(int fd, int flags, bool *stream) {
  struct stat st;
  if (fstat(fd, &st) < 0 || !S_ISSOCK(st.st_mode))
    return false;
  int fl = fcntl(fd, F_GETFL);
  if (fl < 0 || (!(fl & O_NONBLOCK) && !(flags & MSG_DONTWAIT)))
    return false;
  int type = 0;
  socklen_t len = sizeof type;
  *stream = getsockopt(fd, SOL_SOCKET, SO_TYPE, &type, &len) == 0 &&
            type == SOCK_STREAM;
  return true;
}

/* The fault for a call on fd moving n bytes, among `allowed` kinds: 0
 * for none. A call that moves nothing is left alone: the kernel answers a
 * zero-length recv on a connected socket with 0 at once, and LuaSocket
 * tests a connection that way. */
static int roll(int fd, int flags, size_t len, unsigned allowed,
                bool *stream) {
  pthread_once(&once, configure);
  if (cfg.kinds == 0 || len == 0)
    return 0;
  atomic_fetch_add_explicit(&calls, 1, memory_order_relaxed);
  allowed &= cfg.kinds;
  if (allowed == 0 || rand32() >= cfg.threshold)
    return 0;
  bool s = false;
  if (!eligible(fd, flags, &s))
    return 0;
  if (stream)
    *stream = s;
  if (!s)
    allowed &= ~(unsigned)F_SHORT;
  int kinds[3], n = 0;
  for (int k = F_SHORT; k <= F_EINTR; k <<= 1)
    if (allowed & (unsigned)k)
      kinds[n++] = k;
  return n ? kinds[rand32() % (unsigned)n] : 0;
}

/* The length a short transfer of n bytes moves (n > 1). */
static size_t shorten(size_t n) {
  atomic_fetch_add_explicit(&shorts, 1, memory_order_relaxed);
  return rand32() % 2 ? 1 : 1 + rand32() % (n - 1);
}

/* -1 with the error of fault f (EAGAIN or EINTR). */
static ssize_t fail(int f) {
  if (f == F_EAGAIN) {
    atomic_fetch_add_explicit(&eagains, 1, memory_order_relaxed);
    errno = EAGAIN;
  } else {
    atomic_fetch_add_explicit(&eintrs, 1, memory_order_relaxed);
    errno = EINTR;
  }
  return -1;
}

/* The next definition of name (libc's, or a sanitizer's interceptor),
 * looked up on first use; threads racing to it store the same pointer. */
static void *resolve(void *_Atomic *slot, const char *name) {
  void *p = atomic_load_explicit(slot, memory_order_relaxed);
  if (p == NULL) {
    p = dlsym(RTLD_NEXT, name);
    atomic_store_explicit(slot, p, memory_order_relaxed);
  }
  return p;
}

#define REAL(name, ret, ...)                                               \
  static void *_Atomic slot;                                               \
  ret (*real)(__VA_ARGS__) = (ret(*)(__VA_ARGS__))resolve(&slot, name)

/* ---- reads ---------------------------------------------------------------------- */

ssize_t read(int fd, void *buf, size_t n) {
  REAL("read", ssize_t, int, void *, size_t);
  int f = roll(fd, 0, n, F_SHORT | F_EAGAIN | F_EINTR, NULL);
  if (f == F_SHORT && n > 1)
    return real(fd, buf, shorten(n));
  return f == F_EAGAIN || f == F_EINTR ? fail(f) : real(fd, buf, n);
}

ssize_t recv(int fd, void *buf, size_t n, int flags) {
  REAL("recv", ssize_t, int, void *, size_t, int);
  int f = roll(fd, flags, n, F_SHORT | F_EAGAIN | F_EINTR, NULL);
  if (f == F_SHORT && n > 1)
    return real(fd, buf, shorten(n), flags);
  return f == F_EAGAIN || f == F_EINTR ? fail(f) : real(fd, buf, n, flags);
}

ssize_t recvfrom(int fd, void *buf, size_t n, int flags,
                 struct sockaddr *addr, socklen_t *alen) {
  REAL("recvfrom", ssize_t, int, void *, size_t, int, struct sockaddr *,
       socklen_t *);
  int f = roll(fd, flags, n, F_SHORT | F_EAGAIN | F_EINTR, NULL);
  if (f == F_SHORT && n > 1)          /* roll keeps datagrams whole */
    return real(fd, buf, shorten(n), flags, addr, alen);
  return f == F_EAGAIN || f == F_EINTR ? fail(f)
                                       : real(fd, buf, n, flags, addr, alen);
}

/* ---- writes --------------------------------------------------------------------- */

ssize_t write(int fd, const void *buf, size_t n) {
  REAL("write", ssize_t, int, const void *, size_t);
  int f = roll(fd, 0, n, F_SHORT | F_EAGAIN | F_EINTR, NULL);
  if (f == F_SHORT && n > 1)
    return real(fd, buf, shorten(n));
  return f == F_EAGAIN || f == F_EINTR ? fail(f) : real(fd, buf, n);
}

ssize_t send(int fd, const void *buf, size_t n, int flags) {
  REAL("send", ssize_t, int, const void *, size_t, int);
  int f = roll(fd, flags, n, F_SHORT | F_EAGAIN | F_EINTR, NULL);
  if (f == F_SHORT && n > 1)
    return real(fd, buf, shorten(n), flags);
  return f == F_EAGAIN || f == F_EINTR ? fail(f) : real(fd, buf, n, flags);
}

ssize_t sendto(int fd, const void *buf, size_t n, int flags,
               const struct sockaddr *addr, socklen_t alen) {
  REAL("sendto", ssize_t, int, const void *, size_t, int,
       const struct sockaddr *, socklen_t);
  int f = roll(fd, flags, n, F_SHORT | F_EAGAIN | F_EINTR, NULL);
  if (f == F_SHORT && n > 1)
    return real(fd, buf, shorten(n), flags, addr, alen);
  return f == F_EAGAIN || f == F_EINTR ? fail(f)
                                       : real(fd, buf, n, flags, addr, alen);
}

/* A gathered write cut to fewer bytes: the leading iovecs that fit, the
 * last one trimmed. */
ssize_t sendmsg(int fd, const struct msghdr *mh, int flags) {
  REAL("sendmsg", ssize_t, int, const struct msghdr *, int);
  size_t total = 0;
  for (size_t i = 0; i < mh->msg_iovlen; i++)
    total += mh->msg_iov[i].iov_len;
  int f = roll(fd, flags, total, F_SHORT | F_EAGAIN | F_EINTR, NULL);
  if (f == F_EAGAIN || f == F_EINTR)
    return fail(f);
  if (f != F_SHORT || total < 2 || mh->msg_iovlen > 1024)
    return real(fd, mh, flags);
  struct iovec iov[1024];
  struct msghdr m = *mh;
  size_t want = shorten(total), n = 0;
  for (size_t i = 0; i < mh->msg_iovlen && want > 0; i++, n++) {
    iov[n] = mh->msg_iov[i];
    if (iov[n].iov_len > want)
      iov[n].iov_len = want;
    want -= iov[n].iov_len;
  }
  m.msg_iov = iov;
  m.msg_iovlen = n;
  return real(fd, &m, flags);
}

/* ---- connections ---------------------------------------------------------------- */

int accept4(int fd, struct sockaddr *addr, socklen_t *alen, int flags) {
  REAL("accept4", int, int, struct sockaddr *, socklen_t *, int);
  int f = roll(fd, 0, 1, F_EAGAIN | F_EINTR, NULL);
  return f ? (int)fail(f) : real(fd, addr, alen, flags);
}

int accept(int fd, struct sockaddr *addr, socklen_t *alen) {
  REAL("accept", int, int, struct sockaddr *, socklen_t *);
  int f = roll(fd, 0, 1, F_EAGAIN | F_EINTR, NULL);
  return f ? (int)fail(f) : real(fd, addr, alen);
}

/* A non-blocking stream connect that the kernel completed at once (a unix
 * socket's) may as well have said EINPROGRESS: the socket reports itself
 * writable and SO_ERROR 0, as after any asynchronous connect. Nothing
 * else is legal for a non-blocking connect, so nothing else is injected. */
int connect(int fd, const struct sockaddr *addr, socklen_t alen) {
  REAL("connect", int, int, const struct sockaddr *, socklen_t);
  bool stream = false;
  int f = roll(fd, 0, 1, F_EAGAIN, &stream);
  int rc = real(fd, addr, alen);
  if (rc == 0 && f == F_EAGAIN && stream) {
    atomic_fetch_add_explicit(&eagains, 1, memory_order_relaxed);
    errno = EINPROGRESS;
    return -1;
  }
  return rc;
}
