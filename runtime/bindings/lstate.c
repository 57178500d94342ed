/*
 * lstate.c -- one lua_State per thread.
 *
 * The main state is whichever state first requires "netrun" on a thread
 * that is not a loop; that thread gets an external loop (nr_loop_t with no
 * thread of its own) so that work sent to it -- listeners it added, results
 * sent to it -- runs whenever it waits inside netrun.
 *
 * Every loop thread creates its own state when it starts (on its thread),
 * with the standard libraries (as the modules' libs hooks change them), a
 * generational collector, the main state's package.path/cpath,
 * "netrun.core" preloaded and "netrun" required, and a counting allocator
 * so its memory can be read from any thread, and
 * bounded (lua_memory_limit, see "the memory limit"). The state is closed
 * on the same thread when the loop terminates.
 *
 * This is the kernel: a state's context (lnr_state_t) holds the state, its
 * loop, the current call, slots and the memory limit; each module's part
 * follows it in the same block (module.c lays them out and runs their
 * hooks). Nothing here names a feature.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "lmain.h"
#include "lnr.h"

int luaopen_netrun_core(lua_State *L);

static const char STATE_KEY = 0;
/* The main thread's loop. Other threads read it (a signal thread asking
 * the main thread to stop), so it is published once made and set up. */
static _Atomic(nr_loop_t *) main_loop;
static lnr_state_t *main_state;

/* The last lookup, per thread: a thread runs one state (its loop's, or
 * the main one), so this almost always hits. A thread that opens a second
 * state stops caching; closing a state forgets it. */
static _Thread_local lua_State *last_L;
static _Thread_local lnr_state_t *last_S;
static _Thread_local bool no_cache;

static void forget_states(void) {
  last_L = NULL;
  last_S = NULL;
}

/* The registry lookup, out of line so that the usual hit saves no
 * registers. */
static __attribute__((noinline)) lnr_state_t *lookup_state(lua_State *L) {
  lua_rawgetp(L, LUA_REGISTRYINDEX, &STATE_KEY);
  lnr_state_t *S = lua_touserdata(L, -1);
  lua_pop(L, 1);
  if (S != NULL && !no_cache) {
    last_L = L;
    last_S = S;
  }
  return S;
}

/* The state's call thread (lnr_state_t.call_thread) is the other thread
 * its handlers run on: it hits too. */
static inline lnr_state_t *state_of(lua_State *L) {
  return L == last_L || (last_S != NULL && L == last_S->call_thread)
             ? last_S : lookup_state(L);
}

lnr_state_t *lnr_state(lua_State *L) { return state_of(L); }

int lnr_push_ref(lua_State *L, const int *ref) {
  if (*ref == 0) {
    lua_pushnil(L);
    return LUA_TNIL;
  }
  return lua_rawgeti(L, LUA_REGISTRYINDEX, *ref);
}

void lnr_set_ref(lua_State *L, int *ref) {
  if (*ref != 0)
    luaL_unref(L, LUA_REGISTRYINDEX, *ref);
  *ref = luaL_ref(L, LUA_REGISTRYINDEX);
}

static void keep_in_ref(lua_State *L, int *ref) {
  lua_pushvalue(L, -1);
  *ref = luaL_ref(L, LUA_REGISTRYINDEX);
}

int lnr_push_keyed(lua_State *L, int *ref, const void *key) {
  if (*ref > 0)
    return lua_rawgeti(L, LUA_REGISTRYINDEX, *ref);
  int t = lua_rawgetp(L, LUA_REGISTRYINDEX, key);
  if (t != LUA_TNIL)
    keep_in_ref(L, ref);
  return t;
}

void lnr_push_weak_keyed(lua_State *L, int *ref, const void *key,
                         const char *mode) {
  if (*ref > 0) {
    lua_rawgeti(L, LUA_REGISTRYINDEX, *ref);
    return;
  }
  lnr_push_weak(L, key, mode);
  keep_in_ref(L, ref);
}

nr_loop_t *lnr_main_loop(void) { return atomic_load(&main_loop); }

nr_loop_t *lnr_swap_main_loop(nr_loop_t *l) {
  if (main_state != NULL) {
    main_state->loop = l;
    nr_loop_set_data(l, main_state);
  }
  return atomic_exchange(&main_loop, l);
}

/* ---- protected calls ---------------------------------------------------- */

