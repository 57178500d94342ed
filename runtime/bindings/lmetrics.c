/*
 * lmetrics.c -- netrun.metrics.counter / gauge / histogram: a program's
 * own metric families, updated from any state and rendered in the
 * Prometheus text format (0.0.4) after netrun's own families
 * (lua/netrun/metrics.lua calls core.metrics_text()).
 *
 * A family is a handle (LNR_METRIC) to C memory that lives as long as the
 * process, like a shared dict: the same name gives the same family in
 * every state, and a family sent to a loop (an upvalue of a server's
 * init) crosses as that handle.
 *
 * Threads and invariants:
 * - Updates take no lock: a series' value is an atomic (a double's bits,
 *   added with a compare-and-swap loop; a histogram's counts are atomic
 *   integers). Updates are relaxed: a scrape may see one series a little
 *   ahead of another, never a torn or lost update.
 * - Finding a labelled series takes no lock either: a family's hash table
 *   has a fixed number of buckets (sized from max_series when it is made)
 *   and a series, once linked into a chain (release store), is never
 *   moved or freed before the process ends; readers follow the chains
 *   with acquire loads. Only making a new series takes the family's
 *   mutex, and nothing under it allocates Lua memory or raises.
 * - At most max_series series per family (1000 by default): an update
 *   with a new label set past it goes to the family's one overflow series,
 *   whose every label is "_overflow" (a scrape shows it; nothing raises on
 *   the request path because a peer sent many distinct values).
 * - Families are linked in creation order (release store of the tail's
 *   next) so rendering walks them without a lock; only creation locks.
 */

/***
@module netrun.metrics
*/
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "lnr.h"

enum { M_COUNTER, M_GAUGE, M_HISTOGRAM };
static const char *const TYPES[] = {"counter", "gauge", "histogram"};

#define DEFAULT_MAX_SERIES 1000
#define MAX_SERIES_LIMIT 100000
#define MAX_LABELS 16
#define MAX_BUCKETS 64
#define MAX_KEY 4096                 /* bytes of label values per series */

typedef struct series_s {
  struct series_s *_Atomic hnext;    /* the hash chain */
  struct series_s *_Atomic next;     /* creation order, for rendering */
  uint64_t hash;
  _Atomic uint64_t value;            /* counter, gauge: a double's bits;
                                        histogram: the sum's bits */
  _Atomic uint64_t *counts;          /* histogram: per bucket, +Inf last */
  size_t klen;
  char key[];                        /* each value: its bytes then a 0 */
} series_t;

typedef struct family_s {
  struct family_s *_Atomic next;
  int type, nlabels, nbounds;
  char *name, *help;
  char *labels[MAX_LABELS];
  double *bounds;                    /* histogram: increasing, finite */
  size_t max_series, nseries;        /* nseries: under lock */
  pthread_mutex_t lock;              /* making a series */
  series_t *_Atomic *table;
  size_t mask;
  series_t *_Atomic first;
  series_t *last;                    /* under lock */
  series_t *overflow;                /* labelled: made with the family, */
  _Atomic bool overflowed;           /* rendered once used */
  series_t *only;                    /* unlabelled: the one series */
} family_t;

static pthread_mutex_t families_lock = PTHREAD_MUTEX_INITIALIZER;
static family_t *_Atomic families;
static family_t *families_tail;      /* under families_lock */

/* ---- values -------------------------------------------------------------- */

static double bits_to(uint64_t b) {
  double d;
  memcpy(&d, &b, sizeof d);
  return d;
}

static uint64_t to_bits(double d) {
  uint64_t b;
  memcpy(&b, &d, sizeof b);
  return b;
}

static void add_double(_Atomic uint64_t *a, double d) {
  uint64_t old = atomic_load_explicit(a, memory_order_relaxed);
  while (!atomic_compare_exchange_weak_explicit(
      a, &old, to_bits(bits_to(old) + d), memory_order_relaxed,
      memory_order_relaxed))
    ;
}

/* ---- series -------------------------------------------------------------- */

