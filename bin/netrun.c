/*
 * netrun.c -- the `netrun` executable: runs a script (the `lua` command's
 * conventions: arg table, `-` for stdin, -e/-l/-i/-v/-h, exit status 1 and
 * a traceback on failure), then lives while anything of it is alive
 * (netrun.run: a loop with a channel, a timer, a task or work owed).
 *
 * Signals: every thread blocks SIGINT/SIGTERM (the mask is set before any
 * loop thread exists, so they inherit it); one thread takes them with
 * sigwait. The first asks every group to shut down gracefully, which lets
 * netrun.run() return and the process exit 0; a second exits at once with
 * status 130. A signal that comes while the script still runs takes effect
 * when it returns (groups made after it are shut down too). The shutdown
 * timeout (NETRUN_SHUTDOWN_TIMEOUT, default 15 s) is enforced here too, not
 * only by the loops: a loop stuck in a task never checks it. The stall
 * watchdog interrupts a stuck Lua run once it has passed; past it and a
 * margin, the loops still running (stuck in C) are named and the process
 * exits with status 1.
 *
 * SIGHUP means what it meant to the process's parent. A process started
 * with a controlling terminal (run from a shell, in tmux) gets it when
 * that terminal goes away (the window closed, the ssh connection dropped,
 * `tmux kill-session`): it shuts down gracefully, as on SIGTERM -- an
 * orphan serving on would hold its port with no one to stop it. The kernel
 * and the shell may both send it, so a repeated SIGHUP is not the "second
 * signal". A process without one (a service: systemd, setsid, a container
 * without a tty), or one that was started with SIGHUP ignored (nohup),
 * takes it as a request for a hot reload if it runs a script
 * (netrun.reload, run on the main thread the next time it waits inside
 * netrun; its outcome is logged). Elsewhere (the bare REPL, attach, top,
 * reload) it keeps its default action: the process ends. Whether there is
 * a terminal is decided at start: by the time a hangup arrives, the
 * kernel has already taken it away.
 *
 * SIGPIPE is caught by a handler that does nothing rather than ignored:
 * writes to a closed pipe fail with EPIPE all the same, and a caught
 * signal, unlike an ignored one, is back to its default in the programs
 * the script starts (io.popen, os.execute).
 *
 * A blocked mask, unlike a handler, survives exec, and glibc's popen() and
 * system() spawn with the caller's mask (posix_spawn runs no atfork
 * handler): a program started by a script ignored kill -TERM and Ctrl-C.
 * So every state (this file's, each loop's) gets lspawn.c's os.execute and
 * io.popen, which start `/bin/sh -c CMD` with an empty mask and SIGINT,
 * SIGTERM, SIGHUP, SIGPIPE at their default (one that was ignored when
 * netrun started, nohup's SIGHUP, stays ignored). Unblocking and catching
 * these signals with handlers and a self-pipe instead would interrupt
 * blocking calls on every thread (EINTR out of epoll_wait, sigtimedwait,
 * a script's reads) and let any thread take the signal. netrun's own fds
 * (epoll, eventfd, sockets, pipes) are all O_CLOEXEC: programs get none.
 */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <lauxlib.h>
#include <lua.h>
#include <lualib.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "bindings/lmain.h"
#include "netrun.h"

static const char *progname = "netrun";
static _Atomic int signals_seen;
static _Atomic bool hup_reloads;     /* a script runs: SIGHUP reloads */
static bool hup_stops;               /* started in a terminal: SIGHUP stops */

/* The standard libraries, with os.execute and io.popen that start programs
 * with none of the signals blocked (lspawn.c) and a print that writes each
 * line at once (lprint.c). */
static void open_libs(lua_State *L) {
  luaL_openlibs(L);
  lnr_open_spawn(L);
  lnr_open_print(L);
}

#define SHUTDOWN_MARGIN NR_SEC(1)
#define NO_DEADLINE UINT64_MAX

/* When the signal thread gives up on a shutdown (NO_DEADLINE: none asked). */
static _Atomic uint64_t deadline = NO_DEADLINE;

/* NETRUN_SHUTDOWN_TIMEOUT in seconds, else 15. */
static uint64_t shutdown_timeout(void) {
  const char *s = getenv("NETRUN_SHUTDOWN_TIMEOUT");
  char *end = NULL;
  double v = s ? strtod(s, &end) : -1;
  if (s == NULL || end == s || *end != '\0' || !(v >= 0) || v > 1e6)
    return NR_SEC(15);
  return (uint64_t)(v * 1e9);
}

