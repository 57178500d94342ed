/*
 * console.c -- what the REPL needs from C: line editing and history
 * (libedit) when stdin is a terminal, plain reads otherwise; waits that
 * Ctrl-C can abandon; the peer credentials of a console connection; and
 * starting the console socket. The REPL itself is Lua (netrun.repl).
 *
 * Reading a line waits on stdin and on a wake pipe: the signal thread
 * writes to it on Ctrl-C (the line is discarded) and `netrun attach`'s
 * connection does when the server goes (the read ends at once), so the
 * main thread is never stuck in read() while something else happened.
 */
#include <editline/readline.h>
#include <errno.h>
#include <fcntl.h>
#include <libgen.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include "lmain.h"
#include "lnr.h"

static _Atomic int repl_active, interrupted, hangup;
static int wake_pipe[2] = {-1, -1};         /* [0] polled by line reads */
static pthread_once_t wake_once = PTHREAD_ONCE_INIT;

static void make_wake_pipe(void) {
  if (pipe2(wake_pipe, O_CLOEXEC | O_NONBLOCK) < 0)
    wake_pipe[0] = wake_pipe[1] = -1;
}

/* Wake a line read (any thread; the signal thread too). */
static void wake_reader(void) {
  if (wake_pipe[1] >= 0) {
    ssize_t w = write(wake_pipe[1], "", 1); /* full pipe: already woken */
    (void)w;
  }
}

static void drain_wake_pipe(void) {
  char buf[64];
  while (wake_pipe[0] >= 0 && read(wake_pipe[0], buf, sizeof buf) > 0)
    ;
}

static int noop(void *arg) {
  (void)arg;
  return 0;
}

/* A task wakes the main thread if it is waiting in its loop. */
static void wake_main(void) {
  nr_loop_t *m = lnr_main_loop();
  if (m)
    nr_loop_execute(m, noop, NULL);
}

/* Called by the executable's signal thread on SIGINT. Returns true if the
 * REPL took it (then the process goes on). */
bool lnr_repl_interrupt(void) {
  if (!atomic_load(&repl_active))
    return false;
  atomic_store(&interrupted, 1);
  wake_main();
  wake_reader();
  return true;
}

/* core.repl_mode(on): SIGINT interrupts waits instead of shutting down. */
static int l_repl_mode(lua_State *L) {
  atomic_store(&repl_active, lua_toboolean(L, 1));
  return 0;
}

/* core.repl_hangup(): from any thread, end the line being read (and every
 * later one) with nil, "closed": `netrun attach`'s server went away. */
static int l_repl_hangup(lua_State *L) {
  (void)L;
  atomic_store(&hangup, 1);
  wake_reader();
  return 0;
}

/* core.repl_wait(future [, secs]): wait running the main loop; returns
 * true when done, false if Ctrl-C abandoned the wait (the work goes on),
 * nil after secs. */
static int l_repl_wait(lua_State *L) {
  nr_promise_t *p = lnr_check_handle(L, 1, LNR_FUTURE);
  nr_loop_t *m = lnr_main_loop();
  double secs = luaL_optnumber(L, 2, -1);
  uint64_t deadline = secs >= 0 ? nr_now() + lnr_ns(secs) : UINT64_MAX;
  atomic_store(&interrupted, 0);
  while (!nr_promise_is_done(p)) {
    if (atomic_exchange(&interrupted, 0)) {
      lua_pushboolean(L, 0);
      return 1;
    }
    if (nr_now() >= deadline) {
      lua_pushnil(L);
      return 1;
    }
    if (m && nr_loop_current() == m)
      nr_loop_run_once(m, NR_MS(50));
    else
      nr_promise_wait(p, NR_MS(50));
  }
  lua_pushboolean(L, 1);
  return 1;
}

/* core.interrupted(): consume a pending Ctrl-C. */
static int l_interrupted(lua_State *L) {
  lua_pushboolean(L, atomic_exchange(&interrupted, 0));
  return 1;
}

static int l_isatty(lua_State *L) {
  lua_pushboolean(L, isatty((int)luaL_optinteger(L, 1, 0)));
  return 1;
}

static char *history_path(void) {
  const char *home = getenv("HOME");
  static char path[512];
  if (home == NULL || !*home)
    return NULL;
  snprintf(path, sizeof path, "%s/.netrun_history", home);
  return path;
}

/* ---- tab completion -------------------------------------------------------
 * libedit asks for candidates one at a time; the Lua completer answers with
 * an array of whole words at once, kept here while readline runs (which is
 * always on the main thread, inside l_readline). */
