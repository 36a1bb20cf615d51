#!/usr/bin/env bash
# The kernel's housekeeping on one CPU, and back, for e2e_cluster.sh's act one.
#   housekeeping.sh to CPU DIR   the unbound workqueues and every kernel thread that may run
#                                anywhere onto CPU; what they had before goes to DIR
#   housekeeping.sh restore DIR  puts back what DIR holds (again: no change)
#   housekeeping.sh leftovers DIR  prints what is not back, one line each
# As on a node whose housekeeping CPUs are reserved (isolcpus, nohz_full): with the
# antagonist saturating the system CPU, the kernel otherwise runs that work (DAMON's
# kdamond alone about 10 ms/s on this VM) on the quiet node's CPU, in front of its pods.
# Beside stress-ng on CPU 0, a 1 ms sleeper on CPU 1 waited 3.1 ms/s, 0.35 ms/s with this.
# Per-CPU threads refuse a move and stay where they are.
set -uo pipefail
WORKQUEUE_CPUMASK=/sys/devices/virtual/workqueue/cpumask

kthread_start() { # PID: its start time (a PID reused by another thread reads differently)
    cut -d' ' -f22 "/proc/$1/stat" 2>/dev/null
}

case ${1:-} in
to)
    cpu=$2 dir=$3
    mkdir -p "$dir"
    [[ -e $dir/kthreads.before ]] && { echo "housekeeping: moved already ($dir)" >&2; exit 1; }
    : > "$dir/kthreads.before"
    if [[ -w $WORKQUEUE_CPUMASK ]]; then
        cat "$WORKQUEUE_CPUMASK" > "$dir/workqueue.before"
        printf '%x\n' $((1 << cpu)) > "$WORKQUEUE_CPUMASK"
    fi
    for pid in 2 $(pgrep -P 2); do
        cpus=$(taskset -pc "$pid" 2>/dev/null | awk '{print $NF}')
        [[ -n $cpus && $cpus != "$cpu" ]] || continue
        taskset -pc "$cpu" "$pid" >/dev/null 2>&1 && echo "$pid $(kthread_start "$pid") $cpus" >> "$dir/kthreads.before"
    done
    echo "workqueue cpumask $(cat "$WORKQUEUE_CPUMASK" 2>/dev/null || echo absent), $(wc -l < "$dir/kthreads.before") kernel threads on CPU $cpu"
    ;;
restore)
    dir=$2
    [[ -f $dir/workqueue.before ]] && cat "$dir/workqueue.before" > "$WORKQUEUE_CPUMASK"
    [[ -f $dir/kthreads.before ]] && while read -r pid start cpus; do
        [[ $(kthread_start "$pid") == "$start" ]] && taskset -pc "$cpus" "$pid" >/dev/null 2>&1
    done < "$dir/kthreads.before"
    exit 0
    ;;
leftovers)
    dir=$2
    [[ ! -f $dir/workqueue.before || $(cat "$WORKQUEUE_CPUMASK") == "$(cat "$dir/workqueue.before")" ]] \
        || echo "workqueue cpumask $(cat "$WORKQUEUE_CPUMASK")"
    [[ -f $dir/kthreads.before ]] && while read -r pid start cpus; do
        [[ $(kthread_start "$pid") == "$start" && $(taskset -pc "$pid" | awk '{print $NF}') != "$cpus" ]] \
            && echo "kernel thread $pid's CPUs"
    done < "$dir/kthreads.before"
    exit 0
    ;;
*)
    echo "usage: housekeeping.sh to CPU DIR | restore DIR | leftovers DIR" >&2
    exit 2
    ;;
esac
