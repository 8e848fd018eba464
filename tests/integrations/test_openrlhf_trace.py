"""OpenRLHF 0.11.2's steps as live traces: its own ``PPOTrainer.fit`` and ``TrainingActor.fit``,
``RemoteExperienceMaker`` and ``RayActorGroup`` calls on CPU, with the model actors in real Ray worker
processes of a local Ray.

Stand-ins, each marked as such (``openrlhf_stand_ins.py``, and here), mirror what OpenRLHF's source
has there: the ``vllm`` and ``flash_attn`` modules; the vLLM engines' generation
(``SamplesGenerator.generate_samples``, its Experience built as ``_process_response_into_experience``
builds it, the reward left to the reward model); the model actors' GPU work (subclasses of OpenRLHF's
``PolicyModelActor``, ``ReferenceModelActor`` and ``RewardModelActor`` whose ``forward`` / ``fit`` /
``broadcast_to_vllm`` compute on CPU); ``RayActorGroup._initiate_actors``' GPU placement (each
group here: the real class holding one CPU actor); and, for ``TrainingActor``, the rollout queues and
the vLLM lock (Ray actors there). ``PPOTrainer.__init__`` and ``TrainingActor.__init__`` are skipped
(they load a pretrained tokenizer and datasets by path): the test sets what they would and calls
the real ``BasePPOTrainer.__init__``.
"""

from __future__ import annotations

import importlib.util
import logging
import math
import sys
import tempfile
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

pytest.importorskip("torch")
pytest.importorskip("ray")
if importlib.util.find_spec("openrlhf") is None:
    pytest.skip("openrlhf is not installed (scripts/setup.sh installs it with --no-deps)", allow_module_level=True)

import torch  # noqa: E402
from loopback import in_loopback_namespace, rerun_in_loopback_namespace  # noqa: E402
from opentelemetry.sdk.resources import SERVICE_INSTANCE_ID  # noqa: E402
from test_openrlhf import tensorboard_scalars  # noqa: E402

import otel_rl  # noqa: E402
from otel_rl.integrations import openrlhf_trace  # noqa: E402
from otel_rl.integrations import ray as otel_ray  # noqa: E402
from otel_rl.integrations.base import GuardedCalls  # noqa: E402
from otel_rl.integrations.openrlhf import OpenRLHFInstrumentor, OtelLogger  # noqa: E402
from otel_rl.runs.folder import read_log_records, read_metrics, read_spans  # noqa: E402
from otel_rl.semconv import attributes as A  # noqa: E402
from otel_rl.semconv import metrics as M  # noqa: E402
from otel_rl.semconv import names as N  # noqa: E402

HERE = Path(__file__).resolve().parent  # the Ray workers import openrlhf_stand_ins from here
STEPS = 3
N_SAMPLES = 4  # per prompt
PROMPTS = ["1+1=", "2+2=", "3+3=", "4+4="]
STEP_TIMERS = {"timing/generation": 1.0, "timing/make_experience": 0.5, "timing/ppo_train": 2.0, "timing/broadcast": 0.25}


@pytest.fixture(scope="module")
def ppo_trainer_module() -> Any:
    from openrlhf_stand_ins import ppo_trainer  # imported with stand-ins for vLLM and flash-attn

    return ppo_trainer


class SamplesGenerator:
    """STAND-IN for the vLLM engines' generation: N_SAMPLES one-token answers per prompt, each an
    Experience as SamplesGenerator._process_response_into_experience builds it, without a reward
    (the reward model scores it); exhausted after STEPS batches."""

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer, self.calls = tokenizer, 0

    def generate_samples(self, **kwargs: Any) -> tuple[list[Any], float, int, bool]:
        from openrlhf.trainer.ppo_utils.experience import Experience

        self.calls += 1
        out = []
        for i, prompt in enumerate(p for p in PROMPTS for _ in range(N_SAMPLES)):
            prompt_ids = self.tokenizer.encode(prompt)
            ids = prompt_ids + self.tokenizer.encode(str((i + self.calls) % 10))
            sequences = torch.tensor(ids, dtype=torch.long)
            attention_mask = torch.ones(len(ids), dtype=torch.long)
            action_mask = torch.zeros_like(attention_mask)
            action_mask[len(prompt_ids) :] = 1
            out.append(
                Experience(
                    sequences=sequences.unsqueeze(0),
                    attention_mask=attention_mask.unsqueeze(0),
                    action_mask=action_mask[1:].unsqueeze(0),
                    prompts=[prompt],
                    labels=[""],
                    images=[None],
                    mm_train_inputs=[None],
                    response_length=torch.tensor([len(ids) - len(prompt_ids)]),
                    truncated=torch.tensor([False]),
                    total_length=torch.tensor([float(len(ids))]),
                    info={"response_clip_ratio": torch.tensor([False])},
                )
            )
        return out, 1.0, len(PROMPTS), self.calls >= STEPS


