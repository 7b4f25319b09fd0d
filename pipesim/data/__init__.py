"""Data shipped with pipesim: device files (``devices/``) and cluster files (``clusters/``)."""
