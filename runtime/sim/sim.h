/*
 * sim/sim.h -- what the core asks of the simulation (runtime/sim/), at the
 * few places where a simulated loop differs from a real one: its creation
 * (attached to the simulation when made on its thread), its "thread" (a
 * fiber the simulation's scheduler steps), its end, a main loop waiting on
 * nothing, and names (a host's name is its address). Everything else
 * reaches the simulation through the two seams: the clock (clock.c) and
 * the transport (sys.h). Internal to runtime/.
 */
#ifndef NR_SIM_SIM_H
#define NR_SIM_SIM_H

#include <stdbool.h>

#include "netrun.h"

struct nr_simloop_s;

/* At a loop's creation (nr__loop_init): its simulated part when the
 * caller is a simulation's thread -- the loop is then simulated for good
 * -- else NULL (the production path: one thread-local load). */
struct nr_simloop_s *nr__sim_attach(nr_loop_t *l);
/* Start the loop's fiber, which runs fn(l) and then ends. 0 or -errno. */
int nr__sim_start(nr_loop_t *l, void *(*fn)(void *));
/* nr_loop_free: the simulated part goes (the fiber has ended, or never
 * started). Any time, even after the simulation ended. */
void nr__sim_detach(nr_loop_t *l);
/* Whether l, the simulation's main loop, waits for something nothing can
 * ever bring: no loop can run and nothing is scheduled. Its waits then
 * fail (NR_ESIMSTUCK) instead of waiting forever. */
bool nr__sim_stuck(nr_loop_t *l);
/* A host name of the simulation the caller runs in: 1 with its address
 * in out, -ENOENT for a name no host has, 0 when the caller is not in a
 * simulation or name is numeric (nr_resolve_local's). */
int nr__sim_lookup(const char *name, int family, nr_addrs_t *out);

#endif /* NR_SIM_SIM_H */
