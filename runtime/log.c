/*
 * log.c -- the runtime's logger (the clock is in clock.c, error text in
 * error.c).
 *
 * A thread that logs never waits for stderr. It formats its line and
 * appends it to a bounded byte ring under a mutex held only for the copy;
 * one log thread takes whole lines off the ring and writes them to stderr.
 * When the ring is full (stderr is a pipe nobody reads, a slow terminal)
 * the line is dropped and counted, and the first line that fits again is
 * preceded by "N log lines dropped". Lines leave in the order they entered
 * the ring, each written whole, so lines of several threads never mix.
 *
 * Identical lines (same level and text, from any thread) are rate-limited:
 * RL_BURST of them per RL_WINDOW pass, the rest are counted and summed up
 * in one line "message repeated N more times: ..." when the window
 * ends (noticed by the next such line or by the log thread's idle tick).
 *
 * nr_log_flush() waits until every line logged so far is written, as
 * long as the log thread makes progress (FLUSH_WAIT without any ends the
 * wait): at exit (atexit), when netrun.run() returns, before _exit.
 * Each line names its thread: the loop's name, or "main". The level comes
 * from NETRUN_LOG once, at first use.
 *
 * Log files (nr_log_file_*: access logs) are rings of their own, under
 * the same lock and drained by the same thread after stderr's ring: a
 * loop only ever copies a line in or drops it (counted), so a slow disk
 * costs lines, never a loop's time. A file's line is dropped whole. As
 * nginx's access_log buffer= and flush=, a file's lines are taken once an
 * eighth of its ring is held, else at the thread's tick (LOG_TICK, 1 s):
 * one wakeup and one write for many lines.
 */
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <time.h>
#include <unistd.h>

#include "internal.h"

#define RING_SIZE (256 * 1024)        /* ~1500 lines of 160 bytes */
#define CHUNK (64 * 1024)             /* written per write(2) at most */
#define LOG_LINE_MAX 2048
#define RL_SLOTS 16
#define RL_BURST 10
#define RL_WINDOW NR_SEC(1)
#define RL_SAMPLE 200
#define FLUSH_WAIT NR_SEC(1)
#define LOG_TICK 1                    /* s: the log thread's idle wait */

static _Atomic int log_level = -1;
static _Thread_local const char *thread_name;

typedef struct {
  uint64_t hash, start;               /* start: 0 = free slot */
  unsigned passed, suppressed;
  int level;
  size_t len;
  char text[RL_SAMPLE];               /* the text's first bytes */
} rl_slot_t;

static struct {
  pthread_mutex_t lock;
  pthread_cond_t more, drained;       /* to the log thread; from it */
  size_t head, len;                   /* ring: read offset, bytes held */
  uint64_t dropped, written;          /* lines dropped; bytes written */
  bool started, writing, sync_mode;   /* sync_mode: no thread, write here */
  rl_slot_t rl[RL_SLOTS];
  char ring[RING_SIZE];
} lg = {.lock = PTHREAD_MUTEX_INITIALIZER};

struct nr_log_file_s {
  struct nr_log_file_s *next;
  int fd;
  size_t head, len, size;             /* its ring, as lg's */
  uint64_t lines, dropped;
  char *ring;
  char path[];
};

static nr_log_file_t *files;          /* under lg.lock */

static int level_from_env(void) {
  const char *s = getenv("NETRUN_LOG");
  static const char *names[] = {"debug", "info", "warn", "error", "off"};
  for (int i = 0; s && i < 5; i++)
    if (strcmp(s, names[i]) == 0)
      return i;
  return NR_LOG_INFO;
}

int nr_log_level(void) {
  int l = atomic_load_explicit(&log_level, memory_order_relaxed);
  if (l < 0) {
    l = level_from_env();
    atomic_store(&log_level, l);
  }
  return l;
}

void nr_log_set_level(int level) { atomic_store(&log_level, level); }

void nr__log_set_thread_name(const char *name) { thread_name = name; }

const char *nr_thread_name(void) {
  return thread_name ? thread_name : "main";
}

/* ---- writing ------------------------------------------------------------------ */

/* Write all of buf to fd (stderr or a log file); a non-blocking one is
 * waited for with poll. Gives up on an error: there is nowhere left to
 * report it. */
static void write_fd(int fd, const char *buf, size_t n) {
  while (n > 0) {
    ssize_t w = write(fd, buf, n);
    if (w < 0 && errno == EAGAIN) {
      struct pollfd p = {.fd = fd, .events = POLLOUT};
      poll(&p, 1, 100);
      continue;
    }
    if (w < 0 && errno == EINTR)
      continue;
    if (w <= 0)
      return;
    buf += w;
    n -= (size_t)w;
  }
}

