/*
 * lmain.h -- what the `netrun` executable (bin/netrun.c) calls in the
 * bindings, beside the Lua API: opening the module, the script's
 * directory, the console, and the shutdown its signal thread starts.
 * Main thread unless a line says otherwise.
 */
#ifndef LNR_MAIN_H
#define LNR_MAIN_H

#include <stdbool.h>
#include <stdint.h>

#include <lua.h>

/* require "netrun.core" (module.c). */
int luaopen_netrun_core(lua_State *L);
/* Call the function below nargs arguments in protected mode, with a
 * traceback on error (lstate.c): the one protected call of the bindings
 * and the executable. On error, leaves the message on the stack and
 * returns non-zero. */
int lnr_pcall(lua_State *L, int nargs, int nresults);
/* Put the directory of `script` first on package.path (lstate.c). */
void lnr_add_script_dir(lua_State *L, const char *script);
/* `netrun --console PATH`: listen before the script runs; 0 or -1 with a
 * message printed (console.c). */
int lnr_console_start(lua_State *L, const char *path);
/* From the signal thread: true if a REPL waiting for a line took the
 * SIGINT as its own (console.c). */
bool lnr_repl_interrupt(void);
/* Any thread (the signal thread): ask every group to shut down with the
 * given timeout in ns (group/lrun.c). */
void lnr_shutdown_groups_async(uint64_t timeout);
/* Log each loop of a live group that has not terminated, saying why the
 * process gives up on it; returns how many. Any thread (group/lrun.c). */
int lnr_log_unterminated(const char *why);
/* From the signal thread on SIGHUP: a hot reload, run on the main thread
 * (its outcome logged there) (lops.c). */
void lnr_reload_signal(void);
/* After luaL_openlibs: os.execute and io.popen that start programs with
 * an empty signal mask and default SIGINT/SIGTERM/SIGHUP/SIGPIPE, not
 * netrun's blocked ones (lspawn.c). Any thread, on its own state. */
void lnr_open_spawn(lua_State *L);
/* print writing each line with one call (lprint.c): lines printed on
 * several threads at once stay whole. */
void lnr_open_print(lua_State *L);

#endif /* LNR_MAIN_H */