static uint64_t hash_key(const char *s, size_t n) {
  uint64_t h = 1469598103934665603ull;             /* FNV-1a */
  for (size_t i = 0; i < n; i++)
    h = (h ^ (unsigned char)s[i]) * 1099511628211ull;
  return h;
}

static series_t *new_series(const family_t *f, const char *key, size_t klen,
                            uint64_t h) {
  series_t *s = calloc(1, sizeof *s + klen + 1);
  if (s == NULL)
    return NULL;
  if (f->type == M_HISTOGRAM &&
      (s->counts = calloc((size_t)f->nbounds + 1, sizeof *s->counts)) == NULL) {
    free(s);
    return NULL;
  }
  s->hash = h;
  s->klen = klen;
  memcpy(s->key, key, klen);
  return s;
}

/* Link s at the end of the creation order (the family's lock held). */
static void append(family_t *f, series_t *s) {
  if (f->last == NULL)
    atomic_store_explicit(&f->first, s, memory_order_release);
  else
    atomic_store_explicit(&f->last->next, s, memory_order_release);
  f->last = s;
}

static series_t *lookup(family_t *f, const char *key, size_t klen, uint64_t h) {
  series_t *s = atomic_load_explicit(&f->table[h & f->mask], memory_order_acquire);
  for (; s; s = atomic_load_explicit(&s->hnext, memory_order_acquire))
    if (s->hash == h && s->klen == klen && memcmp(s->key, key, klen) == 0)
      return s;
  return NULL;
}

/* The series of key, made if new; the overflow series past max_series;
 * NULL when out of memory. */
static series_t *find_or_make(family_t *f, const char *key, size_t klen) {
  uint64_t h = hash_key(key, klen);
  series_t *s = lookup(f, key, klen, h);
  if (s)
    return s;
  pthread_mutex_lock(&f->lock);
  if ((s = lookup(f, key, klen, h)) == NULL) {   /* lost no race */
    if (f->nseries >= f->max_series) {
      s = f->overflow;
      atomic_store_explicit(&f->overflowed, true, memory_order_release);
    } else if ((s = new_series(f, key, klen, h)) != NULL) {
      series_t *_Atomic *b = &f->table[h & f->mask];
      atomic_store_explicit(&s->hnext, atomic_load(b), memory_order_relaxed);
      atomic_store_explicit(b, s, memory_order_release);
      append(f, s);
      f->nseries++;
    }
  }
  pthread_mutex_unlock(&f->lock);
  return s;
}

/* ---- the handle's methods ------------------------------------------------- */

static family_t *check_family(lua_State *L) {
  return lnr_check_handle(L, 1, LNR_METRIC);
}

/* The key of the label set at idx (a table: name = string or number),
 * written to buf: each value's bytes and a 0. Raises on a missing label,
 * a value of another type or an oversized key. */
static size_t label_key(lua_State *L, const family_t *f, int idx, char *buf) {
  if (lua_type(L, idx) != LUA_TTABLE)
    lnr_raise(L, "metric %s: labels must be a table, got %s", f->name,
              lua_isnone(L, idx) ? "nil" : luaL_typename(L, idx));
  size_t at = 0;
  for (int i = 0; i < f->nlabels; i++) {
    int t = lua_getfield(L, idx, f->labels[i]);
    if (t != LUA_TSTRING && t != LUA_TNUMBER) {
      lnr_push_shown(L, -1);
      lnr_raise(L, "metric %s: label %s must be a string or a number, got %s",
                f->name, f->labels[i], lua_tostring(L, -1));
    }
    size_t n;
    const char *v = lua_tolstring(L, -1, &n);
    if (at + n + 1 > MAX_KEY)
      lnr_raise(L, "metric %s: label values longer than %d bytes", f->name,
                MAX_KEY);
    memcpy(buf + at, v, n);
    at += n;
    buf[at++] = 0;
    lua_pop(L, 1);
  }
  return at;
}

/* Every key of the label table at idx is one of the family's labels
 * (checked when a series is made: a typo would make a series of its own
 * otherwise silently missing a label). */
