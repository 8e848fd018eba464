"""Configuration (otel_rl._sdk.settings.config.resolve_config): explicit arguments beat the environment, the
environment beats the config file, the file beats the defaults; bad values are reported the way the
module promises (env: warn once and fall back; argument: ValueError naming the option)."""

from __future__ import annotations

import logging
import re
from pathlib import Path

import pytest

import otel_rl._sdk.settings.config as _config
from otel_rl._sdk.settings.config import TelemetryConfig, load_config_file, resolve_config


@pytest.fixture(autouse=True)
def _fresh_warn_once_state():
    # "warn once" is per process; give every test a fresh memory so the order of tests does not matter.
    _config._report_env_once.forget()


def _write(path: Path, text: str) -> Path:
    path.write_text(text, encoding="utf-8")
    return path


def _warnings(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "otel_rl" and r.levelno == logging.WARNING]


# ---------------------------------------------------------------------------- precedence matrix

# field, env variable, kwarg value, raw env value, config-file YAML value,
# expected from kwarg, from env, from file, default
MATRIX = [
    ("service_name", "OTEL_SERVICE_NAME", "from-kwarg", "from-env", "from-file", "from-kwarg", "from-env", "from-file", "otel-rl"),
    (
        "endpoint",
        "OTEL_EXPORTER_OTLP_ENDPOINT",
        "http://kwarg:4318",
        "http://env:4318",
        "http://file:4318",
        "http://kwarg:4318",
        "http://env:4318",
        "http://file:4318",
        None,
    ),
    ("protocol", "OTEL_EXPORTER_OTLP_PROTOCOL", "grpc", "http/protobuf", "grpc", "grpc", "http/protobuf", "grpc", "http/protobuf"),
    # the environment variable is in milliseconds (as in every OTel SDK); argument and file in seconds
    ("metric_export_interval_s", "OTEL_METRIC_EXPORT_INTERVAL", 2.0, "3000", 4.0, 2.0, 3.0, 4.0, 10.0),
    ("console", "OTEL_RL_CONSOLE", False, "true", False, False, True, False, True),
    ("strict", "OTEL_RL_STRICT", False, "yes", False, False, True, False, False),
    ("unmapped_key_limit", "OTEL_RL_UNMAPPED_KEY_LIMIT", 7, "8", 9, 7, 8, 9, 256),
    ("exporters", "OTEL_RL_EXPORTERS", "otlp", "file", ["otlp", "file"], ("otlp",), ("file",), ("otlp", "file"), ("auto",)),
    ("framework", "OTEL_RL_FRAMEWORK", "roll", "verl", "trl", "roll", "verl", "trl", None),
    ("rank", "RANK", 1, "2", 3, 1, 2, 3, None),
]


def _yaml_scalar(value) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, list):
        return "[" + ", ".join(value) + "]"
    if isinstance(value, str):
        return f'"{value}"'
    return str(value)


@pytest.mark.parametrize("level", ["kwarg", "env", "file", "default"])
@pytest.mark.parametrize("row", MATRIX, ids=[r[0] for r in MATRIX])
def test_precedence(tmp_path, row, level):
    field, env_name, kwarg, env_raw, file_value, from_kwarg, from_env, from_file, default = row
    config_file = _write(tmp_path / "otel-rl.yaml", f"{field}: {_yaml_scalar(file_value)}\n")
    sources = ["kwarg", "env", "file", "default"]
    present = sources[sources.index(level) :]  # every source at or below `level` is set
    kwargs = {field: kwarg} if "kwarg" in present else {}
    environ = {env_name: env_raw} if "env" in present else {}
    if "file" in present:
        environ["OTEL_RL_CONFIG"] = str(config_file)
    expected = {"kwarg": from_kwarg, "env": from_env, "file": from_file, "default": default}[level]
    config = resolve_config(kwargs, environ)
    assert getattr(config, field) == expected
    assert getattr(TelemetryConfig(), field) == default


def test_defaults_without_any_source():
    config = resolve_config({}, {})
    assert config.service_name == "otel-rl"
    assert config.exporters == ("auto",)
    assert config.endpoint is None
    assert config.protocol == "http/protobuf"
    assert config.metric_export_interval_s == 10.0
    assert config.console is True and config.strict is False
    assert config.unmapped_key_limit == 256
    assert config.config_file is None