static void usage(FILE *f) {
  fprintf(f,
          "usage: %s [options] [script [args...]]\n"
          "  -e CODE          run CODE\n"
          "  -l MOD           require MOD into the global MOD\n"
          "  -i               enter the REPL after running the script\n"
          "  -t N             default number of worker threads\n"
          "  --console PATH   serve a REPL console on a unix socket\n"
          "  -v, --version    show the version\n"
          "  -h               show this help\n"
          "  -                run stdin as the script\n"
          "  %s attach PATH   a REPL on a live process's console socket\n"
          "  %s reload PATH   hot-reload the changed Lua modules of that process\n"
          "  %s top [-d SECONDS] [-n COUNT] PATH   a live view of its loops\n",
          progname, progname, progname, progname);
}

/* The shutdown a signal asked for is overdue: if a loop is still running,
 * name it and exit; false if every loop has terminated (the main thread is
 * on its way out, or busy with something else). */
static bool give_up(uint64_t timeout) {
  if (lnr_log_unterminated("shutdown timed out") == 0)
    return false;
  nr_log(NR_LOG_ERROR, "shutdown did not finish within %.1f s: exiting now",
         (double)timeout / 1e9);
  nr_log_flush();                 /* _exit skips the log's own flush */
  _exit(1);
}

/* Ask every group to shut down, and start the clock on it. */
static void request_shutdown(uint64_t timeout) {
  lnr_shutdown_groups_async(timeout);
  atomic_store(&deadline, nr_now() + timeout + SHUTDOWN_MARGIN);
}

/* The next signal, or 0 once the deadline has passed. */
static int next_signal(const sigset_t *set) {
  for (;;) {
    int sig;
    uint64_t dl = atomic_load(&deadline);
    if (dl == NO_DEADLINE) {
      if (sigwait(set, &sig) == 0)
        return sig;
      continue;
    }
    uint64_t now = nr_now();
    if (now >= dl)
      return 0;
    uint64_t left = dl - now;
    struct timespec ts = {(time_t)(left / 1000000000ull),
                          (long)(left % 1000000000ull)};
    sig = sigtimedwait(set, NULL, &ts);
    if (sig > 0)
      return sig;
  }
}

static void *signal_thread(void *arg) {
  sigset_t *set = arg;
  uint64_t timeout = shutdown_timeout();
  for (;;) {
    int sig = next_signal(set);
    if (sig == 0) {
      if (!give_up(timeout))
        atomic_store(&deadline, NO_DEADLINE);
      continue;
    }
    if (sig == SIGINT && lnr_repl_interrupt())
      continue;                           /* the REPL abandons its wait */
    if (sig == SIGHUP && hup_stops && atomic_load(&hup_reloads)) {
      if (atomic_fetch_add(&signals_seen, 1) == 0) {
        nr_log(NR_LOG_INFO, "SIGHUP: the terminal is gone: shutting down "
               "gracefully");
        request_shutdown(timeout);
      }
      continue;                           /* the kernel's and the shell's */
    }
    if (sig == SIGHUP && atomic_load(&hup_reloads)) {
      nr_log(NR_LOG_INFO, "SIGHUP: reloading the changed Lua modules");
      lnr_reload_signal();
      continue;
    }
    if (sig == SIGHUP) {                  /* its default: terminate */
      sigset_t hup;
      sigemptyset(&hup);
      sigaddset(&hup, SIGHUP);
      signal(SIGHUP, SIG_DFL);
      pthread_sigmask(SIG_UNBLOCK, &hup, NULL);
      raise(SIGHUP);
      continue;
    }
    if (atomic_fetch_add(&signals_seen, 1) > 0) {
      static const char msg[] = "netrun: second signal, exiting now\n";
      nr_log_flush();                     /* bounded: stderr may be stuck */
      ssize_t w = write(STDERR_FILENO, msg, sizeof msg - 1);
      (void)w;
      _exit(130);
    }
    nr_log(NR_LOG_INFO, "signal %d: shutting down gracefully (again to "
           "exit at once)", sig);
    request_shutdown(timeout);
  }
  return NULL;
}

static void on_sigpipe(int sig) { (void)sig; }

/* Whether a hangup means the terminal went away: the process has a
 * controlling terminal, and SIGHUP was not ignored when it started
 * (nohup asks for it to survive). Before SIGHUP is blocked. */
static bool started_in_terminal(void) {
  struct sigaction sa;
  if (sigaction(SIGHUP, NULL, &sa) == 0 && sa.sa_handler == SIG_IGN)
    return false;
  int fd = open("/dev/tty", O_RDONLY | O_NOCTTY | O_CLOEXEC);
  if (fd < 0)
    return false;                         /* ENXIO: no controlling terminal */
  close(fd);
  return true;
}

