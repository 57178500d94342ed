/*
 * netrun_embed.h -- what codecs, native handlers and language bindings
 * use beside the public API of netrun.h: loop and group slots for the
 * embedding, reads that may wait or carry a token, writes that cost no
 * promise, error text for messages only the embedding knows. Part of
 * netrun.h, which includes it (as it includes netrun.h). Each
 * declaration says which thread may call it.
 */
#ifndef NETRUN_EMBED_H
#define NETRUN_EMBED_H

#include "netrun.h"

/* ---- for codecs and bindings -------------------------------------------- */

/* What a codec, a native handler or a language binding uses beside the
 * API above: a loop's and a group's slot for the embedding, reads that may
 * wait or that carry a token, writes that cost no promise, and error text
 * for messages only the embedding knows. An application's own C code
 * needs none of it. */

/* The embedding's data on a loop and on a group (the Lua bindings: the
 * loop's state), and a counter of the memory it spends for the loop,
 * written by the loop's thread, read from any: it lives as long as the
 * loop. */
_Atomic size_t *nr_loop_memory(nr_loop_t *l);
/* A block of *size bytes (zeroed when the loop starts) at the same address
 * in every run, for what must not depend on where memory happens to be:
 * the embedding's first block (a Lua state's, whose address seeds its
 * string hashes). A simulated loop has one (runtime/sim/: in its fiber's
 * mapping, on the loop's thread while it runs); NULL for any other. */
void *nr_loop_scratch(const nr_loop_t *l, size_t *size);
void *nr_loop_data(const nr_loop_t *loop);
void nr_loop_set_data(nr_loop_t *loop, void *data);
void *nr_group_data(const nr_group_t *g);
void nr_group_set_data(nr_group_t *g, void *data);
/* Loop thread only: the mark of the work running now (a stall's mark while
 * that stall goes on; it changes with every task and every iteration). */
uint64_t nr_loop_stall_mark(nr_loop_t *loop);
/* Any thread: true for the first caller with this mark -- the one that
 * reports the stall (the loop thread, or the watchdog when it cannot). */
bool nr_loop_stall_claim(nr_loop_t *loop, uint64_t mark);

/* Error text for a message a channel cannot write: the describer says what
 * the message is ("a number (42)") in buf, for a type the core does not
 * know (the Lua bindings describe NR_MSG_LUA), and where it was written
 * ("app.lua:12"), if it knows, in where (else ""). Set once, before any
 * loop runs; called on the writing loop's thread while the message is
 * valid (the write that made it has not returned). */
typedef void (*nr_msg_describe_fn)(const void *msg, char *buf, size_t size,
                                   char *where, size_t wsize);
void nr_set_msg_describer(nr_msg_describe_fn fn);

/* Reads. */
/* A read the handlers may take later, in order, up to the channel_read_complete
 * that ends the read (a Lua handler then runs a read's messages in one
 * protected call). A producer fires a message so when nothing it does next
 * depends on what the handlers do with it: it would parse and fire the
 * same messages either way, and a close stops the rest. Native handlers
 * see no difference; one that passes the message on as it is keeps the
 * permission. */
void nr_ctx_fire_read_deferrable(nr_ctx_t *ctx, void *msg);
void nr_pipeline_fire_read_deferrable(nr_pipeline_t *p, void *msg);
/* Whether the read of msg now being delivered may be taken later. */
bool nr_ctx_read_deferrable(const nr_ctx_t *ctx, const void *msg);
/* nr_ctx_fire_read(_deferrable) of a message the producer wants to hear
 * about if a handler fails on it: token (not 0) names it to the producer's
 * read_failed. A consumer asks for the token while msg is delivered, and
 * reports a failure with nr_ctx_read_failed from its own ctx. */
void nr_ctx_fire_read_tokened(nr_ctx_t *ctx, void *msg, uint64_t token,
                              bool deferrable);
uint64_t nr_ctx_read_token(const nr_ctx_t *ctx, const void *msg);
/* The token of the read being handled on ctx's pipeline now: the
 * innermost nr_ctx_fire_read_tokened's, or what a binding that delivers a
 * read after its fire (a Lua read batch) set with nr_ctx_set_reading
 * around its handler's call; 0 when none. The HTTP server codec answers
 * that request with a response written meanwhile. nr_ctx_set_reading
 * returns the token it replaces, for the caller to put back. Loop
 * thread. */
uint64_t nr_ctx_reading(const nr_ctx_t *ctx);
uint64_t nr_ctx_set_reading(nr_ctx_t *ctx, uint64_t token);
void nr_ctx_read_failed(nr_ctx_t *ctx, uint64_t token);

/* Writes with no promise: a write mark stands in for one. */
/* The handler's write either fails (returns an error) or, before it
 * returns, passes everything on to the next handler's write, the promise
 * with the last part. Writes through such handlers land in the outbound
 * buffer at once, so a write mark can stand in for a promise (see
 * nr_channel_write_mark): the bindings then make futures lazily. */
#define NR_HANDLER_SYNC_WRITE 1u

/* Loop thread only. A stream channel's write mark: the offset at which
 * everything written so far ends. Marks only grow. A write made without a
 * promise can be watched later by the mark taken right after it:
 * nr_channel_watch_write completes p when the bytes up to mark are
 * written (at once if they are), or fails it if they were dropped. This
 * lets bindings hand out write futures that cost nothing until used. */
uint64_t nr_channel_write_mark(const nr_channel_t *ch);
/* Loop thread only: whether bytes or datagrams were written and not
 * flushed yet. */
bool nr_channel_has_unflushed(const nr_channel_t *ch);
int nr_channel_watch_write(nr_channel_t *ch, uint64_t mark, nr_promise_t *p);
/* True when a write from ctx reaches the head of a stream channel through
 * no outbound handler, or only through NR_HANDLER_SYNC_WRITE ones (so its
 * bytes land in the outbound buffer at once, and nr_channel_write_mark
 * tells where they end). */
bool nr_ctx_writes_to_head(const nr_ctx_t *ctx);
/* Writing in place, for encoders: when a write from ctx would go straight
 * to the head of an open stream channel (no outbound handler between),
 * nr_ctx_write_reserve returns room for n bytes at the end of its outbound
 * buffer, else NULL (write as usual; NULL also when out of memory). The
 * caller writes there, calling nothing that could write meanwhile, then
 * nr_ctx_write_commit appends the m bytes written (0 < m <= n) as a
 * promise-less nr_ctx_write of them would. Loop thread, inside ctx's
 * handler's own write. */
char *nr_ctx_write_reserve(nr_ctx_t *ctx, size_t n);
void nr_ctx_write_commit(nr_ctx_t *ctx, size_t m);
/* nr_ctx_write without a promise (failures go to exception_caught, as
 * always without one), returning the first error any handler on the way
 * reported -- which a handler that passed the write on may not return. */
int nr_ctx_write_void(nr_ctx_t *ctx, void *msg);

#endif /* NETRUN_EMBED_H */
