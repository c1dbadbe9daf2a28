"""Pictures of the suite's report (``omnibal-kernels bench --plot DIR``) and of a user's plan
(``omnibal-kernels plan --plot DIR``). Needs matplotlib: ``pip install omnibal_kernels[plot]``.

* ``rank_loads.png``: each rank's time in each step, random padded against balanced: the step lasts as
  long as its slowest rank (the paper's problem) and balanced packs close the gap (its fix);
* ``pack_loads.png``: how full the packs are, ViT and LLM load against the capacities, per method;
* ``planning_time.png``: planning seconds against the number of samples, log axes, ``numpy.argsort`` for scale;
* ``step_time.png``: simulated epoch time per method, and the measured DDP epoch split into compute and
  all-reduce;
* ``omniverse_steps.png``: each configuration of the whole-run comparison (6+20B, bundled loads), its mean step
  split into compute, recomputation and bubble.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any, Optional, Union

import numpy as np

__all__ = ["plot_report", "plot_rank_loads", "plot_plans", "plot_omniverse_steps"]

_COLORS = {
    "random_padded": "#d62728",
    "length_grouped": "#ff7f0e",
    "ffd_tokens": "#8c564b",
    "random": "#e377c2",
    "isf": "#1f77b4",
    "balanced": "#2ca02c",
    "limit": "#7f7f7f",
    "argsort": "#000000",
}
_LABELS = {
    "random_padded": "random padded",
    "length_grouped": "length grouped (LLaVA)",
    "ffd_tokens": "FFD on tokens",
    "random": "random packs",
    "isf": "ISF (paper)",
    "balanced": "balanced",
    "limit": "limit",
    "argsort": "numpy.argsort",
}


def _pyplot() -> Any:
    try:
        import matplotlib
    except ImportError as exc:
        raise ImportError("pictures need matplotlib: pip install 'omnibal_kernels[plot]'") from exc
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _save(fig: Any, path: Path) -> Path:
    fig.tight_layout()
    tmp = path.with_name(path.stem + ".tmp.png")
    fig.savefig(tmp, dpi=110)
    tmp.replace(path)  # written whole or not at all
    _pyplot().close(fig)
    return path


def plot_rank_loads(traces: Mapping[str, Any], path: Union[str, Path], *, title: str, unit: str) -> Path:
    """One panel per method: every rank's time (dots) in each step and the step's time (the slowest rank).

    Args:
        traces: method -> ``(steps, ranks)`` times.
        path: the PNG to write.
        title: the figure title.
        unit: the y-axis label.
    """
    plt = _pyplot()
    methods = list(traces)
    fig, axes = plt.subplots(len(methods), 1, figsize=(10, 2.6 * len(methods) + 0.6), sharex=True, sharey=True)
    axes = np.atleast_1d(axes)
    for ax, method in zip(axes, methods):
        t = np.asarray(traces[method], dtype=np.float64)
        steps = np.arange(t.shape[0])
        peak = t.max(axis=1)
        ax.vlines(steps, t.min(axis=1), peak, color="#bbbbbb", lw=3, zorder=1)
        for r in range(t.shape[1]):
            ax.scatter(steps, t[:, r], s=10, color=_COLORS.get(method, "#333333"), zorder=2)
        ax.step(steps, peak, where="mid", color="black", lw=1, label="step time (slowest rank)")
        idle = 1.0 - float(t.mean() / peak.mean()) if peak.mean() > 0 else 0.0
        ax.set_title(f"{_LABELS.get(method, method)}: ranks idle {idle:.0%} of each step on average", fontsize=10)
        ax.set_ylabel(unit)
        ax.set_ylim(bottom=0)
        ax.legend(loc="lower right", fontsize=8)
    axes[-1].set_xlabel("step")
    fig.suptitle(title)
    return _save(fig, Path(path))


def _pack_loads(report: Mapping[str, Any], path: Path) -> Path:
    plt = _pyplot()
    h = report["pack_loads"]
    fig, (ax_v, ax_t) = plt.subplots(1, 2, figsize=(11, 4))
    edges = np.asarray(h["llm_edges"])
    for method, hist in h["methods"].items():
        vit = np.asarray(hist["vit"], dtype=np.float64)
        ax_v.plot(
            np.arange(vit.size), vit / vit.sum(), drawstyle="steps-mid", color=_COLORS[method], label=_LABELS[method]
        )
        llm = np.asarray(hist["llm"], dtype=np.float64)
        ax_t.stairs(llm / llm.sum(), edges, color=_COLORS[method], label=_LABELS[method])
    for ax, cap, name in ((ax_v, h["vit_capacity"], "ViT"), (ax_t, h["llm_capacity"], "LLM")):
        ax.axvline(cap, color="black", ls="--", lw=1)
        ax.annotate(f"{name} capacity {cap}", (cap, 0.95), xycoords=("data", "axes fraction"), ha="right", fontsize=8)
        ax.set_ylabel("share of packs")
    ax_v.set_xlabel("ViT load per pack (tiles)")
    ax_t.set_xlabel("LLM load per pack (tokens)")
    # start the axes where the packs start: empty packs are rare and the range below says nothing
    lo = edges[:-1][np.any([np.asarray(m["llm"]) > 0 for m in h["methods"].values()], axis=0)].min()
    ax_t.set_xlim(lo * 0.95, edges[-1])
    vit_lo = min(int(np.flatnonzero(np.asarray(m["vit"]))[0]) for m in h["methods"].values())
    ax_v.set_xlim(max(vit_lo - 1, 0), len(next(iter(h["methods"].values()))["vit"]))
    ax_v.legend(fontsize=8, loc="center left")
    isf = h["isf_capacities"]
    fig.suptitle(
        f"Pack loads against the capacities (bundled data, {report['headline_world_size']} ranks; "
        f"ISF searches its own: {isf[0]} / {isf[1]})",
        fontsize=10,
    )
    return _save(fig, path)


def _planning_time(report: Mapping[str, Any], path: Path) -> Path:
    plt = _pyplot()
    rows = report["planning"]
    fig, ax = plt.subplots(figsize=(7, 4.5))
    methods = list(dict.fromkeys(r["method"] for r in rows))
    for method in methods:
        pts = sorted((r["n"], r["seconds"]) for r in rows if r["method"] == method)
        ax.plot(*zip(*pts), marker="o", color=_COLORS.get(method), label=_LABELS.get(method, method))
    argsort = sorted({(r["n"], r["seconds"] / r["argsort_ratio"]) for r in rows if r["method"] == methods[0]})
    ax.plot(*zip(*argsort), marker="s", ls="--", color=_COLORS["argsort"], label="numpy.argsort of the tokens")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("samples")
    ax.set_ylabel("seconds")
    ax.set_title("Planning time for 8 ranks against the number of samples", fontsize=10)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    return _save(fig, path)


def _step_time(report: Mapping[str, Any], path: Path) -> Path:
    plt = _pyplot()
    ddp = report.get("measured_ddp")
    fig, axes = plt.subplots(
        1, 2 if ddp else 1, figsize=(12 if ddp else 7, 4.5), gridspec_kw={"width_ratios": [2, 1]} if ddp else None
    )
    axes = np.atleast_1d(axes)
    data = "bundled" if "bundled" in report["simulated_speedup"] else next(iter(report["simulated_speedup"]))
    speedup = report["simulated_speedup"][data]
    methods = list(speedup)
    rel = [1.0 / speedup[m] for m in methods]
    ax = axes[0]
    bars = ax.bar(range(len(methods)), rel, color=[_COLORS.get(m, "#333333") for m in methods])
    for bar, value, m in zip(bars, rel, methods):
        ax.annotate(
            f"{value:.2f}\n({speedup[m]:.2f}x)",
            (bar.get_x() + bar.get_width() / 2, value),
            ha="center",
            va="bottom",
            fontsize=8,
        )
    ax.set_xticks(range(len(methods)), [_LABELS.get(m, m) for m in methods], rotation=20, fontsize=8)
    ax.set_ylabel("simulated epoch time / random padded")
    ax.set_ylim(0, max(rel) * 1.25)
    ax.set_title(f"Simulated ({data} data, {report['headline_world_size']} ranks, cost model)", fontsize=10)
    if ddp:
        ax = axes[1]
        names = ["random padded", "balanced packs"]
        total = [ddp["random_s"], ddp["balanced_s"]]
        comm = [ddp["random_s"] * ddp["wait_fraction_random"], ddp["balanced_s"] * ddp["wait_fraction_balanced"]]
        compute = [t - c for t, c in zip(total, comm)]
        ax.bar(names, compute, color=[_COLORS["random_padded"], _COLORS["balanced"]], label="compute")
        ax.bar(names, comm, bottom=compute, color="#cccccc", hatch="//", label="in all-reduce (waiting)")
        for i, t in enumerate(total):
            ax.annotate(f"{t:.2f} s", (i, t), ha="center", va="bottom", fontsize=8)
        ax.set_ylabel("seconds per epoch")
        ax.set_ylim(0, max(total) * 1.2)
        ax.set_title(f"Measured: tiny VLM, DDP, 2 CPU processes\n{ddp['speedup']:.2f}x tokens/s", fontsize=10)
        ax.legend(fontsize=8, loc="lower right")
    return _save(fig, path)


def plot_omniverse_steps(report: Mapping[str, Any], path: Union[str, Path]) -> Path:
    """Stacked bars of each configuration's mean step (compute, recomputation, bubble) of the first row of the
    ``omniverse`` part's table."""
    row = report["omniverse"]["table"][0]
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(7.5, 4.0))
    names = [c["name"] for c in row["configurations"]]
    steps = np.array([c["step_seconds"] for c in row["configurations"]])
    bubble = np.array([c["bubble_fraction"] for c in row["configurations"]]) * steps
    recompute = np.array([c["recompute_fraction"] for c in row["configurations"]]) * steps
    compute = steps - bubble - recompute
    bottom = np.zeros(len(names))
    for values, label, color in (
        (compute, "compute", "#2ca02c"),
        (recompute, "recomputation", "#ff7f0e"),
        (bubble, "bubble", "#d62728"),
    ):
        ax.bar(names, values, bottom=bottom, label=label, color=color)
        bottom += values
    for i, c in enumerate(row["configurations"]):
        ax.text(i, steps[i], f"{c['speedup']:.2f}x", ha="center", va="bottom", fontsize=8)
    lay = row["layout"]
    ax.set_ylabel("mean step (s)")
    ax.set_title(
        f"{row['model']}, {row['data']} data, {lay['gpus']} GPUs (PP {lay['pp']}, TP {lay['tp']}), "
        f"{lay['memory_gb']:g} GiB",
        fontsize=10,
    )
    ax.legend(fontsize=8)
    return _save(fig, Path(path))