/* Loop states do not see the main script's globals (DESIGN.md §3: a
 * function's _ENV binds to its destination's globals), so a global the
 * script set reads nil there. Reading one must stay legal (code probes
 * `if jit then`), so the error it causes is explained instead: "attempt
 * to index a nil value (global 'Base')" on a loop state gets the hint. */
static const char *global_hint(lua_State *L, const char *msg) {
  static const char pat[] = "a nil value (global '";
  const lnr_state_t *S = state_of(L);
  const char *at = strstr(msg, pat);
  if (S == NULL || S->main || S->loop == NULL || S->loop == lnr_main_loop() ||
      at == NULL)
    return msg;
  const char *name = at + sizeof pat - 1, *end = strchr(name, '\'');
  if (end == NULL)
    return msg;
  return lua_pushfstring(L, "%s; global '%s' is not defined in this loop's "
                         "Lua state (%s): loop states do not share the main "
                         "script's globals; pass values as upvalues or "
                         "arguments, or use netrun.shared / require", msg,
                         lua_pushlstring(L, name, (size_t)(end - name)),
                         nr_loop_name(S->loop));
}

int lnr_msgh(lua_State *L) {
  const char *msg = lua_tostring(L, 1);
  if (msg == NULL) {
    if (luaL_callmeta(L, 1, "__tostring") && lua_type(L, -1) == LUA_TSTRING)
      msg = lua_tostring(L, -1);
    else
      msg = lua_pushfstring(L, "(error object is a %s value)",
                            luaL_typename(L, 1));
  } else {
    msg = global_hint(L, msg);
  }
  luaL_traceback(L, L, msg, 1);
  return 1;
}

#if LNR_STACK_CHECKED
void lnr_stack_mismatch(const char *where, int got, int want) {
  fprintf(stderr, "netrun: Lua stack unbalanced in %s: top %d, expected %d\n",
          where, got, want);
  abort();
}
#endif

int lnr_pcall(lua_State *L, int nargs, int nresults) {
  int base = lua_gettop(L) - nargs;
  lua_pushcfunction(L, lnr_msgh);
  lua_insert(L, base);
  int rc = lua_pcall(L, nargs, nresults, base);
  lua_remove(L, base);
  return rc;
}

void lnr_log_error(lua_State *L, const char *what) {
  nr_log(NR_LOG_ERROR, "%s: %s", what, lua_tostring(L, -1));
  lua_pop(L, 1);
}

/* ---- running packed tasks ----------------------------------------------- */

static int run_packed_p(lua_State *L) {
  lnr_blob_t *b = lua_touserdata(L, 1);
  int nresults = (int)lua_tointeger(L, 2);
  lua_settop(L, 0);
  int n = lnr_unpack(L, b);
  luaL_checktype(L, 1, LUA_TFUNCTION);
  lua_call(L, n - 1, nresults);
  return nresults;
}

int lnr_run_packed(lua_State *L, lnr_blob_t *b, int nresults) {
  lua_pushcfunction(L, run_packed_p);
  lua_pushlightuserdata(L, b);
  lua_pushinteger(L, nresults);
  return lnr_pcall(L, 2, nresults);
}

/* ---- loop states ----------------------------------------------------------- */

#define MEDIUM_SHIFT 9                /* medium sizes: 257 B .. 1 << (9 + 7) */

/* Under a sanitizer every block goes to malloc, so that its checks see
 * each one. */
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
#define POOL_MAX 0
#define MEDIUM_MAX 0
#else
#define POOL_MAX (LNR_POOL_CLASSES * 16)
#define MEDIUM_MAX ((size_t)1 << (MEDIUM_SHIFT + LNR_MEDIUM_CLASSES / 4 - 1))
_Static_assert(LNR_POOL_CLASSES * 16 == 1 << (MEDIUM_SHIFT - 1),
               "medium classes begin where the small ones end");
#endif
#define POOL_PAGE 16384
/* Medium bytes kept for reuse at most: about what one collection frees of
 * a busy loop's reads (generational mode collects every few hundred KiB).
 * What is kept cannot serve malloc's other callers: with 10,000 idle
 * echo connections, RSS per connection is 12 bytes higher for it. */
#define MEDIUM_KEEP (512u << 10)

static size_t pool_class(size_t n) { return (n - 1) / 16; }

