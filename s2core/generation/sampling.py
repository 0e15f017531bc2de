"""s2.cpp's token sampler (SPEC 6), as pure functions.

    sample_token(logits, temperature=0.8, top_p=0.8, top_k=30, rng=np.random.default_rng())

1. Sort the ids by logit, descending; `probs` = softmax of the sorted logits at temperature 1
   (not the sampling temperature).
2. Walk the sorted list with `cumsum += probs[i]`; drop item i when i >= top_k (top_k <= 0: the
   whole vocab) or when i > 0 and cumsum > top_p (top_p clamped to [0, 1]). The item whose
   addition crosses top_p is dropped; the first item is always kept.
3. temperature <= 0: the first kept id. Otherwise the softmax of the kept logits at the
   sampling temperature, and one draw.

The arithmetic is s2.cpp's: float32 logits, float32 softmax summed in sorted order, a float32
running sum compared with a float32 top_p. Two things s2.cpp leaves open are fixed here: equal
logits sort by ascending id (std::sort is not stable), and the draw comes from the caller's
numpy Generator (s2.cpp seeds a thread-local mt19937 from the OS).

Ids whose logit is -inf (a mask) are dropped before sorting: they sort last, add exactly 0 to
every sum and get probability 0, so the kept set and the distribution are the same, and a
masked vocabulary of 155776 ids sorts only its ~4097 allowed ones.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np

from s2core.contract.inputs import is_integer
from s2core.errors import InvalidInputError
from s2core.generation import sampler_kernels
from s2core.generation.sampler_kernels import descending, sequential_sum

#: s2.cpp's SamplerParams / GenerateParams defaults
DEFAULT_TEMPERATURE = 0.8
DEFAULT_TOP_P = 0.8
DEFAULT_TOP_K = 30


@dataclass(frozen=True)
class Candidates:
    """What step 2 keeps: ids in sampling order (best first) and their logits (float32)."""

    ids: np.ndarray      # int64
    logits: np.ndarray   # float32

    def probabilities(self, temperature: float) -> np.ndarray:
        """Step 3's distribution over `ids` (float32, as s2.cpp); one-hot on the first id
        when temperature <= 0."""
        if temperature <= 0:
            p = np.zeros(len(self.ids), np.float32)
            p[0] = 1.0
            return p
        z = np.exp((self.logits - self.logits[0]) / np.float32(temperature))
        return z / sequential_sum(z)


def clamped_top_p(top_p: float) -> np.float32:
    """top_p as step 2 compares it: clamped to [0, 1], float32."""
    return np.float32(min(max(top_p, 0.0), 1.0))


def candidates(logits: np.ndarray, top_p: float, top_k: int) -> Candidates:
    """Steps 1 and 2 on validated float32 logits with at least one finite value."""
    # The sums need every logit in descending order, but only values: equal logits are
    # equal terms, so sorting the values alone (4-5x faster than a stable argsort of the
    # ids) gives the same sums. The -inf ones are left out (sampler_kernels: compiled
    # where numba is installed).
    sorted_logits = descending(logits)
    e = np.exp(sorted_logits - sorted_logits[0])
    n = len(sorted_logits) if top_k <= 0 else min(top_k, len(sorted_logits))
    # the walk stops by item n: the running sum of the first n probabilities is all it
    # reads (each term is e / total, the total over every item)
    running = np.cumsum(e[:n] / sequential_sum(e), dtype=np.float32)
    p = clamped_top_p(top_p)
    # The running sum never decreases, so the kept items are a prefix: item 0, then every
    # item up to the first whose running sum exceeds top_p (exclusive).
    crossing = np.flatnonzero(running[1:] > p)
    keep = n if crossing.size == 0 else int(crossing[0]) + 1
    # Their ids: the logits at least the last kept value (finite: no -inf among them), in a
    # stable sort (descending, equal logits by ascending id) of which the first `keep` are
    # the kept ones.
    ties_and_above = np.flatnonzero(logits >= sorted_logits[keep - 1])
    ids = ties_and_above[np.argsort(-logits[ties_and_above], kind="stable")[:keep]]
    return Candidates(ids.astype(np.int64), sorted_logits[:keep])


def candidates_rows(logits: np.ndarray, top_p: Sequence[float],
                    top_k: Sequence[int]) -> list[Candidates]:
    """candidates(logits[b], top_p[b], top_k[b]) for every row of logits (B, V; validated
    float32 rows, each with a finite value): the same Candidates. Where numba is installed
    each pass runs once for all rows, the rows spread over the cores (sampler_compiled.py):
    a batch's draws of a codebook come between two Fast-AR calls, which wait for them."""
    passes = sampler_kernels.compiled()
    if passes is None:
        return [candidates(row, p, k) for row, p, k in zip(logits, top_p, top_k)]
    logits = np.ascontiguousarray(logits, dtype=np.float32)
    n_rows = logits.shape[0]
    ordered = np.empty_like(logits)
    counts = np.empty(n_rows, np.int64)
    passes.descending_rows(logits, ordered, counts)
    # candidates' terms, NumPy's exp of every row at once (-inf past a row's count: 0)
    terms = np.exp(ordered - ordered[:, :1])
    p = np.array([clamped_top_p(v) for v in top_p], np.float32)
    keep = np.empty(n_rows, np.int64)
    ids = np.empty(logits.shape, np.int64)
    passes.kept_rows(logits, ordered, terms, counts, p, np.asarray(top_k, np.int64), keep, ids)
    return [Candidates(ids[b, :keep[b]].copy(), ordered[b, :keep[b]].copy())
            for b in range(n_rows)]


