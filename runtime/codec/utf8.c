/*
 * utf8.c -- the incremental UTF-8 check of ws.h (nr_utf8_check): text
 * messages are checked as their fragments arrive, the state carried from
 * one call to the next. Pure: no thread of its own, no allocation.
 */
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "codec/ws.h"

/* ---- UTF-8 ------------------------------------------------------------------ */

/* A state inside a sequence: bytes still needed, and the range the next
 * one must be in (which rules out overlong forms, surrogates and code
 * points past U+10FFFF at the second byte). Never NR_UTF8_BAD (lo >= 0x80). */
static uint32_t mid(unsigned need, unsigned lo, unsigned hi) {
  return need | lo << 8 | hi << 16;
}

uint32_t nr_utf8_check(uint32_t st, const char *s, size_t n) {
  const unsigned char *u = (const unsigned char *)s;
  size_t i = 0;
  while (i < n && st != NR_UTF8_BAD) {
    if (st == 0) {
      while (i + 8 <= n) {                 /* ASCII, eight bytes at a time */
        uint64_t w;
        memcpy(&w, u + i, 8);
        if (w & 0x8080808080808080ull)
          break;
        i += 8;
      }
      while (i < n && u[i] < 0x80)
        i++;
      if (i == n)
        break;
      unsigned c = u[i++];
      if (c < 0xC2 || c > 0xF4)
        st = NR_UTF8_BAD;
      else if (c < 0xE0)
        st = mid(1, 0x80, 0xBF);
      else if (c < 0xF0)
        st = mid(2, c == 0xE0 ? 0xA0 : 0x80, c == 0xED ? 0x9F : 0xBF);
      else
        st = mid(3, c == 0xF0 ? 0x90 : 0x80, c == 0xF4 ? 0x8F : 0xBF);
    } else {
      unsigned c = u[i++];
      if (c < ((st >> 8) & 0xFF) || c > ((st >> 16) & 0xFF))
        st = NR_UTF8_BAD;
      else
        st = (st & 0xFF) == 1 ? 0 : mid((st & 0xFF) - 1, 0x80, 0xBF);
    }
  }
  return st;
}