static lua_State *comp_L;        /* the state calling readline, or NULL */
static int comp_ref = LUA_NOREF; /* array of candidates for the current word */

static char *next_candidate(const char *text, int state) {
  static lua_Integer i;
  lua_State *L = comp_L;
  if (L == NULL)
    return NULL;
  if (state == 0) {
    i = 0;
    luaL_unref(L, LUA_REGISTRYINDEX, comp_ref);
    comp_ref = LUA_NOREF;
    lua_pushvalue(L, 2);                     /* the completer */
    lua_pushstring(L, text);
    if (lua_pcall(L, 1, 1, 0) != LUA_OK || !lua_istable(L, -1)) {
      lua_pop(L, 1);                         /* error or no candidates */
      return NULL;
    }
    comp_ref = luaL_ref(L, LUA_REGISTRYINDEX);
  }
  if (comp_ref == LUA_NOREF)
    return NULL;
  lua_rawgeti(L, LUA_REGISTRYINDEX, comp_ref);
  lua_rawgeti(L, -1, ++i);
  const char *c = lua_tostring(L, -1);
  char *dup = c ? strdup(c) : NULL;
  lua_pop(L, 2);
  return dup;
}

static char **complete(const char *text, int start, int end) {
  (void)start, (void)end;
  rl_attempted_completion_over = 1;          /* never complete file names */
  return rl_completion_matches(text, next_candidate);
}

/* ---- reading a line ------------------------------------------------------
 * Every byte of a line is read after a poll on stdin and the wake pipe. A
 * Ctrl-C (interrupted) or a hangup ends the read as end of input would;
 * `cancel` says which. */
enum { READ_OK, READ_EOF, READ_INTERRUPTED, READ_CLOSED };
static int cancel;

/* One byte of stdin, or -1 with `cancel` set. */
static int read_byte(void) {
  for (;;) {
    if (atomic_load(&hangup)) {
      cancel = READ_CLOSED;
      return -1;
    }
    if (atomic_exchange(&interrupted, 0)) {
      cancel = READ_INTERRUPTED;
      return -1;
    }
    struct pollfd fds[2] = {{.fd = 0, .events = POLLIN},
                            {.fd = wake_pipe[0], .events = POLLIN}};
    if (poll(fds, wake_pipe[0] >= 0 ? 2 : 1, -1) < 0) {
      if (errno == EINTR)
        continue;
      cancel = READ_EOF;
      return -1;
    }
    if (fds[1].revents)
      drain_wake_pipe();                     /* then look at the flags */
    if (fds[0].revents) {
      unsigned char c;
      ssize_t n = read(0, &c, 1);
      if (n == 1)
        return c;
      if (n < 0 && (errno == EINTR || errno == EAGAIN))
        continue;
      cancel = READ_EOF;
      return -1;
    }
  }
}

/* libedit's way to read a character (bytes, as in the C locale). */
static int getc_hook(FILE *f) {
  (void)f;
  return read_byte();
}

static void init_editline(void) {
  rl_getc_function = getc_hook;              /* before libedit initialises */
  using_history();
  if (history_path())
    read_history(history_path());
  /* '.' and ':' stay inside a word: "string.fo" completes as a path. */
  rl_completer_word_break_characters = " \t\n\"\\'`@$><=;|&{(,+-*/%^#~[]";
  rl_attempted_completion_function = complete;
}

static int edited_line(lua_State *L, const char *prompt) {
  static bool loaded;
  if (!loaded) {
    loaded = true;
    init_editline();
  }
  lua_settop(L, 2);
  comp_L = lua_isfunction(L, 2) ? L : NULL;
  char *line = readline(prompt);
  comp_L = NULL;
  luaL_unref(L, LUA_REGISTRYINDEX, comp_ref);
  comp_ref = LUA_NOREF;
  if (line == NULL)
    return 0;
  if (*line) {
    add_history(line);
    if (history_path())
      write_history(history_path());
  }
  lua_pushstring(L, line);
  free(line);
  return 1;
}

static int plain_line(lua_State *L, const char *prompt) {
  fputs(prompt, stdout);
  fflush(stdout);
  luaL_Buffer b;
  luaL_buffinit(L, &b);
  int c, n = 0;
  while ((c = read_byte()) != -1 && c != '\n') {
    luaL_addchar(&b, (char)c);
    n++;
  }
  if (c == -1 && (n == 0 || cancel != READ_EOF))
    return 0;
  luaL_pushresult(&b);
  return 1;
}

/* core.readline(prompt [, completer]): a line with editing, history and,
 * given completer(word) -> array of words, tab completion on a terminal;
 * a plain line otherwise. At end of input nil; after Ctrl-C false,
 * "interrupted" (the line is discarded); once core.repl_hangup() was
 * called nil, "closed". */
