/*
 * netrun.h -- the public C API of the netrun runtime core.
 *
 * The core reproduces Netty's NioEventLoop model: groups of single-threaded
 * loops, each owning an epoll selector, a lock-free task queue, a timer heap
 * and tail tasks; channels bound to one loop for life; handler pipelines.
 * It knows nothing of Lua: the bindings in runtime/bindings/ sit on top of it.
 *
 * Conventions:
 *  - Functions return 0 or -errno. Pointer-returning constructors return NULL
 *    and set errno.
 *  - "loop thread only" functions assert that the caller runs on the loop
 *    that owns the object; "any thread" functions may be called anywhere.
 *  - Durations are nanoseconds (uint64_t) on the monotonic clock.
 */
#ifndef NETRUN_H
#define NETRUN_H

#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/socket.h>

#define NR_VERSION "0.1.0"

typedef struct nr_loop_s nr_loop_t;
typedef struct nr_group_s nr_group_t;
typedef struct nr_promise_s nr_promise_t;
typedef struct nr_timer_s nr_timer_t;
typedef struct nr_channel_s nr_channel_t;
typedef struct nr_pipeline_s nr_pipeline_t;
typedef struct nr_ctx_s nr_ctx_t;

/* netrun's own error codes, beside negative errno values. */
#define NR_EREJECTED  (-10001)   /* task refused: executor shutting down/shut down */
#define NR_EFULL      (-10002)   /* task refused: pending-task bound reached */
#define NR_ECANCELLED (-10003)   /* future cancelled */
#define NR_ECLOSED    (-10004)   /* channel closed */
#define NR_ETOOLONG   (-10005)   /* frame longer than its limit */
#define NR_EDEADLOCK  (-10006)   /* blocking wait on an event-loop thread */
#define NR_ETIMEDOUT  (-10007)   /* operation timed out */
#define NR_EHANDLER   (-10008)   /* a handler raised (message carries details) */
#define NR_ESENDTIMEOUT (-10020) /* the peer took no bytes for send_timeout */
#define NR_ESIMSTUCK  (-10030)   /* a simulation's wait that nothing can end */

/* A short, static description of an error code. Any thread. */
const char *nr_strerror(int code);

/* Monotonic clock in nanoseconds. */
uint64_t nr_now(void);
/* The monotonic clock to within the kernel's tick (a few ms, never ahead
 * of nr_now); wall time in nanoseconds and seconds since the Unix epoch;
 * n random bytes. Inside a simulation, on its thread, each of these and
 * nr_now are its virtual clock and its seeded generator (runtime/clock.c,
 * nr_sim_*); nr_clock_is_virtual says whether the caller is there. Any
 * thread. */
uint64_t nr_now_coarse(void);
uint64_t nr_wall_ns(void);
int64_t nr_wall_sec(void);
void nr_random_bytes(void *buf, size_t n);
bool nr_clock_is_virtual(void);
#define NR_MS(x) ((uint64_t)(x) * 1000000ull)
#define NR_SEC(x) ((uint64_t)(x) * 1000000000ull)

/* ---- logging ------------------------------------------------------------ */

enum { NR_LOG_DEBUG, NR_LOG_INFO, NR_LOG_WARN, NR_LOG_ERROR, NR_LOG_OFF };
/* Level from NETRUN_LOG (debug|info|warn|error|off), default info. Each line
 * names its thread: the loop's name, or "main". Any thread; never waits for
 * stderr: a log thread writes the lines, in order, and a line that finds
 * its bounded queue full is dropped and counted ("N log lines dropped").
 * More than 10 identical lines a second are summed up ("message repeated
 * N more times: ..."). */
