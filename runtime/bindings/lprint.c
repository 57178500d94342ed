/*
 * lprint.c -- print for netrun's Lua states (the main one and every
 * loop's): Lua 5.4's, except that each call writes its line at once.
 *
 * Lua's print writes each argument, each tab and the newline with a call
 * of its own; stdio locks stdout around each call, not around the line, so
 * two loops printing at the same time interleaved within lines ("lookup on
 * a looplookup\t127.0.0.1\n\t127.0.0.1"). Here the line is built first
 * (luaL_tolstring: __tostring and __name as Lua's print) and written with
 * one fwrite, then flushed as Lua's print does: another thread's line comes
 * before or after it, never inside.
 */
#include <stdio.h>

#include <lauxlib.h>
#include <lualib.h>

#include "lmain.h"
#include "lnr.h"

static int l_print(lua_State *L) {
  int n = lua_gettop(L);
  luaL_Buffer b;
  luaL_buffinit(L, &b);
  for (int i = 1; i <= n; i++) {
    if (i > 1)
      luaL_addchar(&b, '\t');
    luaL_tolstring(L, i, NULL);
    luaL_addvalue(&b);                   /* the string luaL_tolstring pushed */
  }
  luaL_addchar(&b, '\n');
  luaL_pushresult(&b);
  size_t len;
  const char *line = lua_tolstring(L, -1, &len);
  fwrite(line, 1, len, stdout);
  fflush(stdout);
  return 0;
}

void lnr_open_print(lua_State *L) {
  lua_pushcfunction(L, l_print);
  lua_setglobal(L, "print");
}

lnr_module_t lnr_print_module = {.name = "print", .libs = lnr_open_print};
