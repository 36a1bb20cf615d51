#!/usr/bin/env bash
# One benchmark of docs/BENCHMARKS.md's headline table by its name, with the arguments its
# figures were measured with (`make bench BENCH=NAME`; `make bench` runs them all).
# A benchmark that needs what this machine lacks (root, a real kube-apiserver and etcd, a
# base revision to compare with) prints one "skip" line and succeeds, so `make bench` runs
# the others.
set -euo pipefail
cd "$(dirname "$0")/.."

name=${1:?usage: bench/run.sh NAME, a benchmark of the headline table in docs/BENCHMARKS.md}
PY=${PY:-.venv/bin/python}

skip() {
    echo "skip $name: $*"
    exit 0
}
needs_root() {
    [[ $EUID -eq 0 ]] || skip "needs root (the kernel's BPF, cgroups, perf)"
}
needs_control_plane() {
    local problem
    if ! problem=$("$PY" -c 'from tests.e2e.control_plane import find_assets; find_assets()' 2>&1); then
        skip "needs kube-apiserver and etcd: $(tail -n 1 <<<"$problem")"
    fi
}

echo "== $name ($(date -u '+%Y-%m-%d %H:%M UTC'), $(git rev-parse --short HEAD), load average $(cut -d' ' -f1-3 /proc/loadavg))"
case $name in
    agent_overhead)
        needs_root
        exec "$PY" bench/agent_overhead.py --repetitions 9 --loops 200000 ;;
    agent_metrics_scrape)
        exec "$PY" bench/agent_metrics_scrape.py --pods 110 --repetitions 1000 ;;
    runqlat_accuracy)
        needs_root
        exec "$PY" -m pytest -q -s -p no:cacheprovider tests/node_agent/test_bpf_runqlat.py ;;
    demo)
        needs_root
        exec "$PY" -m interference_demo.demo ;;
    onoff_antagonist)
        needs_root
        exec "$PY" bench/onoff_antagonist.py --seconds 120 ;;
    rebalance)
        needs_root
        exec "$PY" bench/rebalance.py --runs 3 ;;
    scheduler_throughput)
        exec "$PY" bench/scheduler_throughput.py ;;
    tracing_cost)
        exec "$PY" bench/tracing_cost.py --path in-memory --nodes 5000 --running 50000 \
            --pending 3000 --rounds 5 --pin ;;
    signal_plane)
        needs_control_plane
        exec "$PY" bench/signal_plane.py --seconds 30 ;;
    scheduler_real_api)
        needs_control_plane
        exec "$PY" bench/scheduler_real_api.py --nodes 5000 --pods 5000 ;;
    preemption_real_api)
        needs_control_plane
        exec "$PY" bench/preemption_real_api.py --runs 3 ;;
    extender_real_api)
        needs_control_plane
        exec "$PY" bench/extender_real_api.py --nodes 5000 --pods 2000 ;;
    extender_costly_requests)
        exec "$PY" bench/extender_costly_requests.py ;;
    noisy_node)
        # The baseline (no bad node) and both attacks, one after the other: the anchor is the
        # baseline's bind latency and staleness.
        needs_root
        needs_control_plane
        for attack in none at-cap over-cap; do
            "$PY" bench/noisy_node.py --nodes 1000 --seconds 40 --attack "$attack" --bind-rate 10
        done ;;
    throughput_versus)
        # This tree beside a revision in alternating turns of the scheduling loop end to end.
        # The base runs this tree's driver too (given as a patch to its bench/), so both
        # sides build the same workload and take their signals the same way.
        [[ -n ${BASE:-} ]] || skip "needs BASE=REVISION (make bench BENCH=throughput_versus BASE=...)"
        driver_patch=$(mktemp --suffix=-driver.patch)
        trap 'rm -f "$driver_patch"' EXIT
        # A base from before scheduler/'s packages (a586bb1) cannot import this driver: it
        # runs its own, which builds the same workload (it must have the turns).
        if git cat-file -e "$BASE:scheduler/cycle/cycle.py" 2>/dev/null; then
            git diff "$BASE" -- bench/scheduler_throughput.py bench/signal_replay.py >"$driver_patch"
        fi
        patch_args=()
        [[ -s $driver_patch ]] && patch_args=(--base-patch "$driver_patch")
        "$PY" bench/throughput_versus.py --base "$BASE" "${patch_args[@]}" --rounds 3 \
            --turns 500 --turns-phase end-to-end ;;
    *)
        echo "bench/run.sh: no benchmark named $name" >&2
        exit 2 ;;
esac
