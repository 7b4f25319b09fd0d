"""The rank side of the harness: what runs inside a rank's process (torch is imported here).

The launcher side (pipesim/harness/*.py) starts these modules by name and reads what they
write; it never imports them. Both sides share only config (what a run is), recorder (the
records' format) and lifetime.
"""
