"""The stack's behaviour that needs no installed server: port conflicts, missing programs, PID files,
the scratch apt set-up, the configs the collectors and Jaeger run with, Go missing, and the command line."""

from __future__ import annotations

import hashlib
import io
import os
import random
import socket
import subprocess
import sys
from pathlib import Path

import psutil
import pytest

from otel_rl.cli import main
from otel_rl.stack import COMPONENT_NAMES, InstallError, MissingBinaryError, PortInUseError, Stack, StackError
from otel_rl.stack._components import Context, plan_launch
from otel_rl.stack._go_build import find_go
from otel_rl.stack._install import DEBIAN_KEYRING, Installer, system_debian_mirror, write_scratch_apt
from otel_rl.stack.process import PidRecord, is_alive, start_process, write_pid_file

REPO = Path(__file__).resolve().parents[2]


def _listen(host: str = "127.0.0.1") -> socket.socket:
    """A listening socket on a free port low enough that a stack moved onto it keeps every port
    under 65536 (an ephemeral port can be above 57277, past what a port offset may reach)."""
    for port in random.Random().sample(range(20000, 48000), 200):
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        try:
            sock.bind((host, port))
        except OSError:
            sock.close()
            continue
        sock.listen(1)
        return sock
    raise RuntimeError("no free port in 20000-48000")


# -- ports ------------------------------------------------------------------------------------


def test_port_in_use_names_port_component_holder_and_fix(tmp_path: Path) -> None:
    with _listen() as sock:
        port = sock.getsockname()[1]
        stack = Stack(tmp_path, port_offset=port - 8428, only=["victoria-metrics"], out=None)
        with pytest.raises(PortInUseError) as err:
            stack.up()
    exc = err.value
    assert (exc.port, exc.component) == (port, "victoria-metrics")
    message = str(exc)
    assert f"port {port}" in message and "victoria-metrics" in message
    assert f"pid {os.getpid()}" in message  # who holds it: this test process
    assert "otel-rl stack down" in message and "--port-offset" in message
    assert not (tmp_path / "debs").exists(), "ports are checked before anything is installed"
    assert not list(tmp_path.glob("run/*.json"))


def test_missing_binary_names_the_path_and_the_install_command(tmp_path: Path, free_offset) -> None:
    stack = Stack(tmp_path, port_offset=free_offset(), only=["victoria-metrics"], out=None)
    with pytest.raises(MissingBinaryError) as err:
        stack.up(install=False)
    expected = tmp_path.resolve() / "debs" / "victoria-metrics" / "usr" / "bin" / "victoria-metrics"
    assert err.value.path == str(expected)
    assert str(expected) in str(err.value) and "otel-rl stack install" in str(err.value)
    assert stack.down() == []  # safe after a failed up()


def test_a_failed_build_shows_the_tool_output_and_what_to_try(tmp_path: Path) -> None:
    # A manifest whose module does not exist: the builder fails at once, before any download.
    manifest = tmp_path / "builder-config.yaml"
    text = (REPO / "collector-config" / "builder-config.yaml").read_text()
    manifest.write_text(text.replace("version: 0.161.0", "version: 0.0.0-no-such-release", 1))
    out = io.StringIO()
    installer = Installer(tmp_path, tmp_path / "cache", lambda: out, collector_manifest=manifest)
    if find_go() is None:
        with pytest.raises(InstallError, match="built from Go modules and the `go` command is not on PATH"):
            installer.install(["otelcol"])
        return
    with pytest.raises(InstallError) as err:
        installer.install(["otelcol"])
    message = str(err.value)
    assert "installing the collector builder v0.0.0-no-such-release failed" in message
    assert "last lines of" in message and "builder@v0.0.0-no-such-release" in message.split("last lines of", 1)[1]
    assert out.getvalue().startswith("installing otelcol (Go modules: collector-config/builder-config.yaml)... \n")
    assert "otelcol" not in installer.manifest()


