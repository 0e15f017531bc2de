"""Backends that break the logit-rows rule (s2core/kit/logit_rows.py): each is NumPy's
backend, which declares Capabilities.logit_rows, with one fault, for
tests/test_kit_catches_broken.py.
"""

from __future__ import annotations

import dataclasses

from s2core.plugin import LogitRows
from s2core_numpy.backend import NumpyBackend


class RowsDeclaredAllReturned(NumpyBackend):
    """Declares logit_rows and returns the whole vocabulary's logits anyway."""

    def eval_cached(self, batch):
        return super().eval_cached(dataclasses.replace(batch, logit_rows=None))


class RowsShifted(NumpyBackend):
    """Computes the rows one id past those asked for (an off-by-one in a window's start)."""

    def eval_cached(self, batch):
        rows = batch.logit_rows
        if rows is not None:  # the last id wraps to 0: as many rows as asked for
            vocab = self.hparams.vocab_size
            rows = LogitRows.of((rows.ids + 1) % vocab, vocab)
        return super().eval_cached(dataclasses.replace(batch, logit_rows=rows))


class SlotsTakeTheFirstRows(NumpyBackend):
    """eval_slots computes every slot's logits with the first slot's logit_rows."""

    def eval_slots(self, batches):
        first = batches[0][1].logit_rows
        return super().eval_slots([(slot, dataclasses.replace(b, logit_rows=first))
                                   for slot, b in batches])
