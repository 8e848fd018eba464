"""AReaL's console as AReaL 1.0.4's own StatsLogger prints it: a subprocess commits steps with
the statistics a PPO step records (one commit of two dicts among them) and writes TensorBoard
beside its console; the replay of the console must give every value TensorBoard holds, at the
step the console names, to the five significant digits the console prints."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from otel_rl.replay import detect_format, parse_file

pytest.importorskip("torch")
if importlib.util.find_spec("areal") is None:
    pytest.skip("areal is not installed (scripts/setup.sh installs it with --no-deps)", allow_module_level=True)

STEPS = 4  # commits; the third holds two dicts (two steps)

SCRIPT = textwrap.dedent(
    """
    import sys
    from areal.api import FinetuneSpec
    from areal.api.cli_args import BaseExperimentConfig
    from areal.utils import stats_tracker
    from areal.utils.stats_logger import StatsLogger

    root = sys.argv[1]
    config = BaseExperimentConfig(experiment_name="gsm8k-grpo", trial_name="console")
    config.cluster.fileroot = root
    s = config.stats_logger
    s.experiment_name, s.trial_name, s.fileroot, s.tensorboard.path = "gsm8k-grpo", "console", root, root + "/tb"
    stats = StatsLogger(config, FinetuneSpec(total_train_epochs=1, dataset_size=4 * 5, train_batch_size=4))

    def one_step(k):
        with stats_tracker.record_timing("rollout"):
            pass
        with stats_tracker.scope("ppo_actor"):
            stats_tracker.scalar(task_reward=0.25 * k + 1 / 3, grad_norm=123456.789 * (k + 1), entropy=-1.5e-7 * k)
        return stats_tracker.export_all()

    step = 0
    for commit in range(4):
        data = [one_step(step), one_step(step + 1)] if commit == 2 else one_step(step)
        stats.commit(0, commit, step, data)
        step += len(data) if isinstance(data, list) else 1
    stats.close()
    """
)


def tensorboard_scalars(folder: Path) -> dict[tuple[str, int], float]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(folder))
    acc.Reload()
    return {(tag, e.step): e.value for tag in acc.Tags()["scalars"] for e in acc.Scalars(tag)}


def test_the_console_replays_every_value_tensorboard_holds(tmp_path: Path) -> None:
    console = tmp_path / "train.log"
    with open(console, "w") as out:
        done = subprocess.run([sys.executable, "-c", SCRIPT, str(tmp_path)], stdout=out, stderr=subprocess.STDOUT, timeout=300)
    assert done.returncode == 0, console.read_text()[-3000:]
    assert "\x1b[" in console.read_text()  # AReaL's colours, as a terminal or a redirect gets them

    assert detect_format(console) == "areal-console"
    parsed = parse_file(console)
    assert parsed.framework == "areal" and not parsed.problems
    assert parsed.settings.get("max_steps") == 5  # "Train step N/5"
    replayed = {(key, record.step): value for record in parsed.records for key, value in record.values.items()}
    # TensorBoard's step is AReaL's zero-based global_step; the console names it one higher.
    written = {(key, step + 1): value for (key, step), value in tensorboard_scalars(tmp_path / "tb").items()}
    assert set(replayed) == set(written) and {step for _, step in written} == set(range(1, STEPS + 2))
    for point, value in written.items():
        assert replayed[point] == pytest.approx(value, rel=1e-4, abs=1e-30), point  # .4e: five significant digits


def test_a_line_cut_inside_a_table_is_named_and_a_table_after_its_end_is_not_read(tmp_path: Path) -> None:
    console = tmp_path / "cut.log"
    console.write_text(
        "(AReaL) 20261130-09:00:00.000 StatsLogger INFO: Epoch 1/1 Step 1/2 Train step 1/2 done.\n"
        "(AReaL) 20261130-09:00:00.001 StatsLogger INFO: Stats (1/1):\n"
        "│ ppo_actor/task_reward/avg │ 5.0000e-01 │ timeperf/rollout │ 1.2000e+01 │\n"
        "│ ppo_actor/update/grad_norm │ 2.5000e+00 │ ppo_actor/\n"
        "╘══════════════════╧════════════╛\n"
        "│ a table some other code printed │ 1.0000e+00 │\n",
        encoding="utf-8",
    )
    parsed = parse_file(console)
    assert [r.step for r in parsed.records] == [1]
    assert parsed.records[0].values == {"ppo_actor/task_reward/avg": 0.5, "timeperf/rollout": 12.0}
    (cut,) = parsed.problems
    assert cut.line == 4 and "odd number of cells" in cut.reason