def _args(tensorboard_dir: Path) -> Any:
    ns = SimpleNamespace
    return ns(
        algo=ns(
            kl=ns(target=None, init_coef=0.01, use_loss=False, estimator="k1"),
            dynamic_filtering_enable=False,
            advantage=ns(estimator="group_norm", gamma=1.0, lambd=1.0, no_std_norm=False),
        ),
        logger=ns(wandb=ns(key=None, run_name="grpo-run", project="openrlhf-test"), tensorboard_dir=str(tensorboard_dir), logging_steps=1),
        train=ns(num_episodes=1, dynamic_batch_enable=False, colocate_all=False, colocate_actor_ref=False, colocate_critic_reward=False),
        critic=ns(freezing_steps=-1),
        ds=ns(enable_sleep=False, ring_attn_size=1, tensor_parallel_size=1),
        vllm=ns(enable_sleep=False),
        rollout=ns(batch_size=len(PROMPTS), n_samples_per_prompt=N_SAMPLES, micro_batch_size=4),
        reward=ns(clip_range=None),
        ckpt=ns(save_steps=math.inf, path="", load_enable=False, best_metric_key="none"),
        eval=ns(steps=math.inf, temperature=1.0, n_samples_per_prompt=N_SAMPLES),
    )


def model_group(ray: Any, actor_class: type, env: dict[str, str]) -> Any:
    """OpenRLHF's RayActorGroup holding one actor of ``actor_class`` on CPU: STAND-IN for its
    ``_initiate_actors``, which places ``num_nodes * num_gpus_per_node`` actors on GPUs."""
    from openrlhf.trainer.ray.launcher import RayActorGroup

    group = RayActorGroup.__new__(RayActorGroup)
    group._num_nodes, group._num_gpus_per_node, group.duplicate_actors = 1, 1, 1
    group._resources = group._num_resources_per_node = None
    group.ray_actor_type = ray.remote(actor_class)
    group._actor_handlers = [group.ray_actor_type.options(num_cpus=0, runtime_env={"env_vars": env}).remote(1, 0, None, None)]
    return group


def run_fit(ppo_trainer: Any, groups: dict[str, Any], tokenizer: Any, tensorboard_dir: Path) -> Any:
    """OpenRLHF's PPOTrainer.fit, STEPS steps, with a reward model and a reference model (GRPO)."""
    from torchdata.stateful_dataloader import StatefulDataLoader

    cls = ppo_trainer.PPOTrainer.__ray_actor_class__  # the class under @ray.remote: run here, not as an actor
    trainer = cls.__new__(cls)
    trainer.prompts_dataloader = StatefulDataLoader(PROMPTS, batch_size=len(PROMPTS))
    trainer.eval_dataloader = None
    trainer.max_steps = STEPS
    trainer.generate_kwargs = {"n_samples_per_prompt": N_SAMPLES}
    trainer.samples_generator = SamplesGenerator(tokenizer)
    strategy = SimpleNamespace(args=_args(tensorboard_dir))
    base_init = ppo_trainer.BasePPOTrainer.__init__
    base_init(trainer, strategy, groups["actor"], None, groups["reward"], groups["reference"], vllm_engines=[object()], tokenizer=tokenizer)
    trainer.fit()
    return trainer


class Queue:
    """STAND-IN for a ray.util.queue.Queue handle (an actor): ``get`` / ``put`` with ``block``."""

    def __init__(self, items: list[Any]) -> None:
        self.items = items

    def get(self, block: bool = True) -> Any:
        return self.items.pop(0)

    def put(self, item: Any, block: bool = True) -> None:
        self.items.append(item)