static void start_signal_thread(void) {
  hup_stops = started_in_terminal();
  static sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGINT);
  sigaddset(&set, SIGTERM);
  sigaddset(&set, SIGHUP);
  pthread_sigmask(SIG_BLOCK, &set, NULL);
  struct sigaction sa = {.sa_handler = on_sigpipe, .sa_flags = SA_RESTART};
  sigemptyset(&sa.sa_mask);
  sigaction(SIGPIPE, &sa, NULL);
  pthread_t th;
  pthread_create(&th, NULL, signal_thread, &set);
  pthread_detach(th);
}

/* ---- running chunks ------------------------------------------------------ */

static int report(lua_State *L, int status) {
  if (status != LUA_OK) {
    nr_log_flush();                       /* log lines first, in order */
    fprintf(stderr, "%s: %s\n", progname, lua_tostring(L, -1));
    fflush(stderr);
    lua_pop(L, 1);
  }
  return status;
}

/* Every chunk runs as the bindings run Lua: lnr_pcall, whose message
 * handler adds the traceback. */
static int docall(lua_State *L, int narg, int nres) {
  return lnr_pcall(L, narg, nres);
}

static int dostring(lua_State *L, const char *s, const char *name) {
  int status = luaL_loadbuffer(L, s, strlen(s), name);
  if (status == LUA_OK)
    status = docall(L, 0, 0);
  return report(L, status);
}

static int dolibrary(lua_State *L, const char *name) {
  lua_getglobal(L, "require");
  lua_pushstring(L, name);
  int status = docall(L, 1, 1);
  if (status == LUA_OK)
    lua_setglobal(L, name);
  return report(L, status);
}

/* The arg table: arg[0] is the script, arg[-n..-1] what came before it. */
static void create_arg_table(lua_State *L, char **argv, int argc, int script) {
  lua_createtable(L, argc - script - 1, script + 1);
  for (int i = 0; i < argc; i++) {
    lua_pushstring(L, argv[i]);
    lua_rawseti(L, -2, i - script);
  }
  lua_setglobal(L, "arg");
}

static int dofile_args(lua_State *L, char **argv, int argc, int script) {
  const char *fname = argv[script];
  if (strcmp(fname, "-") == 0)
    fname = NULL;                          /* stdin */
  else
    lnr_add_script_dir(L, fname);          /* its modules, from any cwd */
  int status = luaL_loadfile(L, fname);
  if (status == LUA_OK) {
    int n = argc - script - 1;
    luaL_checkstack(L, n + 3, "too many arguments to script");
    for (int i = 1; i <= n; i++)
      lua_pushstring(L, argv[script + i]);
    status = docall(L, n, 0);
  }
  return report(L, status);
}

/* If the script used netrun, wait for every group (netrun.run()). */
static int run_groups(lua_State *L) {
  luaL_getsubtable(L, LUA_REGISTRYINDEX, LUA_LOADED_TABLE);
  int used = lua_getfield(L, -1, "netrun.core") == LUA_TTABLE;
  if (!used) {
    lua_pop(L, 2);
    return LUA_OK;
  }
  if (atomic_load(&signals_seen) > 0)     /* came while the script ran */
    request_shutdown(shutdown_timeout());
  lua_getfield(L, -1, "run");
  int status = docall(L, 0, 0);
  lua_pop(L, 2);
  return report(L, status);
}

static int run_repl(lua_State *L) {
  lua_getglobal(L, "require");
  lua_pushliteral(L, "netrun.repl");
  int status = docall(L, 1, 1);
  if (status == LUA_OK) {
    lua_getfield(L, -1, "run");
    lua_remove(L, -2);
    status = docall(L, 0, 0);
  }
  return report(L, status);
}

/* `netrun attach PATH`: returns the exit status netrun.repl.attach gives
 * (1 if it fails, with its traceback). */
static int attach(lua_State *L, const char *path) {
  lua_getglobal(L, "require");
  lua_pushliteral(L, "netrun.repl");
  int status = docall(L, 1, 1);
  if (status == LUA_OK) {
    lua_getfield(L, -1, "attach");
    lua_remove(L, -2);
    lua_pushstring(L, path);
    status = docall(L, 1, 1);
  }
  if (report(L, status) != LUA_OK)
    return 1;
  int rc = (int)lua_tointeger(L, -1);
  lua_pop(L, 1);
  return rc;
}