static void check_label_names(lua_State *L, const family_t *f, int idx) {
  lua_pushnil(L);
  while (lua_next(L, idx)) {
    lua_pop(L, 1);
    bool known = false;
    if (lua_type(L, -1) == LUA_TSTRING)
      for (int i = 0; i < f->nlabels && !known; i++)
        known = strcmp(lua_tostring(L, -1), f->labels[i]) == 0;
    if (!known) {
      lnr_push_shown(L, -1);
      lnr_raise(L, "metric %s: unknown label %s", f->name, lua_tostring(L, -1));
    }
  }
}

/* The series an update at argument idx (labels) names. */
static series_t *series_at(lua_State *L, family_t *f, int idx) {
  if (f->nlabels == 0) {
    if (!lua_isnoneornil(L, idx))
      lnr_raise(L, "metric %s has no labels", f->name);
    return f->only;
  }
  char key[MAX_KEY];
  size_t klen = label_key(L, f, idx, key);
  uint64_t h = hash_key(key, klen);
  series_t *s = lookup(f, key, klen, h);
  if (s)
    return s;
  check_label_names(L, f, idx);
  if ((s = find_or_make(f, key, klen)) == NULL)
    luaL_error(L, "metric %s: out of memory", f->name);
  return s;
}

static void want(lua_State *L, const family_t *f, int type, const char *method) {
  if (f->type != type)
    lnr_raise(L, "metric %s is a %s: it has no %s", f->name, TYPES[f->type],
              method);
}

/***
A metric family, made by `metrics.counter`, `metrics.gauge` or
`metrics.histogram`: a handle usable from any loop (it crosses as a
handle, like a shared dict). `labels` is a table of the family's label
names to strings or numbers, required when the family has labels.
@type metric
*/

/***
Add to a counter or a gauge.
@function metric:inc
@number[opt=1] n what to add (a counter's must not be negative)
@tparam[opt] table labels
*/
static int m_inc(lua_State *L) {
  family_t *f = check_family(L);
  if (f->type == M_HISTOGRAM)
    want(L, f, M_COUNTER, "inc");
  double n = luaL_optnumber(L, 2, 1);
  if (f->type == M_COUNTER && !(n >= 0))
    lnr_raise(L, "metric %s: a counter only goes up, got %f", f->name, n);
  add_double(&series_at(L, f, 3)->value, n);
  return 0;
}

/***
Subtract from a gauge.
@function metric:dec
@number[opt=1] n
@tparam[opt] table labels
*/
static int m_dec(lua_State *L) {
  family_t *f = check_family(L);
  want(L, f, M_GAUGE, "dec");
  add_double(&series_at(L, f, 3)->value, -luaL_optnumber(L, 2, 1));
  return 0;
}

/***
Set a gauge.
@function metric:set
@number v
@tparam[opt] table labels
*/
static int m_set(lua_State *L) {
  family_t *f = check_family(L);
  want(L, f, M_GAUGE, "set");
  double v = luaL_checknumber(L, 2);
  atomic_store_explicit(&series_at(L, f, 3)->value, to_bits(v),
                        memory_order_relaxed);
  return 0;
}

/***
Count an observation in a histogram: in the first bucket whose bound is
at least v (and so in every later one), in `_sum` and `_count`.
@function metric:observe
@number v
@tparam[opt] table labels
*/
static int m_observe(lua_State *L) {
  family_t *f = check_family(L);
  want(L, f, M_HISTOGRAM, "observe");
  double v = luaL_checknumber(L, 2);
  series_t *s = series_at(L, f, 3);
  int lo = 0, hi = f->nbounds;                  /* first bound >= v */
  while (lo < hi) {
    int mid = (lo + hi) / 2;
    if (f->bounds[mid] >= v)
      hi = mid;
    else
      lo = mid + 1;
  }
  atomic_fetch_add_explicit(&s->counts[lo], 1, memory_order_relaxed);
  add_double(&s->value, v);
  return 0;
}

