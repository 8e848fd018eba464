"""Tests of the demo's RL pieces (hand-computed values) and of a real short training run."""

from __future__ import annotations

import contextlib
import math
import time

import pytest

torch = pytest.importorskip("torch")

from otel_rl.demo import DemoConfig, run_demo  # noqa: E402
from otel_rl.demo import _algorithms as alg  # noqa: E402
from otel_rl.demo._policy import HostOffload, TinyCausalLM  # noqa: E402
from otel_rl.demo._task import EOS, PAD, digit_token, score_response  # noqa: E402
from otel_rl.semconv import metrics as M  # noqa: E402


# --------------------------------------------------------------------------------------
# Test double of otel_rl.Telemetry's public API (step / stage / phase / metrics / log /
# record / shutdown). It exports nothing; it keeps what the demo hands it so the tests can
# check the calls. Stage metrics mimic the SDK's ROLL-style time keys.
# --------------------------------------------------------------------------------------
class _NoopStage:
    def __init__(self, name: str, cluster: str | None, offload: bool) -> None:
        self.name = name
        self.cluster = cluster
        self.offload = offload
        self.phases: list[str] = []
        self.metrics: dict[str, float] = {}

    def _key(self, phase: str) -> str:
        infix = f"{self.cluster}/{self.name}" if self.cluster else self.name
        return f"time/{infix}/{phase}"

    @contextlib.contextmanager
    def phase(self, name: str):
        self.phases.append(name)
        t0 = time.perf_counter()
        yield self
        self.metrics[self._key(name)] = time.perf_counter() - t0


class NoopTelemetry:
    """Test double of otel_rl.Telemetry: same public calls, records instead of exporting."""

    def __init__(self) -> None:
        self.logs: list[tuple[int | None, dict]] = []
        self.records: list[tuple[int | None, str, object]] = []
        self.stages: list[tuple[int | None, _NoopStage]] = []
        self.current_step: int | None = None
        self.shut_down = False

    @contextlib.contextmanager
    def step(self, step: int):
        self.current_step = step
        try:
            yield self
        finally:
            self.current_step = None

    @contextlib.contextmanager
    def stage(self, name: str, *, cluster: str | None = None, offload: bool = False):
        st = _NoopStage(name, cluster, offload)
        self.stages.append((self.current_step, st))
        t0 = time.perf_counter()
        yield st
        st.metrics[st._key("total")] = time.perf_counter() - t0

    def log(self, values, *, step: int | None = None) -> None:
        self.logs.append((step, dict(values)))

    def record(self, name: str, values) -> None:
        self.records.append((self.current_step, name, values))

    def shutdown(self) -> None:
        self.shut_down = True


# --------------------------------------------------------------------------------------
# The RL maths, hand-computed
# --------------------------------------------------------------------------------------
def test_group_normalize_by_hand():
    scores = torch.tensor([1.0, 0.0, 0.0, 1.0, 0.5, 0.5, 0.5, 0.5])
    out = alg.group_normalize(scores, group_size=4)
    # group 1: mean 0.5, unbiased std sqrt(4 * 0.25 / 3) = 0.57735 -> +-0.866025
    z = 0.5 / math.sqrt(1.0 / 3.0)
    assert out[:4].tolist() == pytest.approx([z, -z, -z, z], rel=1e-5)
    # group 2 has no spread: no learning signal
    assert out[4:].tolist() == pytest.approx([0.0] * 4, abs=1e-6)


def test_clip_rewards_fraction():
    rewards, frac = alg.clip_rewards(torch.tensor([-3.0, -1.0, 0.5, 2.5]), clip=2.0)
    assert rewards.tolist() == [-2.0, -1.0, 0.5, 2.0]
    assert frac == pytest.approx(0.5)