static size_t ring_space(void) { return RING_SIZE - lg.len; }

static void ring_put(const char *s, size_t n) {
  size_t tail = (lg.head + lg.len) % RING_SIZE;
  size_t first = n < RING_SIZE - tail ? n : RING_SIZE - tail;
  memcpy(lg.ring + tail, s, first);
  memcpy(lg.ring, s + first, n - first);
  lg.len += n;
}

/* Take up to CHUNK bytes of whole lines off the ring into out. */
static size_t ring_take(char *out) {
  size_t n = lg.len < CHUNK ? lg.len : CHUNK;
  size_t first = n < RING_SIZE - lg.head ? n : RING_SIZE - lg.head;
  memcpy(out, lg.ring + lg.head, first);
  memcpy(out + first, lg.ring, n - first);
  while (n > 0 && out[n - 1] != '\n')
    n--;                              /* a line cut by CHUNK waits */
  lg.head = (lg.head + n) % RING_SIZE;
  lg.len -= n;
  return n;
}

/* "<time> <LEVEL> [<thread>] " into buf; returns its length. */
static int prefix(char *buf, size_t size, int level, const char *thread) {
  static const char *tags[] = {"DEBUG", "INFO", "WARN", "ERROR"};
  struct timespec ts;
  struct tm tm;
  uint64_t wall = nr_wall_ns();            /* (a simulation's: virtual) */
  ts.tv_sec = (time_t)(wall / 1000000000ull);
  ts.tv_nsec = (long)(wall % 1000000000ull);
  gmtime_r(&ts.tv_sec, &tm);
  return snprintf(buf, size, "%04d-%02d-%02dT%02d:%02d:%02d.%03ldZ %-5s [%s] ",
                  tm.tm_year + 1900, tm.tm_mon + 1, tm.tm_mday, tm.tm_hour,
                  tm.tm_min, tm.tm_sec, ts.tv_nsec / 1000000, tags[level],
                  thread);
}

/* Once it fits, a line counting the lines dropped so far (lock held). */
static void note_drops(void) {
  if (lg.dropped == 0)
    return;
  char note[128];
  int m = prefix(note, sizeof note, NR_LOG_WARN, "log");
  m += snprintf(note + m, sizeof note - m, "%llu log lines dropped "
                "(stderr was not writable)\n", (unsigned long long)lg.dropped);
  if (ring_space() >= (size_t)m) {
    ring_put(note, (size_t)m);
    lg.dropped = 0;
  }
}

/* Append a whole line (lock held), or drop it and count. */
static void append(const char *line, size_t n) {
  note_drops();
  if (lg.dropped || ring_space() < n) {
    lg.dropped++;
    return;
  }
  ring_put(line, n);
  pthread_cond_signal(&lg.more);
}

/* ---- rate limiting (lock held) -------------------------------------------------- */

static uint64_t text_hash(int level, const char *s, size_t n) {
  uint64_t h = 1469598103934665603ull ^ (uint64_t)level;
  for (size_t i = 0; i < n; i++)
    h = (h ^ (unsigned char)s[i]) * 1099511628211ull;
  return h;
}

static void rl_summary(rl_slot_t *s) {
  if (s->suppressed == 0)
    return;
  char line[RL_SAMPLE + 192];
  int m = prefix(line, sizeof line, s->level, "log");
  m += snprintf(line + m, sizeof line - m,
                "message repeated %u more times: %.*s%s\n", s->suppressed,
                (int)(s->len < RL_SAMPLE ? s->len : RL_SAMPLE), s->text,
                s->len > RL_SAMPLE ? "..." : "");
  s->suppressed = 0;
  append(line, (size_t)m < sizeof line ? (size_t)m : sizeof line - 1);
}

/* Sum up the windows that ended (all of them if `all`). */
static void rl_sweep(uint64_t now, bool all) {
  for (int i = 0; i < RL_SLOTS; i++) {
    rl_slot_t *s = &lg.rl[i];
    if (s->start && (all || now - s->start >= RL_WINDOW)) {
      rl_summary(s);
      s->start = 0;
    }
  }
}

