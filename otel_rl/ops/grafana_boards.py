"""The boards as Grafana dashboards, built with Grafana's own builder library, grafana-foundation-sdk
(the build generated from Grafana 11.6's schemas): template variables, one panel builder per kind
(time series, stat, bar gauge, heatmap), Prometheus queries, thresholds, data links and the layout.

The SDK is needed only to generate the boards (their JSON is committed): it is imported at first
use, and ``otel-rl dashboards generate`` names the extra to install when it is missing.
"""

from __future__ import annotations

import importlib
import json
from collections.abc import Mapping, Sequence
from types import ModuleType, SimpleNamespace
from typing import Any

from otel_rl.ops.dashboard_model import (
    ALL_VALUE,
    DATASOURCE_TYPE,
    DATASOURCE_VARIABLE,
    PROMETHEUS_UID,
    RUN,
    TAG,
    Board,
    Metrics,
    Panel,
    Row,
    TraceLink,
)
from otel_rl.ops.promql import eq, label, ne
from otel_rl.semconv import attributes as A
from otel_rl.semconv import metrics as M

SDK_DISTRIBUTION = "grafana-foundation-sdk"
SDK_MISSING = f"{SDK_DISTRIBUTION} is not installed: building the Grafana boards needs it (pip install 'otel-rl[dashboards]')"


class GrafanaSDKMissing(ImportError):
    """grafana-foundation-sdk is not installed (the optional ``dashboards`` extra)."""


_SDK_MODULES = ("builders.dashboard", "builders.timeseries", "builders.stat", "builders.bargauge", "builders.heatmap",
                "builders.prometheus", "builders.common", "models.dashboard", "models.common", "models.heatmap",
                "models.prometheus", "cog.encoder")  # fmt: skip


def sdk() -> SimpleNamespace:
    """The SDK's modules by dotted name with "_" (``sdk().builders_timeseries.Panel``), imported on first use."""
    modules: dict[str, ModuleType] = {}
    try:
        for name in _SDK_MODULES:
            modules[name.replace(".", "_")] = importlib.import_module(f"grafana_foundation_sdk.{name}")
    except ImportError as error:
        raise GrafanaSDKMissing(SDK_MISSING) from error
    return SimpleNamespace(**modules)


# --------------------------------------------------------------------------------------------
# Template variables


def variables(m: Metrics, g: SimpleNamespace) -> list[Any]:
    """The boards' template variables: datasource, service, run, cluster, rank, device."""
    d, dm = g.builders_dashboard, g.models_dashboard
    datasource = (
        d.DatasourceVariable("datasource")
        .label("Prometheus")
        .type(DATASOURCE_TYPE)
        .current(dm.VariableOption(text="Prometheus", value=PROMETHEUS_UID))
        .hide(dm.VariableHide.DONT_HIDE)
        .regex("")
        .description("The Prometheus-compatible store (Prometheus, Mimir, VictoriaMetrics) holding the run's metrics.")
    )

    def query(name: str, title: str, expr: str, description: str, *, multi: bool, sort: int) -> Any:
        variable = (
            d.QueryVariable(name)
            .label(title)
            .datasource(_datasource(dm))
            .query(expr)
            .refresh(dm.VariableRefresh.ON_TIME_RANGE_CHANGED)
            .sort(dm.VariableSort(sort))
            .multi(multi)
            .include_all(multi)
            .hide(dm.VariableHide.DONT_HIDE)
            .regex("")
            .description(description)
        )
        if multi:  # "All" selected from the start (else Grafana would pick the first value alone)
            variable.all_value(ALL_VALUE).current(dm.VariableOption(selected=True, text=["All"], value=["$__all"]))
        return variable

    any_run = ne(A.RL_RUN_ID, "")
    run = ", ".join(RUN)
    stage_count = m.prom(M.RL_STAGE_DURATION, "_count")
    return [
        datasource,
        query(
            "service",
            "Service",
            f"label_values({{{any_run}}}, {label(A.SERVICE_NAME)})",
            f"{A.SERVICE_NAME} of the training job (every otel-rl series carries {A.RL_RUN_ID}).",
            multi=False,
            sort=1,
        ),
        query(
            "run",
            "Run",
            f"label_values({{{eq(A.SERVICE_NAME, '$service')}, {any_run}}}, {label(A.RL_RUN_ID)})",
            f"{A.RL_RUN_ID}; newest first when run ids start with their start time (otel-rl's default).",
            multi=False,
            sort=2,
        ),
        query(
            "cluster",
            "Cluster",
            f"label_values({stage_count}{{{run}}}, {label(A.RL_CLUSTER)})",
            f"{A.RL_CLUSTER}: the worker group that ran a stage (actor_train, actor_infer, reference, ...).",
            multi=True,
            sort=1,
        ),
        query(
            "rank",
            "Rank",
            f"label_values({{{run}}}, {label(A.RL_RANK)})",
            f"Global rank: {A.RL_RANK} of the reporting process; on per-rank balance panels, {A.RL_MEASURED_RANK}.",
            multi=True,
            sort=3,
        ),
        query(
            "device",
            "Device",
            f"label_values({{{run}, {ne(A.HW_ID, '')}}}, {label(A.HW_ID)})",
            f"{A.HW_ID}: the GPU index (none on a CPU-only run).",
            multi=True,
            sort=3,
        ),
    ]


