"""The PersistentVolumeClaims, PersistentVolumes, StorageClasses and CSINodes the volume
filters read (scheduler/plugins/volume_binding.py), and which claims placed pods use.

The cluster cache keeps it current from the informers; the node table owns one
(:attr:`scheduler.signals.table.NodeTable.volumes`) and counts each placed pod's claims in it, as
kube-scheduler's snapshot counts them for the ReadWriteOncePod check.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Hashable
from typing import TypeVar

from scheduler.api.objects import ClaimInfo, CSINodeInfo, PodInfo, StorageClassInfo, VolumeInfo

K = TypeVar("K")
H = TypeVar("H", bound=Hashable)
V = TypeVar("V")


class VolumeCatalog:
    """Claims by ``namespace/name``, volumes and storage classes by name, claim users."""

    def __init__(self) -> None:
        self._claims: dict[str, ClaimInfo] = {}
        self._volumes: dict[str, VolumeInfo] = {}
        self._classes: dict[str, StorageClassInfo] = {}
        self._csi_nodes: dict[str, CSINodeInfo] = {}
        self._users: Counter[str] = Counter()
        """Claim key → placed pods whose ``persistentVolumeClaim`` volumes use it."""
        self._node_claims: dict[str, Counter[str]] = {}
        """Node → claim keys of its placed pods (ephemeral volumes' too) → pods."""
        self._node_inline: dict[str, Counter[tuple[str, str]]] = {}
        """Node → (driver, volume) of its placed pods' inline in-tree volumes → pods."""
        self._attached: dict[str, dict[str, str]] = {}
        """:meth:`attached` per node, until a claim, volume or class changes (all) or a
        pod with claims comes or goes on the node (its entry)."""

    # ---- claims, volumes, classes (fed by the cluster cache) ---------------------------

    def upsert_claim(self, claim: ClaimInfo) -> bool:
        """Store a claim; True when it is new or changed."""
        return self._changed(_upsert(self._claims, claim.key, claim))

    def remove_claim(self, key: str) -> bool:
        """Forget a claim (``namespace/name``); True when it was known."""
        return self._changed(self._claims.pop(key, None) is not None)

    def claim_keys(self) -> list[str]:
        return list(self._claims)

    def claim(self, namespace: str, name: str) -> ClaimInfo | None:
        return self._claims.get(f"{namespace}/{name}")

    def upsert_volume(self, volume: VolumeInfo) -> bool:
        """Store a PersistentVolume; True when it is new or changed."""
        return self._changed(_upsert(self._volumes, volume.name, volume))

    def remove_volume(self, name: str) -> bool:
        return self._changed(self._volumes.pop(name, None) is not None)

    def volume_names(self) -> list[str]:
        return list(self._volumes)

    def volume(self, name: str) -> VolumeInfo | None:
        return self._volumes.get(name)

    def upsert_storage_class(self, storage_class: StorageClassInfo) -> bool:
        """Store a StorageClass; True when it is new or changed."""
        return self._changed(_upsert(self._classes, storage_class.name, storage_class))

    def remove_storage_class(self, name: str) -> bool:
        return self._changed(self._classes.pop(name, None) is not None)

    def storage_class_names(self) -> list[str]:
        return list(self._classes)

    def storage_class(self, name: str) -> StorageClassInfo | None:
        return self._classes.get(name)

    def upsert_csi_node(self, csi_node: CSINodeInfo) -> bool:
        """Store a CSINode; True when it is new or changed."""
        return _upsert(self._csi_nodes, csi_node.name, csi_node)

    def remove_csi_node(self, name: str) -> bool:
        return self._csi_nodes.pop(name, None) is not None

    def csi_node_names(self) -> list[str]:
        return list(self._csi_nodes)

    def csi_nodes(self) -> list[CSINodeInfo]:
        return list(self._csi_nodes.values())

    # ---- claim users (fed by the node table as pods are placed and removed) ------------

    def add(self, pod: PodInfo, node: str) -> None:
        """Count a pod placed on ``node`` (the table's placed-pod hook)."""
        if pod.claims or pod.inline_attached:
            self._count_users(pod, node, 1)

    def remove(self, pod: PodInfo, node: str) -> None:
        """Stop counting a pod placed on ``node``."""
        if pod.claims or pod.inline_attached:
            self._count_users(pod, node, -1)

    def _count_users(self, pod: PodInfo, node: str, sign: int) -> None:
        """Add (``sign`` 1) or remove (-1) a pod placed on ``node``. Its
        ``persistentVolumeClaim`` claims count as used (ephemeral volumes not, as
        kube-scheduler's snapshot leaves them out of the ReadWriteOncePod check); every
        claim counts towards the node's attached volumes."""
        self._attached.pop(node, None)
        on_node = self._node_claims.setdefault(node, Counter())
        for claim in pod.claims:
            key = f"{pod.namespace}/{claim.claim_name}"
            _add(on_node, key, sign)
            if not claim.ephemeral:
                _add(self._users, key, sign)
        if not on_node:
            del self._node_claims[node]
        inline = self._node_inline.setdefault(node, Counter())
        for attached in pod.inline_attached:
            _add(inline, attached, sign)
        if not inline:
            del self._node_inline[node]

    def attached(self, node: str) -> dict[str, str]:
        """Volumes the pods on ``node`` attach, as kube-scheduler's NodeVolumeLimits counts
        them: ``driver/handle`` → driver for each claim bound to a PV with a CSI driver
        (:attr:`VolumeInfo.attached_as`); a claim not bound yet counts under its
        StorageClass's provisioner as ``driver/namespace/name``. Claims that are gone or
        have neither are not counted. Inline in-tree volumes count as ``driver/volume``.
        Callers must not modify the result."""
        cached = self._attached.get(node)
        if cached is not None:
            return cached
        found = {f"{d}/{handle}": d for d, handle in self._node_inline.get(node, ())}
        for key in self._node_claims.get(node, ()):
            claim = self._claims.get(key)
            if claim is None:
                continue
            volume = self._volumes.get(claim.volume_name) if claim.volume_name else None
            if volume is not None and volume.attached_as is not None:
                driver, handle = volume.attached_as
                found[f"{driver}/{handle}"] = driver
            elif volume is None and claim.storage_class:
                storage_class = self._classes.get(claim.storage_class)
                if storage_class is not None and storage_class.provisioner:
                    found[f"{storage_class.provisioner}/{key}"] = storage_class.provisioner
        self._attached[node] = found
        return found

    def _changed(self, changed: bool) -> bool:
        if changed:
            self._attached.clear()
        return changed

    def in_use(self, namespace: str, name: str) -> bool:
        """True when a placed pod uses the claim."""
        return f"{namespace}/{name}" in self._users


def _add(counter: Counter[H], key: H, sign: int) -> None:
    counter[key] += sign
    if counter[key] <= 0:
        del counter[key]


def _upsert(store: dict[K, V], key: K, value: V) -> bool:
    if store.get(key) == value:
        return False
    store[key] = value
    return True
