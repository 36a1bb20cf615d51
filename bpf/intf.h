/* Shared definitions of the interference agent's BPF programs (compiled by BCC).
 *
 * Contract with node_agent/probes/bpf/ (the loader and the drain):
 *  - every per-cgroup map is keyed by a struct ending in a generation (struct cgroup_key;
 *    runqlat's culprits map: struct culprit_key), the value of drain_generation[0] when
 *    the event was counted. The agent bumps the generation,
 *    waits a grace period for in-flight programs, then reads and deletes the old
 *    generation's entries: counts arriving during the drain land in the new generation,
 *    so none is lost and every interval starts from empty maps (bounded size).
 *  - programs read tracepoint arguments and helpers only, never kernel struct fields,
 *    so they stay correct when the headers BCC compiles against differ from the kernel.
 *  - every entry a program could not keep is counted (count_lost_entry) in lost_entries
 *    under the parity of its drain generation; the agent reads and zeroes the old
 *    parity's slots after the grace period, so no count is lost between read and reset.
 *  - a map named tasks keyed by u32 pid is seeded by the loader, right after the attach,
 *    with an all-zero entry for every thread then present (never overwriting one the
 *    programs made); what was counted before the agent's first interval is drained away.
 */
#ifndef INTERFERENCE_INTF_H
#define INTERFERENCE_INTF_H

/* Log2 histogram slots, as interference/hist.py MAX_SLOTS: slot i counts floor(log2(v)). */
#define HIST_SLOTS 27
/* Map sizes; tests shrink them with -D (node_agent/probes/bpf/loader.py cflags). */
#ifndef MAX_CGROUPS
/* Cgroups that can be active within one drain interval. */
#define MAX_CGROUPS 8192
#endif
#ifndef MAX_TASKS
/* Tasks tracked at once (runnable or mid-reclaim). */
#define MAX_TASKS 32768
#endif
#ifndef MAX_CULPRIT_PAIRS
/* (waiting cgroup, culprit cgroup) pairs that can be active within one drain interval. */
#define MAX_CULPRIT_PAIRS 16384
#endif

struct cgroup_key {
    u64 cgroup_id;  /* cgroup v2 id: inode of the cgroup directory */
    u64 generation; /* drain generation the counts belong to */
};

BPF_ARRAY(drain_generation, u64, 1);

static __always_inline u64 current_generation(void)
{
    u32 zero = 0;
    u64 *generation = drain_generation.lookup(&zero);
    return generation ? *generation : 0;
}

/* What a full map (or an LRU eviction) cost; index of lost_entries within a parity. */
#define LOST_CGROUP_ENTRY 0 /* a per-cgroup entry (stats, culprit pair) not created: those counts are gone */
#define LOST_TASK_ENTRY 1   /* a per-task entry not stored or evicted: that wait/stall is gone */
#define LOST_KINDS 2

/* Slot (generation & 1) * LOST_KINDS + kind; written only on the failure path. */
BPF_PERCPU_ARRAY(lost_entries, u64, 2 * LOST_KINDS);

static __always_inline void count_lost_entry(u64 generation, u32 kind)
{
    u32 slot = (u32)(generation & 1) * LOST_KINDS + kind;
    u64 *count = lost_entries.lookup(&slot);
    if (count)
        *count += 1;
}

static __always_inline struct cgroup_key current_cgroup_key(void)
{
    struct cgroup_key key = {
        .cgroup_id = bpf_get_current_cgroup_id(),
        .generation = current_generation(),
    };
    return key;
}

/* floor(log2(v)), 0 for v <= 1, capped to the last slot (same as hist.slot_of). */
static __always_inline u32 log2_slot(u64 v)
{
    u32 r, shift;

    r = (v > 0xFFFFFFFFULL) << 5; v >>= r;
    shift = (v > 0xFFFF) << 4; v >>= shift; r |= shift;
    shift = (v > 0xFF) << 3; v >>= shift; r |= shift;
    shift = (v > 0xF) << 2; v >>= shift; r |= shift;
    shift = (v > 0x3) << 1; v >>= shift; r |= shift;
    r |= (u32)(v >> 1);
    return r < HIST_SLOTS ? r : HIST_SLOTS - 1;
}

/* What every tracepoint program returns. A perf-attached tracepoint program that returns
 * 0 makes the kernel drop that event for every other perf user on the tracepoint
 * (`perf stat -e sched:sched_switch` would count nothing while the agent runs); 1 keeps
 * their samples. */
#define KEEP_PERF_SAMPLES 1

static __always_inline u32 current_pid(void)
{
    return (u32)bpf_get_current_pid_tgid();
}

#endif
