"""Property-based tests (hypothesis): whatever a training script logs or configures, otel-rl
never raises into the loop (non-strict), never loses the step's event, and a bad setting fails
at configuration time with a message naming the input and the fix."""

from __future__ import annotations

import json
import math
from fractions import Fraction
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp
from opentelemetry.exporter.otlp.proto.common._internal import _encode_value

import otel_rl
from otel_rl._sdk.export.providers import check_otlp_environment
from otel_rl._sdk.settings.config import _FIELDS, resolve_config
from otel_rl.semconv import attributes as A
from otel_rl.semconv import metrics as M
from otel_rl.semconv import names as N

SETTINGS = settings(
    max_examples=150, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow]
)


class Unfloatable:
    """A value whose conversions all fail in unusual ways (its repr only while ``armed``, so that
    hypothesis can still print a failing example)."""

    armed = False

    def __float__(self) -> float:
        raise RuntimeError("no float for you")

    def __repr__(self) -> str:
        if Unfloatable.armed:
            raise RuntimeError("no repr either")
        return "Unfloatable()"


class ItemRaises:
    ndim = 0

    def item(self) -> float:
        raise KeyError("item")


class SizeRaises:
    @property
    def size(self) -> int:
        raise RuntimeError("size")

    def __float__(self) -> float:
        return 1.0


keys = st.one_of(
    st.text(max_size=24), st.integers(), st.none(), st.floats(), st.binary(max_size=4), st.tuples(st.integers(), st.text(max_size=3))
)
leaves = st.one_of(
    st.floats(),
    st.integers(min_value=-(10**400), max_value=10**400),
    st.integers(min_value=2**62, max_value=2**66),
    st.booleans(),
    st.none(),
    st.text(max_size=40),
    st.binary(max_size=8),
    st.complex_numbers(),
    st.fractions(),
    st.lists(st.one_of(st.floats(), st.none(), st.text(max_size=4)), max_size=3),
    hnp.arrays(
        st.sampled_from([np.float64, np.float32, np.int64, np.uint64, np.complex64, np.bool_]),
        hnp.array_shapes(min_dims=0, max_dims=2, min_side=0, max_side=3),
    ),
    st.sampled_from([Unfloatable(), ItemRaises(), SizeRaises(), object(), Ellipsis, math.nan, -math.inf, np.float64("nan")]),
)
nested = st.recursive(leaves, lambda children: st.dictionaries(keys, children, max_size=4), max_leaves=12)
log_calls = st.dictionaries(keys, nested, max_size=10)


def leaf_count(values: Any) -> int:
    if isinstance(values, dict):
        return sum(leaf_count(v) for v in values.values())
    return 1


@pytest.fixture(scope="module")
def tel(tmp_path_factory: pytest.TempPathFactory):
    run_dir = tmp_path_factory.mktemp("props")
    telemetry = otel_rl.init(
        service_name="props", run_dir=str(run_dir), exporters="file", console=False, unmapped_key_limit=10**6, metric_export_interval_s=3600
    )
    yield telemetry
    telemetry.shutdown()


@SETTINGS
@given(values=log_calls, step=st.one_of(st.none(), st.integers(0, 10**6)))
def test_log_of_anything_never_raises_and_emits_exactly_one_event(tel, values: dict, step: int | None) -> None:
    pipeline = tel._pipeline
    emitted: list[tuple[str, dict]] = []
    original = pipeline.emit_event

    def capture(name, body, attributes, *args, **kwargs):
        emitted.append((name, body))
        return original(name, body, attributes, *args, **kwargs)

    pipeline.emit_event = capture
    Unfloatable.armed = True
    try:
        tel.log(values, step=step)
        assert tel.flush(timeout_s=5)
    finally:
        Unfloatable.armed = False
        pipeline.emit_event = original
    internal = [key for key in pipeline._reported if key[0] == "pipeline"]
    assert not internal, f"the pipeline dropped an item after an internal error: {internal}"
    [(name, body)] = emitted
    assert name == N.RL_LOG_EVENT
    assert len(body) >= min(1, leaf_count(values)) if values else body == {}
    json.dumps(body, default=str)
    _encode_value(body)  # what the OTLP encoders take: one bad value would fail a whole batch of events


@SETTINGS
@given(values=log_calls)
def test_strict_mode_raises_only_value_error_naming_the_key(tmp_path_factory, values: dict) -> None:
    tel = _strict(tmp_path_factory)
    Unfloatable.armed = True
    try:
        tel.log(values, step=1)
    except ValueError as exc:
        assert "otel-rl" in str(exc)
    finally:
        Unfloatable.armed = False