def _datasource(dm: ModuleType) -> Any:
    return dm.DataSourceRef(type_val=DATASOURCE_TYPE, uid=DATASOURCE_VARIABLE)


# --------------------------------------------------------------------------------------------
# Panels: one builder per kind, with the options the boards use


def _timeseries(panel: Panel, g: SimpleNamespace) -> Any:
    c, cb = g.models_common, g.builders_common
    return (
        g.builders_timeseries.Panel()
        .draw_style(c.GraphDrawStyle.BARS if panel.bars else c.GraphDrawStyle.LINE)
        .line_width(1)
        .fill_opacity(70 if panel.bars else 10)
        .gradient_mode(c.GraphGradientMode.NONE)
        .show_points(c.VisibilityMode.AUTO)
        .point_size(4)
        .line_interpolation(c.LineInterpolation.LINEAR)
        .span_nulls(True)
        .insert_nulls(False)
        .bar_alignment(c.BarAlignment.CENTER)
        .axis_placement(c.AxisPlacement.AUTO)
        .axis_label("")
        .axis_border_show(False)
        .axis_centered_zero(False)
        .axis_color_mode(c.AxisColorMode.TEXT)
        .scale_distribution(cb.ScaleDistributionConfig().type(c.ScaleDistribution.LINEAR))
        .stacking(cb.StackingConfig().mode(c.StackingMode.NORMAL if panel.stack else c.StackingMode.NONE).group("A"))
        .thresholds_style(
            cb.GraphThresholdsStyleConfig().mode(c.GraphThresholdsStyleMode.LINE if panel.thresholds else c.GraphThresholdsStyleMode.OFF)
        )
        .hide_from(_shown(g))
        .legend(
            cb.VizLegendOptions()
            .calcs(["lastNotNull", "max"])
            .display_mode(c.LegendDisplayMode.TABLE)
            .placement(c.LegendPlacement.BOTTOM)
            .show_legend(True)
        )
        .tooltip(cb.VizTooltipOptions().mode(c.TooltipDisplayMode.MULTI).sort(c.SortOrder.DESCENDING))
    )


def _stat(panel: Panel, g: SimpleNamespace) -> Any:
    c = g.models_common
    return (
        g.builders_stat.Panel()
        .color_mode(c.BigValueColorMode.VALUE)
        .graph_mode(c.BigValueGraphMode.AREA)
        .justify_mode(c.BigValueJustifyMode.AUTO)
        .orientation(c.VizOrientation.AUTO)
        .percent_change_color_mode(c.PercentChangeColorMode.STANDARD)
        .show_percent_change(False)
        .text_mode(c.BigValueTextMode.AUTO)
        .wide_layout(True)
        .reduce_options(_last_value(g))
    )


def _bargauge(panel: Panel, g: SimpleNamespace) -> Any:
    c = g.models_common
    return (
        g.builders_bargauge.Panel()
        .display_mode(c.BarGaugeDisplayMode.GRADIENT)
        .orientation(c.VizOrientation.HORIZONTAL)
        .name_placement(c.BarGaugeNamePlacement.AUTO)
        .show_unfilled(True)
        .sizing(c.BarGaugeSizing.AUTO)
        .value_mode(c.BarGaugeValueMode.COLOR)
        .min_viz_height(16)
        .min_viz_width(8)
        .max_viz_height(300)
        .reduce_options(_last_value(g))
        .legend(
            g.builders_common.VizLegendOptions()
            .calcs([])
            .display_mode(c.LegendDisplayMode.LIST)
            .placement(c.LegendPlacement.BOTTOM)
            .show_legend(False)
        )
    )


