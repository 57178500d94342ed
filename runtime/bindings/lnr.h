/*
 * lnr.h -- internals of the Lua bindings (runtime/bindings/). Only these files
 * include both lua.h and netrun.h.
 *
 * Threading: every lua_State belongs to one thread -- the main thread (the
 * state that required "netrun") or a loop thread (its own state, created on
 * that thread). Nothing here touches a lua_State from another thread: values
 * cross threads as blobs (transfer.c) and run as tasks on the owner's loop.
 */
#ifndef LNR_H
#define LNR_H

#include <assert.h>
#include <errno.h>
#include <lauxlib.h>
#include <lua.h>
#include <lualib.h>
#include <stdatomic.h>

#include "lmain.h"
#include "netrun.h"
#include "lopts.h"

typedef struct lnr_blob_s lnr_blob_t;

/* Stack balance (STYLE.md: "stack-balanced calls checked by a debug
 * macro"). An entry point from C into Lua -- a handler call, a task, a
 * promise listener -- opens with LNR_STACK_BEGIN(L) and, where it is done
 * with the stack, LNR_STACK_END(L, n) checks that it left exactly n slots
 * more than it found (0: balanced; negative: it consumed its arguments).
 * A slot leaked per event grows the state's stack without bound; a slot
 * too many popped takes the caller's value. Checked in the Debug ASan
 * build (LNR_STACK_CHECK, set by CMake), where a mismatch aborts naming
 * the function and both tops; elsewhere both macros are nothing. Handler
 * calls, which begin in one function and end in another, keep their marks
 * in the state (LNR_STACK_MARK / LNR_STACK_UNMARK, lpipeline_handler.c). */
#if defined(LNR_STACK_CHECK) && !defined(NDEBUG)
#define LNR_STACK_CHECKED 1
#define LNR_STACK_MARKS 64
void lnr_stack_mismatch(const char *where, int got, int want);
#define LNR_STACK_BEGIN(L) const int lnr_stack_top_ = lua_gettop(L)
#define LNR_STACK_END(L, n)                                                 \
  do {                                                                      \
    int got_ = lua_gettop(L), want_ = lnr_stack_top_ + (n);                 \
    if (got_ != want_)                                                      \
      lnr_stack_mismatch(__func__, got_, want_);                            \
  } while (0)
#else
#define LNR_STACK_CHECKED 0
#define LNR_STACK_BEGIN(L) ((void)0)
#define LNR_STACK_END(L, n) ((void)0)
#endif

/* ---- per-state context -------------------------------------------------- */

/* A loop state's small blocks (lstate.c): size classes of 16 bytes up to
 * 256, each a free list, carved from 16 KiB pages kept until the state is
 * closed. Lua makes and frees such blocks for every message (strings,
 * tables, futures); this is several times cheaper than malloc and free.
 * Medium blocks (up to 64 KiB: a read's string, say) come from malloc in
 * size classes, and freed ones are kept for the next, up to a bound
 * (glibc's own cache stops at 1 KiB). */
#define LNR_POOL_CLASSES 16
#define LNR_MEDIUM_CLASSES 32         /* 320 B .. 64 KiB, four a doubling */
typedef struct lnr_pool_s {
  void *free[LNR_POOL_CLASSES];
  char *cur, *end;              /* the page being carved */
  void *pages;                  /* every page, linked through its start */
  void *mfree[LNR_MEDIUM_CLASSES];
  size_t mkept;                 /* bytes on the medium lists */
} lnr_pool_t;

/* Registry references the kernel itself fetches on every message: an
 * array read, where a registry lookup by pointer or name walks a hash
 * chain. A feature keeps its own such references in its part (below) and
 * reads them through lnr_push_ref / lnr_push_keyed. */
enum { LNR_SLOT_VOID, LNR_KEYED_HANDLES, LNR_KEYED_CHANNEL_MT, LNR_NSLOTS };

typedef struct lnr_module_s lnr_module_t;

/* A state's context: the kernel's fields here, then each module's part
 * (lnr_part), in one block made with the state and freed after it. */
