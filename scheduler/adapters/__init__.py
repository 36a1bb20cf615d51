"""I/O adapters behind the Protocols of ``scheduler.ports``."""
