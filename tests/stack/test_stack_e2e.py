"""The stack with its real servers: built from Go modules and taken from Debian's archive, started
on 127.0.0.1 at a free port offset, fed real OTLP, stopped by PID. Every wait has a deadline; the
fixtures stop every server however a test ends."""

from __future__ import annotations

import hashlib
import io
import json
import os
import re
import subprocess
import time
import urllib.parse
import urllib.request
import uuid
from pathlib import Path

import psutil
import pytest
import yaml
from go_builds import require_go_built

from otel_rl.stack import COMPONENT_NAMES, HealthCheckError, Stack
from otel_rl.stack._install import system_debian_mirror, write_scratch_apt
from otel_rl.stack.process import port_free, read_pid_file

pytestmark = pytest.mark.e2e
REPO = Path(__file__).resolve().parents[2]
_OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def _get_json(url: str) -> dict:
    with _OPENER.open(url, timeout=5) as response:
        return json.loads(response.read())


def _poll(what: str, probe, deadline_s: float):
    """Call ``probe`` until it returns something truthy; fail naming ``what`` after ``deadline_s``."""
    end = time.monotonic() + deadline_s
    last = None
    while time.monotonic() < end:
        try:
            last = probe()
        except OSError as exc:
            last = exc
        if last and not isinstance(last, Exception):
            return last
        time.sleep(0.5)
    pytest.fail(f"{what}: nothing after {deadline_s} s (last: {last!r})")


def _query(base: str, promql: str) -> list:
    return _get_json(f"{base}/api/v1/query?{urllib.parse.urlencode({'query': promql})}")["data"]["result"]


def _send_metric(otlp_http: str, name: str) -> None:
    from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import PeriodicExportingMetricReader
    from opentelemetry.sdk.resources import Resource

    reader = PeriodicExportingMetricReader(
        OTLPMetricExporter(endpoint=f"{otlp_http}/v1/metrics", timeout=10), export_interval_millis=3_600_000
    )
    provider = MeterProvider(metric_readers=[reader], resource=Resource.create({"service.name": "otel-rl-stack-test"}))
    provider.get_meter("otel-rl-stack-test").create_counter(name, unit="1").add(3, {"rl.stage": "generate"})
    assert reader.force_flush(timeout_millis=10_000), "the OTLP export to the agent failed"
    provider.shutdown()


def _send_span(otlp_http: str) -> str:
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor

    provider = TracerProvider(resource=Resource.create({"service.name": "otel-rl-stack-test"}))
    provider.add_span_processor(SimpleSpanProcessor(OTLPSpanExporter(endpoint=f"{otlp_http}/v1/traces", timeout=10)))
    with provider.get_tracer("otel-rl-stack-test").start_as_current_span("rl.step") as span:
        span.set_attribute("rl.step", 7)
        trace_id = format(span.get_span_context().trace_id, "032x")
    provider.shutdown()
    return trace_id


def _assert_all_stopped(stack: Stack, records: dict) -> None:
    for name, rec in records.items():
        assert not psutil.pid_exists(rec.pid) or psutil.Process(rec.pid).status() == psutil.STATUS_ZOMBIE, (
            f"{name} (pid {rec.pid}) still runs after down()"
        )
        for role, port in rec.ports.items():
            assert port_free(port, "127.0.0.1"), f"{name}'s port {port} is still taken after down()"
    assert not list((stack.data_dir / "run").glob("*.json"))


def test_collectors_to_victoria_metrics_and_jaeger_round_trip(make_stack) -> None:
    require_go_built()
    out = io.StringIO()
    names = ["otelcol-agent", "otelcol-gateway", "victoria-metrics"]
    stack = make_stack(only=names, out=out)
    started = time.monotonic()
    statuses = stack.up()
    up_s = time.monotonic() - started
    assert [(s.name, s.state) for s in statuses] == [(n, "healthy") for n in names], out.getvalue()

    # agent -> gateway -> remote write. VictoriaMetrics makes a new series searchable ~10 s after it arrives.
    metric = f"stack_probe_{uuid.uuid4().hex[:8]}"
    _send_metric(stack.endpoints["otlp_http"], metric)
    series = _poll(f"{metric}_total in VictoriaMetrics", lambda: _query(stack.endpoints["victoria_metrics"], f"{metric}_total"), 60)
    assert series[0]["value"][1] == "3" and series[0]["metric"]["rl_stage"] == "generate"
    assert series[0]["metric"]["host_name"]  # the agent's transform/host_name filled it in (the SDK sent none)

    again = io.StringIO()
    stack._out = again
    stack.up()  # idempotent
    assert again.getvalue().count("already running and healthy") == 3 and "started" not in again.getvalue()

    # Adding Jaeger re-routes the gateway's traces to it: the gateway is restarted with the new routing.
    routed = io.StringIO()
    with_jaeger = make_stack(only=["otelcol-gateway", "jaeger"], port_offset=stack.port_offset, out=routed)
    with_jaeger.up()
    assert "otelcol-gateway: running with another configuration" in routed.getvalue()
    gateway = read_pid_file(stack.data_dir / "run" / "otelcol-gateway.json")
    assert gateway.env["OTEL_GATEWAY_JAEGER_ENDPOINT"] == f"127.0.0.1:{stack.ports('jaeger')['otlp_grpc']}"
    trace_id = _send_span(stack.endpoints["otlp_http"])
    spans = _poll(f"trace {trace_id} in Jaeger", lambda: _get_json(f"{stack.endpoints['jaeger']}/api/traces/{trace_id}")["data"], 60)
    assert spans[0]["spans"][0]["operationName"] == "rl.step"

    all_names = ("otelcol-agent", "otelcol-gateway", "jaeger", "victoria-metrics")
    records = {name: read_pid_file(stack.data_dir / "run" / f"{name}.json") for name in all_names}
    started = time.monotonic()
    # down() stops all, in reverse start order: what sends before what it sends to
    assert stack.down() == ["otelcol-agent", "otelcol-gateway", "jaeger", "victoria-metrics"]
    down_s = time.monotonic() - started
    _assert_all_stopped(stack, records)
    print(f"\nup {up_s:.1f} s (builds and installs included), down {down_s:.1f} s")