def test_gae_three_steps_by_hand():
    rewards = torch.tensor([[0.0, 0.0, 1.0]])
    values = torch.tensor([[0.5, 0.6, 0.7]])
    mask = torch.ones(1, 3)
    adv, ret = alg.compute_gae(rewards, values, mask, gamma=1.0, lam=0.9)
    # t=2: 1 - 0.7 = 0.3; t=1: (0.7 - 0.6) + 0.9 * 0.3 = 0.37; t=0: (0.6 - 0.5) + 0.9 * 0.37 = 0.433
    assert adv[0].tolist() == pytest.approx([0.433, 0.37, 0.3], abs=1e-6)
    assert ret[0].tolist() == pytest.approx([0.933, 0.97, 1.0], abs=1e-6)


def test_gae_discount_and_mask_by_hand():
    rewards = torch.tensor([[0.0, 1.0, 0.0]])
    values = torch.tensor([[0.2, 0.4, 9.0]])  # 9.0 sits past the end of the response
    mask = torch.tensor([[1.0, 1.0, 0.0]])
    adv, ret = alg.compute_gae(rewards, values, mask, gamma=0.9, lam=0.5)
    # t=1: 1 + 0.9 * 0 - 0.4 = 0.6; t=0: 0.9 * 0.4 - 0.2 + 0.9 * 0.5 * 0.6 = 0.43
    assert adv[0].tolist() == pytest.approx([0.43, 0.6, 0.0], abs=1e-6)
    assert ret[0].tolist() == pytest.approx([0.63, 1.0, 0.0], abs=1e-6)


def test_token_level_rewards_on_last_token():
    mask = torch.tensor([[1, 1, 1, 0], [1, 0, 0, 0]])
    out = alg.token_level_rewards(torch.tensor([0.75, -1.0]), mask)
    assert out.tolist() == [[0.0, 0.0, 0.75, 0.0], [-1.0, 0.0, 0.0, 0.0]]


def test_k3_kl_by_hand():
    logp = torch.tensor([-1.0, -2.0, -0.5])
    ref = torch.tensor([-1.0, -1.0, -1.5])
    # ref - logp = [0, 1, -1] -> exp(x) - x - 1 = [0, e - 2, 1/e]
    assert alg.k3_kl(logp, ref).tolist() == pytest.approx([0.0, math.e - 2.0, math.exp(-1.0)], rel=1e-6)


def test_ppo_clip_fractions_and_ratio_by_hand():
    # sample 0: ratios 1.0, 1.5, 0.5, 1.1 with advantages 1, 1, 1, -1
    # sample 1: ratios 5.0, 1.0 with advantages -1, -1, then two masked tokens
    ratios = torch.tensor([[1.0, 1.5, 0.5, 1.1], [5.0, 1.0, 20.0, 20.0]])
    adv = torch.tensor([[1.0, 1.0, 1.0, -1.0], [-1.0, -1.0, 1.0, 1.0]])
    mask = torch.tensor([[1.0, 1.0, 1.0, 1.0], [1.0, 1.0, 0.0, 0.0]])
    old = torch.full((2, 4), -2.0)
    logp = old + ratios.log()
    total, m = alg.ppo_policy_loss(
        log_probs=logp,
        old_log_probs=old,
        ref_log_probs=logp,
        advantages=adv,
        response_mask=mask,
        final_response_mask=mask,
        sample_weights=torch.tensor([1.5, 0.5]),
        clip=0.2,
        dual_clip=3.0,
        kl_coef=0.1,
    )
    assert m["actor/ppo_ratio_high_clipfrac"] == pytest.approx(2 / 6)  # 1.5 and 5.0
    assert m["actor/ppo_ratio_low_clipfrac"] == pytest.approx(1 / 6)  # 0.5
    assert m["actor/ppo_ratio_clipfrac"] == pytest.approx(3 / 6)
    # surr2 < surr1 only for (1.5, A=1): sample 0 -> 1/4, sample 1 -> 0
    assert m["actor/clipfrac"] == pytest.approx(0.125)
    assert m["actor/ratio_mean"] == pytest.approx((1.025 + 3.0) / 2)
    assert m["actor/ratio_max"] == pytest.approx(5.0)
    assert m["actor/ratio_min"] == pytest.approx(0.5)
    # per-token loss -min(surr1, surr2): sample 0 [-1, -1.2, -0.5, 1.1] -> mean -0.4;
    # sample 1 [5 -> dual clip 3, 1] -> mean 2
    assert m["actor/pg_loss"] == pytest.approx((-0.4 + 2.0) / 2, abs=1e-6)
    assert m["actor/weighted_pg_loss"] == pytest.approx((-0.4 * 1.5 + 2.0 * 0.5) / 2, abs=1e-6)
    assert m["actor/kl_loss"] == pytest.approx(0.0, abs=1e-7)  # current == reference
    assert total.item() == pytest.approx(m["actor/weighted_pg_loss"], abs=1e-6)
    d0 = [math.log(r) for r in (1.0, 1.5, 0.5, 1.1)]
    d1 = [math.log(5.0), 0.0]
    assert m["actor/policykl"] == pytest.approx((sum(d0) / 4 + sum(d1) / 2) / 2, rel=1e-5)
    approx = (sum(0.5 * x * x for x in d0) / 4 + sum(0.5 * x * x for x in d1) / 2) / 2
    assert m["actor/approxkl"] == pytest.approx(approx, rel=1e-5)
    assert m["actor/valid_samples"] == 2.0 and m["actor/total_samples"] == 2.0
    assert m["actor/sample_weights_max"] == 1.5 and m["actor/sample_weights_min"] == 0.5


