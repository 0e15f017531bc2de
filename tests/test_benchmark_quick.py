"""The benchmark's --quick mode end to end on the NumPy backend: files written, fields sane.

Nothing here compares a time with a threshold: a slow or busy machine must still pass.
"""

from __future__ import annotations

import json
import os

import pytest

for _module in ("matplotlib", "psutil", "threadpoolctl"):
    pytest.importorskip(_module, reason=f"{_module} is needed by the benchmark (s2core[bench] extra)")

from s2core.benchmarking.cli import main  # noqa: E402

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(scope="module")
def quick_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("bench-out")
    models = tmp_path_factory.mktemp("bench-models")
    rc = main(["--quick", "--backends", "numpy", "--out", str(out), "--model-dir", str(models)])
    jsons = list(out.glob("*.json"))
    assert len(jsons) == 1, f"expected one JSON in {out}: {list(out.iterdir())}"
    return rc, out, json.loads(jsons[0].read_text())


def test_quick_run_succeeds_and_writes_all_outputs(quick_run):
    rc, out, report = quick_run
    assert rc == 0
    stems = {p.suffix: p for p in out.iterdir()}
    assert set(stems) == {".json", ".png", ".md"}
    assert stems[".png"].read_bytes()[:8] == PNG_SIGNATURE
    assert stems[".png"].stat().st_size > 10_000  # a drawn chart, not an empty canvas
    assert "Decode step" in stems[".md"].read_text()


def test_report_describes_machine_and_software(quick_run):
    _, _, report = quick_run
    m = report["machine"]
    assert m["cpu_model"] and m["cpus_usable"] >= 1 and m["ram_bytes"] > 0
    assert m["versions"]["numpy"] and m["versions"]["gguf"]
    assert isinstance(m["blas"], list)
    assert report["config"]["quick"] is True and report["config"]["seed"] == 0
    assert report["machine_tag"]


def test_bandwidth_and_floors_are_positive(quick_run):
    _, _, report = quick_run
    bw = report["bandwidth"]
    assert bw["copy_gbps"] > 0 and bw["read_gbps"] > 0
    # sampled at the start, before each backend run and at the end
    assert [b["when"] for b in bw["samples"]][::len(bw["samples"]) - 1] == ["start", "end"]
    assert len(bw["samples"]) == 2 + len(report["results"])
    assert all(b["gemv_f32_gbps"] > 0 and b["dot_f64_gbps"] > 0 for b in bw["samples"])
    assert set(report["models"]) == {"f32", "f16", "q8_0"}
    for m in report["models"].values():
        assert 0 < m["step_read_bytes"] < m["weight_bytes"] <= m["file_bytes"]
        for key in ("step_floor_ms", "step_read_floor_ms", "fast_floor_ms", "fast_read_floor_ms",
                    "prefill_flops"):
            assert m[key] > 0, key
    # f32 streams the most bytes, q8_0 the fewest: the floors follow the weight type
    floors = {t: m["step_floor_ms"] for t, m in report["models"].items()}
    assert floors["f32"] > floors["f16"] > floors["q8_0"]


def test_every_result_has_sane_timings_and_ratios(quick_run):
    _, _, report = quick_run
    cfg = report["config"]
    results = report["results"]
    assert [(r["backend"], r["weight_type"]) for r in results] == \
        [("numpy", t) for t in ("f32", "f16", "q8_0")]
    for r in results:
        assert r["status"] == "ok", r.get("traceback") or r.get("error")
        assert r["load_s"] > 0
        dec = r["decode"]
        assert dec["n"] >= min(cfg["min_reps"], cfg["steps"]) and len(dec["times_ms"]) == dec["n"]
        assert 0 < dec["min_ms"] <= dec["median_ms"] <= dec["max_ms"] and dec["iqr_ms"] >= 0
        assert r["context"] == cfg["context"]
        assert r["prefill"]["median_ms"] > 0 and r["prefill"]["n_tokens"] == cfg["prefill_tokens"]
        assert r["fast"]["median_ms"] > 0 and r["fast"]["calls_per_frame"] == 9
        d = r["derived"]
        for key in ("step_floor_ms", "step_ratio_to_floor", "step_read_floor_ms",
                    "step_ratio_to_read_floor", "step_ratio_to_resident_floor",
                    "step_ratio_to_best", "step_effective_gbps", "prefill_tokens_per_s",
                    "prefill_gflops", "fast_ratio_to_floor", "fast_ratio_to_read_floor",
                    "kv_cache_bytes", "child_read_gbps", "step_ratio_to_child_read_floor",
                    "step_ratio_to_sum_floor", "step_ratio_to_sum_floor_beside"):
            assert d[key] > 0, key
        # the steps beside their own sum samples: as many as asked, each with its sample
        beside = r["decode_beside"]
        assert len(beside["step_ms"]) == len(beside["sum_gbps"]) == cfg["beside_steps"] > 0
        assert min(beside["step_ms"]) > 0 and min(beside["sum_gbps"]) > 0
        assert d["step_ratio_to_best"] == pytest.approx(1.0)  # the only backend is the best
        mem = r["memory"]
        assert mem["after_load"]["rss"] > 0 and mem["end"]["peak"] >= mem["end"]["rss"] > 0
        assert r["runtime"]["threadpools"] is not None
        assert dec["others_cpu_share"] is None or 0 <= dec["others_cpu_share"] <= 1
        assert dec["cpu_per_wall"] > 0
        assert r["bandwidth_before"]["copy_gbps"] > 0


