"""Every metric key the seed documents and the real logs name resolves to a registry metric.

The keys are enumerated from the documents themselves (/work/shared/seeds, /work/shared/logs), not
from a hand-written list, so a key the mappings miss makes this fail.
"""

from __future__ import annotations

import itertools
import json
import math
import re
from collections import defaultdict
from pathlib import Path

import pytest
from shared_files import needs_shared

from otel_rl._sdk.keys.resolver import KeyResolver, load_registry_tables

pytestmark = needs_shared

REPO = Path(__file__).resolve().parents[2]
SHARED = REPO / ".." / "shared"
SEEDS = SHARED / "seeds"
LOGS = SHARED / "logs"
SEMCONV = REPO / "semconv"

# A metric key as the seeds write it: segments of word characters or {template} parts.
KEY_RE = re.compile(r"[a-z][a-z_]*(?:/(?:[A-Za-z0-9_]+|\{[a-z_]+\}))+")
TEMPLATE_RE = re.compile(r"\{([a-z_]+)\}")
CLUSTERS = ("actor_train", "critic")  # {metric_infix} = "<cluster>/<stage>"
DEVICE_IDS = ("0", "1")


def _seed(prefix: str) -> str:
    (path,) = sorted(SEEDS.glob(f"{prefix}_*.txt"))
    return path.read_text(encoding="utf-8")


@pytest.fixture(scope="module")
def resolver() -> KeyResolver:
    return KeyResolver.from_directory(SEMCONV)


@pytest.fixture(scope="module")
def registry_metrics() -> set[str]:
    metrics, _attributes, _enums = load_registry_tables(SEMCONV / "registry")
    assert len(metrics) > 50, "semconv/registry/*.yaml holds (almost) no metrics"
    return set(metrics)


# --------------------------------------------------------------------------------------------------
# Seeds 000 / 001: ROLL's metric reference


def roll_templates(text: str) -> set[str]:
    """Keys and key templates of the bullet lines "key: description" / "key_a / key_b: description"."""
    keys: set[str] = set()
    for line in text.splitlines():
        item = line.strip().lstrip("•-·").strip()
        if ":" not in item:
            continue
        pieces = [p.strip() for p in item.split(":", 1)[0].split(" / ")]
        if all(KEY_RE.fullmatch(p) for p in pieces):
            keys.update(pieces)
    return keys


def stage_infixes_000(text: str) -> list[str]:
    return re.findall(r'metric_infix=f"\{self\.cluster_name\}/(\w+)', text)


def stage_infixes_001(text: str) -> list[str]:
    section = text.split("\n各执行阶段", 1)[1].split("\n时间指标", 1)[0]
    return re.findall(r"^-\s*([a-z_]+):", section, flags=re.M)


def fill(template: str, stages: list[str]) -> list[tuple[str, dict[str, str]]]:
    """Every key a template stands for, with the placeholder values used."""
    names = TEMPLATE_RE.findall(template)
    assert set(names) <= {"metric_infix", "device_id"}, f"unexpected placeholder in {template!r}"
    choices = {
        "metric_infix": [(f"{c}/{s}", {"rl.cluster": c, "rl.stage": s}) for c in CLUSTERS for s in stages],
        "device_id": [(d, {"hw.id": d}) for d in DEVICE_IDS],
    }
    out = []
    for combo in itertools.product(*(choices[n] for n in names)):
        key, expected = template, {}
        for name, (value, attrs) in zip(names, combo):
            key = key.replace("{" + name + "}", value, 1)
            expected.update(attrs)
        out.append((key, expected))
    return out


def seed_roll_keys() -> tuple[set[str], list[tuple[str, dict[str, str]]]]:
    text000, text001 = _seed("000"), _seed("001")
    stages = stage_infixes_000(text000)
    templates = roll_templates(text000) | roll_templates(text001)
    plain = {t for t in templates if not TEMPLATE_RE.search(t)}
    filled = [kv for t in sorted(templates - plain) for kv in fill(t, stages)]
    return plain, filled


