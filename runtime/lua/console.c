/*
 * console.c -- placeholder until the console socket lands (issue 4).
 */
#include "lnr.h"

int lnr_console_start(lua_State *L, const char *path) {
  (void)L;
  nr_log(NR_LOG_ERROR, "--console %s: the console is not available yet", path);
  return -1;
}
