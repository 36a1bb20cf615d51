"""The leader's verdict about a reloaded configuration file, as every replica reads it
(:mod:`scheduler.entry.config_reload`, "One verdict for every replica"): published as the
annotation :data:`LEASE_VERDICT_ANNOTATION` on the leader election Lease, JSON."""

from __future__ import annotations

import dataclasses
import hashlib
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from enum import Enum

LEASE_VERDICT_ANNOTATION = "interference.io/reload-verdict"
"""The leader's latest reload verdict, on its leader election Lease (JSON:
:class:`PublishedVerdict`)."""
VERDICT_TEXT_MAX = 64 * 1024
"""Longest last good file carried in the verdict (a Lease's annotations hold 256 KiB)."""


def live_digest(config: object, sections: Sequence[str]) -> str:
    """SHA-256 of ``config``'s live ``sections`` in a canonical form: what a verdict is
    about. Replicas serving the same live configuration agree on it even when their files
    differ in sections that apply only at a restart (each replica's ``http.port``)."""
    canonical = json.dumps(
        {name: _canonical(getattr(config, name)) for name in sections},
        sort_keys=True,
        default=repr,
    )
    return hashlib.sha256(canonical.encode()).hexdigest()


def _canonical(value: object) -> object:
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        fields = {f.name: _canonical(getattr(value, f.name)) for f in dataclasses.fields(value)}
        return {"type": type(value).__name__, **fields}
    if isinstance(value, Enum):
        return value.value
    if isinstance(value, (set, frozenset)):
        return sorted((_canonical(v) for v in value), key=repr)
    if isinstance(value, (list, tuple)):
        return [_canonical(v) for v in value]
    if isinstance(value, Mapping):
        return {str(k): _canonical(v) for k, v in value.items()}
    return value


@dataclass(frozen=True, slots=True)
class PublishedVerdict:
    """What the leader decided about the live configuration with digest ``config``
    (:func:`live_digest`)."""

    config: str
    verdict: str
    """``confirmed`` or ``rolled_back``."""
    good_config: str = ""
    """The digest of the last good configuration, serving after the verdict."""
    good_text: str = ""
    """Its file's text (empty when longer than :data:`VERDICT_TEXT_MAX`)."""
    file_sha256: str = ""
    """The SHA-256 of the file judged (for a person reading the Lease)."""

    def encode(self) -> str:
        text = self.good_text if len(self.good_text) <= VERDICT_TEXT_MAX else ""
        return json.dumps(
            {
                "config": self.config,
                "verdict": self.verdict,
                "good_config": self.good_config,
                "good_text": text,
                "file_sha256": self.file_sha256,
            }
        )

    @staticmethod
    def decode(value: str | None) -> PublishedVerdict | None:
        """The verdict an annotation holds; ``None`` for none or one that does not parse."""
        if not value:
            return None
        try:
            found = json.loads(value)
            verdict = PublishedVerdict(
                str(found["config"]),
                str(found["verdict"]),
                str(found.get("good_config", "")),
                str(found.get("good_text", "")),
                str(found.get("file_sha256", "")),
            )
        except (ValueError, TypeError, KeyError, AttributeError):
            return None
        return verdict if verdict.verdict in ("confirmed", "rolled_back") else None