/* Whether a line with this text may pass; counts it if not. */
static bool rl_pass(int level, const char *text, size_t n, uint64_t now) {
  uint64_t h = text_hash(level, text, n);
  size_t cmp = n < RL_SAMPLE ? n : RL_SAMPLE;
  rl_slot_t *s = NULL, *oldest = &lg.rl[0];
  for (int i = 0; i < RL_SLOTS && s == NULL; i++) {
    rl_slot_t *c = &lg.rl[i];
    if (c->start && c->hash == h && c->level == level && c->len == n &&
        memcmp(c->text, text, cmp) == 0)
      s = c;
    else if (c->start < oldest->start)
      oldest = c;
  }
  if (s && now - s->start >= RL_WINDOW) {
    rl_summary(s);
    s->start = now;
    s->passed = 0;
  }
  if (s == NULL) {
    rl_summary(oldest);               /* its window is cut short */
    s = oldest;
    *s = (rl_slot_t){.hash = h, .start = now, .level = level, .len = n};
    memcpy(s->text, text, cmp);
  }
  if (s->passed < RL_BURST) {
    s->passed++;
    return true;
  }
  s->suppressed++;
  return false;
}

/* ---- the log thread --------------------------------------------------------------- */

static size_t file_take(nr_log_file_t *f, char *out);
static nr_log_file_t *file_pending(void);
static void write_fd(int fd, const char *buf, size_t n);

static void *log_thread(void *arg) {
  (void)arg;
  static char out[CHUNK];
  pthread_mutex_lock(&lg.lock);
  for (;;) {
    nr_log_file_t *f = NULL;
    while (lg.len == 0 && (f = file_pending()) == NULL) {
      rl_sweep(nr_now(), false);
      if (lg.len)
        break;
      struct timespec ts;
      clock_gettime(CLOCK_MONOTONIC, &ts);
      ts.tv_sec += LOG_TICK;
      pthread_cond_timedwait(&lg.more, &lg.lock, &ts);
    }
    int fd = STDERR_FILENO;
    size_t n;
    if (lg.len > 0) {
      n = ring_take(out);
    } else {
      n = file_take(f, out);
      fd = f->fd;
    }
    lg.writing = true;
    pthread_mutex_unlock(&lg.lock);
    write_fd(fd, out, n);
    pthread_mutex_lock(&lg.lock);
    lg.writing = false;
    lg.written += n;
    note_drops();
    pthread_cond_broadcast(&lg.drained);
  }
  return NULL;
}

/* A forked child has no log thread: it starts its own, and does not write
 * again what its parent still held. */
static void atfork_prepare(void) { pthread_mutex_lock(&lg.lock); }
static void atfork_parent(void) { pthread_mutex_unlock(&lg.lock); }
static void atfork_child(void) {
  lg.started = lg.writing = false;
  lg.head = lg.len = 0;
  for (nr_log_file_t *f = files; f; f = f->next)
    f->head = f->len = 0;
  pthread_mutex_unlock(&lg.lock);
}

static void flush_at_exit(void) { nr_log_flush(); }

/* Start the log thread (lock held) with every signal blocked, so signals
 * go to the threads that wait for them. Without a thread, lines are
 * written by the thread that logs, as before. */
static void start(void) {
  lg.started = true;
  pthread_condattr_t ca;
  pthread_condattr_init(&ca);
  pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
  pthread_cond_init(&lg.more, &ca);
  pthread_cond_init(&lg.drained, &ca);
  pthread_condattr_destroy(&ca);
  static bool once;
  if (!once) {
    once = true;
    pthread_atfork(atfork_prepare, atfork_parent, atfork_child);
    atexit(flush_at_exit);
  }
  sigset_t all, old;
  sigfillset(&all);
  pthread_sigmask(SIG_SETMASK, &all, &old);
  pthread_t th;
  lg.sync_mode = pthread_create(&th, NULL, log_thread, NULL) != 0;
  if (!lg.sync_mode)
    pthread_detach(th);
  pthread_sigmask(SIG_SETMASK, &old, NULL);
}

/* Waits while the log thread makes progress: a slow reader gets every
 * line, a reader that is gone costs FLUSH_WAIT. */
void nr_log_flush(void) {
  pthread_mutex_lock(&lg.lock);
  rl_sweep(0, true);
  note_drops();
  if (lg.started && !lg.sync_mode) {
    pthread_cond_signal(&lg.more);
    uint64_t seen = lg.written - 1;
    struct timespec ts;
    while (lg.len || lg.writing || lg.dropped || file_pending()) {
      if (lg.written != seen) {         /* progress: wait FLUSH_WAIT more */
        seen = lg.written;
        uint64_t end = nr_now() + FLUSH_WAIT;
        ts = (struct timespec){(time_t)(end / NR_SEC(1)),
                               (long)(end % NR_SEC(1))};
      }
      if (pthread_cond_timedwait(&lg.drained, &lg.lock, &ts) != 0 &&
          lg.written == seen)
        break;
    }
  }
  pthread_mutex_unlock(&lg.lock);
}

