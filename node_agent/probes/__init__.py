"""Probes: one module per BPF program or kernel reader, all behind ``base.Probe``.

Importing this package registers every probe in ``base``'s registry.
"""