def test_without_go_up_starts_the_rest_and_says_so_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, free_offset) -> None:
    monkeypatch.setenv("OTEL_RL_GO", str(tmp_path / "no-go"))  # a go that is not there
    out = io.StringIO()
    stack = Stack(tmp_path, port_offset=free_offset(), out=out)
    assert stack._startable() == ("victoria-metrics", "vmalert", "prometheus")
    line = out.getvalue()
    assert line.count("\n") == 1 and line.startswith("otelcol-agent, otelcol-gateway, jaeger: not started")
    assert "https://go.dev/dl/" in line and "Starting the rest" in line
    # Asked for by name, they are an error that says what to install.
    with pytest.raises(InstallError, match="jaeger: built from Go modules, and the `go` command is not on PATH"):
        Stack(tmp_path, only="jaeger", out=None).up()
    # Once built (here: a binary in place and its install record), they run without Go.
    (tmp_path / "bin").mkdir()
    for name in ("otelcol-rl", "jaeger"):
        (tmp_path / "bin" / name).write_text("#!/bin/sh\n")
        (tmp_path / "bin" / name).chmod(0o755)
    installer = stack._installer
    record = {p: {"source": "go", "build_key": installer.build_key(p), "version": "x"} for p in ("otelcol", "jaeger")}
    installer.manifest_path.write_text(__import__("json").dumps(record))
    assert Stack(tmp_path, out=None)._startable() == COMPONENT_NAMES


# -- PID files --------------------------------------------------------------------------------


def _dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def test_status_of_a_stale_pid_file_and_down_removes_it(tmp_path: Path) -> None:
    stack = Stack(tmp_path, out=None)
    pid_file = tmp_path / "run" / "victoria-metrics.json"
    write_pid_file(pid_file, PidRecord("victoria-metrics", _dead_pid(), 1.0, {"http": 8428}, ["victoria-metrics"]))
    row = {s.name: s for s in stack.status()}["victoria-metrics"]
    assert row.state == "stale pid file" and not row.healthy
    assert "otel-rl stack down" in row.note
    assert stack.down() == []
    assert not pid_file.exists()


def test_a_reused_pid_is_never_signalled(tmp_path: Path) -> None:
    # A PID file naming this very test process, with another start time: the PID was reused.
    stack = Stack(tmp_path, out=None)
    me = psutil.Process()
    write_pid_file(
        tmp_path / "run" / "prometheus.json", PidRecord("prometheus", me.pid, me.create_time() - 1000, {"http": 9090}, ["prometheus"])
    )
    assert {s.name: s.state for s in stack.status()}["prometheus"] == "stale pid file"
    stack.down()  # must not kill us
    assert me.is_running()


def test_unhealthy_process_is_reported_and_stopped_by_its_pid(tmp_path: Path, free_offset) -> None:
    # A real process in the PID file that does not answer vmalert's health check.
    offset = free_offset()
    stack = Stack(tmp_path, port_offset=offset, out=None)
    rec = start_process(
        "vmalert",
        [sys.executable, "-c", "import time; time.sleep(120)"],
        env=dict(os.environ),
        extra_env={},
        ports={"http": 8880 + offset},
        log_path=tmp_path / "logs" / "vmalert.log",
        pid_path=tmp_path / "run" / "vmalert.json",
        cwd=tmp_path,
    )
    try:
        row = {s.name: s for s in stack.status()}["vmalert"]
        assert (row.state, row.pid) == ("unhealthy", rec.pid)
        # The data folder's stack runs at `offset`: another explicit offset is refused, none adopts it.
        with pytest.raises(StackError, match=f"runs with port offset {offset}, not {offset + 1}"):
            Stack(tmp_path, port_offset=offset + 1, only="vmalert", out=None).up(install=False)
        assert Stack(tmp_path, out=None).status()[0].ports == {
            "otlp_grpc": 4317 + offset,
            "otlp_http": 4318 + offset,
            "health": 13133 + offset,
            "telemetry": 8888 + offset,
        }
        assert stack.down(only="vmalert") == ["vmalert"]
        assert not is_alive(rec)
        assert not (tmp_path / "run" / "vmalert.json").exists()
    finally:
        if is_alive(rec):
            os.killpg(rec.pid, 9)


def test_status_of_nothing_is_all_stopped(tmp_path: Path) -> None:
    statuses = Stack(tmp_path / "none", port_offset=1000, out=None).status()
    assert [s.name for s in statuses] == list(COMPONENT_NAMES)
    assert {s.state for s in statuses} == {"stopped"}
    assert {s.name: s.ports for s in statuses}["jaeger"] == {"http": 17686, "grpc": 17685, "otlp_grpc": 5327}


# -- options ----------------------------------------------------------------------------------


