"""Draw the Grafana boards' panels into PNGs from a Prometheus-compatible query API (``otel-rl dashboards render``).

No Grafana server is needed: each board's own queries (``grafana/dashboards/*.json`` as
``otel-rl dashboards generate`` writes them) run against VictoriaMetrics or Prometheus with the
template variables filled in for one run, and matplotlib draws the panels on the board's grid with
their titles and units. Used for the pictures in ``docs/dashboards/`` and to prove the boards show
real data. matplotlib is imported only here, at first use.
"""

from __future__ import annotations

import io
import json
import math
import re
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from otel_rl.codegen.generate import find_repo_root, prometheus_name
from otel_rl.ops.dashboard_model import Metrics, template_values, uses_agent_loop_metric, uses_gpu_only_metric
from otel_rl.ops.dashboards import generate as generate_boards
from otel_rl.ops.promql import eq, label, ne, substitute
from otel_rl.semconv import METRICS
from otel_rl.semconv import attributes as A
from otel_rl.semconv import metrics as M

GRID_COLUMNS = 24
PNG_LIMIT_BYTES = 300_000


class QueryError(RuntimeError):
    """The query API could not be reached or refused a query."""


class QueryAPI:
    """The Prometheus HTTP query API (VictoriaMetrics and Prometheus both serve it)."""

    def __init__(self, base_url: str, timeout_s: float = 30.0) -> None:
        self.base_url = base_url.rstrip("/")
        self.timeout_s = timeout_s

    def _get(self, path: str, params: Mapping[str, Any]) -> Any:
        url = f"{self.base_url}{path}?{urllib.parse.urlencode(params)}"
        try:
            with urllib.request.urlopen(url, timeout=self.timeout_s) as response:  # noqa: S310 - a user-given http URL
                answer = json.loads(response.read().decode("utf-8"))
        except urllib.error.HTTPError as exc:
            detail = exc.read().decode("utf-8", "replace")[:500]
            raise QueryError(f"{path}: HTTP {exc.code}: {detail} (query {_shorten(params.get('query', ''))!r})") from None
        except (urllib.error.URLError, OSError) as exc:
            raise QueryError(f"cannot reach {self.base_url}: {exc}") from None
        if answer.get("status") != "success":
            raise QueryError(f"{path}: {answer.get('error') or answer} (query {_shorten(params.get('query', ''))!r})")
        return answer["data"]

    def query(self, expr: str, at: float) -> list[dict[str, Any]]:
        return self._get("/api/v1/query", {"query": expr, "time": f"{at:.3f}"})["result"]

    def query_range(self, expr: str, start: float, end: float, step: float) -> list[dict[str, Any]]:
        # step in plain seconds: Prometheus refuses a fractional duration with a unit ("1.007s")
        return self._get("/api/v1/query_range", {"query": expr, "start": f"{start:.3f}", "end": f"{end:.3f}", "step": f"{step:g}"})[
            "result"
        ]


def _shorten(text: str, limit: int = 200) -> str:
    """The error comes first in QueryError; the query after it, cut so the error survives truncation."""
    return text if len(text) <= limit else text[:limit] + "..."


@dataclass(frozen=True)
class RunWindow:
    """One run's identity and the time its metrics span."""

    service: str
    run: str
    first: float  # unix seconds of its first and last sample
    last: float
    interval_s: float  # the export interval, estimated from the samples

    def values(self) -> dict[str, str]:
        """Template values for this run: the whole run is the range; rate windows hold >= 4 exports."""
        start, end, step = self.span()
        rate_window = max(4 * self.interval_s, step + self.interval_s)  # Grafana's $__rate_interval rule
        return template_values(
            service=self.service,
            run=self.run,
            rate_interval=_duration(rate_window),
            interval=_duration(step),
            range_=_duration(end - start),
        )

    def span(self, points: int = 200) -> tuple[float, float, float]:
        """(start, end, step) of the range queries: the run with two export intervals either side."""
        start, end = self.first - 2 * self.interval_s, self.last + 2 * self.interval_s
        step = max(self.interval_s / 2, (end - start) / points, 1.0)
        return start, end, round(step, 3)


