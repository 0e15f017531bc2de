"""The codec tests every backend that provides a codec passes, as a base class a third party
subclasses (the same way as `BackendConformance`):

    from s2core.kit.codec_conformance import CodecConformance
    class TestMyCodec(CodecConformance):
        pass            # with s2core's pytest plugin: every registered backend

Numbers are compared with the float64 reference of CODEC.md (`codec_reference`) as the
largest absolute difference of the audio (CODEC.md's measure; audio lies in [-1, 1]), against
a bound set by the backend's declared codec precision. Backends that provide no codec are
skipped with that reason.
"""

from __future__ import annotations

import copy
import dataclasses
from typing import Any

import numpy as np
import pytest

import s2core
from s2core.codec import CodecClosedError
from s2core.errors import BackendOutOfMemoryError, InvalidInputError

from s2core.kit.codec_models import (CODEC_IDS, example_codes_audio, example_path,
                           kit_codec, kit_codec_reference, random_audio, random_codes)
from s2core.kit.tolerances import CODEC_NEAR_TIE, codec_stream_tolerance, codec_tolerance

CODEC_STATE_KEPT = "codec-stream-state-is-never-modified"
#: the codec rules a rule test of this module checks (the rest: see s2core/kit/catalog.py)
CODEC_RULES = {
    CODEC_STATE_KEPT: "decode_stream leaves the state it is given unchanged (it returns a new "
                      "one), so a push that fails inside the backend leaves the stream where "
                      "it was: the next push gives one-shot decode's samples",
}

#: push sizes of the uneven streaming test (frames)
UNEVEN_PUSHES = (1, 3, 2, 1, 4)


def max_abs(out: np.ndarray, ref: np.ndarray) -> float:
    return float(np.max(np.abs(np.asarray(out, np.float64) - np.asarray(ref, np.float64))))


def assert_audio_close(out: np.ndarray, ref: np.ndarray, tol: float, what: str) -> None:
    assert out.dtype == np.float32, f"{what}: audio dtype {out.dtype}, expected float32"
    assert out.shape == ref.shape, f"{what}: audio shape {out.shape}, expected {ref.shape}"
    assert np.all(np.isfinite(out)), f"{what}: non-finite samples"
    err = max_abs(out, ref)
    assert err <= tol, f"{what}: max |out - ref| = {err:.3e} > {tol:.1e}"


