"""The package's version, in one place: pyproject.toml reads it from here, the package and the
KV prefix files (which record the version that wrote them) import it."""

__version__ = "0.1.0"