def test_the_built_and_installed_programs_have_what_the_stack_uses(stack_dir: Path) -> None:
    require_go_built()
    stack = Stack(stack_dir, only=["otelcol-agent", "jaeger", "victoria-metrics", "prometheus"], out=None)
    stack.install()
    again = io.StringIO()
    stack._out = again
    assert set(stack.install()) == {"otelcol", "jaeger", "victoria-metrics", "prometheus"}
    assert again.getvalue() == ""  # recorded in install.json: nothing to do

    def run(package: str, binary: str, *args: str) -> str:
        done = subprocess.run([str(stack._installer.binary(package, binary)), *args], capture_output=True, text=True, timeout=60)
        return done.stdout + done.stderr

    assert "otelcol-rl version 0.161.0" in run("otelcol", "otelcol-rl", "--version")
    # Every component type the shipped configs name is in the build (`validate` checks each config: tests/test_collector_config.py).
    components = yaml.safe_load(run("otelcol", "otelcol-rl", "components"))
    built = {kind: {c["name"] for c in components[kind]} for kind in ("receivers", "processors", "exporters", "connectors", "extensions")}
    assert {"otlp", "prometheus"} <= built["receivers"] and {"span_metrics"} <= built["connectors"]
    assert {"otlp_grpc", "otlp_http", "prometheus_remote_write", "prometheus", "file", "nop"} <= built["exporters"]
    assert {"memory_limiter", "batch", "filter", "transform"} <= built["processors"] and {"health_check", "file_storage"} <= built[
        "extensions"
    ]
    assert '"gitVersion":"v2.13.0"' in run("jaeger", "jaeger", "version").replace(" ", "")

    def flags(package: str, binary: str, help_flag: str = "-help") -> str:
        return run(package, binary, help_flag)

    vm = flags("victoria-metrics", "victoria-metrics")
    for flag in ("-storageDataPath", "-httpListenAddr", "-search.latencyOffset", "-opentelemetry.usePrometheusNaming"):
        assert f"  {flag}" in vm
    vmalert = flags("victoria-metrics", "vmalert")
    for flag in ("-datasource.url", "-remoteWrite.url", "-notifier.blackhole", "-rule", "-evaluationInterval"):
        assert f"  {flag}" in vmalert
    prometheus = flags("prometheus", "prometheus", "--help")
    for flag in ("--web.listen-address", "--storage.tsdb.path", "--config.file"):
        assert flag in prometheus
    manifest = json.loads((stack_dir / "install.json").read_text())
    assert manifest["victoria-metrics"]["suite"] == "trixie" and manifest["victoria-metrics"]["version"].startswith("1.")
    assert manifest["prometheus"]["suite"] == "bookworm" and manifest["prometheus"]["version"].startswith("2.42")
    assert (manifest["otelcol"]["version"], manifest["jaeger"]["version"]) == ("0.161.0", "v2.13.0")
    assert manifest["otelcol"]["spec"] == str(REPO / "collector-config" / "builder-config.yaml")
    # A copy in the data folder, not a link into the cache: a later build never changes a running stack.
    assert not stack._installer.binary("otelcol", "otelcol-rl").is_symlink()
    assert Path(manifest["otelcol"]["cached"]).read_bytes() == stack._installer.binary("otelcol", "otelcol-rl").read_bytes()


