/* Per-cgroup memory reclaim stalls: memcg reclaim (a cgroup over its limit or high
 * mark) and direct reclaim (the node short of memory), both run by the allocating task,
 * which is current; plus mm_vmscan_throttled occurrences (reclaim made to wait).
 */
#include "intf.h"

enum reclaim_kind {
    RECLAIM_MEMCG = 0,
    RECLAIM_DIRECT = 1,
};

struct reclaim_start_key {
    u32 pid;
    u32 kind;
};

struct reclaim_stats {
    u64 reclaim_count;
    u64 reclaim_ns;
    u64 vmscan_throttled;
    u64 reclaim_us_slots[HIST_SLOTS];
};

/* LRU: a start whose end the kernel skipped (BPF recursion guard) would otherwise stay
 * until its pid is reused; on a long-lived node those leftovers would fill the map and
 * every later start would be lost. Eviction drops the oldest (the leftovers) first. */
BPF_TABLE("lru_hash", struct reclaim_start_key, u64, started_ns, MAX_TASKS);
BPF_PERCPU_HASH(stats, struct cgroup_key, struct reclaim_stats, MAX_CGROUPS);

static __always_inline struct reclaim_stats *current_cgroup_stats(void)
{
    struct cgroup_key key = current_cgroup_key();
    struct reclaim_stats zero = {};
    struct reclaim_stats *cg = stats.lookup_or_try_init(&key, &zero);
    if (!cg)
        count_lost_entry(key.generation, LOST_CGROUP_ENTRY);
    return cg;
}

static __always_inline int reclaim_begin(u32 kind)
{
    struct reclaim_start_key key = {.pid = current_pid(), .kind = kind};
    u64 now = bpf_ktime_get_ns();
    if (started_ns.update(&key, &now) != 0)
        count_lost_entry(current_generation(), LOST_TASK_ENTRY);
    return 0;
}

static __always_inline int reclaim_end(u32 kind)
{
    struct reclaim_start_key key = {.pid = current_pid(), .kind = kind};
    u64 *start = started_ns.lookup(&key);
    if (!start)
        return 0; /* began before the program was attached */
    u64 now = bpf_ktime_get_ns();
    u64 stall = now > *start ? now - *start : 0;
    started_ns.delete(&key);

    struct reclaim_stats *cg = current_cgroup_stats();
    if (!cg)
        return 0;
    cg->reclaim_count += 1;
    cg->reclaim_ns += stall;
    u32 slot = log2_slot(stall / 1000);
    if (slot < HIST_SLOTS)
        cg->reclaim_us_slots[slot] += 1;
    return 0;
}

TRACEPOINT_PROBE(vmscan, mm_vmscan_memcg_reclaim_begin)
{
    reclaim_begin(RECLAIM_MEMCG);
    return KEEP_PERF_SAMPLES;
}

TRACEPOINT_PROBE(vmscan, mm_vmscan_memcg_reclaim_end)
{
    reclaim_end(RECLAIM_MEMCG);
    return KEEP_PERF_SAMPLES;
}

TRACEPOINT_PROBE(vmscan, mm_vmscan_direct_reclaim_begin)
{
    reclaim_begin(RECLAIM_DIRECT);
    return KEEP_PERF_SAMPLES;
}

TRACEPOINT_PROBE(vmscan, mm_vmscan_direct_reclaim_end)
{
    reclaim_end(RECLAIM_DIRECT);
    return KEEP_PERF_SAMPLES;
}

TRACEPOINT_PROBE(vmscan, mm_vmscan_throttled)
{
    struct reclaim_stats *cg = current_cgroup_stats();
    if (cg)
        cg->vmscan_throttled += 1;
    return KEEP_PERF_SAMPLES;
}
