"""s2core's products against ggml's own CPU backend: the ground truth of arithmetic="ggml".

    cmake -B build -DGGML_NATIVE=ON && cmake --build build --target ggml-cpu   # in a ggml checkout
    python benchmarks/ggml_products/compare.py /path/to/ggml [commit]   # -> benchmarks/results/

mm.c multiplies a weight of each type (random values quantized by gguf / s2core's K-quant
writer) by float32 activation rows with ggml_mul_mat, as s2.cpp's graph does; this script
compares the NumPy backend's arithmetic="ggml" and "f32" and the kit's float64 transcription
with it, as max |out - ggml| / max |ggml|. tests/test_ggml_products.py runs it when
$S2CORE_GGML_DIR names such a checkout.
"""

from __future__ import annotations

import json
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import gguf
import numpy as np
from gguf import GGMLQuantizationType as QT

from s2core.embedded.kquants import quantize_k
from s2core.kit.ggml_arithmetic import block_mins_of, ggml_product
from s2core.plugin import block_shape

TYPES = [QT.Q8_0, QT.Q4_0, QT.Q5_0, QT.Q4_1, QT.Q5_1, QT.Q2_K, QT.Q3_K, QT.Q4_K, QT.Q5_K,
         QT.Q6_K, QT.F16]
HERE = Path(__file__).parent


def build(ggml_dir: Path, out: Path) -> Path:
    """Compile mm.c against a ggml checkout's build (build/ or build0/)."""
    lib = next(p.parent for p in sorted(ggml_dir.glob("build*/src/libggml-cpu.so")))
    binary = out / "mm"
    subprocess.run(["cc", "-O1", "-o", str(binary), str(HERE / "mm.c"),
                    f"-I{ggml_dir / 'include'}", f"-L{lib}", "-lggml-cpu", "-lggml-base",
                    f"-Wl,-rpath,{lib}"], check=True)
    return binary


class _OneTensor:
    """What the NumPy backend's WeightLoader reads of a file, for one tensor."""

    def __init__(self, qtype, raw, w64):
        self.qtype, self.raw_bytes, self.w64 = qtype, raw, w64

    def info(self, name):
        return type("Info", (), {"type": self.qtype})()

    def raw(self, name):
        return self.raw_bytes.view(np.uint8).reshape(self.w64.shape[0], -1)

    def release(self, name):
        pass

    def dequantize(self, name, dtype, release=False):
        return self.w64.astype(dtype)


def compare(binary: Path, rows_list=(1, 4, 24), n_out: int = 128, n_in: int = 1024) -> list[dict]:
    from s2core_numpy.weights import WeightLoader, linear
    work = Path(tempfile.mkdtemp(prefix="s2core-ggml-"))
    results = []
    for qtype in TYPES:
        rng = np.random.default_rng(int(qtype))
        w = rng.standard_normal((n_out, n_in)).astype(np.float32)
        raw = np.ascontiguousarray(quantize_k(w, qtype) if qtype.name.endswith("_K")
                                   else gguf.quants.quantize(w, qtype))
        w64 = gguf.quants.dequantize(raw, qtype).astype(np.float64).reshape(n_out, n_in)
        raw.tofile(work / "w.bin")
        mins = (block_mins_of(raw.view(np.uint8).reshape(n_out, -1), block_shape(qtype)[1])
                if qtype in (QT.Q4_1, QT.Q5_1) else None)
        for rows in rows_list:
            x = (rng.standard_normal((rows, n_in))
                 * rng.choice([0.1, 1, 10], (rows, n_in))).astype(np.float32)
            x.tofile(work / "x.bin")
            subprocess.run([str(binary), str(int(qtype)), str(n_in), str(n_out), str(rows),
                            str(work / "w.bin"), str(work / "x.bin"), str(work / "y.bin")],
                           check=True)
            y = np.fromfile(work / "y.bin", np.float32).reshape(rows, n_out)
            scale = float(np.abs(y).max())
            row = {"type": qtype.name, "rows": rows}
            for arithmetic in ("ggml", "f32"):
                m = WeightLoader(_OneTensor(qtype, raw, w64), True, arithmetic).matrix("w")
                row[f"numpy_{arithmetic}"] = float(np.abs(linear(x, m) - y).max()) / scale
            row["kit_reference"] = float(np.abs(ggml_product(x, w64, qtype, mins) - y).max()) / scale
            results.append(row)
    return results


def main() -> None:
    ggml_dir = Path(sys.argv[1])
    with tempfile.TemporaryDirectory() as tmp:
        rows = compare(build(ggml_dir, Path(tmp)))
    commit = (sys.argv[2] if len(sys.argv) > 2 else  # a source tree without .git: say it
              subprocess.run(["git", "-C", str(ggml_dir), "rev-parse", "HEAD"],
                             capture_output=True, text=True, check=False).stdout.strip()
              or "unknown")
    flags = next((line.split(":")[1].split() for line in
                  Path("/proc/cpuinfo").read_text().splitlines() if line.startswith("flags")), [])
    report = {"ggml": str(ggml_dir), "ggml_commit": commit, "machine": platform.machine(),
              "cpu_flags": sorted(f for f in flags if f.startswith(("avx", "fma", "f16c"))),
              "relative_to_max_ggml_output": rows}
    for r in rows:
        print(f"{r['type']:5s} rows={r['rows']:3d}  numpy ggml {r['numpy_ggml']:.1e}  "
              f"numpy f32 {r['numpy_f32']:.1e}  kit reference {r['kit_reference']:.1e}")
    out = Path("benchmarks/results")
    out.mkdir(parents=True, exist_ok=True)
    (out / f"ggml-products-{time.strftime('%Y%m%d-%H%M')}.json").write_text(
        json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
