"""Standalone mode: the scheduling loop, the binder and the reload baseline."""