static int l_readline(lua_State *L) {
  const char *prompt = luaL_optstring(L, 1, "");
  drain_wake_pipe();
  atomic_store(&interrupted, 0);              /* a Ctrl-C before the prompt */
  cancel = READ_OK;
  if (isatty(0) ? edited_line(L, prompt) : plain_line(L, prompt))
    return 1;
  if (cancel == READ_INTERRUPTED) {
    lua_pushboolean(L, 0);
    lua_pushliteral(L, "interrupted");
    return 2;
  }
  if (cancel == READ_CLOSED) {
    lua_pushnil(L);
    lua_pushliteral(L, "closed");
    return 2;
  }
  return 0;
}

/* core.peer_credentials(ch) -> pid, uid, gid of a unix socket's peer. */
static int l_peer_credentials(lua_State *L) {
  nr_channel_t *ch = lnr_check_handle(L, 1, LNR_CHANNEL);
  struct ucred cr;
  socklen_t len = sizeof cr;
  if (getsockopt(nr_channel_fd(ch), SOL_SOCKET, SO_PEERCRED, &cr, &len) < 0)
    return lnr_error_code(L, "peer_credentials", -errno, NULL);
  lua_pushinteger(L, cr.pid);
  lua_pushinteger(L, cr.uid);
  lua_pushinteger(L, cr.gid);
  return 3;
}

/* core.main_loop(): the main thread's loop, to send work to the main state. */
static int l_main_loop(lua_State *L) {
  lnr_push_handle(L, LNR_LOOP, lnr_main_loop());
  return 1;
}

static int l_getpid(lua_State *L) {
  lua_pushinteger(L, (lua_Integer)getpid());
  return 1;
}

static int l_getuid(lua_State *L) {
  lua_pushinteger(L, (lua_Integer)getuid());
  return 1;
}

/* core.exit_now(status): leave at once, without closing any state or
 * waiting for any loop (the REPL's :quit when a loop is stuck in Lua,
 * whose thread would never be joined). */
static int l_exit_now(lua_State *L) {
  int status = (int)luaL_optinteger(L, 1, 0);
  fflush(stdout);
  fflush(stderr);
  _exit(status);
  return 0;
}

static void open_console(lua_State *L) {
  pthread_once(&wake_once, make_wake_pipe);   /* before repl_mode() is on */
  static const luaL_Reg funcs[] = {
      {"repl_mode", l_repl_mode}, {"repl_wait", l_repl_wait},
      {"repl_hangup", l_repl_hangup}, {"exit_now", l_exit_now},
      {"interrupted", l_interrupted}, {"isatty", l_isatty},
      {"readline", l_readline}, {"peer_credentials", l_peer_credentials},
      {"getuid", l_getuid}, {"main_loop", l_main_loop},
      {"getpid", l_getpid}, {NULL, NULL}};
  luaL_setfuncs(L, funcs, 0);
}

/* The directory a socket path would be created in exists (checked first,
 * to say so in one line). */
static int check_socket_dir(const char *path) {
  char copy[4096];
  snprintf(copy, sizeof copy, "%s", path);
  const char *dir = dirname(copy);
  struct stat st;
  int rc = stat(dir, &st);
  if (rc == 0 && S_ISDIR(st.st_mode))
    return 0;
  if (rc == 0 || errno == ENOENT || errno == ENOTDIR)
    fprintf(stderr, "netrun: --console %s: directory %s does not exist\n",
            path, dir);
  else
    fprintf(stderr, "netrun: --console %s: %s: %s\n", path, dir,
            strerror(errno));
  return -1;
}

/* `netrun --console PATH`: listen before the script runs. */
int lnr_console_start(lua_State *L, const char *path) {
  if (check_socket_dir(path) < 0)
    return -1;
  lua_getglobal(L, "require");
  lua_pushliteral(L, "netrun.console");
  if (lnr_pcall(L, 1, 1) == LUA_OK) {
    lua_getfield(L, -1, "listen");
    lua_remove(L, -2);
    lua_pushstring(L, path);
    if (lnr_pcall(L, 1, 0) == LUA_OK)
      return 0;
  }
  nr_log_flush();                            /* log lines first, in order */
  const char *msg = lua_tostring(L, -1);     /* one line: no traceback */
  int len = msg ? (int)strcspn(msg, "\n") : 0;
  fprintf(stderr, "netrun: --console %s: %.*s\n", path, len, msg ? msg : "");
  lua_pop(L, 1);
  return -1;
}

lnr_module_t lnr_console_module = {.name = "console", .open = open_console};