def test_ppo_loss_drops_masked_samples_and_adds_kl():
    logp = torch.tensor([[-1.0, -2.0], [-1.0, -1.0]])
    ref = torch.tensor([[-1.0, -1.0], [-3.0, -3.0]])
    mask = torch.ones(2, 2)
    final = torch.tensor([[1.0, 1.0], [0.0, 0.0]])  # sample 1 truncated and masked out
    total, m = alg.ppo_policy_loss(
        log_probs=logp,
        old_log_probs=logp,
        ref_log_probs=ref,
        advantages=torch.zeros(2, 2),
        response_mask=mask,
        final_response_mask=final,
        sample_weights=torch.ones(2),
        kl_coef=0.5,
    )
    # k3 on sample 0: [0, e - 2] -> mean (e - 2) / 2; sample 1 contributes 0; mean over 2 samples
    kl = (math.e - 2.0) / 2 / 2
    assert m["actor/kl_loss"] == pytest.approx(kl, rel=1e-5)
    assert total.item() == pytest.approx(0.5 * kl, rel=1e-5)
    assert m["actor/valid_samples"] == 1.0 and m["actor/valid_sample_ratio"] == 0.5


def test_value_loss_clipping_by_hand():
    loss, m = alg.value_loss(
        values=torch.tensor([[1.0, 0.2]]), old_values=torch.zeros(1, 2), returns=torch.tensor([[1.0, 0.0]]), mask=torch.ones(1, 2), clip=0.5
    )
    # token 0: unclipped error 0, clipped prediction 0.5 -> error 0.25 (clip binds)
    # token 1: 0.04 both ways
    assert loss.item() == pytest.approx(0.5 * (0.25 + 0.04) / 2)
    assert m["critic/clipfrac"] == pytest.approx(0.5)
    assert m["critic/error"] == pytest.approx(0.02)
    assert m["critic/vpred"] == pytest.approx(0.6)
    assert m["critic/value"] == pytest.approx(0.0)


def test_sample_weights_favour_short_responses():
    mask = torch.tensor([[1, 0, 0, 0, 0], [1, 1, 1, 0, 0], [1, 1, 1, 1, 1]])
    w = alg.compute_sample_weights(mask)
    assert w.tolist() == pytest.approx([1.5, 1.0, 0.5], rel=1e-6)
    assert alg.compute_sample_weights(mask, length_weighting=False).tolist() == [1.0, 1.0, 1.0]


