"""``python -m sim`` runs the ``hybridsim`` command line (the same entry as the console script)."""

from sim.entry import main

main()