def _duration(seconds: float) -> str:
    return f"{max(1, math.ceil(seconds))}s"


def find_run(api: QueryAPI, *, service: str | None = None, run: str | None = None, lookback: str = "30d") -> RunWindow:
    """The given run, or the one whose metrics arrived last, with its time span (MetricsQL functions)."""
    step = METRICS[M.RL_STEP_DURATION]
    step_count = prometheus_name(step.name, step.unit, step.instrument) + "_count"
    matchers = [ne(A.RL_RUN_ID, "")]
    if service:
        matchers.append(eq(A.SERVICE_NAME, service))
    if run:
        matchers.append(eq(A.RL_RUN_ID, run))
    selector = f"{step_count}{{{', '.join(matchers)}}}"
    group = f"by ({label(A.SERVICE_NAME)}, {label(A.RL_RUN_ID)})"
    now = time.time()
    # tfirst/tlast_over_time are VictoriaMetrics' MetricsQL; with Prometheus pass --start/--end.
    last = api.query(f"max {group} (tlast_over_time({selector}[{lookback}]))", now)
    if not last:
        raise QueryError(f"no run found: no {step_count} series matching {selector} in the last {lookback}")
    latest = max(last, key=lambda s: float(s["value"][1]))
    labels = latest["metric"]
    chosen = f"{step_count}{{{eq(A.SERVICE_NAME, labels[label(A.SERVICE_NAME)])}, {eq(A.RL_RUN_ID, labels[label(A.RL_RUN_ID)])}}}"
    first = min(float(s["value"][1]) for s in api.query(f"min(tfirst_over_time({chosen}[{lookback}]))", now))
    count = max(float(s["value"][1]) for s in api.query(f"max(count_over_time({chosen}[{lookback}]))", now))
    last_t = float(latest["value"][1])
    interval = (last_t - first) / (count - 1) if count > 1 else 10.0
    return RunWindow(labels[label(A.SERVICE_NAME)], labels[label(A.RL_RUN_ID)], first, last_t, max(interval, 0.5))


# --------------------------------------------------------------------------------------------
# Values with Grafana's units


def format_value(value: float, unit: str) -> str:
    """A value as Grafana writes it for the common units the boards use."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    if unit == "percentunit":
        return f"{value * 100:.3g}%"
    if unit in ("s", "ms", "µs", "ns"):
        seconds = value * {"s": 1, "ms": 1e-3, "µs": 1e-6, "ns": 1e-9}[unit]
        size = abs(seconds)
        if size == 0:
            return "0 s"
        for limit, scale, name in ((1e-6, 1e9, "ns"), (1e-3, 1e6, "µs"), (1, 1e3, "ms"), (60, 1, "s"), (3600, 1 / 60, "min")):
            if size < limit:
                return f"{seconds * scale:.3g} {name}"
        return f"{seconds / 3600:.3g} h"
    if unit == "bytes":
        size, names = abs(value), ("B", "KiB", "MiB", "GiB", "TiB", "PiB")
        power = min(int(math.log(size, 1024)) if size >= 1 else 0, len(names) - 1)
        return f"{value / 1024**power:.3g} {names[power]}"
    if unit == "watt":
        return f"{value:.3g} W"
    if unit == "celsius":
        return f"{value:.3g} °C"
    suffix = ""
    if unit.startswith("count:"):
        suffix = " " + unit.split(":", 1)[1]
    elif unit.startswith("suffix:"):
        suffix = unit.split(":", 1)[1]
    size = abs(value)
    for limit, scale, name in ((1e12, 1e12, "T"), (1e9, 1e9, "B"), (1e6, 1e6, "M"), (1e3, 1e3, "K")):
        if size >= limit:
            return f"{value / scale:.3g}{name}{suffix}"
    return f"{value:.3g}{suffix}"


def unit_label(unit: str) -> str:
    """How a unit reads next to a panel title."""
    return {"percentunit": "%", "none": "", "bytes": "bytes", "s": "s", "watt": "W", "celsius": "°C"}.get(
        unit, unit.split(":", 1)[1].strip() if ":" in unit else unit
    )


# --------------------------------------------------------------------------------------------
# Querying a board


@dataclass
class Series:
    name: str
    times: list[float]
    values: list[float]
    labels: dict[str, str] = field(default_factory=dict)

    @property
    def has_data(self) -> bool:
        return any(not math.isnan(v) for v in self.values)


@dataclass
class PanelData:
    """A panel's query results: its series per query (refId), in query order."""

    panel: dict[str, Any]
    series: dict[str, list[Series]]
    errors: list[str] = field(default_factory=list)

    @property
    def has_data(self) -> bool:
        return any(s.has_data for group in self.series.values() for s in group)


