"""s2core's NumPy CPU backend (built in). See `s2core_numpy.backend`."""