typedef struct lnr_state_s {
  lua_State *L;
  int slots[LNR_NSLOTS];      /* registry refs; 0: not set yet */
  lnr_pool_t pool;
  nr_loop_t *loop;            /* the loop this state runs on (main: external) */
  bool main;
  bool closing;               /* the state is being closed: run no more tasks */
  _Atomic size_t *memory;     /* bytes allocated by this state: the
                                 loop's counter (nr_loop_memory), which
                                 outlives the state */
  /* lua_memory_limit (lstate.c, "the memory limit"): SIZE_MAX when off. */
  size_t mem_limit;
  size_t mem_refused;         /* the size refused last (Lua retries it) */
  bool mem_reserve;           /* refused: the reserve is open */
  bool converting;            /* the bindings push values for a call */
  int resuming;               /* coroutines resumed from C */
  /* The current call. The ctx of the Lua handler called last
   * (lpipeline_handler.c): its table's address and C context, so that
   * ctx:write knows it without reading the table. NULL when that handler
   * has left its pipeline. */
  const void *ctx_table;
  nr_ctx_t *ctx;
  /* The read being handled (lpipeline_batch.c, lpipeline_exec.c): the ctx
   * (or executor proxy) of the Lua handler whose channel_read runs, and
   * the read's token, when its producer asked to hear of a failure
   * (nr_ctx_read_token: the HTTP codec, which answers 500). What that
   * handler fires on from this ctx carries the token, so a handler after
   * it that raises is answered for too, however many stand between. */
  const void *read_ctx;
  uint64_t read_token;
  /* The thread of this state, besides L, that handlers are called on
   * (the pipeline's read batch), once made: lnr_state finds the state of
   * either without a registry lookup. */
  lua_State *call_thread;
  /* This state's proxy of the void promise, kept in LNR_SLOT_VOID (so its
   * address stays): a write tells it by address. NULL until made. */
  const void *void_proxy;
  /* The coroutine running now, NULL when none is (lnr_resume): the thread
   * the stall watchdog hooks besides L, since a count hook is per thread.
   * Set as a resume begins; put back as it ends under run_lock, which the
   * watchdog holds while it hooks `running`: a thread it reads there
   * cannot be left, and so collected, before its hook is set. */
  lua_State *_Atomic running;
  _Atomic bool run_lock;
#if LNR_STACK_CHECKED
  /* The tops at the handler calls in progress, innermost last (they nest:
   * a handler's write runs the handlers before it). */
  int stack_marks[LNR_STACK_MARKS];
  int stack_depth;
#endif
} lnr_state_t;

/* ---- modules ---------------------------------------------------------------- */

/* A feature of the bindings is a module: one row of the module table
 * (module.c), as in Lua's linit.c and nginx's ngx_module_t. The kernel --
 * lstate.c and module.c -- knows features only through their rows: it
 * opens them, sizes and closes their parts, and runs their hooks, in
 * table order, naming none. Every field but name may be empty. */
struct lnr_module_s {
  const char *name;
  /* Fill netrun.core: called in every state, with the core table on top
   * of the stack, which it leaves as it found it. */
  void (*open)(lua_State *L);
  /* After luaL_openlibs in a loop state, before "netrun" is required:
   * replace standard functions (os.execute, coroutine.resume). */
  void (*libs)(lua_State *L);
  /* The module's per-state part: part_size bytes of every state's
   * context, zeroed when the state is made (lnr_part). close, if any,
   * runs on the state's thread after its Lua state is closed. */
  size_t part_size;
  void (*close)(lnr_state_t *S, void *part);
  /* A hot reload (core.forget_caches) in this state, on its thread:
   * forget what the state cached of the code it ran. */
  void (*reload)(lua_State *L);
  /* The process's teardown, as the main state closes, in table order.
   * false stops it: what later rows free may still be in use (a loop is
   * stuck). */
  bool (*teardown)(lua_State *L);
  /* Where the part begins in a state's context: set by the kernel
   * (lnr_state_size) before any state is made, constant after. */
  size_t part_offset;
};

/* The part of module m in the state S (m->part_size bytes). */
static inline void *lnr_part(const lnr_state_t *S, const lnr_module_t *m) {
  return (char *)S + m->part_offset;
}

/* The kernel's walks of the table (module.c). The size of a state's
 * context with every part (computed once; any thread). */
