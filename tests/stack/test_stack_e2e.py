"""The stack with its real servers: installed from PyPI and Debian's archive, started on 127.0.0.1
at a free port offset, fed real OTLP, stopped by PID. Every wait has a deadline; the fixtures stop
every server however a test ends."""

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
    assert reader.force_flush(timeout_millis=10_000), "the OTLP export to rotel failed"
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


def test_rotel_to_victoria_metrics_round_trip(make_stack) -> None:
    out = io.StringIO()
    stack = make_stack(only=["rotel", "victoria-metrics"], out=out)
    started = time.monotonic()
    statuses = stack.up()
    up_s = time.monotonic() - started
    assert [(s.name, s.state) for s in statuses] == [("rotel", "healthy"), ("victoria-metrics", "healthy")]
    assert re.search(r"installing rotel \(PyPI rotel==0\.0\.1a15\)\.\.\. done in|rotel: started", out.getvalue())

    # VictoriaMetrics makes a new series searchable about 10 s after it arrives: poll, with a deadline.
    metric = f"stack_probe_{uuid.uuid4().hex[:8]}"
    _send_metric(stack.endpoints["otlp_http"], metric)
    series = _poll(f"{metric}_total in VictoriaMetrics", lambda: _query(stack.endpoints["victoria_metrics"], f"{metric}_total"), 60)
    assert series[0]["value"][1] == "3" and series[0]["metric"]["rl_stage"] == "generate"

    again = io.StringIO()
    stack._out = again
    stack.up()  # idempotent
    assert again.getvalue().count("already running and healthy") == 2 and "started" not in again.getvalue()

    # Adding vmagent re-routes rotel's metrics through it: rotel is restarted with the new routing.
    routed = io.StringIO()
    with_vmagent = make_stack(only=["rotel", "vmagent"], port_offset=stack.port_offset, out=routed)
    with_vmagent.up()
    assert "rotel: running with another configuration" in routed.getvalue()
    rotel = read_pid_file(stack.data_dir / "run" / "rotel.json")
    assert rotel.env["ROTEL_EXPORTER_METRICS_ENDPOINT"] == f"{stack.endpoints['vmagent']}/opentelemetry"
    via = f"{metric}_via_vmagent"
    _send_metric(stack.endpoints["otlp_http"], via)
    _poll(f"{via}_total in VictoriaMetrics", lambda: _query(stack.endpoints["victoria_metrics"], f"{via}_total"), 60)

    names = ("rotel", "victoria-metrics", "vmagent")
    records = {name: read_pid_file(stack.data_dir / "run" / f"{name}.json") for name in names}
    started = time.monotonic()
    assert stack.down() == ["rotel", "vmagent", "victoria-metrics"]  # down() stops all, in reverse start order
    down_s = time.monotonic() - started
    _assert_all_stopped(stack, records)
    print(f"\nup {up_s:.1f} s (installs included), down {down_s:.1f} s")