def test_widening_is_accounted(quick_run):
    """Without numba NumPy widens f16 and q8_0 to float32: it streams more bytes than the file
    holds. With numba it keeps them: it streams the file's bytes (q8_0 with float32 scales)."""
    _, _, report = quick_run
    by_type = {r["weight_type"]: r for r in report["results"]}
    f32_bytes = by_type["f32"]["derived"]["resident_step_bytes"]
    assert f32_bytes == report["models"]["f32"]["step_read_bytes"]
    for t in ("f16", "q8_0"):
        caps = by_type[t]["capabilities"]
        held = by_type[t]["derived"]["resident_step_bytes"]
        file_bytes = report["models"][t]["step_read_bytes"]
        if t in caps["native_weight_types"]:
            per_file_byte = dict(caps["native_weight_overhead"]).get(t, 1.0)
            assert per_file_byte == {"f16": 1.0, "q8_0": 36 / 34}[t]
            assert held == pytest.approx(per_file_byte * file_bytes, rel=1e-6)
        else:
            assert held == f32_bytes > file_bytes


def test_render_rewrites_chart_and_summary_from_json(quick_run, tmp_path, capsys):
    _, out, report = quick_run
    copy = tmp_path / "earlier.json"
    copy.write_text(json.dumps(report))
    assert main(["--render", str(copy)]) == 0
    assert (tmp_path / "earlier.png").read_bytes()[:8] == PNG_SIGNATURE
    assert "Decode step" in (tmp_path / "earlier.md").read_text()
    assert "Decode step" in capsys.readouterr().out


def test_voice_case_quick_run(tmp_path):
    """`s2core bench --case voice --quick`: cold prompt vs restored prefix, both through the
    real stream, in a child process; figures consistent (no time is compared with a bound)."""
    rc = main(["--case", "voice", "--quick", "--backends", "numpy", "--out", str(tmp_path / "out"),
               "--model-dir", str(tmp_path / "models")])
    assert rc == 0
    [path] = (tmp_path / "out").glob("voice-*.json")
    report = json.loads(path.read_text())
    p = report["prompt"]
    assert p["reference_frames"] == 215 and p["text_tokens"] == 40
    assert p["prefix_positions"] > 215 and p["rest_positions"] > 40
    [r] = report["results"]
    assert r["status"] == "ok" and r["backend"] == "numpy"
    cold, warm = r["cold"], r["warm"]
    assert cold["restored_positions"] == 0 and cold["prefilled_positions"] == r["prompt_positions"]
    assert warm["restored_positions"] == p["prefix_positions"]
    assert warm["prefilled_positions"] == p["rest_positions"] and not warm["recomputed"]
    for case in (cold, warm):
        assert 0 < case["prefill_ms"] <= case["prompt_ms"] < case["first_frame_ms"]
    assert r["prompt_ratio"] == warm["prompt_ms"] / cold["prompt_ms"]
    assert "prompt ratio" in path.with_suffix(".md").read_text()


