"""Writers of results: Chrome/Perfetto traces and report folders."""
