/* Per-cgroup run-queue delay (count, sum, log2 µs histogram), idle wake-up delay and
 * on-CPU time.
 *
 * Enqueue: sched_wakeup / sched_wakeup_new, and a `prev` switched out still runnable.
 * At switch-in the delay of `next` is known but the current task is still `prev`, so the
 * delay is stashed per pid and added to the task's own cgroup
 * (bpf_get_current_cgroup_id()) at its next switch-out, when it is current.
 * On-CPU time runs from switch-in to switch-out on each CPU.
 *
 * A switch-in whose `prev` is the idle task waited for the CPU to wake up, not behind
 * another task: that delay is the CPU's idle-exit latency (C-states, vCPU wake-up), no
 * neighbour's fault, so it goes to idle_wakeup_* and never into the run-queue figures.
 *
 * Culprits: who held the CPU while a task waited. Each CPU keeps a ring of its last
 * CULPRIT_STINTS on-CPU stints (cgroup, start, end), pushed at every switch while `prev`
 * is current. At a task's switch-in its wait [enqueued, now] is split over the stints
 * that overlap it, newest first; what the ring no longer covers goes to the newest
 * stint, `prev` (the task that ran last before the waiter got the CPU: Netflix's
 * "preempted by"). The split waits in a per-CPU slot until the task's switch-out on the
 * same CPU, when its own cgroup is current, and is added to
 * culprits[(waiter's cgroup, stint's cgroup)]: wait_ns by overlap, wait_count 1 for
 * `prev`'s pair. So a cgroup's pairs sum to its runq_ns and runq_count exactly, unless a
 * pair entry could not be created (counted as a lost cgroup entry). A split over stints
 * rather than `prev` alone keeps a frequently waking short task (a profiler, a kworker)
 * from taking the blame for a wait spent behind a busy loop.
 *
 * Lost entries (count_lost_entry): a stats entry that cannot be created (map full) loses
 * that switch-out's counts; a task entry that cannot be stored, or that the LRU evicted
 * while the task was queued, shows up as a switch-in of a task without an entry, whose
 * wait is then unknown. Evicting a sleeping task's entry loses nothing: its next wake-up
 * stores a fresh one.
 */
#include "intf.h"

/* sched_switch's prev_state holds TASK_REPORT bits (0xff, idle included) and
 * TASK_REPORT_MAX (0x100) for a preempted task; no state bit means still runnable. */
#define TASK_REPORT_STATE_MASK 0xffUL
/* The report bits of an exiting task (EXIT_DEAD, EXIT_ZOMBIE). */
#define TASK_REPORT_EXITING 0x30UL

struct runq_stats {
    u64 runq_count;
    u64 runq_ns;
    u64 idle_wakeup_count;
    u64 idle_wakeup_ns;
    u64 oncpu_ns;
    u64 runq_us_slots[HIST_SLOTS];
};

struct task_state {
    u64 enqueued_ns;      /* when it became runnable; 0 when not queued */
    u64 pending_delay_ns; /* delay measured at switch-in, not yet attributed */
    u64 has_pending;
    u64 pending_from_idle; /* the stashed delay ended by switching in from the idle task */
};

/* On-CPU stints a wait is split over (a power of two: the ring index is masked). */
#define CULPRIT_STINTS 64

struct cpu_stints {
    u64 cgroup_id[CULPRIT_STINTS]; /* 0: the idle task */
    u64 start_ns[CULPRIT_STINTS];
    u64 end_ns[CULPRIT_STINTS];
    u64 newest;
};

/* The wait of the task switched in on this CPU, split by culprit; slot 0 is `prev`. */
struct wait_split {
    u64 pid; /* 0: none pending */
    u64 cgroup_id[CULPRIT_STINTS];
    u64 wait_ns[CULPRIT_STINTS];
};

struct culprit_key {
    u64 cgroup_id;         /* the waiting task's cgroup */
    u64 culprit_cgroup_id; /* the cgroup of the task that held the CPU until its switch-in */
    u64 generation;
};

struct culprit_wait {
    u64 wait_count;
    u64 wait_ns;
};

/* Seeded by the loader with an empty entry per thread present at attach.
 * A task keeps its entry while it sleeps (no delete + insert per sleep/wake-up cycle, the
 * bulk of the per-event cost) and loses it when it exits; LRU evicts what an exit
 * skipped by the kernel would otherwise leave behind, and the least recently used
 * (sleeping) tasks first when more tasks than MAX_TASKS are about. */
