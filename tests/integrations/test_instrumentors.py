"""The instrumentors (``otel_rl.integrations.base``): version check, idempotence, undo, and for each
framework an instrument() -> run -> uninstrument() round trip.

The round trips run the real framework where it is installed (TRL and transformers, verl, Ray, and
ms-swift 4.x's callback registry; ms-swift's own trainers cannot train here, see test_swift.py).
ROLL is not on PyPI and ms-swift 3.x is not installed: those use stand-ins mirroring their
interfaces, marked "stand-in" below, as the other tests of this folder do.
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.metadata
import inspect
import logging
import sys
import tempfile
import types
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import otel_rl
from otel_rl.integrations.base import DependencyConflictError, Instrumentor, Patches, get_dependency_conflicts, version_satisfies
from otel_rl.runs.folder import read_log_records, read_metrics, read_spans
from otel_rl.semconv import attributes as A
from otel_rl.semconv import names as N

HERE = Path(__file__).resolve().parent


# --------------------------------------------------------------------------------------------------
# Helpers


class Counting(Instrumentor):
    """An instrumentor of a made-up framework: one attribute of a namespace it patches."""

    target = types.SimpleNamespace(hook="original")
    calls: list[dict] = []
    fail = False

    def instrumentation_dependencies(self):
        return ("made-up-framework >= 2.0",)

    def _instrument(self, **kwargs):
        type(self).calls.append(kwargs)
        self.patches.replace(self.target, "hook", ("patched", kwargs))
        if type(self).fail:
            raise ImportError("made-up-framework broke half-way")


@pytest.fixture
def counting(monkeypatch) -> Iterator[Counting]:
    instrumentor = Counting()
    Counting.calls.clear()
    monkeypatch.setattr(Counting, "fail", False)
    yield instrumentor
    if instrumentor.is_instrumented:
        instrumentor.uninstrument()


@pytest.fixture
def run_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Telemetry started by an integration writes a run folder under tmp_path; none is reused."""
    run_dir = tmp_path / "run"
    for name in (
        "OTEL_SERVICE_NAME",
        "OTEL_RL_EXPERIMENT",
        "OTEL_EXPORTER_OTLP_ENDPOINT",
        "OTEL_RL_RUN_ID",
        "OTEL_RL_FRAMEWORK",
        "RANK",
        "WORLD_SIZE",
        "LOCAL_RANK",
        "ROLL_OTEL_ENABLED",
    ):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("OTEL_RL_RUN_DIR", str(run_dir))
    monkeypatch.setenv("OTEL_RL_EXPORTERS", "file")
    monkeypatch.setenv("OTEL_RL_CONSOLE", "false")
    monkeypatch.setattr(otel_rl, "_current", None)
    return run_dir


@contextlib.contextmanager
def fresh(instrumentor: Instrumentor, reinstall_on_import: Any = None) -> Iterator[Instrumentor]:
    """``instrumentor`` uninstrumented for a test, and afterwards as the test found it.

    verl, ms-swift and ROLL are instrumented by importing their module: ``reinstall_on_import``
    (the module's install() / register()) puts that back for the tests that rely on it.
    """
    was_on_import = instrumentor.is_instrumented
    if instrumentor.is_instrumented:
        instrumentor.uninstrument()
    try:
        yield instrumentor
    finally:
        if instrumentor.is_instrumented:
            instrumentor.uninstrument()
        if was_on_import and reinstall_on_import is not None:
            reinstall_on_import()


def only_version(monkeypatch: pytest.MonkeyPatch, versions: dict[str, str]) -> None:
    """importlib.metadata.version answers ``versions`` for those names, the truth for the others."""
    real = importlib.metadata.version

    def version(name: str) -> str:
        normal = name.lower().replace("_", "-")
        return versions[normal] if normal in versions else real(name)

    monkeypatch.setattr(importlib.metadata, "version", version)


def messages(caplog: pytest.LogCaptureFixture, level: int) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno == level and r.name == "otel_rl"]


# --------------------------------------------------------------------------------------------------
# The protocol


def test_one_instance_per_subclass(counting):
    class Other(Counting):
        pass

    assert Counting() is counting and Counting() is Counting()
    assert Other() is Other() and Other() is not counting


