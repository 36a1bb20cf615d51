"""``interference-credentials``: issues each node agent its own Redis ACL user.

An agent POSTs its pod-bound ServiceAccount token to ``/v1/credentials``; the issuer asks
the API server to review it (TokenReview, audience ``interference-credentials``), takes the
node from the token's ``authentication.kubernetes.io/node-name`` claim, and creates or
resets the Redis user ``agent:NODE`` (:mod:`interference.acl`) with a fresh password on
every Redis node. The agent then writes to Redis directly, and Redis holds it to its own
node's keys (docs/design.md §4).
"""