def test_batch_case_quick_run(tmp_path):
    """`s2core bench --case batch --quick`: B concurrent requests through the real server in a
    child process; the frames counted are B x the timed frames, the chart is written."""
    rc = main(["--case", "batch", "--quick", "--backends", "numpy,example", "--types", "f16",
               "--frames", "3", "--out", str(tmp_path / "out"),
               "--model-dir", str(tmp_path / "models")])
    assert rc == 0
    [path] = (tmp_path / "out").glob("batch-*.json")
    report = json.loads(path.read_text())
    assert report["sizes"] == [1, 2] and report["frames"] == 3
    by_backend = {r["backend"]: r for r in report["results"]}
    assert set(by_backend) == {"numpy", "example"}
    for r in report["results"]:
        assert r["status"] == "ok", r.get("error")
        assert [row["sequences"] for row in r["sizes"]] == [1, 2]
        for row in r["sizes"]:
            # every request's timed frames (served in turns, the later requests' first frames
            # fall in the timed part too)
            assert row["sequences"] * report["frames"] * row["rounds"] <= row["frames"] \
                <= row["sequences"] * (report["frames"] + 1) * row["rounds"]
            assert row["frames_per_s"] > 0 and row["speedup"] > 0
    assert by_backend["numpy"]["sizes"][1]["sequences_per_call"] == 2
    # the child says which kernels ran: this machine's, unless the caller named another CPU
    assert by_backend["numpy"]["numba_target"]["cpu_name"] == \
        (os.environ.get("NUMBA_CPU_NAME") or "host")
    assert by_backend["example"]["sizes"][1]["sequences_per_call"] == 1  # served in turns
    assert path.with_suffix(".png").read_bytes().startswith(PNG_SIGNATURE)
    assert "frames/s" in path.with_suffix(".md").read_text()


def test_batch_case_avx2_build(tmp_path, monkeypatch):
    """`--avx2`: the children compile numba's kernels for a Haswell (the code AVX2-only CPUs
    run) and say so; the files are tagged -avx2 and name the build; the caller's environment
    is left as it was."""
    from s2core.benchmarking.machine import cpu_flags
    if "avx2" not in cpu_flags():
        pytest.skip("this CPU cannot run the AVX2 build")
    for key in ("NUMBA_CPU_NAME", "NUMBA_CPU_FEATURES"):
        monkeypatch.delenv(key, raising=False)
    rc = main(["--case", "batch", "--quick", "--avx2", "--backends", "numpy", "--types",
               "q8_0", "--frames", "2", "--out", str(tmp_path / "out"),
               "--model-dir", str(tmp_path / "models")])
    assert rc == 0
    [path] = (tmp_path / "out").glob("batch-*.json")
    assert path.stem.endswith("-avx2-quick")
    report = json.loads(path.read_text())
    [result] = report["results"]
    assert result["status"] == "ok", result.get("error")
    assert result["numba_target"] == {"cpu_name": "haswell", "build": "avx2"}
    assert report["machine"]["env"]["NUMBA_CPU_NAME"] == "haswell"
    text = path.with_suffix(".md").read_text()
    assert "the AVX2 build" in text and "CPU flags: " in text
    assert "NUMBA_CPU_NAME" not in os.environ and "NUMBA_CPU_FEATURES" not in os.environ


def test_avx2_refused_where_the_cpu_cannot_run_it(tmp_path, capsys, monkeypatch):
    from s2core.benchmarking import cli
    monkeypatch.setattr(cli, "cpu_flags", lambda: ["asimd", "fphp"])  # an ARM server's
    rc = main(["--case", "batch", "--avx2", "--out", str(tmp_path / "out")])
    assert rc == 2
    assert "--avx2 builds the AVX2 code, which this CPU cannot run" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("option", ["--frames", "--rounds"])
def test_batch_case_refuses_a_count_below_one(option, tmp_path, capsys):
    rc = main(["--case", "batch", option, "0", "--out", str(tmp_path / "out")])
    assert rc == 2
    assert "--frames and --rounds must be positive" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def test_http_case_quick_run(tmp_path):
    """`s2core bench --case http --quick`: streaming clients over a real local HTTP server
    against the same requests in process, in a child process; every path made the same
    frames and the first audio came."""
    pytest.importorskip("fastapi", reason="the http case needs s2core[serve]")
    pytest.importorskip("httpx", reason="the http case's clients need httpx (s2core[test])")
    rc = main(["--case", "http", "--quick", "--backends", "numpy",
               "--out", str(tmp_path / "out"), "--model-dir", str(tmp_path / "models")])
    assert rc == 0
    [path] = (tmp_path / "out").glob("http-*.json")
    report = json.loads(path.read_text())
    [result] = report["results"]
    assert result["status"] == "ok", result.get("error")
    assert [row["clients"] for row in result["clients"]] == [1, 4]
    for row in result["clients"]:
        assert row["same_frames"] and row["frames"] > 0
        assert 0 < row["first_audio_p50_s"] <= row["first_audio_p95_s"]
        assert row["http_frames_per_s"] > 0 and row["codes_frames_per_s"] > 0
    assert path.with_suffix(".png").read_bytes().startswith(PNG_SIGNATURE)