void nr_log(int level, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
void nr_vlog(int level, const char *fmt, va_list ap);
int nr_log_level(void);
void nr_log_set_level(int level);
/* Wait until the lines logged so far are written to stderr, for as long as
 * they are being written: 1 s without progress ends the wait (stderr may be
 * a pipe nobody reads). Runs at exit by itself; call it before _exit or
 * before writing to stderr directly. Any thread. */
void nr_log_flush(void);
/* Name of the calling thread as it appears in log lines. */
const char *nr_thread_name(void);
/* Files the log thread writes besides stderr (access logs): one per path,
 * opened for appending, living until the process ends. A line is copied
 * whole into the file's ring of `buffer` bytes under a lock held only for
 * the copy, and written by the log thread; when the ring is full (the
 * disk is slower than the lines come) the line is dropped and counted,
 * never waited for. nr_log_flush waits for them too. Any thread. */
typedef struct nr_log_file_s nr_log_file_t;
/* The file of path (the same one for the same path, its first buffer
 * kept); NULL and *err (-errno) when it cannot be opened. */
nr_log_file_t *nr_log_file_open(const char *path, size_t buffer, int *err);
/* Queue one line (with its newline); false when dropped. */
bool nr_log_file_write(nr_log_file_t *f, const char *line, size_t n);
/* Lines queued and lines dropped so far. */
void nr_log_file_counts(nr_log_file_t *f, uint64_t *lines, uint64_t *dropped);

/* ---- tasks and loops ---------------------------------------------------- */

/* A task function. A non-zero return (an error code) is logged; the loop
 * goes on. */
typedef int (*nr_task_fn)(void *arg);

/* An intrusive task: the caller owns its memory until fn runs (or the
 * submission fails). Lets hot paths submit work without allocating. */
typedef struct nr_task_s {
  struct nr_task_s *_Atomic next;
  nr_task_fn fn;
  void *arg;
  unsigned flags;                         /* internal */
} nr_task_t;

enum { NR_NOT_STARTED, NR_STARTED, NR_SHUTTING_DOWN, NR_SHUTDOWN,
       NR_TERMINATED };

/* Stall detection (runtime/stall.c). A watchdog thread notices a loop whose
 * current task or handler call has run for stall_threshold ns and asks the
 * loop's on_stall callback, on the watchdog thread, to report it
 * (NR_STALL_REPORT, once per stall) and, past stall_timeout, to interrupt it
 * (NR_STALL_INTERRUPT, again every stall_timeout while it lasts). The
 * callback must not block; it returns true if the loop thread itself will
 * report the stall (it then claims it with nr_loop_stall_claim), false to
 * let the watchdog log what it knows. It is called only between the loop's
 * on_start and on_exit. `mark` identifies the stretch of work that is stuck
 * (see nr_loop_stall_mark). */
enum { NR_STALL_REPORT = 1, NR_STALL_INTERRUPT = 2 };
typedef bool (*nr_stall_fn)(nr_loop_t *loop, int what, uint64_t busy_ns,
                            uint64_t mark, void *ud);

typedef struct nr_loop_opts_s {
  const char *name;          /* thread and log name; copied */
  int io_ratio;              /* 1..100, default 50; 100 = run all tasks */
  int rebuild_threshold;     /* spurious wakeups before a selector rebuild;
                                default 512; < 0 = never */
  size_t max_pending;        /* bound on pending tasks; 0 = unbounded */
  bool external;             /* no thread: the creating thread drives it with
                                nr_loop_run_once (used for the main thread) */
  /* Run on the loop thread when it starts and just before it terminates. */
  void (*on_start)(nr_loop_t *loop, void *ud);
  void (*on_exit)(nr_loop_t *loop, void *ud);
  void *ud;
  uint64_t stall_threshold;  /* ns; 0 = not watched (see nr_stall_fn) */
  uint64_t stall_timeout;    /* ns; 0 = stalls are never interrupted */
  nr_stall_fn on_stall;      /* called with ud; NULL: the watchdog logs */
} nr_loop_opts_t;

typedef struct nr_loop_stats_s {
  const char *name;
  int state;
  uint64_t pending_tasks, scheduled_tasks, channels, tasks_run, io_events,
      wakeups, selector_rebuilds, iterations, io_time_ns, task_time_ns;
  uint64_t stalls;           /* stalls reported (watched loops only) */
  uint64_t max_busy_ns;      /* longest run (one task, or one iteration's I/O
                                processing), timed on the loop; or the
                                watchdog's sample of one still going on */
  uint64_t busy_ns;          /* how long the current run has lasted, 0 idle */
  uint64_t lag_ns;           /* the longest recent run, less the time since
                                it ended: how long what the loop handles
                                now may have waited behind it */
} nr_loop_stats_t;
/* lag_ns alone, cheaply (netrun.limit's shed_lag reads it per request). Any
 * thread. */
uint64_t nr_loop_lag(nr_loop_t *l);

/* Create a loop (not started: the thread starts on the first task). */
nr_loop_t *nr_loop_new(const nr_loop_opts_t *opts);
/* Free a terminated loop, joining its thread. Not from the loop itself. */
void nr_loop_free(nr_loop_t *loop);
/* Keep a loop's memory (its name, state and termination future) past
 * nr_loop_free, for a handle of a loop that has no group. Any thread. */
void nr_loop_retain(nr_loop_t *loop);
void nr_loop_release(nr_loop_t *loop);

/* Any thread. Queue fn(arg); 0, NR_EREJECTED, NR_EFULL or -ENOMEM. */
int nr_loop_execute(nr_loop_t *loop, nr_task_fn fn, void *arg);
/* Any thread. Queue an intrusive task (see nr_task_t). */
int nr_loop_execute_task(nr_loop_t *loop, nr_task_t *task);
/* Any thread. A tail task, run after the current/next iteration. */
int nr_loop_after_iteration(nr_loop_t *loop, nr_task_fn fn, void *arg);
/* Any thread. Register a hook run on the loop thread during shutdown. */
int nr_loop_add_shutdown_hook(nr_loop_t *loop, nr_task_fn fn, void *arg);

bool nr_loop_in_thread(const nr_loop_t *loop);
/* The loop running the calling thread (or its external loop), else NULL. */
nr_loop_t *nr_loop_current(void);
const char *nr_loop_name(const nr_loop_t *loop);
int nr_loop_state(const nr_loop_t *loop);
bool nr_loop_is_shutting_down(const nr_loop_t *loop);  /* state >= SHUTTING_DOWN */
bool nr_loop_is_shutdown(const nr_loop_t *loop);       /* state >= SHUTDOWN */
bool nr_loop_is_terminated(const nr_loop_t *loop);
nr_group_t *nr_loop_group(const nr_loop_t *loop);
void nr_loop_stats(const nr_loop_t *loop, nr_loop_stats_t *out);  /* any thread */

/* Start graceful shutdown (Netty's shutdownGracefully): tasks keep being
 * accepted and run until none ran for `quiet` ns, or `timeout` ns elapsed.
 * Returns the termination future (borrowed). Any thread; idempotent. */
nr_promise_t *nr_loop_shutdown_gracefully(nr_loop_t *loop, uint64_t quiet,
                                          uint64_t timeout);
nr_promise_t *nr_loop_termination_future(const nr_loop_t *loop);

/* External loops only, on the creating thread: run one iteration, blocking
 * up to timeout ns (0 = poll) for tasks. Returns tasks run. */
int nr_loop_run_once(nr_loop_t *loop, uint64_t timeout);
/* Loop thread only (an external loop's creating thread): tasks are queued
 * or timers are due -- run_once would have work without waiting. */
bool nr_loop_has_pending_tasks(nr_loop_t *loop);

/* Any thread. Work owed to `loop` from elsewhere: a task it sent to
 * another loop, whose outcome comes back to it (a future's listener, a
 * task queued back, a name lookup). While any is owed, a graceful
 * shutdown keeps the loop running and its channels open (they stop
 * reading), within the shutdown's timeout, and the loop is alive. The
 * holder unholds after queueing what comes back. A hold keeps the loop's
 * memory until its unhold. */
void nr_loop_hold(nr_loop_t *loop);
void nr_loop_unhold(nr_loop_t *loop);
/* Any thread. A request `loop` waits for, under way elsewhere (a name
 * lookup): it keeps the loop alive (nr_loop_is_alive) as a hold does, but
 * does not hold its shutdown (libuv's active requests). The unref comes
 * after what the request completes was queued back. Each ref keeps the
 * loop's memory until its unref. */
void nr_loop_ref(nr_loop_t *loop);
void nr_loop_unref(nr_loop_t *loop);
/* Any thread, a snapshot: whether the loop has anything that keeps a
 * process alive (libuv's uv_loop_alive, Node's ref/unref): a task queued
 * or running, a pending timer made by nr_loop_schedule_ref, a channel
 * linked to it and not unref'd (nr_channel_set_ref), work owed to it, a
 * request it waits for (nr_loop_ref); or it is shutting down and has not
 * terminated. If mark is given, it gets a
 * number that changes whenever the loop ran or was given a task: two
 * calls with the same mark, both false, saw a loop idle in between. */
bool nr_loop_is_alive(const nr_loop_t *loop, uint64_t *mark);
/* Any thread. While watcher is set (NULL: off), a loop about to block
 * with nothing alive but its queue queues an empty task to watcher, which
 * may then look again (nr_loop_is_alive). */
void nr_loop_watch_idle(nr_loop_t *watcher);

/* Diagnostics: the current epoll fd (tests use it to provoke a spurious
 * wakeup storm, as a stale registration would). */
int nr_loop_selector_fd(const nr_loop_t *loop);

/* ---- scheduled tasks ---------------------------------------------------- */

/* Any thread. Run fn(arg) after `delay` ns; period > 0 repeats at a fixed
 * rate, period < 0 with a fixed delay of -period ns. cancel_fn(arg), if
 * given, runs on the loop thread when the task is discarded without running
 * (cancelled, or the loop shut down); a periodic task that is cancelled gets
 * it too. Returns a handle the caller releases with nr_timer_release. */
nr_timer_t *nr_loop_schedule(nr_loop_t *loop, uint64_t delay, int64_t period,
                             nr_task_fn fn, nr_task_fn cancel_fn, void *arg);
/* As nr_loop_schedule, for a timer that keeps its loop alive while it is
 * pending (nr_loop_is_alive): a program's own timers, as libuv's ref'd
 * timers. A timer made by nr_loop_schedule keeps nothing alive by itself:
 * it belongs to something that does (a channel's timeouts) or to nothing
 * a program waits for (a pool's sweeper). */
nr_timer_t *nr_loop_schedule_ref(nr_loop_t *loop, uint64_t delay,
                                 int64_t period, nr_task_fn fn,
                                 nr_task_fn cancel_fn, void *arg);
/* Any thread. 0 if cancelled now, -EALREADY if it ran or was cancelled. */
int nr_timer_cancel(nr_timer_t *t);
bool nr_timer_is_cancelled(const nr_timer_t *t);
void nr_timer_release(nr_timer_t *t);

/* ---- groups ------------------------------------------------------------- */

typedef struct nr_group_opts_s {
  const char *name;          /* loops are named "<name>-1" .. "<name>-N" */
  int threads;               /* default: number of CPUs */
  int io_ratio;              /* as nr_loop_opts_t */
  int rebuild_threshold;
  size_t max_pending;
  void (*on_start)(nr_loop_t *loop, void *ud);
  void (*on_exit)(nr_loop_t *loop, void *ud);
  void *ud;
  uint64_t stall_threshold, stall_timeout;   /* as nr_loop_opts_t */
  nr_stall_fn on_stall;
} nr_group_opts_t;

nr_group_t *nr_group_new(const nr_group_opts_t *opts);
/* Free a terminated group and its loops. Not from one of its loops. */
void nr_group_free(nr_group_t *g);
nr_loop_t *nr_group_next(nr_group_t *g);          /* round-robin, any thread */
int nr_group_size(const nr_group_t *g);
nr_loop_t *nr_group_loop(const nr_group_t *g, int i);
const char *nr_group_name(const nr_group_t *g);
nr_promise_t *nr_group_shutdown_gracefully(nr_group_t *g, uint64_t quiet,
                                           uint64_t timeout);
/* Completes once every loop of the group has terminated. */
nr_promise_t *nr_group_termination_future(const nr_group_t *g);
bool nr_group_is_shutting_down(const nr_group_t *g);
bool nr_group_is_shutdown(const nr_group_t *g);
bool nr_group_is_terminated(const nr_group_t *g);

/* ---- promises ----------------------------------------------------------- */

/* A promise is a reference-counted, thread-safe future. It completes once:
 * success with a value (owned by the promise, freed with free_fn when the
 * promise is freed), failure with a code and message, or cancellation. */
typedef void (*nr_listener_fn)(nr_promise_t *p, void *arg);

nr_promise_t *nr_promise_new(void);
nr_promise_t *nr_promise_retain(nr_promise_t *p);
void nr_promise_release(nr_promise_t *p);
/* The void promise (Netty's voidPromise): a static promise meaning "no
 * promise". It never completes: setting it, adding a listener or waiting
 * on it returns -EINVAL. Retain and release do nothing to it. */
nr_promise_t *nr_promise_void(void);
bool nr_promise_is_void(const nr_promise_t *p);

/* 0, or -EALREADY when already complete (the value is then freed), or
 * -EINVAL for the void promise. */
int nr_promise_set_success(nr_promise_t *p, void *value,
                           void (*free_fn)(void *));
int nr_promise_set_failure(nr_promise_t *p, int code, const char *msg);
int nr_promise_cancel(nr_promise_t *p);

bool nr_promise_is_done(const nr_promise_t *p);
bool nr_promise_is_success(const nr_promise_t *p);
bool nr_promise_is_cancelled(const nr_promise_t *p);
void *nr_promise_value(const nr_promise_t *p);      /* after success */
/* The destructor given with the value: tells what kind of value it is. */
void (*nr_promise_value_free_fn(const nr_promise_t *p))(void *);
int nr_promise_code(const nr_promise_t *p);         /* 0 unless failed */
const char *nr_promise_message(const nr_promise_t *p);

/* Call fn(p, arg) once when p completes, on loop `on` (NULL: on the thread
 * that completes it, or now if already complete). If `on` has shut down the
 * listener runs on the completing thread, with a warning. Any thread. */
int nr_promise_add_listener(nr_promise_t *p, nr_loop_t *on,
                            nr_listener_fn fn, void *arg);
/* The same for an arg from malloc that fn frees: should p be released
 * without ever completing (a timer a shutdown cancelled, a promise nobody
 * sets), arg is freed with the listener instead of leaking. */
int nr_promise_add_listener_owning(nr_promise_t *p, nr_loop_t *on,
                                   nr_listener_fn fn, void *arg);
/* Block until p completes or timeout ns pass (UINT64_MAX = forever).
 * On an event-loop thread returns NR_EDEADLOCK without waiting; on an
 * external loop's thread it runs that loop's tasks while waiting.
 * 0, or NR_ETIMEDOUT. */
int nr_promise_wait(nr_promise_t *p, uint64_t timeout);

/* ---- channels ----------------------------------------------------------- */

/* Pipeline messages are `void *`; every message struct starts with an int
 * type tag (Netty's instanceof), so adapters such as the Lua one know how
 * to convert what they receive. Messages are borrowed: valid only during
 * the call that passes them; a handler that keeps one copies it.
 *
 * The core's tags are this enum. A handler's own messages are declared in
 * its header (codec/http.h's NR_MSG_HTTP_REQUEST, ...): netrun's handlers
 * (codec/, handler/, tls/) take tags from NR_MSG_NATIVE, applications from
 * NR_MSG_USER, and each registers its tags with a name (nr_msg_register)
 * before any message of them is made, so two types given one tag fail at
 * start-up instead of being taken for each other. */
enum {
  NR_MSG_BYTES = 1,          /* nr_bytes_t */
  NR_MSG_SLICES,             /* nr_slices_t: gathered bytes, one write */
  NR_MSG_DATAGRAM,           /* nr_datagram_t */
  NR_MSG_LUA,                /* a Lua value (runtime/bindings/) */
  NR_MSG_EVENT,              /* nr_event_t */
  NR_MSG_FILE,               /* nr_file_region_t */
  NR_MSG_NATIVE = 16,        /* first tag of netrun's own handlers */
  NR_MSG_USER = 1000         /* first tag free for applications */
};
static inline int nr_msg_type(const void *msg) { return *(const int *)msg; }

/* Message types by tag. nr_msg_register gives `type` (> 0) its name
 * ("http_request": static, used in error text); registering a type again
 * under the same name does nothing. 0, or -EEXIST (the tag, or the name,
 * is another type's), -ENOSPC (NR_MSG_TYPES types are registered; the
 * core's are among them) or -EINVAL. nr_msg_name: the name of a registered
 * type, or NULL. Any thread. */
#define NR_MSG_TYPES 64
int nr_msg_register(int type, const char *name);
const char *nr_msg_name(int type);
/* nr_msg_register for a handler's constructor (run when the program
 * loads): a tag or name already taken aborts, naming both. */
void nr_msg_declare(int type, const char *name);
/* "a message of type http_response" (or of its number, if unregistered)
 * in buf, for error text. Any thread. */
void nr_msg_describe(int type, char *buf, size_t size);

/* Bytes. Stream channels deliver these to the first handler and accept them
 * (and nr_slices_t) on write: the bytes are copied into the outbound buffer. */
typedef struct nr_bytes_s {
  int type;                  /* NR_MSG_BYTES */
  const char *data;
  size_t len;
} nr_bytes_t;
#define NR_BYTES(d, n) ((nr_bytes_t){NR_MSG_BYTES, (d), (n)})

typedef struct nr_slice_s {
  const char *data;
  size_t len;
} nr_slice_t;

typedef struct nr_slices_s {
  int type;                  /* NR_MSG_SLICES */
  const nr_slice_t *v;
  size_t n;
} nr_slices_t;

/* A region of an open file, written to a stream channel as if its bytes
 * were (Netty's FileRegion): the channel sends it with sendfile(2) as the
 * socket drains, so it holds no memory for it; it counts toward the
 * water marks by its length. The channel keeps a dup of fd (the writer
 * may close its own at once). A file found shorter than the region when
 * its turn comes closes the channel with ENODATA: the peer was promised
 * the bytes. Handlers that transform bytes (TLS) do not take it: read
 * the file into bytes for them. */
typedef struct nr_file_region_s {
  int type;                  /* NR_MSG_FILE */
  int fd;
  uint64_t offset;
  size_t len;
} nr_file_region_t;

/* A datagram: bytes and the peer's address (destination on write). */
typedef struct nr_datagram_s {
  int type;                  /* NR_MSG_DATAGRAM */
  const char *data;
  size_t len;
  struct sockaddr_storage addr;
  socklen_t addrlen;
} nr_datagram_t;

/* An error delivered to exception_caught. The message is borrowed. */
typedef struct nr_err_s {
  int code;
  const char *msg;
} nr_err_t;

/* User events fired by the core carry the NR_MSG_EVENT tag:
 * user_event(ctx, &NR_EVT_INPUT_SHUTDOWN) when the peer half-closed and
 * allow_half_closure is set; user_event(ctx, &NR_EVT_SHUTDOWN) once, when
 * a graceful shutdown of its loop is about to close the channel (a
 * protocol may say goodbye first: nr_channel_delay_shutdown_close). */
typedef struct nr_event_s {
  int type;                  /* NR_MSG_EVENT */
  const char *name;
} nr_event_t;
extern const nr_event_t NR_EVT_INPUT_SHUTDOWN;
extern const nr_event_t NR_EVT_SHUTDOWN;

typedef struct nr_channel_opts_s {
  int tcp_nodelay;           /* default 1 */
  int keepalive;             /* default 0 */
  int sndbuf, rcvbuf;        /* 0 = system default */
  int auto_read;             /* default 1 */
  int allow_half_closure;    /* default 0: EOF closes the channel */
  size_t write_buffer_low;   /* default 32 KiB */
  size_t write_buffer_high;  /* default 64 KiB */
  int max_reads;             /* reads per readiness event, default 16 */
  int write_spin;            /* write syscalls per flush, default 16 */
  /* Close (reset) a stream channel whose peer has taken none of its
   * flushed bytes for this long (ns; 0 = never): its pending writes fail
   * and exception_caught gets NR_ESENDTIMEOUT "send timeout" (nginx's
   * send_timeout, Netty's WriteTimeoutHandler). Default 60 s; a channel
   * made by nr_connect with all-zero opts has none. */
  uint64_t send_timeout;
} nr_channel_opts_t;

/* Fill *o with the defaults. */
void nr_channel_opts_init(nr_channel_opts_t *o);

/* Run on the channel's loop once it is registered, before it is active:
 * the place to build its pipeline. */
typedef void (*nr_init_fn)(nr_channel_t *ch, void *arg);

typedef struct nr_server_opts_s {
  nr_group_t *group;         /* accepts; required unless loop is given */
  nr_loop_t *loop;           /* or accepts on this loop */
  nr_group_t *child_group;   /* serves accepted channels; default: group */
  nr_loop_t *child_loop;     /* or serves them all on this loop (default:
                                loop, when neither group is given) */
  const char *host;          /* default "0.0.0.0" */
  int port;                  /* 0 = ephemeral */
  const char *unix_path;     /* instead of host/port */
  int unix_mode;             /* the socket file's mode, narrowed by the
                                umask; 0 = 0777 (the umask alone decides) */
  int backlog;               /* default 1024 */
  bool reuseport;            /* SO_REUSEPORT; with a child group, one
                                listener per child loop, each accepting for
                                itself (the returned channel is the first
                                loop's; its close closes them all) */
  uint64_t accept_backoff;   /* pause after EMFILE, default 1 s */
  nr_channel_opts_t child;   /* defaults applied if all zero */
  nr_init_fn init;           /* for the server channel itself (optional) */
  nr_init_fn child_init;     /* for each accepted channel */
  /* For each accepted channel, once, on its loop, as it closes (when its
   * close future completes): cheaper than a listener on that future,
   * which makes a promise per connection (optional). */
  nr_init_fn child_closed;
  void *arg;                 /* passed to both inits and child_closed */
} nr_server_opts_t;

typedef struct nr_connect_opts_s {
  nr_group_t *group;         /* the channel's loop is group's next() */
  nr_loop_t *loop;           /* or this loop */
  const char *host;
  /* Or numeric addresses (at most NR_MAX_ADDRS), tried in turn on one
   * channel, IPv6 and IPv4 interleaved (RFC 8305): the next starts when
   * one fails, or beside it when it has not answered in 250 ms; the first
   * to connect is the channel's (the others are closed) and only then is
   * it active. Failing on all, the future fails with the first one's code
   * and every address's reason. timeout bounds the whole. */
  const char *const *hosts;
  int nhosts;
  int port;
  const char *unix_path;
  uint64_t timeout;          /* connect timeout, default 30 s */
  nr_channel_opts_t opts;    /* defaults applied if all zero */
  nr_init_fn init;
  void *arg;
} nr_connect_opts_t;

typedef struct nr_udp_opts_s {
  nr_group_t *group;
  nr_loop_t *loop;
  const char *host;          /* default "0.0.0.0" */
  int port;
  nr_channel_opts_t opts;
  nr_init_fn init;
  void *arg;
} nr_udp_opts_t;

/* Any thread. Each returns a future (the caller owns one reference) whose
 * value on success is the channel (nr_channel_t *, borrowed: retain it to
 * keep it). Address errors fail the future ("host:port: ECONNREFUSED"). */
nr_promise_t *nr_server_bind(const nr_server_opts_t *opts);
nr_promise_t *nr_connect(const nr_connect_opts_t *opts);
nr_promise_t *nr_udp_bind(const nr_udp_opts_t *opts);

/* ---- name resolution (resolver.c) ---------------------------------------- */

/* The addresses of a name, as text, in the resolver's order (RFC 6724),
 * each once. A promise of nr_resolve holds one (free_fn nr_addrs_free). */
#define NR_MAX_ADDRS 32
typedef struct nr_addrs_s {
  int n;
  uint32_t ttl;              /* seconds: the smallest TTL of the answer; 0
                                when it gave none (hosts file, loopback) */
  char addr[NR_MAX_ADDRS][46];
} nr_addrs_t;
void nr_addrs_free(void *addrs);

/* The answer for a name that is never sent to a server, into *out: a
 * numeric address (itself), "localhost" or a name under it (::1 then
 * 127.0.0.1, RFC 6761 §6.3, whatever /etc/hosts says). family is AF_UNSPEC,
 * AF_INET or AF_INET6. 1 if answered, 0 if the name needs the resolver,
 * -EAFNOSUPPORT for a numeric address of another family. Any thread. */
int nr_resolve_local(const char *name, int family, nr_addrs_t *out);

/* Look name up (c-ares, on the resolver's own thread, made on first use):
 * a future of an nr_addrs_t, or failed with the resolver's reason (or
 * NR_ETIMEDOUT "timed out after N s" once `timeout` ns passed; 0 = 10 s).
 * Names nr_resolve_local answers complete at once; names under "invalid"
 * fail without a query (RFC 6761 §6.4). Callers asking for one name while
 * it is looked up share the lookup. NULL only when out of memory. Any
 * thread. */
nr_promise_t *nr_resolve(const char *name, int family, uint64_t timeout);
/* The name servers lookups use from now on: "host[:port],..." as c-ares
 * takes them ("127.0.0.1:5353,[::1]:53"); NULL or "" for the environment's
 * NETRUN_DNS_SERVERS, else the system's (/etc/resolv.conf). 0, or -EINVAL
 * (a list c-ares refuses) or -ENOMEM with the reason in err. Any thread. */
int nr_resolver_set_servers(const char *csv, char *err, size_t errlen);
/* Names looked up at once (default 256) and names waiting for a slot
 * beyond those (default 4096; past it a lookup fails at once with
 * -EAGAIN). A value < 1 (< 0 for max_waiting) leaves it as it is. */
void nr_resolver_set_limits(int max_inflight, int max_waiting);
/* Fail every lookup in flight now (NR_ECANCELLED "cancelled: netrun is
 * shutting down"): the process is shutting down and waits for none. Later
 * lookups go on as usual. Any thread. */
void nr_resolver_cancel_all(void);
/* Fail every lookup in flight (NR_ECANCELLED), stop the resolver's thread
 * and wait for it (not on the resolver's thread). Lookups after it start
 * a new one. */
void nr_resolver_shutdown(void);

/* Channels are reference counted; the loop holds one while registered. */
nr_channel_t *nr_channel_retain(nr_channel_t *ch);
void nr_channel_release(nr_channel_t *ch);

uint64_t nr_channel_id(const nr_channel_t *ch);
nr_loop_t *nr_channel_loop(const nr_channel_t *ch);
nr_pipeline_t *nr_channel_pipeline(nr_channel_t *ch);
bool nr_channel_is_open(const nr_channel_t *ch);      /* any thread */
bool nr_channel_is_active(const nr_channel_t *ch);    /* any thread */
bool nr_channel_is_writable(const nr_channel_t *ch);  /* any thread */
/* Loop thread only. Whether channel_active has been fired on ch's
 * pipeline (an accepted channel is active during its init, before the
 * event): a handler added later knows the handlers around it saw it. */
bool nr_channel_fired_active(const nr_channel_t *ch);
bool nr_channel_is_server(const nr_channel_t *ch);
bool nr_channel_is_datagram(const nr_channel_t *ch);
int nr_channel_fd(const nr_channel_t *ch);
/* Bytes waiting in the outbound buffer (written but not yet sent), and
 * those a handler holds for the peer (nr_channel_hold_bytes). */
size_t nr_channel_pending_bytes(const nr_channel_t *ch);
/* Loop thread only. Work owed to the peer (a request delivered, its
 * response still being computed): while any is held, a graceful shutdown
 * leaves the channel open -- it reads nothing more -- and closes it as the
 * last hold is released, or when the shutdown times out. */
void nr_channel_hold(nr_channel_t *ch);
void nr_channel_unhold(nr_channel_t *ch);
/* Loop thread only. Bytes a handler keeps for the peer outside the
 * outbound buffer (HTTP/2 data waiting for the peer's flow-control
 * window) count toward the water marks as if they had been written (and
 * in nr_channel_pending_bytes): delta > 0 as it takes them, < 0 as they
 * go on (or are dropped). So the channel turns unwritable, and its
 * handlers stop producing, while the peer holds the window shut. */
void nr_channel_hold_bytes(nr_channel_t *ch, ptrdiff_t delta);
/* Loop thread only. A server's accepted channel is "fresh" until its peer
 * has shown it speaks: by default its first byte read. A codec whose
 * messages may drip in a byte at a time (the HTTP server codec's request
 * heads) calls nr_channel_fresh_until_message as it is added, and
 * nr_channel_established at its first whole message. When accept finds
 * no free descriptor, the server closes its oldest fresh channels to let
 * new ones in. Both do nothing to a channel that is not fresh. */
void nr_channel_fresh_until_message(nr_channel_t *ch);
void nr_channel_established(nr_channel_t *ch);
/* Loop thread only. A codec of an accepted channel says that it waits for
 * its peer and owes it nothing (idle: the HTTP server codec between
 * requests, and in a head after the first), or that a TLS server handshake
 * is under way (handshaking), or no longer. Such a channel is closed with
 * the fresh ones, oldest accepted first, when accept finds no free
 * descriptor (nginx's reusable connections). Nothing on a channel that was
 * not accepted. */
void nr_channel_set_idle(nr_channel_t *ch, bool idle);
void nr_channel_set_handshaking(nr_channel_t *ch, bool on);
/* Loop thread only. Whether ch keeps its loop alive while it is open
 * (nr_loop_is_alive; the default: yes), as Node's socket.ref()/unref():
 * an idle pooled connection does not. Ignored once ch has closed. */
void nr_channel_set_ref(nr_channel_t *ch, bool ref);
/* Loop thread only. The peer will send nothing more (a TLS close_notify)
 * and the channel is to close once its answers are out: it stops reading,
 * and closes through its pipeline (every handler's close runs, as with
 * nr_channel_close) as soon as no work is held -- from a task, so that
 * the read under way and its read_complete, where answers are written,
 * come first. Nothing if the channel is closing already. */
void nr_channel_close_when_idle(nr_channel_t *ch);
/* Loop thread only. While held the channel reads nothing, whatever
 * auto_read and read requests say: backpressure of a codec's own that the
 * application's auto_read cannot undo (the HTTP server codec's body
 * budget). Not counted: one holder. */
void nr_channel_hold_reads(nr_channel_t *ch, bool held);
/* Loop thread only. The peer may still be sending (it pipelines): a
 * graceful close half-closes and drains its input (lingering close) even
 * if none has arrived yet, so that its late bytes cannot make the kernel
 * reset the connection and destroy the last answers. */
void nr_channel_linger(nr_channel_t *ch);
/* Loop thread only. A handler told NR_EVT_SHUTDOWN that has started a
 * goodbye (a WebSocket close handshake) keeps ch open -- still reading --
 * through the shutdown until `deadline` (nr_now()'s clock), or until it is
 * closed otherwise; the shutdown's own timeout bounds it too. */
void nr_channel_delay_shutdown_close(nr_channel_t *ch, uint64_t deadline);
/* Loop thread only. Someone who moves bytes into ch from elsewhere (a
 * body from another connection) and must stop while ch cannot take more:
 * w->fn runs each time ch's writability changes (after its pipeline was
 * told), and once as ch closes. The watch holds a reference to ch until
 * nr_channel_unwatch (which may be called from fn, for any watch). w is
 * the caller's (embedded in its state); a watch is on one channel at a
 * time. Watcher and channel share the loop. */
typedef struct nr_chwatch_s nr_chwatch_t;
struct nr_chwatch_s {
  void (*fn)(nr_chwatch_t *w, nr_channel_t *ch);
  nr_channel_t *ch;                    /* watched (NULL: none) */
  nr_chwatch_t *prev, *next;
};
void nr_channel_watch(nr_channel_t *ch, nr_chwatch_t *w);
void nr_channel_unwatch(nr_chwatch_t *w);

/* Half-close: no more bytes go out (shutdown(SHUT_WR)); the peer reads
 * EOF after what was written. 0 or -errno (-ENOTCONN once closed). Loop
 * thread only. */
int nr_channel_shutdown_output(nr_channel_t *ch);
/* Format an address: "1.2.3.4" / port, or the unix path / -1. */
int nr_channel_local_address(const nr_channel_t *ch, char *host, size_t n,
                             int *port);
int nr_channel_remote_address(const nr_channel_t *ch, char *host, size_t n,
                              int *port);
/* Future completed (success) once the channel is closed and unregistered.
 * Borrowed. */
nr_promise_t *nr_channel_close_future(const nr_channel_t *ch);

/* Any thread: writes/closes from other threads are queued to the loop (the
 * bytes copied first). Outbound operations enter the pipeline at the tail.
 * `p` may be NULL (no notification). */
int nr_channel_write(nr_channel_t *ch, const void *data, size_t len,
                     bool flush, nr_promise_t *p);
int nr_channel_flush(nr_channel_t *ch);
int nr_channel_close(nr_channel_t *ch, nr_promise_t *p);
/* Close at once: drop what is queued, RST the connection. */
int nr_channel_abort(nr_channel_t *ch);
int nr_channel_read(nr_channel_t *ch);      /* request a read (auto_read off) */
int nr_channel_set_auto_read(nr_channel_t *ch, bool on);
/* Loop thread only. */
const nr_channel_opts_t *nr_channel_options(const nr_channel_t *ch);

/* Loop thread only. Set an option by name: tcp_nodelay, keepalive, sndbuf,
 * rcvbuf, allow_half_closure, write_buffer_low, write_buffer_high,
 * auto_read. 0, -ENOENT (unknown name) or -errno. */
int nr_channel_set_option(nr_channel_t *ch, const char *name, int value);
/* Loop thread only. The send timeout (ns, 0 = none); a channel blocked on
 * its peer now is timed afresh from now. */
void nr_channel_set_send_timeout(nr_channel_t *ch, uint64_t ns);
/* Format a socket address: numeric host and port, or a unix path and -1. */
int nr_format_addr(const struct sockaddr_storage *ss, socklen_t len,
                   char *host, size_t n, int *port);

/* ---- pipelines ---------------------------------------------------------- */

/* A handler is a vtable plus a per-context state pointer. NULL members pass
 * the event on and cost nothing: each context's skip mask is computed once,
 * from the non-NULL members, or from mask() when given.
 *
 * Inbound callbacks and outbound operations return 0 or an error code; an
 * error is delivered to this same handler's exception callback (Netty's
 * "exception thrown from channelRead goes to that handler's
 * exceptionCaught"). All calls happen on the channel's loop thread. */
typedef struct nr_handler_s {
  const char *type;
  void (*added)(nr_ctx_t *ctx);
  void (*removed)(nr_ctx_t *ctx);     /* free the state here */
  /* inbound */
  int (*registered)(nr_ctx_t *ctx);
  int (*unregistered)(nr_ctx_t *ctx);
  int (*active)(nr_ctx_t *ctx);
  int (*inactive)(nr_ctx_t *ctx);
  int (*channel_read)(nr_ctx_t *ctx, void *msg);
  int (*channel_read_complete)(nr_ctx_t *ctx);
  int (*user_event)(nr_ctx_t *ctx, void *evt);
  int (*writability_changed)(nr_ctx_t *ctx);
  int (*exception)(nr_ctx_t *ctx, const nr_err_t *err);
  /* outbound */
  int (*bind)(nr_ctx_t *ctx, const struct sockaddr *sa, socklen_t len,
              nr_promise_t *p);
  int (*connect)(nr_ctx_t *ctx, const struct sockaddr *sa, socklen_t len,
                 nr_promise_t *p);
  int (*disconnect)(nr_ctx_t *ctx, nr_promise_t *p);
  int (*close)(nr_ctx_t *ctx, nr_promise_t *p);
  int (*read)(nr_ctx_t *ctx);
  int (*write)(nr_ctx_t *ctx, void *msg, nr_promise_t *p);
  int (*flush)(nr_ctx_t *ctx);
  unsigned (*mask)(const struct nr_handler_s *h, void *state);
  unsigned flags;                     /* NR_HANDLER_* */
  /* A handler after this one raised on a message this one fired with a
   * token (nr_ctx_fire_read_tokened): answer for it (the HTTP codec's 500
   * in that request's turn). */
  void (*read_failed)(nr_ctx_t *ctx, uint64_t token);
} nr_handler_t;

/* Record a message for `code` on this thread and return `code`: a handler
 * returns nr_raise(NR_ETOOLONG, "frame of %zu bytes", n) and the pipeline
 * delivers that message to exception_caught. */
int nr_raise(int code, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

/* Event bits of a skip mask. */
enum {
  NR_EV_REGISTERED = 1u << 0, NR_EV_UNREGISTERED = 1u << 1,
  NR_EV_ACTIVE = 1u << 2, NR_EV_INACTIVE = 1u << 3, NR_EV_READ = 1u << 4,
  NR_EV_READ_COMPLETE = 1u << 5, NR_EV_USER_EVENT = 1u << 6,
  NR_EV_WRITABILITY = 1u << 7, NR_EV_EXCEPTION = 1u << 8,
  NR_OP_BIND = 1u << 9, NR_OP_CONNECT = 1u << 10, NR_OP_DISCONNECT = 1u << 11,
  NR_OP_CLOSE = 1u << 12, NR_OP_READ = 1u << 13, NR_OP_WRITE = 1u << 14,
  NR_OP_FLUSH = 1u << 15,
  NR_EV_ALL_INBOUND = 0x1ffu, NR_OP_ALL_OUTBOUND = 0xfe00u
};
/* The mask a vtable's non-NULL members give. */
unsigned nr_handler_mask(const nr_handler_t *h);

/* Pipeline mutation: loop thread only. 0, -EEXIST (duplicate name),
 * -ENOENT (unknown base/name), -ENOMEM, or for an add -ESHUTDOWN (the
 * channel is closed and its handlers were removed). */
int nr_pipeline_add_first(nr_pipeline_t *p, const char *name,
                          const nr_handler_t *h, void *state);
int nr_pipeline_add_last(nr_pipeline_t *p, const char *name,
                         const nr_handler_t *h, void *state);
int nr_pipeline_add_before(nr_pipeline_t *p, const char *base,
                           const char *name, const nr_handler_t *h,
                           void *state);
int nr_pipeline_add_after(nr_pipeline_t *p, const char *base,
                          const char *name, const nr_handler_t *h,
                          void *state);
int nr_pipeline_remove(nr_pipeline_t *p, const char *name);
int nr_pipeline_replace(nr_pipeline_t *p, const char *old_name,
                        const char *new_name, const nr_handler_t *h,
                        void *state);
nr_ctx_t *nr_pipeline_context(nr_pipeline_t *p, const char *name);
nr_ctx_t *nr_pipeline_first(nr_pipeline_t *p);   /* NULL when empty */
nr_ctx_t *nr_pipeline_last(nr_pipeline_t *p);
nr_channel_t *nr_pipeline_channel(nr_pipeline_t *p);
/* The embedded head and tail: firing an inbound event from the head starts
 * at the first handler; an outbound operation from the tail at the last. */
nr_ctx_t *nr_pipeline_head(nr_pipeline_t *p);
nr_ctx_t *nr_pipeline_tail(nr_pipeline_t *p);

/* Inbound events from the head; outbound operations from the tail. */
void nr_pipeline_fire_read(nr_pipeline_t *p, void *msg);
void nr_pipeline_fire_user_event(nr_pipeline_t *p, void *evt);
void nr_pipeline_fire_exception(nr_pipeline_t *p, const nr_err_t *err);
int nr_pipeline_write(nr_pipeline_t *p, void *msg, nr_promise_t *prom);
int nr_pipeline_flush(nr_pipeline_t *p);
int nr_pipeline_close(nr_pipeline_t *p, nr_promise_t *prom);

/* Context accessors and Netty's ChannelHandlerContext operations: fire_*
 * start at the next handler, outbound operations at the previous one. */
const char *nr_ctx_name(const nr_ctx_t *ctx);
void *nr_ctx_state(const nr_ctx_t *ctx);
const nr_handler_t *nr_ctx_handler(const nr_ctx_t *ctx);
nr_channel_t *nr_ctx_channel(const nr_ctx_t *ctx);
nr_pipeline_t *nr_ctx_pipeline(const nr_ctx_t *ctx);
nr_ctx_t *nr_ctx_next(const nr_ctx_t *ctx);   /* NULL at the end */
bool nr_ctx_is_removed(const nr_ctx_t *ctx);
nr_ctx_t *nr_ctx_retain(nr_ctx_t *ctx);
void nr_ctx_release(nr_ctx_t *ctx);

void nr_ctx_fire_registered(nr_ctx_t *ctx);
void nr_ctx_fire_unregistered(nr_ctx_t *ctx);
void nr_ctx_fire_active(nr_ctx_t *ctx);
void nr_ctx_fire_inactive(nr_ctx_t *ctx);
void nr_ctx_fire_read(nr_ctx_t *ctx, void *msg);
void nr_ctx_fire_read_complete(nr_ctx_t *ctx);
void nr_ctx_fire_user_event(nr_ctx_t *ctx, void *evt);
void nr_ctx_fire_writability_changed(nr_ctx_t *ctx);
void nr_ctx_fire_exception(nr_ctx_t *ctx, const nr_err_t *err);

int nr_ctx_bind(nr_ctx_t *ctx, const struct sockaddr *sa, socklen_t len,
                nr_promise_t *p);
int nr_ctx_connect(nr_ctx_t *ctx, const struct sockaddr *sa, socklen_t len,
                   nr_promise_t *p);
int nr_ctx_disconnect(nr_ctx_t *ctx, nr_promise_t *p);
int nr_ctx_close(nr_ctx_t *ctx, nr_promise_t *p);
int nr_ctx_read(nr_ctx_t *ctx);
int nr_ctx_write(nr_ctx_t *ctx, void *msg, nr_promise_t *p);
int nr_ctx_flush(nr_ctx_t *ctx);
int nr_ctx_write_and_flush(nr_ctx_t *ctx, void *msg, nr_promise_t *p);

/* ---- embedded channels (Netty's EmbeddedChannel) ------------------------ */

/* A channel with no socket, for testing handlers and codecs: inbound
 * messages are fed by hand, what reaches the tail and what is written to
 * the head is captured. It lives on `loop` and is used only on that loop's
 * thread (the main thread's external loop works). */
typedef struct nr_embedded_s nr_embedded_t;

/* Where captured messages go (borrowed: copy what you keep). NULL sink
 * members: bytes and slices are copied into the embedded channel's own
 * queues (nr_embedded_read_*), other messages raise -EINVAL. The first
 * exception that reaches the tail is kept (nr_embedded_error) unless
 * `exception` takes it. */
typedef struct nr_embedded_sink_s {
  void (*inbound)(void *ud, void *msg);
  void (*outbound)(void *ud, void *msg);
  void (*exception)(void *ud, const nr_err_t *err);
  void *ud;
} nr_embedded_sink_t;

/* Create one (not yet registered: add handlers to its pipeline, then
 * nr_embedded_start). sink may be NULL. NULL and errno on failure. */
nr_embedded_t *nr_embedded_new(nr_loop_t *loop, const nr_embedded_sink_t *sink);
nr_channel_t *nr_embedded_channel(nr_embedded_t *e);
/* Fire channel_registered and channel_active. */
void nr_embedded_start(nr_embedded_t *e);
/* Fire channel_read(msg) then, with complete, channel_read_complete. */
void nr_embedded_write_inbound(nr_embedded_t *e, void *msg, bool complete);
/* Write from the tail and flush: 0 or the write's error code. */
int nr_embedded_write_outbound(nr_embedded_t *e, void *msg);
/* Default queues: the next message's bytes (malloc'd, *len set; the caller
 * frees) or NULL when empty. */
char *nr_embedded_read_inbound(nr_embedded_t *e, size_t *len);
char *nr_embedded_read_outbound(nr_embedded_t *e, size_t *len);
/* The first exception that reached the tail since the last call (code 0
 * when none); the message stays valid until the next call or the free. */
nr_err_t nr_embedded_error(nr_embedded_t *e);
/* Close: channel_inactive, channel_unregistered, handlers removed.
 * Idempotent. */
void nr_embedded_close(nr_embedded_t *e);
/* Close and free. The channel may outlive it (handles keep references):
 * it is closed, so writes to it fail. */
void nr_embedded_free(nr_embedded_t *e);

/* The simulation's API, and what codecs and bindings use beside the API
 * above, in headers of their own (each includes this one, and this one
 * them: either name brings in all). */
#include "netrun_sim.h"
#include "netrun_embed.h"

#endif /* NETRUN_H */
