"""The contract's rules that numbers against a reference do not catch, as kit tests.

A backend can match the float64 reference call by call and still break the contract: return
a buffer that its next call overwrites, hand out views of its live cache, declare an f16
cache while holding float32 (or the reverse), declare a compute precision it does not have,
take options it does not declare, run the Fast-AR with the Slow-AR's RoPE base and eps
(the other kit models have equal values), share state between two models so that two threads
corrupt each other, keep the file mapped after close(), or lose its cache when a new one cannot
be allocated. Each test here checks one rule and fails with a
message that starts with the rule's name (RULES), so a third-party author knows which.

`BackendConformance` inherits these; they need its `backend` and `open_model` fixtures.
"""

from __future__ import annotations

import inspect
import shutil
import threading
import time
from pathlib import Path
from typing import Any, Callable

import numpy as np
import pytest

import s2core
from s2core.errors import (BackendUnavailableError, CacheAllocationError, InvalidInputError,
                           ModelBusyError, ModelClosedError)
from s2core.generation.loop import GenerationConfig, stream
from s2core.kit.prompts import mixed_prompt, semantic_frame

from s2core.kit.models import CONFIGS, kit_model, kit_reference
from s2core.kit.tolerances import COMPUTE, fast_tolerance, output_tolerance

RESULTS_UNCHANGED = "results-unchanged"
SNAPSHOTS_ARE_COPIES = "snapshots-are-copies"
CACHE_DTYPE_HOLDS = "declared-kv-cache-dtype-holds"
COMPUTE_DTYPE_HOLDS = "declared-compute-dtype-holds"
OPTIONS_DECLARED = "options-declared-and-checked"
FAST_AR_OWN_HPARAMS = "fast-ar-uses-its-own-hparams"
CONCURRENCY = "threads-never-interleave"
LIFE_CYCLE = "close-releases-and-failed-init-keeps-the-cache"
CACHE_BYTES_HOLD = "declared-kv-cache-bytes-hold"
WEIGHT_BYTES_HOLD = "declared-weight-holding-holds"
BACKEND_ERRORS = "backend-failures-reach-users-as-s2core-errors"
LOGIT_ROWS = "logit-rows-are-rows-of-the-full-logits"

#: rule name -> what it says (the README's list)
RULES = {
    RESULTS_UNCHANGED: "hidden, logits and Fast-AR logits (native and numpy) stay unchanged "
                       "after later calls",
    SNAPSHOTS_ARE_COPIES: "kv_cache_snapshot() returns copies: later calls do not change one, "
                          "and changing one changes neither the cache nor a later snapshot",
    CACHE_DTYPE_HOLDS: "the cache holds values of the declared kv_cache_dtype: an f16 (bf16) "
                       "cache's values are f16 (bf16) numbers, an f32 cache keeps what f16 "
                       "would round",
    COMPUTE_DTYPE_HOLDS: "the measured error fits the declared compute_dtype: within its bound, "
                         "and beyond f32's when a half type is declared",
    OPTIONS_DECLARED: "load() options are the declared ones (exactly the class's keywords, "
                      "same defaults); unknown names and undeclared values are refused; each declared "
                      "choice loads, and kv_cache_dtype=X gives a backend declaring X",
    FAST_AR_OWN_HPARAMS: "the Fast-AR runs with its own RoPE base, eps and head counts",
    CONCURRENCY: "two threads on one model take turns (a stream's model refuses other threads "
                 "with ModelBusyError), and two models in two threads give what they give "
                 "alone: nothing is shared between instances",
    LIFE_CYCLE: "close() releases the weights and the file's mapping and every later call "
                "raises ModelClosedError; an init_kv_cache that cannot be allocated raises "
                "CacheAllocationError and keeps the previous cache and n_past",
    CACHE_BYTES_HOLD: "the cache takes the bytes per position its held type "
                      "(kv_cache_storage_dtype, else kv_cache_dtype) says, for every offered "
                      "cache type: the core's memory limit and `s2core info` count by it",
    WEIGHT_BYTES_HOLD: "the bytes a load copies are at most what native_weight_types, "
                       "native_weight_overhead, widened_weight_dtype and mapped_weight_types "
                       "say: a type declared mapped is used from the file's pages, not copied",
    BACKEND_ERRORS: "whatever a backend raises in any call the core makes "
                      "reaches the user as an S2CoreError (BackendError naming the backend and "
                      "the call, CacheAllocationError for an allocation, "
                      "BackendOutOfMemoryError for a MemoryError), and the model is as before "
                      "the call: the next call gives what a model that never saw it gives",
    LOGIT_ROWS: "a call with logit_rows returns the full logits at those ids, bit for bit, "
                "from eval_cached and from each slot of eval_slots, and changes nothing else "
                "(hidden and K/V as without); a backend declaring Capabilities.logit_rows "
                "returns only those rows; ids outside the vocabulary are refused and change "
                "nothing",
}


