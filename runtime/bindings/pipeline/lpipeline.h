/*
 * lpipeline.h -- what the files of Lua handlers in the C pipeline share
 * (internal to runtime/bindings/pipeline/; everything here runs on a loop
 * thread, the one whose state the handler or ctx belongs to, unless it
 * says otherwise).
 *
 *   lpipeline_handler.c  the Lua-handler vtable: its record (skip mask),
 *                        calling its methods, routing their errors
 *   lpipeline_batch.c    read batches: channel_read and
 *                        channel_read_complete, and the reads a handler
 *                        holds while its channel is unwritable
 *   lpipeline_ctx.c      the ctx objects handlers are called with
 *   lpipeline.c          the pipeline objects (p:add_last ...)
 *   lpipeline_exec.c     handlers on an executor group (a proxy handler
 *                        and the xctx)
 */
#ifndef NETRUN_LPIPELINE_H
#define NETRUN_LPIPELINE_H

#include "lnr.h"

/* What netrun learns of a handler table (or object) the first time it is
 * added in a state, shared by every channel it serves: its skip mask and
 * the two methods called per message (LUA_NOREF when absent). A userdata,
 * kept in a weak-keyed table by the handler, so it lives as long as the
 * handler does; its __gc drops the references. */
typedef struct hrec_s {
  unsigned mask;             /* what reaches it (see read batches) */
  unsigned has;              /* the methods it has */
  bool added, removed;       /* has handler_added, handler_removed */
  int read_ref, read_complete_ref;
} hrec_t;

/* Reads a Lua handler takes later (lpipeline_batch.c): the messages of one
 * read, converted, wait on the stack of a thread of their own until that
 * read's channel_read_complete, which delivers them all in one protected
 * call. One batch per state, owned by one handler at a time. */
#define LNR_BATCH_TOKENS 128
typedef struct lh_s lh_t;
typedef struct lnr_batch_s {
  lua_State *Q;               /* the messages are Q's stack, 1 .. n */
  int q_ref;                  /* anchors Q */
  lh_t *owner;                /* the handler, NULL once removed */
  nr_ctx_t *ctx;              /* its ctx, retained while messages wait */
  int n, next;                /* waiting, delivered (or dropped) */
  uint64_t tokens[LNR_BATCH_TOKENS]; /* each one's nr_ctx_read_token (a
                                 batch of held reads may be longer) */
  bool draining;              /* being delivered: reads arriving now go
                                 straight in */
  bool complete;              /* read_complete goes in the same call */
  bool may_hold;              /* the rest may wait for writability */
  bool stalled;               /* the channel turned unwritable mid-batch */
  const char *method;         /* the method being called, for errors */
} lnr_batch_t;

/* The pipeline module's part of a state: its read batch, the registry
 * references of its metatables and weak tables (lnr_push_keyed), and the
 * native handler added last (lpipeline.c): its metatable, anchored in
 * native_mt_ref (so its address stays its), and its maker. */
typedef struct lnr_pipe_part_s {
  lnr_batch_t batch;
  int recs_ref, ctx_mt_ref, ctx_handle_mt_ref, pipe_mt_ref;
  int native_mt_ref;
  const void *native_mt;
  const nr_handler_t *(*native_make)(lua_State *L, int idx, void **state);
} lnr_pipe_part_t;

extern lnr_module_t lnr_pipeline_module;

static inline lnr_pipe_part_t *lnr_pipe_part(const lnr_state_t *S) {
  return lnr_part(S, &lnr_pipeline_module);
}

/* The state of one Lua handler in one pipeline (nr_ctx_state). */
struct lh_s {
  lnr_state_t *S;
  int ref;                   /* the handler (table or object) */
  int ctx_ref;               /* the ctx table */
  const void *ctx_table;     /* its address (lua_topointer) */
  const hrec_t *rec;         /* alive while ref is */
  lua_State *held;           /* reads waiting for writability, or NULL */
  int held_ref;              /* anchors held */
  bool unhold_queued;        /* a task delivers them */
};

/* ---- lpipeline_handler.c ------------------------------------------------ */

extern const nr_handler_t lnr_lua_vt;
/* The names of the methods netrun calls: handler_added, handler_removed,
 * then the events in nr_handler_t's order; NULL past the last. */
const char *lnr_event_method(size_t i);
/* Log the function fields of the handler at idx that look like misspelled
 * events (once per table and state). */
void lnr_check_method_names(lua_State *L, int idx, const char *handler);
/* The vtable and state (*state) for the Lua handler at idx; raises. */
const nr_handler_t *lnr_make_lua_handler(lua_State *L, int idx,
                                         const char *name, void **state);
/* Free a Lua handler's state (removed, or never added). */
void lnr_lh_free(lua_State *L, lh_t *h);
/* A method call: begin pushes the message handler, the method, self and
 * ctx; the caller pushes nargs arguments; finish calls it in protected
 * mode and routes an error (lnr_lh_route_error). begin_ref takes a method
 * looked up when the handler was added (LUA_NOREF: look it up). */
