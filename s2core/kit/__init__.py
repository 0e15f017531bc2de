"""The conformance kit: float64 references (the Slow-AR's and the codec's), the kit's models,
and the base test classes.

Import `BackendConformance` and `CodecConformance` only inside a pytest run (they import
pytest)."""

from s2core.kit.codec_reference import CodecReference
from s2core.kit.reference import Reference, ReferenceOutput
from s2core.kit.tolerances import fast_tolerance, kv_tolerance, output_tolerance


def __getattr__(name: str):
    if name == "BackendConformance":  # keep pytest out of `import s2core.kit`
        from s2core.kit.conformance import BackendConformance
        return BackendConformance
    if name == "CodecConformance":
        from s2core.kit.codec_conformance import CodecConformance
        return CodecConformance
    raise AttributeError(name)


__all__ = ["BackendConformance", "CodecConformance", "CodecReference", "Reference", "ReferenceOutput", "fast_tolerance",
           "kv_tolerance", "output_tolerance"]