static void *pool_get(lnr_pool_t *p, size_t n) {
  size_t c = pool_class(n);
  void *b = p->free[c];
  if (b != NULL) {
    p->free[c] = *(void **)b;
    return b;
  }
  size_t size = (c + 1) * 16;
  if (p->cur == NULL || (size_t)(p->end - p->cur) < size) {
    char *page = malloc(POOL_PAGE);
    if (page == NULL)
      return NULL;
    *(void **)page = p->pages;            /* the link takes the first block */
    p->pages = page;
    p->cur = page + 16;
    p->end = page + POOL_PAGE;
  }
  b = p->cur;
  p->cur += size;
  return b;
}

static void pool_put(lnr_pool_t *p, void *b, size_t n) {
  size_t c = pool_class(n);
  *(void **)b = p->free[c];
  p->free[c] = b;
}

/* The medium class of n (POOL_MAX < n <= MEDIUM_MAX): four to each
 * doubling, so that a live block (a table's part, a stack) wastes a fifth
 * of itself at most. Class c holds blocks of medium_size(c) bytes. */
static unsigned medium_class(size_t n) {
  unsigned bits = 64 - (unsigned)__builtin_clzll((unsigned long long)(n - 1));
  return (bits - MEDIUM_SHIFT) * 4 + (unsigned)(((n - 1) >> (bits - 3)) & 3);
}

static size_t medium_size(unsigned c) {
  return (size_t)((c & 3) + 5) << ((c >> 2) + MEDIUM_SHIFT - 3);
}

static void *medium_get(lnr_pool_t *p, size_t n) {
  unsigned c = medium_class(n);
  void *b = p->mfree[c];
  if (b == NULL)
    return malloc(medium_size(c));
  p->mfree[c] = *(void **)b;
  p->mkept -= medium_size(c);
  return b;
}

static void medium_put(lnr_pool_t *p, void *b, size_t n) {
  unsigned c = medium_class(n);
  if (p->mkept + medium_size(c) > MEDIUM_KEEP) {
    free(b);
    return;
  }
  *(void **)b = p->mfree[c];
  p->mfree[c] = b;
  p->mkept += medium_size(c);
}

static void pool_free_pages(lnr_pool_t *p) {
  for (void *pg = p->pages, *next; pg != NULL; pg = next) {
    next = *(void **)pg;
    free(pg);
  }
  for (unsigned c = 0; c < LNR_MEDIUM_CLASSES; c++)
    for (void *b = p->mfree[c], *next; b != NULL; b = next) {
      next = *(void **)b;
      free(b);
    }
  memset(p, 0, sizeof *p);
}

/* A block of n bytes, and its return, by the tier n falls in. */
static void *take(lnr_pool_t *p, size_t n) {
  return n <= POOL_MAX ? pool_get(p, n) : n <= MEDIUM_MAX ? medium_get(p, n)
                                                          : malloc(n);
}

static void give_back(lnr_pool_t *p, void *b, size_t n) {
  if (n <= POOL_MAX)
    pool_put(p, b, n);
  else if (n <= MEDIUM_MAX)
    medium_put(p, b, n);
  else
    free(b);
}

/* Whether a block of size old serves size n where it is. */
static bool fits(size_t old, size_t n) {
  if (old <= POOL_MAX)
    return n <= POOL_MAX && pool_class(old) == pool_class(n);
  if (old <= MEDIUM_MAX)
    return n > POOL_MAX && n <= MEDIUM_MAX && medium_class(old) == medium_class(n);
  return false;
}

/* ---- the memory limit ----------------------------------------------------- */

/* A loop state's Lua memory is bounded (the group's lua_memory_limit):
 * an allocation that would take it past the limit fails, which Lua raises
 * as "not enough memory" in the code that asked -- a handler's call goes
 * to its exception_caught, a task fails its future -- and the loop lives
 * on. Only Lua code being run is refused: what the bindings allocate
 * between calls (the message they convert for the next call, a ctx) and
 * while pushing a call's arguments (`converting`) is never refused, as
 * they do not expect a Lua error there. Lua collects and asks once more
 * after a refusal; when that retry is refused too, a reserve of
 * MEM_RESERVE bytes past the limit opens, so that the error can be
 * handled (a traceback, exception_caught, a log line); it closes once the
 * state is back under its limit. */
#define MEM_RESERVE ((size_t)256 << 10)

