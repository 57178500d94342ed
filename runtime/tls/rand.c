/*
 * rand.c -- OpenSSL's randomness inside a simulation: while a world is
 * entered (runtime/sim/), OpenSSL's RAND method draws from nr_random_bytes
 * -- the world's seeded generator on its thread, getrandom(2) on any
 * other -- so that handshakes (randoms, key shares, signatures, tickets)
 * replay with the seed. Outside a simulation OpenSSL's own DRBG serves,
 * as always. Any thread (OpenSSL locks the method).
 */
#define OPENSSL_SUPPRESS_DEPRECATED      /* RAND_METHOD: the one switch OpenSSL 3 has */
#include <openssl/rand.h>

#include "netrun.h"
#include "tls/tls.h"

static int sim_bytes(unsigned char *buf, int num) {
  if (num > 0)
    nr_random_bytes(buf, (size_t)num);
  return 1;
}

static int sim_status(void) { return 1; }

static const RAND_METHOD sim_method = {
    .bytes = sim_bytes, .pseudorand = sim_bytes, .status = sim_status};

void nr_tls_simulated_random(bool on) {
  RAND_set_rand_method(on ? &sim_method : NULL);
}
