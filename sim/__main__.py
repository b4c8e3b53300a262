"""``python -m sim`` runs the ``hybridsim`` command line."""

from sim.cli import main

main()