def _system_apt_state() -> dict[str, tuple]:
    roots = [Path("/etc/apt"), Path("/var/lib/apt/lists"), Path("/var/lib/dpkg/status"), Path("/var/cache/apt")]
    state = {}
    for root in roots:
        for path in [root, *(root.rglob("*") if root.is_dir() else [])]:
            if path.exists() or path.is_symlink():
                st = path.lstat()
                digest = hashlib.sha256(path.read_bytes()).hexdigest() if path.is_file() and st.st_size < 50_000_000 else ""
                state[str(path)] = (st.st_mtime_ns, st.st_size, digest)
    return state


@pytest.mark.skipif(not Path("/etc/apt").is_dir(), reason="not a Debian system")
def test_scratch_apt_update_and_download_leave_the_system_apt_alone(tmp_path: Path) -> None:
    before = _system_apt_state()
    conf = write_scratch_apt(tmp_path / "apt", mirror=system_debian_mirror())
    env = dict(os.environ, APT_CONFIG=str(conf), LC_ALL="C")
    subprocess.run(["apt-get", "-q", "update"], env=env, check=True, capture_output=True, timeout=300)
    policy = subprocess.run(
        ["apt-cache", "policy", "victoria-metrics"], env=env, check=True, capture_output=True, text=True, timeout=60
    ).stdout
    assert re.search(r"Candidate: 1\.1\d\d\.", policy), policy  # trixie's, not bookworm's 1.79
    (tmp_path / "dl").mkdir()
    subprocess.run(
        ["apt-get", "-q", "download", "prometheus/bookworm"], env=env, cwd=tmp_path / "dl", check=True, capture_output=True, timeout=300
    )
    assert list((tmp_path / "dl").glob("prometheus_2.42*.deb"))
    assert _system_apt_state() == before


def test_a_server_that_fails_its_start_is_reported_and_the_call_undone(make_stack, tmp_path: Path) -> None:
    rules = tmp_path / "rules"
    rules.mkdir()
    (rules / "broken.yml").write_text("groups:\n  - name: broken\n    rules:\n      - alert: X\n        expr: 'sum(('\n")
    stack = make_stack(only=["victoria-metrics", "vmalert"], rules_dir=rules, out=None)
    with pytest.raises(HealthCheckError) as err:
        stack.up(timeout_s=20)
    assert err.value.component == "vmalert"
    assert "Last lines of" in str(err.value) and "broken.yml" in str(err.value)
    # victoria-metrics came up in the same call, and was stopped again.
    assert {s.name: s.state for s in stack.status()} == {"victoria-metrics": "stopped", "vmalert": "stopped"}


def test_full_stack_up_status_data_and_down(make_stack) -> None:
    require_go_built()
    out = io.StringIO()
    stack = make_stack(out=out)
    started = time.monotonic()
    statuses = stack.up()
    up_s = time.monotonic() - started
    assert {s.name: s.state for s in statuses} == dict.fromkeys(COMPONENT_NAMES, "healthy"), out.getvalue()
    assert all(s.pid for s in statuses)
    urls = {s.name: s.urls for s in statuses}
    assert urls["jaeger"]["query API"] == f"{stack.endpoints['jaeger']}/api/traces"

    trace_id = _send_span(stack.endpoints["otlp_http"])
    metric = f"stack_full_{uuid.uuid4().hex[:8]}"
    _send_metric(stack.endpoints["otlp_http"], metric)
    traces = _poll(f"trace {trace_id} in Jaeger", lambda: _get_json(f"{stack.endpoints['jaeger']}/api/traces/{trace_id}")["data"], 60)
    span = traces[0]["spans"][0]
    assert span["operationName"] == "rl.step" and {"key": "rl.step", "type": "int64", "value": 7} in span["tags"]
    # metrics: agent -> gateway -> remote write to VictoriaMetrics; Prometheus scrapes the gateway's :8889
    _poll(f"{metric}_total in VictoriaMetrics", lambda: _query(stack.endpoints["victoria_metrics"], f"{metric}_total"), 60)
    _poll(f"{metric}_total in Prometheus", lambda: _query(stack.endpoints["prometheus"], f"{metric}_total"), 60)
    assert _get_json(f"{stack.endpoints['vmalert']}/api/v1/rules")["status"] == "success"
    # span_metrics: the rl.step span became a call count in the metrics store, through the gateway's connector
    _poll(
        "the span_metrics calls of rl.step",
        lambda: _query(stack.endpoints["victoria_metrics"], 'traces_span_metrics_calls_total{span_name="rl.step"}'),
        60,
    )

    records = {name: read_pid_file(stack.data_dir / "run" / f"{name}.json") for name in COMPONENT_NAMES}
    started = time.monotonic()
    assert sorted(stack.down()) == sorted(COMPONENT_NAMES)
    down_s = time.monotonic() - started
    _assert_all_stopped(stack, records)
    assert {s.state for s in stack.status()} == {"stopped"}
    print(f"\nfull stack: up {up_s:.1f} s (builds and installs included), down {down_s:.1f} s")
