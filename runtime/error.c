/*
 * error.c -- error text: the description of a code (nr_strerror), its
 * errno-style name (nr__errname), and the message a handler raises with a
 * code (nr_raise, nr__raised).
 *
 * nr_raise records one message per thread: a handler returns
 * nr_raise(code, ...) and the pipeline, on the same thread and before any
 * other handler runs, reads it back with nr__raised(code). A message is
 * only returned for the code it was raised with, so a stale message never
 * names a later, different error. Any thread; nothing here allocates.
 */
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "error.h"
#include "netrun.h"

static _Thread_local int raised_code;
static _Thread_local char raised_msg[512];

const char *nr_strerror(int code) {
  switch (code) {
  case 0: return "success";
  case NR_EREJECTED: return "rejected: event loop is shut down";
  case NR_EFULL: return "rejected: too many pending tasks";
  case NR_ECANCELLED: return "cancelled";
  case NR_ECLOSED: return "closed";
  case NR_ETOOLONG: return "frame too long";
  case NR_EDEADLOCK: return "blocking operation on an event loop";
  case NR_ETIMEDOUT: return "timeout";
  case NR_EHANDLER: return "handler error";
  case NR_ESENDTIMEOUT: return "send timeout";
  case NR_ESIMSTUCK: return "simulation stuck: nothing can end this wait";
  default: return code < 0 ? strerror(-code) : "unknown error";
  }
}

const char *nr__errname(int code) {
  static _Thread_local char buf[128];
  if (code > -10000 && code < 0) {
    const char *name = strerrorname_np(-code);
    snprintf(buf, sizeof buf, "%s: %s", name ? name : "E?", strerror(-code));
    char *s = strstr(buf, ": ");          /* "ECONNREFUSED: connection refused" */
    if (s && s[2] >= 'A' && s[2] <= 'Z')
      s[2] = (char)(s[2] - 'A' + 'a');
    return buf;
  }
  return nr_strerror(code);
}

int nr_raise(int code, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(raised_msg, sizeof raised_msg, fmt, ap);
  va_end(ap);
  raised_code = code;
  return code;
}

const char *nr__raised_msg(int code) {
  return raised_code == code && code != 0 ? raised_msg : NULL;
}

const char *nr__raised(int code) {
  const char *msg = nr__raised_msg(code);
  return msg ? msg : nr__errname(code);
}

void nr__raise_clear(void) { raised_code = 0; }