def _heatmap(panel: Panel, g: SimpleNamespace) -> Any:
    c, h, hb = g.models_common, g.models_heatmap, g.builders_heatmap
    rows = c.HeatmapCellLayout.LE if any(t.heatmap for t in panel.targets) else c.HeatmapCellLayout.AUTO  # buckets are upper bounds
    return (
        hb.Panel()
        .calculate(False)
        .cell_gap(1)
        .cell_values(hb.CellValues().unit(panel.unit))
        .color(
            hb.HeatmapColorOptions()
            .exponent(0.5)
            .fill("dark-orange")
            .mode(h.HeatmapColorMode.SCHEME)
            .reverse(False)
            .scale(h.HeatmapColorScale.EXPONENTIAL)
            .scheme("Oranges")
            .steps(64)
        )
        .exemplars_color("rgba(255,0,255,0.7)")
        .filter_values(hb.FilterValueRange().le(1e-9))
        .show_legend()
        .rows_frame(hb.RowsHeatmapOptions().layout(rows))
        .selection_mode(h.HeatmapSelectionMode.X)
        .show_value(c.VisibilityMode.NEVER)
        .mode(c.TooltipDisplayMode.SINGLE)
        .show_color_scale(False)
        .hide_y_histogram()
        .y_axis(hb.YAxisConfig().axis_placement(c.AxisPlacement.LEFT).reverse(False).unit(panel.y_unit or "none"))
        .hide_from(_shown(g))
        .scale_distribution(g.builders_common.ScaleDistributionConfig().type(c.ScaleDistribution.LINEAR))
    )


def _shown(g: SimpleNamespace) -> Any:
    return g.builders_common.HideSeriesConfig().legend(False).tooltip(False).viz(False)


def _last_value(g: SimpleNamespace) -> Any:
    return g.builders_common.ReduceDataOptions().calcs(["lastNotNull"]).fields("").values(False)


_KINDS = {"timeseries": _timeseries, "stat": _stat, "bargauge": _bargauge, "heatmap": _heatmap}


def _data_link(link: TraceLink, g: SimpleNamespace) -> Any:
    # This SDK build types a field's data links as dashboard links: a link to a URL, in a new tab.
    d, dm = g.builders_dashboard, g.models_dashboard
    return d.DashboardLink(link.title).type(dm.DashboardLinkType.LINK).url(link.url).target_blank(True)


def panel_builder(panel: Panel, panel_id: int, grid: Mapping[str, int], m: Metrics, g: SimpleNamespace) -> Any:
    """One panel: queries, unit, the registry briefs as its description, thresholds, links, overrides."""
    if panel.kind not in _KINDS:
        raise ValueError(f"{panel.title}: unknown panel kind {panel.kind}")
    d, dm, prometheus = g.builders_dashboard, g.models_dashboard, g.builders_prometheus
    used: list[str] = []
    for target in panel.targets:
        used += [name for name in m.used_in(target.expr) if name not in used]
    color = dm.FieldColorModeId.THRESHOLDS if panel.kind in ("stat", "bargauge") else dm.FieldColorModeId.PALETTE_CLASSIC
    steps = [dm.Threshold(value=None, color="green"), *(dm.Threshold(value=v, color="red") for v in panel.thresholds)]
    builder = (
        _KINDS[panel.kind](panel, g)
        .id(panel_id)
        .title(panel.title)
        .description(" ".join([m.brief(name) for name in used] + ([panel.note] if panel.note else [])))
        .datasource(_datasource(dm))
        .grid_pos(dm.GridPos(**grid))
        .unit(panel.unit)
        .color_scheme(d.FieldColor().mode(color))
        .mappings([])
        .thresholds(d.ThresholdsConfig().mode(dm.ThresholdsMode.ABSOLUTE).steps(steps))
        .overrides([])
    )
    if panel.min is not None:
        builder.min(panel.min)
    if panel.max is not None:
        builder.max(panel.max)
    if panel.links:
        builder.data_links([_data_link(link, g) for link in panel.links])
    for number, target in enumerate(panel.targets):
        ref = chr(ord("A") + number)
        query = (
            prometheus.Dataquery()
            .ref_id(ref)
            .datasource(_datasource(dm))
            .editor_mode(g.models_prometheus.QueryEditorMode.CODE)
            .expr(target.expr)
            .legend_format(target.legend or "__auto")
        )
        query.instant() if target.instant else query.range()
        if target.heatmap:
            query.format(g.models_prometheus.PromQueryFormat.HEATMAP)
        if target.exemplar:
            query.exemplar(True)
        builder.with_target(query)
        if target.unit and target.unit != panel.unit:  # its series get their own unit, on the right axis
            properties = [dm.DynamicConfigValue(id_val="unit", value=target.unit)]
            if panel.kind == "timeseries":
                properties.append(dm.DynamicConfigValue(id_val="custom.axisPlacement", value="right"))
            if panel.min is not None or panel.max is not None:  # the panel's 0..1 range is not this series'
                properties += [dm.DynamicConfigValue(id_val="min"), dm.DynamicConfigValue(id_val="max")]
            builder.override_by_query(ref, properties)
    return builder


