"""``python -m pipesim``: the command line."""

from pipesim.cli import main

main()