def fail(rule: str, message: str, rules: dict[str, str] = RULES) -> None:
    """Fail the running kit test, naming the rule broken (from `rules`) and what was seen."""
    pytest.fail(rule_message(rule, message, rules), pytrace=False)


def rule_message(rule: str, message: str, rules: dict[str, str] = RULES) -> str:
    """How a kit failure starts: the rule's name and what it asks, then what was seen."""
    return f"rule '{rule}' ({rules[rule]}): {message}"


class _NotAValue:
    """An object no honest option schema accepts."""

    def __repr__(self) -> str:
        return "<s2core kit: not a value>"


def _host_copy(backend: Any, native: Any) -> np.ndarray:
    return np.array(backend.to_numpy(native), dtype=np.float32, copy=True)


def _prompt(config: str, n: int, seed: int) -> tuple[np.ndarray, list[np.ndarray]]:
    hp = CONFIGS[config]
    rng = np.random.default_rng(seed)
    return mixed_prompt(hp, n, rng), [semantic_frame(hp, rng) for _ in range(4)]


def _rel_err(out: np.ndarray, ref: np.ndarray) -> float:
    out, ref = np.asarray(out, np.float64), np.asarray(ref, np.float64)
    return float(np.linalg.norm(out - ref) / np.linalg.norm(ref))