def legend_text(template: str, labels: Mapping[str, str]) -> str:
    if not template or template == "__auto":
        return "{" + ", ".join(f'{k}="{v}"' for k, v in sorted(labels.items()) if k != "__name__") + "}"
    return re.sub(r"\{\{\s*(\w+)\s*\}\}", lambda m: labels.get(m.group(1), ""), template).strip()


def to_series(raw: dict[str, Any], template: str) -> Series:
    labels = dict(raw.get("metric") or {})
    points = raw.get("values") or ([raw["value"]] if "value" in raw else [])
    return Series(legend_text(template, labels), [float(t) for t, _ in points], [float(v) for _, v in points], labels)


def query_panel(api: QueryAPI, panel: Mapping[str, Any], values: Mapping[str, str], start: float, end: float, step: float) -> PanelData:
    """Run every query of a panel with the template variables filled in."""
    out = PanelData(dict(panel), {})
    for target in panel.get("targets", []):
        expr = substitute(target["expr"], values)
        try:
            if target.get("instant"):
                raw = api.query(expr, end)
            else:
                raw = api.query_range(expr, start, end, step)
        except QueryError as exc:
            out.errors.append(str(exc))
            raw = []
        out.series[target["refId"]] = [to_series(r, target.get("legendFormat", "")) for r in raw]
    return out


# --------------------------------------------------------------------------------------------
# Drawing


def _figure_layout(board: Mapping[str, Any]) -> int:
    return max((p["gridPos"]["y"] + p["gridPos"]["h"] for p in board["panels"]), default=1)


def _override_units(panel: Mapping[str, Any]) -> dict[str, str]:
    units = {}
    for override in panel.get("fieldConfig", {}).get("overrides", []):
        if override.get("matcher", {}).get("id") == "byFrameRefID":
            for prop in override.get("properties", []):
                if prop.get("id") == "unit":
                    units[override["matcher"]["options"]] = prop["value"]
    return units


def _is_gpu_only(panel: Mapping[str, Any], metrics: Metrics) -> bool:
    return any(uses_gpu_only_metric(t["expr"], metrics) for t in panel.get("targets", []))


def _is_agent_loop_only(panel: Mapping[str, Any], metrics: Metrics) -> bool:
    return any(uses_agent_loop_metric(t["expr"], metrics) for t in panel.get("targets", []))


def _bucket_bound(text: str) -> float:
    return math.inf if text in ("+Inf", "inf", "Inf") else float(text)