/* `netrun reload PATH` and `netrun top ...`: module.fn(arg) returns the
 * exit status; arg is args[0], or (as_table) an array of the n args. */
static int command(lua_State *L, const char *module, const char *fn,
                   char **args, int n, bool as_table) {
  lua_getglobal(L, "require");
  lua_pushstring(L, module);
  int status = docall(L, 1, 1);
  if (status == LUA_OK) {
    lua_getfield(L, -1, fn);
    lua_remove(L, -2);
    if (!as_table) {
      lua_pushstring(L, args[0]);
    } else {
      lua_createtable(L, n, 0);
      for (int i = 0; i < n; i++) {
        lua_pushstring(L, args[i]);
        lua_rawseti(L, -2, i + 1);
      }
    }
    status = docall(L, 1, 1);
  }
  if (report(L, status) != LUA_OK)
    return 1;
  int rc = (int)lua_tointeger(L, -1);
  lua_pop(L, 1);
  return rc;
}

/* os.exit(code [, close]) with `close` defaulting to true: closing the
 * main state releases its groups, so terminated loop threads are joined
 * instead of abandoned (as ThreadSanitizer would rightly report). */
static int os_exit(lua_State *L) {
  lua_settop(L, 2);
  if (lua_isnil(L, 2)) {
    lua_pushboolean(L, 1);
    lua_replace(L, 2);
  }
  lua_pushvalue(L, lua_upvalueindex(1));
  lua_insert(L, 1);
  lua_call(L, 2, 0);
  return 0;
}

/* Where netrun's Lua modules are: share/lua/5.4 beside the directory of
 * the executable itself (/proc/self/exe), which holds them both where
 * `cmake --install` put them (PREFIX/bin/netrun, PREFIX/share/lua/5.4)
 * and in a build tree (build/bin/netrun, build/share/lua/5.4 a link to
 * the sources' lua/). No path is built in, so an installed tree may be
 * moved. -1 if they are not there: package.path alone decides then (the
 * stock /usr/local/share/lua/5.4 of Debian's Lua among others). */
static int lua_dir(char *dir, size_t n) {
  char exe[PATH_MAX], probe[PATH_MAX + 64];
  ssize_t len = readlink("/proc/self/exe", exe, sizeof exe - 1);
  if (len <= 0)
    return -1;
  exe[len] = '\0';
  char *slash = strrchr(exe, '/');
  if (slash == NULL)
    return -1;
  *slash = '\0';
  snprintf(probe, sizeof probe, "%s/../share/lua/5.4", exe);
  if (realpath(probe, dir) == NULL || strlen(dir) + 20 >= n)
    return -1;
  snprintf(probe, sizeof probe, "%s/netrun/init.lua", dir);
  return access(probe, R_OK) == 0 ? 0 : -1;
}

static void set_paths(lua_State *L) {
  lua_getglobal(L, "os");
  lua_getfield(L, -1, "exit");
  lua_pushcclosure(L, os_exit, 1);
  lua_setfield(L, -2, "exit");
  lua_pop(L, 1);

  char dir[PATH_MAX];
  lua_getglobal(L, "package");
  if (lua_dir(dir, sizeof dir) == 0) {
    lua_getfield(L, -1, "path");
    lua_pushfstring(L, "%s/?.lua;%s/?/init.lua;%s", dir, dir,
                    lua_tostring(L, -1));
    lua_setfield(L, -3, "path");
    lua_pop(L, 1);
  }
  luaL_getsubtable(L, LUA_REGISTRYINDEX, LUA_PRELOAD_TABLE);
  lua_pushcfunction(L, luaopen_netrun_core);
  lua_setfield(L, -2, "netrun.core");
  lua_pop(L, 2);
}

typedef struct opts_s {
  int script;                /* index of the script in argv, or 0 */
  bool interactive, version, has_e;
  const char *console;
} opts_t;

/* First pass: find the script and the flags that matter before running. */
static int parse(int argc, char **argv, opts_t *o) {
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i];
    if (a[0] != '-' || strcmp(a, "-") == 0) {
      o->script = i;
      return 0;
    }
    if (strcmp(a, "--") == 0) {
      o->script = i + 1 < argc ? i + 1 : 0;
      return 0;
    }
    if (strcmp(a, "-i") == 0) o->interactive = true;
    else if (strcmp(a, "-v") == 0 || strcmp(a, "--version") == 0)
      o->version = true;
    else if (strcmp(a, "-h") == 0 || strcmp(a, "--help") == 0) return 2;
    else if (strcmp(a, "-e") == 0 || strcmp(a, "-l") == 0 ||
             strcmp(a, "-t") == 0 || strcmp(a, "--console") == 0) {
      if (++i >= argc) {
        fprintf(stderr, "%s: '%s' needs an argument\n", progname, a);
        return 1;
      }
      if (a[1] == 'e') o->has_e = true;
      if (a[1] == '-') o->console = argv[i];
    } else {
      fprintf(stderr, "%s: unrecognized option '%s'\n", progname, a);
      return 1;
    }
  }
  return 0;
}