static bool running(lnr_state_t *S) {
  lua_Debug ar;
  return !S->converting && (S->resuming > 0 || lua_getstack(S->L, 0, &ar));
}

/* Whether to refuse an allocation taking the state to `total` bytes, past
 * its limit. */
static __attribute__((noinline)) bool refuse(lnr_state_t *S, size_t nsize,
                                             size_t total) {
  if (S->L == NULL || !running(S))
    return false;
  if (S->mem_reserve)
    return total > S->mem_limit + MEM_RESERVE;
  if (S->mem_refused == nsize) {           /* Lua's retry after collecting */
    S->mem_refused = 0;
    S->mem_reserve = true;
  } else {
    S->mem_refused = nsize;
  }
  return true;
}

/* Lua's allocator for loop states: small blocks from the pool, medium ones
 * from their lists, others from malloc (Lua always tells a block's size,
 * so its tier and class are known); the state's memory is counted for
 * stats(). Loop thread only. */
static __attribute__((noinline)) void *alloc_slow(lnr_state_t *S, void *ptr,
                                                  size_t osize, size_t nsize) {
  size_t old = ptr ? osize : 0;
  size_t m = atomic_load_explicit(S->memory, memory_order_relaxed);
  void *p = NULL;
  if (nsize > old && m - old + nsize > S->mem_limit) {
    if (refuse(S, nsize, m - old + nsize))
      return NULL;
  } else if (S->mem_reserve && m - old + nsize <= S->mem_limit) {
    S->mem_reserve = false;                /* back under the limit */
    S->mem_refused = 0;
  }
  if (nsize == 0) {
    if (old > 0)
      give_back(&S->pool, ptr, old);
  } else if (old > 0 && fits(old, nsize)) {
    p = ptr;                               /* same class: stays in place */
  } else if (old > POOL_MAX && nsize > POOL_MAX) {
    /* medium and large blocks are malloc's: realloc may grow in place */
    p = realloc(ptr, nsize <= MEDIUM_MAX ? medium_size(medium_class(nsize)) : nsize);
  } else {
    p = take(&S->pool, nsize);
    if (p != NULL && old > 0) {            /* to or from a small block */
      memcpy(p, ptr, old < nsize ? old : nsize);
      give_back(&S->pool, ptr, old);
    }
  }
  if (nsize == 0 || p != NULL)
    atomic_store_explicit(S->memory, m - old + nsize, memory_order_relaxed);
  return p;
}

static inline void count(lnr_state_t *S, size_t plus, size_t minus) {
  size_t m = atomic_load_explicit(S->memory, memory_order_relaxed);
  atomic_store_explicit(S->memory, m + plus - minus, memory_order_relaxed);
}

/* The two calls every message makes -- a small block freed, a small block
 * whose free list has one -- are served here, the rest out of line. That
 * is safe because Lua passes every block's size (osize), so a small
 * block's class is known without a header and its list is the one it came
 * from; a free only lowers the count; and the one allocation served here
 * is checked against mem_limit first, so whatever could pass the limit
 * (and needs refuse()'s judgement) takes alloc_slow. */
static void *counting_alloc(void *ud, void *ptr, size_t osize, size_t nsize) {
  lnr_state_t *S = ud;
#if POOL_MAX > 0
  if (nsize == 0 && ptr != NULL && osize > 0 && osize <= POOL_MAX) {
    pool_put(&S->pool, ptr, osize);
    count(S, 0, osize);
    return NULL;
  }
  if (ptr == NULL && nsize != 0 && nsize <= POOL_MAX) {
    void **head = &S->pool.free[pool_class(nsize)];
    void *b = *head;
    size_t m = atomic_load_explicit(S->memory, memory_order_relaxed);
    if (b != NULL && m + nsize <= S->mem_limit) {
      *head = *(void **)b;
      atomic_store_explicit(S->memory, m + nsize, memory_order_relaxed);
      return b;
    }
  }
#endif
  return alloc_slow(S, ptr, osize, nsize);
}

/* The allocator of a loop whose memory must not depend on where things
 * happen to be (the loops that have an nr_loop_scratch): counting_alloc, but
 * for Lua's first block, its global state, which lives in the loop's
 * scratch block -- at the same address in every run. Lua seeds a state's
 * string hashes with that address (and a stack address and the time,
 * which such a loop fixes too), and the hashes decide the order pairs()
 * visits string keys in: header fields written from a table, say. So a
 * run replays that order as well. The scratch's first SCRATCH_HEAD bytes
 * say whether the block is taken (the scratch comes zeroed). */