def test_version_check_refuses_an_unsupported_version_and_names_it(counting, monkeypatch, caplog):
    only_version(monkeypatch, {"made-up-framework": "1.4.2"})
    counting.instrument()
    assert not counting.is_instrumented and Counting.calls == [] and Counting.target.hook == "original"
    (error,) = messages(caplog, logging.ERROR)
    assert 'requested "made-up-framework >= 2.0" but found "made-up-framework 1.4.2"' in error
    with pytest.raises(DependencyConflictError, match="made-up-framework 1.4.2") as raised:
        counting.instrument(raise_exception_on_conflict=True)
    assert raised.value.conflict.found == "made-up-framework 1.4.2"
    assert isinstance(raised.value, ImportError)
    counting.instrument(skip_dep_check=True, option=1)  # the way round the check
    assert counting.is_instrumented and Counting.target.hook == ("patched", {"option": 1})


def test_a_missing_framework_is_named_with_its_pip_extra(counting, monkeypatch, caplog):
    monkeypatch.setattr(Counting, "pip_extra", "made-up")
    counting.instrument()
    (error,) = messages(caplog, logging.ERROR)
    assert 'requested "made-up-framework >= 2.0" but it is not installed' in error
    assert "pip install 'otel-rl[made-up]'" in error
    assert not counting.is_instrumented


def test_supported_version_instruments_and_prereleases_count(counting, monkeypatch):
    only_version(monkeypatch, {"made-up-framework": "2.1.0rc1"})
    counting.instrument()
    assert counting.is_instrumented and Counting.calls == [{}]


def test_instrument_twice_is_idempotent_with_one_warning(counting, monkeypatch, caplog):
    only_version(monkeypatch, {"made-up-framework": "2.0"})
    counting.instrument(option="first")
    counting.instrument(option="second")
    assert Counting.calls == [{"option": "first"}] and Counting.target.hook == ("patched", {"option": "first"})
    (warning,) = messages(caplog, logging.WARNING)
    assert "Counting is already instrumented; instrument() does nothing" in warning


def test_uninstrument_restores_what_instrument_changed(counting, monkeypatch, caplog):
    only_version(monkeypatch, {"made-up-framework": "2.0"})
    counting.uninstrument()
    assert "Counting is not instrumented; uninstrument() does nothing" in messages(caplog, logging.WARNING)[0]
    counting.instrument()
    counting.uninstrument()
    assert not counting.is_instrumented and Counting.target.hook == "original"
    counting.instrument(option=2)  # and again, with other options
    assert Counting.target.hook == ("patched", {"option": 2})


def test_a_failed_instrument_leaves_the_framework_as_it_was(counting, monkeypatch):
    only_version(monkeypatch, {"made-up-framework": "2.0"})
    monkeypatch.setattr(Counting, "fail", True)
    with pytest.raises(ImportError, match="half-way"):
        counting.instrument()
    assert not counting.is_instrumented and Counting.target.hook == "original" and len(counting.patches) == 0


def test_explicit_instrument_takes_over_an_instrumentation_on_import(counting, monkeypatch, caplog):
    only_version(monkeypatch, {"made-up-framework": "2.0"})
    assert counting.instrument_on_import(option="import") is True
    assert counting.instrument_on_import(option="again") is True  # nothing more
    counting.instrument(option="explicit")  # no warning: the options of the explicit call win
    assert not messages(caplog, logging.WARNING)
    assert Counting.target.hook == ("patched", {"option": "explicit"})
    assert Counting.calls == [{"option": "import"}, {"option": "explicit"}]
    counting.instrument()
    assert len(messages(caplog, logging.WARNING)) == 1


def test_patches_undo_in_reverse_and_leave_later_patches_alone():
    class Owner:
        def method(self):
            return "original"

    class Child(Owner):
        pass

    registry = {"kept": 1}
    items: list = ["a"]
    patches = Patches()
    patches.replace(Child, "method", lambda self: "patched")  # inherited: deleted again on undo
    patches.replace(Owner, "method", lambda self: "owner patched")
    patches.set_item(registry, "new", 2)
    patches.set_item(registry, "kept", 3)
    patches.append(items, "b")
    undone = []
    patches.on_restore(lambda: undone.append(True))
    later = lambda self: "someone else"  # noqa: E731
    Owner.method = later  # replaced again after us: theirs stays
    patches.restore()
    assert "method" not in vars(Child) and Owner.method is later
    assert registry == {"kept": 1} and items == ["a"] and undone == [True]
    assert len(patches) == 0


