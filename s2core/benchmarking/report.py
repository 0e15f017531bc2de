"""The report as people read it: terminal tables, a markdown summary, and the JSON file."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from s2core.benchmarking import machine

GB = 1e9


def _fmt(value: Any, spec: str, missing: str = "-") -> str:
    return missing if value is None else format(value, spec)


def _percent(share: float | None) -> str:
    return "-" if share is None else f"{share * 100:.0f}%"


def _table(header: list[str], rows: list[list[str]]) -> list[str]:
    """Columns padded to their widest cell; first column left-aligned, the rest right."""
    widths = [max(len(r[i]) for r in [header] + rows) for i in range(len(header))]

    def line(cells: list[str]) -> str:
        return "  ".join(c.ljust(w) if i < 2 else c.rjust(w)
                         for i, (c, w) in enumerate(zip(cells, widths)))
    return [line(header), "  ".join("-" * w for w in widths)] + [line(r) for r in rows]


def _ok(report: dict[str, Any]) -> list[dict[str, Any]]:
    return [r for r in report["results"] if r["status"] == "ok"]


def decode_table(report: dict[str, Any]) -> list[str]:
    rows = []
    for r in report["results"]:
        m, d, dec = report["models"][r["weight_type"]], r.get("derived", {}), r.get("decode")
        if dec is None:
            rows.append([r["weight_type"], r["backend"], "failed"] + [""] * 15)
            continue
        rows.append([
            r["weight_type"], r["backend"], f"{dec['median_ms']:.1f}",
            f"{dec['min_ms']:.1f}-{dec['max_ms']:.1f}", f"{dec['iqr_ms']:.1f}",
            f"{dec['n']}" + ("*" if dec["capped"] else ""),
            f"{m['step_floor_ms']:.1f}", f"{d['step_ratio_to_floor']:.2f}",
            f"{m['step_read_floor_ms']:.1f}", f"{d['step_ratio_to_read_floor']:.2f}",
            _fmt(d.get("step_ratio_to_sum_floor"), ".2f"),
            _fmt(d.get("step_ratio_to_sum_floor_beside"), ".2f"),
            _fmt(d.get("step_ratio_to_resident_floor"), ".2f"),
            f"{d['step_ratio_to_best']:.2f}", f"{d['step_effective_gbps']:.1f}",
            _fmt(d.get("child_read_gbps"), ".1f"),
            f"{dec['cpu_per_wall']:.1f}", _percent(dec["others_cpu_share"])])
    return _table(["type", "backend", "step ms", "min-max", "IQR", "n", "floor ms", "x floor",
                   "read floor", "x read floor", "x sum floor", "x sum beside", "x own floor",
                   "x best", "eff. GB/s",
                   "read GB/s here", "cores", "others"], rows)


def _anon_file(d: dict[str, Any], stage: str) -> str:
    anon, file = d.get(f"rss_anon_{stage}_bytes"), d.get(f"rss_file_{stage}_bytes")
    return "-" if anon is None else f"{anon / GB:.2f}/{file / GB:.2f}"


def load_table(report: dict[str, Any]) -> list[str]:
    rows = []
    for r in report["results"]:
        m, d = report["models"][r["weight_type"]], r.get("derived", {})
        if "load_s" not in r:
            rows.append([r["weight_type"], r["backend"], "failed"] + [""] * 8)
            continue
        rows.append([
            r["weight_type"], r["backend"], f"{r['load_s']:.1f}", f"{m['file_bytes'] / GB:.2f}",
            f"{m['weight_bytes'] / GB:.2f}",
            _fmt(d.get("expected_resident_weight_bytes", 0) / GB, ".2f"),
            f"{d['weights_rss_bytes'] / GB:.2f}", _anon_file(d, "after_load"),
            _anon_file(d, "end"), _fmt(d.get("kv_cache_bytes", 0) / 2**20, ".0f"),
            _fmt(d.get("peak_bytes", d.get("load_peak_bytes", 0)) / GB, ".2f")])
    return _table(["type", "backend", "load s", "file GB", "used GB", "expected GB",
                   "RSS load GB", "load anon/file", "end anon/file", "KV MiB", "peak RSS GB"], rows)


def compute_table(report: dict[str, Any]) -> list[str]:
    rows = []
    for r in report["results"]:
        d, pre, fast = r.get("derived", {}), r.get("prefill"), r.get("fast")
        rows.append([
            r["weight_type"], r["backend"],
            _fmt(pre and pre["median_ms"], ".0f"), _fmt(pre and pre["first_ms"], ".0f"),
            _fmt(d.get("prefill_tokens_per_s"), ".0f"), _fmt(d.get("prefill_gflops"), ".1f"),
            _fmt(fast and fast["median_ms"], ".0f"), _fmt(d.get("fast_floor_ms"), ".0f"),
            _fmt(d.get("fast_ratio_to_floor"), ".2f"), _fmt(d.get("fast_ratio_to_read_floor"), ".2f")])
    return _table(["type", "backend", "prefill ms", "first ms", "tokens/s", "GFLOP/s",
                   "fast frame ms", "floor ms", "x floor", "x read floor"], rows)


def runtime_lines(report: dict[str, Any]) -> list[str]:
    """Each backend's threads and BLAS as its child process saw them (one line per backend)."""
    seen, lines = set(), []
    for r in _ok(report):
        if r["backend"] in seen:
            continue
        seen.add(r["backend"])
        rt = r.get("runtime", {})
        parts = [f"{p['internal_api']} {p.get('version') or ''} "
                 f"{('(' + p['architecture'] + ') ') if p.get('architecture') else ''}"
                 f"{p['num_threads']} threads".replace("  ", " ")
                 for p in rt.get("threadpools") or []]
        if "torch_threads" in rt:
            parts.append(f"torch.get_num_threads() = {rt['torch_threads']}")
        if "mlx_device" in rt:
            parts.append(f"mlx device {rt['mlx_device']}")
        caps = r.get("capabilities", {})
        native = ", ".join(caps.get("native_weight_types", []))
        lines.append(f"{r['backend']}: {'; '.join(parts) or 'no thread pools seen'}; computes in "
                     f"{caps.get('compute_dtype')}, keeps {native} "
                     f"weights as stored, widens others to {caps.get('widened_weight_dtype')}, "
                     f"KV cache {caps.get('kv_cache_dtype')}")
    return lines


