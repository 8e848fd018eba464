"""The stack's behaviour that needs no installed server: port conflicts, missing programs, PID files,
the scratch apt set-up, rotel's configuration file and the command line."""

from __future__ import annotations

import hashlib
import io
import os
import socket
import subprocess
import sys
from pathlib import Path

import psutil
import pytest

from otel_rl.cli import main
from otel_rl.stack import COMPONENT_NAMES, InstallError, MissingBinaryError, PortInUseError, Stack, StackError
from otel_rl.stack._components import BUILTIN_ROTEL_ENV, Context, parse_rotel_env, plan_launch
from otel_rl.stack._install import DEBIAN_KEYRING, Installer, Package, system_debian_mirror, write_scratch_apt
from otel_rl.stack.process import PidRecord, is_alive, start_process, write_pid_file

REPO = Path(__file__).resolve().parents[2]


def _listen(host: str = "127.0.0.1") -> socket.socket:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind((host, 0))
    sock.listen(1)
    return sock


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


def test_phoenix_starts_through_the_launcher_that_keeps_its_grpc_port_on_loopback(tmp_path: Path) -> None:
    # Phoenix binds its gRPC receiver to [::] whatever PHOENIX_HOST says; the launcher rewrites the address
    # (tests/e2e/test_stack_truth_e2e.py checks the sockets of the real stack).
    from otel_rl.stack._components import Context, plan_launch

    ctx = Context(tmp_path, 0, frozenset({"phoenix"}), lambda package, name: tmp_path / "venvs" / package / "bin" / name)
    launch = plan_launch("phoenix", ctx)
    assert launch.command == [str(tmp_path / "venvs/phoenix/bin/python"), str(tmp_path / "config/phoenix_loopback.py"), "serve"]
    text = (tmp_path / "config/phoenix_loopback.py").read_text()
    compile(text, "phoenix_loopback.py", "exec")
    assert 'return "127.0.0.1:" + port' in text and "from phoenix.server.main import main" in text
    assert launch.env["PHOENIX_HOST"] == "127.0.0.1"


def test_missing_binary_names_the_path_and_the_install_command(tmp_path: Path, free_offset) -> None:
    stack = Stack(tmp_path, port_offset=free_offset(), only=["victoria-metrics"], out=None)
    with pytest.raises(MissingBinaryError) as err:
        stack.up(install=False)
    expected = tmp_path.resolve() / "debs" / "victoria-metrics" / "usr" / "bin" / "victoria-metrics"
    assert err.value.path == str(expected)
    assert str(expected) in str(err.value) and "otel-rl stack install" in str(err.value)
    assert stack.down() == []  # safe after a failed up()


def test_a_failed_install_shows_the_tool_output_and_what_to_try(tmp_path: Path) -> None:
    out = io.StringIO()
    installer = Installer(tmp_path, tmp_path / "cache", lambda: out)
    missing = tmp_path / "no-such-project"  # a local requirement: pip fails at once, without the network
    with pytest.raises(InstallError) as err:
        installer._install_one(Package("bogus", "pypi", str(missing), binaries=("bogus",)))
    message = str(err.value)
    assert f"pip install {missing} failed" in message and "exited 1" in message
    assert str(missing) in message.split("last lines of", 1)[1]  # pip's own complaint, from the log tail
    assert "check that PyPI is reachable" in message
    assert out.getvalue() == f"installing bogus (PyPI {missing})... failed\n"
    assert "bogus" not in installer.manifest()


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
    # A real process in the PID file that does not answer vmagent's health check.
    offset = free_offset()
    stack = Stack(tmp_path, port_offset=offset, out=None)
    rec = start_process(
        "vmagent",
        [sys.executable, "-c", "import time; time.sleep(120)"],
        env=dict(os.environ),
        extra_env={},
        ports={"http": 8429 + offset},
        log_path=tmp_path / "logs" / "vmagent.log",
        pid_path=tmp_path / "run" / "vmagent.json",
        cwd=tmp_path,
    )
    try:
        row = {s.name: s for s in stack.status()}["vmagent"]
        assert (row.state, row.pid) == ("unhealthy", rec.pid)
        # The data folder's stack runs at `offset`: another explicit offset is refused, none adopts it.
        with pytest.raises(StackError, match=f"runs with port offset {offset}, not {offset + 1}"):
            Stack(tmp_path, port_offset=offset + 1, only="vmagent", out=None).up(install=False)
        assert Stack(tmp_path, out=None).status()[0].ports == {"otlp_grpc": 4317 + offset, "otlp_http": 4318 + offset}
        assert stack.down(only="vmagent") == ["vmagent"]
        assert not is_alive(rec)
        assert not (tmp_path / "run" / "vmagent.json").exists()
    finally:
        if is_alive(rec):
            os.killpg(rec.pid, 9)


