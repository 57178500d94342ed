/*
 * lstatic.c -- netrun.handler.static, the static file handler's Lua
 * constructor (runtime/handler/static.h does the work). Like the other
 * native handlers, the constructor returns a configuration of plain bytes
 * (copied when it crosses states); each pipeline it is added to gets a
 * fresh handler state, sharing its loop's open file cache.
 *
 * Threads: the constructor runs in any state; the handler on its loop.
 */

/***
@module netrun
*/
#include <errno.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>

#include "handler/static.h"
#include "lnr.h"

#define STATIC_MT "netrun.handler.static"

static const nr_handler_t *make_static(lua_State *L, int idx, void **state) {
  nr_static_cfg_t *c = luaL_checkudata(L, idx, STATIC_MT);
  if ((*state = nr_static_new(c)) == NULL)
    luaL_error(L, "netrun.handler.static: root '%s': %s", c->root,
               strerror(errno));
  return &nr_static_handler;
}

static int tostring(lua_State *L) {
  nr_static_cfg_t *c = luaL_checkudata(L, 1, STATIC_MT);
  lua_pushfstring(L, "netrun.handler.static (%s)", c->root);
  return 1;
}

/***
Serves the files under a directory to the HTTP server codec's requests
(put it after `codec.http_server`). GET and HEAD of a regular file, as
RFC 9110 says: strong `ETag` and `Last-Modified`, `If-None-Match` /
`If-Modified-Since` (304), `If-Match` / `If-Unmodified-Since` (412), `Range`
with `If-Range` (206, several ranges as `multipart/byteranges`, 416 with
a `Content-Range` giving the length), `.br` / `.gz` siblings by `Accept-Encoding`
(with `Vary`), a MIME type by extension. A request it does not serve --
another method, a path naming nothing, a directory without its index, a
path it refuses (`..`, encoded slashes, backslashes, a symlink out of the
root) -- goes on to the next handler unchanged, as nginx's `try_files`.
A directory named without its trailing slash is answered 301.
Bodies go as the socket drains (sendfile on a plain connection, reads
into a buffer through TLS and HTTP/2), at most `max_chunk` bytes a
connection per loop turn.
@function handler.static
@tparam[opt] table opts
@string[opt="."] opts.root the directory served (made absolute now)
@string[opt="index.html"] opts.index a directory's file ("" for none)
@bool[opt=true] opts.precompressed look for `.br` / `.gz` siblings
@tparam[opt] table opts.cache the open file cache of each loop:
  `max` entries (1000; 0 for none), trusted for `valid` seconds (60)
@int[opt=2097152] opts.max_chunk bytes a connection sends per loop turn
@int[opt=64] opts.max_ranges ranges in one request; more are answered
  with the whole file (nginx's `max_ranges`)
@bool[opt=false] opts.follow_symlinks follow symlinks wherever they lead
  (false: only those that stay under the root)
@bool[opt=true] opts.sendfile use sendfile(2) on plain connections
@return a handler configuration
@usage ch:pipeline():add_last("http", netrun.codec.http_server())
ch:pipeline():add_last("files", netrun.handler.static { root = "public" })
ch:pipeline():add_last("app", App)   -- what is not a file
*/
static int l_static(lua_State *L) {
  static const char *const keys[] = {
      "root", "index", "precompressed", "cache", "max_chunk", "max_ranges",
      "follow_symlinks", "sendfile", NULL};
  static const char *const cache_keys[] = {"max", "valid", NULL};
  lnr_opts_t t, ct;
  lnr_opts_open(&t, L, 1, "netrun.handler.static", keys, false);
  nr_static_cfg_t cfg;
  nr_static_cfg_init(&cfg);
  size_t rlen, ilen;
  const char *root = lnr_opt_string(&t, "root", ".", &rlen);
  const char *index = lnr_opt_string(&t, "index", cfg.index, &ilen);
  if (ilen >= sizeof cfg.index || memchr(index, '/', ilen) != NULL)
    return luaL_error(L, "netrun.handler.static: index '%s': a file name of "
                      "fewer than %d bytes", index, (int)sizeof cfg.index);
  memcpy(cfg.index, index, ilen + 1);
  char abs[PATH_MAX];
  if (realpath(root, abs) == NULL)
    return luaL_error(L, "netrun.handler.static: root '%s': %s", root,
                      strerror(errno));
  if (strlen(abs) >= sizeof cfg.root)
    return luaL_error(L, "netrun.handler.static: root '%s': too long", abs);
  strcpy(cfg.root, abs);
  cfg.precompressed = lnr_opt_boolean(&t, "precompressed", true);
  cfg.follow_symlinks = lnr_opt_boolean(&t, "follow_symlinks", false);
  cfg.no_sendfile = !lnr_opt_boolean(&t, "sendfile", true);
  cfg.max_chunk = lnr_opt_size(&t, "max_chunk", cfg.max_chunk, 4096,
                               LNR_OPT_SIZE_MAX);
  cfg.max_ranges = (uint32_t)lnr_opt_integer(&t, "max_ranges", cfg.max_ranges,
                                             0, 10000);
  lnr_opts_sub(&ct, &t, "cache", cache_keys);
  cfg.cache_max = (uint32_t)lnr_opt_integer(&ct, "max", cfg.cache_max, 0,
                                            1000000);
  cfg.cache_valid = lnr_opt_seconds(&ct, "valid", cfg.cache_valid);
  lua_pop(L, 1);
  nr_static_cfg_t *u = lua_newuserdatauv(L, sizeof cfg, 0);
  *u = cfg;
  lnr_native_class(L, STATIC_MT, make_static, tostring);
  luaL_setmetatable(L, STATIC_MT);
  return 1;
}

static void open_static(lua_State *L) {
  luaL_getsubtable(L, -1, "handler");
  lua_pushcfunction(L, l_static);
  lua_setfield(L, -2, "static");
  lua_pop(L, 1);
}

lnr_module_t lnr_static_module = {.name = "static", .open = open_static};
