"""I/O adapters behind the Protocols of ``scheduler.cycle.ports``."""