/* Second pass: run -e and -l in order, set -t. */
static int run_options(lua_State *L, char **argv, int upto) {
  for (int i = 1; i < upto; i++) {
    const char *a = argv[i];
    if (strcmp(a, "-e") == 0 && dostring(L, argv[++i], "=(command line)"))
      return 1;
    if (strcmp(a, "-l") == 0 && dolibrary(L, argv[++i]))
      return 1;
    if (strcmp(a, "-t") == 0) {
      char *end;
      long n = strtol(argv[++i], &end, 10);
      if (*end || n < 1 || n > 1024) {
        fprintf(stderr, "%s: -t needs a thread count from 1 to 1024\n",
                progname);
        return 1;
      }
      lua_pushinteger(L, n);
      lua_setglobal(L, "NETRUN_THREADS");
    }
    if (strcmp(a, "--console") == 0)
      i++;
  }
  return 0;
}

static int pmain(lua_State *L) {
  int argc = (int)lua_tointeger(L, 1);
  char **argv = lua_touserdata(L, 2);
  opts_t o = {0};
  int rc = parse(argc, argv, &o);
  if (rc == 2) {
    usage(stdout);
    lua_pushinteger(L, 0);
    return 1;
  }
  if (rc) {
    usage(stderr);
    lua_pushinteger(L, 1);
    return 1;
  }
  open_libs(L);
  set_paths(L);
  if (o.version)
    printf("netrun %s (%s)\n", NR_VERSION, LUA_RELEASE);
  create_arg_table(L, argv, argc, o.script ? o.script : 0);
  int upto = o.script ? o.script : argc;
  atomic_store(&hup_reloads, o.script != 0 || o.has_e);
  if (run_options(L, argv, upto)) {
    lua_pushinteger(L, 1);
    return 1;
  }
  if (o.console && lnr_console_start(L, o.console) != 0) {
    lua_pushinteger(L, 1);
    return 1;
  }
  if (o.script && dofile_args(L, argv, argc, o.script) != LUA_OK) {
    lua_pushinteger(L, 1);
    return 1;
  }
  if (o.interactive || (!o.script && !o.has_e && !o.version)) {
    if (run_repl(L) != LUA_OK) {
      lua_pushinteger(L, 1);
      return 1;
    }
  }
  lua_pushinteger(L, run_groups(L) == LUA_OK ? 0 : 1);
  return 1;
}

int main(int argc, char **argv) {
  if (argv[0] && argv[0][0])
    progname = "netrun";
  start_signal_thread();
  lua_State *L = luaL_newstate();
  if (L == NULL) {
    fprintf(stderr, "%s: cannot create a Lua state\n", progname);
    return 1;
  }
  int status;
  if (argc >= 2 && strcmp(argv[1], "attach") == 0) {
    if (argc != 3 || argv[2][0] == '\0') {
      fprintf(stderr, "usage: %s attach PATH\n", progname);
      lua_close(L);
      return 2;
    }
    open_libs(L);
    set_paths(L);
    status = attach(L, argv[2]);
  } else if (argc >= 2 && strcmp(argv[1], "reload") == 0) {
    if (argc != 3 || argv[2][0] == '\0') {
      fprintf(stderr, "usage: %s reload PATH\n", progname);
      lua_close(L);
      return 2;
    }
    open_libs(L);
    set_paths(L);
    status = command(L, "netrun.repl", "reload_command", argv + 2, 1, false);
  } else if (argc >= 2 && strcmp(argv[1], "top") == 0) {
    open_libs(L);
    set_paths(L);
    status = command(L, "netrun.top", "main", argv + 2, argc - 2, true);
  } else {
    lua_pushcfunction(L, pmain);
    lua_pushinteger(L, argc);
    lua_pushlightuserdata(L, argv);
    int rc = docall(L, 2, 1);
    status = rc == LUA_OK ? (int)lua_tointeger(L, -1) : 1;
    if (rc != LUA_OK)
      report(L, rc);
  }
  fflush(stdout);
  lua_close(L);
  return status;
}
