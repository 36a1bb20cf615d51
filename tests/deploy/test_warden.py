"""The warden cuts off a node that keeps more in Redis than an agent may (issue 28, item 1):
the deployed Redis (shipped redis.conf with its key events, entrypoint, ACL users) under
the Redis Deployment's 512 MiB memory limit, the warden logged in as the issuer's Redis
user, an attacker logged in as node ``bad``'s own user, while node ``good``'s real agent
publisher keeps publishing with an agent's TTL."""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
import redis
from prometheus_client import CollectorRegistry
from redis.backoff import NoBackoff
from redis.retry import Retry

from credential_issuer.settings import redis_target
from credential_issuer.warden import REASONS, Warden, WardenLimits, WardenMetrics
from interference import keys
from interference.signals import PodMetrics
from node_agent.publisher import PublisherSettings, RedisPublisher
from tests.deploy.conftest import DeployedRedis
from tests.deploy.test_redis_acl import ISSUER, enrol, report
from tests.deploy.test_redis_limits import LIMIT_BYTES, MIB, limited_redis, peak_rss

pytestmark = pytest.mark.redis
__all__ = ["limited_redis"]  # the fixture, imported to be used here

COOLDOWN_S = 60.0


class HonestNode:
    """Node ``good``'s real agent publisher (110 pods, TTL 5 s) publishing every 0.2 s."""

    def __init__(self, server: DeployedRedis) -> None:
        username, password = enrol(server, "good")
        self.publisher = RedisPublisher(
            PublisherSettings(server.url, username=username, password=password, ttl_s=5)
        )
        self.published = self.failed = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        rows = [PodMetrics("shop", f"api-{i}", uid=f"u{i}") for i in range(110)]
        while not self._stop.is_set():
            if self.publisher.publish(report("good", time.time(), rows)):
                self.published += 1
            else:
                self.failed += 1
            self._stop.wait(0.2)

    def __enter__(self) -> HonestNode:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(30)
        self.publisher.close()


@contextmanager
def running_warden(server: DeployedRedis, sweep_s: float = 10.0) -> Iterator[Warden]:
    username, password = server.credentials(*ISSUER)
    target = redis_target(server.url, username=username, password=password)
    warden = Warden(
        target,
        WardenLimits(),
        WardenMetrics(CollectorRegistry()),
        sweep_s=sweep_s,
        cooldown_s=COOLDOWN_S,
    )
    warden.start()
    try:
        yield warden
    finally:
        warden.close()


def attack_until_cut_off(attack: Callable[[redis.Redis[bytes]], None], password: str,
                         server: DeployedRedis, within_s: float) -> tuple[float, int]:  # fmt: skip
    """Run ``attack`` as ``agent:bad`` until Redis refuses it; (seconds, attacks that ran)."""
    # no retries: the attacker's own reconnects are not the warden's reaction time
    bad = redis.Redis(
        port=server.port, username="agent:bad", password=password, retry=Retry(NoBackoff(), 0)
    )
    started = time.monotonic()
    ran = 0
    try:
        while time.monotonic() - started < within_s:
            attack(bad)
            ran += 1
    except redis.RedisError:
        return time.monotonic() - started, ran
    finally:
        bad.close()
    raise AssertionError(f"agent:bad still writing after {within_s} s ({ran} attacks)")


def cutoffs(warden: Warden) -> dict[str, float]:
    """The cut-off counter by reason, once the cut-off under way (if any) has finished."""
    deadline = time.monotonic() + 5
    while warden.cutting_off and time.monotonic() < deadline:
        time.sleep(0.05)
    return {r: warden.metrics.cutoffs.labels(reason=r)._value.get() for r in REASONS}


def assert_cut_off_and_good_intact(
    server: DeployedRedis, warden: Warden, honest: HonestNode, reason: str, password: str
) -> None:
    counted = cutoffs(warden)
    assert counted[reason] == 1 and sum(counted.values()) == 1, counted
    admin = server.admin()
    bad_user = admin.acl_getuser("agent:bad")
    assert bad_user is not None and "off" in bad_user["flags"]
    with pytest.raises(redis.AuthenticationError):
        redis.Redis(port=server.port, username="agent:bad", password=password).ping()
    assert list(admin.scan_iter(match="intf:node:bad*")) == []
    assert 0 < warden.cooldown_left("bad") <= COOLDOWN_S
    assert warden.cooldown_left("good") == 0
    good_user = admin.acl_getuser("agent:good")
    assert good_user is not None and "on" in good_user["flags"]
    before = honest.published
    deadline = time.monotonic() + 10
    while honest.published < before + 3:
        assert time.monotonic() < deadline, "the honest node stopped publishing"
        time.sleep(0.05)
    assert 0 < admin.ttl(keys.sched_key("good")) <= 5
    assert honest.failed == 0
    assert server.proc is not None and server.proc.poll() is None
    assert peak_rss(server.proc.pid) < LIMIT_BYTES