def _draw_timeseries(ax: Any, data: PanelData, unit: str, plt: Any) -> None:
    from matplotlib.ticker import FuncFormatter

    custom = data.panel["fieldConfig"]["defaults"].get("custom", {})
    stacked = custom.get("stacking", {}).get("mode") == "normal"
    bars = custom.get("drawStyle") == "bars"
    right_units = _override_units(data.panel)
    right_ax = None
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    color_index = 0
    stack_base: dict[float, float] = {}
    for ref, group in data.series.items():
        target_ax, target_unit = ax, unit
        if ref in right_units:
            if right_ax is None:
                right_ax = ax.twinx()
                right_ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _p, u=right_units[ref]: format_value(v, u)))
                right_ax.tick_params(labelsize=6)
            target_ax, target_unit = right_ax, right_units[ref]
        for s in group:
            if not s.has_data:
                continue
            color = colors[color_index % len(colors)]
            color_index += 1
            times = [_dt(t) for t in s.times]
            values = [0.0 if math.isnan(v) else v for v in s.values] if stacked else s.values
            series_label = f"{s.name}  {format_value(_last(s.values), target_unit)}"
            # The panel's last query in a stacked bar chart is its line (the step time), drawn on top.
            if stacked and target_ax is ax and not (bars and ref == list(data.series)[-1] and len(data.series) > 1):
                bottoms = [stack_base.get(t, 0.0) for t in s.times]
                if bars:
                    width = (s.times[1] - s.times[0]) / 86400 * 0.8 if len(s.times) > 1 else 0.0005
                    target_ax.bar(times, values, width=width, bottom=bottoms, color=color, label=series_label, linewidth=0)
                else:
                    target_ax.fill_between(
                        times, bottoms, [b + v for b, v in zip(bottoms, values)], color=color, alpha=0.6, label=series_label, linewidth=0
                    )
                for t, b, v in zip(s.times, bottoms, values):
                    stack_base[t] = b + v
            else:
                target_ax.plot(
                    times, s.values, color=color, linewidth=1.2, label=series_label, linestyle="--" if target_ax is not ax else "-"
                )
    for threshold in data.panel["fieldConfig"]["defaults"].get("thresholds", {}).get("steps", [])[1:]:
        ax.axhline(threshold["value"], color="#d44a3a", linewidth=1, linestyle=":")
    ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _p: format_value(v, unit)))
    handles, labels = ax.get_legend_handles_labels()
    if right_ax is not None:
        more_h, more_l = right_ax.get_legend_handles_labels()
        handles, labels = handles + more_h, labels + more_l
    if handles:
        ax.legend(
            handles,
            labels,
            fontsize=5.5,
            loc="upper left",
            ncol=2 if len(labels) > 6 else 1,
            framealpha=0.7,
            handlelength=1.2,
            borderpad=0.3,
            labelspacing=0.2,
        )
    _time_axis(ax)


