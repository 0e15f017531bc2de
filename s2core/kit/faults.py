"""The rule that a backend's failure reaches the user as an s2core error and changes nothing.

A backend fails in ways the core cannot check beforehand: an IndexError on an input its
author did not foresee, a MemoryError in the middle of an evaluation, a driver's
RuntimeError. The kit injects such faults into every call the core makes on a loaded
backend, before and after the backend's own work (a late fault has already written cache
rows), and checks that the user sees an S2CoreError naming the call and that the model then
gives exactly what a model that never saw the fault gives.
"""

from __future__ import annotations

from typing import Any, Callable

import numpy as np

from s2core.errors import (BackendError, BackendOutOfMemoryError, CacheAllocationError,
                           S2CoreError)
from s2core.kit.models import CONFIGS
from s2core.kit.prompts import mixed_prompt, semantic_frame
from s2core.kit.rules import BACKEND_ERRORS, fail

#: (exception type the backend raises, what the user must see instead); each injection
#: raises a new instance, so no traceback (and no model in its frames) outlives its test
FAULTS = ((IndexError, BackendError), (MemoryError, BackendOutOfMemoryError))


def inject(backend: Any, method: str, exc: BaseException, late: bool) -> Callable[[], None]:
    """Make the instance's `method` raise `exc` (a new instance) once, before (early) or
    after (late) its own work; returns the undo."""
    original = getattr(backend, method)

    def faulty(*args: Any, **kwargs: Any) -> Any:
        setattr(backend, method, original)  # once
        if late:
            original(*args, **kwargs)
        raise exc
    setattr(backend, method, faulty)

    def undo() -> None:
        if vars(backend).get(method) is faulty:
            setattr(backend, method, original)
    return undo


class BackendErrorRules:
    """Faults injected at each call the core makes."""

    def test_rule_backend_failures_reach_users_as_s2core_errors(self, open_model):
        hp = CONFIGS["gqa4"]
        rng = np.random.default_rng(21)
        prompt = mixed_prompt(hp, 10, rng)
        frames = [semantic_frame(hp, rng) for _ in range(2)]
        hidden = rng.standard_normal(hp.dim).astype(np.float32)
        clean = open_model("gqa4", "f32")
        clean.init_kv_cache(len(prompt) + len(frames))
        clean.prefill(prompt)
        expected_step = clean.step(frames[0]).logits.copy()
        expected_fast = clean.fast_decode(hidden, [1, 2]).copy()

        m = open_model("gqa4", "f32")
        m.init_kv_cache(len(prompt) + len(frames))
        m.prefill(prompt)
        be = m.backend
        fast_calls = (("fast_start", "fast_extend") if be.incremental_fast_decode
                      else ("fast_decode",))
        for kind, want in FAULTS:
            for late in (False, True):
                when = "after its own work" if late else "before its work"
                # an evaluation: n_past and the cache stay, the next step is a clean one's
                k, v = m.kv_cache_snapshot()
                self._expect(be, "eval_cached", kind, late, want, lambda: m.step(frames[0]))
                if m.n_past != len(prompt):
                    fail(BACKEND_ERRORS, f"expected n_past={len(prompt)} after a step whose "
                         f"eval_cached raised {kind.__name__} {when}, seen {m.n_past}")
                k2, v2 = m.kv_cache_snapshot()
                if not (np.array_equal(k, k2) and np.array_equal(v, v2)):
                    fail(BACKEND_ERRORS, f"expected the cache below n_past unchanged by a "
                         f"failed eval_cached ({kind.__name__} {when}), seen it changed")
                # the Fast-AR: a failed call leaves no half sequence behind
                for call in fast_calls:
                    # fast_extend is reached when the call extends the last sequence ([1]),
                    # fast_start when it does not ([3])
                    m.fast_decode(hidden, [1] if call == "fast_extend" else [3])
                    self._expect(be, call, kind, late, want,
                                 lambda: m.fast_decode(hidden, [1, 2]))
                got = m.fast_decode(hidden, [1, 2])
                if not np.array_equal(got, expected_fast):
                    fail(BACKEND_ERRORS, f"expected the Fast-AR logits of a clean model after "
                         f"a failed Fast-AR call ({kind.__name__} {when}), seen a max "
                         f"difference of {np.abs(got - expected_fast).max():.3g}")
            # reading the cache
            self._expect(be, "read_kv_cache", kind, False, want, m.kv_cache_snapshot)
            # an allocation keeps the previous cache
            self._expect(be, "allocate_kv_cache", kind, False, CacheAllocationError,
                         lambda: m.init_kv_cache(len(prompt) + len(frames) + 1))
            if (m.max_seq_len, m.n_past) != (len(prompt) + len(frames), len(prompt)):
                fail(BACKEND_ERRORS, f"expected max_seq_len={len(prompt) + len(frames)}, "
                     f"n_past={len(prompt)} after a failed allocate_kv_cache, seen "
                     f"{m.max_seq_len}, {m.n_past}")
        after = m.step(frames[0]).logits
        if not np.array_equal(after, expected_step):
            fail(BACKEND_ERRORS, f"expected a clean model's step after the failed calls, seen "
                 f"a max difference of {np.abs(after - expected_step).max():.3g}: a failed "
                 "call changed the backend's state")

    @staticmethod
    def _expect(backend: Any, method: str, kind: type[BaseException], late: bool,
                want: type[S2CoreError], call: Callable[[], Any]) -> None:
        exc = kind("injected by the s2core kit")
        undo = inject(backend, method, exc, late)
        try:
            call()
        except want as err:
            if isinstance(err, BackendError) and err.call.split("(")[0] != method:
                fail(BACKEND_ERRORS, f"expected the error to name the call {method!r}, seen "
                     f"{err.call!r}")
            if err.__cause__ is not exc:
                fail(BACKEND_ERRORS, f"expected {type(err).__name__} to chain the backend's "
                     f"{type(exc).__name__}, seen __cause__={err.__cause__!r}")
        except BaseException as err:  # noqa: BLE001 - the wrong kind is the broken rule
            fail(BACKEND_ERRORS, f"expected {want.__name__} when {method} raises "
                 f"{type(exc).__name__}, seen {type(err).__name__}: {err}")
        else:
            fail(BACKEND_ERRORS, f"expected {want.__name__} when {method} raises "
                 f"{type(exc).__name__}, seen the call succeed")
        finally:
            undo()