/***
A series' value: a counter's or gauge's number; a histogram's count and
sum. A series not yet updated reads 0.
@function metric:get
@tparam[opt] table labels
@treturn number
@treturn[opt] number a histogram's sum
*/
static int m_get(lua_State *L) {
  family_t *f = check_family(L);
  series_t *s = series_at(L, f, 2);
  double v = bits_to(atomic_load_explicit(&s->value, memory_order_relaxed));
  if (f->type != M_HISTOGRAM) {
    if (v == floor(v) && fabs(v) < 9007199254740992.0)   /* 2^53: exact */
      lua_pushinteger(L, (lua_Integer)v);
    else
      lua_pushnumber(L, v);
    return 1;
  }
  uint64_t n = 0;
  for (int i = 0; i <= f->nbounds; i++)
    n += atomic_load_explicit(&s->counts[i], memory_order_relaxed);
  lua_pushinteger(L, (lua_Integer)n);
  lua_pushnumber(L, v);
  return 2;
}

static int m_tostring(lua_State *L) {
  family_t *f = check_family(L);
  lua_pushfstring(L, "netrun.metric: %s %s", TYPES[f->type], f->name);
  return 1;
}

/* ---- rendering ----------------------------------------------------------- */

static void put_number(luaL_Buffer *b, double v) {
  char s[40];
  if (isnan(v))
    strcpy(s, "NaN");
  else if (isinf(v))
    strcpy(s, v > 0 ? "+Inf" : "-Inf");
  else {
    snprintf(s, sizeof s, "%.15g", v);
    if (strtod(s, NULL) != v)                   /* the shortest that reads back */
      snprintf(s, sizeof s, "%.17g", v);
  }
  luaL_addstring(b, s);
}

static void put_escaped(luaL_Buffer *b, const char *s, size_t n, bool quote) {
  for (size_t i = 0; i < n; i++) {
    char c = s[i];
    if (c == '\\')
      luaL_addstring(b, "\\\\");
    else if (c == '\n')
      luaL_addstring(b, "\\n");
    else if (c == '"' && quote)
      luaL_addstring(b, "\\\"");
    else
      luaL_addchar(b, c);
  }
}

/* name{l1="v1",...[,le="x"]} value\n */
static void put_sample(luaL_Buffer *b, const family_t *f, const series_t *s,
                       const char *suffix, const char *le, double v) {
  luaL_addstring(b, f->name);
  luaL_addstring(b, suffix);
  const char *k = s->key;
  if (f->nlabels > 0 || le) {
    luaL_addchar(b, '{');
    for (int i = 0; i < f->nlabels; i++) {
      size_t n = strlen(k);
      if (i > 0)
        luaL_addchar(b, ',');
      luaL_addstring(b, f->labels[i]);
      luaL_addstring(b, "=\"");
      put_escaped(b, k, n, true);
      luaL_addchar(b, '"');
      k += n + 1;
    }
    if (le) {
      luaL_addstring(b, f->nlabels > 0 ? ",le=\"" : "le=\"");
      luaL_addstring(b, le);
      luaL_addchar(b, '"');
    }
    luaL_addchar(b, '}');
  }
  luaL_addchar(b, ' ');
  put_number(b, v);
  luaL_addchar(b, '\n');
}

static void put_histogram(luaL_Buffer *b, const family_t *f, const series_t *s) {
  uint64_t cum = 0;
  char le[40];
  for (int i = 0; i <= f->nbounds; i++) {
    cum += atomic_load_explicit(&s->counts[i], memory_order_relaxed);
    if (i < f->nbounds) {
      snprintf(le, sizeof le, "%.15g", f->bounds[i]);
      if (strtod(le, NULL) != f->bounds[i])
        snprintf(le, sizeof le, "%.17g", f->bounds[i]);
    }
    put_sample(b, f, s, "_bucket", i < f->nbounds ? le : "+Inf", (double)cum);
  }
  put_sample(b, f, s, "_sum", NULL,
             bits_to(atomic_load_explicit(&s->value, memory_order_relaxed)));
  put_sample(b, f, s, "_count", NULL, (double)cum);
}

static void put_series(luaL_Buffer *b, const family_t *f, const series_t *s) {
  if (f->type == M_HISTOGRAM)
    put_histogram(b, f, s);
  else
    put_sample(b, f, s, "", NULL,
               bits_to(atomic_load_explicit(&s->value, memory_order_relaxed)));
}