def test_the_pinned_programs_have_the_flags_the_stack_uses(stack_dir: Path) -> None:
    stack = Stack(stack_dir, only=["rotel", "victoria-metrics", "prometheus"], out=None)
    stack.install()
    again = io.StringIO()
    stack._out = again
    assert set(stack.install()) == {"rotel", "victoria-metrics", "prometheus"}
    assert again.getvalue() == ""  # recorded in install.json: nothing to do
    rotel = stack._installer.binary("rotel", "rotel-agent")
    help_text = subprocess.run([str(rotel), "start", "--help"], capture_output=True, text=True, timeout=30).stdout
    env_file = (REPO / "collector-config" / "rotel" / "rotel.env").read_text()
    keys = re.findall(r"^(ROTEL_[A-Z_]+)=", env_file, re.M)
    flag_keys = [k for k in keys if not k.startswith("ROTEL_EXPORTER_")]  # per-exporter keys exist only as variables
    for key in flag_keys:
        assert f"[env: {key}=]" in help_text, f"rotel-agent {rotel} has no {key}"
    for key in ("ROTEL_EXPORTER_TRACES_ENDPOINT", "ROTEL_EXPORTER_METRICS_PROTOCOL"):
        assert key in keys
    version = subprocess.run([str(rotel), "--version"], capture_output=True, text=True, timeout=30).stdout
    assert "rotel" in version

    def flags(package: str, binary: str, help_flag: str = "-help") -> str:
        path = stack._installer.binary(package, binary)
        done = subprocess.run([str(path), help_flag], capture_output=True, text=True, timeout=30)
        return done.stdout + done.stderr

    vm = flags("victoria-metrics", "victoria-metrics")
    for flag in ("-storageDataPath", "-httpListenAddr", "-search.latencyOffset", "-opentelemetry.usePrometheusNaming"):
        assert f"  {flag}" in vm
    vmagent = flags("victoria-metrics", "vmagent")
    for flag in ("-remoteWrite.url", "-remoteWrite.tmpDataPath", "-remoteWrite.maxDiskUsagePerURL", "-opentelemetry.usePrometheusNaming"):
        assert f"  {flag}" in vmagent
    vmalert = flags("victoria-metrics", "vmalert")
    for flag in ("-datasource.url", "-remoteWrite.url", "-notifier.blackhole", "-rule", "-evaluationInterval"):
        assert f"  {flag}" in vmalert
    prometheus = flags("prometheus", "prometheus", "--help")
    for flag in ("--web.enable-remote-write-receiver", "--web.listen-address", "--storage.tsdb.path", "--config.file"):
        assert flag in prometheus
    manifest = json.loads((stack_dir / "install.json").read_text())
    assert manifest["victoria-metrics"]["suite"] == "trixie" and manifest["victoria-metrics"]["version"].startswith("1.")
    assert manifest["prometheus"]["suite"] == "bookworm" and manifest["prometheus"]["version"].startswith("2.42")
    assert manifest["rotel"]["version"] == "0.0.1a15"


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
    out = io.StringIO()
    stack = make_stack(out=out)
    started = time.monotonic()
    statuses = stack.up()
    up_s = time.monotonic() - started
    assert {s.name: s.state for s in statuses} == dict.fromkeys(COMPONENT_NAMES, "healthy"), out.getvalue()
    assert all(s.pid for s in statuses)
    urls = {s.name: s.urls for s in statuses}
    assert urls["phoenix"]["UI"] == stack.endpoints["phoenix"]

    trace_id = _send_span(stack.endpoints["otlp_http"])
    metric = f"stack_full_{uuid.uuid4().hex[:8]}"
    _send_metric(stack.endpoints["otlp_http"], metric)
    spans = _poll(
        f"trace {trace_id} in Phoenix",
        lambda: [
            s
            for s in _get_json(f"{stack.endpoints['phoenix']}/v1/projects/default/spans?limit=100")["data"]
            if s["context"]["trace_id"] == trace_id
        ],
        60,
    )
    assert spans[0]["name"] == "rl.step" and spans[0]["attributes"]["rl.step"] == 7
    # metrics: rotel -> vmagent -> VictoriaMetrics and Prometheus
    _poll(f"{metric}_total in VictoriaMetrics", lambda: _query(stack.endpoints["victoria_metrics"], f"{metric}_total"), 60)
    _poll(f"{metric}_total in Prometheus", lambda: _query(stack.endpoints["prometheus"], f"{metric}_total"), 60)
    assert _get_json(f"{stack.endpoints['vmalert']}/api/v1/rules")["status"] == "success"

    records = {name: read_pid_file(stack.data_dir / "run" / f"{name}.json") for name in COMPONENT_NAMES}
    started = time.monotonic()
    assert sorted(stack.down()) == sorted(COMPONENT_NAMES)
    down_s = time.monotonic() - started
    _assert_all_stopped(stack, records)
    assert {s.state for s in stack.status()} == {"stopped"}
    print(f"\nfull stack: up {up_s:.1f} s (installs included), down {down_s:.1f} s")