def test_none_kwarg_means_not_given():
    config = resolve_config({"service_name": None, "console": None}, {"OTEL_SERVICE_NAME": "env-name", "OTEL_RL_CONSOLE": "0"})
    assert config.service_name == "env-name"
    assert config.console is False


def test_empty_env_value_is_ignored(tmp_path):
    cfg = _write(tmp_path / "c.yaml", "service_name: from-file\n")
    config = resolve_config({}, {"OTEL_SERVICE_NAME": "", "OTEL_RL_CONFIG": str(cfg)})
    assert config.service_name == "from-file"


def test_config_file_kwarg_beats_otel_rl_config_env(tmp_path):
    from_kwarg = _write(tmp_path / "kwarg.yaml", "service_name: kwarg-file\n")
    from_env = _write(tmp_path / "env.yaml", "service_name: env-file\n")
    config = resolve_config({"config_file": str(from_kwarg)}, {"OTEL_RL_CONFIG": str(from_env)})
    assert config.service_name == "kwarg-file"
    assert config.config_file == str(from_kwarg)


def test_env_reads_os_environ_by_default(monkeypatch):
    monkeypatch.setenv("OTEL_SERVICE_NAME", "from-os-environ")
    monkeypatch.delenv("OTEL_RL_CONFIG", raising=False)
    assert resolve_config({}).service_name == "from-os-environ"


def test_protocol_http_shorthand_and_case():
    assert resolve_config({}, {"OTEL_EXPORTER_OTLP_PROTOCOL": "http"}).protocol == "http/protobuf"
    assert resolve_config({}, {"OTEL_EXPORTER_OTLP_PROTOCOL": "GRPC"}).protocol == "grpc"


@pytest.mark.parametrize(
    ("raw", "expected"),
    [("1", True), ("true", True), ("YES", True), (" on ", True), ("0", False), ("false", False), ("No", False), ("off", False)],
)
def test_console_env_booleans(raw, expected):
    assert resolve_config({}, {"OTEL_RL_CONSOLE": raw}).console is expected


# ---------------------------------------------------------------------------- invalid environment values

INVALID_ENV = [
    ("OTEL_RL_CONSOLE", "maybe", "console", True),
    ("OTEL_EXPORTER_OTLP_PROTOCOL", "http/json", "protocol", "http/protobuf"),
    ("OTEL_METRIC_EXPORT_INTERVAL", "-5", "metric_export_interval_s", 10.0),
    ("OTEL_METRIC_EXPORT_INTERVAL", "0", "metric_export_interval_s", 10.0),
    ("OTEL_METRIC_EXPORT_INTERVAL", "soon", "metric_export_interval_s", 10.0),
    ("OTEL_RL_EXPORTERS", "kafka", "exporters", ("auto",)),
    ("OTEL_RL_UNMAPPED_KEY_LIMIT", "-1", "unmapped_key_limit", 256),
    ("RANK", "first", "rank", None),
]


@pytest.mark.parametrize(("env_name", "raw", "field", "default"), INVALID_ENV, ids=[f"{e}={r}" for e, r, _, _ in INVALID_ENV])
def test_invalid_env_warns_once_and_falls_back_to_the_default(caplog, env_name, raw, field, default):
    caplog.set_level(logging.WARNING, logger="otel_rl")
    environ = {env_name: raw}
    first = resolve_config({}, environ)
    second = resolve_config({}, environ)
    assert getattr(first, field) == default
    assert getattr(second, field) == default
    warnings = _warnings(caplog)
    assert len(warnings) == 1, warnings
    assert env_name in warnings[0]
    assert repr(raw) in warnings[0]


def test_invalid_env_falls_back_to_the_config_file(tmp_path, caplog):
    caplog.set_level(logging.WARNING, logger="otel_rl")
    cfg = _write(tmp_path / "c.yaml", "console: false\nprotocol: grpc\n")
    config = resolve_config({}, {"OTEL_RL_CONSOLE": "maybe", "OTEL_EXPORTER_OTLP_PROTOCOL": "http/json", "OTEL_RL_CONFIG": str(cfg)})
    assert config.console is False
    assert config.protocol == "grpc"
    warnings = _warnings(caplog)
    assert len(warnings) == 2
    assert any("OTEL_RL_CONSOLE" in w for w in warnings) and any("OTEL_EXPORTER_OTLP_PROTOCOL" in w for w in warnings)