_STRICT: list[Any] = []


def _strict(tmp_path_factory: pytest.TempPathFactory):
    if not _STRICT:
        # a second live telemetry beside the module's: built directly (a second init() would replace the first)
        _STRICT.append(
            otel_rl.Telemetry(
                resolve_config(
                    {
                        "service_name": "props-strict",
                        "run_dir": str(tmp_path_factory.mktemp("strict")),
                        "exporters": "none",
                        "console": False,
                        "strict": True,
                        "unmapped_key_limit": 10**6,
                    }
                )
            )
        )
    return _STRICT[0]


def test_every_bad_value_is_counted_and_the_event_keeps_it(tel) -> None:
    before = tel.latest(M.RL_TELEMETRY_REJECTED, {A.RL_TELEMETRY_REASON: A.RlTelemetryReasonValues.NON_NUMERIC.value}) or 0
    Unfloatable.armed = True
    tel.log({"actor/pg_loss": Unfloatable(), "actor/entropy": 10**400, "critic/score/mean": ItemRaises()}, step=3)
    tel.flush()
    Unfloatable.armed = False
    after = tel.latest(M.RL_TELEMETRY_REJECTED, {A.RL_TELEMETRY_REASON: A.RlTelemetryReasonValues.NON_NUMERIC.value}) or 0
    inf = tel.latest(M.RL_TELEMETRY_REJECTED, {A.RL_TELEMETRY_REASON: A.RlTelemetryReasonValues.INF.value}) or 0
    assert after - before >= 2 and inf >= 1  # 10**400 overflows a float: infinite


def test_self_referencing_and_very_deep_nesting_is_cut_not_hung(tel) -> None:
    loop: dict[str, Any] = {"x": 1.0}
    loop["self"] = loop
    deep: dict[str, Any] = {"v": 1.0}
    for _ in range(5000):
        deep = {"d": deep}
    tel.log({"actor/loop": loop, "actor/deep": deep}, step=4)
    assert tel.flush(timeout_s=10)
    assert not [key for key in tel._pipeline._reported if key[0] == "pipeline"]


def test_a_mapping_that_fails_to_copy_is_reported_not_raised(tel) -> None:
    class Broken(dict):
        def keys(self):
            raise RuntimeError("broken mapping")

        def __iter__(self):
            raise RuntimeError("broken mapping")

    tel.log(Broken(a=1), step=5)  # no exception into the loop


# -- configuration ---------------------------------------------------------------------------------

ENV_NAMES = sorted(f.metadata["env"] for f in _FIELDS.values() if f.metadata.get("env") and f.metadata["env"] != "OTEL_RL_CONFIG")


@SETTINGS
@given(env=st.dictionaries(st.sampled_from(ENV_NAMES), st.text(max_size=20)))
def test_any_environment_resolves_falling_back_with_a_warning_never_raising(env: dict[str, str]) -> None:
    config = resolve_config({}, environ=env)
    assert config.run_id and config.run_dir


yaml_scalars = st.one_of(st.none(), st.booleans(), st.integers(), st.floats(allow_nan=False), st.text(max_size=10))
yaml_values = st.recursive(
    yaml_scalars, lambda c: st.one_of(st.lists(c, max_size=3), st.dictionaries(st.text(max_size=8), c, max_size=3)), max_leaves=8
)


@SETTINGS
@given(
    doc=st.one_of(st.dictionaries(st.sampled_from(sorted(_FIELDS) + ["bogus", "endpoint "]), yaml_values, max_size=5), yaml_values),
    raw=st.one_of(st.none(), st.binary(max_size=40)),
)
def test_a_config_file_loads_or_fails_naming_the_file(tmp_path_factory, doc: Any, raw: bytes | None) -> None:
    path = tmp_path_factory.mktemp("cfg") / "otel-rl.yaml"
    path.write_bytes(raw if raw is not None else yaml.safe_dump(doc).encode())
    try:
        resolve_config({"config_file": str(path)}, environ={})
    except (ValueError, FileNotFoundError) as exc:
        assert str(path) in str(exc), exc