def header_lines(report: dict[str, Any]) -> list[str]:
    cfg = report["config"]
    return [
        f"s2core benchmark, {report['created']}, machine tag {report['machine_tag']}",
        *machine.summary_lines(report["machine"]),
        f"CPU used by other processes at the start (1 s sample): "
        f"{report['others_cpu_percent_at_start']:.0f} %",
        f"model: {report['model_label']}; context {cfg['context']} positions, "
        f"{cfg['steps']} timed steps after {cfg['warmup_steps']} warm-up, prefill "
        f"{cfg['prefill_tokens']} tokens x {cfg['prefill_reps']}, Fast-AR {cfg['fast_frames']} "
        f"frames; threads: {cfg['threads'] or 'library defaults'}; seed {cfg['seed']}",
        bandwidth_line(report["bandwidth"]),
    ]


def bandwidth_line(bw: dict[str, Any]) -> str:
    copies = [b["copy_gbps"] for b in bw["samples"]]
    reads = [b["read_gbps"] for b in bw["samples"]]
    size_mib = bw["samples"][0]["bytes_each"] / 2**20
    return (f"memory bandwidth, {len(copies)} samples of {size_mib:.0f} MiB "
            f"arrays (start, before each backend, end): copy (np.copyto, read + written bytes) "
            f"{min(copies):.1f}-{max(copies):.1f} GB/s; read (BLAS float32 gemv / float64 dot) "
            f"{min(reads):.1f}-{max(reads):.1f} GB/s{_sum_range(bw)}; floors use the best: copy "
            f"{bw['copy_gbps']:.1f}, read {bw['read_gbps']:.1f} GB/s"
            + (f", sum {bw['sum_gbps']:.1f} GB/s" if "sum_gbps" in bw else ""))


def _sum_range(bw: dict[str, Any]) -> str:
    sums = [b["sum_gbps"] for b in bw["samples"] if "sum_gbps" in b]
    return (f"; sum (float32, one thread per core) {min(sums):.1f}-{max(sums):.1f} GB/s"
            if sums else "")