static void put_family(luaL_Buffer *b, const family_t *f) {
  luaL_addstring(b, "# HELP ");
  luaL_addstring(b, f->name);
  luaL_addchar(b, ' ');
  put_escaped(b, f->help, strlen(f->help), false);
  luaL_addstring(b, "\n# TYPE ");
  luaL_addstring(b, f->name);
  luaL_addchar(b, ' ');
  luaL_addstring(b, TYPES[f->type]);
  luaL_addchar(b, '\n');
  const series_t *s = atomic_load_explicit(&f->first, memory_order_acquire);
  for (; s; s = atomic_load_explicit(&s->next, memory_order_acquire))
    put_series(b, f, s);
  if (atomic_load_explicit(&f->overflowed, memory_order_acquire))
    put_series(b, f, f->overflow);
}

/* core.metrics_text(): every user family, in creation order. */
static int l_metrics_text(lua_State *L) {
  luaL_Buffer b;
  luaL_buffinit(L, &b);
  const family_t *f = atomic_load_explicit(&families, memory_order_acquire);
  for (; f; f = atomic_load_explicit(&f->next, memory_order_acquire))
    put_family(&b, f);
  luaL_pushresult(&b);
  return 1;
}

/*** @section end */

/* ---- making a family ------------------------------------------------------ */

static bool valid_name(const char *s, bool colon) {
  if (*s == 0 || (*s >= '0' && *s <= '9'))
    return false;
  for (; *s; s++) {
    char c = *s;
    if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ||
          (c >= '0' && c <= '9') || c == '_' || (colon && c == ':')))
      return false;
  }
  return true;
}

/* What a constructor was given, read and checked before any lock. */
typedef struct spec_s {
  int type, nlabels, nbounds;
  const char *name, *help;
  const char *labels[MAX_LABELS];
  double bounds[MAX_BUCKETS];
  size_t max_series;
} spec_t;

static const double DEFAULT_BOUNDS[] = {0.005, 0.01, 0.025, 0.05, 0.1, 0.25,
                                        0.5,   1,    2.5,   5,    10};

static void read_labels(lnr_opts_t *o, spec_t *sp) {
  lua_State *L = o->L;
  int n = lnr_opt_strings(o, "labels", MAX_LABELS);
  for (int i = 0; i < n; i++) {
    lua_rawgeti(L, -1, i + 1);
    const char *l = lua_tostring(L, -1);
    lua_pop(L, 1);                         /* anchored by the options */
    if (!valid_name(l, false) || (l[0] == '_' && l[1] == '_') ||
        (sp->type == M_HISTOGRAM && strcmp(l, "le") == 0))
      lnr_opts_error(o, "labels: %s is not a valid label name "
                        "([a-zA-Z_][a-zA-Z0-9_]*, not __*%s)",
                     l, sp->type == M_HISTOGRAM ? " nor le" : "");
    for (int j = 0; j < i; j++)
      if (strcmp(sp->labels[j], l) == 0)
        lnr_opts_error(o, "labels: %s given twice", l);
    sp->labels[i] = l;
  }
  if (n > 0)
    lua_pop(L, 1);
  sp->nlabels = n;
}

static void read_buckets(lnr_opts_t *o, spec_t *sp) {
  lua_State *L = o->L;
  sp->nbounds = (int)(sizeof DEFAULT_BOUNDS / sizeof DEFAULT_BOUNDS[0]);
  memcpy(sp->bounds, DEFAULT_BOUNDS, sizeof DEFAULT_BOUNDS);
  int t = lua_getfield(L, o->t, "buckets");
  if (t == LUA_TNIL) {
    lua_pop(L, 1);
    return;
  }
  if (sp->type != M_HISTOGRAM)
    lnr_opts_error(o, "buckets: only a histogram has buckets");
  int n = t == LUA_TTABLE ? (int)luaL_len(L, -1) : 0;
  if (n < 1 || n > MAX_BUCKETS)
    lnr_opt_bad(o, "buckets", -1, "an array of 1 to 64 increasing numbers");
  for (int i = 0; i < n; i++) {
    lua_rawgeti(L, -1, i + 1);
    sp->bounds[i] = lnr_optv_number(o, "buckets", -1, -HUGE_VAL, HUGE_VAL);
    lua_pop(L, 1);
    if (!isfinite(sp->bounds[i]) || (i > 0 && !(sp->bounds[i] > sp->bounds[i - 1])))
      lnr_opts_error(o, "buckets must be finite and increasing, got %f after %f",
                     sp->bounds[i], i > 0 ? sp->bounds[i - 1] : -HUGE_VAL);
  }
  lua_pop(L, 1);
  sp->nbounds = n;
}

