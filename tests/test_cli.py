"""The `s2core` command, through its installed console script where it matters."""

from __future__ import annotations

import json
import subprocess


from s2core.cli.main import main
from s2core.testing.commands import s2core_executable


def test_backends_lists_numpy_with_capabilities(capsys):
    assert main(["backends"]) == 0
    out = capsys.readouterr().out
    assert "numpy" in out and "keeps as stored: f32" in out and "default" in out
    assert main(["backends", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert any(r["name"] == "numpy" and r["available"] for r in rows)


def test_info_reports_types_and_memory(tiny_model, capsys):
    assert main(["info", str(tiny_model), "--ctx", "100"]) == 0
    out = capsys.readouterr().out
    assert "head_dim                    32" in out
    assert "f32" in out and "KV cache at 100 positions" in out
    # 2 layers x 100 positions x 1 kv head x 32 x 2 (K,V) x 2 bytes = 25.6 kB
    assert "f16 0.03 MB" in out


def test_info_shows_per_type_kept_or_widened_and_bytes_held(capsys):
    """A mixed q4_k_m file: each backend's line per tensor type says kept or widened and the
    bytes held, which are the file's for a kept type and the widened type's for the rest."""
    import s2core
    from s2core.modelfile.file import ModelFile
    from s2core.kit.models import kit_model
    from s2core.runtime.memory import holdings
    path = kit_model("mha-k", "q4_k_m")
    assert main(["info", str(path)]) == 0
    out = capsys.readouterr().out
    mf = ModelFile(path)
    for row in s2core.list_backends():
        caps = row.capabilities
        if caps is None:
            continue
        held = holdings(mf, caps)
        assert {h.type_name for h in held} == {"f32", "q4_k", "q6_k"}
        for h in held:
            kept = h.type_name in caps.native_weight_types
            assert h.kept == kept
            n_values = sum(t.n_elements for t in mf.model_tensors() if t.type_name == h.type_name)
            widened = n_values * {"f32": 4, "f16": 2, "bf16": 2}[caps.widened_weight_dtype]
            if kept:  # (each tensor's count is truncated to whole bytes)
                factor = caps.held_bytes_per_file_byte(h.type_name)
                assert abs(h.held_bytes - h.file_bytes * factor) <= h.n_tensors
            else:
                assert h.held_bytes == widened
            how = "kept as stored" if kept else f"widened to {caps.widened_weight_dtype}"
            assert any(line.split()[:1] == [h.type_name] and how in line
                       for line in out.splitlines()), (row.name, h.type_name)
    numpy_caps = next(r for r in s2core.list_backends() if r.name == "numpy").capabilities
    if "q4_k" in numpy_caps.native_weight_types:  # with numba: the file's bytes, every type
        assert all(h.kept and h.held_bytes == h.file_bytes for h in holdings(mf, numpy_caps))
    mf.close()


def test_info_on_a_bad_file_is_a_clean_error(tmp_path, capsys):
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"nope")
    assert main(["info", str(bad)]) == 2
    assert "s2core: error:" in capsys.readouterr().err


def test_demo_runs_through_the_console_script(tmp_path):
    exe = s2core_executable()
    env = {"S2CORE_CACHE": str(tmp_path), "PATH": "/usr/bin:/bin",
           "S2CORE_BACKEND": "numpy"}
    out = subprocess.run([exe, "demo", "--steps", "4"], capture_output=True, text=True,
                         env=env, timeout=300, cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    assert "backend      numpy" in out.stdout
    assert "generated    4 frames" in out.stdout
    assert list(tmp_path.glob("demo-f16-*.gguf"))
    # the demo ends in speech: 4 frames of 2048 samples at 44.1 kHz, decoded as they came
    import wave
    with wave.open(str(tmp_path / "s2core-demo.wav"), "rb") as w:
        assert (w.getframerate(), w.getnchannels(), w.getsampwidth()) == (44100, 1, 2)
        assert w.getnframes() == 4 * 2048
    assert "first audio" in out.stdout