def plot_report(report: Mapping[str, Any], outdir: Union[str, Path]) -> list[Path]:
    """Writes the PNGs the report has data for into ``outdir`` (created) and returns their paths."""
    out = Path(outdir)
    out.mkdir(parents=True, exist_ok=True)
    written = []
    if "load_trace" in report:
        trace = report["load_trace"]
        written.append(
            plot_rank_loads(
                trace["methods"],
                out / "rank_loads.png",
                unit="rank time\n(mean pack = 1)",
                title=f"Per-rank load per step ({trace['data']} data, {trace['world_size']} ranks, cost model)",
            )
        )
    if "pack_loads" in report:
        written.append(_pack_loads(report, out / "pack_loads.png"))
    if "planning" in report:
        written.append(_planning_time(report, out / "planning_time.png"))
    if "simulated_speedup" in report:
        written.append(_step_time(report, out / "step_time.png"))
    if "omniverse" in report:
        written.append(plot_omniverse_steps(report, out / "omniverse_steps.png"))
    return written


def plot_plans(
    plans: Mapping[str, Any],
    lengths: Any,
    outdir: Union[str, Path],
    *,
    steps: int = 40,
    cost_model: Optional[Any] = None,
) -> Path:
    """``rank_loads.png`` in ``outdir`` for the user's own plans (method -> ``Plan`` of ``lengths``): each
    rank's time in the first ``steps`` steps under ``cost_model`` (default ``CostModel.internvl_7b()``)."""
    from ..balance import CostModel
    from .simulate import rank_costs

    cost_model = cost_model or CostModel.internvl_7b()
    traces = {m: rank_costs(p, lengths, cost_model)[:steps] for m, p in plans.items()}
    scale = max(float(np.mean(t)) for t in traces.values())
    out = Path(outdir)
    out.mkdir(parents=True, exist_ok=True)
    world = next(iter(plans.values())).world_size
    return plot_rank_loads(
        {m: t / scale for m, t in traces.items()},
        out / "rank_loads.png",
        unit="rank time\n(relative)",
        title=f"Per-rank load per step ({len(lengths):,} samples, {world} ranks, cost model)",
    )