static void read_spec(lua_State *L, int type, const char *what, spec_t *sp) {
  static const char *const keys[] = {"name", "help", "labels", "buckets",
                                     "max_series", NULL};
  lnr_opts_t o;
  lnr_opts_open(&o, L, 1, what, keys, true);
  memset(sp, 0, sizeof *sp);
  sp->type = type;
  sp->name = lnr_opt_string(&o, "name", NULL, NULL);
  if (sp->name == NULL)
    lnr_opts_error(&o, "name is required");
  if (!valid_name(sp->name, true))
    lnr_opts_error(&o, "name %s is not a valid metric name ([a-zA-Z_:][a-zA-Z0-9_:]*)",
                   sp->name);
  if (strncmp(sp->name, "netrun_", 7) == 0)
    lnr_opts_error(&o, "name %s: the prefix netrun_ is netrun's own", sp->name);
  sp->help = lnr_opt_string(&o, "help", "", NULL);
  read_labels(&o, sp);
  read_buckets(&o, sp);
  sp->max_series = (size_t)lnr_opt_integer(&o, "max_series", DEFAULT_MAX_SERIES,
                                           1, MAX_SERIES_LIMIT);
}

static void free_family(family_t *f) {
  if (f == NULL)
    return;
  for (series_t *s = f->first, *n; s; s = n) {
    n = s->next;
    free(s->counts);
    free(s);
  }
  if (f->overflow) {
    free(f->overflow->counts);
    free(f->overflow);
  }
  for (int i = 0; i < f->nlabels; i++)
    free(f->labels[i]);
  free(f->table);
  free(f->bounds);
  free(f->name);
  free(f->help);
  pthread_mutex_destroy(&f->lock);
  free(f);
}

static family_t *new_family(const spec_t *sp) {
  family_t *f = calloc(1, sizeof *f);
  if (f == NULL)
    return NULL;
  pthread_mutex_init(&f->lock, NULL);
  f->type = sp->type;
  f->nlabels = sp->nlabels;
  f->nbounds = sp->type == M_HISTOGRAM ? sp->nbounds : 0;
  f->max_series = sp->max_series;
  bool ok = (f->name = strdup(sp->name)) && (f->help = strdup(sp->help));
  for (int i = 0; i < f->nlabels; i++)
    ok = ok && (f->labels[i] = strdup(sp->labels[i]));
  if (ok && f->nbounds > 0 && (f->bounds = malloc(sizeof(double) * f->nbounds)))
    memcpy(f->bounds, sp->bounds, sizeof(double) * f->nbounds);
  ok = ok && (f->nbounds == 0 || f->bounds);
  if (ok && f->nlabels == 0) {
    ok = (f->only = new_series(f, "", 0, 0)) != NULL;
    if (ok)
      append(f, f->only);
  } else if (ok) {
    size_t n = 16;
    while (n < f->max_series * 2)
      n *= 2;
    f->mask = n - 1;
    char key[MAX_LABELS * 10];
    size_t klen = 0;
    for (int i = 0; i < f->nlabels; i++) {
      memcpy(key + klen, "_overflow", 10);
      klen += 10;
    }
    ok = (f->table = calloc(n, sizeof *f->table)) &&
         (f->overflow = new_series(f, key, klen, 0));
  }
  if (!ok) {
    free_family(f);
    return NULL;
  }
  return f;
}

