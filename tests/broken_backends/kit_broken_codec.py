"""Codec backends for the codec kit (tests/test_kit_catches_broken.py): one broken, one
honest but without an encoder. Both are NumPy's codec with one change."""

from __future__ import annotations

import dataclasses

from s2core_numpy.codec import NumpyCodec


class MutatesStreamState(NumpyCodec):
    """decode_stream updates the history of the state it is given in place: a push that
    fails after it (a MemoryError later in the backend) leaves the stream off one-shot."""

    name = "broken_codec_mutates_stream_state"

    def decode_stream(self, state, codes):
        audio, new = super().decode_stream(state, codes)
        state.history.update(new.history)
        return audio, new


class NoEncoder(NumpyCodec):
    """Declares encode=False, honestly: the kit must skip what needs an encoder."""

    name = "broken_codec_without_encoder"

    @property
    def capabilities(self):
        return dataclasses.replace(super().capabilities, encode=False)