def run_async_fit(groups: dict[str, Any], tokenizer: Any, tensorboard_dir: Path) -> Any:
    """OpenRLHF's asynchronous TrainingActor.fit on STEPS rollouts that GenerateSamplesActor would
    have queued (here generated beforehand), its VLLMLock a STAND-IN answering with object refs."""
    import ray
    from openrlhf.trainer import ppo_trainer, ppo_trainer_async

    generator = SamplesGenerator(tokenizer)
    payloads = [(generator.generate_samples()[0], {"episode": 0, "total_consumed_prompts": 0}, 1.0, 0.5) for _ in range(STEPS)]
    cls = ppo_trainer_async.TrainingActor.__ray_actor_class__
    trainer = cls.__new__(cls)
    strategy = SimpleNamespace(args=_args(tensorboard_dir))
    base_init = ppo_trainer.BasePPOTrainer.__init__
    base_init(trainer, strategy, groups["actor"], None, groups["reward"], groups["reference"], vllm_engines=[object()], tokenizer=tokenizer)
    lock = SimpleNamespace(remote=lambda: ray.put(None))
    trainer.vllm_lock, trainer._partial_rollout = SimpleNamespace(acquire=lock, release=lock), False
    trainer.rollout_queue, trainer.rollout_slots = Queue([*payloads, "done"]), Queue([])
    trainer.fit(global_step=0)
    return trainer


WORKER_SPANS = {
    ("make_experience", "compute_rewards", "reward"),  # RewardModelActor.forward
    ("make_experience", "compute_log_probs", "actor_train"),  # the old log-probs: PolicyModelActor.forward
    ("make_experience", "compute_ref_log_probs", "reference"),  # ReferenceModelActor.forward
    ("train_step", "train_step", "actor_train"),  # PolicyModelActor.fit
    ("model_update", "model_update", "actor_train"),  # PolicyModelActor.broadcast_to_vllm
}
TRAINER_STAGES = [("generate", "actor_infer"), ("make_experience", None), ("train_step", "actor_train"), ("model_update", None)]


def check_step_traces(
    spans: list[Any], roots: list[Any], events: list[dict[str, Any]], stages_expected: list[Any], run_id: str
) -> set[str]:
    """Each root's trace: the step, the trainer's stages and in them the workers' calls; its rl.log
    event in it. Returns the worker processes (service.instance.id) seen."""
    assert [s.attributes[A.RL_STEP] for s in roots] == [1, 2, 3]  # one trace per step
    worker_processes = set()
    for root in roots:
        step, trainer_process = root.attributes[A.RL_STEP], root.resource[SERVICE_INSTANCE_ID]
        trace = [s for s in spans if s.trace_id == root.trace_id]
        stages = sorted((s for s in trace if s.parent_span_id == root.span_id), key=lambda s: s.start_ns)
        assert [(s.attributes[A.RL_STAGE], s.attributes.get(A.RL_CLUSTER)) for s in stages] == stages_expected
        by_id = {s.span_id: s for s in stages}
        workers = [s for s in trace if s.resource[SERVICE_INSTANCE_ID] != trainer_process]
        assert len(trace) == 1 + len(stages) + len(workers)  # the step, its stages and the workers' calls
        placed = {(by_id[s.parent_span_id].attributes[A.RL_STAGE], s.attributes[A.RL_STAGE], s.attributes[A.RL_CLUSTER]) for s in workers}
        assert placed == WORKER_SPANS and len(workers) == len(WORKER_SPANS)
        for span in workers:
            parent = by_id[span.parent_span_id]
            assert parent.start_ns <= span.start_ns and span.end_ns <= parent.end_ns
            assert span.attributes[A.RL_STEP] == step and span.resource[A.RL_RUN_ID] == run_id
            worker_processes.add(span.resource[SERVICE_INSTANCE_ID])
        # the step's rl.log event is in the step's trace
        assert [e["trace_id"] for e in events if e["attributes"][A.RL_STEP] == step] == [root.trace_id]
    return worker_processes


