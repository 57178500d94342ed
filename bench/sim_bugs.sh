#!/usr/bin/env bash
# bench/sim_bugs.sh -- netrun.sim's bug-finding power (issue 31): bugs
# planted in the real source, one at a time, each looked for by the
# simulated scenarios (spec/sim/*.lua) over seeds 1-1000; prints, per bug,
# the first seed whose run fails (and how), or that none did.
#
#   bench/sim_bugs.sh [BUG...]     bugs: idle_off_by_one pool_leak_on_reset
#                                  post_retried stale_timeout lost_wakeup
#
# The tree (HEAD, unchanged) is copied to a scratch directory (WORK=DIR
# keeps it, and its build, for the next run) and built once; each bug is an exact edit of one line or two of that copy (it
# must match once: the script stops otherwise, so a bug that no longer
# applies is noticed), rebuilt (one file), run, and undone. Nothing here
# runs in ctest: it takes minutes.
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
SEEDS=${SEEDS:-1-1000}
work=${WORK:-$(mktemp -d /tmp/netrun-sim-bugs.XXXXXX)}   # WORK=DIR: kept, reused
[[ -n ${WORK:-} ]] || trap 'rm -rf "$work"' EXIT
rm -rf "$work/src"
git -C "$here" archive HEAD | tar -x -C "$work" --one-top-level=src
cmake -S "$work/src" -B "$work/build" -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DNETRUN_BENCH=OFF >/dev/null
cmake --build "$work/build" -j2 --target netrun_bin >/dev/null

# plant NAME FILE-PATTERN OLD NEW: in the one file under runtime/ holding
# OLD (and matching FILE-PATTERN), OLD becomes NEW.
plant() {
  python3 - "$work/src" "$2" "$3" "$4" <<'PY'
import pathlib, sys
root, pattern, old, new = sys.argv[1:]
hits = [p for p in pathlib.Path(root, "runtime").rglob(pattern) if old in p.read_text()]
if len(hits) != 1 or hits[0].read_text().count(old) != 1:
    sys.exit(f"plant: {old!r} is not in exactly one place ({len(hits)} files)")
p = hits[0]
pathlib.Path(str(p) + ".orig").write_text(p.read_text())
p.write_text(p.read_text().replace(old, new))
print(p.relative_to(root))
PY
}
unplant() {
  find "$work/src/runtime" -name '*.orig' | while read -r f; do
    mv "$f" "${f%.orig}" && touch "${f%.orig}"     # (newer than its object)
  done
}

# hunt NAME FILE SCENARIO: the first seed of SEEDS whose run fails.
hunt() {
  local name=$1 file=$2 scenario=$3 out
  cmake --build "$work/build" -j2 --target netrun_bin >/dev/null
  local t0=$SECONDS
  out=$(cd "$work/src" && NETRUN_SIM_ONLY=$scenario timeout 600 \
        "$work/build/bin/netrun" --sim "$SEEDS" "$file" 2>&1) || true
  local seed
  seed=$(grep -o 'failed with seed [0-9]*' <<<"$out" | grep -o '[0-9]*$' || true)
  if [[ -n $seed ]]; then
    local why
    why=$(grep -m1 '^netrun.sim: seed' <<<"$out" | cut -c1-160)
    printf '| %s | %s | %s | %s s | %s |\n' "$name" "$scenario" "$seed" $((SECONDS - t0)) "$why"
  else
    printf '| %s | %s | not found in %s | %s s | %s |\n' "$name" "$scenario" "$SEEDS" \
      $((SECONDS - t0)) "$(tail -1 <<<"$out" | cut -c1-120)"
  fi
}

bug() {
  case $1 in
    idle_off_by_one)   # the server's idle (keep-alive) timeout one second short
      plant "$1" 'http_server.c' '  s->timeout[2] = o->keepalive_timeout;' \
        '  s->timeout[2] = o->keepalive_timeout - NR_SEC(1);' >/dev/null
      hunt "$1" spec/sim/server.lua keepalive_timeout_closes_an_idle_connection_at_75_s ;;
    pool_leak_on_reset)   # a connection that dies of a reset keeps its place
      plant "$1" 'lhttp_pool.c' '    c->gone = true;
    P->total--;' '    c->gone = true;
    if (!strstr(c->err, "ECONNRESET")) P->total--;' >/dev/null
      hunt "$1" spec/sim/client.lua a_pool_of_one_connects_again_after_its_connection_is_reset ;;
    post_retried)   # POST counts as idempotent: sent again when its connection closes
      plant "$1" 'lhttp_pool.c' '    if (strcmp(m, ok[i]) == 0)' \
        '    if (strcmp(m, ok[i]) == 0 || strcmp(m, "POST") == 0)' >/dev/null
      hunt "$1" spec/sim/client.lua a_get_is_sent_again_when_its_reused_connection_closes_unanswered ;;
    stale_timeout)   # a connection's old deadline is not let go when its wait ends
      plant "$1" 'http_server.c' '    if (s->wait == l->wait && !s->closing' \
        '    if (!s->closing' >/dev/null
      hunt "$1" spec/sim/server.lua a_slow_answer_is_waited_for_and_counts_no_idle_time ;;
    lost_wakeup)   # a producer wakes a loop only if it blocks with no deadline
      plant "$1" 'executor.c' '  if (atomic_load(&l->next_wakeup) != NR_AWAKE &&' \
        '  if (atomic_load(&l->next_wakeup) == NR_NONE &&' >/dev/null
      hunt "$1" spec/sim/server.lua an_answer_computed_by_another_group_goes_out_at_once ;;
    *) echo "sim_bugs: no bug $1" >&2; exit 2 ;;
  esac
  unplant
}

BUGS=("$@")
((${#BUGS[@]})) || BUGS=(idle_off_by_one pool_leak_on_reset post_retried stale_timeout lost_wakeup)
echo "| bug | scenario | first failing seed | wall | how it failed |"
echo "|---|---|---:|---:|---|"
for b in "${BUGS[@]}"; do bug "$b"; done