def test_a_node_filling_its_stream_with_huge_entries_is_cut_off(
    limited_redis: DeployedRedis,
) -> None:
    """The issue's stream of ~300 MiB: entries of 16 fields of 1 MiB (what one command may
    carry), as fast as Redis takes them."""
    _, password = enrol(limited_redis, "bad")
    fields = {f"f{i}": os.urandom(MIB) for i in range(16)}
    with running_warden(limited_redis) as warden, HonestNode(limited_redis) as honest:
        took, ran = attack_until_cut_off(
            lambda bad: bad.xadd(keys.reports_key("bad"), fields),  # type: ignore[arg-type]
            password,
            limited_redis,
            within_s=20,
        )
        # Each 16 MiB entry takes Redis a while to read: bounded by entries, not seconds.
        assert ran <= 4, (took, ran)
        counted = cutoffs(warden)
        reason = max(counted, key=lambda r: counted[r])
        assert reason in ("stream_too_large", "entry_too_large"), counted
        assert_cut_off_and_good_intact(limited_redis, warden, honest, reason, password)


def test_a_node_setting_its_record_without_expiry_is_cut_off(
    limited_redis: DeployedRedis,
) -> None:
    _, password = enrol(limited_redis, "bad")
    with running_warden(limited_redis) as warden, HonestNode(limited_redis) as honest:
        took, _ = attack_until_cut_off(
            lambda bad: bad.set(keys.sched_key("bad"), b"x" * 100) and time.sleep(0.05),
            password,
            limited_redis,
            within_s=10,
        )
        assert took < 3, took  # the grace (1 s) and a check
        assert_cut_off_and_good_intact(limited_redis, warden, honest, "no_expiry", password)


def test_a_node_setting_a_huge_record_is_cut_off(limited_redis: DeployedRedis) -> None:
    """The issue's 190 MiB record, at the 1 MiB one argument may carry, with a TTL."""
    _, password = enrol(limited_redis, "bad")
    value = os.urandom(MIB - 64)
    with running_warden(limited_redis) as warden, HonestNode(limited_redis) as honest:
        took, _ = attack_until_cut_off(
            lambda bad: bad.set(keys.sched_key("bad"), value, ex=5),
            password,
            limited_redis,
            within_s=10,
        )
        assert took < 2, took
        assert_cut_off_and_good_intact(limited_redis, warden, honest, "value_too_large", password)


@pytest.mark.parametrize("event", ["xadd", "set"])
def test_a_node_reporting_faster_than_any_agent_is_cut_off(
    limited_redis: DeployedRedis, event: str
) -> None:
    """Small entries, or a small record, each within every size and TTL bound, written as
    fast as Redis takes them: the rate is the bound (10 a second over 5 s)."""
    _, password = enrol(limited_redis, "bad")
    writes: dict[str, Callable[[redis.Redis[bytes]], object]] = {
        "xadd": lambda bad: (
            bad.xadd(keys.reports_key("bad"), {"r": b"x" * 100}, maxlen=10, approximate=False)
            and bad.expire(keys.reports_key("bad"), 5)
        ),
        "set": lambda bad: bad.set(keys.sched_key("bad"), b"x" * 100, ex=5),
    }
    with running_warden(limited_redis) as warden, HonestNode(limited_redis) as honest:
        took, ran = attack_until_cut_off(writes[event], password, limited_redis, within_s=10)
        assert ran > WardenLimits().max_writes_per_window, (took, ran)
        assert took < 3, (took, ran)
        assert_cut_off_and_good_intact(limited_redis, warden, honest, "writing_too_fast", password)


@pytest.mark.parametrize(
    ("reason", "write"),
    [
        ("ttl_too_long", lambda bad: bad.expire(keys.node_key("bad"), 10**6)),
        (
            "value_too_large",
            lambda bad: (
                bad.hset(
                    keys.pod_key("bad", "ns", "p"),
                    mapping={f"f{i}": os.urandom(4096) for i in range(64)},
                )
                and bad.expire(keys.pod_key("bad", "ns", "p"), 5)
            ),
        ),
    ],
)
def test_what_no_event_shows_is_found_by_the_sweep(
    limited_redis: DeployedRedis,
    reason: str,
    write: Callable[[redis.Redis[bytes]], object],
) -> None:
    """Hash writes and TTLs lengthened by EXPIRE send no event the warden follows."""
    _, password = enrol(limited_redis, "bad")
    with running_warden(limited_redis, sweep_s=2.0) as warden, HonestNode(limited_redis) as honest:
        bad = redis.Redis(port=limited_redis.port, username="agent:bad", password=password)
        bad.hset(keys.node_key("bad"), "index", "5")
        bad.expire(keys.node_key("bad"), 5)
        write(bad)
        bad.close()
        deadline = time.monotonic() + 10
        while cutoffs(warden)[reason] == 0:
            assert time.monotonic() < deadline, "not cut off"
            time.sleep(0.1)
        assert_cut_off_and_good_intact(limited_redis, warden, honest, reason, password)


def test_an_honest_node_is_never_cut_off(limited_redis: DeployedRedis, tmp_path: Path) -> None:
    """Several sweeps and every event of an honest node of 110 pods: no cut-off."""
    with running_warden(limited_redis, sweep_s=0.5) as warden, HonestNode(limited_redis) as honest:
        deadline = time.monotonic() + 4
        while time.monotonic() < deadline:
            time.sleep(0.2)
        assert warden.sweeps >= 4
        assert honest.published >= 10 and honest.failed == 0
    assert sum(cutoffs(warden).values()) == 0
    user = limited_redis.admin().acl_getuser("agent:good")
    assert user is not None and "on" in user["flags"]