def test_invalid_env_is_not_consulted_when_a_kwarg_is_given(caplog):
    caplog.set_level(logging.WARNING, logger="otel_rl")
    assert resolve_config({"console": False}, {"OTEL_RL_CONSOLE": "maybe"}).console is False
    assert _warnings(caplog) == []


def test_a_different_invalid_value_warns_again(caplog):
    caplog.set_level(logging.WARNING, logger="otel_rl")
    resolve_config({}, {"OTEL_RL_CONSOLE": "maybe"})
    resolve_config({}, {"OTEL_RL_CONSOLE": "maybe"})
    resolve_config({}, {"OTEL_RL_CONSOLE": "perhaps"})
    assert len(_warnings(caplog)) == 2


# ---------------------------------------------------------------------------- invalid arguments

INVALID_KWARGS = [
    ("console", "maybe"),
    ("strict", "sometimes"),
    ("protocol", "http/json"),
    ("protocol", "udp"),
    ("metric_export_interval_s", -5),
    ("metric_export_interval_s", 0),
    ("metric_export_interval_s", "soon"),
    ("exporters", "otlp,bogus"),
    ("exporters", ""),
    ("exporters", ["file", "kafka"]),
    ("unmapped_key_limit", -1),
    ("rank", "first"),
]


@pytest.mark.parametrize(("name", "value"), INVALID_KWARGS, ids=[f"{n}={v!r}" for n, v in INVALID_KWARGS])
def test_invalid_kwarg_raises_value_error_naming_the_option(name, value):
    with pytest.raises(ValueError, match=re.escape(f"otel_rl.init({name}=")) as info:
        resolve_config({name: value}, {})
    assert repr(value) in str(info.value)


@pytest.mark.parametrize(("name", "value", "accepted_as"), [("console", 0, False), ("strict", 1, True), ("protocol", 5, None)])
def test_int_kwarg_for_a_text_parsed_option_is_accepted_or_a_value_error(name, value, accepted_as):
    # Either reading 0/1 as a boolean or refusing with ValueError is fine; AttributeError is not.
    try:
        config = resolve_config({name: value}, {})
    except ValueError as exc:
        assert f"otel_rl.init({name}=" in str(exc)
    else:
        assert accepted_as is not None and getattr(config, name) is accepted_as


@pytest.mark.parametrize("name", ["metric_export_interval_s", "unmapped_key_limit"])
def test_bool_kwarg_for_a_numeric_option_raises(name):
    with pytest.raises(ValueError, match=re.escape(f"otel_rl.init({name}=")):
        resolve_config({name: True}, {})


def test_unknown_kwarg_raises_type_error_listing_known_options():
    with pytest.raises(TypeError) as info:
        resolve_config({"servce_name": "typo"}, {})
    message = str(info.value)
    assert "servce_name" in message
    for known in ("service_name", "endpoint", "exporters", "metric_export_interval_s", "console"):
        assert known in message


def test_kwarg_is_validated_even_when_env_is_valid():
    with pytest.raises(ValueError, match="console"):
        resolve_config({"console": "maybe"}, {"OTEL_RL_CONSOLE": "true"})


def test_metric_export_interval_kwarg_is_seconds():
    assert resolve_config({"metric_export_interval_s": "2.5"}, {}).metric_export_interval_s == 2.5


# ---------------------------------------------------------------------------- config file errors


def test_missing_config_file_names_the_file(tmp_path):
    missing = tmp_path / "nope.yaml"
    with pytest.raises(FileNotFoundError, match=re.escape(str(missing))):
        resolve_config({"config_file": str(missing)}, {})
    with pytest.raises(FileNotFoundError, match=re.escape(str(missing))):
        resolve_config({}, {"OTEL_RL_CONFIG": str(missing)})


def test_config_file_that_is_not_yaml_names_the_file(tmp_path):
    bad = _write(tmp_path / "bad.yaml", "service_name: [unclosed\n")
    with pytest.raises(ValueError, match=re.escape(str(bad))) as info:
        resolve_config({"config_file": str(bad)}, {})
    assert "not valid YAML" in str(info.value)