def test_seed_000_001_enumeration_is_not_vacuous():
    text000, text001 = _seed("000"), _seed("001")
    stages = stage_infixes_000(text000)
    assert sorted(stages) == sorted(stage_infixes_001(text001))
    assert set(stages) == {
        "train_step",
        "generate",
        "model_update",
        "compute_log_probs",
        "do_checkpoint",
        "compute_values",
        "compute_rewards",
    }
    t000, t001 = roll_templates(text000), roll_templates(text001)
    assert t000 == t001, "the two ROLL documents list the same keys"
    plain, filled = seed_roll_keys()
    assert len(plain) > 60, sorted(plain)
    assert {"val/score/min", "actor/sample_weights_max", "critic/values/min", "time/adv", "system/samples"} <= plain
    templates = t000 - plain
    assert len(templates) == 4 + 18 + 4  # time phases, GPU memory snapshots, CPU memory snapshots
    assert len(filled) == 4 * 7 * 2 + 18 * 7 * 2 * 2 + 4 * 7 * 2
    assert not any("{" in k for k, _ in filled)


def test_seed_000_001_keys_resolve(resolver, registry_metrics):
    plain, filled = seed_roll_keys()
    problems = []
    for key in sorted(plain) + [k for k, _ in filled]:
        res = resolver.resolve(key, "roll")
        if res.fallback or res.framework != "roll" or res.metric not in registry_metrics:
            problems.append(f"{key} -> {res.metric} {res.attributes} (framework {res.framework})")
    assert not problems, "\n".join(problems)


def test_seed_000_001_templates_carry_their_parts(resolver):
    _plain, filled = seed_roll_keys()
    for key, expected in filled:
        res = resolver.resolve(key, "roll")
        attrs = dict(res.attributes)
        assert {k: attrs.get(k) for k in expected} == expected, key
        last = key.rsplit("/", 1)[-1]
        if key.startswith("time/"):
            assert (res.metric, attrs["rl.stage.phase"]) == ("rl.stage.duration", last), key
        elif key.startswith("memory/cpu/"):
            assert res.metric == {"rss": "process.memory.usage", "vms": "process.memory.virtual"}[last], key
            assert res.transform is not None and res.transform(1) == 2**30  # ROLL logs GiB
        else:
            kind = key.split("/")[-2]
            if kind.endswith("_frac"):
                assert (res.metric, attrs["rl.memory.kind"]) == ("rl.gpu.memory.utilization", kind[: -len("_frac")]), key
                assert res.transform is None
            else:
                assert (res.metric, attrs["rl.memory.kind"]) == ("rl.gpu.memory.usage", kind), key
                assert res.transform is not None and res.transform(1) == 2**30


# --------------------------------------------------------------------------------------------------
# Seed 003 (ms-swift logging.jsonl analysis) and the real logs

# Backticked text in seed 003 section 1 that is not a metric key: a config value, a file, output tags,
# config names. Each must occur in the section, so the list cannot go stale silently.
SEED003_NOT_KEYS = {
    "5e-5",
    "swift/plugin/orm.py",
    "<plane>…</plane> <modality>…</modality> <title>…</title> <caption>…</caption> <think>…</think> <answer>…</answer>",
    "<think>",
    "<answer>",
    "max_completion_length=512",
    "max_completion_length",
}
# Shorthand the seed uses for a family of keys that ms-swift really writes.
SEED003_SHORTHAND = {"train_speed": ("train_speed(iter/s)", "train_speed(s/it)")}
# log_history / logging.jsonl fields that are no metrics (bookkeeping). Kept explicit and small.
LOG_NOT_METRICS: frozenset[str] = frozenset()


def _brace_expand(name: str) -> list[str]:
    m = re.search(r"\{([^{}]*,[^{}]*)\}", name)
    if not m:
        return [name]
    return [x for alt in m.group(1).split(",") for x in _brace_expand(name[: m.start()] + alt + name[m.end() :])]


def log_rows() -> list[tuple[str, str, dict]]:
    """(file name, framework, row) for every JSON row and every log_history entry of the logs."""
    rows = []
    for path in sorted(LOGS.glob("*.jsonl")):
        framework = path.name.split("_", 1)[0]
        for line in path.read_text(encoding="utf-8").splitlines():
            if line.strip():
                rows.append((path.name, framework, json.loads(line)))
    for path in sorted(LOGS.glob("*trainer_state.json")):
        for entry in json.loads(path.read_text(encoding="utf-8"))["log_history"]:
            rows.append((path.name, "trl", entry))
    return rows


