/*
 * handler.h -- native utility handlers (runtime/handler/): idle-state
 * detection and event logging. Loop thread only, like every handler.
 *
 * Each handler is a vtable (nr_handler_t) plus a state made by its _new
 * function; the pipeline owns the state once the handler is added and frees
 * it in `removed`. When adding fails, the caller frees it with free().
 */
#ifndef NR_HANDLER_H
#define NR_HANDLER_H

#include "netrun.h"

/* ---- idle state (Netty's IdleStateHandler) --------------------------------- */

/* The user event the idle handler fires (registered by idle.c). */
#define NR_MSG_IDLE (NR_MSG_NATIVE + 8)

enum { NR_IDLE_READER, NR_IDLE_WRITER, NR_IDLE_ALL };

typedef struct nr_idle_event_s {
  int type;                 /* NR_MSG_IDLE */
  int state;                /* NR_IDLE_READER, _WRITER or _ALL */
  bool first;               /* first event of this kind since the last activity */
} nr_idle_event_t;

/* "reader", "writer" or "all". */
const char *nr_idle_state_name(int state);

extern const nr_handler_t nr_idle_handler;

/* State for nr_idle_handler: timeouts in ns, 0 disables that kind. NULL on
 * out of memory. Timers start on channel_active, or when the handler is
 * added to an active channel, and stop on channel_inactive or removal.
 * Reads (channel_read) and writes (the write operation) reset them. */
void *nr_idle_new(uint64_t reader, uint64_t writer, uint64_t all);

/* ---- logging (Netty's LoggingHandler) ------------------------------------- */

extern const nr_handler_t nr_logging_handler;

/* State for nr_logging_handler: every event and operation that passes is
 * logged at `level` (NR_LOG_DEBUG..NR_LOG_ERROR) with the channel id and the
 * handler's name, then passed on unchanged. NULL on out of memory. */
void *nr_logging_new(int level);

/* ---- access log (nginx's log_format / access_log) ---------------------------- */

/* A parsed format of nginx's variables ($remote_addr, $request, $status,
 * $http_<name>, ...; access_log.c lists them), kept for the process's
 * life (the same text gives the same one). NULL and a message in err
 * for an unknown variable or a format too long. Any thread. */
typedef struct nr_access_format_s nr_access_format_t;
const nr_access_format_t *nr_access_format(const char *fmt, char *err,
                                           size_t errn);

/* After an HTTP/1.1 server codec: a line per answer in format f, queued
 * to file (nr_log_file_open). NULL on out of memory. */
extern const nr_handler_t nr_access_log_handler;
void *nr_access_log_new(const nr_access_format_t *f, nr_log_file_t *file);

#endif /* NR_HANDLER_H */
