"""The PersistentVolumeClaims, PersistentVolumes and StorageClasses the volume filters read
(scheduler/plugins/volume_binding.py), and which claims placed pods use.

The cluster cache keeps it current from the informers; the node table owns one
(:attr:`scheduler.table.NodeTable.volumes`) and counts each placed pod's claims in it, as
kube-scheduler's snapshot counts them for the ReadWriteOncePod check.
"""

from __future__ import annotations

from collections import Counter
from typing import TypeVar

from scheduler.model import ClaimInfo, PodInfo, StorageClassInfo, VolumeInfo

K = TypeVar("K")
V = TypeVar("V")


class VolumeCatalog:
    """Claims by ``namespace/name``, volumes and storage classes by name, claim users."""

    def __init__(self) -> None:
        self._claims: dict[str, ClaimInfo] = {}
        self._volumes: dict[str, VolumeInfo] = {}
        self._classes: dict[str, StorageClassInfo] = {}
        self._users: Counter[str] = Counter()
        """Claim key → placed pods whose ``persistentVolumeClaim`` volumes use it."""

    # ---- claims, volumes, classes (fed by the cluster cache) ---------------------------

    def upsert_claim(self, claim: ClaimInfo) -> bool:
        """Store a claim; True when it is new or changed."""
        return _upsert(self._claims, claim.key, claim)

    def remove_claim(self, key: str) -> bool:
        """Forget a claim (``namespace/name``); True when it was known."""
        return self._claims.pop(key, None) is not None

    def claim_keys(self) -> list[str]:
        return list(self._claims)

    def claim(self, namespace: str, name: str) -> ClaimInfo | None:
        return self._claims.get(f"{namespace}/{name}")

    def upsert_volume(self, volume: VolumeInfo) -> bool:
        """Store a PersistentVolume; True when it is new or changed."""
        return _upsert(self._volumes, volume.name, volume)

    def remove_volume(self, name: str) -> bool:
        return self._volumes.pop(name, None) is not None

    def volume_names(self) -> list[str]:
        return list(self._volumes)

    def volume(self, name: str) -> VolumeInfo | None:
        return self._volumes.get(name)

    def upsert_storage_class(self, storage_class: StorageClassInfo) -> bool:
        """Store a StorageClass; True when it is new or changed."""
        return _upsert(self._classes, storage_class.name, storage_class)

    def remove_storage_class(self, name: str) -> bool:
        return self._classes.pop(name, None) is not None

    def storage_class_names(self) -> list[str]:
        return list(self._classes)

    def storage_class(self, name: str) -> StorageClassInfo | None:
        return self._classes.get(name)

    # ---- claim users (fed by the node table as pods are placed and removed) ------------

    def count_users(self, pod: PodInfo, sign: int) -> None:
        """Add (``sign`` 1) or remove (-1) a placed pod's ``persistentVolumeClaim`` claims
        (ephemeral volumes are not counted, as kube-scheduler's snapshot leaves them out)."""
        for claim in pod.claims:
            if claim.ephemeral:
                continue
            key = f"{pod.namespace}/{claim.claim_name}"
            self._users[key] += sign
            if self._users[key] <= 0:
                del self._users[key]

    def in_use(self, namespace: str, name: str) -> bool:
        """True when a placed pod uses the claim."""
        return f"{namespace}/{name}" in self._users


def _upsert(store: dict[K, V], key: K, value: V) -> bool:
    if store.get(key) == value:
        return False
    store[key] = value
    return True