def seed003_keys() -> set[str]:
    text = _seed("003")
    section1 = text.split("\n## 1.", 1)[1].split("\n## 2.", 1)[0]
    log_keys = {k for _, fw, row in log_rows() if fw == "swift" for k in row}
    names: set[str] = set()
    backticked = re.findall(r"`([^`]+)`", section1)
    assert SEED003_NOT_KEYS <= set(backticked), SEED003_NOT_KEYS - set(backticked)
    for chunk in backticked:
        if chunk in SEED003_NOT_KEYS:
            continue
        for part in chunk.split("、"):
            names.update(_brace_expand(part.strip()))
    headings = re.findall(r"^#### \*\*([^\s*（]+)", section1, flags=re.M)
    names.update(headings)
    keys: set[str] = set()
    for name in names:
        if name.endswith("/*"):  # clip_ratio/*, rewards/*: the family's members in the seed and logs
            members = {k for k in names | log_keys if k.startswith(name[:-1]) and not k.endswith("*")}
            assert members, name
            keys.update(members)
        elif name in SEED003_SHORTHAND:
            assert set(SEED003_SHORTHAND[name]) <= log_keys
            keys.update(SEED003_SHORTHAND[name])
        else:
            keys.add(name)
    return keys


def test_seed_003_enumeration_is_not_vacuous():
    keys = seed003_keys()
    assert len(SEED003_NOT_KEYS) <= 8
    assert len(keys) >= 25, sorted(keys)
    assert {
        "loss",
        "kl",
        "rewards/Format/mean",
        "rewards/ModalityMatchString/mean",
        "completions/min_length",
        "global_step/max_steps",
        "memory(GiB)",
        "percentage",
        "clip_ratio",
        "clip_ratio/low_mean",
    } <= keys


def test_seed_003_keys_resolve(resolver, registry_metrics):
    problems = []
    for key in sorted(seed003_keys()):
        res = resolver.resolve(key, "swift")
        if res.fallback or res.metric not in registry_metrics:
            problems.append(f"{key} -> {res.metric} {res.attributes}")
    assert not problems, "\n".join(problems)


def test_log_keys_resolve_and_values_convert(resolver, registry_metrics):
    rows = log_rows()
    assert len(rows) > 200
    assert len(LOG_NOT_METRICS) <= 3
    seen = set()
    problems = []
    for name, framework, row in rows:
        for key, value in row.items():
            if key in LOG_NOT_METRICS:
                continue
            seen.add((framework, key))
            res = resolver.resolve(key, framework)
            if res.fallback or res.framework != framework or res.metric not in registry_metrics:
                problems.append(f"{name}: {key} -> {res.metric} {res.attributes} (framework {res.framework})")
                continue
            if value is None:  # TRL writes None where every value of a window was NaN
                continue
            try:
                number = res.transform(value) if res.transform else float(value)
            except (TypeError, ValueError) as exc:
                problems.append(f"{name}: {key}={value!r} does not convert: {exc}")
                continue
            if not math.isfinite(number):
                problems.append(f"{name}: {key}={value!r} -> {number}")
    assert not problems, "\n".join(sorted(set(problems)))
    assert len({k for fw, k in seen if fw == "swift"}) >= 25
    assert len({k for fw, k in seen if fw == "trl"}) >= 25


# --------------------------------------------------------------------------------------------------
# Distinct keys must not share a series, unless they carry the same quantity.

# Key groups of one framework that deliberately land on one series: each carries one quantity.
ALIASES = [
    {"verl:timing_s/step", "verl:perf/time_per_step"},  # both are timing_raw["step"]
    {"swift:train_speed(iter/s)", "swift:train_speed(s/it)"},  # steps/s, the second through `inverse`
    {"trl:completion_length", "trl:completions/mean_length"},  # TRL < 0.16 name of the same mean
    # TRL < 0.16 logged a reward function's mean without the /mean (two of the real logs differ so)
    {"trl:rewards/correctness_reward_func", "trl:rewards/correctness_reward_func/mean"},
    {"swift:clip_ratio", "swift:clip_ratio/region_mean"},  # older single name of the region clip mean
]