void nr_vlog(int level, const char *fmt, va_list ap) {
  if (level < nr_log_level() || level >= NR_LOG_OFF)
    return;
  char line[LOG_LINE_MAX];
  int n = prefix(line, sizeof line, level, nr_thread_name());
  int text = n;
  int m = vsnprintf(line + n, sizeof line - n - 1, fmt, ap);
  n = m < 0 ? n : (size_t)(n + m) >= sizeof line - 1 ? (int)sizeof line - 2
                                                     : n + m;
  line[n++] = '\n';
  uint64_t now = nr_now();
  pthread_mutex_lock(&lg.lock);
  if (!lg.started)
    start();
  if (rl_pass(level, line + text, (size_t)(n - 1 - text), now))
    append(line, (size_t)n);
  if (lg.sync_mode) {                 /* no log thread could be made */
    char out[CHUNK];
    size_t k;
    while ((k = ring_take(out)) > 0)
      write_fd(STDERR_FILENO, out, k);
  }
  pthread_mutex_unlock(&lg.lock);
}

void nr_log(int level, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  nr_vlog(level, fmt, ap);
  va_end(ap);
}

/* ---- log files ------------------------------------------------------------------- */

/* The first file with lines queued (lock held), or NULL. */
static nr_log_file_t *file_pending(void) {
  for (nr_log_file_t *f = files; f; f = f->next)
    if (f->len > 0)
      return f;
  return NULL;
}

/* Up to CHUNK bytes of f's whole lines into out (lock held). */
static size_t file_take(nr_log_file_t *f, char *out) {
  size_t n = f->len < CHUNK ? f->len : CHUNK;
  size_t first = n < f->size - f->head ? n : f->size - f->head;
  memcpy(out, f->ring + f->head, first);
  memcpy(out + first, f->ring, n - first);
  while (n > 0 && out[n - 1] != '\n')
    n--;
  f->head = (f->head + n) % f->size;
  f->len -= n;
  return n;
}

nr_log_file_t *nr_log_file_open(const char *path, size_t buffer, int *err) {
  pthread_mutex_lock(&lg.lock);
  nr_log_file_t *f = files;
  while (f && strcmp(f->path, path) != 0)
    f = f->next;
  pthread_mutex_unlock(&lg.lock);
  if (f)
    return f;
  size_t plen = strlen(path);
  if (buffer < CHUNK)
    buffer = CHUNK;                    /* a line always fits a take */
  if ((f = calloc(1, sizeof *f + plen + 1)) == NULL ||
      (f->ring = malloc(buffer)) == NULL) {
    free(f);
    *err = -ENOMEM;
    return NULL;
  }
  memcpy(f->path, path, plen + 1);
  f->size = buffer;
  f->fd = open(path, O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0644);
  if (f->fd < 0) {
    *err = -errno;
    free(f->ring);
    free(f);
    return NULL;
  }
  pthread_mutex_lock(&lg.lock);
  nr_log_file_t *twin = files;        /* opened meanwhile by another */
  while (twin && strcmp(twin->path, path) != 0)
    twin = twin->next;
  if (twin == NULL) {
    f->next = files;
    files = f;
  }
  pthread_mutex_unlock(&lg.lock);
  if (twin) {
    close(f->fd);
    free(f->ring);
    free(f);
    f = twin;
  }
  return f;
}

bool nr_log_file_write(nr_log_file_t *f, const char *line, size_t n) {
  bool queued = false;
  pthread_mutex_lock(&lg.lock);
  if (!lg.started)
    start();
  if (n <= f->size - f->len && n < CHUNK) {
    size_t tail = (f->head + f->len) % f->size;
    size_t first = n < f->size - tail ? n : f->size - tail;
    memcpy(f->ring + tail, line, first);
    memcpy(f->ring, line + first, n - first);
    f->len += n;
    f->lines++;
    queued = true;
    /* nginx's buffer= and flush=: the log thread is woken once an eighth
     * of the ring is held, else takes the lines at its tick (LOG_TICK) */
    if (f->len >= f->size / 8 && !lg.writing)
      pthread_cond_signal(&lg.more);
  } else {
    f->dropped++;
  }
  if (lg.sync_mode) {                 /* no log thread could be made */
    char out[CHUNK];
    size_t k;
    while ((k = file_take(f, out)) > 0)
      write_fd(f->fd, out, k);
  }
  pthread_mutex_unlock(&lg.lock);
  return queued;
}

void nr_log_file_counts(nr_log_file_t *f, uint64_t *lines, uint64_t *dropped) {
  pthread_mutex_lock(&lg.lock);
  *lines = f->lines;
  *dropped = f->dropped;
  pthread_mutex_unlock(&lg.lock);
}