def test_bad_component_and_offset_are_named(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog) -> None:
    with pytest.raises(ValueError, match="unknown stack component 'grafana'.*otelcol-agent, otelcol-gateway, jaeger"):
        Stack(tmp_path, only="jaeger,grafana")
    with pytest.raises(ValueError, match="port offset 60000"):
        Stack(tmp_path, port_offset=60000)
    monkeypatch.setenv("OTEL_RL_STACK_PORT_OFFSET", "lots")
    assert Stack(tmp_path).port_offset == 0
    assert "OTEL_RL_STACK_PORT_OFFSET='lots'" in caplog.text
    monkeypatch.setenv("OTEL_RL_STACK_PORT_OFFSET", "100")
    monkeypatch.setenv("OTEL_RL_STACK_DIR", str(tmp_path / "from-env"))
    stack = Stack()
    assert stack.port_offset == 100 and stack.data_dir == tmp_path / "from-env"
    assert stack.endpoints == {
        "otlp_grpc": "http://127.0.0.1:4417",
        "otlp_http": "http://127.0.0.1:4418",
        "gateway_grpc": "http://127.0.0.1:4517",
        "gateway_http": "http://127.0.0.1:4518",
        "gateway_scrape": "http://127.0.0.1:8989",
        "jaeger": "http://127.0.0.1:16786",
        "victoria_metrics": "http://127.0.0.1:8528",
        "prometheus": "http://127.0.0.1:9190",
        "vmalert": "http://127.0.0.1:8980",
    }