#define SCRATCH_HEAD 16

static void *scratch_alloc(void *ud, void *ptr, size_t osize, size_t nsize) {
  lnr_state_t *S = ud;
  size_t size = 0;
  char *head = nr_loop_scratch(S->loop, &size);
  if (head == NULL || size <= SCRATCH_HEAD)
    return counting_alloc(ud, ptr, osize, nsize);
  char *first = head + SCRATCH_HEAD;
  size -= SCRATCH_HEAD;
  if (ptr != NULL && ptr == first) {
    if (nsize == 0) {                    /* lua_close: the last block */
      count(S, 0, osize);
      *head = 0;
      return NULL;
    }
    return nsize <= size ? ptr : NULL;
  }
  if (ptr == NULL && nsize > 0 && *head == 0 && nsize <= size) {
    *head = 1;
    count(S, nsize, 0);
    return first;
  }
  return counting_alloc(ud, ptr, osize, nsize);
}

/* What a loop state copies from the state that created its group: the
 * module paths, and the command line (the global `arg`, so that
 * netrun.option reads the same flags in every state, and `netrun -t N`'s
 * NETRUN_THREADS, the default size of the groups a loop makes). */
typedef struct lnr_paths_s {
  char *path, *cpath;
  size_t mem_limit;           /* 0: none */
  char **args;                /* arg[first .. first + nargs - 1] */
  int first, nargs;
  lua_Integer threads;        /* NETRUN_THREADS, 0 when unset */
} lnr_paths_t;

void lnr_paths_set_memory_limit(void *ud, size_t bytes) {
  ((lnr_paths_t *)ud)->mem_limit = bytes;
}

static void set_path(lua_State *L, const char *field, const char *value) {
  if (value == NULL)
    return;
  lua_getglobal(L, "package");
  lua_pushstring(L, value);
  lua_setfield(L, -2, field);
  lua_pop(L, 1);
}

static void set_args(lua_State *L, const lnr_paths_t *paths) {
  if (paths->args != NULL) {
    lua_createtable(L, paths->nargs, 0);
    for (int i = 0; i < paths->nargs; i++) {
      lua_pushstring(L, paths->args[i]);
      lua_rawseti(L, -2, paths->first + i);
    }
    lua_setglobal(L, "arg");
  }
  if (paths->threads > 0) {
    lua_pushinteger(L, paths->threads);
    lua_setglobal(L, "NETRUN_THREADS");
  }
}

static int open_loop_state(lua_State *L) {
  const lnr_paths_t *paths = lua_touserdata(L, 1);
  luaL_openlibs(L);
  lnr_modules_libs(L);
  lua_gc(L, LUA_GCGEN, 0, 0);
  set_path(L, "path", paths->path);
  set_path(L, "cpath", paths->cpath);
  set_args(L, paths);
  luaL_getsubtable(L, LUA_REGISTRYINDEX, LUA_PRELOAD_TABLE);
  lua_pushcfunction(L, luaopen_netrun_core);
  lua_setfield(L, -2, "netrun.core");
  lua_pop(L, 1);
  lua_getglobal(L, "require");
  lua_pushliteral(L, "netrun");
  lua_call(L, 1, 0);
  return 0;
}

void lnr_loop_started(nr_loop_t *loop, void *ud) {
  lnr_state_t *S = calloc(1, lnr_state_size());
  const lnr_paths_t *paths = ud;
  if (S) {
    S->mem_limit = paths->mem_limit ? paths->mem_limit : SIZE_MAX;
    S->memory = nr_loop_memory(loop);  /* read by stats() from any thread */
    S->loop = loop;                    /* (scratch_alloc reads it) */
  }
  size_t scratch;
  lua_State *L = S == NULL ? NULL
                 : lua_newstate(nr_loop_scratch(loop, &scratch) ? scratch_alloc
                                                                : counting_alloc,
                                S);
  if (L == NULL) {
    nr_log(NR_LOG_ERROR, "%s: cannot create a Lua state", nr_loop_name(loop));
    free(S);
    return;
  }
  S->L = L;
  S->loop = loop;
  *(lnr_state_t **)lua_getextraspace(L) = S;   /* lnr_loop_state; before
                                                   any thread is made */
  lua_pushlightuserdata(L, S);
  lua_rawsetp(L, LUA_REGISTRYINDEX, &STATE_KEY);
  nr_loop_set_data(loop, S);
  lua_pushcfunction(L, open_loop_state);
  lua_pushlightuserdata(L, ud);
  if (lnr_pcall(L, 1, 0) != LUA_OK)
    lnr_log_error(L, "cannot set up the loop's Lua state");
}