def _draw_heatmap(ax: Any, data: PanelData, unit: str, colour_scale: Any) -> None:
    import numpy as np

    panel = data.panel
    group = next(iter(data.series.values()), [])
    group = [s for s in group if s.has_data]
    if not group:
        return
    times = sorted({t for s in group for t in s.times})
    index = {t: i for i, t in enumerate(times)}
    histogram = any(t.get("format") == "heatmap" for t in panel["targets"])
    if histogram:
        group.sort(key=lambda s: _bucket_bound(s.labels.get("le", "inf")))
        names = [s.labels.get("le", "?") for s in group]
    else:
        group.sort(key=lambda s: _numeric_key(s.name))
        names = [s.name for s in group]
    grid = np.full((len(group), len(times)), np.nan)
    for row, s in enumerate(group):
        for t, v in zip(s.times, s.values):
            grid[row, index[t]] = v
    if histogram:  # cumulative buckets -> per bucket, as Grafana's "heatmap" format does
        grid = np.diff(np.nan_to_num(grid), axis=0, prepend=0.0)
        grid[grid < 0] = 0
        # Only the buckets the data reaches (and one either side): 18 power-of-two token buckets
        # would leave the picture mostly empty.
        used = np.nonzero(grid.sum(axis=1) > 0)[0]
        if len(used):
            low, high = max(0, used[0] - 1), min(len(group), used[-1] + 2)
            grid, names, group = grid[low:high], names[low:high], group[low:high]
    y_unit = panel["options"].get("yAxis", {}).get("unit", "none")
    mesh = ax.imshow(
        grid,
        aspect="auto",
        origin="lower",
        cmap="Oranges",
        interpolation="nearest",
        extent=(_num(times[0]), _num(times[-1]) if len(times) > 1 else _num(times[0]) + 1e-4, 0, len(group)),
    )
    labels = [format_value(_bucket_bound(n), y_unit) if histogram and n not in ("+Inf", "inf") else n for n in names]
    every = max(1, len(labels) // 8)
    ax.set_yticks([i + 0.5 for i in range(0, len(labels), every)], labels[::every], fontsize=5.5)
    bar = ax.figure.colorbar(mesh, cax=colour_scale)
    bar.ax.tick_params(labelsize=5)
    bar.ax.yaxis.set_major_formatter(_formatter(unit))
    ax.xaxis_date()
    _time_axis(ax)


def _draw_stat(ax: Any, data: PanelData, unit: str) -> None:
    found = [s for group in data.series.values() for s in group if s.has_data]
    ax.set_axis_off()
    if not found:
        return
    text = "   ".join(f"{format_value(_last(s.values), unit)}" + (f"\n{s.name}" if len(found) > 1 else "") for s in found[:3])
    ax.text(
        0.5,
        0.45,
        text,
        ha="center",
        va="center",
        fontsize=15 if len(found) == 1 else 10,
        color="#3274d9",
        fontweight="bold",
        transform=ax.transAxes,
    )


def _draw_bargauge(ax: Any, data: PanelData, unit: str) -> None:
    found = [s for group in data.series.values() for s in group if s.has_data]
    if not found:
        return
    found.sort(key=lambda s: _last(s.values))
    values = [_last(s.values) for s in found]
    ax.barh(range(len(found)), values, color="#73bf69")
    ax.set_yticks(range(len(found)), [s.name for s in found], fontsize=6)
    for i, v in enumerate(values):
        ax.text(v, i, " " + format_value(v, unit), va="center", fontsize=6)
    ax.xaxis.set_major_formatter(_formatter(unit))
    ax.tick_params(labelsize=6)
    ax.set_xlim(0, max(values) * 1.25 if max(values) > 0 else 1)


def _formatter(unit: str) -> Any:
    from matplotlib.ticker import FuncFormatter

    return FuncFormatter(lambda v, _p: format_value(v, unit))


def _time_axis(ax: Any) -> None:
    import matplotlib.dates as mdates

    ax.xaxis.set_major_formatter(mdates.DateFormatter("%H:%M:%S"))
    ax.tick_params(labelsize=6)
    ax.grid(alpha=0.25, linewidth=0.5)


def _dt(t: float) -> Any:
    from datetime import datetime, timezone

    return datetime.fromtimestamp(t, tz=timezone.utc)


def _num(t: float) -> float:
    import matplotlib.dates as mdates

    return float(mdates.date2num(_dt(t)))


def _last(values: Sequence[float]) -> float:
    for v in reversed(values):
        if not math.isnan(v):
            return v
    return math.nan


def _numeric_key(text: str) -> tuple[float, str]:
    found = re.search(r"-?\d+(?:\.\d+)?", text)
    return (float(found.group()) if found else math.inf, text)


def draw_board(board: Mapping[str, Any], panels: Mapping[int, PanelData], out_path: Path, *, subtitle: str, metrics: Metrics) -> int:
    """Draw one board's panels on its grid into a PNG; return the file's size in bytes."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from PIL import Image

    rows = _figure_layout(board)
    width_in, unit_h_in, header_in = 16.0, 0.34, 0.55
    height_in = rows * unit_h_in + header_in
    fig = plt.figure(figsize=(width_in, height_in), dpi=80)
    fig.text(0.01, 1 - 0.22 / height_in, board["title"], fontsize=13, fontweight="bold", va="top")
    fig.text(0.01, 1 - 0.45 / height_in, subtitle, fontsize=8, color="#555555", va="top")
    top = 1 - header_in / height_in
    cell_h = (1 - header_in / height_in) / rows
    for panel in board["panels"]:
        g = panel["gridPos"]
        x0, y_top = g["x"] / GRID_COLUMNS, top - g["y"] * cell_h
        w, h = g["w"] / GRID_COLUMNS, g["h"] * cell_h
        if panel["type"] == "row":
            fig.text(x0 + 0.005, y_top - h * 0.5, panel["title"], fontsize=10, fontweight="bold", va="center", color="#333333")
            continue
        data = panels[panel["id"]]
        unit = panel["fieldConfig"]["defaults"].get("unit", "none")
        suffix = unit_label(unit)
        fig.text(
            x0 + 0.006,
            y_top - 0.06 / height_in,
            panel["title"] + (f"  [{suffix}]" if suffix else ""),
            fontsize=8,
            fontweight="bold",
            va="top",
        )
        kind = panel["type"]
        # Margins in inches inside the panel's grid cell: title above, tick labels left and below,
        # a right axis or a colour scale on the right.
        pad_l = {"timeseries": 0.75, "heatmap": 0.75, "bargauge": 1.6}.get(kind, 0.05)
        pad_r = 0.7 if (kind == "heatmap" or _override_units(panel)) else 0.15
        pad_t, pad_b = 0.3, 0.28 if kind != "stat" else 0.05
        rect = (x0 + pad_l / width_in, y_top - h + pad_b / height_in, w - (pad_l + pad_r) / width_in, h - (pad_t + pad_b) / height_in)
        ax = fig.add_axes(rect)
        if not data.has_data:
            ax.set_axis_off()
            why = "no data"
            if _is_gpu_only(panel, metrics):
                why = "no data on this run: GPU only"
            elif _is_agent_loop_only(panel, metrics):
                why = "no data on this run: agent loops only"
            if data.errors:
                why = "query failed: " + data.errors[0][:80]
            ax.text(0.5, 0.5, why, ha="center", va="center", fontsize=8, color="#999999", transform=ax.transAxes)
            continue
        if kind == "timeseries":
            _draw_timeseries(ax, data, unit, plt)
        elif kind == "heatmap":
            colour_scale = fig.add_axes((rect[0] + rect[2] + 0.08 / width_in, rect[1], 0.1 / width_in, rect[3]))
            _draw_heatmap(ax, data, unit, colour_scale)
        elif kind == "stat":
            _draw_stat(ax, data, unit)
        elif kind == "bargauge":
            _draw_bargauge(ax, data, unit)
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=80)
    plt.close(fig)
    buffer.seek(0)
    # A 256-colour palette keeps a board's picture well under the docs' size limit.
    image = Image.open(buffer).convert("RGB").quantize(colors=256)
    out_path.parent.mkdir(parents=True, exist_ok=True)
    image.save(out_path, format="PNG", optimize=True)
    return out_path.stat().st_size


@dataclass
class BoardResult:
    slug: str
    path: Path
    size: int
    panels: dict[str, PanelData]

    @property
    def empty_panels(self) -> list[str]:
        return [title for title, data in self.panels.items() if not data.has_data]


def render(
    api: QueryAPI, window: RunWindow, out_dir: Path, *, repo_root: Path | None = None, slugs: Sequence[str] | None = None
) -> list[BoardResult]:
    """Render every board (or the given slugs) for one run into ``out_dir/<slug>.png``."""
    from otel_rl.codegen.registry import load_registry

    root = repo_root or find_repo_root()
    registry = load_registry(root / "semconv")
    metrics = Metrics(registry)
    values = window.values()
    start, end, step = window.span()
    stamp = time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(window.first))
    subtitle = (
        f"service {window.service}, run {window.run}; {stamp} UTC, {window.last - window.first:.0f} s of metrics "
        f"exported every {window.interval_s:.1f} s; queries as on the Grafana board"
    )
    results = []
    for rel, text in generate_boards(root).items():
        slug = rel.stem
        if slugs and slug not in slugs:
            continue
        board = json.loads(text)
        panels = {p["id"]: query_panel(api, p, values, start, end, step) for p in board["panels"] if p["type"] != "row"}
        size = draw_board(board, panels, out_dir / f"{slug}.png", subtitle=subtitle, metrics=metrics)
        results.append(
            BoardResult(slug, out_dir / f"{slug}.png", size, {p["title"]: panels[p["id"]] for p in board["panels"] if p["type"] != "row"})
        )
    return results
