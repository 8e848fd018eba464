"""PNG plots of a run's key metrics with its findings marked (matplotlib, imported at first use)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import numpy as np

from otel_rl.analyze._series import Series
from otel_rl.detect.detectors import Finding

_KIND_COLOURS = {
    "spike": "#e6862e",
    "explosion": "#d62728",
    "collapse": "#9467bd",
    "level shift": "#1f77b4",
    "pinned-at-limit": "#7f7f7f",
    "periodic": "#2ca02c",
}


def _pyplot() -> Any:
    try:
        import matplotlib
    except ImportError:
        raise ImportError(
            "otel-rl analyze draws its plots with matplotlib: pip install 'otel-rl[analyze]' "
            "(or pip install matplotlib), or pass --no-plots"
        ) from None
    matplotlib.use("Agg", force=False)  # files only: never open a window
    import matplotlib.pyplot as plt

    return plt


def _log_axis(ax: Any) -> None:
    """A log-scale y axis labelled in plain numbers (1e-05, 0.1, 100), no minor ticks: matplotlib's
    default typesets each label as math and draws ~8 minor ticks a decade, most of a picture's cost."""
    from matplotlib.ticker import FuncFormatter, NullLocator

    ax.set_yscale("log")
    ax.yaxis.set_minor_locator(NullLocator())
    ax.yaxis.set_major_formatter(FuncFormatter(lambda value, _pos: f"{value:g}"))


def slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9]+", "_", text).strip("_").lower() or "series"


def plot_series(series: Series, findings: list[Finding], path: Path, *, title: str | None = None) -> Path:
    """One metric over the steps, with each finding's span shaded and its peak marked."""
    plt = _pyplot()
    steps, x = series.arrays()
    fig, ax = plt.subplots(figsize=(7.0, 2.4), dpi=90)
    try:
        finite = np.isfinite(x)
        ax.plot(steps[finite], x[finite], color="#333333", linewidth=1.0)
        positive = x[finite][x[finite] > 0]
        if positive.size == finite.sum() and positive.size > 2 and positive.max() / positive.min() > 1e3:
            _log_axis(ax)  # an explosion of several orders of magnitude would flatten the rest
        seen: set[str] = set()
        for f in findings:
            colour = _KIND_COLOURS.get(f.kind, "#000000")
            label = f.kind if f.kind not in seen else None
            seen.add(f.kind)
            if f.kind == "periodic" and f.period:
                marks = steps[(steps >= f.first_step) & (steps <= f.last_step)]
                ax.vlines(
                    [m for m in marks if (m - f.first_step) % max(1, int(round(f.period))) == 0],
                    *ax.get_ylim(),
                    colors=colour,
                    alpha=0.25,
                    linewidth=1,
                    label=label,
                )
                continue
            if f.kind == "pinned-at-limit":
                ax.axhline(f.limit or 0.0, color=colour, linestyle="--", linewidth=1, label=label)
                continue
            lo, hi = f.first_step, max(f.last_step, f.first_step)
            ax.axvspan(lo - 0.5, hi + 0.5, color=colour, alpha=0.25, label=label)
            if np.isfinite(f.peak_value):
                ax.plot([f.peak_step], [f.peak_value], marker="o", markersize=4, color=colour)
        # A fixed title height: matplotlib's automatic one measures every tick label (~0.2 s a picture).
        ax.set_title(title or series.label, fontsize=9, loc="left", y=1.0)
        ax.set_xlabel("step", fontsize=8)
        ax.tick_params(labelsize=7)
        if seen:
            # a fixed corner and fixed margins: "best" placement and tight_layout cost ~0.3 s a plot
            ax.legend(fontsize=7, loc="upper right", frameon=False)
        fig.subplots_adjust(left=0.1, right=0.98, top=0.88, bottom=0.2)
        path.parent.mkdir(parents=True, exist_ok=True)
        fig.savefig(path)
    finally:
        plt.close(fig)
    return path