# --------------------------------------------------------------------------------------------
# Boards


def layout(items: Sequence[Panel | Row]) -> list[tuple[Panel | Row, dict[str, int]]]:
    """Grid positions: rows span the width; panels flow left to right, 24 columns wide.

    Ours, not the SDK's: its automatic placement lets a panel run past the 24th column (16 + 16)
    instead of starting a new line, so every position is given explicitly.
    """
    placed: list[tuple[Panel | Row, dict[str, int]]] = []
    x = y = line_h = 0
    for item in items:
        if isinstance(item, Row):
            if x:
                y, x, line_h = y + line_h, 0, 0
            placed.append((item, {"h": 1, "w": 24, "x": 0, "y": y}))
            y += 1
            continue
        if x + item.w > 24:
            y, x, line_h = y + line_h, 0, 0
        placed.append((item, {"h": item.h, "w": item.w, "x": x, "y": y}))
        x += item.w
        line_h = max(line_h, item.h)
    return placed


def board_builder(board: Board, m: Metrics, g: SimpleNamespace | None = None) -> Any:
    """The SDK's dashboard builder for a board."""
    g = g or sdk()
    d, dm = g.builders_dashboard, g.models_dashboard
    dashboard = (
        d.Dashboard(board.title)
        .uid(board.uid)
        .description(
            f"{board.description} Generated from semconv/registry by `otel-rl dashboards generate` "
            "(otel_rl/ops/dashboard_boards.py); edit that, not this file."
        )
        .tags([TAG, *board.tags])
        .editable()
        .tooltip(dm.DashboardCursorSync(board.cursor_sync))
        .refresh("30s")
        .time("now-3h", "now")
        .timezone("browser")
        .fiscal_year_start_month(0)
        .week_start("")
        .version(1)
        .annotation(
            d.AnnotationQuery()
            .name("Annotations & Alerts")
            .datasource(dm.DataSourceRef(type_val="grafana", uid="-- Grafana --"))
            .enable(True)
            .hide(True)
            .icon_color("rgba(0, 211, 255, 1)")
            .type("dashboard")
            .built_in(1)
        )
        .link(
            d.DashboardLink("otel-rl boards")
            .type(dm.DashboardLinkType.DASHBOARDS)
            .tags([TAG])
            .as_dropdown(True)
            .include_vars(True)
            .keep_time(True)
            .icon("external link")
            .target_blank(False)
            .tooltip("")
            .url("")
        )
        .variables(variables(m, g))
    )
    for number, (item, grid) in enumerate(layout(board.items), start=1):
        if isinstance(item, Row):
            dashboard.with_row(d.Row(item.title).id(number).collapsed(False).grid_pos(dm.GridPos(**grid)))
        else:
            dashboard.with_panel(panel_builder(item, number, grid, m, g))
    return dashboard


def board_json(board: Board, m: Metrics) -> dict[str, Any]:
    """The dashboard JSON Grafana imports, as the SDK's encoder writes it."""
    g = sdk()
    dashboard = board_builder(board, m, g).build()
    for variable in dashboard.templating.list_val:
        # This SDK build gives every variable an interval variable's auto / auto_min / auto_count,
        # which Grafana 11.6's schema does not have and Grafana reads on interval variables only.
        if variable.type_val != g.models_dashboard.VariableType.INTERVAL:
            variable.auto = variable.auto_min = variable.auto_count = None
    return json.loads(json.dumps(dashboard, cls=g.cog_encoder.JSONEncoder))


def dashboard_targets(board: Mapping[str, Any]) -> list[tuple[dict[str, Any], dict[str, Any]]]:
    """(panel, target) for every query of a dashboard JSON, rows' nested panels included.

    Ours: it reads committed JSON back (tests, ``dashboards render``), where the SDK only builds.
    """
    out = []
    for panel in board.get("panels", []):
        for inner in [panel, *panel.get("panels", [])]:
            for target in inner.get("targets", []) or []:
                out.append((inner, target))
    return out
