"""Which backend decodes audio when none is named: a pure function of declared capabilities.

Only backends whose probe declares a codec (`Capabilities.codec`) and whose plugin names a
codec class take part. The codec is convolutions over long sequences, compute-bound, so unlike
the Slow-AR's choice (bytes held) this one goes by the codec's own priority, which a backend
sets from measurements of its convolutions (an accelerator far above any CPU); then a backend
that streams exactly over one that re-decodes windows, then the name for a stable answer.
"""

from __future__ import annotations

from s2core.errors import BackendUnavailableError
from s2core.contract.registry import BackendInfo


def codec_priority(row: BackendInfo) -> int:
    codec = row.capabilities.codec if row.capabilities is not None else None
    if codec is None:
        return row.priority
    return row.priority if codec.priority is None else codec.priority


def provides_codec(row: BackendInfo) -> bool:
    return bool(row.codec_class) and row.capabilities is not None and row.capabilities.codec is not None


def choose_codec_backend(rows: list[BackendInfo]) -> str:
    providers = [r for r in rows if provides_codec(r)]
    available = [r for r in providers if r.available]
    if not available:
        why = "; ".join(f"{r.name}: {r.reason}" for r in providers) or (
            "no registered backend provides a codec")
        raise BackendUnavailableError(f"no codec backend is available ({why})")
    return min(available, key=lambda r: (-codec_priority(r), not r.capabilities.codec.streaming,
                                         r.name)).name