BPF_TABLE("lru_hash", u32, struct task_state, tasks, MAX_TASKS);
BPF_PERCPU_ARRAY(oncpu_since_ns, u64, 1);
BPF_PERCPU_HASH(stats, struct cgroup_key, struct runq_stats, MAX_CGROUPS);
/* Shared across CPUs with atomic adds: small values, and a per-CPU copy of every pair
 * would cost MAX_CULPRIT_PAIRS x CPUs of memory. */
BPF_HASH(culprits, struct culprit_key, struct culprit_wait, MAX_CULPRIT_PAIRS);
BPF_PERCPU_ARRAY(stints, struct cpu_stints, 1);
BPF_PERCPU_ARRAY(pending_split, struct wait_split, 1);

static __always_inline void charge_culprit(struct cgroup_key *waiter, u64 culprit, u64 count,
                                           u64 wait_ns)
{
    struct culprit_key key = {
        .cgroup_id = waiter->cgroup_id,
        .culprit_cgroup_id = culprit,
        .generation = waiter->generation,
    };
    struct culprit_wait zero = {};
    struct culprit_wait *pair = culprits.lookup_or_try_init(&key, &zero);
    if (!pair) {
        count_lost_entry(waiter->generation, LOST_CGROUP_ENTRY);
        return;
    }
    if (count)
        __sync_fetch_and_add(&pair->wait_count, count);
    __sync_fetch_and_add(&pair->wait_ns, wait_ns);
}

/* The waiter (current, switching out) files the split its switch-in left on this CPU. */
static __always_inline void charge_split(struct cgroup_key *waiter, u32 pid, u64 delay)
{
    u32 zero = 0;
    struct wait_split *split = pending_split.lookup(&zero);
    if (!split || split->pid != pid) {
        /* Not split at its switch-in (a missed event): all on an unknown culprit. */
        charge_culprit(waiter, 0, 1, delay);
        return;
    }
#pragma unroll
    for (int k = 0; k < CULPRIT_STINTS; k++) {
        if (k == 0 || split->wait_ns[k])
            charge_culprit(waiter, split->cgroup_id[k], k == 0, split->wait_ns[k]);
    }
    split->pid = 0;
}

/* `prev` (current) ends a stint on this CPU; the idle task's stints are cgroup 0. */
static __always_inline void push_stint(u64 cgroup_id, u64 start, u64 end)
{
    u32 zero = 0;
    struct cpu_stints *ring = stints.lookup(&zero);
    if (!ring || !start)
        return;
    u32 slot = (u32)(ring->newest + 1) & (CULPRIT_STINTS - 1);
    ring->cgroup_id[slot] = cgroup_id;
    ring->start_ns[slot] = start;
    ring->end_ns[slot] = end;
    ring->newest = slot;
}

/* Split the wait [enqueued, now] of `pid` over this CPU's stints that overlap it. */
static __always_inline void split_wait(u32 pid, u64 enqueued, u64 now)
{
    u32 zero = 0;
    struct cpu_stints *ring = stints.lookup(&zero);
    struct wait_split *split = pending_split.lookup(&zero);
    if (!ring || !split)
        return;
    u64 left = now > enqueued ? now - enqueued : 0;
    u32 newest = (u32)ring->newest & (CULPRIT_STINTS - 1);
    split->pid = pid;
#pragma unroll
    for (int k = 0; k < CULPRIT_STINTS; k++) {
        split->cgroup_id[k] = 0;
        split->wait_ns[k] = 0;
    }
#pragma unroll
    for (int k = 0; k < CULPRIT_STINTS; k++) {
        u32 slot = (newest - k) & (CULPRIT_STINTS - 1);
        u64 start = ring->start_ns[slot];
        u64 end = ring->end_ns[slot];
        if (!start || end <= enqueued)
            break; /* this stint and older ones ended before the wait began */
        u64 from = start > enqueued ? start : enqueued;
        u64 to = end < now ? end : now;
        if (to <= from || ring->cgroup_id[slot] == 0)
            continue;
        u64 part = to - from < left ? to - from : left;
        split->cgroup_id[k] = ring->cgroup_id[slot];
        split->wait_ns[k] = part;
        left -= part;
    }
    /* What the ring does not cover: the task that ran last before the switch-in. */
    split->cgroup_id[0] = ring->cgroup_id[newest];
    split->wait_ns[0] += left;
}

