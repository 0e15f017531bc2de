"""The conformance kit: a float64 reference, the kit's models, and the base test classes.

Import `BackendConformance` only inside a pytest run (it imports pytest)."""

from .reference import Reference, ReferenceOutput
from .tolerances import fast_tolerance, kv_tolerance, output_tolerance


def __getattr__(name: str):
    if name == "BackendConformance":  # keep pytest out of `import s2core.kit`
        from .conformance import BackendConformance
        return BackendConformance
    raise AttributeError(name)


__all__ = ["BackendConformance", "Reference", "ReferenceOutput", "fast_tolerance",
           "kv_tolerance", "output_tolerance"]