size_t lnr_state_size(void);
void lnr_modules_libs(lua_State *L);
void lnr_modules_close(lnr_state_t *S);
void lnr_modules_reload(lua_State *L);
bool lnr_modules_teardown(lua_State *L);


#if LNR_STACK_CHECKED
#define LNR_STACK_MARK(S)                                                   \
  do {                                                                      \
    if ((S)->stack_depth < LNR_STACK_MARKS)                                 \
      (S)->stack_marks[(S)->stack_depth] = lua_gettop((S)->L);              \
    (S)->stack_depth++;                                                     \
  } while (0)
#define LNR_STACK_UNMARK(S, n)                                              \
  do {                                                                      \
    assert((S)->stack_depth > 0);                                           \
    if (--(S)->stack_depth < LNR_STACK_MARKS &&                             \
        lua_gettop((S)->L) != (S)->stack_marks[(S)->stack_depth] + (n))     \
      lnr_stack_mismatch(__func__, lua_gettop((S)->L),                      \
                         (S)->stack_marks[(S)->stack_depth] + (n));         \
  } while (0)
#else
#define LNR_STACK_MARK(S) ((void)0)
#define LNR_STACK_UNMARK(S, n) ((void)0)
#endif

/* The context of the state L. Every state that runs the bindings' code
 * has one: it is made before netrun.core opens (lnr_open_state). */
lnr_state_t *lnr_state(lua_State *L);
/* A registry reference kept in a state's context (a kernel slot, a field
 * of a module's part): 0 until set. Push its value (nil if unset);
 * returns its type. */
int lnr_push_ref(lua_State *L, const int *ref);
/* Pop the value on top into *ref (letting go of the one there). */
void lnr_set_ref(lua_State *L, int *ref);
/* Push registry[key] (a light-userdata key whose value, once made, never
 * changes), read through *ref once it was found there: an array read, not
 * a walk of the registry's hash chains. Returns its type. */
int lnr_push_keyed(lua_State *L, int *ref, const void *key);
/* The main thread's external loop, created when the module is first loaded. */
nr_loop_t *lnr_main_loop(void);
/* Loop state hooks; ud is what lnr_paths_new returned. */
void lnr_loop_started(nr_loop_t *loop, void *ud);
void lnr_loop_exiting(nr_loop_t *loop, void *ud);
void *lnr_paths_new(lua_State *L);
void lnr_paths_free(void *paths);
/* The Lua memory limit of the group's loop states, in bytes (0: none). */
void lnr_paths_set_memory_limit(void *paths, size_t bytes);
/* The state running on the current thread's loop (or main), or NULL. */
lnr_state_t *lnr_current_state(void);
/* Queue a packed task (fn, args...) to a loop; raises if rejected. */
void lnr_send_task(lua_State *L, nr_loop_t *loop, lnr_blob_t *b,
                   nr_promise_t *p);

/* lnr_pcall (lmain.h) is the one protected call. The message handler it
 * uses: adds a traceback. */
int lnr_msgh(lua_State *L);
/* Log the error on top of the stack ("<what>: <message>") and pop it. */
void lnr_log_error(lua_State *L, const char *what);

/* ---- value transfer (DESIGN.md §3) --------------------------------------- */

/* Handle kinds that cross threads by reference count. */
enum { LNR_GROUP = 1, LNR_LOOP, LNR_CHANNEL, LNR_FUTURE, LNR_DICT,
       LNR_CHGROUP, LNR_TLS, LNR_UPSTREAM, LNR_METRIC, LNR_NKINDS };

struct lnr_blob_s {
  nr_task_t task;             /* lets a blob travel as a task */
  int nvalues;
  size_t len, cap;
  char *buf;
  int nhandles, hcap;
  struct lnr_href_s { int kind; void *ptr; } *handles;
  void *user;                 /* for whoever sends the blob */
  void *user2;
  uint64_t token;             /* lpipeline_exec.c: a read's token */
  nr_loop_t *owed;            /* group/lgroup.c: the loop the task's outcome
                                 goes back to (nr_loop_hold), or NULL */
  int kept;                   /* lnr_keep: registry ref of the values, else 0 */
  const struct lnr_state_s *home;   /* lnr_keep: the state holding them */
  /* lnr_pack_result: packed and kept both; the kept ref is let go on
   * home_loop (retained) when the blob is freed on another thread */
  bool packed_too;
  nr_loop_t *home_loop;
  char small[96];
};