void lnr_loop_exiting(nr_loop_t *loop, void *ud) {
  (void)ud;
  lnr_state_t *S = nr_loop_data(loop);
  if (S == NULL)
    return;
  nr_loop_set_data(loop, NULL);
  lua_close(S->L);
  lnr_modules_close(S);
  forget_states();
  pool_free_pages(&S->pool);
  free(S);
}

/* `netrun dir/server.lua` run from anywhere finds dir/helper.lua: the
 * script's directory (made absolute, so a later chdir does not matter)
 * goes first on the main state's package.path, which every loop state
 * copies when its group is made. */
void lnr_add_script_dir(lua_State *L, const char *script) {
  char *abs = realpath(script, NULL);
  char *slash = abs ? strrchr(abs, '/') : NULL;
  if (slash == NULL) {
    free(abs);
    return;
  }
  *slash = '\0';
  const char *dir = slash == abs ? "" : abs;     /* a script in / */
  lua_getglobal(L, "package");
  lua_getfield(L, -1, "path");
  lua_pushfstring(L, "%s/?.lua;%s/?/init.lua;%s", dir, dir,
                  lua_isstring(L, -1) ? lua_tostring(L, -1) : "");
  lua_setfield(L, -3, "path");
  lua_pop(L, 2);
  free(abs);
}

/* Whether t[i] (t on top) is a string. */
static bool string_at(lua_State *L, lua_Integer i) {
  bool is = lua_rawgeti(L, -1, i) == LUA_TSTRING;
  lua_pop(L, 1);
  return is;
}

/* The strings of the global `arg` (lua.c's: arg[0] the script, the
 * interpreter and its options below 0, the script's arguments from 1), as
 * far as they run without a gap. */
static void copy_args(lua_State *L, lnr_paths_t *p) {
  if (lua_getglobal(L, "arg") != LUA_TTABLE) {
    lua_pop(L, 1);
    return;
  }
  int first = 1, last = 0;
  if (string_at(L, 0))
    for (first = 0; first > -1000 && string_at(L, first - 1); first--)
      ;
  while (last < 100000 && string_at(L, last + 1))
    last++;
  int n = last - first + 1;
  p->args = n > 0 ? calloc((size_t)n, sizeof *p->args) : NULL;
  for (int i = 0; p->args != NULL && i < n; i++) {
    lua_rawgeti(L, -1, first + i);
    p->args[i] = strdup(lua_tostring(L, -1));
    lua_pop(L, 1);
  }
  p->first = first;
  p->nargs = p->args != NULL ? n : 0;
  lua_pop(L, 1);
}

void *lnr_paths_new(lua_State *L) {
  lnr_paths_t *p = calloc(1, sizeof *p);
  lua_getglobal(L, "package");
  lua_getfield(L, -1, "path");
  p->path = lua_isstring(L, -1) ? strdup(lua_tostring(L, -1)) : NULL;
  lua_getfield(L, -2, "cpath");
  p->cpath = lua_isstring(L, -1) ? strdup(lua_tostring(L, -1)) : NULL;
  lua_pop(L, 3);
  copy_args(L, p);
  lua_getglobal(L, "NETRUN_THREADS");
  p->threads = lua_isinteger(L, -1) ? lua_tointeger(L, -1) : 0;
  lua_pop(L, 1);
  return p;
}

void lnr_paths_free(void *ud) {
  lnr_paths_t *p = ud;
  if (p) {
    free(p->path);
    free(p->cpath);
    for (int i = 0; i < p->nargs; i++)
      free(p->args[i]);
    free(p->args);
    free(p);
  }
}

/* ---- the main state ---------------------------------------------------------- */

/* The main state registers itself the first time the module is opened on
 * a thread that is not a loop. A sentinel's __gc tears the runtime down
 * when that state closes: the modules' teardowns, in table order. */
