/*
 * sys.h -- the transport seam: every socket, selector and wakeup syscall
 * the core makes (channel.c, connect.c, bootstrap.c, loop.c, executor.c)
 * goes through these functions, so that a simulation (runtime/sim/) can
 * serve them from its in-memory network.
 *
 * A simulated descriptor is a number at or above NR_SIM_FD_BASE (no
 * kernel hands those out: the limit on open files, nr_open, is 2^20 at
 * most by default), so each call decides by its descriptor: a real one
 * goes straight to the system call, as before, and a simulated one to the
 * table the simulation installed (nr__transport). The production cost is
 * a compare and a branch predicted not taken per call; no function
 * pointer is called. Descriptors are made by the loop that will own them
 * (nr_sys_socket, nr_sys_selector): a simulated loop (l->sim) makes
 * simulated ones.
 *
 * The functions keep the system calls' conventions (-1 and errno), so a
 * call site reads as the syscall it was. Any thread, as the syscalls.
 */
#ifndef NR_SYS_H
#define NR_SYS_H

#include <errno.h>
#include <stdbool.h>
#include <stdint.h>
#include <sys/epoll.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <sys/types.h>
#include <unistd.h>

#include "netrun.h"

#define NR_SIM_FD_BASE 0x20000000

typedef struct nr_transport_s {
  int (*socket)(nr_loop_t *l, int family, int type);
  int (*bind)(int fd, const struct sockaddr *sa, socklen_t len);
  int (*listen)(int fd, int backlog);
  int (*accept)(int fd, struct sockaddr *sa, socklen_t *len);
  int (*connect)(int fd, const struct sockaddr *sa, socklen_t len);
  ssize_t (*read)(int fd, void *buf, size_t n);
  ssize_t (*write)(int fd, const void *buf, size_t n);
  /* send, sendmsg and sendto: msg_name is the datagram's destination */
  ssize_t (*sendmsg)(int fd, const struct msghdr *m);
  ssize_t (*recvfrom)(int fd, void *buf, size_t n, struct sockaddr *sa,
                      socklen_t *len);
  int (*shutdown)(int fd, int how);
  int (*close)(int fd);
  int (*getsockopt)(int fd, int level, int name, void *v, socklen_t *len);
  int (*setsockopt)(int fd, int level, int name, const void *v,
                    socklen_t len);
  int (*getsockname)(int fd, struct sockaddr *sa, socklen_t *len);
  int (*getpeername)(int fd, struct sockaddr *sa, socklen_t *len);
  int (*ioctl)(int fd, unsigned long req, int *arg);
  /* A loop's selector and its wakeup descriptor (epoll_create1, eventfd). */
  int (*selector)(nr_loop_t *l, int *epfd, int *wakefd);
  int (*epoll_ctl)(int epfd, int op, int fd, struct epoll_event *ev);
  /* As epoll_wait, with the exact deadline (nr_now's clock) behind the
   * millisecond timeout: where a loop would block, a simulated one yields
   * to the simulation's scheduler until then. */
  int (*epoll_wait)(int epfd, struct epoll_event *ev, int max, int timeout,
                    uint64_t deadline);
} nr_transport_t;

/* The simulation's table, set while one exists (runtime/sim/). */
extern const nr_transport_t *nr__transport;

static inline bool nr__simfd(int fd) {
  return __builtin_expect(fd >= NR_SIM_FD_BASE, 0);
}

/* Descriptors are made for the loop that will own them. */
int nr_sys_socket(nr_loop_t *l, int family, int type);
int nr_sys_selector(nr_loop_t *l, int *epfd, int *wakefd);

static inline int nr_sys_bind(int fd, const struct sockaddr *sa,
                              socklen_t len) {
  return nr__simfd(fd) ? nr__transport->bind(fd, sa, len) : bind(fd, sa, len);
}

static inline int nr_sys_listen(int fd, int backlog) {
  return nr__simfd(fd) ? nr__transport->listen(fd, backlog)
                       : listen(fd, backlog);
}

static inline int nr_sys_accept(int fd, struct sockaddr *sa, socklen_t *len) {
  return nr__simfd(fd) ? nr__transport->accept(fd, sa, len)
                       : accept4(fd, sa, len, SOCK_NONBLOCK | SOCK_CLOEXEC);
}