/* Pack n values starting at stack index `from`. Raises a Lua error naming
 * the path of anything that cannot be transferred; `what` names the values
 * ("argument", "result", "message"). */
lnr_blob_t *lnr_pack(lua_State *L, int from, int n, const char *what);
/* A blob for the caller's own loop: the n values from `from` are kept in
 * this state as they are (a closure keeps its upvalues, ctx included) and
 * the blob only refers to them; it is unpacked and freed on this state's
 * loop thread. */
lnr_blob_t *lnr_keep(lua_State *L, int from, int n);
/* A future's value (the one at idx): packed, so that any state reads a
 * copy, and -- a table, a function or a userdata -- also kept in this
 * state, so that a reader in this same state (an await on the producer's
 * own loop) gets the value itself, no copy. For the futures this state
 * is likely to read: a LOCAL one's, an own-loop submit's. Raises like
 * lnr_pack. */
lnr_blob_t *lnr_pack_result(lua_State *L, int idx);
/* A LOCAL future's value (lfuture.c): kept in this state only, not
 * packed -- nobody elsewhere can read it until the future escapes, and
 * then lnr_pack_kept packs it (lnr_future_escapes, on this state's
 * thread, as the future's handle is packed). A value that is its own copy
 * (a string, a number) is packed at once, as lnr_pack_result. */
lnr_blob_t *lnr_keep_result(lua_State *L, int idx);
/* Pack a blob of lnr_keep_result's (kept, not packed yet) in its home
 * state; nothing for any other blob. Raises like lnr_pack. */
void lnr_pack_kept(lua_State *L, lnr_blob_t *b);
/* Push the blob's values; returns how many. Raises on failure. */
int lnr_unpack(lua_State *L, const lnr_blob_t *b);
void lnr_blob_free(lnr_blob_t *b);
void lnr_blob_free_fn(void *b);   /* as a promise value destructor */

/* ---- handles ----------------------------------------------------------------- */

void lnr_handle_retain(int kind, void *ptr);
void lnr_handle_release(int kind, void *ptr);
/* Push this state's proxy for a handle (one per state), taking a ref. */
void lnr_push_handle(lua_State *L, int kind, void *ptr);
/* lnr_push_handle for a channel just made (its init): no lookup, for there
 * can be no proxy of it yet. */
void lnr_push_new_channel(lua_State *L, nr_channel_t *ch);
/* Whether the value at idx is this state's void promise (a quick check:
 * false for a void promise not made by lnr_push_handle here). */
static inline bool lnr_is_void(lua_State *L, int idx) {
  const void *p = lua_topointer(L, idx);
  lnr_state_t *S = p != NULL ? lnr_state(L) : NULL;
  return S != NULL && p == S->void_proxy;
}
void lnr_push_new_handle(lua_State *L, int kind, void *ptr);
/* The same, with the kind's metatable given at stack index mt (hot paths
 * keep it as an upvalue). */
void lnr_push_new_handle_mt(lua_State *L, int kind, void *ptr, int mt);
/* A future made in this state (netrun.promise(), spawn) is LOCAL until
 * its proxy is packed for a transfer: until then only this state can read
 * its value, which is then also kept here as it is (lnr_pack_result). */
void lnr_future_mark_local(lua_State *L, int idx);
bool lnr_future_is_local(lua_State *L, int idx);
void lnr_future_escapes(lua_State *L, int idx);
/* Push the metatable of a handle kind. */
void lnr_push_class(lua_State *L, int kind);
/* A lazy write future (lhandle.c): the write on stream channel ch that
 * ended at `mark`; the value at `keep` (the ctx) is held to keep ch alive;
 * lazy_mt is the lazy class (lnr_push_lazy_class). It turns into a real
 * future the first time it is used as one. Channel's loop only. */
void lnr_push_lazy_write(lua_State *L, nr_channel_t *ch, uint64_t mark,
                         int keep, int lazy_mt);
void lnr_push_lazy_class(lua_State *L);
/* The handle at idx if it is of `kind`, else NULL. */
void *lnr_to_handle(lua_State *L, int idx, int kind);
void *lnr_check_handle(lua_State *L, int idx, int kind);
/* Kind of the netrun handle at idx, or 0. */
int lnr_handle_kind(lua_State *L, int idx);
void lnr_handle_class(lua_State *L, int kind);