static __always_inline int mark_enqueued(u32 pid, u64 now)
{
    if (pid == 0)
        return 0;
    struct task_state *task = tasks.lookup(&pid);
    if (task) {
        task->enqueued_ns = now;
        return 0;
    }
    struct task_state fresh = {.enqueued_ns = now};
    if (tasks.update(&pid, &fresh) != 0)
        count_lost_entry(current_generation(), LOST_TASK_ENTRY);
    return 0;
}

TRACEPOINT_PROBE(sched, sched_wakeup)
{
    mark_enqueued(args->pid, bpf_ktime_get_ns());
    return KEEP_PERF_SAMPLES;
}

TRACEPOINT_PROBE(sched, sched_wakeup_new)
{
    mark_enqueued(args->pid, bpf_ktime_get_ns());
    return KEEP_PERF_SAMPLES;
}

/* `prev` is current: charge its cgroup with its on-CPU time and its stashed delay. */
static __always_inline void switch_out(u32 pid, long prev_state, u64 now, u64 oncpu_since)
{
    struct task_state *task = tasks.lookup(&pid);
    struct cgroup_key key = current_cgroup_key();
    struct runq_stats zero = {};
    struct runq_stats *cg = stats.lookup_or_try_init(&key, &zero);

    if (!cg)
        count_lost_entry(key.generation, LOST_CGROUP_ENTRY);
    else {
        if (oncpu_since && now > oncpu_since)
            cg->oncpu_ns += now - oncpu_since;
        if (task && task->has_pending && task->pending_from_idle) {
            cg->idle_wakeup_count += 1;
            cg->idle_wakeup_ns += task->pending_delay_ns;
        } else if (task && task->has_pending) {
            u64 delay = task->pending_delay_ns;
            cg->runq_count += 1;
            cg->runq_ns += delay;
            u32 slot = log2_slot(delay / 1000);
            if (slot < HIST_SLOTS)
                cg->runq_us_slots[slot] += 1;
            charge_split(&key, pid, delay);
        }
    }
    if ((prev_state & TASK_REPORT_STATE_MASK) == 0) {
        if (task) {
            task->enqueued_ns = now;
            task->has_pending = 0;
        } else {
            struct task_state fresh = {.enqueued_ns = now};
            if (tasks.update(&pid, &fresh) != 0)
                count_lost_entry(key.generation, LOST_TASK_ENTRY);
        }
    } else if (prev_state & TASK_REPORT_EXITING) {
        if (task)
            tasks.delete(&pid);
    } else if (task) {
        /* Sleeping: not queued until its next wake-up. */
        task->enqueued_ns = 0;
        task->has_pending = 0;
    }
}

static __always_inline void switch_in(u32 pid, u64 now, u64 from_idle)
{
    struct task_state *task = tasks.lookup(&pid);
    if (!task) {
        /* Every way into a run queue stores an entry, and the loader seeds one for every
         * thread present at attach, so this one was never stored or was evicted. */
        count_lost_entry(current_generation(), LOST_TASK_ENTRY);
        return;
    }
    if (task->enqueued_ns) {
        task->pending_delay_ns = now > task->enqueued_ns ? now - task->enqueued_ns : 0;
        task->has_pending = 1;
        task->pending_from_idle = from_idle;
        if (!from_idle)
            split_wait(pid, task->enqueued_ns, now);
        task->enqueued_ns = 0;
    }
}

TRACEPOINT_PROBE(sched, sched_switch)
{
    u64 now = bpf_ktime_get_ns();
    u32 zero = 0;
    u64 *since = oncpu_since_ns.lookup(&zero);
    u32 prev = args->prev_pid;
    u32 next = args->next_pid;

    /* pid 0 is the idle task of every CPU: never queued, its time is not a cgroup's. */
    if (prev != 0)
        switch_out(prev, args->prev_state, now, since ? *since : 0);
    push_stint(prev != 0 ? bpf_get_current_cgroup_id() : 0, since ? *since : 0, now);
    if (next != 0)
        switch_in(next, now, prev == 0);
    if (since)
        *since = now;
    return KEEP_PERF_SAMPLES;
}