class ContractRules:
    """Rules of the contract beyond the numbers (see the module docstring)."""

    # ------------------------------------------------------------ results
    def test_rule_results_unchanged_after_later_calls(self, open_model):
        m = open_model("gqa4", "f32")
        backend = m.backend
        prompt, frames = _prompt("gqa4", 20, seed=11)
        m.init_kv_cache(64)
        saved = []  # (label, Result, hidden copy, logits copy, host arrays taken at once)

        def keep(label: str, result: Any, host_now: bool) -> None:
            h, lg = _host_copy(backend, result.hidden_native), _host_copy(backend, result.logits_native)
            # half the results are converted to numpy at once (the conversion is cached in
            # the Result), half only at the end: both hand-offs must survive later calls
            host = (result.hidden, result.logits) if host_now else None
            saved.append((label, result, h, lg, host))

        keep("prefill", m.prefill(prompt), True)
        keep("step 1", m.step(frames[0]), False)
        keep("step 2", m.step(frames[1]), True)
        rng = np.random.default_rng(12)
        fast_saved = []
        hidden = rng.standard_normal(m.hparams.dim).astype(np.float32)
        for codes in ([], [1], [1, 2]):
            native = m.fast_decode_native(hidden, codes)
            fast_saved.append((f"fast logits after prefix {codes}", native,
                               _host_copy(backend, native)))
        public = m.fast_decode(hidden, [1, 2, 3])
        fast_saved.append(("fast_decode() numpy result", None, public.copy(), public))

        # later calls of every kind: steps, other Fast-AR sequences, a reset and new prefill
        m.step(frames[2])
        for codes in ([5], [5, 6], [7]):
            m.fast_decode(rng.standard_normal(m.hparams.dim).astype(np.float32), codes)
        m.reset()
        m.prefill(_prompt("gqa4", 9, seed=13)[0])
        m.step(frames[3])

        for label, result, h, lg, host in saved:
            for what, expected, native, numpy_now in (
                    ("hidden", h, result.hidden_native, host[0] if host else None),
                    ("logits", lg, result.logits_native, host[1] if host else None)):
                for form, value in (("native", backend.to_numpy(native)),
                                    (f"numpy (Result.{what})", numpy_now)):
                    if value is not None and not np.array_equal(value, expected):
                        fail(RESULTS_UNCHANGED, f"the {label} result's {what} ({form}) changed "
                             f"after later calls (max change "
                             f"{np.abs(np.asarray(value) - expected).max():.3g}): the backend "
                             "returned a buffer that a later call overwrites")
        for entry in fast_saved:
            label, native, expected = entry[:3]
            value = backend.to_numpy(native) if native is not None else entry[3]
            if not np.array_equal(value, expected):
                fail(RESULTS_UNCHANGED, f"{label} changed after later calls (max change "
                     f"{np.abs(np.asarray(value) - expected).max():.3g}): fast_decode "
                     "returned a buffer that a later call overwrites")

    # ------------------------------------------------------------ snapshots
    def test_rule_snapshots_are_copies(self, open_model):
        m = open_model("gqa4", "f32")  # one KV head: the shape where a view is easiest to leak
        prompt, frames = _prompt("gqa4", 12, seed=14)
        m.init_kv_cache(len(prompt) + 2)
        m.prefill(prompt)
        k1, v1 = m.kv_cache_snapshot()
        if k1.dtype != np.float32 or v1.dtype != np.float32:
            fail(SNAPSHOTS_ARE_COPIES, f"snapshots must be float32 numpy arrays, got "
                 f"{k1.dtype} and {v1.dtype}")
        k1_copy, v1_copy = k1.copy(), v1.copy()
        m.step(frames[0])
        m.step(frames[1])  # the cache is now full: n_past == max_seq_len
        if not (np.array_equal(k1, k1_copy) and np.array_equal(v1, v1_copy)):
            fail(SNAPSHOTS_ARE_COPIES, "a snapshot changed when later steps wrote the cache: "
                 "read_kv_cache returned views of the live cache, not copies")
        k2, v2 = m.kv_cache_snapshot()
        k2_copy, v2_copy = k2.copy(), v2.copy()
        for arr in (k2, v2):
            if arr.flags.writeable:
                arr += 1.0
        k3, v3 = m.kv_cache_snapshot()
        if not (np.array_equal(k3, k2_copy) and np.array_equal(v3, v2_copy)):
            fail(SNAPSHOTS_ARE_COPIES, "changing a snapshot of the full cache changed the cache "
                 "(a later snapshot saw the change): read_kv_cache returned views")
        if np.shares_memory(k3, k2) or np.shares_memory(v3, v2):
            fail(SNAPSHOTS_ARE_COPIES, "two snapshots share memory")

    # ------------------------------------------------------------ declared types
    def test_rule_declared_kv_cache_dtype_holds(self, open_model, backend):
        prompt, _ = _prompt("gqa4", 16, seed=15)
        offered = s2core.get_registry().info(backend).capabilities.supported_kv_cache_dtypes
        for dtype in offered:
            m = open_model("gqa4", "f32", kv_cache_dtype=dtype)
            declared = m.capabilities.kv_cache_dtype
            if declared != dtype:
                fail(CACHE_DTYPE_HOLDS, f"kv_cache_dtype={dtype!r} gave a backend declaring "
                     f"{declared!r}")
            m.init_kv_cache(32)
            m.prefill(prompt)
            k, v = m.kv_cache_snapshot()
            values = np.concatenate([k.ravel(), v.ravel()]).astype(np.float32)
            values = values[values != 0]
            if dtype == "f16":
                off = values[values.astype(np.float16).astype(np.float32) != values]
                if off.size:
                    fail(CACHE_DTYPE_HOLDS, f"declares an f16 cache but {off.size} of "
                         f"{values.size} cached values are not f16 numbers (e.g. {off[0]!r}): "
                         "values must be rounded to f16 when written, as s2.cpp does")
            elif dtype == "bf16":
                off = values[values.view(np.uint32) & 0xFFFF != 0]
                if off.size:
                    fail(CACHE_DTYPE_HOLDS, f"declares a bf16 cache but {off.size} of "
                         f"{values.size} cached values are not bf16 numbers (e.g. {off[0]!r})")
            else:
                exact = np.count_nonzero(values.astype(np.float16).astype(np.float32) == values)
                if exact > values.size // 2:
                    fail(CACHE_DTYPE_HOLDS, f"declares an f32 cache but {exact} of "
                         f"{values.size} cached values are f16 numbers: the cache rounds "
                         "what it should keep")

    def test_rule_declared_compute_dtype_holds(self, open_model, backend):
        """Within the declared type's bound; and a declared half type must show: declaring one
        loosens every bound the kit applies, so it must not hide float32-exact work."""
        offered = s2core.get_registry().info(backend).capabilities.supported_kv_cache_dtypes
        cache = {"kv_cache_dtype": "f32"} if "f32" in offered else {}
        m = open_model("gqa4", "f16", **cache)  # f16 weights: half-compute backends use them as is
        ref = kit_reference("gqa4", "f16", m.capabilities.arithmetic)
        prompt, frames = _prompt("gqa4", 16, seed=16)
        m.init_kv_cache(32)
        m.prefill(prompt)
        out = m.step(frames[0])  # one position: the path half-precision GEMVs take
        step_err = _rel_err(out.logits, ref.forward(np.vstack([prompt, frames[0]])).logits)
        hidden = np.random.default_rng(17).standard_normal(m.hparams.dim).astype(np.float32)
        fast_err = _rel_err(m.fast_decode(hidden, [1, 2]), ref.fast_decode(hidden, [1, 2]))
        caps = m.capabilities
        bound = output_tolerance(caps)
        if step_err > bound or fast_err > fast_tolerance(caps):
            fail(COMPUTE_DTYPE_HOLDS, f"declares compute_dtype={caps.compute_dtype!r} "
                 f"(kv_cache_dtype={caps.kv_cache_dtype!r}) but the step's logits are off by "
                 f"{step_err:.2e} (bound {bound:.1e}) and the Fast-AR's by {fast_err:.2e} "
                 f"(bound {fast_tolerance(caps):.1e})")
        if caps.compute_dtype != "f32" and max(step_err, fast_err) <= COMPUTE["f32"]:
            fail(COMPUTE_DTYPE_HOLDS, f"declares compute_dtype={caps.compute_dtype!r} but its "
                 f"errors ({step_err:.2e}, {fast_err:.2e}) are within f32's bound "
                 f"{COMPUTE['f32']:.0e}: declare 'f32'")

    # ------------------------------------------------------------ options
    def test_rule_options_declared_and_checked(self, open_model, backend):
        registry = s2core.get_registry()
        declared = registry.info(backend).options
        _expect_refusal("an unknown option", "unknown_option",
                        lambda: open_model("gqa4", "f32", s2core_kit_no_such_option=1))
        params = inspect.signature(registry.backend_class(backend).__init__).parameters
        takes_any = any(p.kind is p.VAR_KEYWORD for p in params.values())
        keywords = [n for n, p in list(params.items())[2:]  # after self and model_file
                    if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]
        undeclared = sorted(set(keywords) - {o.name for o in declared})
        if undeclared:
            fail(OPTIONS_DECLARED, f"{registry.info(backend).backend_class} takes "
                 f"{', '.join(undeclared)} but its BackendSpec does not declare "
                 f"{'it' if len(undeclared) == 1 else 'them'}: load() refuses undeclared options")
        for opt in declared:
            if not takes_any and opt.name not in params:
                fail(OPTIONS_DECLARED, f"option {opt.name!r} is declared but "
                     f"{registry.info(backend).backend_class} does not take it")
            if opt.name in params and params[opt.name].default is not inspect.Parameter.empty \
                    and not _same_default(params[opt.name].default, opt.default):
                fail(OPTIONS_DECLARED, f"option {opt.name!r} declares default "
                     f"{opt.default!r} but the class's is {params[opt.name].default!r}")
            _expect_refusal(f"option {opt.name}=<an arbitrary object>", opt.name,
                            lambda: open_model("gqa4", "f32", **{opt.name: _NotAValue()}))
            for value in opt.choices or ():
                try:
                    m = open_model("gqa4", "f32", **{opt.name: value})
                except BackendUnavailableError:
                    continue  # a choice this machine cannot do (a GPU that is not here)
                except InvalidInputError as exc:
                    if exc.check == opt.name:
                        continue  # refused by the backend itself, naming the option: fine
                    fail(OPTIONS_DECLARED, f"{opt.name}={value!r} (a declared choice) raised "
                         f"{exc!r}")
                except Exception as exc:  # noqa: BLE001 - any other failure breaks the rule
                    fail(OPTIONS_DECLARED, f"{opt.name}={value!r} (a declared choice) raised "
                         f"{exc!r}")
                if opt.name == "kv_cache_dtype" and value is not None \
                        and m.capabilities.kv_cache_dtype != value:
                    fail(OPTIONS_DECLARED, f"kv_cache_dtype={value!r} gave a backend "
                         f"declaring kv_cache_dtype={m.capabilities.kv_cache_dtype!r}: the "
                         "option is ignored")

    # ------------------------------------------------------------ Fast-AR
    def test_rule_fast_ar_uses_its_own_hparams(self, open_model):
        m = open_model("fast-own", "f32")
        ref = kit_reference("fast-own", "f32")
        hp = m.hparams
        f = hp.fast
        rng = np.random.default_rng(18)
        hidden = rng.standard_normal(hp.dim).astype(np.float32)
        codes = rng.integers(0, hp.codebook_size, hp.num_codebooks)
        for n in (0, 1, 4, hp.num_codebooks - 1):
            try:
                out = m.fast_decode(hidden, codes[:n])
            except Exception as exc:  # noqa: BLE001 - shapes from the wrong hparams raise
                fail(FAST_AR_OWN_HPARAMS, f"fast_decode with {n} prefix codes raised {exc!r}")
            err = _rel_err(out, ref.fast_decode(hidden, codes[:n]))
            if err > fast_tolerance(m.capabilities):
                fail(FAST_AR_OWN_HPARAMS, f"fast logits after {n} codes are off by {err:.2e} "
                     f"(bound {fast_tolerance(m.capabilities):.1e}) on a model whose Fast-AR "
                     f"has RoPE base {f.rope_freq_base:g}, eps {f.rms_norm_eps:g}, "
                     f"{f.n_head}/{f.n_head_kv} heads of {f.head_dim} (Slow-AR: "
                     f"{hp.rope_freq_base:g}, {hp.rms_norm_eps:g}, {hp.n_head}/{hp.n_head_kv} "
                     f"of {hp.head_dim}); read them from hparams.fast")


