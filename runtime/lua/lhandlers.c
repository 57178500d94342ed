/*
 * lhandlers.c -- Lua constructors for native handlers: idle_state, logging.
 * (Scaffold: filled in by the batteries work.)
 */
#include "lnr.h"

void lnr_open_handlers(lua_State *L) { (void)L; }