_SEVERITY_COLOURS = {"critical": "#c62828", "warning": "#ef8f00", "info": "#1f77b4"}


def plot_incident(series: dict[str, Series], incident: Any, path: Path, *, limits: dict[str, tuple[float, str]] | None = None) -> Path:
    """The series of one incident, one panel each (one of each family, then the biggest movers; five at most): its steps shaded, each
    spike marked, the level before it as a dashed line and band, and the limit or threshold that
    applies drawn (``limits``: series -> (value, what it is))."""
    plt = _pyplot()
    # One series of each family the incident names (its reward as well as its lengths), the biggest
    # mover of each first, then the next biggest movers, five panels at most.
    ranked = [p for p in sorted(incident.parts, key=lambda p: -p.size) if p.series in series]
    order: list[str] = []
    seen: set[str] = set()
    for part in ranked:
        family = incident.families.get(part.series, part.series)
        if family not in seen and part.series not in order:
            seen.add(family)
            order.append(part.series)
    order += [label for label in dict.fromkeys(p.series for p in ranked) if label not in order]
    # The outcome on top, then the policy's state, then the optimizer's signals: the order a person reads.
    reading = ("reward", "validation", "signal", "length", "entropy", "kl", "grad", "mismatch")
    order = sorted(order[:5], key=lambda label: reading.index(f) if (f := incident.families.get(label)) in reading else len(reading))
    fig, axes = plt.subplots(len(order), 1, figsize=(7.5, 1.6 * len(order) + 0.5), dpi=90, sharex=True, squeeze=False)
    colour = _SEVERITY_COLOURS.get(incident.severity, "#555555")
    try:
        for ax, label in zip(axes[:, 0], order):
            steps, x = series[label].arrays()
            finite = np.isfinite(x)
            ax.plot(steps[finite], x[finite], color="#333333", linewidth=1.0)
            positive = x[finite][x[finite] > 0]
            if positive.size == finite.sum() and positive.size > 2 and positive.max() / positive.min() > 1e2:
                _log_axis(ax)
            mine = [p for p in incident.parts if p.series == label]
            for part in mine:
                if part.kind == "spike":
                    ax.plot(part.steps, [part.after] * len(part.steps), "o", color=colour, markersize=5)
                    continue
                lo, hi = part.first_step, max(part.last_step, part.first_step)
                ax.axvspan(lo - 0.5, hi + 0.5, color=colour, alpha=0.15 if part.kind == "sustained" else 0.3, linewidth=0)
            before = next((p.before for p in mine if p.kind != "spike"), mine[0].before if mine else None)
            if before is not None and np.isfinite(before):
                ax.axhline(before, color="#777777", linestyle="--", linewidth=0.9)
                first = min((p.first_step for p in mine), default=int(steps[0]))
                ax.axvspan(float(steps[0]) - 0.5, first - 0.5, color="#9e9e9e", alpha=0.12, linewidth=0)  # the baseline
            if limits and label in limits:
                value, what = limits[label]
                ax.axhline(value, color="#c62828", linestyle=":", linewidth=1.2)
                ax.annotate(what, (0.995, value), xycoords=("axes fraction", "data"), ha="right", va="bottom", fontsize=7, color="#c62828")
            ax.set_title(f"{label}  ({series[label].metric})", fontsize=8, loc="left", y=1.0)
            ax.tick_params(labelsize=7)
        axes[-1, 0].set_xlabel("step", fontsize=8)
        fig.suptitle(incident.name, fontsize=9, x=0.01, ha="left", color=colour)
        fig.subplots_adjust(
            left=0.1, right=0.98, top=1 - 0.45 / (1.6 * len(order) + 0.5), bottom=0.35 / (1.6 * len(order) + 0.5), hspace=0.55
        )
        path.parent.mkdir(parents=True, exist_ok=True)
        fig.savefig(path)
    finally:
        plt.close(fig)
    return path