def _expect_refusal(what: str, check: str, call: Any) -> None:
    """`call` must raise InvalidInputError with `check`; anything else breaks the rule."""
    try:
        call()
    except InvalidInputError as exc:
        if exc.check != check:
            fail(OPTIONS_DECLARED, f"{what} raised {exc!r}, not a refusal naming {check!r}")
        return
    except Exception as exc:  # noqa: BLE001 - a TypeError from the class is the bug itself
        fail(OPTIONS_DECLARED, f"{what} raised {exc!r}, not InvalidInputError({check!r})")
    fail(OPTIONS_DECLARED, f"{what} was accepted")


def _same_default(a: Any, b: Any) -> bool:
    from s2core.contract.plugin_spec import same_value
    return same_value(a, b)


# ---------------------------------------------------------------- threads and life cycle
def _threads(*bodies: Callable[[], Any], timeout: float = 120.0) -> list[BaseException]:
    """Run each body in its own thread; the exceptions they raised."""
    errors: list[BaseException] = []

    def run(body: Callable[[], Any]) -> None:
        try:
            body()
        except BaseException as exc:  # noqa: BLE001 - reported by the rule
            errors.append(exc)
    threads = [threading.Thread(target=run, args=(b,), daemon=True) for b in bodies]
    for t in threads:
        t.start()
    deadline = time.monotonic() + timeout
    for t in threads:
        t.join(max(0.0, deadline - time.monotonic()))
    if any(t.is_alive() for t in threads):
        errors.append(TimeoutError(f"a thread was still running after {timeout:g} s"))
    return errors


