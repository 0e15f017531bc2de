"""The conformance kit: float64 references (the Slow-AR's and the codec's), the kit's models,
and the base test classes; and what a plugin's own tests need besides (model writers, random
quantized blocks, prompts, the cache bytes the core counts for a backend, a `Registry` to
build with or without the built-in plugins).

Import `BackendConformance` and `CodecConformance` only inside a pytest run (they import
pytest)."""

from s2core.contract.registry import Registry
from s2core.embedded.writer import tiny_hparams, write_model
from s2core.kit.blocks import random_blocks, set_scale
from s2core.kit.codec_reference import CodecReference
from s2core.kit.models import kit_model, kit_reference
from s2core.kit.prompts import mixed_prompt, semantic_frame
from s2core.runtime.memory import backend_kv_cache_bytes
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


__all__ = ["BackendConformance", "CodecConformance", "CodecReference", "Reference",
           "ReferenceOutput", "fast_tolerance", "kv_tolerance", "output_tolerance",
           "kit_model", "kit_reference", "write_model", "tiny_hparams", "random_blocks",
           "set_scale", "mixed_prompt", "semantic_frame", "backend_kv_cache_bytes", "Registry"]