def test_status_of_nothing_is_all_stopped(tmp_path: Path) -> None:
    statuses = Stack(tmp_path / "none", port_offset=1000, out=None).status()
    assert [s.name for s in statuses] == list(COMPONENT_NAMES)
    assert {s.state for s in statuses} == {"stopped"}
    assert {s.name: s.ports for s in statuses}["phoenix"] == {"http": 7006, "grpc": 5327}


# -- options ----------------------------------------------------------------------------------


def test_bad_component_and_offset_are_named(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog) -> None:
    with pytest.raises(ValueError, match="unknown stack component 'grafana'.*rotel, victoria-metrics"):
        Stack(tmp_path, only="rotel,grafana")
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
        "victoria_metrics": "http://127.0.0.1:8528",
        "vmagent": "http://127.0.0.1:8529",
        "prometheus": "http://127.0.0.1:9190",
        "phoenix": "http://127.0.0.1:6106",
        "vmalert": "http://127.0.0.1:8980",
    }


def test_default_data_dir_is_dot_stack_in_the_working_directory(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("OTEL_RL_STACK_DIR", raising=False)
    monkeypatch.chdir(tmp_path)
    assert Stack().data_dir == tmp_path.resolve() / ".stack"
    assert ".stack/" in (REPO / ".gitignore").read_text().splitlines()


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


# -- rotel's configuration --------------------------------------------------------------------


def test_rotel_env_file_and_builtin_copy_are_identical() -> None:
    assert (REPO / "collector-config" / "rotel" / "rotel.env").read_text() == BUILTIN_ROTEL_ENV


def test_rotel_routes_metrics_through_vmagent_only_when_it_runs(tmp_path: Path) -> None:
    def launch(running):
        ctx = Context(data_dir=tmp_path, offset=100, running=frozenset(running), binary=lambda p, b: tmp_path / b)
        return plan_launch("rotel", ctx)

    full = launch(COMPONENT_NAMES)
    assert full.env["ROTEL_EXPORTER_METRICS_ENDPOINT"] == "http://127.0.0.1:8529/opentelemetry"
    assert full.env["ROTEL_EXPORTER_TRACES_ENDPOINT"] == "http://127.0.0.1:6106"
    assert full.env["ROTEL_OTLP_GRPC_ENDPOINT"] == "127.0.0.1:4417"
    assert full.env["ROTEL_BATCH_TIMEOUT"] == "200ms"
    assert full.env["ROTEL_EXPORTERS"] == "traces:otlp,metrics:otlp,logs:blackhole"
    assert full.env["ROTEL_EXPORTER_LOGS_ENDPOINT"] == "http://127.0.0.1:4419"
    assert launch({"rotel", "victoria-metrics"}).env["ROTEL_EXPORTER_METRICS_ENDPOINT"] == "http://127.0.0.1:8528/opentelemetry"
    assert full.command[1] == "start" and full.drop_env_prefixes == ("ROTEL_",)


def test_rotel_env_errors_name_the_line() -> None:
    with pytest.raises(ValueError, match=r"x.env:2: unknown placeholder \$\{NOPE\}"):
        parse_rotel_env("# c\nROTEL_A=${NOPE}\n", {"PORT": "1"}, "x.env")
    with pytest.raises(ValueError, match="x.env:1: expected ROTEL_NAME=value"):
        parse_rotel_env("export FOO=1\n", {}, "x.env")
    assert parse_rotel_env("ROTEL_A='a ${PORT}'\n", {"PORT": "1"}) == {"ROTEL_A": "a 1"}


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
    for word in ("install", "up", "down", "status", "--port-offset", "rotel", "phoenix"):
        assert word in out
    assert main(["stack", "status", "--dir", str(tmp_path)]) == 1  # nothing healthy
    out = capsys.readouterr().out
    assert "victoria-metrics" in out and "stopped" in out and "http://127.0.0.1:6006" in out
    assert main(["stack", "up", "--dir", str(tmp_path), "--only", "nginx"]) == 2
    assert "unknown stack component 'nginx'" in capsys.readouterr().err
    assert main(["stack"]) == 2