def test_distinct_keys_land_on_distinct_series(resolver):
    plain, filled = seed_roll_keys()
    keys = {("roll", k) for k in plain} | {("roll", k) for k, _ in filled}
    keys |= {("swift", k) for k in seed003_keys()}
    keys |= {(fw, k) for _, fw, row in log_rows() for k in row}
    keys |= {
        ("verl", k)
        for k in (
            "timing_s/step",
            "perf/time_per_step",
            "timing_s/update_actor",
            "timing_s/update_critic",
            "timing_s/gen",
            "timing_s/ref",
            "timing_s/old_log_prob",
            "timing_per_token_ms/update_actor",
            "timing_per_token_ms/update_critic",
            "actor/pg_clipfrac",
            "actor/pg_clipfrac_lower",
            "critic/vf_clipfrac",
            "actor/ppo_kl",
            "actor/reward_kl_penalty",
            "perf/mfu/actor",
            "perf/mfu/critic",
            "response_length/max",
            "prompt_length/max",
            "global_seqlen/max",
            "global_seqlen/balanced_max",
        )
    }
    series = defaultdict(set)
    for fw, key in keys:
        res = resolver.resolve(key, fw)
        series[(fw, res.metric, res.attributes)].add(f"{fw}:{key}")
    allowed = [frozenset(a) for a in ALIASES]
    clashes = [sorted(ks) for ks in series.values() if len(ks) > 1 and frozenset(ks) not in allowed]
    assert not clashes, clashes


# --------------------------------------------------------------------------------------------------
# Seed 002 (RL DFX metric design): each bullet of sections 2, 3 and 6 -> the registry metric(s)

VERL_MAPPING = "semconv/mappings/verl.yaml"  # "carried by every metric of the verl mapping"
SEED002_TABLE: dict[tuple[str, str], tuple[str, ...] | str] = {
    # 2.1 correctness
    ("2.1", "shape checksum"): ("rl.tensor.checksum",),
    ("2.1", "mask ratio"): ("rl.response.mask_ratio",),
    ("2.1", "token alignment"): ("rl.batch.token_misaligned",),
    ("2.1", "sample / group id 对齐"): ("rl.batch.id_misaligned",),
    ("2.1", "NaN / Inf 计数"): ("rl.tensor.nonfinite",),
    # 2.2 stability
    ("2.2", "actor/entropy"): ("rl.policy.entropy",),
    ("2.2", "actor/ppo_kl"): ("rl.policy.kl",),
    ("2.2", "actor/kl_loss"): ("rl.loss",),
    ("2.2", "actor/grad_norm"): ("rl.grad_norm",),
    ("2.2", "actor/pg_clipfrac"): ("rl.clip.fraction",),
    ("2.2", "reward mean / max / min"): ("rl.reward",),
    # 2.3 performance
    ("2.3", "step time"): ("rl.step.duration",),
    ("2.3", "stage time"): ("rl.stage.duration",),
    ("2.3", "tokens/s"): ("rl.throughput.tokens",),
    ("2.3", "samples/s"): ("rl.throughput.samples",),
    ("2.3", "MFU"): ("rl.mfu",),
    ("2.3", "SMA"): ("rl.sm_activity",),
    ("2.3", "pipeline bubble"): ("rl.pipeline.bubble_ratio",),
    # 2.4 memory
    ("2.4", "allocated memory"): ("rl.gpu.memory.usage",),
    ("2.4", "reserved memory"): ("rl.gpu.memory.usage",),
    ("2.4", "fragmentation ratio"): ("rl.gpu.memory.fragmentation",),
    ("2.4", "activation peak"): ("rl.gpu.memory.activation_peak",),
    ("2.4", "KV cache peak"): ("rl.gpu.memory.kv_cache_peak",),
    ("2.4", "communication buffer peak"): ("rl.gpu.memory.comm_buffer_peak",),
    # 2.5 load balance
    ("2.5", "per-rank token count"): ("rl.rank.tokens",),
    ("2.5", "per-rank active time"): ("rl.rank.active_time",),
    ("2.5", "per-rank idle time"): ("rl.rank.idle_time",),
    ("2.5", "queue depth"): ("rl.queue.depth",),
    ("2.5", "straggler rank"): ("rl.straggler.rank",),
    # 2.6 data quality
    ("2.6", "prompt length mean / max / min"): ("rl.prompt.length",),
    ("2.6", "response length mean / max / min"): ("rl.response.length",),
    ("2.6", "clip ratio"): ("rl.response.clipped_ratio",),
    ("2.6", "aborted ratio"): ("rl.rollout.abort_ratio",),
    ("2.6", "reward distribution"): ("rl.sample.reward",),
    # 3.1 rollout
    ("3.1", "prefill tokens"): ("rl.rollout.tokens",),  # gen_ai.token.type=input
    ("3.1", "decode tokens"): ("rl.rollout.tokens",),  # gen_ai.token.type=output
    ("3.1", "request latency"): ("gen_ai.server.request.duration",),
    ("3.1", "TTFT / TPOT"): ("gen_ai.server.time_to_first_token", "gen_ai.server.time_per_output_token"),
    ("3.1", "KV cache utilization"): ("rl.rollout.kv_cache.utilization",),
    ("3.1", "abort / timeout ratio"): ("rl.rollout.abort_ratio", "rl.rollout.timeout_ratio"),
    # 3.2 reward
    ("3.2", "reward latency"): ("rl.reward.duration",),
    ("3.2", "reward batch tokens"): ("rl.reward.batch_tokens",),
    ("3.2", "rule reward exception count"): ("rl.reward.exceptions",),
    ("3.2", "reward model throughput"): ("rl.reward.throughput",),
    # 3.3 old / ref logprob
    ("3.3", "micro batch token 数"): ("rl.logprob.micro_batch_tokens",),
    ("3.3", "forward time"): ("rl.compute.duration",),  # rl.compute.op=forward
    ("3.3", "activation peak"): ("rl.gpu.memory.activation_peak",),
    ("3.3", "logprob shape"): ("rl.logprob.shape",),
    ("3.3", "response mask ratio"): ("rl.response.mask_ratio",),
    # 3.4 actor update
    ("3.4", "forward time"): ("rl.compute.duration",),
    ("3.4", "backward time"): ("rl.compute.duration",),  # rl.compute.op=backward
    ("3.4", "optimizer time"): ("rl.compute.duration",),  # rl.compute.op=optimizer_step
    ("3.4", "communication time"): ("rl.compute.duration", "rl.rank.communication_time"),
    ("3.4", "grad norm"): ("rl.grad_norm",),
    ("3.4", "loss decomposition"): ("rl.loss",),  # rl.loss.type
    # 6 open questions
    ("6", "verl 当前日志中已有指标的准确口径。"): VERL_MAPPING,
    ("6", "Ascend 环境下 MFU / SMA 计算公式与数据源。"): ("rl.mfu", "rl.sm_activity"),
    ("6", "是否能在 DataProto 或 worker 边界自动记录 shape ledger。"): ("rl.shape_ledger.mismatches",),
    ("6", "是否能在异步模式下补充 queue depth、policy lag、stale sample ratio。"): (
        "rl.queue.depth",
        "rl.async.policy_lag",
        "rl.async.stale_sample_ratio",
    ),
}


