"""Parsing of PersistentVolumeClaim, PersistentVolume, StorageClass and CSINode API JSON,
and the volume annotations, labels and in-tree plugin names kube-scheduler reads."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from scheduler.api.objects import ClaimInfo, CSINodeInfo, StorageClassInfo, VolumeInfo
from scheduler.api.reader import Reader
from scheduler.api.selectors import parse_node_selector_term

ANNOTATION_BIND_COMPLETED = "pv.kubernetes.io/bind-completed"
"""Set on a claim by the PV controller once its binding is complete (kube-scheduler counts
a claim as bound only with it and ``spec.volumeName``)."""


ANNOTATION_BETA_STORAGE_CLASS = "volume.beta.kubernetes.io/storage-class"
"""The legacy storage class annotation, which wins over ``spec.storageClassName``."""


READ_WRITE_ONCE_POD = "ReadWriteOncePod"


WAIT_FOR_FIRST_CONSUMER = "WaitForFirstConsumer"


VOLUME_ZONE_LABELS = (
    "failure-domain.beta.kubernetes.io/zone",
    "failure-domain.beta.kubernetes.io/region",
    "topology.kubernetes.io/zone",
    "topology.kubernetes.io/region",
)
"""PV labels kube-scheduler's VolumeZone filter reads (a value may list zones joined by
``__``)."""


INLINE_DISK_VOLUMES = ("gcePersistentDisk", "awsElasticBlockStore", "rbd", "iscsi")
"""Inline volume types whose disk conflicts kube-scheduler's VolumeRestrictions checks
(not implemented: such pods are refused, as are other inline in-tree volumes that count
towards attach limits, :data:`MIGRATED_IN_TREE_SOURCES`)."""


MIGRATED_IN_TREE_SOURCES = {
    "awsElasticBlockStore": ("ebs.csi.aws.com", "volumeID"),
    "gcePersistentDisk": ("pd.csi.storage.gke.io", "pdName"),
    "azureDisk": ("disk.csi.azure.com", "diskURI"),
    "azureFile": ("file.csi.azure.com", "shareName"),
    "cinder": ("cinder.csi.openstack.org", "volumeID"),
    "vsphereVolume": ("csi.vsphere.vmware.com", "volumePath"),
    "portworxVolume": ("pxd.portworx.com", "volumeID"),
}
"""In-tree PV source → (the CSI driver kube translates it to, the field naming the volume)."""


MIGRATED_IN_TREE_PROVISIONERS = {
    "kubernetes.io/aws-ebs": "ebs.csi.aws.com",
    "kubernetes.io/gce-pd": "pd.csi.storage.gke.io",
    "kubernetes.io/azure-disk": "disk.csi.azure.com",
    "kubernetes.io/azure-file": "file.csi.azure.com",
    "kubernetes.io/cinder": "cinder.csi.openstack.org",
    "kubernetes.io/vsphere-volume": "csi.vsphere.vmware.com",
    "kubernetes.io/portworx-volume": "pxd.portworx.com",
}
"""In-tree provisioner → the CSI driver kube translates it to."""


def parse_claim(obj: Mapping[str, Any]) -> ClaimInfo:
    """A PersistentVolumeClaim from its API JSON; :class:`ObjectError` names the field."""
    reader = Reader(obj, "persistentvolumeclaim")
    metadata = reader.metadata
    spec = reader.mapping(obj, "spec")
    annotations = reader.string_map(metadata, "annotations", "metadata.annotations")
    modes = reader.sequence(spec, "spec.accessModes")
    if not all(isinstance(m, str) for m in modes):
        raise reader.error("spec.accessModes", "expected a list of strings")
    controller_uid = ""
    for i, owner in enumerate(reader.sequence(metadata, "metadata.ownerReferences")):
        owner = reader.as_mapping(owner, f"metadata.ownerReferences[{i}]")
        if owner.get("controller") is True:
            controller_uid = reader.string(owner, "uid", f"metadata.ownerReferences[{i}].uid")
    storage_class = annotations.get(ANNOTATION_BETA_STORAGE_CLASS)
    if storage_class is None:
        storage_class = reader.string(spec, "storageClassName", "spec.storageClassName")
    return ClaimInfo(
        namespace=reader.string(metadata, "namespace", "metadata.namespace") or "default",
        name=reader.name,
        volume_name=reader.string(spec, "volumeName", "spec.volumeName"),
        bind_completed=ANNOTATION_BIND_COMPLETED in annotations,
        storage_class=storage_class,
        access_modes=frozenset(modes),
        deleting=metadata.get("deletionTimestamp") is not None,
        lost=reader.mapping(obj, "status").get("phase") == "Lost",
        controller_uid=controller_uid,
    )


def parse_volume(obj: Mapping[str, Any]) -> VolumeInfo:
    """A PersistentVolume from its API JSON; :class:`ObjectError` names the field."""
    reader = Reader(obj, "persistentvolume")
    spec = reader.mapping(obj, "spec")
    required = reader.mapping(
        reader.mapping(spec, "spec.nodeAffinity"), "spec.nodeAffinity.required"
    )
    node_affinity = None
    if required:
        path = "spec.nodeAffinity.required.nodeSelectorTerms"
        node_affinity = tuple(
            parse_node_selector_term(reader, term, f"{path}[{i}]")
            for i, term in enumerate(reader.sequence(required, path))
        )
    labels = reader.string_map(reader.metadata, "labels", "metadata.labels")
    zones = []
    for key in VOLUME_ZONE_LABELS:
        values = [v.strip() for v in labels.get(key, "").split("__")]
        if all(values):  # kube-scheduler ignores a label with an empty zone (or no value)
            zones.append((key, frozenset(values)))
    local = spec.get("local") is not None or spec.get("hostPath") is not None
    return VolumeInfo(
        reader.name, node_affinity, tuple(zones), _attached_as(reader, spec), local=local
    )


def _attached_as(reader: Reader, spec: Mapping[str, Any]) -> tuple[str, str] | None:
    csi = reader.mapping(spec, "spec.csi")
    if csi:
        driver = reader.string(csi, "driver", "spec.csi.driver")
        return driver, reader.string(csi, "volumeHandle", "spec.csi.volumeHandle")
    for source, (driver, field) in MIGRATED_IN_TREE_SOURCES.items():
        found = reader.mapping(spec, f"spec.{source}")
        if found:
            return driver, reader.string(found, field, f"spec.{source}.{field}")
    return None


def parse_csi_node(obj: Mapping[str, Any]) -> CSINodeInfo:
    """A CSINode from its API JSON (per driver, the attach limit when it has one)."""
    reader = Reader(obj, "csinode")
    limits: dict[str, int] = {}
    path = "spec.drivers"
    for i, driver in enumerate(reader.sequence(reader.mapping(obj, "spec"), path)):
        driver = reader.as_mapping(driver, f"{path}[{i}]")
        allocatable = reader.mapping(driver, f"{path}[{i}].allocatable")
        count = allocatable.get("count")
        if count is None:
            continue
        if not isinstance(count, int) or isinstance(count, bool) or count < 0:
            raise reader.error(f"{path}[{i}].allocatable.count", f"{count!r} is not a count")
        limits[reader.string(driver, "name", f"{path}[{i}].name")] = count
    return CSINodeInfo(reader.name, limits)


def parse_storage_class(obj: Mapping[str, Any]) -> StorageClassInfo:
    """A StorageClass from its API JSON (name, binding mode, provisioner)."""
    reader = Reader(obj, "storageclass")
    mode = reader.string(obj, "volumeBindingMode", "volumeBindingMode") or "Immediate"
    provisioner = reader.string(obj, "provisioner", "provisioner")
    return StorageClassInfo(
        reader.name, mode, MIGRATED_IN_TREE_PROVISIONERS.get(provisioner, provisioner)
    )