def _run_steps(m: Any, prompt: np.ndarray, frames: list[np.ndarray]) -> tuple[np.ndarray, ...]:
    """hidden, logits and Fast-AR logits of every call, then K and V."""
    m.init_kv_cache(len(prompt) + len(frames))
    results = [m.prefill(prompt)] + [m.step(f) for f in frames]
    fast = [m.fast_decode(r.hidden, f[1:1 + i % m.hparams.num_codebooks]) for i, (r, f) in
            enumerate(zip(results, frames))]
    k, v = m.kv_cache_snapshot()
    return (np.stack([r.hidden for r in results]), np.stack([r.logits for r in results]),
            np.stack(fast), k, v)


def _maps_file(path: Path) -> bool | None:
    """Whether this process maps `path` (None where /proc/self/maps does not exist)."""
    maps = Path("/proc/self/maps")
    return str(path) in maps.read_text() if maps.exists() else None


class ThreadAndLifeCycleRules:
    """The rules of concurrency and of the model's life cycle. The core enforces part of each
    for every backend (its guard serializes one model's calls; closed models and caches
    beyond the backend's kv_cache_limit_bytes are refused before the backend is called);
    what is left to the backend is checked here."""

    def test_rule_threads_never_interleave(self, open_model):
        hp = CONFIGS["gqa4"]
        rng = np.random.default_rng(19)
        prompt = mixed_prompt(hp, 8, rng)
        frames = [semantic_frame(hp, rng) for _ in range(24)]
        # one model, two threads stepping it
        m = open_model("gqa4", "f32")
        m.init_kv_cache(len(prompt) + len(frames))
        m.prefill(prompt)
        errors = _threads(*(lambda part=frames[i::2]: [m.step(f) for f in part]
                            for i in range(2)))
        if errors:
            fail(CONCURRENCY, f"two threads stepping one model raised {errors[0]!r}")
        if m.n_past != len(prompt) + len(frames):
            fail(CONCURRENCY, f"after {len(frames)} steps from two threads n_past is {m.n_past}, "
                 f"not {len(prompt) + len(frames)}")
        order = m.token_rows()  # the rows in the order the steps ran
        replay = open_model("gqa4", "f32")
        replay.init_kv_cache(len(order))
        replay.prefill(order[:len(prompt)])
        for row in order[len(prompt):]:
            replay.step(row)
        if not all(np.array_equal(a, b) for a, b in zip(m.kv_cache_snapshot(),
                                                         replay.kv_cache_snapshot())):
            fail(CONCURRENCY, "two threads stepping one model left a cache that differs from a "
                 "serial replay of the same steps")
        # a stream holds its model against other threads
        it = stream(m, prompt, GenerationConfig(max_new_tokens=3, seed=0,
                                                im_end_id=hp.vocab_size - 1,
                                                min_tokens_before_end=3))
        next(it)
        refused = []
        _threads(lambda: refused.append(_raises(ModelBusyError, lambda: m.step(frames[0]))))
        it.close()
        if refused != [True]:
            fail(CONCURRENCY, "another thread's step() during a stream was not refused with "
                 "ModelBusyError")
        # two models in two threads, each on its own input, each as it is alone: module-global
        # scratch shared by the instances shows as one model's values in the other's results
        inputs = [(prompt, frames), (mixed_prompt(hp, 8, rng),
                                     [semantic_frame(hp, rng) for _ in range(len(frames))])]
        alone = [_run_steps(open_model("gqa4", "f32"), *inputs[i]) for i in range(2)]
        pair = [open_model("gqa4", "f32"), open_model("gqa4", "f32")]
        results: dict[int, tuple[np.ndarray, ...]] = {}
        errors = _threads(*(lambda i=i: results.__setitem__(i, _run_steps(pair[i], *inputs[i]))
                            for i in range(2)))
        if errors:
            fail(CONCURRENCY, f"two models in two threads raised {errors[0]!r}")
        for i, got in results.items():
            for what, a, b in zip(("hidden", "logits", "Fast-AR logits", "K cache", "V cache"),
                                  got, alone[i]):
                if not np.array_equal(a, b):
                    fail(CONCURRENCY, f"expected model {i} of two run in two threads (other "
                         f"inputs) to give the {what} it gives alone, seen a max difference of "
                         f"{np.abs(a - b).max():.3g}: the instances share state")

    def test_rule_close_releases_and_failed_init_keeps_the_cache(self, open_model, backend,
                                                                 backend_options, tmp_path):
        hp = CONFIGS["gqa4"]
        rng = np.random.default_rng(20)
        prompt = mixed_prompt(hp, 8, rng)
        frame = semantic_frame(hp, rng)
        # close(): a private copy of a kit file, so no other model in the process maps it
        path = tmp_path / "kit-close.gguf"
        shutil.copy(kit_model("gqa4", "f32"), path)
        m = s2core.load(path, backend=backend, **backend_options)
        m.init_kv_cache(len(prompt) + 1)
        kept = m.prefill(prompt)
        expected_logits = np.array(m.backend.to_numpy(kept.logits_native), copy=True)
        m.close()
        if _maps_file(path):
            fail(LIFE_CYCLE, f"{path.name} is still mapped after close(): the backend keeps "
                 "arrays viewing the file (close() must drop every weight)")
        if not _raises(ModelClosedError, lambda: m.step(frame)):
            fail(LIFE_CYCLE, "a step after close() did not raise ModelClosedError")
        m.close()  # twice is fine
        if not np.array_equal(kept.logits, expected_logits):
            fail(LIFE_CYCLE, "a result made before close() changed or cannot be read")
        # a cache that cannot be allocated
        m = open_model("huge-context", "f32")
        m.init_kv_cache(len(prompt) + 1)
        m.prefill(prompt)
        k, v = m.kv_cache_snapshot()
        try:
            m.init_kv_cache(CONFIGS["huge-context"].context_length)
        except CacheAllocationError:
            pass
        except Exception as exc:  # noqa: BLE001 - anything else breaks the rule
            fail(LIFE_CYCLE, f"init_kv_cache(2**31 - 1) raised {exc!r}, not "
                 "CacheAllocationError")
        else:
            pytest.skip("this backend allocated a cache of 2**31 - 1 positions: the failure "
                        "cannot be provoked here")
        if (m.max_seq_len, m.n_past) != (len(prompt) + 1, len(prompt)):
            fail(LIFE_CYCLE, f"after a failed init_kv_cache, max_seq_len={m.max_seq_len} and "
                 f"n_past={m.n_past}, not {len(prompt) + 1} and {len(prompt)}")
        try:
            same = all(np.array_equal(a, b) for a, b in zip(m.kv_cache_snapshot(), (k, v)))
            after = m.step(frame).logits
        except Exception as exc:  # noqa: BLE001 - a lost cache shows here
            fail(LIFE_CYCLE, f"after a failed init_kv_cache the previous cache is gone: "
                 f"{exc!r} (allocate the new cache before dropping the old)")
        if not same:
            fail(LIFE_CYCLE, "a failed init_kv_cache changed the previous cache's contents")
        clean = open_model("huge-context", "f32")
        clean.init_kv_cache(len(prompt) + 1)
        clean.prefill(prompt)
        if not np.array_equal(after, clean.step(frame).logits):
            fail(LIFE_CYCLE, "after a failed init_kv_cache the next step differs from a model's "
                 "that never saw it")


def _raises(error: type[BaseException], call: Callable[[], Any]) -> bool:
    try:
        call()
    except error:
        return True
    except Exception:  # noqa: BLE001 - the wrong error is a broken rule too
        return False
    return False