def test_minibatch_reduction():
    out = alg.reduce_minibatch_metrics(
        [
            {
                "actor/ratio_max": 1.2,
                "actor/ratio_min": 0.9,
                "actor/pg_loss": 1.0,
                "actor/valid_samples": 3.0,
                "actor/total_samples": 4.0,
                "actor/valid_sample_ratio": 0.75,
            },
            {
                "actor/ratio_max": 1.5,
                "actor/ratio_min": 0.7,
                "actor/pg_loss": 3.0,
                "actor/valid_samples": 4.0,
                "actor/total_samples": 4.0,
                "actor/valid_sample_ratio": 1.0,
            },
        ]
    )
    assert out == {
        "actor/ratio_max": 1.5,
        "actor/ratio_min": 0.7,
        "actor/pg_loss": 2.0,
        "actor/valid_samples": 7.0,
        "actor/total_samples": 8.0,
        "actor/valid_sample_ratio": 0.875,
    }


def _toks(digits):
    return [digit_token(d) for d in digits]


@pytest.mark.parametrize(
    ("response", "score", "format_ok"),
    [
        (_toks([3, 2, 1]) + [EOS, PAD, PAD], 1.0, True),  # right answer
        (_toks([3, 2]) + [EOS], 0.8 * 2 / 3 + 0.2, True),  # one digit missing
        (_toks([3, 2, 1, 4]) + [EOS], 0.8 * 3 / 4 + 0.2, True),  # one digit too many
        (_toks([1, 2, 3]) + [EOS], 0.8 * 1 / 3 + 0.2, True),  # copied, not reversed
        ([EOS], 0.2, True),  # stops at once
        (_toks([3, 2, 1, 1, 1, 1]), 0.8 * 3 / 6, False),  # truncated: no EOS in the budget
    ],
)
def test_reward_on_crafted_outputs(response, score, format_ok):
    parts = score_response([1, 2, 3], response)
    assert parts.score == pytest.approx(score)
    assert parts.format_ok is format_ok


def test_host_offload_round_trip():
    torch.manual_seed(0)
    model = TinyCausalLM(d_model=16, n_layers=1, n_heads=2, d_ff=32)
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    ids = torch.tensor([[1, 6, 7, 3]])
    model(ids, torch.ones_like(ids)).sum().backward()
    opt.step()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    exp_avg = {id(p): opt.state[p]["exp_avg"].clone() for p in model.parameters()}
    host = HostOffload(model, opt)
    host.offload()
    assert all(p.numel() == 0 and p.grad is None for p in model.parameters())
    assert all(opt.state[p]["exp_avg"].numel() == 0 for p in model.parameters())
    assert all(torch.equal(host.host_state_dict()[k], v) for k, v in before.items())
    host.onload(with_optimizer=False)
    assert all(torch.equal(model.state_dict()[k], v) for k, v in before.items())
    host.onload()
    assert all(torch.equal(opt.state[p]["exp_avg"], exp_avg[id(p)]) for p in model.parameters())


def test_fresh_policy_ends_most_answers_within_the_budget():
    """The EOS prior keeps a healthy run's first steps under seed 003's clipped_ratio > 0.3 alert."""
    from otel_rl.demo._policy import generate
    from otel_rl.demo._task import ReverseDigitsTask

    task = ReverseDigitsTask()
    prompts = task.sample_prompts(512, torch.Generator().manual_seed(1))
    ids, mask = task.encode(prompts)

    def truncated_share(eos_logit: float) -> float:
        torch.manual_seed(0)
        model = TinyCausalLM(eos_logit=eos_logit)
        assert model.head.bias[EOS] == eos_logit
        rollout = generate(model, ids, mask, max_new_tokens=task.max_new_tokens, generator=torch.Generator().manual_seed(2))
        return rollout.truncated.float().mean().item()

    with_prior = truncated_share(DemoConfig().eos_prior_logit)
    assert 0.05 < with_prior < 0.3
    assert truncated_share(0.0) > 0.5  # uniform sampling: (13/14)^6 of answers run out of tokens


