"""Agents' reports replayed at cluster scale from a few processes (bench/signal_plane.py,
bench/scheduler_real_api.py).

Encoding a production-shaped report (30 pods with histograms, node histograms, two
windows) costs ~1 ms of Python, so 5,000 real agents would need 5 cores this machine does
not have. Instead every node's report is built once (:func:`tests.shaped_reports.shaped_report`)
and queued by the agent's own publishing code (:meth:`RedisPublisher.queue_report`), and
the commands are packed into the bytes redis-py would send (RESP). Each second every
node's bytes are sent again, spread evenly over the second, with the scheduling record's
``ts`` patched in place to the moment of sending — the only field the scheduler's
freshness and age read. (The hashes' ``updated_at`` and the stream entry keep their
encode-time values; the scheduler never reads them.) Replies are read and dropped by a
second thread.

``mode``: ``full`` sends everything an agent writes (record, node hash, pod hashes, pod
set, GPU hash, report stream, with their TTLs); ``records`` only the scheduling record
(where Redis itself, on the same 2 CPUs, could not take the full write volume).
"""

from __future__ import annotations

import multiprocessing
import socket
import struct
import threading
import time
from typing import Any

import redis
from redis.connection import Connection

from interference import sched_record
from node_agent.publisher import PublisherSettings, RedisPublisher
from tests.shaped_reports import shaped_report

MODES = ("full", "records")
TS_OFFSET = sum(struct.calcsize("<" + code) for name, code in sched_record.HEADER[:5])
"""Byte offset of ``ts`` in a scheduling record (after version … node_id)."""
assert sched_record.HEADER[5][0] == "ts"


def encode_node(node: str, pods: int, mode: str) -> tuple[bytearray, int]:
    """The bytes one flush of ``node``'s agent sends, and the offset of its record's ts."""
    report = shaped_report(node, time.time(), pods=pods)
    publisher = RedisPublisher(PublisherSettings(redis_url="redis://127.0.0.1:1/0"))
    pipe = redis.Redis().pipeline(transaction=False)  # queues only; never connects
    publisher.queue_report(pipe, report)
    commands = [args for args, _options in pipe.command_stack]
    if mode == "records":
        commands = commands[:1]
    packed = bytearray(b"".join(Connection().pack_commands(commands)))
    record = sched_record.encode(report)
    at = packed.find(record)
    if at < 0 or packed.find(record, at + 1) >= 0:
        raise RuntimeError(f"the record of {node} is not once in its flush")
    return packed, at + TS_OFFSET


def replay(
    port: int,
    nodes: list[str],
    pods: int,
    mode: str,
    ready: Any,
    stop: Any,
    sent_counter: Any,
) -> None:
    """Send every node's flush once per second until ``stop`` (a multiprocessing Event);
    sets ``ready`` once encoding is done and sending began; ``sent_counter`` (a
    multiprocessing Value) counts the flushes sent."""
    flushes = [encode_node(node, pods, mode) for node in nodes]
    sock = socket.create_connection(("127.0.0.1", port))
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def drain() -> None:
        try:
            while sock.recv(1 << 20):
                pass
        except OSError:
            pass  # closed at the end

    threading.Thread(target=drain, daemon=True).start()
    count, start, sent = len(flushes), time.time(), 0
    ready.set()
    while not stop.is_set():
        now = time.time()
        due = int((now - start) * count)  # node i is due at start + k + i / count
        chunk = []
        while sent < due:
            buffer, offset = flushes[sent % count]
            struct.pack_into("<d", buffer, offset, now)
            chunk.append(bytes(buffer))
            sent += 1
        if chunk:
            sock.sendall(b"".join(chunk))
            with sent_counter.get_lock():
                sent_counter.value += len(chunk)
        time.sleep(0.01)
    sock.close()


def start_replay(
    port: int, nodes: list[str], pods: int, mode: str, processes: int, stop: Any
) -> tuple[list[multiprocessing.Process], Any]:
    """``processes`` processes replaying ``nodes`` (each a share) until ``stop`` is set;
    returns once all of them encoded their flushes and send, with the shared counter of
    flushes sent."""
    sent = multiprocessing.Value("q", 0)
    started = []
    for p in range(processes):
        ready = multiprocessing.Event()
        proc = multiprocessing.Process(
            target=replay,
            args=(port, nodes[p::processes], pods, mode, ready, stop, sent),
            daemon=True,
        )
        proc.start()
        started.append((proc, ready))
    for proc, ready in started:
        while not ready.wait(1):
            if not proc.is_alive():
                raise RuntimeError("a replaying process died while encoding")
    return [proc for proc, _ in started], sent