@pytest.mark.slow
def test_each_step_is_one_trace_with_the_trainers_stages_and_the_model_workers_calls(
    request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    if not in_loopback_namespace():  # Ray's services bind every interface
        rerun_in_loopback_namespace(request, timeout_s=420)
        return
    import ray
    from openrlhf_stand_ins import CpuPolicyModelActor, CpuReferenceModelActor, CpuRewardModelActor
    from test_ray import local_ray_cluster

    ppo_trainer = request.getfixturevalue("ppo_trainer_module")
    _, tokenizer = request.getfixturevalue("hf_tiny_lm")
    run_dir, async_dir = tmp_path / "run", tmp_path / "async-run"
    telemetry = otel_rl.init(run_dir=str(run_dir), console=False, framework="openrlhf")
    env = {**otel_ray.worker_env(), "PYTHONPATH": str(HERE)}  # the job's OTEL_* variables, as the setup hook passes them
    with tempfile.TemporaryDirectory(prefix="ray") as ray_dir, local_ray_cluster(Path(ray_dir), deadline_s=360):  # short: AF_UNIX paths
        actors = {"actor": CpuPolicyModelActor, "reference": CpuReferenceModelActor, "reward": CpuRewardModelActor}
        groups = {name: model_group(ray, cls, env) for name, cls in actors.items()}
        run_fit(ppo_trainer, groups, tokenizer, tmp_path / "tb-plain")  # OpenRLHF as it is
        OpenRLHFInstrumentor().instrument(worker_spans=True)  # the workers import otel-rl (PYTHONPATH above)
        try:
            trainer = run_fit(ppo_trainer, groups, tokenizer, tmp_path / "tb-otel")
            assert isinstance(trainer.tensorboard_logger, OtelLogger)
            telemetry.shutdown()  # the asynchronous trainer's steps 1-3 go to a run folder of their own
            async_telemetry = otel_rl.init(run_dir=str(async_dir), run_id=telemetry.config.run_id, console=False, framework="openrlhf")
            run_async_fit(groups, tokenizer, tmp_path / "tb-async")
            async_telemetry.shutdown()
        finally:
            OpenRLHFInstrumentor().uninstrument()
        task_names = {name: ray.get(g._actor_handlers[0].task_names.remote()) for name, g in groups.items()}
        ray.get([h.close.remote() for g in groups.values() for h in g._actor_handlers])

    # the calls sent through __ray_call__ kept the names Ray gives the methods' own tasks
    assert task_names == {
        "actor": ["CpuPolicyModelActor.broadcast_to_vllm", "CpuPolicyModelActor.execute_batch", "CpuPolicyModelActor.fit"],
        "reference": ["CpuReferenceModelActor.execute_batch"],
        "reward": ["CpuRewardModelActor.execute_batch"],
    }

    # OpenRLHF logged the same values with otel-rl as without (wall times aside)
    plain, with_otel = tensorboard_scalars(tmp_path / "tb-plain"), tensorboard_scalars(tmp_path / "tb-otel")
    timing = {k for k in plain if k[0].startswith("train/timing/")}
    assert set(with_otel) == set(plain) and len(timing) == 5 * STEPS
    assert {k: v for k, v in with_otel.items() if k not in timing} == {k: v for k, v in plain.items() if k not in timing}

    # the trainers' run folders, and the one each worker process wrote beside the first (their ranks repeat)
    spans = [s for folder in sorted(tmp_path.glob("*run*")) for s in read_spans(folder)]
    assert not any(s.attributes.get(A.RL_SPAN_RECONSTRUCTED) for s in spans)  # no step rebuilt from its timers
    run_id = telemetry.config.run_id
    for folder, stages in ((run_dir, TRAINER_STAGES), (async_dir, TRAINER_STAGES[1:])):
        # the asynchronous trainer gets its rollouts from another actor: its steps start at train_step
        roots = sorted((s for s in read_spans(folder) if s.name == N.RL_STEP_SPAN), key=lambda s: s.start_ns)
        events = [r for r in read_log_records(folder) if r["event_name"] == N.RL_LOG_EVENT]
        assert len(check_step_traces(spans, roots, events, stages, run_id)) == 3  # each model in its own Ray worker process

        # each stage's and the step's duration counted once a step, though both the spans and the
        # logged timing/* keys measure them
        counts: dict[tuple[str, tuple], int] = {}
        for p in read_metrics(folder):
            if p.name in (M.RL_STAGE_DURATION, M.RL_STEP_DURATION):
                key = (p.name, tuple(sorted(p.attributes.items())))
                counts[key] = max(counts.get(key, 0), p.count or 0)  # cumulative: the last point counts them all
        assert len(counts) == 5 and set(counts.values()) == {STEPS}, counts


def test_a_step_traced_live_is_not_rebuilt_and_one_not_traced_live_is(make_telemetry: Any, tmp_path: Path) -> None:
    telemetry = make_telemetry(framework="openrlhf")
    otel = OtelLogger(None, None, telemetry=telemetry)
    logs = {"policy_loss": 0.1, **STEP_TIMERS}
    otel.log_train(1, logs)  # nothing traced step 1 as it ran: rebuilt from its timers
    live = otel.live_steps
    live.begin(2)
    for timer in STEP_TIMERS:
        with live.stage(timer):
            pass
    live.end()
    otel.log_train(2, logs)
    otel.close()
    telemetry.shutdown()

    spans = read_spans(tmp_path / "run0")
    roots = {s.attributes[A.RL_STEP]: s for s in spans if s.name == N.RL_STEP_SPAN}
    assert sorted(s.attributes[A.RL_STEP] for s in spans if s.name == N.RL_STEP_SPAN) == [1, 2]  # no second trace of step 2
    for step, rebuilt in ((1, True), (2, False)):
        stages = sorted((s for s in spans if s.parent_span_id == roots[step].span_id), key=lambda s: s.start_ns)
        assert [s.attributes[A.RL_STAGE] for s in stages] == ["generate", "make_experience", "train_step", "model_update"]
        assert all(bool(s.attributes.get(A.RL_SPAN_RECONSTRUCTED)) is rebuilt for s in [roots[step], *stages])
    events = {r["attributes"][A.RL_STEP]: r for r in read_log_records(tmp_path / "run0") if r["event_name"] == N.RL_LOG_EVENT}
    assert events[2]["trace_id"] == roots[2].trace_id and events[2]["body"]["policy_loss"] == 0.1


class Broken:
    """A telemetry whose every call fails."""

    config = SimpleNamespace(strict=False, log_samples=0)

    def fail(self, *args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("collector gone")

    step = stage = inject = join = log = flush = fail


class Handle:
    """STAND-IN for a Ray actor handle of a Ray without ``__ray_call__``: ``fit.remote`` answers at once."""

    def __init__(self) -> None:
        self.fit = SimpleNamespace(remote=lambda **kwargs: {"fit": kwargs})


def test_otel_rl_failures_never_reach_the_trainer_or_the_workers(
    ppo_trainer_module: Any, make_telemetry: Any, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    from openrlhf.trainer.ray.launcher import RayActorGroup
    from openrlhf_stand_ins import CpuPolicyModelActor

    # the trainer's step and stages, with a telemetry that fails at every call
    live = OtelLogger(None, None, telemetry=Broken()).live_steps  # type: ignore[arg-type]
    for step in (1, 2):
        live.begin(step)
        with live.stage("timing/ppo_train"):
            pass
        live.end()
    assert live.traced(2) is None  # its span never started: the step is rebuilt from its timers
    with pytest.raises(KeyError, match="the trainer's own"):  # the trainer's error, untouched
        live.begin(3)
        with live.stage("timing/ppo_train"):
            raise KeyError("the trainer's own")

    # a worker's call, with a worker telemetry that fails at every call
    monkeypatch.setattr(openrlhf_trace, "WORKER_TELEMETRY", SimpleNamespace(telemetry=Broken))
    monkeypatch.setattr(openrlhf_trace, "WORKER_CALLS", GuardedCalls("the OpenRLHF model worker"))
    worker = SimpleNamespace(double=lambda x: 2 * x, fail=lambda: 1 / 0)
    assert [openrlhf_trace.run_method(worker, "double", {}, "train_step", "actor_train", x) for x in (1, 2)] == [2, 4]
    with pytest.raises(ZeroDivisionError):
        openrlhf_trace.run_method(worker, "fail", {}, "train_step", "actor_train")

    # a model group's call in a stage, on a Ray whose actors have no __ray_call__: it goes as before
    telemetry = make_telemetry(framework="openrlhf")
    group = RayActorGroup.__new__(RayActorGroup)
    group._actor_handlers, group.ray_actor_type = [Handle()], CpuPolicyModelActor
    OpenRLHFInstrumentor().instrument(worker_spans=True)
    try:
        with telemetry.step(1), telemetry.stage("train_step"):
            for _ in range(2):
                assert group.async_run_method("fit", kl_ctl=0.5) == [{"fit": {"kl_ctl": 0.5}}]
    finally:
        OpenRLHFInstrumentor().uninstrument()

    failures = sorted(r.args[1] for r in caplog.records if r.levelno == logging.WARNING and "failed in" in r.getMessage())
    assert failures == ["join", "route", "stage", "stage", "step"], failures  # each kind once, for each source


def test_each_model_actors_calls_that_are_stages_of_the_step(ppo_trainer_module: Any) -> None:
    from openrlhf.trainer.ray import launcher, ppo_actor, ppo_critic

    actor, critic = ppo_actor.PolicyModelActor, ppo_critic.CriticModelActor
    stage = openrlhf_trace.worker_stage
    assert [stage(actor, m) for m in ("forward", "fit", "broadcast_to_vllm")] == [
        ("PolicyModelActor", "compute_log_probs", "actor_train"),
        ("PolicyModelActor", "train_step", "actor_train"),
        ("PolicyModelActor", "model_update", "actor_train"),
    ]
    assert [stage(critic, m) for m in ("forward", "fit")] == [
        ("CriticModelActor", "compute_values", "critic"),
        ("CriticModelActor", "train_step", "critic"),
    ]
    assert stage(launcher.ReferenceModelActor, "forward") == ("ReferenceModelActor", "compute_ref_log_probs", "reference")
    assert stage(launcher.RewardModelActor, "forward") == ("RewardModelActor", "compute_rewards", "reward")
    # what stays a plain call: moving data, memory and checkpoints, and any other class's methods
    assert [stage(actor, m) for m in ("append", "empty_cache", "reload_states", "offload_states", "save_checkpoint")] == [None] * 5
    assert stage(object, "forward") is None


def test_the_launcher_gives_the_ray_job_one_run_for_the_trainer_and_the_workers(monkeypatch: pytest.MonkeyPatch) -> None:
    import ray

    from otel_rl import environment_variables as ENV
    from otel_rl.integrations import openrlhf

    started: list[dict[str, Any]] = []
    monkeypatch.setattr(ray, "is_initialized", lambda: False)
    monkeypatch.setattr(ray, "init", lambda **kwargs: started.append(kwargs))
    monkeypatch.setattr(openrlhf, "install", lambda: None)  # this process: nothing to instrument here
    monkeypatch.setattr(openrlhf.runpy, "run_module", lambda *args, **kwargs: None)  # OpenRLHF's CLI: not run
    monkeypatch.setattr(sys, "argv", list(sys.argv))  # main() sets it for OpenRLHF's CLI
    monkeypatch.delenv(ENV.OTEL_RL_RUN_ID, raising=False)
    openrlhf.main(["--actor.model_name_or_path", "m"])
    monkeypatch.setenv(ENV.OTEL_RL_RUN_ID, "mine")
    openrlhf.main([])
    first, given = (run["runtime_env"]["env_vars"][ENV.OTEL_RL_RUN_ID] for run in started)
    assert first and first != "mine" and given == "mine"
    assert started[0]["runtime_env"]["worker_process_setup_hook"] == openrlhf.SETUP_HOOK


class RoutableHandle(Handle):
    """STAND-IN for a Ray actor handle with ``__ray_call__``: records whether a call went through it."""

    def __init__(self) -> None:
        super().__init__()
        self.routed: list[str] = []
        self.__ray_call__ = SimpleNamespace(options=lambda name: SimpleNamespace(remote=lambda *a, **k: self.routed.append(name)))


def test_worker_calls_are_routed_only_where_the_workers_can_import_otel_rl(ppo_trainer_module: Any, make_telemetry: Any) -> None:
    from openrlhf.trainer.ray.launcher import RayActorGroup
    from openrlhf_stand_ins import CpuPolicyModelActor

    from otel_rl.integrations.openrlhf import install
    from otel_rl.integrations.openrlhf_agent import OpenRLHFAgentInstrumentor

    telemetry = make_telemetry(framework="openrlhf")
    group = RayActorGroup.__new__(RayActorGroup)
    handle = RoutableHandle()
    group._actor_handlers, group.ray_actor_type = [handle], CpuPolicyModelActor
    for instrument, routed in (
        (lambda: OpenRLHFInstrumentor().instrument(), []),  # a script's own instrument(): the workers may lack otel-rl
        (install, ["CpuPolicyModelActor.fit"]),  # the Ray setup hook runs in every worker of the job
    ):
        instrument()
        try:
            assert openrlhf_trace.routes_worker_calls() == bool(routed)
            with telemetry.step(1), telemetry.stage("train_step"):
                group.async_run_method("fit", kl_ctl=0.5)
        finally:
            OpenRLHFInstrumentor().uninstrument()
            if OpenRLHFAgentInstrumentor().is_instrumented:  # install() instruments the agent executor too, if imported
                OpenRLHFAgentInstrumentor().uninstrument()
        assert handle.routed == routed
        handle.routed.clear()
    assert not openrlhf_trace.routes_worker_calls()