static inline int nr_sys_connect(int fd, const struct sockaddr *sa,
                                 socklen_t len) {
  return nr__simfd(fd) ? nr__transport->connect(fd, sa, len)
                       : connect(fd, sa, len);
}

static inline ssize_t nr_sys_read(int fd, void *buf, size_t n) {
  return nr__simfd(fd) ? nr__transport->read(fd, buf, n) : read(fd, buf, n);
}

static inline ssize_t nr_sys_write(int fd, const void *buf, size_t n) {
  return nr__simfd(fd) ? nr__transport->write(fd, buf, n)
                       : write(fd, buf, n);
}

static inline ssize_t nr_sys_send(int fd, const void *buf, size_t n) {
  if (nr__simfd(fd)) {
    struct iovec iov = {(void *)buf, n};
    struct msghdr m = {.msg_iov = &iov, .msg_iovlen = 1};
    return nr__transport->sendmsg(fd, &m);
  }
  return send(fd, buf, n, MSG_NOSIGNAL);
}

static inline ssize_t nr_sys_sendmsg(int fd, const struct msghdr *m) {
  return nr__simfd(fd) ? nr__transport->sendmsg(fd, m)
                       : sendmsg(fd, m, MSG_NOSIGNAL);
}

static inline ssize_t nr_sys_sendto(int fd, const void *buf, size_t n,
                                    const struct sockaddr *sa,
                                    socklen_t len) {
  if (nr__simfd(fd)) {
    struct iovec iov = {(void *)buf, n};
    struct msghdr m = {.msg_name = (void *)sa, .msg_namelen = len,
                       .msg_iov = &iov, .msg_iovlen = 1};
    return nr__transport->sendmsg(fd, &m);
  }
  return sendto(fd, buf, n, MSG_NOSIGNAL, sa, len);
}

static inline ssize_t nr_sys_recvfrom(int fd, void *buf, size_t n,
                                      struct sockaddr *sa, socklen_t *len) {
  return nr__simfd(fd) ? nr__transport->recvfrom(fd, buf, n, sa, len)
                       : recvfrom(fd, buf, n, 0, sa, len);
}

static inline int nr_sys_shutdown(int fd, int how) {
  return nr__simfd(fd) ? nr__transport->shutdown(fd, how) : shutdown(fd, how);
}

static inline int nr_sys_close(int fd) {
  return nr__simfd(fd) ? nr__transport->close(fd) : close(fd);
}

static inline int nr_sys_getsockopt(int fd, int level, int name, void *v,
                                    socklen_t *len) {
  return nr__simfd(fd) ? nr__transport->getsockopt(fd, level, name, v, len)
                       : getsockopt(fd, level, name, v, len);
}

static inline int nr_sys_setsockopt(int fd, int level, int name,
                                    const void *v, socklen_t len) {
  return nr__simfd(fd) ? nr__transport->setsockopt(fd, level, name, v, len)
                       : setsockopt(fd, level, name, v, len);
}

static inline int nr_sys_getsockname(int fd, struct sockaddr *sa,
                                     socklen_t *len) {
  return nr__simfd(fd) ? nr__transport->getsockname(fd, sa, len)
                       : getsockname(fd, sa, len);
}

static inline int nr_sys_getpeername(int fd, struct sockaddr *sa,
                                     socklen_t *len) {
  return nr__simfd(fd) ? nr__transport->getpeername(fd, sa, len)
                       : getpeername(fd, sa, len);
}

/* SIOCOUTQ and FIONREAD: an int out. */
static inline int nr_sys_ioctl(int fd, unsigned long req, int *arg) {
  return nr__simfd(fd) ? nr__transport->ioctl(fd, req, arg)
                       : ioctl(fd, req, arg);
}

static inline int nr_sys_epoll_ctl(int epfd, int op, int fd,
                                   struct epoll_event *ev) {
  return nr__simfd(epfd) ? nr__transport->epoll_ctl(epfd, op, fd, ev)
                         : epoll_ctl(epfd, op, fd, ev);
}

static inline int nr_sys_epoll_wait(int epfd, struct epoll_event *ev, int max,
                                    int timeout, uint64_t deadline) {
  if (nr__simfd(epfd))
    return nr__transport->epoll_wait(epfd, ev, max, timeout, deadline);
  return epoll_wait(epfd, ev, max, timeout);
}

#endif /* NR_SYS_H */