def legend_lines() -> list[str]:
    return [
        "step ms: median of the timed decode steps (min-max, IQR); n* = stopped by the time cap",
        "floor ms: file-type bytes of the Slow-AR layer matrices + tied embeddings / copy "
        "bandwidth; read floor: the same bytes / read bandwidth (a step only reads, and reading "
        "can stream faster than copying: the read floor is the stricter one); x sum floor: "
        "against the same bytes / the sum bandwidth (issue 10's figure, the loosest); x sum "
        "beside: the median of more steps (after the Fast-AR), each against the sum bandwidth "
        "sampled right after it (the machine's speed moves between minutes)",
        "x own floor: against the bytes the backend really streams (after widening on load), "
        "at copy bandwidth",
        "x best: against the fastest backend on the same weight type",
        "eff. GB/s: floor bytes / step time (what the step achieved as streaming); read GB/s "
        "here: read bandwidth measured in the backend's own process after its phases",
        "cores: the process's CPU time / wall time while stepping; others: share of the "
        "machine's CPU other processes took meanwhile (above ~20 % the times are inflated)",
        "used GB: bytes of the tensors s2core uses; expected GB: what the backend should hold "
        "(file bytes for the types it keeps, widened bytes for the rest)",
        "RSS load: resident after load minus before it (framework import excluded), split into "
        "anonymous copies / pages of the memory-mapped file; end: the same after prefill, decode "
        "and Fast-AR (a float32 file used in place becomes resident as it is read)",
        "peak RSS: highest resident set of the child (load, or KV cache + compute)",
        "fast frame: 9 fast_decode calls (prefix lengths 1..9); its floor: 9 x the Fast-AR "
        "matrices' file-type bytes / bandwidth",
        "GFLOP/s: 2*params*tokens (layer matrices) + attention 2*heads*head_dim*n*(n+1) per layer"
        " + logits 2*vocab*dim, over the prefill median",
    ]


def terminal_text(report: dict[str, Any]) -> str:
    out = header_lines(report) + [""]
    out += ["Decode step (one position, from the stated context)"] + decode_table(report) + [""]
    out += ["Load and memory"] + load_table(report) + [""]
    out += ["Prefill and Fast-AR"] + compute_table(report) + [""]
    out += ["Backends (as seen by their own process)"] + runtime_lines(report) + [""]
    out += legend_lines()
    if report["notes"] or report["skipped_backends"]:
        out += ["", "Notes"]
        out += [f"- {n}" for n in report["notes"]]
        out += [f"- backend {s['backend']} not measured: {s['reason']}"
                for s in report["skipped_backends"]]
    failed = [r for r in report["results"] if r["status"] != "ok"]
    out += [f"- FAILED {r['backend']} {r['weight_type']}: {r['error']}" for r in failed]
    return "\n".join(out)


def markdown_text(report: dict[str, Any], chart_name: str | None) -> str:
    """The summary stored next to the JSON: the same tables in code blocks, and the chart."""
    hp_note = (f"Each Slow-AR layer has {report['layer_matrix_params'] / 1e6:.1f} M matrix "
               "parameters.")
    md = [f"# s2core benchmark: {report['machine_tag']}, {report['created'][:10]}", "",
          "## Machine and settings", ""]
    md += [f"- {line}" for line in header_lines(report)[1:]]
    md.append(f"- {hp_note}")
    md += ["", "## Decode step", "", "```", *decode_table(report), "```", "",
           "## Load and memory", "", "```", *load_table(report), "```", "",
           "## Prefill and Fast-AR", "", "```", *compute_table(report), "```", "",
           "## Backends", ""]
    md += [f"- {line}" for line in runtime_lines(report)]
    md += ["", "## Reading the tables", ""] + [f"- {line}" for line in legend_lines()]
    if report["notes"] or report["skipped_backends"]:
        md += ["", "## Notes", ""] + [f"- {n}" for n in report["notes"]]
        md += [f"- backend {s['backend']} not measured: {s['reason']}"
               for s in report["skipped_backends"]]
    if chart_name:
        md += ["", f"![decode step per backend and weight type]({chart_name})"]
    return "\n".join(md) + "\n"


def write_json(report: dict[str, Any], path: Path) -> None:
    path.write_text(json.dumps(report, indent=1, default=str) + "\n")