/* Groups as the bindings know them: a core group plus its liveness. */
typedef struct lnr_group_s lnr_group_t;
nr_group_t *lnr_group_core(lnr_group_t *g);
lnr_group_t *lnr_group_of_loop(nr_loop_t *l);
/* True on an executor group's thread, where sync() may block. */
bool lnr_loop_may_block(nr_loop_t *l);
/* The group options stall_threshold and stall_timeout of t (NULL: the
 * defaults) into o (lstall.c); raises on a bad value. */
void lnr_stall_options(const lnr_opts_t *t, bool executor,
                       nr_group_opts_t *o);
/* Publish co as the coroutine running (lnr_state_t.running) until
 * lnr_run_leave(S, the value returned), which must follow before anything
 * can collect co (lstall.c). */
static inline lua_State *lnr_run_enter(lnr_state_t *S, lua_State *co) {
  lua_State *prev = atomic_load_explicit(&S->running, memory_order_relaxed);
  atomic_store_explicit(&S->running, co, memory_order_release);
  return prev;
}
void lnr_run_lock_wait(lnr_state_t *S);   /* the watchdog holds it */
static inline void lnr_run_leave(lnr_state_t *S, lua_State *prev) {
  if (atomic_exchange_explicit(&S->run_lock, true, memory_order_acquire))
    lnr_run_lock_wait(S);
  atomic_store_explicit(&S->running, prev, memory_order_relaxed);
  atomic_store_explicit(&S->run_lock, false, memory_order_release);
}
/* lua_resume(co, from, nargs, nres), with co known to the stall watchdog
 * as the running coroutine while it runs. S may be NULL. Every resume of
 * the bindings goes through here: netrun.spawn's, and the coroutine
 * library's of loop states (lstall.c). */
static inline int lnr_resume(lnr_state_t *S, lua_State *co, lua_State *from,
                             int nargs, int *nres) {
  if (S == NULL)
    return lua_resume(co, from, nargs, nres);
  lua_State *prev = lnr_run_enter(S, co);
  int st = lua_resume(co, from, nargs, nres);
  lnr_run_leave(S, prev);
  return st;
}
/* A loop state's lnr_state_t from any of its threads, in one load: it is
 * kept in the extra space of the state's main thread (lnr_loop_started),
 * which every thread made later copies. Loop states only. */
static inline lnr_state_t *lnr_loop_state(lua_State *L) {
  return *(lnr_state_t **)lua_getextraspace(L);
}
/* Reference counts of the handle kinds, defined next to each kind and
 * used by lnr_handle_retain/release (lhandle.c). */
void lnr_group_retain(lnr_group_t *g);
void lnr_group_release(lnr_group_t *g);
void lnr_chgroup_retain(void *cg);
void lnr_chgroup_release(void *cg);
void lnr_tls_retain(void *cfg);
void lnr_tls_release(void *cfg);
void lnr_upstream_retain(void *u);   /* http/lupstream.c */
void lnr_upstream_release(void *u);
/* Push a lookup's answer: an array of address strings, its TTL as `ttl`. */
void lnr_push_addrs(lua_State *L, const nr_addrs_t *a);
/* Default groups for servers and clients without one (created lazily). */
lnr_group_t *lnr_default_group(lua_State *L, bool boss);

/* Futures are promises. Push one (taking the caller's reference); a
 * scheduled one also cancels its timer when cancelled. */
void lnr_push_promise(lua_State *L, nr_promise_t *p);
void lnr_push_scheduled(lua_State *L, nr_promise_t *p, nr_timer_t *t);
/* Pack the value at idx in protected mode (a future's result; keep: with
 * lnr_pack_result): 1 and *out, or 0 with the error message pushed. */
int lnr_try_pack(lua_State *L, int idx, bool keep, lnr_blob_t **out);

/* Run a Lua task packed as (fn, args...) in the current state. */
int lnr_run_packed(lua_State *L, lnr_blob_t *b, int nresults);

/* Make the context of the state L, if it has none yet (the first state
 * of a thread that is not a loop's becomes the main one): the kernel's
 * first step in opening netrun.core (module.c). */
