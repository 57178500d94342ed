/*
 * static_http.c -- the RFC 9110 rules the static handler applies: Range
 * (14.1.2), Accept-Encoding q-values (12.5.3), entity-tag lists (13.1.1,
 * 8.8.3.2), HTTP-dates (5.6.7). Plain functions over header values; no
 * state, any thread. Every number is checked against overflow: a value
 * too large to hold is refused, never wrapped.
 */
#include <stdio.h>
#include <string.h>
#include <strings.h>
#include <time.h>

#include "handler/static.h"

static bool ows(char c) { return c == ' ' || c == '\t'; }

/* Digits at v[*i ..] into *out: false for none, or for a number past
 * 2^63 (too large: *big set). */
static bool digits(const char *v, size_t n, size_t *i, uint64_t *out,
                   bool *big) {
  size_t start = *i;
  uint64_t x = 0;
  while (*i < n && v[*i] >= '0' && v[*i] <= '9') {
    if (x > (UINT64_C(1) << 62) / 5) {     /* x * 10 would pass 2^63 */
      *big = true;
      while (*i < n && v[*i] >= '0' && v[*i] <= '9')
        (*i)++;
      return false;
    }
    x = x * 10 + (uint64_t)(v[*i] - '0');
    (*i)++;
  }
  *out = x;
  return *i > start;
}

/* One range-spec at v[*i ..]: 1 satisfiable (into *r), 0 unsatisfiable,
 * -1 bad syntax, -2 a number too large. */
static int one_range(const char *v, size_t n, size_t *i, uint64_t size,
                     nr_static_range_t *r) {
  uint64_t a = 0, b = 0;
  bool big = false, has_a = digits(v, n, i, &a, &big);
  if (big)
    return -2;
  if (*i >= n || v[*i] != '-')
    return -1;
  (*i)++;
  bool has_b = digits(v, n, i, &b, &big);
  if (big && has_a)
    has_b = true, b = UINT64_MAX;          /* a last-pos past any size */
  else if (big)
    return -2;
  if (!has_a) {                            /* suffix: the last b bytes */
    if (!has_b)
      return -1;
    if (b == 0 || size == 0)
      return 0;
    r->first = b >= size ? 0 : size - b;
    r->last = size - 1;
    return 1;
  }
  if (has_b && b < a)
    return -1;
  if (a >= size)
    return 0;
  r->first = a;
  r->last = !has_b || b >= size ? size - 1 : b;
  return 1;
}

int nr_static_ranges(const char *v, size_t n, uint64_t size,
                     nr_static_range_t *r, int max) {
  if (n < 6 || strncasecmp(v, "bytes=", 6) != 0)
    return 0;
  size_t i = 6;
  int count = 0, specs = 0;
  uint64_t total = 0;
  for (;;) {
    while (i < n && (ows(v[i]) || v[i] == ','))
      i++;
    if (i >= n)
      break;
    if (++specs > max)
      return 0;               /* too many: the whole file */
    nr_static_range_t one;
    int k = one_range(v, n, &i, size, &one);
    if (k == -1)
      return 0;
    if (k == -2)
      return -1;
    if (k == 1) {
      total += one.last - one.first + 1;
      if (total > size)
        return 0;             /* overlaps add up past the file: all of it */
      r[count++] = one;
    }
    while (i < n && ows(v[i]))
      i++;
    if (i < n && v[i] != ',')
      return 0;
  }
  if (specs == 0)
    return 0;
  return count > 0 ? count : -1;
}

/* ---- Accept-Encoding ---- */

/* The q-value at v[*i ..] after ";": 0 .. 1000, -1 if malformed. */
static int qvalue(const char *v, size_t n, size_t i) {
  while (i < n && ows(v[i]))
    i++;
  if (i + 1 >= n || (v[i] != 'q' && v[i] != 'Q') || v[i + 1] != '=')
    return 1000;              /* another parameter: ignored */
  i += 2;
  if (i >= n || (v[i] != '0' && v[i] != '1'))
    return -1;
  int q = (v[i] - '0') * 1000, scale = 100;
  i++;
  if (i < n && v[i] == '.')
    for (i++; i < n && v[i] >= '0' && v[i] <= '9' && scale > 0; i++, scale /= 10)
      q += (v[i] - '0') * scale;
  return q > 1000 ? 1000 : q;
}

