/*
 * laccess.c -- netrun.handler.access_log { format = ..., path = ...,
 * buffer = ... }: the Lua constructor of the access log handler
 * (runtime/handler/access_log.c), and core.access_log_stats() for
 * netrun.metrics (lines written and dropped per file).
 *
 * The configuration is a native value of plain bytes: two pointers to
 * objects that live as long as the process (the parsed format, interned;
 * the log file, one per path), so it crosses states as its bytes and the
 * format is parsed once, when the constructor runs.
 *
 * Threads: the constructor may run on any state; the file table is under
 * a mutex held only to look up or add (no Lua call under it).
 */

/***
@module netrun
*/
#include <pthread.h>
#include <string.h>

#include "handler/handler.h"
#include "lnr.h"

#define ACCESS_MT "netrun.handler.access_log"
#define DEFAULT_FORMAT                                                       \
  "$remote_addr - - [$time_local] \"$request\" $status $body_bytes_sent "   \
  "\"$http_referer\" \"$http_user_agent\""
#define DEFAULT_BUFFER ((size_t)1 << 20)
#define MAX_FILES 64

typedef struct access_cfg_s {
  const nr_access_format_t *f;
  nr_log_file_t *file;
} access_cfg_t;

static pthread_mutex_t files_lock = PTHREAD_MUTEX_INITIALIZER;
static struct { nr_log_file_t *file; char path[256]; } files[MAX_FILES];
static int nfiles;

static const nr_handler_t *make_access(lua_State *L, int idx, void **state) {
  access_cfg_t *c = luaL_checkudata(L, idx, ACCESS_MT);
  *state = nr_access_log_new(c->f, c->file);
  if (*state == NULL)
    luaL_error(L, "access_log: out of memory");
  return &nr_access_log_handler;
}

static int access_tostring(lua_State *L) {
  lua_pushliteral(L, ACCESS_MT);
  return 1;
}

/* The file of path, opened once and listed for access_log_stats. */
static nr_log_file_t *file_of(lnr_opts_t *o, const char *path, size_t buffer) {
  pthread_mutex_lock(&files_lock);
  int i = 0;
  while (i < nfiles && strcmp(files[i].path, path) != 0)
    i++;
  nr_log_file_t *f = i < nfiles ? files[i].file : NULL;
  bool full = f == NULL && nfiles == MAX_FILES;
  pthread_mutex_unlock(&files_lock);
  if (f || full) {
    if (full)
      lnr_opts_error(o, "more than %d files", MAX_FILES);
    return f;
  }
  int err = 0;
  if ((f = nr_log_file_open(path, buffer, &err)) == NULL)
    lnr_opts_error(o, "path %s: %s", path, nr_strerror(err));
  pthread_mutex_lock(&files_lock);
  for (i = 0; i < nfiles && files[i].file != f; i++)
    ;
  if (i == nfiles && nfiles < MAX_FILES) {
    files[nfiles].file = f;
    strcpy(files[nfiles].path, path);
    nfiles++;
  }
  pthread_mutex_unlock(&files_lock);
  return f;
}

/***
An access log (nginx's `access_log`): put it right after
`codec.http_server`; it writes one line per answer -- the handlers', and
the codec's own (a 500 for a handler that raised, a 400 for a request it
could not parse) -- and one with status 499 for each request still
unanswered when the client goes away. Lines are written by the log
thread: a loop only copies a line into the file's buffer, and when that
is full (the disk is slower than the lines come) the line is dropped and
counted (`netrun_access_log_dropped_total{path}` in `netrun.metrics`).
Variables: `$remote_addr`, `$remote_port`, `$request`, `$request_method`,
`$request_uri`, `$server_protocol`, `$status`, `$body_bytes_sent`,
`$bytes_sent`, `$request_time`, `$time_iso8601`, `$time_local`, `$msec`,
`$pipe`, `$http_<name>` (a request header), `$upstream_addr` (always "-"
for now); also written `${name}`. Values are escaped as nginx's
`escape=default` (`"`, `\`, control and non-ASCII bytes as `\xXX`); an
empty value is "-". HTTP/1.1 only (HTTP/2 streams are not logged).
@function handler.access_log
@tparam[opt] table opts
@string[opt] opts.format the line (default nginx's "combined")
@string[opt="/dev/stderr"] opts.path the file, opened for appending
  (the same path shares one file and one buffer)
@int[opt=1048576] opts.buffer bytes of lines held for the log thread
  (the first constructor of a path sets it)
@return a handler configuration
@usage ch:pipeline():add_last("log", netrun.handler.access_log {
  format = '$remote_addr "$request" $status $body_bytes_sent $request_time',
  path = "/var/log/app/access.log" })
*/
static int l_access_log(lua_State *L) {
  static const char *const keys[] = {"format", "path", "buffer", NULL};
  lnr_opts_t t;
  lnr_opts_open(&t, L, 1, "netrun.handler.access_log", keys, false);
  const char *fmt = lnr_opt_string(&t, "format", DEFAULT_FORMAT, NULL);
  size_t plen;
  const char *path = lnr_opt_string(&t, "path", "/dev/stderr", &plen);
  if (plen == 0 || plen >= sizeof files[0].path)
    lnr_opts_error(&t, "path must be 1 to %d bytes",
                   (int)sizeof files[0].path - 1);
  size_t buffer = lnr_opt_size(&t, "buffer", DEFAULT_BUFFER, 65536,
                               (size_t)1 << 30);
  char err[128];
  access_cfg_t cfg = {nr_access_format(fmt, err, sizeof err), NULL};
  if (cfg.f == NULL)
    lnr_opts_error(&t, "format: %s", err);
  cfg.file = file_of(&t, path, buffer);
  lnr_native_class(L, ACCESS_MT, make_access, access_tostring);
  *(access_cfg_t *)lua_newuserdatauv(L, sizeof cfg, 0) = cfg;
  luaL_setmetatable(L, ACCESS_MT);
  return 1;
}

/* core.access_log_stats(): { { path =, lines =, dropped = }, ... }. */
static int l_access_log_stats(lua_State *L) {
  pthread_mutex_lock(&files_lock);
  int n = nfiles;
  pthread_mutex_unlock(&files_lock);    /* entries are never removed */
  lua_createtable(L, n, 0);
  for (int i = 0; i < n; i++) {
    uint64_t lines, dropped;
    nr_log_file_counts(files[i].file, &lines, &dropped);
    lua_createtable(L, 0, 3);
    lua_pushstring(L, files[i].path);
    lua_setfield(L, -2, "path");
    lua_pushinteger(L, (lua_Integer)lines);
    lua_setfield(L, -2, "lines");
    lua_pushinteger(L, (lua_Integer)dropped);
    lua_setfield(L, -2, "dropped");
    lua_rawseti(L, -2, i + 1);
  }
  return 1;
}

static void open_access(lua_State *L) {
  luaL_getsubtable(L, -1, "handler");
  lua_pushcfunction(L, l_access_log);
  lua_setfield(L, -2, "access_log");
  lua_pop(L, 1);
  lua_pushcfunction(L, l_access_log_stats);
  lua_setfield(L, -2, "access_log_stats");
}

lnr_module_t lnr_access_log_module = {.name = "access_log", .open = open_access};