@SETTINGS
@given(text=st.text(max_size=60))
def test_a_registry_file_of_any_text_is_reported_as_problems_not_a_crash(tmp_path_factory, text: str) -> None:
    from otel_rl.codegen.registry import load_registry

    root = tmp_path_factory.mktemp("semconv")
    (root / "registry").mkdir()
    (root / "registry" / "bad.yaml").write_text(text, encoding="utf-8")
    registry = load_registry(root)
    assert registry.problems  # an arbitrary text is never a valid registry with metrics


@SETTINGS
@given(name=st.text(min_size=1, max_size=12).filter(lambda n: n.strip() and "," not in n))
def test_an_unknown_tracker_name_fails_at_init_listing_the_known_ones(tmp_path_factory, name: str) -> None:
    assume(name.strip() not in otel_rl.known_trackers())
    with pytest.raises(ValueError) as info:
        otel_rl.init(run_dir=str(tmp_path_factory.mktemp("trk")), exporters="none", console=False, track_with=name)
    message = str(info.value)
    assert (name.strip() in message or repr(name.strip()) in message) and "tensorboard" in message


# -- OTEL_EXPORTER_OTLP_* checked at init -----------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "value", "expected"),
    [
        ("OTEL_EXPORTER_OTLP_HEADERS", "Bearer s3cr3t-token", "not name=value"),
        ("OTEL_EXPORTER_OTLP_TRACES_HEADERS", "authorization=ok,=s3cr3t-token", "entry 2 of 2"),
        ("OTEL_EXPORTER_OTLP_CERTIFICATE", "/nonexistent/ca.pem", "no such readable file"),
        ("OTEL_EXPORTER_OTLP_CLIENT_KEY", "/nonexistent/key.pem", "private key"),
        ("OTEL_EXPORTER_OTLP_TIMEOUT", "ten", "positive number of seconds"),
        ("OTEL_EXPORTER_OTLP_METRICS_TIMEOUT", "-1", "positive number of seconds"),
        ("OTEL_EXPORTER_OTLP_COMPRESSION", "zip", "gzip, deflate, none"),
        ("OTEL_EXPORTER_OTLP_INSECURE", "maybe", "true or false"),
        ("OTEL_EXPORTER_OTLP_LOGS_ENDPOINT", "collector:4318/v1/logs", "http:// or https:// URL"),
    ],
)
def test_bad_otlp_variables_fail_at_init_naming_the_variable_and_never_a_secret(
    tmp_path: Path, monkeypatch, name: str, value: str, expected: str
) -> None:
    monkeypatch.setenv(name, value)
    with pytest.raises(ValueError) as info:
        otel_rl.init(run_dir=str(tmp_path), endpoint="http://127.0.0.1:4318", exporters="otlp", console=False)
    message = str(info.value)
    assert name in message and expected in message
    assert "s3cr3t" not in message


def test_a_file_that_is_not_a_ca_certificate_is_named(tmp_path: Path) -> None:
    bogus = tmp_path / "ca.pem"
    bogus.write_text("not a certificate\n")
    with pytest.raises(ValueError, match="not a PEM CA certificate"):
        check_otlp_environment("grpc", "https://127.0.0.1:4317", {"OTEL_EXPORTER_OTLP_CERTIFICATE": str(bogus)})


def test_an_http_endpoint_without_a_scheme_is_named() -> None:
    with pytest.raises(ValueError, match="not an http:// or https:// URL"):
        check_otlp_environment("http/protobuf", "collector:4318", {})
    check_otlp_environment("grpc", "collector:4317", {})  # gRPC takes host:port


def test_fractions_and_numpy_scalars_are_numbers(tel) -> None:
    tel.log({"actor/pg_loss": Fraction(1, 4), "actor/entropy": np.float32(0.5), "actor/lr": np.int64(3)}, step=6)
    tel.flush()
    assert tel.latest(M.RL_POLICY_ENTROPY, {A.RL_STATISTIC: "mean"}) == 0.5


@pytest.mark.parametrize("text", [b"framework: x\nrules:\n  - key: [unclosed\n", b"\x80\x81"])
def test_a_malformed_mapping_file_is_a_problem_line_not_a_traceback(tmp_path: Path, capsys, text: bytes) -> None:
    import shutil

    from otel_rl.cli import main

    repo = Path(__file__).resolve().parents[1] / "semconv"
    shutil.copytree(repo, tmp_path / "semconv")
    (tmp_path / "semconv" / "mappings" / "bad.yaml").write_bytes(text)
    assert main(["semconv", "check", "--registry", str(tmp_path / "semconv")]) == 1
    assert "bad.yaml" in capsys.readouterr().err
