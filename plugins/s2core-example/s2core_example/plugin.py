"""The plugin module named by the entry point. Keep it cheap: it is imported at discovery."""

from s2core.plugin import Capabilities
from s2core.plugin import BackendSpec, Option, Probe, hookimpl

CAPABILITIES = Capabilities(device="cpu", kv_cache_dtype="f32", supported_kv_cache_dtypes=("f32",),
                            compute_dtype="f32", native_weight_types=frozenset({"f32"}),
                            widened_weight_dtype="f32", writes_kv_cache=True)


def probe() -> Probe:
    return Probe(available=True, reason="pure NumPy; an example, not tuned for speed",
                 capabilities=CAPABILITIES)


@hookimpl
def s2core_backends():
    # Priority 0: never chosen automatically over the built-in backends.
    # `options`: every keyword the backend class takes; the core refuses any other before
    # the backend is imported, and values outside `choices`.
    return [BackendSpec(name="example", backend_class="s2core_example.backend:ExampleBackend",
                        probe=probe, priority=0, description="minimal example plugin",
                        options=(Option("kv_cache_dtype", choices=("f32",), default="f32",
                                        doc="only a float32 cache"),))]
