"""The parent process of one run: run directory, control store, rank processes, relaunches, progress."""