def seed002_bullets() -> list[tuple[str, str]]:
    heading = None
    out = []
    for line in _seed("002").splitlines():
        m = re.match(r"^(\d+)(?:\.(\d+))?\.?\s+\S", line)
        if m:
            heading = m.group(1) + (f".{m.group(2)}" if m.group(2) else "")
            continue
        item = line.strip()
        if item.startswith("•") and heading and heading.split(".")[0] in {"2", "3", "6"}:
            out.append((heading, item.lstrip("•").strip()))
    return out


def test_seed_002_every_bullet_has_a_registry_metric(registry_metrics, resolver):
    bullets = seed002_bullets()
    assert len(bullets) >= 55
    assert set(bullets) == set(SEED002_TABLE), (
        f"not in the table: {sorted(set(bullets) - set(SEED002_TABLE))}; not in the seed: {sorted(set(SEED002_TABLE) - set(bullets))}"
    )
    for bullet, metrics in SEED002_TABLE.items():
        if metrics == VERL_MAPPING:
            rules = resolver.rules_for("verl")
            assert len(rules) >= 30
            metrics = tuple(sorted({r["metric"] for r in rules}))
        missing = [m for m in metrics if m not in registry_metrics]
        assert not missing, f"{bullet}: {missing} not in the registry"
    # the stability bullets are verl keys: the resolver must agree with the table
    for (section, bullet), metrics in SEED002_TABLE.items():
        if section == "2.2" and bullet.startswith("actor/"):
            assert resolver.resolve(bullet, "verl").metric == metrics[0], bullet