@pytest.mark.parametrize("text", ["- a\n- b\n", "just a string\n", "42\n"])
def test_config_file_that_is_not_a_mapping_names_the_file(tmp_path, text):
    bad = _write(tmp_path / "list.yaml", text)
    with pytest.raises(ValueError, match=re.escape(str(bad))) as info:
        resolve_config({}, {"OTEL_RL_CONFIG": str(bad)})
    assert "mapping" in str(info.value)


@pytest.mark.parametrize("text", ["[]\n", "0\n", "false\n"])
def test_config_file_that_is_a_falsy_non_mapping_names_the_file(tmp_path, text):
    bad = _write(tmp_path / "falsy.yaml", text)
    with pytest.raises(ValueError, match=re.escape(str(bad))):
        resolve_config({}, {"OTEL_RL_CONFIG": str(bad)})


def test_config_file_unknown_key_names_the_file_and_the_key(tmp_path):
    bad = _write(tmp_path / "typo.yaml", "service_name: ok\nendpint: http://x:4318\n")
    with pytest.raises(ValueError) as info:
        resolve_config({"config_file": str(bad)}, {})
    assert str(bad) in str(info.value)
    assert "endpint" in str(info.value)


def test_config_file_bad_value_names_the_file_and_the_key(tmp_path):
    bad = _write(tmp_path / "value.yaml", "console: maybe\n")
    with pytest.raises(ValueError) as info:
        resolve_config({"config_file": str(bad)}, {})
    assert str(bad) in str(info.value) and "console" in str(info.value)


def test_config_file_int_for_a_bool_setting_is_accepted_or_names_the_file(tmp_path):
    cfg = _write(tmp_path / "int.yaml", "console: 1\n")
    try:
        config = resolve_config({"config_file": str(cfg)}, {})
    except ValueError as exc:
        assert str(cfg) in str(exc) and "console" in str(exc)
    else:
        assert config.console is True


def test_empty_config_file_is_no_settings(tmp_path):
    empty = _write(tmp_path / "empty.yaml", "")
    assert load_config_file(empty) == {}
    config = resolve_config({"config_file": str(empty)}, {})
    assert config.service_name == "otel-rl"
    assert config.config_file == str(empty)


def test_config_file_with_every_kind_of_setting(tmp_path):
    cfg = _write(
        tmp_path / "full.yaml",
        "\n".join(
            [
                "service_name: grpo",
                "experiment: exp-1",
                "exporters: otlp,file",
                "endpoint: http://collector:4317",
                "protocol: grpc",
                "metric_export_interval_s: 0.5",
                "console: false",
                "strict: true",
                "unmapped_key_limit: 0",
                "world_size: 8",
            ]
        )
        + "\n",
    )
    config = resolve_config({}, {"OTEL_RL_CONFIG": str(cfg)})
    assert (config.service_name, config.experiment) == ("grpo", "exp-1")
    assert config.exporters == ("otlp", "file")
    assert (config.endpoint, config.protocol) == ("http://collector:4317", "grpc")
    assert config.metric_export_interval_s == 0.5
    assert (config.console, config.strict, config.unmapped_key_limit, config.world_size) == (False, True, 0, 8)


# ---------------------------------------------------------------------------- exporters


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        ("otlp,file", ("otlp", "file")),
        ("file, otlp", ("file", "otlp")),
        ("OTLP", ("otlp",)),
        ("file,file", ("file",)),
        ("none", ("none",)),
        ("auto", ("auto",)),
    ],
)
def test_exporters_parsing(raw, expected):
    assert resolve_config({"exporters": raw}, {}).exporters == expected
    assert resolve_config({}, {"OTEL_RL_EXPORTERS": raw}).exporters == expected


def test_exporters_kwarg_accepts_a_list():
    assert resolve_config({"exporters": ["otlp", "file"]}, {}).exporters == ("otlp", "file")
    assert resolve_config({"exporters": ("file",)}, {}).exporters == ("file",)


@pytest.mark.parametrize("raw", ["kafka", "otlp,kafka", ",", "otlp;file"])
def test_bad_exporter_names_are_rejected(raw):
    with pytest.raises(ValueError, match="exporters") as info:
        resolve_config({"exporters": raw}, {})
    assert "auto" in str(info.value) and "otlp" in str(info.value)


