"""The PNG chart: decode step time per backend and weight type against the bandwidth floor,
with prefill throughput and resident memory beside it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")  # files only, no display needed
import matplotlib.pyplot as plt  # noqa: E402

COLORS = {"numpy": "#4C72B0", "torch": "#DD8452", "mlx": "#55A868"}
FALLBACK = ["#8172B3", "#C44E52", "#937860", "#DA8BC3", "#8C8C8C"]


def _layout(report: dict[str, Any]) -> tuple[list[str], list[str], dict[tuple[str, str], dict]]:
    types = list(report["models"])
    backends: list[str] = []
    for r in report["results"]:
        if r["backend"] not in backends:
            backends.append(r["backend"])
    by_key = {(r["weight_type"], r["backend"]): r for r in report["results"] if r["status"] == "ok"}
    return types, backends, by_key


def _color(backend: str, i: int) -> str:
    return COLORS.get(backend, FALLBACK[i % len(FALLBACK)])


def _ms(x: float) -> str:
    """Three significant figures at most: 1234 ms, 61.7 ms, 0.213 ms."""
    return f"{x:.0f}" if x >= 100 else f"{x:.3g}"


def _bar_positions(n_backends: int, group: int) -> tuple[list[float], float]:
    width = 0.8 / max(n_backends, 1)
    return [group - 0.4 + width * (j + 0.5) for j in range(n_backends)], width


def _step_panel(ax, report, types, backends, by_key) -> None:
    values = []
    for g, wtype in enumerate(types):
        xs, width = _bar_positions(len(backends), g)
        for j, (x, b) in enumerate(zip(xs, backends)):
            r = by_key.get((wtype, b))
            if r is None or "decode" not in r:
                ax.text(x, 0, "failed", rotation=90, ha="center", va="bottom", fontsize=8)
                continue
            dec = r["decode"]
            med = dec["median_ms"]
            values.append(med)
            ax.bar(x, med, width * 0.9, color=_color(b, j), label=b if g == 0 else None,
                   yerr=[[med - dec["min_ms"]], [dec["max_ms"] - med]], capsize=3)
            ax.annotate(f"{_ms(med)} ms\n{r['derived']['step_ratio_to_floor']:.1f}x",
                        (x, dec["max_ms"]), textcoords="offset points", xytext=(0, 3),
                        ha="center", va="bottom", fontsize=7.5)
        m = report["models"][wtype]
        floor, read_floor = m["step_floor_ms"], m["step_read_floor_ms"]
        values += [floor, read_floor]
        ax.hlines(floor, g - 0.45, g + 0.45, colors="black", linestyles="--", linewidth=1.5,
                  label="floor at copy bandwidth" if g == 0 else None)
        ax.hlines(read_floor, g - 0.45, g + 0.45, colors="crimson", linestyles=":", linewidth=1.8,
                  label="floor at read bandwidth" if g == 0 else None)
        ax.annotate(f"floor {_ms(floor)} / read {_ms(read_floor)} ms", (g, min(floor, read_floor)),
                    textcoords="offset points", xytext=(0, -11), ha="center", fontsize=8,
                    bbox=dict(facecolor="white", alpha=0.8, edgecolor="none", pad=1))
    if values and max(values) / max(min(values), 1e-9) > 15:
        ax.set_yscale("log")  # MLX on a Linux CPU can be 50x the others
        ax.set_ylim(min(values) / 2, max(values) * 4)  # room for the labels above the bars
    else:
        ax.set_ylim(0, max(values, default=1) * 1.3)
    ax.set_ylabel("ms per decode step (median; bars: min-max)")
    ax.set_title("Decode step vs memory-bandwidth floors\n(label: median, multiple of the copy floor)")


def _prefill_panel(ax, report, types, backends, by_key) -> None:
    top = 1.0
    for g, wtype in enumerate(types):
        xs, width = _bar_positions(len(backends), g)
        for j, (x, b) in enumerate(zip(xs, backends)):
            r = by_key.get((wtype, b))
            if r is None or "prefill_tokens_per_s" not in r.get("derived", {}):
                continue
            d = r["derived"]
            top = max(top, d["prefill_tokens_per_s"])
            ax.bar(x, d["prefill_tokens_per_s"], width * 0.9, color=_color(b, j))
            ax.annotate(f"{d['prefill_gflops']:.0f}", (x, d["prefill_tokens_per_s"]),
                        textcoords="offset points", xytext=(0, 3), ha="center", fontsize=8)
    ax.set_ylim(0, top * 1.3)
    ax.set_ylabel("tokens per second")
    ax.set_title(f"Prefill of {report['config']['prefill_tokens']} tokens (higher is better)\n"
                 "(label: GFLOP/s)")


def _memory_panel(ax, report, types, backends, by_key) -> None:
    """Resident memory at the end of the child (weights as used, KV cache, buffers), split into
    anonymous copies (solid) and pages of the memory-mapped file (hatched): a backend that uses
    the file in place holds nothing after load, but the file's pages become resident as read."""
    top = 0.0
    for g, wtype in enumerate(types):
        xs, width = _bar_positions(len(backends), g)
        for j, (x, b) in enumerate(zip(xs, backends)):
            r = by_key.get((wtype, b))
            d = r.get("derived", {}) if r else {}
            if "rss_anon_end_bytes" not in d:
                continue
            anon, file = d["rss_anon_end_bytes"] / 1e9, d["rss_file_end_bytes"] / 1e9
            peak = (d["peak_bytes"] - r["memory"]["baseline"]["rss"]) / 1e9
            top = max(top, peak, anon + file)
            ax.bar(x, anon, width * 0.9, color=_color(b, j))
            ax.bar(x, file, width * 0.9, bottom=anon, color=_color(b, j), alpha=0.45, hatch="//",
                   label="file pages (mmap)" if (g, j) == (0, 0) else None)
            ax.plot([x], [peak], marker="v", color="black", markersize=5,
                    label="peak (load or compute)" if (g, j) == (0, 0) else None)
        file_gb = report["models"][wtype]["weight_bytes"] / 1e9
        top = max(top, file_gb)
        ax.hlines(file_gb, g - 0.45, g + 0.45, colors="gray", linestyles=":", linewidth=1.5,
                  label="tensor bytes in the file" if g == 0 else None)
    ax.set_ylim(0, top * 1.25 if top else 1)
    ax.set_ylabel("GB above the process's baseline")
    ax.set_title("Resident memory at the end\n(solid: anonymous copies, hatched: file pages)")
    ax.legend(fontsize=8, loc="upper right")