def test_version_check_without_packaging(monkeypatch):
    for name in ("packaging", "packaging.requirements", "packaging.specifiers"):
        monkeypatch.setitem(sys.modules, name, None)  # import fails
    assert version_satisfies("0.16.0", ">=0.16") and version_satisfies("1.16.0", ">=0.16, <2")
    assert not version_satisfies("0.9.6", ">=0.16") and not version_satisfies("2.0", ">=0.16,<2")
    assert version_satisfies("2.60.0", ">=2.9")  # numbers, not strings
    only_version(monkeypatch, {"trl": "0.9.6"})
    conflict = get_dependency_conflicts(["trl >= 0.16"], "pip install 'otel-rl[trl]'")
    assert conflict is not None and conflict.found == "trl 0.9.6"


# --------------------------------------------------------------------------------------------------
# Every integration declares its versions and refuses others


# (module, instrumentor) of the integrations whose versions are pip requirements (ROLL's: below)
PIP_INTEGRATIONS = [
    ("trl", "TrlInstrumentor"),
    ("swift", "SwiftInstrumentor"),
    ("verl", "VerlInstrumentor"),
    ("verl_agent_loop", "VerlAgentLoopInstrumentor"),
    ("ray", "RayInstrumentor"),
]


@pytest.mark.parametrize("module_name, class_name", PIP_INTEGRATIONS, ids=[c for _, c in PIP_INTEGRATIONS])
def test_each_integration_refuses_an_old_framework_and_says_which(module_name, class_name, monkeypatch, caplog):
    try:
        module = importlib.import_module(f"otel_rl.integrations.{module_name}")
    except ImportError as exc:
        pytest.skip(f"{module_name} integration not importable here: {exc}")
    instrumentor = getattr(module, class_name)()
    assert isinstance(instrumentor, Instrumentor)
    requirements = list(instrumentor.instrumentation_dependencies())
    assert requirements and all(">=" in r for r in requirements)
    dists = [r.split(">=")[0].strip() for r in requirements]
    only_version(monkeypatch, {d: "0.0.1" for d in dists})
    with pytest.raises(DependencyConflictError) as raised:
        instrumentor.instrument(raise_exception_on_conflict=True)
    assert f'found "{dists[0]} 0.0.1"' in str(raised.value)
    assert f"pip install 'otel-rl[{instrumentor.pip_extra}]'" in str(raised.value)


def test_the_instrumentors_are_reachable_from_the_package():
    import otel_rl.integrations as integrations

    assert set(integrations.INSTRUMENTORS) == {
        "TrlInstrumentor",
        "SwiftInstrumentor",
        "VerlInstrumentor",
        "VerlAgentLoopInstrumentor",
        "RollInstrumentor",
        "RayInstrumentor",
        "OpenRLHFInstrumentor",
        "OpenRLHFAgentInstrumentor",
        "AReaLInstrumentor",
        "AReaLWorkflowInstrumentor",
    }
    assert integrations.RollInstrumentor is importlib.import_module("otel_rl.integrations.roll").RollInstrumentor
    with pytest.raises(AttributeError):
        integrations.NoSuchInstrumentor  # noqa: B018


# --------------------------------------------------------------------------------------------------
# TRL (real): every Trainer built while instrumented gets the callback


def _tiny_trainer(transformers, model_dir: str, output_dir: Path, **kwargs) -> Any:
    model = transformers.AutoModelForCausalLM.from_pretrained(model_dir)
    args = transformers.TrainingArguments(
        output_dir=str(output_dir),
        report_to=[],
        use_cpu=True,
        max_steps=2,
        per_device_train_batch_size=2,
        logging_steps=1,
        save_strategy="no",
    )
    rows = [{"input_ids": [3 + i, 4, 5, 6], "attention_mask": [1, 1, 1, 1], "labels": [3 + i, 4, 5, 6]} for i in range(4)]
    return transformers.Trainer(model=model, args=args, train_dataset=rows, **kwargs)


@pytest.fixture
def trl_instrumentor() -> Iterator[Any]:
    pytest.importorskip("trl")
    from otel_rl.integrations.trl import TrlInstrumentor

    with fresh(TrlInstrumentor()) as instrumentor:
        yield instrumentor


