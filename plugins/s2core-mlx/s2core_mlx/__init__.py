"""s2core-mlx: the MLX backend of s2core (Apple GPU through Metal; MLX's CPU build elsewhere).

Registered through the entry point group `s2core.backends` (see `s2core_mlx.plugin`); use it
with `s2core.load(path, backend="mlx")`. Importing this package does not import mlx.
"""

__version__ = "0.1.0"