# --------------------------------------------------------------------------------------
# A real training run
# --------------------------------------------------------------------------------------
ROLL_KEYS = [
    "actor/pg_loss",
    "actor/weighted_pg_loss",
    "actor/kl_loss",
    "actor/total_loss",
    "actor/approxkl",
    "actor/policykl",
    "actor/clipfrac",
    "actor/ppo_ratio_high_clipfrac",
    "actor/ppo_ratio_low_clipfrac",
    "actor/ppo_ratio_clipfrac",
    "actor/ratio_mean",
    "actor/ratio_max",
    "actor/ratio_min",
    "actor/lr",
    "actor/grad_norm",
    "actor/valid_samples",
    "actor/total_samples",
    "actor/valid_sample_ratio",
    "actor/sample_weights_mean",
    "actor/sample_weights_min",
    "actor/sample_weights_max",
    "critic/score/mean",
    "critic/score/max",
    "critic/score/min",
    "critic/rewards/mean",
    "critic/rewards/max",
    "critic/rewards/min",
    "critic/advantages/mean",
    "critic/advantages/max",
    "critic/advantages/min",
    "critic/returns/mean",
    "critic/returns/max",
    "critic/returns/min",
    "critic/ref_log_prob/mean",
    "critic/old_log_prob/mean",
    "critic/entropy/mean",
    "critic/reward_clip_frac",
    "tokens/response_length/mean",
    "tokens/response_length/max",
    "tokens/response_length/min",
    "tokens/prompt_length/mean",
    "tokens/prompt_length/max",
    "tokens/prompt_length/min",
    "system/tps",
    "system/samples",
]
PPO_KEYS = [
    "critic/lr",
    "critic/loss",
    "critic/value",
    "critic/vpred",
    "critic/clipfrac",
    "critic/error",
    "critic/values/mean",
    "critic/values/max",
    "critic/values/min",
]
STAGES = {
    "grpo": [
        ("generate", "actor_infer", False),
        ("compute_rewards", "reward", False),
        ("compute_log_probs", "actor_train", True),
        ("compute_ref_log_probs", "reference", True),
        ("advantage", None, False),
        ("train_step", "actor_train", True),
        ("model_update", "actor_infer", False),
    ]
}
STAGES["ppo"] = (
    STAGES["grpo"][:4]
    + [("compute_values", "critic", True), ("advantage", None, False), ("train_step", "critic", True)]
    + STAGES["grpo"][5:]
)
SAMPLE_METRICS = {M.RL_SAMPLE_RESPONSE_LENGTH, M.RL_SAMPLE_PROMPT_LENGTH, M.RL_SAMPLE_REWARD, M.RL_SAMPLE_ADVANTAGE}