int nr_static_accepts(const char *v, size_t n, const char *coding) {
  size_t clen = strlen(coding);
  int named = -1, star = -1;
  size_t i = 0;
  while (i < n) {
    while (i < n && (ows(v[i]) || v[i] == ','))
      i++;
    size_t s = i;
    while (i < n && v[i] != ',' && v[i] != ';' && !ows(v[i]))
      i++;
    size_t len = i - s;
    while (i < n && ows(v[i]))
      i++;
    int q = 1000;
    if (i < n && v[i] == ';')
      q = qvalue(v, n, i + 1);
    while (i < n && v[i] != ',')
      i++;
    if (q < 0)
      continue;
    if (len == clen && strncasecmp(v + s, coding, clen) == 0)
      named = q;
    else if (len == 1 && v[s] == '*')
      star = q;
  }
  return named >= 0 ? named : star > 0 ? star : 0;
}

/* ---- entity tags ---- */

bool nr_static_etag_match(const char *v, size_t n, const char *etag,
                          bool weak) {
  size_t elen = strlen(etag);
  size_t i = 0;
  while (i < n) {
    while (i < n && (ows(v[i]) || v[i] == ','))
      i++;
    if (i < n && v[i] == '*')
      return true;
    bool w = false;
    if (i + 1 < n && v[i] == 'W' && v[i + 1] == '/') {
      w = true;
      i += 2;
    }
    if (i >= n || v[i] != '"')
      return false;           /* malformed: no match */
    size_t s = i++;
    while (i < n && v[i] != '"')
      i++;
    if (i >= n)
      return false;
    i++;
    if ((weak || !w) && i - s == elen && memcmp(v + s, etag, elen) == 0)
      return true;
  }
  return false;
}

/* ---- dates ---- */

static const char months[] = "JanFebMarAprMayJunJulAugSepOctNovDec";
static const char days[] = "SunMonTueWedThuFriSat";

static int month_of(const char *m) {
  for (int k = 0; k < 12; k++)
    if (strncmp(months + 3 * k, m, 3) == 0)
      return k;
  return -1;
}

int64_t nr_static_parse_date(const char *v, size_t n) {
  char buf[64], mon[4] = "";
  if (n == 0 || n >= sizeof buf)
    return -1;
  memcpy(buf, v, n);
  buf[n] = '\0';
  struct tm tm = {0};
  int used = 0;
  const char *comma = strchr(buf, ',');
  if (comma != NULL && comma - buf == 3) {      /* Sun, 06 Nov 1994 08:49:37 GMT */
    if (sscanf(buf + 4, " %2d %3s %4d %2d:%2d:%2d GMT%n", &tm.tm_mday, mon,
               &tm.tm_year, &tm.tm_hour, &tm.tm_min, &tm.tm_sec, &used) != 6)
      return -1;
    used += 4;
  } else if (comma != NULL) {                   /* Sunday, 06-Nov-94 ... */
    if (sscanf(comma + 1, " %2d-%3[A-Za-z]-%2d %2d:%2d:%2d GMT%n", &tm.tm_mday,
               mon, &tm.tm_year, &tm.tm_hour, &tm.tm_min, &tm.tm_sec, &used) != 6)
      return -1;
    used += (int)(comma + 1 - buf);
    tm.tm_year += tm.tm_year < 70 ? 2000 : 1900;
  } else {                                      /* Sun Nov  6 08:49:37 1994 */
    if (sscanf(buf, "%*3s %3s %d %2d:%2d:%2d %4d%n", mon, &tm.tm_mday,
               &tm.tm_hour, &tm.tm_min, &tm.tm_sec, &tm.tm_year, &used) != 6)
      return -1;
  }
  if ((size_t)used != n || (tm.tm_mon = month_of(mon)) < 0 ||
      tm.tm_mday < 1 || tm.tm_mday > 31 || tm.tm_hour > 23 ||
      tm.tm_min > 59 || tm.tm_sec > 60 || tm.tm_year < 1900)
    return -1;
  tm.tm_year -= 1900;
  return (int64_t)timegm(&tm);
}

void nr_static_format_date(int64_t t, char *out) {
  time_t tt = (time_t)t;
  struct tm tm;
  gmtime_r(&tt, &tm);
  char tmp[80];               /* (the compiler cannot bound the fields) */
  snprintf(tmp, sizeof tmp, "%.3s, %02d %.3s %04d %02d:%02d:%02d GMT",
           days + 3 * tm.tm_wday, tm.tm_mday, months + 3 * tm.tm_mon,
           (tm.tm_year + 1900) % 10000, tm.tm_hour, tm.tm_min, tm.tm_sec);
  memcpy(out, tmp, 29);
  out[29] = '\0';
}
