"""What the BPF probes (``runqlat``, ``reclaim``) share: the programs' sources, the checks
before loading, the compiler process, the loaded program's maps and the drain.

Every BPF program in ``bpf/`` follows the contract of ``bpf/intf.h``: one per-CPU hash
named ``stats`` keyed by ``(cgroup_id, generation)`` whose value is a struct of ``u64``
counters and ``u64 NAME_slots[HIST_SLOTS]`` log2 histograms, and a one-slot array
``drain_generation``. :class:`~node_agent.probes.bpf.cgroup_probe.BpfCgroupProbe` bumps
the generation, waits a grace period for programs already running, then reads and
deletes the old generation: events counted during the drain land in the new generation,
so nothing is lost and the map starts every interval empty. Entries a program could not
keep (a map full, an LRU eviction) are counted in the per-CPU array ``lost_entries``
under the generation's parity and drained the same way: read, then zeroed, after the
grace period.

BCC (with LLVM and clang, well over 100 MB resident) runs only in a short-lived compiler
process per program (``compiler``); it hands the map and tracepoint-attachment file
descriptors to the agent over a Unix socket (``loader``), and the agent drains the maps
with plain ``bpf(2)`` calls (``loaded_program``). So the agent never imports ``bcc``,
imports fine on machines without it, and stays small. Every step that can fail raises
:class:`~node_agent.probes.base.ProbeUnavailable` with what to mount, install or grant.
"""