def write_chart(report: dict[str, Any], path: Path) -> None:
    types, backends, by_key = _layout(report)
    fig, axes = plt.subplots(1, 3, figsize=(19, 7), gridspec_kw={"width_ratios": [1.7, 1, 1]})
    _step_panel(axes[0], report, types, backends, by_key)
    _prefill_panel(axes[1], report, types, backends, by_key)
    _memory_panel(axes[2], report, types, backends, by_key)
    for ax in axes:
        ax.set_xticks(range(len(types)), [f"{t}" for t in types])
        ax.set_xlabel("weight type in the file")
        ax.grid(axis="y", alpha=0.3)
    # One legend for the whole figure, below the panels, so it never hides a bar.
    handles, labels = axes[0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="lower center", ncol=len(labels), fontsize=9, frameon=False)
    bw = report["bandwidth"]
    fig.suptitle(f"s2core on {report['machine']['cpu_model']} ({report['machine']['cpus_usable']} "
                 f"cores), {report['model_label']}, context {report['config']['context']}; "
                 f"bandwidth copy {bw['copy_gbps']:.1f} / read {bw['read_gbps']:.1f} GB/s "
                 f"({report['created'][:10]})", fontsize=11)
    fig.tight_layout(rect=(0, 0.05, 1, 1))
    fig.savefig(path, dpi=110)
    plt.close(fig)


def finish_sweep_figure(fig, panels, xs: list[int], xlabel: str, suptitle: str, path: Path,
                        legend_size: int = 8) -> None:
    """The two-panel sweep charts of the batch and HTTP cases: log2 x axis over `xs`, each
    panel's (ax, title, ylabel), a title over both, saved and closed."""
    import matplotlib.pyplot as plt
    for ax, title, ylabel in panels:
        ax.set_xscale("log", base=2)
        ax.set_xticks(xs, [str(x) for x in xs])
        ax.set_xlabel(xlabel)
        ax.set_ylabel(ylabel)
        ax.set_title(title)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=legend_size)
    fig.suptitle(suptitle, fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)

