/*
 * lhttp.c -- Lua constructors for the HTTP/1.1 server codec.
 * (Scaffold: filled in by the batteries work.)
 */
#include "lnr.h"

void lnr_open_http(lua_State *L) { (void)L; }