lua_State *lnr_lh_begin(nr_ctx_t *ctx, const char *method);
lua_State *lnr_lh_begin_ref(nr_ctx_t *ctx, int fn_ref, const char *method);
int lnr_lh_call(nr_ctx_t *ctx, lua_State *L, int nargs);
int lnr_lh_finish(nr_ctx_t *ctx, lua_State *L, int nargs, const char *method);
/* The error on top of L, raised by the handler's `method`: to its
 * exception_caught, else on down the pipeline. Pops it. */
void lnr_lh_route_error(nr_ctx_t *ctx, lua_State *L, const char *method);
/* The end of a read at a handler with channel_read but no
 * channel_read_complete: flush what is unflushed, then pass it on. */
void lnr_read_complete_flushing(nr_ctx_t *ctx);
/* Push the future of p, or nil. */
void lnr_push_opt_promise(lua_State *L, nr_promise_t *p);

/* ---- lpipeline_batch.c -------------------------------------------------- */

/* The state is closed: a ctx its batch still holds is let go. */
void lnr_batch_close(lnr_batch_t *b);
/* The one way into a Lua handler's method (but channel_read_complete and
 * channel_writability_changed, which order themselves after what waits):
 * what waits is delivered first. False when the event goes on instead:
 * the handler left its pipeline meanwhile, or has no method for bit. */
bool lnr_lh_enter(nr_ctx_t *ctx, unsigned bit);
/* lnr_lh_enter for channel_writability_changed: what the handler holds
 * goes on if the channel is writable (now, or from a task inside a
 * batch); what is still held afterwards stays held, as this event does
 * not force it out. */
bool lnr_lh_enter_writability(nr_ctx_t *ctx);
/* A read: it waits for its read_complete when it may (one path), or is
 * called now, after what waits. */
int lnr_lh_channel_read(nr_ctx_t *ctx, void *msg);
int lnr_lh_channel_read_complete(nr_ctx_t *ctx);
/* The handler is leaving its pipeline: what waits for it is delivered,
 * what it holds goes on. */
void lnr_batch_handler_removed(nr_ctx_t *ctx);
/* Forget h (being freed): the rest of its batch goes on. */
void lnr_batch_forget(lh_t *h);

/* ---- lpipeline_ctx.c ---------------------------------------------------- */

/* Make the ctx table of a Lua handler's context, if not yet made. */
void lnr_ensure_ctx(nr_ctx_t *ctx);
/* The C context of the ctx table at idx, on its loop; raises otherwise
 * (a forwarder writes a response through it: lhttp_xfer.c). */
nr_ctx_t *lnr_check_ctx(lua_State *L, int idx);
/* Push a new ctx table for ctx (retains it). */
void lnr_push_ctx(lua_State *L, nr_ctx_t *ctx);
/* The Lua value of a context's handler: the table, or the native type. */
void lnr_push_ctx_handler(lua_State *L, nr_ctx_t *ctx);
/* The promise argument at idx, or a new one; pushes its future. */
nr_promise_t *lnr_opt_promise(lua_State *L, int idx);
/* The fire_* methods of ctx and pipeline objects alike: the event (its
 * argument at index 2) goes to the handlers after `from` (a pipeline's
 * head for p:fire_*); returns 1, the object at index 1 (chaining). A
 * message or user event must be given; raises otherwise. */
enum {
  LNR_FIRE_REGISTERED, LNR_FIRE_UNREGISTERED, LNR_FIRE_ACTIVE,
  LNR_FIRE_INACTIVE, LNR_FIRE_READ, LNR_FIRE_READ_COMPLETE,
  LNR_FIRE_USER_EVENT, LNR_FIRE_WRITABILITY, LNR_FIRE_EXCEPTION
};
int lnr_fire(lua_State *L, nr_ctx_t *from, int event);
/* Register the ctx metatables. */
void lnr_open_ctx(lua_State *L);

/* ---- lpipeline.c -------------------------------------------------------- */

/* Push a pipeline object for ch (retains it). */
void lnr_push_pipeline(lua_State *L, nr_channel_t *ch);

/* ---- lpipeline_exec.c --------------------------------------------------- */

typedef struct xh_s xh_t;
extern const nr_handler_t lnr_exec_vt;
/* The proxy for the handler at idx, run on exec for channel ch; raises. */
const nr_handler_t *lnr_make_exec_handler(lua_State *L, nr_loop_t *exec,
                                          nr_channel_t *ch, const char *name,
                                          int idx, void **state);
/* The handler in the channel's state (for p:get()), a registry ref. */
int lnr_xh_home_ref(const xh_t *x);
/* Drop a reference to the proxy (any thread). */
void lnr_xh_release(xh_t *x);
/* Register the xctx metatable. */
void lnr_open_xctx(lua_State *L);

#endif
