"""The programs' wiring: the two entry points, the configuration and its reload."""