@pytest.mark.parametrize("algo", ["grpo", "ppo"])
def test_demo_learns_and_logs_roll_keys(algo, tmp_path):
    steps = 30
    tel = NoopTelemetry()
    result = run_demo(steps=steps, algo=algo, out=tmp_path, seed=0, telemetry=tel, progress=False)

    # it learns: the rule score of the last 5 steps clearly beats the first 5
    first, last = sum(result.rewards[:5]) / 5, sum(result.rewards[-5:]) / 5
    assert first < 0.3
    assert last > first + 0.3, (first, last, result.rewards)
    assert result.final_val_score is not None and result.final_val_score > 0.5
    assert not tel.shut_down  # a telemetry that was handed in stays open

    # one log per step, with every ROLL key and every stage's metrics
    assert [s for s, _ in tel.logs] == list(range(1, steps + 1))
    expected = ROLL_KEYS + (PPO_KEYS if algo == "ppo" else [])
    for step, values in tel.logs:
        missing = [k for k in expected if k not in values]
        assert not missing, (step, missing)
        assert all(math.isfinite(float(v)) for v in values.values())
        stages = [st for s, st in tel.stages if s == step]
        for st in stages:
            assert st.metrics and all(k in values for k in st.metrics), st.name
        assert [(st.name, st.cluster, st.offload) for st in stages][: len(STAGES[algo])] == STAGES[algo]
        for st in stages:
            assert st.phases == (["onload", "execute", "offload"] if st.offload else [])
        assert values["system/samples"] == step * 512
        assert ("val/score/mean" in values) == (step % 5 == 0 or step == steps)
        assert any(st.name == "do_checkpoint" for st in stages) == (step % 10 == 0 or step == steps)
        assert "time/actor_train/train_step/onload" in values
    # whole per-sample arrays, four per step
    for step in range(1, steps + 1):
        recorded = {name: vals for s, name, vals in tel.records if s == step}
        assert set(recorded) == SAMPLE_METRICS
        assert all(len(v) == 512 for v in recorded.values())

    # checkpoints exist and load back into the model
    assert [p.name for p in result.checkpoints] == ["checkpoint-10.pt", "checkpoint-20.pt", "checkpoint-30.pt"]
    ckpt = torch.load(result.checkpoints[-1], weights_only=True)
    assert ckpt["step"] == steps and ckpt["algo"] == algo
    model = TinyCausalLM(**ckpt["model_kwargs"])
    model.load_state_dict(ckpt["actor"])
    if algo == "ppo":
        critic = TinyCausalLM(**ckpt["model_kwargs"], out_dim=1)
        critic.load_state_dict(ckpt["critic"])


def test_demo_is_deterministic_and_prints_progress(tmp_path, capsys):
    a = run_demo(steps=2, out=tmp_path / "a", seed=3, telemetry=NoopTelemetry(), progress=True)
    b = run_demo(steps=2, out=tmp_path / "b", seed=3, telemetry=NoopTelemetry(), progress=False)
    assert a.rewards == b.rewards
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 2 and err[0].startswith("step 1/2 reward ") and " kl " in err[0]


def test_injected_spike_is_a_real_instability(tmp_path):
    tel = NoopTelemetry()
    run_demo(steps=8, out=tmp_path, telemetry=tel, inject_spike_at=5, progress=False)
    logs = dict(tel.logs)
    before, spike = logs[4], logs[5]
    assert spike["actor/lr"] == pytest.approx(DemoConfig().actor_lr * DemoConfig().spike_lr_factor)
    assert spike["actor/kl_loss"] > 10 * before["actor/kl_loss"]
    assert spike["actor/grad_norm"] > 100 * before["actor/grad_norm"]
    assert spike["actor/ppo_ratio_clipfrac"] > 2 * before["actor/ppo_ratio_clipfrac"]
    # the next rollouts meet a collapsed policy
    assert min(logs[s]["critic/entropy/mean"] for s in (6, 7, 8)) < 0.5 * spike["critic/entropy/mean"]


def test_run_demo_owns_telemetry_when_none_given(tmp_path, monkeypatch):
    import otel_rl

    created = {}

    def fake_init(**kwargs):
        created.update(kwargs)
        created["tel"] = NoopTelemetry()
        return created["tel"]

    monkeypatch.setattr(otel_rl, "init", fake_init, raising=False)
    result = run_demo(steps=1, algo="grpo", out=tmp_path, progress=False)
    assert created["service_name"] == "otel-rl-demo-grpo"
    assert created["run_dir"] == tmp_path and created["framework"] == "roll"
    assert created["tel"].shut_down
    assert result.out == tmp_path and result.run_dir == tmp_path and result.steps == 1
    assert [p.name for p in result.checkpoints] == ["checkpoint-1.pt"]