def draw(c: Candidates, temperature: float, rng: np.random.Generator) -> int:
    """Step 3: one id from the kept candidates."""
    if temperature <= 0 or len(c.ids) == 1:
        return int(c.ids[0])
    p = c.probabilities(temperature).astype(np.float64)
    cdf = np.cumsum(p)
    # side="right": an id of probability 0 is never hit (its cdf equals its predecessor's).
    i = int(np.searchsorted(cdf, rng.random() * cdf[-1], side="right"))
    return int(c.ids[min(i, len(c.ids) - 1)])


def sample_token(logits: Any, *, temperature: float = DEFAULT_TEMPERATURE,
                 top_p: float = DEFAULT_TOP_P, top_k: int = DEFAULT_TOP_K,
                 rng: np.random.Generator) -> int:
    """One id (an index into `logits`) drawn exactly as s2.cpp's sample_token (SPEC 6).

    `logits` is 1-D; -inf entries are masked out (never drawn); NaN or +inf is an error, as is
    a vector without a finite value."""
    check_sampling(temperature, top_p, top_k)
    if not isinstance(rng, np.random.Generator):
        raise InvalidInputError("rng", f"rng must be a numpy.random.Generator "
                                f"(np.random.default_rng(seed)), got {type(rng).__name__}")
    x = check_logits(logits)
    return draw(candidates(x, top_p, top_k), temperature, rng)


def check_logits(logits: Any) -> np.ndarray:
    """float32 1-D logits with at least one finite value and no NaN or +inf."""
    try:
        x = np.asarray(logits, dtype=np.float32)
    except (TypeError, ValueError) as exc:
        raise InvalidInputError("logits", f"logits must be a 1-D array of numbers: {exc}") from exc
    if x.ndim != 1 or x.size == 0:
        raise InvalidInputError("logits", f"logits must be a non-empty 1-D array, got shape "
                                f"{x.shape}")
    bad = np.isnan(x) | (x == np.inf)
    if bad.any():
        i = int(np.flatnonzero(bad)[0])
        raise InvalidInputError("logits_finite", f"logit {i} is {x[i]} ({int(bad.sum())} NaN or "
                                "+inf values); only -inf (a masked id) is allowed")
    if not np.isfinite(x).any():
        raise InvalidInputError("logits_finite", "every logit is -inf: nothing can be sampled")
    return x


def check_sampling(temperature: Any, top_p: Any, top_k: Any, what: str = "") -> None:
    """The three settings' types and values (s2.cpp's meaning: temperature <= 0 is greedy,
    top_p is clamped to [0, 1], top_k <= 0 is off); NaN and non-numbers are refused."""
    prefix = f"{what}." if what else ""
    for name, value in (("temperature", temperature), ("top_p", top_p)):
        if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, float, np.number)):
            raise InvalidInputError(f"{prefix}{name}", f"{prefix}{name} must be a number, "
                                    f"got {value!r}")
        if math.isnan(float(value)):
            raise InvalidInputError(f"{prefix}{name}", f"{prefix}{name} is NaN")
    if math.isinf(float(temperature)):
        raise InvalidInputError(f"{prefix}temperature", f"{prefix}temperature must be finite, "
                                f"got {temperature}")
    if not is_integer(top_k):
        raise InvalidInputError(f"{prefix}top_k", f"{prefix}top_k must be an integer (<= 0: "
                                f"off), got {top_k!r}")
