"""The Redis ACL user of one node's agent: its name and its rules (docs/design.md §4).

An agent logs in as ``agent:NODE`` (:func:`agent_username`), a user the credential issuer
(``interference-credentials``) creates after a TokenReview of the agent's pod-bound
ServiceAccount token, naming the node from the token's
``authentication.kubernetes.io/node-name`` claim. Its rules (:func:`agent_acl_rules`) allow
exactly the commands the publisher sends (:data:`AGENT_COMMANDS`) on exactly the keys of
that node (:func:`interference.keys.node_key_patterns`), so Redis itself refuses, with
``NOPERM``, and records in its ``ACL LOG`` any write to another node's keys.

Stdlib only: the agent, the issuer and the tests share it.
"""

from __future__ import annotations

from interference import keys

AGENT_COMMANDS = ("set", "hset", "expire", "sadd", "srem", "xadd", "del")
"""Every Redis command the agent's publisher sends, all on its own node's keys."""

CLUSTER_CLIENT_COMMANDS = ("cluster|slots", "command")
"""What a Redis Cluster client sends before any write: redis-py reads the slot map
(``CLUSTER SLOTS``) and the command table (``COMMAND``) when it builds its client. Granted
only on a Cluster; neither reads or changes data."""

USERNAME_PREFIX = "agent:"


def agent_username(node: str) -> str:
    """The ACL user of ``node``'s agent (``agent:NODE``); ``ValueError`` for a name that is
    not a Kubernetes node name."""
    if not keys.valid_node_name(node):
        raise ValueError(f"not a Kubernetes node name: {node[:80]!r}")
    return USERNAME_PREFIX + node


def agent_acl_rules(node: str, password: str, *, cluster: bool = False) -> list[str]:
    """The ``ACL SETUSER agent:NODE`` arguments giving ``node``'s agent the password
    ``password`` (its only one: ``reset`` drops earlier ones) and exactly
    :data:`AGENT_COMMANDS` on exactly ``node``'s keys, no channels; on a Cluster also
    :data:`CLUSTER_CLIENT_COMMANDS`.

    ``ValueError`` for a node name that is not one (a ``*`` or ``?`` would widen the key
    pattern to other nodes' keys) or a password that is empty or holds whitespace or
    control characters (it would end the rule or fail to log in)."""
    patterns = keys.node_key_patterns(node)
    if not password or any(ch.isspace() or not ch.isprintable() for ch in password):
        raise ValueError("an agent password must be non-empty printable text without spaces")
    commands = AGENT_COMMANDS + (CLUSTER_CLIENT_COMMANDS if cluster else ())
    return [
        "reset",
        "on",
        f">{password}",
        "resetchannels",
        *(f"~{pattern}" for pattern in patterns),
        "-@all",
        *(f"+{command}" for command in commands),
    ]
