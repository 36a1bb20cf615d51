"""Infrastructure the node agent and the scheduler both need, written once:

* :mod:`interference_infra.http` — the ``/healthz``, ``/readyz`` and ``/metrics`` endpoint
  (a stdlib ``ThreadingHTTPServer``), each program supplying its own checks;
* :mod:`interference_infra.redis_client` — the Redis connection: a single server
  (``redis://``, ``rediss://``, ``unix://``), a master found through Redis Sentinel, or a
  Redis Cluster, with TLS and the ``REDIS_USERNAME``/``REDIS_PASSWORD`` credentials;
* :mod:`interference_infra.strict` — strict parsing of settings from the environment and
  the command line, and :class:`~interference_infra.strict.SettingsError`;
* :mod:`interference_infra.logsetup` — the programs' logging (text or JSON, credentials
  masked);
* :mod:`interference_infra.cliparse` — the one-line ``argparse`` errors and exit statuses;
* :mod:`interference_infra.version` — every program's ``--version``.

It may import :mod:`interference` (the shared contract), never ``node_agent``,
``scheduler`` or ``interference_cli`` (docs/design.md §2).
"""