void lnr_open_state(lua_State *L);
/* The main state's loop becomes l (a simulation's, while one runs:
 * lsim.c); returns the one before. Main thread. */
nr_loop_t *lnr_swap_main_loop(nr_loop_t *l);

/* ---- what features share -------------------------------------------------------- */

/* A request's options (netrun.http), checked: raises, at the caller's
 * line (lnr_push_where: the call that gave them to netrun.http), when
 * the value at idx is not a table of known options of the right types;
 * with base > 0 each option's value is copied to stack slot base +
 * LNR_HOPT_* (slots the caller made; those of absent options are left).
 * True if a number option was given as a string ("2.5", "64k"): its
 * number is what the slot holds, and lnr_http_converted pushes a copy of
 * the options with the numbers of the slots (the Lua side's). */
enum { LNR_HOPT_URL, LNR_HOPT_FORWARD, LNR_HOPT_HEADERS, LNR_HOPT_METHOD,
       LNR_HOPT_BODY, LNR_HOPT_TIMEOUT, LNR_HOPT_MAX_BODY, LNR_HOPT_TLS,
       LNR_HOPT_FOLLOW, LNR_HOPT_FOLLOW_DOWNGRADE, LNR_HOPT_STREAM,
       LNR_HOPT_UPSTREAM, LNR_HOPT_PATH, LNR_HOPT_N };
bool lnr_http_check_request(lua_State *L, int idx, int base);
void lnr_http_converted(lua_State *L, int idx, int base);
/* Write the request whose fields are the uservalues of the userdata at idx
 * (2 method, 3 path, 4 headers, 5 body, 6 forward, 7 host; false: none)
 * through ctx (to the client codec before it): 0 when written; 1, err
 * filled, when a field cannot be sent (nothing written); < 0 when the
 * write failed (reported to exception_caught). `tag` comes back with its
 * reply (HTTP/2 matches replies to requests by it). */
int lnr_http_write_call(lua_State *L, int idx, nr_ctx_t *ctx, uint64_t tag,
                        char *err, size_t el);
/* lhttp.c: a server request (netrun.http.request) seen by the client
 * codec that forwards it (lhttp_client.c), without making a Lua value of
 * its fields. Loop thread of L. A field the handler assigned wins over
 * the one that arrived; strings made for that (a target rebuilt from an
 * assigned path or query) are pushed and stay on the stack. */
typedef struct lnr_http_fwd_s {
  const char *method, *target, *body;
  size_t method_len, target_len, body_len;
  int headers;                /* stack index of the headers table the
                                 handler read or assigned (pushed), or 0:
                                 forward the head's own nheaders fields */
  size_t nheaders;
  const char *bad;            /* the field the handler assigned a value
                                 that cannot be sent (a table as path),
                                 or NULL */
} lnr_http_fwd_t;
/* false if the value at idx (absolute) is no server request. */
bool lnr_http_forward_view(lua_State *L, int idx, lnr_http_fwd_t *f);
/* Is the value at idx a server request? */
bool lnr_http_is_request(lua_State *L, int idx);
/* A request knows the read it came in (the codec's token, for pipeline
 * p), so that firing it on later, from anywhere in the state, still names
 * it: that token if the value at idx is a request of pipeline p, else 0. */
uint64_t lnr_http_request_token(lua_State *L, int idx, const void *p);
/* The head's fields of the request at idx as they arrived (names in
 * their case, repeats apart), into out[0 .. cap): how many there are. */
struct nr_http_header_s;
size_t lnr_http_forward_fields(lua_State *L, int idx,
                               struct nr_http_header_s *out, size_t cap);

/* Messages: Lua value <-> C pipeline message (lmsg.c). */
void lnr_push_msg(lua_State *L, void *msg);
/* Teach lnr_push_msg a message type (codec bindings do, once, before any
 * loop runs). Registering a second converter for a type, or more types
 * than lmsg.c's table holds, aborts with a message naming the type. */
typedef void (*lnr_msg_push_fn)(lua_State *L, void *msg);
void lnr_register_msg(int type, lnr_msg_push_fn push);
/* What a Lua value no handler encoded is, and the Lua line that wrote it,
 * for the head's error text (nr_set_msg_describer). */
