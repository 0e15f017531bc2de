"""`s2core bench --codec`: the FLOP count of S2 Pro's structure, and a quick real run."""

from __future__ import annotations

import json

import pytest

from s2core.benchmarking.codec import decode_flops
from s2core.embedded.codec_writer import s2pro_codec_config


def test_s2pro_decode_costs_about_140_gflop_per_second_of_audio():
    cfg = s2pro_codec_config()
    frames = 43
    per_audio_s = decode_flops(cfg.layout(), frames) / (frames * 2048 / 44100)
    assert 135e9 < per_audio_s < 150e9
    # the decoder's residual units dominate: they alone are ~117 GFLOP a second of audio
    assert decode_flops(cfg.layout(), 2 * frames) == pytest.approx(2 * decode_flops(cfg.layout(), frames),
                                                                  rel=0.01)


def test_quick_codec_bench_writes_its_report(tmp_path, monkeypatch, capsys):
    pytest.importorskip("psutil")
    from s2core.benchmarking.cli import main
    monkeypatch.setenv("S2CORE_CACHE", str(tmp_path / "cache"))
    assert main(["--codec", "--quick", "--backends", "numpy", "--frames", "2", "--far-frame", "12",
                 "--out", str(tmp_path / "out")]) == 0
    report = json.loads(next((tmp_path / "out").glob("bench-codec-*.json")).read_text())
    (r,) = report["results"]
    assert r["backend"] == "numpy" and r["status"] == "ok"
    assert set(r["stream_frame_s"]) == {"10", "12"} and r["audio_s_per_s"] > 0
    assert 0 < r["of_sgemm_peak"] < 2
    assert "| numpy |" in (next((tmp_path / "out").glob("bench-codec-*.md")).read_text())