/* Does the family f match what was asked (same type, labels, buckets)? */
static bool same(const family_t *f, const spec_t *sp) {
  if (f->type != sp->type || f->nlabels != sp->nlabels ||
      (sp->type == M_HISTOGRAM && f->nbounds != sp->nbounds))
    return false;
  for (int i = 0; i < f->nlabels; i++)
    if (strcmp(f->labels[i], sp->labels[i]) != 0)
      return false;
  for (int i = 0; i < f->nbounds; i++)
    if (f->bounds[i] != sp->bounds[i])
      return false;
  return true;
}

static int make(lua_State *L, int type, const char *what) {
  spec_t sp;
  read_spec(L, type, what, &sp);
  pthread_mutex_lock(&families_lock);
  family_t *f = atomic_load(&families);
  while (f && strcmp(f->name, sp.name) != 0)
    f = atomic_load(&f->next);
  bool clash = f && !same(f, &sp);
  if (f == NULL && (f = new_family(&sp)) != NULL) {
    if (families_tail)
      atomic_store_explicit(&families_tail->next, f, memory_order_release);
    else
      atomic_store_explicit(&families, f, memory_order_release);
    families_tail = f;
  }
  int old_type = f ? f->type : 0;
  pthread_mutex_unlock(&families_lock);
  if (f == NULL)
    return luaL_error(L, "%s: %s: out of memory", what, sp.name);
  if (clash)
    lnr_raise(L, "%s: %s is already a %s of other labels or buckets", what,
              sp.name, TYPES[old_type]);
  lnr_push_handle(L, LNR_METRIC, f);
  return 1;
}

/***
A counter family (`netrun.metrics.counter`): the same name gives the same
family from any state; asking again with other labels raises.
@function counter
@tparam table opts
@string opts.name a Prometheus metric name, not starting with `netrun_`
@string[opt=""] opts.help
@tparam[opt] {string,...} opts.labels label names
@int[opt=1000] opts.max_series the most label sets; past it updates go
  to one series whose labels are all `_overflow`
@treturn metric
*/
static int l_counter(lua_State *L) {
  return make(L, M_COUNTER, "netrun.metrics.counter");
}

/***
A gauge family (`netrun.metrics.gauge`), options as `metrics.counter`.
@function gauge
@tparam table opts
@treturn metric
*/
static int l_gauge(lua_State *L) {
  return make(L, M_GAUGE, "netrun.metrics.gauge");
}

/***
A histogram family (`netrun.metrics.histogram`), options as
`metrics.counter` plus buckets.
@function histogram
@tparam table opts
@tparam[opt] {number,...} opts.buckets upper bounds, increasing (1 to 64;
  Prometheus' defaults, .005 to 10, when absent); +Inf is added
@treturn metric
*/
static int l_histogram(lua_State *L) {
  return make(L, M_HISTOGRAM, "netrun.metrics.histogram");
}

/* The process's teardown: every family is freed. */
static bool free_families(lua_State *L) {
  (void)L;
  pthread_mutex_lock(&families_lock);
  for (family_t *f = families, *n; f; f = n) {
    n = f->next;
    free_family(f);
  }
  families = NULL;
  families_tail = NULL;
  pthread_mutex_unlock(&families_lock);
  return true;
}

static void open_metrics(lua_State *L) {
  static const luaL_Reg methods[] = {
      {"inc", m_inc}, {"dec", m_dec}, {"set", m_set}, {"observe", m_observe},
      {"get", m_get}, {NULL, NULL}};
  static const luaL_Reg meta[] = {{"__tostring", m_tostring}, {NULL, NULL}};
  lnr_new_class(L, lnr_kind_names[LNR_METRIC], methods, meta);
  lnr_handle_class(L, LNR_METRIC);
  static const luaL_Reg funcs[] = {
      {"metric_counter", l_counter}, {"metric_gauge", l_gauge},
      {"metric_histogram", l_histogram}, {"metrics_text", l_metrics_text},
      {NULL, NULL}};
  luaL_setfuncs(L, funcs, 0);
}

lnr_module_t lnr_metrics_module = {
    .name = "metrics", .open = open_metrics, .teardown = free_families};
