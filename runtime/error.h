/*
 * error.h -- netrun's one home for error text (error.c).
 *
 * Codes are 0 or negative: -errno, or one of netrun's own NR_E* codes
 * (netrun.h, below -10000). Their public face is in netrun.h
 * (nr_strerror, nr_raise); this header adds what the runtime's own files
 * use to name a code and to recover the message a handler raised with.
 * Any thread: what nr_raise records is per thread.
 */
#ifndef NR_ERROR_H
#define NR_ERROR_H

/* "ECONNREFUSED: connection refused" style text for a -errno code;
 * nr_strerror's text for netrun's own codes. The text of an errno code
 * lives in a per-thread buffer, valid until the thread's next call. */
const char *nr__errname(int code);
/* The message last given to nr_raise for `code` on this thread, else the
 * code's name (nr__errname). */
const char *nr__raised(int code);
/* The message last given to nr_raise for `code` on this thread, or NULL
 * (never for code 0). */
const char *nr__raised_msg(int code);
/* Forget the recorded message: before a call whose raise is to be told
 * apart from an older one. */
void nr__raise_clear(void);

#endif