# exporters, endpoint -> (file_enabled, otlp_enabled)
ENABLED = [
    (("auto",), None, True, False),
    (("auto",), "http://collector:4318", False, True),
    (("file",), None, True, False),
    (("file",), "http://collector:4318", True, False),
    (("otlp",), None, False, True),
    (("otlp",), "http://collector:4318", False, True),
    (("otlp", "file"), "http://collector:4318", True, True),
    (("none",), None, False, False),
    (("none",), "http://collector:4318", False, False),
]


@pytest.mark.parametrize(("exporters", "endpoint", "file_on", "otlp_on"), ENABLED)
def test_file_and_otlp_enabled(exporters, endpoint, file_on, otlp_on):
    config = resolve_config({"exporters": exporters, "endpoint": endpoint}, {})
    assert (config.file_enabled, config.otlp_enabled) == (file_on, otlp_on)


def test_endpoint_from_env_switches_auto_from_file_to_otlp():
    config = resolve_config({}, {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4318"})
    assert (config.file_enabled, config.otlp_enabled) == (False, True)


# ---------------------------------------------------------------------------- run id and run folder


def test_default_run_id_and_run_dir():
    config = resolve_config({}, {})
    assert re.fullmatch(r"\d{8}-\d{6}-[0-9a-f]{6}", config.run_id or "")
    assert Path(config.run_dir or "") == Path("otel-rl-runs") / config.run_id
    other = resolve_config({}, {})
    assert other.run_id != config.run_id


def test_run_dir_defaults_under_the_given_run_id():
    config = resolve_config({}, {"OTEL_RL_RUN_ID": "exp-42"})
    assert config.run_id == "exp-42"
    assert Path(config.run_dir or "") == Path("otel-rl-runs") / "exp-42"


def test_explicit_run_dir_is_kept():
    config = resolve_config({"run_dir": "/data/runs/x", "run_id": "abc"}, {"OTEL_RL_RUN_DIR": "/env/dir"})
    assert (config.run_id, config.run_dir) == ("abc", "/data/runs/x")
    assert resolve_config({}, {"OTEL_RL_RUN_DIR": "/env/dir"}).run_dir == "/env/dir"


def test_rank_and_world_size_from_the_torch_distributed_environment():
    config = resolve_config({}, {"RANK": "3", "LOCAL_RANK": "1", "WORLD_SIZE": "8"})
    assert (config.rank, config.local_rank, config.world_size) == (3, 1, 8)


def test_public_dict_holds_every_field():
    config = resolve_config({"service_name": "s"}, {})
    d = config.public_dict()
    assert d["service_name"] == "s"
    assert set(d) == {f for f in TelemetryConfig.__dataclass_fields__}


@pytest.mark.parametrize("raw", ["1e30", "inf", "1e12"])
def test_a_metric_interval_past_a_day_is_refused_not_a_dead_metrics_thread(monkeypatch, caplog, raw) -> None:
    # 1e30 ms overflowed the reader thread's wait (a traceback, and no metric exported for the run)
    monkeypatch.setenv("OTEL_METRIC_EXPORT_INTERVAL", raw)
    assert resolve_config({}).metric_export_interval_s == 10.0
    assert any("OTEL_METRIC_EXPORT_INTERVAL" in m and "a day" in m for m in _warnings(caplog))
    with pytest.raises(ValueError, match="a day"):
        resolve_config({"metric_export_interval_s": 1e30})
    assert resolve_config({"metric_export_interval_s": 86_400}).metric_export_interval_s == 86_400


@pytest.mark.parametrize("run_id", ["../../../x", "a/b", "..", ".", "a\\b"])
def test_a_run_id_is_a_name_never_a_path_out_of_the_runs_folder(monkeypatch, caplog, run_id) -> None:
    monkeypatch.setenv("OTEL_RL_RUN_ID", run_id)
    config = resolve_config({})
    assert config.run_id != run_id and Path(str(config.run_dir)).parent == Path("otel-rl-runs")
    assert any("OTEL_RL_RUN_ID" in m and "not a path" in m for m in _warnings(caplog))
    with pytest.raises(ValueError, match="not a path"):
        resolve_config({"run_id": run_id})