static int sentinel_gc(lua_State *L) {
  if (!lnr_modules_teardown(L))
    return 0;      /* a loop is stuck and may use all this: the process ends */
  if (main_state && main_state->L == L) {
    lnr_modules_close(main_state);          /* while its loop is there */
    nr_loop_t *m = atomic_exchange(&main_loop, NULL);
    nr_loop_set_data(m, NULL);
    nr_loop_free(m);
    free(main_state);
    main_state = NULL;
  }
  forget_states();
  return 0;
}

/* A second non-loop state's context is a userdata of that state, kept
 * until it closes. */
static int second_state_gc(lua_State *L) {
  lnr_modules_close(lua_touserdata(L, 1));
  return 0;
}

void lnr_open_state(lua_State *L) {
  if (lnr_state(L) != NULL)
    return;                                   /* a loop state, already set */
  if (main_state != NULL) {
    /* A second non-loop state (rare): give it a context on the same loop. */
    no_cache = true;
    forget_states();
    lnr_state_t *S = lua_newuserdatauv(L, lnr_state_size(), 0);
    memset(S, 0, lnr_state_size());
    S->L = L;
    S->loop = lnr_main_loop();
    lua_newtable(L);                         /* its parts close with it */
    lua_pushcfunction(L, second_state_gc);
    lua_setfield(L, -2, "__gc");
    lua_setmetatable(L, -2);
    luaL_ref(L, LUA_REGISTRYINDEX);          /* keep it alive */
    lua_pushlightuserdata(L, S);
    lua_rawsetp(L, LUA_REGISTRYINDEX, &STATE_KEY);
    return;
  }
  nr_loop_t *m = nr_loop_new(&(nr_loop_opts_t){.name = "main", .external = true});
  main_state = calloc(1, lnr_state_size());
  if (m == NULL || main_state == NULL)
    luaL_error(L, "netrun: cannot create the main loop");
  main_state->L = L;
  main_state->loop = m;
  main_state->main = true;
  nr_loop_set_data(m, main_state);
  atomic_store(&main_loop, m);              /* set up: others may see it */
  lua_pushlightuserdata(L, main_state);
  lua_rawsetp(L, LUA_REGISTRYINDEX, &STATE_KEY);
  lua_newuserdatauv(L, 1, 0);
  lua_newtable(L);
  lua_pushcfunction(L, sentinel_gc);
  lua_setfield(L, -2, "__gc");
  lua_setmetatable(L, -2);
  luaL_ref(L, LUA_REGISTRYINDEX);
}

/* ---- small helpers ---------------------------------------------------------- */

double lnr_checkseconds(lua_State *L, int idx, const char *what) {
  double s = luaL_checknumber(L, idx);
  if (!(s >= 0) || s > 1e9)
    luaL_error(L, "%s: expected a duration in seconds >= 0, got %f", what, s);
  return s;
}

uint64_t lnr_ns(double seconds) { return (uint64_t)(seconds * 1e9 + 0.5); }

int lnr_error_code(lua_State *L, const char *prefix, int code,
                   const char *msg) {
  lua_pushnil(L);
  lua_pushfstring(L, "%s: %s", prefix, msg ? msg : nr_strerror(code));
  lua_pushinteger(L, code);
  return 3;
}

void lnr_new_class(lua_State *L, const char *name, const luaL_Reg *methods,
                   const luaL_Reg *meta) {
  luaL_newmetatable(L, name);
  if (meta)
    luaL_setfuncs(L, meta, 0);
  if (methods) {
    lua_newtable(L);
    luaL_setfuncs(L, methods, 0);
    lua_setfield(L, -2, "__index");
  }
  lua_pushstring(L, name);
  lua_setfield(L, -2, "__name");
  lua_pop(L, 1);
}

void lnr_push_weak(lua_State *L, const void *key, const char *mode) {
  if (lua_rawgetp(L, LUA_REGISTRYINDEX, key) == LUA_TTABLE)
    return;
  lua_pop(L, 1);
  lua_newtable(L);
  lua_newtable(L);
  lua_pushstring(L, mode);
  lua_setfield(L, -2, "__mode");
  lua_setmetatable(L, -2);
  lua_pushvalue(L, -1);
  lua_rawsetp(L, LUA_REGISTRYINDEX, key);
}