class CodecConformance:
    """Needs a `backend` fixture (a registered backend's name)."""

    @pytest.fixture
    def codec_options(self) -> dict[str, Any]:
        """Options passed to every load_codec(); override to test a non-default setup."""
        return {}

    @pytest.fixture
    def open_codec(self, backend, codec_options):
        """open_codec(path) -> a Codec on this backend, closed afterwards."""
        info = s2core.get_registry().info(backend)
        if not info.codec_class and (info.capabilities is None or info.capabilities.codec is None):
            pytest.skip(f"{backend}: provides no codec")
        opened = []

        def _open(path, **options):
            c = s2core.load_codec(path, backend=backend, **{**codec_options, **options})
            opened.append(c)
            return c
        yield _open
        for c in opened:
            c.close()

    # ------------------------------------------------------------ declaration
    def test_codec_is_declared_by_probe_and_plugin(self, backend, open_codec):
        """Rule: a backend provides a codec through both its plugin (BackendSpec.codec_class)
        and its probe (Capabilities.codec); the loaded codec says what the probe said."""
        info = s2core.get_registry().info(backend)
        assert info.codec_class, (f"{backend}: the probe declares a codec but the plugin names "
                                  "no codec_class")
        assert info.capabilities is not None and info.capabilities.codec is not None, (
            f"{backend}: the plugin names {info.codec_class} but the probe declares no "
            "Capabilities.codec")
        c = open_codec(example_path())
        caps, declared = c.capabilities, info.capabilities.codec
        assert c.backend_name == backend
        assert (caps.streaming, caps.encode, caps.compute_dtype) == (
            declared.streaming, declared.encode, declared.compute_dtype), (
            f"{backend}: loaded codec capabilities {caps} differ from the probe's {declared}")
        assert caps.streaming == c.backend.streams, (
            f"{backend}: declares streaming={caps.streaming} but "
            f"{'does not implement' if caps.streaming else 'implements'} decode_stream")

    # ------------------------------------------------------------ numbers
    def test_shared_example(self, open_codec):
        """The reference decoder's own output for the shared tiny codec (CODEC.md's example)."""
        codes, audio = example_codes_audio()
        c = open_codec(example_path())
        assert (c.sample_rate, c.samples_per_frame, c.num_codebooks) == (44100, 32, 10)
        assert_audio_close(c.decode(codes), audio, codec_tolerance(c.capabilities), "shared example")

    @pytest.mark.parametrize("name", CODEC_IDS)
    def test_decode_matches_reference(self, open_codec, name):
        c = open_codec(kit_codec(name))
        codes = random_codes(name)
        ref = kit_codec_reference(name).decode(codes)
        out = c.decode(codes)
        assert out.shape == (codes.shape[1] * c.samples_per_frame,)
        assert np.std(ref) > 0.05, "the kit's codec should make audible noise"
        assert_audio_close(out, ref, codec_tolerance(c.capabilities), f"{name} decode")

    def test_both_containers_decode_alike(self, open_codec):
        """The same codec in a full file (c. prefix) and a codec-only file."""
        name = "window-lt-T-f16-full"
        codes = random_codes(name, seed=4)
        full = open_codec(kit_codec(name, codec_only=False)).decode(codes)
        only = open_codec(kit_codec(name, codec_only=True)).decode(codes)
        np.testing.assert_array_equal(full, only)

    def test_out_of_range_codes_are_clamped(self, open_codec):
        """CODEC.md 4.1: negatives to 0, too large to size - 1, per codebook (semantic apart)."""
        name = "window-lt-T-f16-full"
        c = open_codec(kit_codec(name))
        codes = random_codes(name, n_frames=6, seed=5).astype(np.int64)
        wild = codes.copy()
        wild[0, 0], wild[0, 1] = -5, c.codebook_sizes[0] + 100       # semantic
        wild[3, 2], wild[9, 3] = -(2 ** 40), c.codebook_sizes[3]      # residual
        clamped = codes.copy()
        clamped[0, 0], clamped[0, 1] = 0, c.codebook_sizes[0] - 1
        clamped[3, 2], clamped[9, 3] = 0, c.codebook_sizes[3] - 1
        np.testing.assert_array_equal(c.decode(wild), c.decode(clamped))
        ref = kit_codec_reference(name).decode(clamped)
        assert_audio_close(c.decode(wild.astype(np.int16)), ref, codec_tolerance(c.capabilities),
                           "clamped int16 codes")

    # ------------------------------------------------------------ streaming
    @pytest.mark.parametrize("name", CODEC_IDS)
    def test_streaming_equals_one_shot(self, open_codec, name):
        """Frames pushed one at a time, or in uneven groups, give the one-shot samples."""
        c = open_codec(kit_codec(name))
        codes = random_codes(name, seed=1)
        whole = c.decode(codes)
        spf = c.samples_per_frame
        tol = codec_stream_tolerance(c.capabilities)
        for pushes in ((1,) * codes.shape[1], UNEVEN_PUSHES):
            s = c.stream_decoder()
            assert s.mode == ("exact" if c.capabilities.streaming else "windowed")
            parts, start = [], 0
            for n in pushes:
                if start >= codes.shape[1]:
                    break
                part = s.push(codes[:, start:start + n])
                assert part.shape == (min(n, codes.shape[1] - start) * spf,), (
                    f"a push of {n} frames returned {part.shape[0]} samples")
                parts.append(part)
                start += n
            if start < codes.shape[1]:
                parts.append(s.push(codes[:, start:]))
            tail = s.flush()
            assert tail.shape == (0,), "flush returned samples: every op is causal"
            assert s.frames_decoded == codes.shape[1]
            assert_audio_close(np.concatenate(parts), whole, tol, f"{name} pushes {pushes}")

    def test_long_stream_equals_one_shot(self, open_codec):
        """60 frames (15 attention windows) in pushes of 3: the K/V trimmed to the window and
        the RoPE positions carried across 20 pushes give the one-shot samples."""
        name = "window-lt-T-f16-full"
        c = open_codec(kit_codec(name))
        codes = random_codes(name, n_frames=60, seed=8)
        s = c.stream_decoder()
        out = np.concatenate([s.push(codes[:, i:i + 3]) for i in range(0, 60, 3)])
        assert_audio_close(out, c.decode(codes), codec_stream_tolerance(c.capabilities),
                           "60 frames in pushes of 3")
        ref = kit_codec_reference(name).decode(codes)
        assert_audio_close(out, ref, codec_tolerance(c.capabilities), "60 frames vs reference")

    def test_stream_reset_and_empty_push(self, open_codec):
        name = "one-factor-f16"
        c = open_codec(kit_codec(name))
        codes = random_codes(name, seed=2)
        s = c.stream_decoder()
        assert s.push(codes[:, :0]).shape == (0,)
        first = s.push(codes[:, :3])
        s.push(codes[:, 3:6])
        s.reset()
        assert s.frames_decoded == 0
        np.testing.assert_allclose(s.push(codes[:, :3]), first, rtol=0, atol=1e-6)

    def test_windowed_stream(self, open_codec):
        """s2.cpp's windowed re-decoding: exact while the history covers the whole stream."""
        name = "window-lt-T-f16-full"
        c = open_codec(kit_codec(name))
        codes = random_codes(name, seed=3)
        whole = c.decode(codes)
        s = c.stream_decoder(mode="windowed", history_frames=codes.shape[1])
        out = np.concatenate([s.push(codes[:, i:i + 2]) for i in range(0, codes.shape[1], 2)])
        assert_audio_close(out, whole, codec_stream_tolerance(c.capabilities), "windowed, full history")
        short = c.stream_decoder(mode="windowed", history_frames=2)
        approx = np.concatenate([short.push(codes[:, i:i + 1]) for i in range(codes.shape[1])])
        assert approx.shape == whole.shape and np.all(np.isfinite(approx))
        np.testing.assert_allclose(approx[:3 * c.samples_per_frame], whole[:3 * c.samples_per_frame],
                                   rtol=0, atol=codec_stream_tolerance(c.capabilities))

    def test_failed_push_leaves_stream_unchanged(self, open_codec):
        name = "gqa-window-gt-T-f32"
        c = open_codec(kit_codec(name))
        codes = random_codes(name, seed=6)
        s = c.stream_decoder()
        parts = [s.push(codes[:, :4])]
        for bad, check in ((codes[:-1, 4:6], "codes_shape"), (codes[:, 4:6].astype(np.float32), "codes_dtype"),
                           (codes[:, 4], "codes_shape")):
            with pytest.raises(InvalidInputError) as info:
                s.push(bad)
            assert info.value.check == check
            assert s.frames_decoded == 4
        parts.append(s.push(codes[:, 4:]))
        assert_audio_close(np.concatenate(parts), c.decode(codes),
                           codec_stream_tolerance(c.capabilities), "after failed pushes")

    def test_rule_codec_stream_state_is_never_modified(self, open_codec):
        name = "gqa-window-gt-T-f32"
        c = open_codec(kit_codec(name))
        if not c.capabilities.streaming:
            pytest.skip(f"{c.backend_name}: declares no exact streaming (decode_stream)")
        codes = c.check_codes(random_codes(name, seed=7))
        backend = c.backend
        _, state = backend.decode_stream(backend.begin_stream(), codes[:, :3])
        kept = copy.deepcopy(state)
        backend.decode_stream(state, codes[:, 3:5])
        where = _first_difference(state, kept, "state")
        if where is not None:
            fail_codec(CODEC_STATE_KEPT, f"expected the state passed to decode_stream "
                       f"unchanged after the call, seen {where} changed: build the new state "
                       "instead of updating the old one in place")
        # a push that fails inside the backend, after its own work
        s = c.stream_decoder(mode="exact")
        parts = [s.push(codes[:, :4])]
        original = backend.decode_stream

        def fails_late(state: Any, frames: np.ndarray) -> Any:
            original(state, frames)
            raise MemoryError("injected by the s2core kit")
        backend.decode_stream = fails_late
        try:
            s.push(codes[:, 4:6])
        except BackendOutOfMemoryError:
            pass
        except Exception as exc:  # noqa: BLE001 - the wrong kind breaks the rule too
            fail_codec(CODEC_STATE_KEPT, f"expected BackendOutOfMemoryError from a push whose "
                       f"decode_stream raised MemoryError, seen {exc!r}")
        finally:
            del backend.decode_stream
        parts.append(s.push(codes[:, 4:]))
        whole, tol = c.decode(codes), codec_stream_tolerance(c.capabilities)
        err = max_abs(np.concatenate(parts), whole)
        if err > tol:
            fail_codec(CODEC_STATE_KEPT, f"expected the stream after a push that failed in the "
                       f"backend to equal one-shot decode within {tol:.1e}, seen {err:.3e}")

    # ------------------------------------------------------------ encode
    @pytest.mark.parametrize("name", CODEC_IDS)
    def test_encode_matches_reference(self, open_codec, name):
        """Codes equal the reference's wherever the choice is not a near-tie: a decision whose
        best and second-best cosines differ by less than CODEC_NEAR_TIE may go either way in
        float32, and then every later codebook of that frame may differ too (CODEC.md 5.4)."""
        c = open_codec(kit_codec(name))
        if not c.capabilities.encode:
            pytest.skip(f"{c.backend_name}: declares no codec encoder")
        audio = random_audio(name)
        ref = kit_codec_reference(name).encode(audio)
        codes = c.encode(audio)
        n_frames = -(-len(audio) // c.samples_per_frame)
        assert codes.shape == (c.num_codebooks, n_frames) and codes.dtype == np.int32
        tie = np.maximum.accumulate(ref.margins < CODEC_NEAR_TIE, axis=0)  # and all later ones
        decided = ~tie
        assert decided.mean() > 0.8, f"too many near-ties to test ({(~decided).sum()} decisions)"
        wrong = np.argwhere((codes != ref.codes) & decided)
        assert len(wrong) == 0, (f"{len(wrong)} codes differ from the reference away from near-"
                                 f"ties, first at (codebook, frame) {tuple(wrong[0])}")
        assert np.all((codes >= 0) & (codes < np.asarray(c.codebook_sizes)[:, None]))

    def test_encode_whole_frames_and_short_audio(self, open_codec):
        name = "one-factor-f16"
        c = open_codec(kit_codec(name))
        if not c.capabilities.encode:
            pytest.skip(f"{c.backend_name}: declares no codec encoder")
        ref = kit_codec_reference(name)
        for n in (1, c.samples_per_frame, 3 * c.samples_per_frame):
            audio = random_audio(name, n_frames=n / c.samples_per_frame, seed=n)
            codes = c.encode(audio)
            assert codes.shape == (c.num_codebooks, -(-n // c.samples_per_frame))
            expected = ref.encode(audio)
            decided = ~np.maximum.accumulate(expected.margins < CODEC_NEAR_TIE, axis=0)
            assert np.array_equal(codes[decided], expected.codes[decided]), f"{n} samples"
        assert c.encode(np.zeros(5, np.float64)).shape == (c.num_codebooks, 1)

    # ------------------------------------------------------------ bad input
    def test_bad_codes(self, open_codec):
        c = open_codec(example_path())
        codes, _ = example_codes_audio()
        cases = [(codes.astype(np.float32), "codes_dtype"), (codes.astype(bool), "codes_dtype"),
                 (codes[0], "codes_shape"), (codes[:9], "codes_shape"),
                 (codes[None], "codes_shape"), ([["a"]], "codes_dtype")]
        for bad, check in cases:
            with pytest.raises(InvalidInputError) as info:
                c.decode(bad)
            assert info.value.check == check, f"{check}: raised {info.value}"
        assert c.decode(codes[:, :0]).shape == (0,)

    def test_bad_audio(self, open_codec):
        c = open_codec(example_path())
        if not c.capabilities.encode:
            pytest.skip(f"{c.backend_name}: declares no codec encoder (encode() refuses every "
                        "audio before checking it)")
        good = np.zeros(100, np.float32)
        nan, inf = good.copy(), good.copy()
        nan[7], inf[3] = np.nan, -np.inf
        cases = [((good * 32767).astype(np.int16), "audio_dtype"), (np.zeros((2, 50), np.float32), "audio_shape"),
                 (good[:0], "audio_length"), (nan, "audio_finite"), (inf, "audio_finite")]
        for bad, check in cases:
            with pytest.raises(InvalidInputError) as info:
                c.encode(bad)
            assert info.value.check == check, f"{check}: raised {info.value}"
        with pytest.raises(InvalidInputError, match="index 7"):
            c.encode(nan)

    def test_close(self, open_codec):
        c = open_codec(example_path())
        codes, _ = example_codes_audio()
        s = c.stream_decoder()
        s.push(codes[:, :1])
        c.close()
        c.close()  # idempotent
        for call in (lambda: c.decode(codes), lambda: c.encode(np.zeros(10, np.float32)),
                     lambda: s.push(codes[:, 1:2]), c.stream_decoder):
            with pytest.raises(CodecClosedError):
                call()


def fail_codec(rule: str, message: str) -> None:
    from s2core.kit.rules import fail
    fail(rule, message, CODEC_RULES)


def _first_difference(a: Any, b: Any, where: str) -> str | None:
    """Where two states differ (a path such as "state.caches[2]"), or None when equal."""
    if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        same = (isinstance(a, np.ndarray) and isinstance(b, np.ndarray) and a.shape == b.shape
                and np.array_equal(a, b, equal_nan=a.dtype.kind in "fc"))
        return None if same else where
    if dataclasses.is_dataclass(a) and not isinstance(a, type):
        a, b = vars(a) if hasattr(a, "__dict__") else dataclasses.asdict(a), \
            vars(b) if hasattr(b, "__dict__") else dataclasses.asdict(b)
    elif hasattr(a, "__dict__") and type(a).__module__ not in ("builtins",):
        a, b = vars(a), vars(b)
    if isinstance(a, dict) and isinstance(b, dict):
        if a.keys() != b.keys():
            return where
        for key in a:
            found = _first_difference(a[key], b[key], f"{where}.{key}")
            if found:
                return found
        return None
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        if len(a) != len(b):
            return where
        for i, (x, y) in enumerate(zip(a, b)):
            found = _first_difference(x, y, f"{where}[{i}]")
            if found:
                return found
        return None
    try:
        return None if a == b else where
    except Exception:  # noqa: BLE001 - an object without equality: no verdict on it
        return None