@pytest.mark.slow
def test_trl_round_trip_with_a_real_grpo_trainer(trl_instrumentor, hf_tiny_lm, run_env, tmp_path):
    trl = pytest.importorskip("trl")
    datasets = pytest.importorskip("datasets")
    import transformers

    from otel_rl.integrations.trl import OtelRLCallback

    original_init = transformers.Trainer.__init__
    trl_instrumentor.instrument(run_dir=str(run_env), console=False, service_name="trl-instrumented")
    assert transformers.Trainer.__init__ is not original_init
    model_dir, tokenizer = hf_tiny_lm
    config = trl.GRPOConfig(
        output_dir=str(tmp_path / "out"),
        per_device_train_batch_size=2,
        num_generations=2,
        max_completion_length=4,
        max_steps=2,
        logging_steps=1,
        report_to=[],
        use_cpu=True,
        seed=0,
        save_strategy="no",
        beta=0.0,
    )
    trainer = trl.GRPOTrainer(
        model=model_dir,
        reward_funcs=[lambda completions, **kw: [float(len(c)) for c in completions]],
        args=config,
        train_dataset=datasets.Dataset.from_dict({"prompt": ["1+1=", "2+2="] * 2}),
        processing_class=tokenizer,
    )  # no callbacks=: the instrumentor adds it
    (callback,) = [c for c in trainer.callback_handler.callbacks if isinstance(c, OtelRLCallback)]
    assert callback.trainer is trainer
    trainer.train()

    spans = read_spans(run_env)
    steps = {s.attributes[A.RL_STEP]: s for s in spans if s.name == N.RL_STEP_SPAN}
    assert sorted(steps) == [1, 2]
    stages = {s.attributes[A.RL_STAGE] for s in spans if s.trace_id == steps[1].trace_id and s is not steps[1]}
    assert {"generate", "compute_rewards", "train_step"} <= stages
    assert {s.resource[A.SERVICE_NAME] for s in spans} == {"trl-instrumented"}
    logged = [r for r in read_log_records(run_env) if r["event_name"] == N.RL_LOG_EVENT]
    assert [r["body"] for r in logged] == [{k: v for k, v in h.items() if k != "step"} for h in trainer.state.log_history]

    trl_instrumentor.uninstrument()
    assert transformers.Trainer.__init__ is original_init
    after = trl.GRPOTrainer(
        model=model_dir,
        reward_funcs=[lambda completions, **kw: [0.0] * len(completions)],
        args=config,
        train_dataset=datasets.Dataset.from_dict({"prompt": ["1+1="] * 2}),
        processing_class=tokenizer,
    )
    assert not [c for c in after.callback_handler.callbacks if isinstance(c, OtelRLCallback)]


def test_trl_keeps_the_users_own_callback_and_adds_none(trl_instrumentor, hf_tiny_lm, tmp_path):
    import transformers

    from otel_rl.integrations.trl import OtelRLCallback

    trl_instrumentor.instrument()
    trl_instrumentor.instrument()  # idempotent: still one wrapper, one callback per trainer
    mine = OtelRLCallback()
    trainer = _tiny_trainer(transformers, hf_tiny_lm[0], tmp_path / "out", callbacks=[mine])
    assert [c for c in trainer.callback_handler.callbacks if isinstance(c, OtelRLCallback)] == [mine]
    plain = _tiny_trainer(transformers, hf_tiny_lm[0], tmp_path / "out2")
    assert len([c for c in plain.callback_handler.callbacks if isinstance(c, OtelRLCallback)]) == 1


# --------------------------------------------------------------------------------------------------
# ms-swift: 4.x's real callbacks_map; 3.x's extra_callbacks through a stand-in


@pytest.fixture
def swift_instrumentor() -> Iterator[Any]:
    pytest.importorskip("transformers")
    from otel_rl.integrations import swift as otel_swift

    if otel_swift._callbacks_map() is None:
        pytest.skip("ms-swift 4.x's swift.callbacks is not importable here")
    with fresh(otel_swift.SwiftInstrumentor(), otel_swift.register) as instrumentor:
        yield instrumentor


