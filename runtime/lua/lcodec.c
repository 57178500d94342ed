/*
 * lcodec.c -- Lua constructors for frame codecs: line, delimiter, length_field, length_prepender, fixed_length.
 * (Scaffold: filled in by the batteries work.)
 */
#include "lnr.h"

void lnr_open_codec(lua_State *L) { (void)L; }