def test_e2e_case_quick_run(tmp_path):
    """`s2core bench --case e2e --quick`: the sentence spoken with a voice restored from its
    files on the backend load() picks, the codec in the same file; the floor's parts add up,
    the split of the sentence's time stays inside its wall time (no time compared with a
    bound)."""
    import s2core
    from s2core.benchmarking import e2e

    rc = main(["--case", "e2e", "--quick", "--out", str(tmp_path / "out"),
               "--model-dir", str(tmp_path / "models")])
    assert rc == 0
    [path] = (tmp_path / "out").glob("e2e-*.json")
    report = json.loads(path.read_text())
    [r] = report["results"]
    assert r["status"] == "ok", r.get("error")
    assert r["weight_type"] == "q4_k_m"
    [model_file] = (tmp_path / "models").glob("model-q4_k_m-*.gguf")
    assert r["backend"] == s2core.default_backend(str(model_file))
    v = r["voice"]
    assert v["prefix_positions"] > 215 and v["text_positions"] > v["sentence_tokens"] > 10
    assert len(r["first_audio_runs"]) == 2
    for run in r["first_audio_runs"]:
        assert run["restored_positions"] == v["prefix_positions"]
        assert run["prefilled_positions"] == v["text_positions"]
        assert 0 < run["prefill_ms"] + run["fast_ar_ms"] + run["codec_push_ms"] \
            < run["first_audio_ms"]

    floor = r["floor"]
    assert all(floor[k] > 0 for k in e2e.FLOOR_PARTS)
    assert floor["total_ms"] == pytest.approx(sum(floor[k] for k in e2e.FLOOR_PARTS))
    assert r["first_audio_ratio"] == pytest.approx(r["first_audio"]["first_audio_ms"]
                                                   / floor["total_ms"])
    assert len(r["sgemm_gflops"]) == 2 and min(r["sgemm_gflops"]) > 0

    s = r["sentence"]
    assert s["frames"] == e2e.QUICK_FRAMES and s["stopped_by"] == "max_new_tokens"
    assert s["audio_s"] == pytest.approx(s["samples"] / 44100) and s["samples"] > 0
    seconds = s["seconds"]
    assert all(seconds[k] > 0 for k in e2e.SPLIT_PARTS)
    # the parts are timed inside the wall time, each once: what they leave is >= 0, and here
    # (a synthesis, no I/O to wait for) a small part of it
    assert 0 <= seconds["other"] < 0.5 * seconds["total"]
    assert seconds["total"] == pytest.approx(sum(seconds[k] for k in e2e.SPLIT_PARTS)
                                             + seconds["other"])
    assert s["per_audio_s"]["total"] == pytest.approx(seconds["total"] / s["audio_s"])
    text = path.with_suffix(".md").read_text()
    assert "time to first audio" in text and "CPU flags:" in text


def test_batch_report_judges_load_pick_against_the_fastest():
    """The batch case's verdict on load()'s pick: the fastest at every size, or a bug."""
    from s2core.benchmarking.batch import choice_lines

    def result(backend, fps):
        return {"backend": backend, "weight_type": "f16", "status": "ok",
                "sizes": [{"sequences": b, "frames_per_s": f} for b, f in zip((1, 4), fps)]}

    report = {"sizes": [1, 4], "picks": {"f16": "numpy"},
              "results": [result("numpy", (1.0, 3.0)), result("torch", (0.8, 2.0))]}
    assert "| f16 | numpy | numpy | numpy | the fastest |" in choice_lines(report)
    report["results"][1] = result("torch", (0.8, 3.5))  # torch batches faster: a bad pick
    assert "| f16 | numpy | numpy | torch | slower than another: a bug in selection.py |" \
        in choice_lines(report)
    report["results"] = report["results"][:1]
    assert any("not compared" in line for line in choice_lines(report))


def test_gemv_probe_samples_and_gives_blas_its_threads_back():
    """The floor sampled beside each step (benchmarks/arithmetic.py) holds BLAS to one
    thread only while it reads: a limit left behind would slow every later product."""
    from threadpoolctl import threadpool_info

    from s2core.benchmarking.bandwidth import GemvProbe

    before = [lib["num_threads"] for lib in threadpool_info() if lib["user_api"] == "blas"]
    probe = GemvProbe(8)
    try:
        samples = [probe.sample() for _ in range(3)]
    finally:
        probe.close()
    assert all(0 < s < 10_000 for s in samples), samples  # GB/s: read, not skipped
    after = [lib["num_threads"] for lib in threadpool_info() if lib["user_api"] == "blas"]
    assert after == before