def test_swift_round_trip_with_its_callback_registry(swift_instrumentor, hf_tiny_lm, run_env, tmp_path):
    import transformers
    from swift.callbacks import callbacks_map

    from otel_rl.integrations.swift import CALLBACK_NAME, OtelRLSwiftCallback

    assert CALLBACK_NAME not in callbacks_map  # the import's registration was taken back for this test
    swift_instrumentor.instrument(run_dir=str(run_env), console=False)
    # --callbacks otel_rl, as SwiftMixin._get_callbacks builds it: callbacks_map[name](args, trainer)
    built = callbacks_map[CALLBACK_NAME](None, None)
    assert isinstance(built, OtelRLSwiftCallback) and built.init_kwargs == {"run_dir": str(run_env), "console": False}
    # No --callbacks: the trainer gets one anyway.
    trainer = _tiny_trainer(transformers, hf_tiny_lm[0], tmp_path / "out")
    (callback,) = [c for c in trainer.callback_handler.callbacks if isinstance(c, OtelRLSwiftCallback)]
    assert callback.trainer is trainer and callback.args is trainer.args
    trainer.train()
    spans = read_spans(run_env)
    assert sorted(s.attributes[A.RL_STEP] for s in spans if s.name == N.RL_STEP_SPAN) == [1, 2]
    assert {s.resource[A.RL_FRAMEWORK] for s in spans} == {"swift"}
    assert list(read_metrics(run_env))

    swift_instrumentor.uninstrument()
    assert CALLBACK_NAME not in callbacks_map
    after = _tiny_trainer(transformers, hf_tiny_lm[0], tmp_path / "out2")
    assert not [c for c in after.callback_handler.callbacks if isinstance(c, OtelRLSwiftCallback)]


def test_swift_3x_extra_callbacks_stand_in():
    """stand-in: mirrors ms-swift 3.x's swift/plugin/__init__.py ``extra_callbacks`` (a list every
    trainer's callbacks are extended with); 3.x has no swift.callbacks.callbacks_map."""
    pytest.importorskip("transformers")
    from otel_rl.integrations import swift as otel_swift

    plugin = types.ModuleType("swift.plugin")
    plugin.extra_callbacks = []
    # Put back before fresh() restores the import's registration, which needs the real ms-swift.
    with fresh(otel_swift.SwiftInstrumentor(), otel_swift.register) as instrumentor, pytest.MonkeyPatch.context() as mp:
        mp.setitem(sys.modules, "swift.plugin", plugin)
        mp.setattr(otel_swift, "_callbacks_map", lambda: None)
        only_version(mp, {"ms-swift": "3.9.0"})
        instrumentor.instrument(main_process_only=True)
        (callback,) = plugin.extra_callbacks
        assert isinstance(callback, otel_swift.OtelRLSwiftCallback) and callback.main_process_only
        instrumentor.uninstrument()
        assert plugin.extra_callbacks == []


# --------------------------------------------------------------------------------------------------
# verl: the real Tracking where verl imports, else test_verl.py's stand-in