void lnr_describe_msg(const void *msg, char *buf, size_t size, char *where,
                      size_t wsize);
/* Native messages: a full userdata that begins with an lnr_native_t, then
 * a C pipeline message (its first int its NR_MSG type) holding no
 * pointers, such as a prepared HTTP response. lnr_to_msg hands it to the
 * pipeline as it is; the type's converter (lnr_register_msg) makes a Lua
 * value of it again where one is needed. */
typedef struct lnr_native_s {
  const void *tag;            /* &lnr_native_tag: proves the userdata is one */
  const void *pad;            /* the message stays aligned */
} lnr_native_t;
extern const char lnr_native_tag;
/* The message of the native message at idx, or NULL. */
static inline void *lnr_to_native(lua_State *L, int idx) {
  const lnr_native_t *h = lua_touserdata(L, idx);   /* a light one has length 0 */
  if (h == NULL || lua_rawlen(L, idx) < sizeof *h + sizeof(int) ||
      h->tag != &lnr_native_tag)
    return NULL;
  return (void *)(h + 1);
}

/* A Lua value travelling through a pipeline on its own loop, valid for
 * the call that passes it on (nothing keeps one). L is the thread that
 * wrote it -- a coroutine, say -- not necessarily the one a handler runs
 * on: read it with lnr_push_msg (or with m->L itself), never as idx of
 * another thread. */
typedef struct lnr_lmsg_s {
  int type;                   /* NR_MSG_LUA */
  lua_State *L;
  int idx;                    /* absolute stack index in L */
} lnr_lmsg_t;

/* A message made of a Lua value by lnr_to_msg, in memory its caller owns
 * (a local): strings become bytes, arrays of strings slices, {data, host,
 * port} on a datagram channel a datagram, a native message itself; other
 * values travel as NR_MSG_LUA. It points into the value, so it is valid
 * while the value stays on the stack, and until lnr_msg_done. */
#define LNR_MSG_SMALL 16
typedef struct lnr_msgbuf_s {
  union {
    nr_bytes_t bytes;
    nr_slices_t slices;
    nr_datagram_t datagram;
    lnr_lmsg_t lua;
  } u;
  nr_slice_t small[LNR_MSG_SMALL];
  nr_slice_t *heap;           /* the slices, when more than small holds */
  lua_State *L;
  int pushed;                 /* a datagram's fields, on L's stack */
} lnr_msgbuf_t;
/* The message of the value at idx (for the pipeline of ch: NULL for a
 * read), filled into *m; raises for a malformed datagram or array. */
void *lnr_to_msg(lua_State *L, int idx, nr_channel_t *ch, lnr_msgbuf_t *m);
/* Give back what lnr_to_msg took (heap slices, a datagram's fields). */
void lnr_msg_done(lnr_msgbuf_t *m);

/* Native handlers: a userdata whose metatable has __netrun_native, a light
 * userdata holding a function of this type that builds the C handler. Such
 * a userdata is a configuration of plain bytes (no pointers, no user
 * values): transfer.c copies it between states. */
typedef const nr_handler_t *(*lnr_native_fn)(lua_State *L, int idx,
                                             void **state);
/* Make the metatable `name` of a native value (if the state has none yet):
 * its __netrun_native is make, its __tostring tostring. */
void lnr_native_class(lua_State *L, const char *name, lnr_native_fn make,
                      lua_CFunction tostring);

/* Helpers */
/* Push the registry table stored under the address `key`, making it the
 * first time as a weak table of the given __mode ("k", "v" or "kv"). */
void lnr_push_weak(lua_State *L, const void *key, const char *mode);
/* lnr_push_weak through *ref (lnr_push_keyed). */
void lnr_push_weak_keyed(lua_State *L, int *ref, const void *key,
                         const char *mode);
double lnr_checkseconds(lua_State *L, int idx, const char *what);
uint64_t lnr_ns(double seconds);
int lnr_error_code(lua_State *L, const char *prefix, int code, const char *msg);
/* Register a metatable named `name` with methods and a __tostring. */
void lnr_new_class(lua_State *L, const char *name, const luaL_Reg *methods,
                   const luaL_Reg *meta);

#define LNR_NAME(kind) lnr_kind_names[kind]
extern const char *const lnr_kind_names[];

#endif /* LNR_H */