def test_default_data_dir_is_the_same_from_any_working_directory(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("OTEL_RL_STACK_DIR", raising=False)
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "data"))
    for cwd in (tmp_path, REPO):
        monkeypatch.chdir(cwd)
        assert Stack().data_dir == (tmp_path / "data" / "otel-rl" / "stack").resolve()
    monkeypatch.delenv("XDG_DATA_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert Stack().data_dir == (tmp_path / "home" / ".local" / "share" / "otel-rl" / "stack").resolve()
    assert ".stack/" in (REPO / ".gitignore").read_text().splitlines()  # scripts/test.sh's --dir


# -- scratch apt ------------------------------------------------------------------------------


def _tree_fingerprint(root: Path) -> dict[str, tuple]:
    out = {}
    for path in sorted([root, *root.rglob("*")]):
        st = path.lstat()
        digest = hashlib.sha256(path.read_bytes()).hexdigest() if path.is_file() and not path.is_symlink() else ""
        out[str(path)] = (st.st_mode, st.st_mtime_ns, st.st_size, digest)
    return out


def test_system_mirror_read_from_deb822_and_one_line_sources(tmp_path: Path) -> None:
    etc = tmp_path / "etc-apt"
    (etc / "sources.list.d").mkdir(parents=True)
    (etc / "sources.list.d" / "debian.sources").write_text(
        "Types: deb\n# a comment\nURIs: http://mirror.example/debian-security\nSuites: bookworm-security\nComponents: main\n\n"
        "Types: deb\nURIs: http://disabled.example/debian\nSuites: bookworm\nEnabled: no\n\n"
        "Types: deb\nURIs: http://mirror.example/debian/\nSuites: bookworm bookworm-updates\nComponents: main\n"
    )
    assert system_debian_mirror(etc) == "http://mirror.example/debian"
    (etc / "sources.list.d" / "debian.sources").unlink()
    (etc / "sources.list").write_text("# old style\ndeb [arch=amd64] http://old.example/debian bookworm main\n")
    assert system_debian_mirror(etc) == "http://old.example/debian"
    (etc / "sources.list").write_text("deb http://ppa.example/ubuntu jammy main\n")
    with pytest.raises(StackError, match="no Debian archive"):
        system_debian_mirror(etc)


@pytest.mark.skipif(not Path("/etc/apt").is_dir(), reason="not a Debian system")
def test_scratch_apt_uses_the_system_mirror_and_never_touches_etc_apt(tmp_path: Path) -> None:
    before = _tree_fingerprint(Path("/etc/apt"))
    mirror = system_debian_mirror()
    conf = write_scratch_apt(tmp_path / "apt", mirror=mirror)
    sources = (tmp_path / "apt" / "sources.list").read_text().splitlines()
    assert sources == [f"deb [signed-by={DEBIAN_KEYRING}] {mirror} trixie main", f"deb [signed-by={DEBIAN_KEYRING}] {mirror} bookworm main"]
    text = conf.read_text()
    assert 'Dir::Etc::SourceParts "/dev/null";' in text and f'Dir::Etc::Trusted "{DEBIAN_KEYRING}";' in text
    # apt itself reads the scratch set-up: every list, cache and state path is under tmp_path.
    env = dict(os.environ, APT_CONFIG=str(conf))
    dump = subprocess.run(["apt-config", "dump"], env=env, capture_output=True, text=True, check=True).stdout
    settings = dict(line.split(" ", 1) for line in dump.splitlines() if " " in line)
    for key in ("Dir::Etc::sourcelist", "Dir::State", "Dir::Cache", "Dir::Etc::main", "Dir::Etc::parts", "Dir::State::status"):
        assert str(tmp_path) in settings[key], (key, settings[key])
    assert "APT::Update::Post-Invoke-Success" not in dump  # the system's hooks are not read
    assert _tree_fingerprint(Path("/etc/apt")) == before


# -- what the collectors, Jaeger and Prometheus run with ----------------------------------------


def _context(tmp_path: Path, running, offset: int = 100) -> Context:
    return Context(data_dir=tmp_path, offset=offset, running=frozenset(running), binary=lambda p, b: tmp_path / "bin" / b)


def _yaml(path: str) -> dict:
    import yaml

    return yaml.safe_load(Path(path).read_text())


def test_the_collectors_run_the_projects_configs_with_an_overlay_of_ports_and_routes(tmp_path: Path) -> None:
    gateway = plan_launch("otelcol-gateway", _context(tmp_path, COMPONENT_NAMES))
    configs = [gateway.command[i + 1] for i, arg in enumerate(gateway.command) if arg == "--config"]
    otelcol = REPO / "collector-config" / "otelcol"
    assert gateway.command[0] == str(tmp_path / "bin" / "otelcol-rl")
    assert configs == [str(otelcol / "gateway.yaml"), str(tmp_path / "config" / "otelcol-gateway.yaml")]
    overlay = _yaml(configs[-1])
    assert overlay["receivers"]["otlp"]["protocols"]["grpc"]["endpoint"] == "127.0.0.1:4517"
    assert overlay["extensions"]["health_check"]["endpoint"] == "127.0.0.1:13333"
    assert overlay["exporters"]["prometheus"]["endpoint"] == "127.0.0.1:8989"
    pipelines = overlay["service"]["pipelines"]
    assert pipelines["traces"]["exporters"] == ["otlp_grpc/jaeger"]  # no Tempo here
    assert pipelines["metrics"]["exporters"] == ["prometheus_remote_write", "prometheus"]
    assert overlay["service"]["telemetry"]["metrics"]["readers"][0]["pull"]["exporter"]["prometheus"] == {"host": "127.0.0.1", "port": 9088}
    assert gateway.env["OTEL_GATEWAY_JAEGER_ENDPOINT"] == "127.0.0.1:4427"
    assert gateway.env["OTEL_GATEWAY_REMOTE_WRITE_URL"] == "http://127.0.0.1:8528/api/v1/write"
    assert gateway.env["OTEL_GATEWAY_EVENTS_FILE"] == str(tmp_path / "data" / "otelcol-gateway" / "rl-events.jsonl")
    assert gateway.drop_env_prefixes == ("OTEL_",)  # a training job's OTEL_* settings never reach the collector
    # Without Jaeger and VictoriaMetrics the pipelines name only what runs; with the bridge, its overlay joins.
    alone = plan_launch("otelcol-gateway", _context(tmp_path, {"otelcol-gateway", "bridge"}))
    overlay = _yaml(str(tmp_path / "config" / "otelcol-gateway.yaml"))
    assert overlay["service"]["pipelines"]["traces"]["exporters"] == ["nop"] and "nop" in overlay["exporters"]
    assert overlay["service"]["pipelines"]["metrics"]["exporters"] == ["prometheus"]
    assert str(otelcol / "gateway-bridge.yaml") in alone.command
    assert alone.env["OTEL_RL_BRIDGE_ENDPOINT"] == "http://127.0.0.1:4419"
    assert alone.env["OTEL_RL_STACK_CONFIG_SHA256"] != gateway.env["OTEL_RL_STACK_CONFIG_SHA256"]  # another launch: a restart

    agent = plan_launch("otelcol-agent", _context(tmp_path, COMPONENT_NAMES))
    assert [agent.command[i + 1] for i, a in enumerate(agent.command) if a == "--config"] == [
        str(otelcol / "agent.yaml"),
        str(tmp_path / "config" / "otelcol-agent.yaml"),
    ]
    assert agent.env["OTEL_GATEWAY_ENDPOINT"] == "127.0.0.1:4517"
    assert agent.env["OTEL_AGENT_STORAGE_DIR"] == str(tmp_path / "data" / "otelcol-agent" / "queue")
    assert _yaml(str(tmp_path / "config" / "otelcol-agent.yaml"))["receivers"]["otlp"]["protocols"]["http"]["endpoint"] == "127.0.0.1:4418"


def test_jaeger_and_prometheus_listen_on_loopback_only(tmp_path: Path) -> None:
    jaeger = plan_launch("jaeger", _context(tmp_path, COMPONENT_NAMES))
    config = _yaml(jaeger.command[-1])
    query = config["extensions"]["jaeger_query"]
    assert (query["http"]["endpoint"], query["grpc"]["endpoint"]) == ("127.0.0.1:16786", "127.0.0.1:16785")
    assert query["enable_tracing"] is False  # its own spans would go to OTLP's default port: the agent's
    assert config["receivers"]["otlp"]["protocols"] == {"grpc": {"endpoint": "127.0.0.1:4427"}}
    assert config["service"]["telemetry"]["metrics"] == {"level": "none"}  # no :8888 on every interface
    badger = config["extensions"]["jaeger_storage"]["backends"]["local"]["badger"]
    assert badger["directories"]["keys"].startswith(str(tmp_path / "data" / "jaeger"))
    prometheus = plan_launch("prometheus", _context(tmp_path, COMPONENT_NAMES))
    assert "--web.listen-address=127.0.0.1:9190" in prometheus.command
    scrape = _yaml(str(tmp_path / "config" / "prometheus.yml"))["scrape_configs"][0]
    assert scrape["honor_labels"] is True and scrape["static_configs"] == [{"targets": ["127.0.0.1:8989"]}]


def test_outside_a_checkout_the_collectors_name_what_they_need(tmp_path: Path) -> None:
    ctx = _context(tmp_path, COMPONENT_NAMES)
    ctx.collector_config = tmp_path / "nowhere"
    with pytest.raises(ValueError, match="has no gateway.yaml: run from an otel-rl checkout, or give the folder with --collector-config"):
        plan_launch("otelcol-agent", ctx)


def test_vmalert_uses_an_empty_rules_file_without_rule_files(tmp_path: Path) -> None:
    ctx = Context(
        data_dir=tmp_path, offset=0, running=frozenset(COMPONENT_NAMES), binary=lambda p, b: tmp_path / b, rules_dir=tmp_path / "no-rules"
    )
    command = plan_launch("vmalert", ctx).command
    empty = tmp_path / "config" / "alerts-empty.yml"
    assert f"-rule={empty}" in command and "groups: []" in empty.read_text()
    rules = tmp_path / "rules"
    rules.mkdir()
    (rules / "a.yml").write_text("groups: []\n")
    (rules / "notes.md").write_text("not a rule file\n")
    ctx.rules_dir = rules
    assert [a for a in plan_launch("vmalert", ctx).command if a.startswith("-rule=")] == [f"-rule={rules / 'a.yml'}"]


# -- command line -----------------------------------------------------------------------------


def test_cli_help_and_status(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    with pytest.raises(SystemExit) as done:
        main(["stack", "--help"])
    assert done.value.code == 0
    out = capsys.readouterr().out
    for word in ("install", "up", "down", "status", "--port-offset", "otelcol-agent", "otelcol-gateway", "jaeger"):
        assert word in out
    assert main(["stack", "status", "--dir", str(tmp_path)]) == 1  # nothing healthy
    out = capsys.readouterr().out
    assert "victoria-metrics" in out and "stopped" in out and "http://127.0.0.1:16686/api/traces" in out
    assert main(["stack", "up", "--dir", str(tmp_path), "--only", "nginx"]) == 2
    assert "unknown stack component 'nginx'" in capsys.readouterr().err
    assert main(["stack"]) == 2
