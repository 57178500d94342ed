/*
 * lops.c -- what operating a live process needs from C (DESIGN.md §8.5):
 * file stamps for hot reload, forgetting a state's cached copies after
 * one, a SIGHUP's reload on the main thread, the HTTP response counters
 * for netrun.metrics, and the raw terminal `netrun top` reads keys from.
 * The policy (which modules, all-or-nothing, rendering) is Lua:
 * lua/netrun/reload.lua, metrics.lua and top.lua.
 */
#include <errno.h>
#include <poll.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <termios.h>
#include <unistd.h>

#include "codec/http.h"
#include "lmain.h"
#include "lnr.h"

/* core.file_stamp(path) --> "mtime_ns:size:inode", or nil, message: what
 * tells a changed file from the one loaded (an editor that writes a new
 * file and renames it changes the inode even within one mtime tick). */
static int l_file_stamp(lua_State *L) {
  const char *path = luaL_checkstring(L, 1);
  struct stat st;
  if (stat(path, &st) < 0) {
    lua_pushnil(L);
    lua_pushfstring(L, "%s: %s", path, strerror(errno));
    return 2;
  }
  lua_pushfstring(L, "%I:%I:%I",
                  (lua_Integer)st.st_mtim.tv_sec * 1000000000 + st.st_mtim.tv_nsec,
                  (lua_Integer)st.st_size, (lua_Integer)st.st_ino);
  return 1;
}

/* core.forget_caches(): after a reload's swap in this state, what the
 * modules cached of the code it ran is dropped (each module's reload
 * hook: the server inits it unpacked, its map of module values); the next
 * channel unpacks its init afresh, resolving the modules anew. */
static int l_forget_caches(lua_State *L) {
  lnr_modules_reload(L);
  return 0;
}

/* core.http_stats() --> { [status] = responses, ... } over every thread,
 * only the statuses seen. */
static int l_http_stats(lua_State *L) {
  uint64_t n[NR_HTTP_STATUS_MAX - NR_HTTP_STATUS_MIN + 1];
  nr_http_status_counts(n);
  lua_newtable(L);
  for (int i = 0; i <= NR_HTTP_STATUS_MAX - NR_HTTP_STATUS_MIN; i++)
    if (n[i] > 0) {
      lua_pushinteger(L, (lua_Integer)n[i]);
      lua_rawseti(L, -2, i + NR_HTTP_STATUS_MIN);
    }
  return 1;
}

/* ---- the terminal of `netrun top` ----------------------------------------- */

static struct termios saved_tio;
static bool raw_on;

/* core.term_raw(on): keys arrive one at a time, unechoed (stdin a tty);
 * false restores the terminal. Returns whether stdin is a terminal. */
static int l_term_raw(lua_State *L) {
  bool on = lua_toboolean(L, 1);
  if (!isatty(STDIN_FILENO)) {
    lua_pushboolean(L, 0);
    return 1;
  }
  if (on && !raw_on && tcgetattr(STDIN_FILENO, &saved_tio) == 0) {
    struct termios t = saved_tio;
    t.c_lflag &= ~(tcflag_t)(ICANON | ECHO | ISIG);
    t.c_cc[VMIN] = 1;
    t.c_cc[VTIME] = 0;
    raw_on = tcsetattr(STDIN_FILENO, TCSANOW, &t) == 0;
  } else if (!on && raw_on) {
    tcsetattr(STDIN_FILENO, TCSANOW, &saved_tio);
    raw_on = false;
  }
  lua_pushboolean(L, 1);
  return 1;
}

/* core.term_key(seconds) --> the key pressed (a one-byte string), nil
 * when none came in time, false at the end of stdin. */
static int l_term_key(lua_State *L) {
  double secs = luaL_checknumber(L, 1);
  struct pollfd pfd = {.fd = STDIN_FILENO, .events = POLLIN};
  int ms = secs <= 0 ? 0 : (int)(secs * 1000 + 0.5);
  int rc;
  do
    rc = poll(&pfd, 1, ms);
  while (rc < 0 && errno == EINTR);
  if (rc <= 0) {
    lua_pushnil(L);
    return 1;
  }
  char c;
  ssize_t r = read(STDIN_FILENO, &c, 1);
  if (r == 1)
    lua_pushlstring(L, &c, 1);
  else
    lua_pushboolean(L, 0);
  return 1;
}

/* ---- SIGHUP --------------------------------------------------------------- */

static int reload_task(void *arg) {
  (void)arg;
  lnr_state_t *S = lnr_current_state();
  if (S == NULL)
    return 0;
  lua_State *L = S->L;
  lua_getglobal(L, "require");
  lua_pushliteral(L, "netrun.reload");
  if (lnr_pcall(L, 1, 1) == LUA_OK) {
    lua_getfield(L, -1, "on_signal");
    lua_remove(L, -2);
    if (lnr_pcall(L, 0, 0) == LUA_OK)
      return 0;
  }
  nr_log(NR_LOG_ERROR, "reload on SIGHUP: %s", lua_tostring(L, -1));
  lua_pop(L, 1);
  return 0;
}

void lnr_reload_signal(void) {
  nr_loop_t *m = lnr_main_loop();
  if (m == NULL || nr_loop_execute(m, reload_task, NULL) < 0)
    nr_log(NR_LOG_WARN, "SIGHUP: no netrun main state to reload; ignored");
}

static void open_ops(lua_State *L) {
  static const luaL_Reg funcs[] = {
      {"file_stamp", l_file_stamp}, {"forget_caches", l_forget_caches},
      {"http_stats", l_http_stats}, {"term_raw", l_term_raw},
      {"term_key", l_term_key}, {NULL, NULL}};
  luaL_setfuncs(L, funcs, 0);
}

lnr_module_t lnr_ops_module = {.name = "ops", .open = open_ops};