@pytest.fixture
def verl_tracking(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    from test_verl import REAL_VERL, STAND_IN_LOGGER, STAND_IN_TRACKING

    if not REAL_VERL:  # stand-in: mirrors verl 0.9.1's verl/utils/tracking.py (see test_verl.py)
        root = tmp_path / "verl_stand_in"
        (root / "verl" / "utils" / "logger").mkdir(parents=True)
        (root / "verl" / "__init__.py").write_text("")
        (root / "verl" / "utils" / "__init__.py").write_text("")
        (root / "verl" / "utils" / "tracking.py").write_text(STAND_IN_TRACKING)
        (root / "verl" / "utils" / "logger" / "__init__.py").write_text(STAND_IN_LOGGER)
        monkeypatch.syspath_prepend(str(root))
        only_version(monkeypatch, {"verl": "0.9.1"})
    from otel_rl.integrations import verl as otel_verl

    with fresh(otel_verl.VerlInstrumentor(), otel_verl.install) as instrumentor:
        yield importlib.import_module("verl.utils.tracking"), instrumentor
    if not REAL_VERL:
        for name in [n for n in sys.modules if n == "verl" or n.startswith("verl.")]:
            del sys.modules[name]


def test_verl_round_trip_through_its_tracking(verl_tracking, run_env):
    from otel_rl.integrations.verl import OtelBackend

    tracking, instrumentor = verl_tracking
    Tracking = tracking.Tracking
    original_init, original_backends = Tracking.__init__, list(Tracking.supported_backend)
    assert "otel" not in original_backends  # the import's installation was taken back for this test
    instrumentor.instrument(reconstruct_spans=False)
    assert "otel" in Tracking.supported_backend
    run = Tracking(project_name="proj", experiment_name="exp", default_backend=["otel"], config={"lr": 1e-6})
    backend = run.logger["otel"]
    assert isinstance(backend, OtelBackend) and backend._reconstruct_spans is False
    run.log(data={"actor/pg_loss": 0.25, "timing_s/gen": 1.0, "timing_s/step": 2.0}, step=1)
    run.finish()
    records = read_log_records(run_env)
    assert [r["body"] for r in records if r["event_name"] == N.RL_LOG_EVENT] == [
        {"actor/pg_loss": 0.25, "timing_s/gen": 1.0, "timing_s/step": 2.0}
    ]
    assert not [s for s in read_spans(run_env) if s.name == N.RL_STEP_SPAN]  # reconstruct_spans=False

    instrumentor.uninstrument()
    assert Tracking.__init__ is original_init and Tracking.supported_backend == original_backends
    assert not getattr(Tracking, "_otel_rl_installed", False)
    with pytest.raises(AssertionError, match="not supported"):
        Tracking(project_name="proj", experiment_name="exp", default_backend=["otel"])


# --------------------------------------------------------------------------------------------------
# ROLL (stand-in: test_roll.py's copy of roll/utils/tracking.py)


@pytest.fixture
def roll_registry(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    from test_roll import write_stand_in

    def forget_roll() -> None:
        for name in [n for n in sys.modules if n == "roll" or n.startswith("roll.")]:
            del sys.modules[name]

    forget_roll()
    monkeypatch.syspath_prepend(str(write_stand_in(tmp_path / "site")))
    from otel_rl.integrations import roll as otel_roll

    with fresh(otel_roll.RollInstrumentor()) as instrumentor:
        yield importlib.import_module("roll.utils.tracking"), instrumentor
    forget_roll()


def test_roll_round_trip_stand_in(roll_registry, run_env):
    from otel_rl.integrations.roll import OtelTracker

    tracking, instrumentor = roll_registry
    assert "otel" not in tracking.tracker_registry
    instrumentor.instrument()  # a checkout on sys.path: recognised by roll.utils.tracking, no version
    assert tracking.tracker_registry["otel"] is OtelTracker
    tracker = tracking.create_tracker("otel", {"exp_name": "rlvr"}, run_dir=str(run_env), console=False)
    tracker.log({"actor/pg_loss@sum": 0.5}, step=1)
    tracker.finish()
    assert [r["body"] for r in read_log_records(run_env) if r["event_name"] == N.RL_LOG_EVENT] == [{"actor/pg_loss": 0.5}]
    instrumentor.uninstrument()
    assert "otel" not in tracking.tracker_registry and "stdout" in tracking.tracker_registry
    with pytest.raises(ValueError, match="Unknown tracker name: otel"):
        tracking.create_tracker("otel", {})


def test_roll_version_is_checked_when_pip_installed(roll_registry, monkeypatch, caplog):
    _, instrumentor = roll_registry
    only_version(monkeypatch, {"roll": "0.0.1"})
    instrumentor.instrument()
    assert not instrumentor.is_instrumented
    assert 'requested "roll >= 0.1" but found "roll 0.0.1"' in messages(caplog, logging.ERROR)[0]


def test_roll_refuses_the_unrelated_pypi_roll(monkeypatch, caplog):
    from otel_rl.integrations import roll as otel_roll

    monkeypatch.setattr(otel_roll, "_roll_installed", lambda: False)  # no roll.utils.tracking
    only_version(monkeypatch, {"roll": "1.0.3"})
    with fresh(otel_roll.RollInstrumentor()) as instrumentor:
        instrumentor.instrument()
        assert not instrumentor.is_instrumented
        error = messages(caplog, logging.ERROR)[0]
        assert 'found "roll 1.0.3 without roll.utils.tracking"' in error and "alibaba/ROLL" in error


# --------------------------------------------------------------------------------------------------
# Ray: what the wrappers hand to Ray (no cluster), then a real local cluster


@pytest.fixture
def ray_instrumentor() -> Iterator[Any]:
    pytest.importorskip("ray")
    from otel_rl.integrations.ray import RayInstrumentor

    with fresh(RayInstrumentor()) as instrumentor:
        yield instrumentor


def test_ray_calls_carry_the_context_and_actors_the_run(ray_instrumentor, make_telemetry, monkeypatch):
    from ray import actor
    from ray_actors import RolloutWorker

    from otel_rl.integrations.ray import CONTEXT_KWARG

    sent: list[tuple[str, Any, Any]] = []
    monkeypatch.setattr(actor.ActorMethod, "_remote", lambda self, args=None, kwargs=None, **options: sent.append(("call", args, kwargs)))
    monkeypatch.setattr(actor.ActorClass, "_remote", lambda self, args=None, kwargs=None, **options: sent.append(("actor", args, options)))
    ray_call, ray_create = actor.ActorMethod._remote, actor.ActorClass._remote
    tel = make_telemetry(run_id="run-42", world_size=3)

    def method(name: str) -> Any:  # what an actor handle holds for RolloutWorker.<name>
        handle_method = object.__new__(actor.ActorMethod)
        handle_method._method_name = name
        handle_method._signature = list(inspect.signature(getattr(RolloutWorker, name)).parameters.values())[1:]
        return handle_method

    ray_instrumentor.instrument()
    with tel.step(4) as scope, tel.stage("generate"):
        method("generate").remote([1, 2])  # a @stage method: the context rides along
        method("pid").remote()  # a plain method: untouched
        method("generate").remote([3], **{CONTEXT_KWARG: {"given": "1"}})  # one given by hand wins
    method("generate").remote([5])  # no current span: nothing to carry
    actor.ActorClass._remote(None, args=[0.1], kwargs={}, runtime_env={"env_vars": {"RANK": "2", "OTEL_RL_RUN_ID": "mine"}})
    actor.ActorClass._remote(None, args=[0.1], kwargs={})
    (_, _, first), (_, _, plain), (_, _, given), (_, _, outside), (_, _, created), (_, _, bare) = sent
    assert first[CONTEXT_KWARG]["traceparent"].split("-")[1] == scope.trace_id
    assert plain == {} and given == {CONTEXT_KWARG: {"given": "1"}} and outside == {}
    env = created["runtime_env"]["env_vars"]
    assert (env["RANK"], env["OTEL_RL_RUN_ID"], env["WORLD_SIZE"]) == ("2", "mine", "3")  # the actor's own win
    assert bare["runtime_env"]["env_vars"]["OTEL_RL_RUN_ID"] == "run-42"

    ray_instrumentor.uninstrument()
    assert actor.ActorMethod._remote is ray_call and actor.ActorClass._remote is ray_create


@pytest.mark.slow
def test_ray_round_trip_on_a_local_cluster(request, ray_instrumentor, tmp_path: Path):
    from loopback import in_loopback_namespace, rerun_in_loopback_namespace

    if not in_loopback_namespace():  # Ray's services bind every interface
        rerun_in_loopback_namespace(request, timeout_s=300)
        return
    import ray
    from ray_actors import RolloutWorker
    from test_ray import local_ray_cluster

    from otel_rl.runs.folder import find_step_trace

    tel = otel_rl.init(run_dir=str(tmp_path), console=False, service_name="ray-driver", rank=0, world_size=3)
    ray_instrumentor.instrument()
    with tempfile.TemporaryDirectory(prefix="ray") as ray_dir, local_ray_cluster(Path(ray_dir)):
        Worker = ray.remote(RolloutWorker)
        workers = [
            Worker.options(runtime_env={"env_vars": {"RANK": str(r), "PYTHONPATH": str(HERE)}}).remote(0.01) for r in (1, 2)
        ]  # no worker_env() by hand
        with tel.step(1) as first, tel.stage("generate", cluster="actor_infer"):
            assert ray.get([w.generate.remote([1]) for w in workers]) == [[2], [2]]  # no otel_ray.remote()
        ray_instrumentor.uninstrument()
        with tel.step(2) as second, tel.stage("generate", cluster="actor_infer"):
            ray.get(workers[0].generate.remote([2]))
        ray.get([w.close.remote() for w in workers])
    tel.shutdown()

    spans = read_spans(tmp_path)
    trace = find_step_trace(spans, 1)
    assert {s.trace_id for s in trace} == {first.trace_id}
    worker_stages = [s for s in trace if s.name == "rl.generate" and s.resource[A.RL_RANK] != 0]
    assert sorted(s.resource[A.RL_RANK] for s in worker_stages) == [1, 2]
    assert {s.resource[A.RL_RUN_ID] for s in worker_stages} == {tel.config.run_id}  # worker_env() by the instrumentor
    uninstrumented = [s for s in spans if s.name == "rl.generate" and s.resource[A.RL_RANK] == 1 and s.trace_id != first.trace_id]
    assert uninstrumented and all(s.trace_id != second.trace_id for s in uninstrumented)
