"""Every log format is detected from its content and read back into the values that were logged."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import replay_samples as samples
from shared_files import LOGS, needs_shared_logs

from otel_rl.replay import FORMATS, FormatError, detect_format, parse_file

SWIFT_LOG = LOGS / "swift_grpo_logging_lines_from_issues.jsonl"
AAIPL = LOGS / "trl_grpo_aaipl_checkpoint-500_trainer_state.json"
TELELOGS = LOGS / "trl_grpo_telelogs_checkpoint-200_trainer_state.json"


def write(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return path


def assert_values(parsed, data, rel: float = 0.0, abs_: float = 0.0) -> None:
    got = {r.step: r.values for r in parsed.records}
    assert sorted(got) == [s for s, _ in data]
    for step, values in data:
        for key, value in values.items():
            assert got[step][key] == pytest.approx(value, rel=rel, abs=abs_), (step, key)


# ------------------------------------------------------------------------------- real logs


@needs_shared_logs
def test_real_swift_rows_of_three_runs_are_split_and_read_exactly():
    # Rows pasted from three runs (max_steps 10000, 547, 4389): each is its own run, read exactly.
    rows = [json.loads(line) for line in SWIFT_LOG.read_text().splitlines() if line.strip()]
    runs = [parse_file(SWIFT_LOG, segment=i) for i in (1, 2, 3)]
    assert all(p.format == "swift" and p.framework == "swift" for p in runs)
    assert [r.values for p in runs for r in p.records] == rows  # exact, strings included ("1/10000", "0.18%")
    assert [[r.step for r in p.records] for p in runs] == [[1, 2], [1], [2]]
    assert [r.elapsed_s for p in runs for r in p.records] == [36.0, 39.0, 318.0, 410.0]
    assert all(p.clock == "elapsed" and not p.problems and not p.doubts for p in runs)
    assert "train_speed(s/it)" in rows[0] and "train_speed(iter/s)" in rows[2]
    default = parse_file(SWIFT_LOG)  # the last run, and the file's other runs said, not hidden
    assert [r.values for r in default.records] == rows[3:]
    assert len(default.segments) == 3 and any("holds 3 runs" in note for note in default.notes)
    with pytest.raises(ValueError, match="segment 4 does not exist"):
        parse_file(SWIFT_LOG, segment=4)


@needs_shared_logs
@pytest.mark.parametrize("path, count, first, last", [(AAIPL, 50, 10, 500), (TELELOGS, 200, 1, 200)])
def test_real_trainer_states_read_every_log_history_entry(path, count, first, last):
    parsed = parse_file(path)
    assert parsed.format == "trl-state" and parsed.framework == "trl"
    history = json.loads(path.read_text())["log_history"]
    assert len(parsed.records) == count == len(history)
    assert parsed.records[0].step == first and parsed.records[-1].step == last
    assert parsed.records[7].values == {k: v for k, v in history[7].items() if k != "step"}
    # line numbers point at the entry's opening brace
    lines = path.read_text().splitlines()
    assert lines[parsed.records[3].line - 1].strip() == "{"
    assert parsed.settings["max_steps"] == json.loads(path.read_text())["max_steps"]


# --------------------------------------------------------------------------- synthetic, all formats


def test_swift_synthetic_with_s_per_it(tmp_path):
    data = samples.steps(12)
    path = write(tmp_path, "logging.jsonl", samples.swift(data, speed_key="train_speed(s/it)"))
    parsed = parse_file(path)
    assert detect_format(path) == "swift"
    assert_values(parsed, data)
    assert parsed.records[1].elapsed_s == 150.0 and parsed.settings["max_steps"] == 100


def test_trainer_state_synthetic(tmp_path):
    data = samples.steps(20, every=5)
    path = write(tmp_path, "trainer_state.json", samples.trainer_state(data, logging_steps=5))
    parsed = parse_file(path)
    assert parsed.format == "trl-state"
    assert_values(parsed, data)
    assert parsed.settings["logging_steps"] == 5


@pytest.mark.parametrize("string_floats", [True, False], ids=["new-4g-strings", "old-numbers"])
def test_hf_console_steps_come_from_the_progress_bar(tmp_path, string_floats):
    pytest.importorskip("tqdm")
    data = samples.steps(15, every=10)
    text = samples.hf_console(data, total=150, string_floats=string_floats)
    assert "\r" in text  # the real progress-bar junk is there
    path = write(tmp_path, "train.log", text)
    parsed = parse_file(path)
    assert parsed.format == "hf-console" and parsed.framework == "trl"
    assert_values(parsed, data, rel=1e-3 if string_floats else 0.0)
    assert parsed.settings["max_steps"] == 150
    assert parsed.clock == "elapsed"


def test_hf_console_values_python_cannot_read_plainly(tmp_path):
    clear = "\r" + " " * 60 + "\r"
    text = (
        "\r 10%|█         | 1/10 [00:01<00:09,  1.00it/s]"
        + clear
        + "{'loss': 0.5, 'grad_norm': tensor(2.5, device='cuda:0'), 'learning_rate': 1e-06, 'epoch': 0.1}\n"
        "\r 10%|█         | 1/10 [00:01<00:09,  1.00it/s]\r 20%|██        | 2/10 [00:02<00:08,  1.00it/s]"
        + clear
        + "{'loss': nan, 'grad_norm': np.float64(inf), 'epoch': 0.2}\n"
        "\r 20%|██        | 2/10 [00:02<00:08,  1.00it/s]\n"
        "{'loss': 0.3, 'grad_norm': 1.0, 'epoch': 0.3\n"  # cut off mid-line: reported, not fatal
        # print() over a bar (no tqdm.write): the bar drawn before the dict gives the step
        "\r 30%|███       | 3/10 [01:03<00:08,  1.00it/s]{'loss': 0.25, 'epoch': 0.3}\n"
    )
    parsed = parse_file(write(tmp_path, "console.txt", text))
    assert parsed.format == "hf-console"
    steps = {r.step: r.values for r in parsed.records}
    assert steps[1]["grad_norm"] == 2.5
    assert math.isnan(steps[2]["loss"]) and steps[2]["grad_norm"] == math.inf
    assert steps[3] == {"loss": 0.25, "epoch": 0.3}
    assert parsed.records[-1].elapsed_s == 63.0
    assert [p.line for p in parsed.problems] == [4]


@pytest.mark.parametrize("pformat, ray_prefix, colours", [(True, True, True), (False, False, False), (True, True, False)])
def test_verl_console(tmp_path, pformat, ray_prefix, colours):
    np = pytest.importorskip("numpy")
    data = samples.steps(10)
    if pformat:  # newer verl: pprint.pformat of numpy scalars prints np.float64(...)
        data = [(s, {k: (np.float64(v) if k == "kl" else v) for k, v in values.items()}) for s, values in data]
    path = write(tmp_path, "verl.log", samples.verl_console(data, pformat=pformat, ray_prefix=ray_prefix, colours=colours))
    parsed = parse_file(path)
    assert parsed.format == "verl-console" and parsed.framework == "verl"
    assert_values(parsed, data, abs_=0.0 if pformat else 5e-4)
    assert not parsed.problems


def test_verl_jsonl_nulls_and_step_durations_give_a_clock(tmp_path):
    data = [(s, {**values, "timing_s/step": 10.0 + s}) for s, values in samples.steps(8)]
    data[3][1]["kl"] = float("nan")
    path = write(tmp_path, "exp.jsonl", samples.verl_jsonl(data))
    parsed = parse_file(path)
    assert parsed.format == "verl-jsonl"
    assert "kl" not in parsed.records[3].values and any("null" in n for n in parsed.notes)
    assert parsed.clock == "durations"
    assert parsed.records[2].elapsed_s == pytest.approx(11 + 12 + 13)


def test_roll_stdout_timestamps(tmp_path):
    data = samples.steps(5)
    parsed = parse_file(write(tmp_path, "roll.log", samples.roll_stdout(data)))
    assert parsed.format == "roll-stdout" and parsed.framework == "roll"
    assert_values(parsed, data)
    assert parsed.clock == "timestamp"
    first = parsed.records[0].time_ns
    assert first == 1748772000123000000  # 2025-06-01 10:00:00.123 (UTC)
    assert parsed.records[1].time_ns - first == 1_000_000_000


def test_malformed_lines_are_skipped_and_listed(tmp_path):
    data = samples.steps(6)
    lines = samples.swift(data).splitlines()
    lines.insert(2, '{"loss": 0.1, "grad_norm"')  # truncated by a crash
    lines.insert(4, "Traceback (most recent call last):")
    lines.append("[1, 2, 3]")
    parsed = parse_file(write(tmp_path, "logging.jsonl", "\n".join(lines) + "\n"))
    assert parsed.format == "swift"
    assert [p.line for p in parsed.problems] == [3, 5, 9]
    assert "not JSON" in parsed.problems[0].reason and "not a JSON object" in parsed.problems[2].reason
    assert len(parsed.records) == 6  # nothing after a bad line was lost


def test_truncated_trainer_state_keeps_the_entries_before_the_break(tmp_path):
    data = samples.steps(10)
    text = samples.trainer_state(data)
    cut = text.index('"step": 8')  # crash while writing: entry 8 is incomplete, the file ends
    parsed = parse_file(write(tmp_path, "trainer_state.json", text[:cut]))
    assert [r.step for r in parsed.records] == list(range(1, 8))
    assert parsed.problems  # said, with a line number


def test_one_line_trainer_state_past_the_line_limit_is_read_whole(tmp_path):
    # json.dump without indent writes the whole state on one line; a long run makes it > 16 MiB
    from otel_rl.runs.textfile import MAX_LINE_BYTES

    pad = "x" * 400
    entries, size = [], 0
    while size <= MAX_LINE_BYTES:
        step = len(entries) + 1
        entries.append({"loss": 0.1, "reward": step / 1e5, "kl": 0.01, "note": pad, "step": step})
        size += len(json.dumps(entries[-1])) + 2
    path = tmp_path / "trainer_state.json"
    path.write_text(json.dumps({"global_step": len(entries), "log_history": entries}), encoding="utf-8")
    assert path.stat().st_size > MAX_LINE_BYTES and path.read_bytes().count(b"\n") == 0
    parsed = parse_file(path)
    assert parsed.format == "trl-state"
    assert len(parsed.records) == len(entries) and parsed.records[-1].step == len(entries)
    assert not [p for p in parsed.problems if "limit" in p.reason]


def test_unknown_content_names_the_file_and_the_fix(tmp_path):
    path = write(tmp_path, "notes.txt", "hello\nworld\n")
    with pytest.raises(FormatError, match=r"notes.txt.*--format"):
        detect_format(path)
    with pytest.raises(FileNotFoundError, match="nope.jsonl"):
        parse_file(tmp_path / "nope.jsonl")


def _easyr1_rows(steps: int = 30) -> str:
    rows = []
    for step in range(1, steps + 1):
        row = {
            "step": step,
            "reward": {"overall": 0.3 + step / 100, "format": 0.9, "accuracy": 0.2 + step / 100},
            "actor": {"pg_loss": -0.01, "kl_loss": 0.001 * step, "grad_norm": 0.4, "entropy_loss": 0.7, "lr": 1e-6},
            "response_length": {"mean": 400.0 + step, "clip_ratio": 0.01},
        }
        if step % 10 == 0:
            row["val"] = {"reward_score": 0.25 + step / 200}
        rows.append(json.dumps(row))
    return "\n".join(rows) + "\n"


def test_easyr1_experiment_log_is_detected_and_read_at_verl_keys(tmp_path):
    path = write(tmp_path, "experiment_log.jsonl", _easyr1_rows())
    assert detect_format(path) == "easyr1-jsonl"
    parsed = parse_file(path)
    assert parsed.framework == "verl" and len(parsed.records) == 30 and not parsed.doubts
    first = parsed.records[0].values
    assert first["reward/overall"] == pytest.approx(0.31) and first["actor/kl_loss"] == pytest.approx(0.001)
    assert first["response_length/clip_ratio"] == 0.01 and "val/reward_score" not in first
    assert parsed.records[9].values["val/reward_score"] == pytest.approx(0.3)


def test_a_format_that_reads_under_half_of_the_fields_is_doubted(tmp_path):
    # Forced to the flat-row reader, each EasyR1 row gives a record, but only its flat keys: the lines
    # are "read (100%)" while most of their numbers are lost. The read must say so, not pass as healthy.
    path = write(tmp_path, "experiment_log.jsonl", _easyr1_rows())
    parsed = parse_file(path, "swift")
    assert any("numeric fields" in d for d in parsed.doubts), parsed.doubts
    assert not any("numeric fields" in d for d in parse_file(path).doubts)


def _verl_line(step: int, length: int) -> str:
    """A verl metric line of ``length`` characters whose last key is the validation score."""
    tail = " - val-core/a/reward/mean@4:0.75"
    head = f"step:{step} - actor/grad_norm:0.5 - critic/score/mean:0.25 - pad/"
    whole = head + "x" * max(0, length - len(head) - len(":1.0") - len(tail)) + ":1.0" + tail
    return whole if len(whole) == length else whole[:length]


def test_only_lines_of_exactly_4096_characters_are_cut_by_wandb(tmp_path):
    lines = [_verl_line(1, 4500), _verl_line(2, 4500)[:4096], _verl_line(3, 4500)]
    assert len(lines[0]) == 4500 and len(lines[1]) == 4096
    parsed = parse_file(write(tmp_path, "output.log", "\n".join(lines) + "\n"), "verl-console")
    by_step = {r.step: r.values for r in parsed.records}
    assert by_step[1]["val-core/a/reward/mean@4"] == 0.75  # longer than W&B keeps: not W&B's cut
    assert "val-core/a/reward/mean@4" not in by_step[2] and parsed.truncated_steps == [2]


def _notebook(rows: int, planned: int, *, finished: bool, example_table: bool = True) -> str:
    """A saved notebook in the shape Colab writes: a markdown cell with an example table (another
    run's numbers), the trainer's banner as a stream, transformers' notebook display (a progress bar
    with its [N/M ...] text and the Step table, as display_data HTML) and, when the run finished,
    the TrainOutput result."""
    head = "<tr><th>Step</th><th>Training Loss</th><th>reward</th><th>kl</th><th>rewards / correctness_reward_func</th></tr>"
    body = "".join(
        f"<tr><td>{s}</td><td>{0.001 * s:.6f}</td><td>{s / rows:.6f}</td><td>{0.01 * s:.6f}</td><td>{'No log' if s == 2 else f'{s / rows:.6f}'}</td></tr>"
        for s in range(1, rows + 1)
    )
    html = (
        f"<div><progress value='{rows}' max='{planned}'></progress>\n [{rows:>3}/{planned} 54:58 < 2:25:31, 0.02 it/s, Epoch 0.06/1]</div>"
        f'<table border="1" class="dataframe"><thead>{head}</thead><tbody>{body}</tbody></table><p>'
    )
    outputs: list[dict] = [
        {"output_type": "stream", "name": "stdout", "text": ["==((====))==  Unsloth\n", f"   Total steps = {planned}\n"]},
        {
            "output_type": "display_data",
            "data": {"text/html": [html], "text/plain": ["<IPython.core.display.HTML object>"]},
            "metadata": {},
        },
    ]
    if finished:
        outputs.append(
            {
                "output_type": "execute_result",
                "execution_count": 9,
                "metadata": {},
                "data": {"text/plain": [f"TrainOutput(global_step={rows}, training_loss=0.004, metrics={{'train_runtime': 942.6}})"]},
            }
        )
    cells = [{"cell_type": "code", "source": ["trainer.train()"], "outputs": outputs, "metadata": {}, "execution_count": 9}]
    if example_table:
        example = "| Step | Training Loss | reward |\n|---|---|---|\n| 1 | 0.000000 | 0.125000 |\n"
        cells.insert(0, {"cell_type": "markdown", "source": [example], "metadata": {}})
    return json.dumps({"cells": cells, "metadata": {}, "nbformat": 4, "nbformat_minor": 0}, indent=1)


def test_a_jupyter_notebooks_trainer_table_is_read_with_its_steps_and_planned_total(tmp_path):
    parsed = parse_file(write(tmp_path, "grpo.ipynb", _notebook(68, 250, finished=False)))
    assert parsed.format == "hf-notebook" and parsed.framework == "trl"
    assert [r.step for r in parsed.records] == list(range(1, 69)) and not parsed.doubts
    first, second = parsed.records[0].values, parsed.records[1].values
    assert first == {"loss": 0.001, "reward": 0.014706, "kl": 0.01, "rewards/correctness_reward_func": 0.014706}
    assert "rewards/correctness_reward_func" not in second  # "No log": not logged at that step
    assert parsed.settings["max_steps"] == 250 and "progress display" in parsed.setting_sources["max_steps"]
    assert parsed.ending.status == "stopped" and parsed.ending.step == 68
    finished = parse_file(write(tmp_path, "done.ipynb", _notebook(250, 250, finished=True)))
    assert finished.ending.status == "finished" and len(finished.records) == 250


def test_a_notebook_with_an_sft_table_then_a_grpo_table_reads_the_last_run(tmp_path):
    # Seen in a user's Qwen3 notebook: an SFT warm-up's table (118 steps), then GRPO's (32 of 100) and an OOM
    sft = json.loads(_notebook(115, 118, finished=True, example_table=False))
    grpo = json.loads(_notebook(30, 100, finished=False, example_table=False))
    oom = {
        "output_type": "error",
        "ename": "OutOfMemoryError",
        "evalue": "CUDA out of memory. Tried to allocate 1.06 GiB",
        "traceback": ["OutOfMemoryError: CUDA out of memory. Tried to allocate 1.06 GiB"],
    }
    grpo["cells"][0]["outputs"].append(oom)
    notebook = {**sft, "cells": sft["cells"] + grpo["cells"]}
    parsed = parse_file(write(tmp_path, "qwen3.ipynb", json.dumps(notebook)))
    assert [r.step for r in parsed.records] == list(range(1, 31))
    assert parsed.settings["max_steps"] == 100
    assert any("holds 2 runs" in n for n in parsed.notes), parsed.notes
    assert parsed.ending.status == "crashed" and parsed.ending.step == 30


def test_a_notebook_without_a_trainer_table_is_read_as_its_console(tmp_path):
    lines = "".join(f"{{'loss': 0.1, 'reward': {s / 10}, 'epoch': {s / 100}}}\n" for s in range(1, 21))
    cell = {"cell_type": "code", "source": [], "metadata": {}, "outputs": [{"output_type": "stream", "name": "stdout", "text": [lines]}]}
    path = write(tmp_path, "run.ipynb", json.dumps({"cells": [cell], "metadata": {}, "nbformat": 4, "nbformat_minor": 5}))
    parsed = parse_file(path)
    assert parsed.format == "hf-console" and len(parsed.records) == 20


def test_a_loops_type_tagged_json_lines_make_one_record_per_rl_step_and_eval_lines_are_validation(tmp_path):
    # A hand-written GRPO loop (CS336-style): a rollout line, 2 optimizer steps of training, then an
    # evaluation, per GRPO step; the optimizer step is finer than the GRPO step that every line carries.
    lines = []
    for step in range(1, 21):
        lines.append(
            {"type": "rollout", "grpo_step": step, "reward": step / 40, "std_reward": 0.3, "avg_response_token_length": 300 - step}
        )
        for epoch in (1, 2):
            lines.append(
                {
                    "type": "train",
                    "grpo_step": step,
                    "optimizer_step": 2 * (step - 1) + epoch,
                    "grad_norm": 0.1 * epoch,
                    "token_entropy": 0.9,
                    "loss_type": "grpo_clip",
                    "include_stop_str_in_output": True,
                }
            )
        if step % 5 == 0:
            lines.append({"type": "eval", "grpo_step": step, "optimizer_step": 2 * step, "reward": 0.5 + step / 100})
    path = write(tmp_path, "metrics.jsonl", "\n".join(json.dumps(line) for line in lines) + "\n")
    assert detect_format(path) == "metrics-jsonl"
    parsed = parse_file(path)
    assert [r.step for r in parsed.records] == list(range(1, 21))
    tenth = parsed.records[9].values
    assert tenth["reward"] == 0.25 and tenth["eval_reward"] == 0.6  # the training reward kept apart from the evaluation's
    assert tenth["grad_norm"] == 0.2  # the step's last optimizer step
    assert tenth["completion_length"] == 290 and tenth["reward_std"] == 0.3 and tenth["entropy"] == 0.9  # names by meaning
    assert "include_stop_str_in_output" not in tenth and "optimizer_step" in tenth  # a flag is no metric
    assert "'grpo_step'" in " ".join(parsed.notes)


def test_a_loops_common_metric_names_are_read_by_their_meaning_and_a_missing_evaluation_is_no_zero(tmp_path):
    # One line per step; the evaluation every 10 steps leaves val_accuracy null in between, while a
    # sibling placeholder val_mean_reward reads 0.0 there: only the accuracy is the validation score.
    lines = []
    for step in range(1, 31):
        val = 0.3 + step / 100 if step % 10 == 0 else None
        lines.append(
            {
                "step": step,
                "rollout_reward_mean": step / 60,
                "rollout_reward_std": 0.2,
                "gradient_norm": 0.5,
                "val_accuracy": val,
                "val_mean_reward": val or 0.0,
            }
        )
    parsed = parse_file(write(tmp_path, "grpo_metrics.jsonl", "\n".join(json.dumps(line) for line in lines) + "\n"))
    assert parsed.format == "metrics-jsonl"
    by_step = {r.step: r.values for r in parsed.records}
    assert by_step[20]["reward"] == 20 / 60 and by_step[20]["reward_std"] == 0.2 and by_step[20]["grad_norm"] == 0.5
    assert by_step[20]["eval_reward"] == 0.5 and "eval_reward" not in by_step[21]  # not evaluated: no value, not 0


def test_every_format_is_covered_here():
    assert set(FORMATS) == {
        "swift",
        "trl-state",
        "hf-console",
        "verl-jsonl",
        "easyr1-jsonl",
        "nemo-rl-console",
        "openrlhf-console",
        "areal-console",
        "metric-table",
        "key-value",
        "metrics-jsonl",
        "hf-notebook",
        "verl-console",
        "roll-stdout",
        "otel-rl",
    }


def test_wandb_csv_export_reads_each_row_as_a_step_and_leaves_the_bands_out(tmp_path):
    lines = ['"Step","run-7 - train/reward","run-7 - train/reward__MIN","run-7 - train/reward__MAX","run-7 - actor/entropy"']
    for step in range(1, 31):
        entropy = "" if step == 5 else f"{0.5 - step / 100:.3f}"  # not logged at step 5: missing, not zero
        lines.append(f"{step},{0.1 + step / 100:.3f},0.0,1.0,{entropy}")
    parsed = parse_file(write(tmp_path, "wandb_export.csv", "\n".join(lines) + "\n"))
    assert parsed.format == "metric-table"
    assert [r.step for r in parsed.records] == list(range(1, 31))
    assert parsed.records[0].values == {"train/reward": 0.11, "actor/entropy": 0.49}
    assert "actor/entropy" not in parsed.records[4].values
    assert any("band column" in n for n in parsed.notes)


def test_areal_metric_table_is_read_with_areal_keys(tmp_path):
    header = "step,ppo_actor/task_reward/avg,ppo_actor/update/entropy/avg,ppo_actor/update/grad_norm,eval-rollout/reward"
    rows = [f"{s},{0.3 + s / 200:.4f},{0.3:.4f},{0.7:.4f},{0.35 if s % 10 else 0.5}" for s in range(1, 41)]
    rows.insert(10, "bad,1,2,3,4")  # a row whose step is no integer: said, skipped
    parsed = parse_file(write(tmp_path, "metrics.csv", "\n".join([header, *rows]) + "\n"))
    assert parsed.framework == "areal" and len(parsed.records) == 40
    assert any("'bad'" in p.reason for p in parsed.problems)
    from otel_rl.analyze._series import build_series

    series, unmapped = build_series(parsed)
    names = {(k[0], dict(k[1]).get("rl.statistic")) for k in series}
    assert {("rl.reward", "mean"), ("rl.policy.entropy", "mean"), ("rl.grad_norm", None), ("rl.validation.score", "mean")} <= names
    assert not unmapped


NEMO_RL_STEP = """========================= Step {step}/{total} =========================
▶ Preparing batch...
(VllmGenerationWorker pid=1) INFO 02-26 03:57:11 [abstract.py:324] It took 0.07 seconds to wake up
Logged data to /data/logs/train_data_step{step}.jsonl

📊 Training Results:
  • Loss: {loss:.4f}
  • Generation KL Error: 0.0006
  • Avg Reward: {reward:.4f}
  • Mean Generation Length: 616.4766

⏱️  Timing:
  • Total step time: 44.74s
  • generation: 32.82s (73.4%)

🔍 Performance Metrics:
  • Mean Total Tokens per Sample: 619.48
  • Throughputs (per GPU):
    - E2E (Samples/sec/gpu): 1.43
"""
NEMO_RL_VALIDATION = """
📊 Validation Results:
    • Accuracy: {accuracy:.4f}
    • Average response length: 722.7 tokens
    • Samples processed: 256

  ⏱️  Validation Timing:
    • Total validation time: 30.49s
"""


def test_nemo_rl_console_reads_each_step_summary_and_its_validation(tmp_path):
    # The shape nemo_rl/algorithms/grpo.py prints per step (Ray worker lines interleaved)
    parts = ["Loaded configuration from: grpo.yaml\n", NEMO_RL_VALIDATION.format(accuracy=0.25)]
    for step in range(1, 21):
        parts.append(NEMO_RL_STEP.format(step=step, total=50, loss=0.02, reward=0.25 + step / 100))
        if step % 10 == 0:
            parts.append(NEMO_RL_VALIDATION.format(accuracy=0.3 + step / 100))
    parsed = parse_file(write(tmp_path, "train.out", "".join(parts)))
    assert parsed.format == "nemo-rl-console" and parsed.framework == "nemo_rl"
    by_step = {r.step: r.values for r in parsed.records}
    assert sorted(by_step) == list(range(0, 21))
    assert by_step[0] == {
        "validation/accuracy": 0.25,
        "validation/average_response_length": 722.7,
        "validation/samples_processed": 256,
        "validation_timing/total_validation_time": 30.49,
    }
    assert by_step[3]["train/avg_reward"] == 0.28 and by_step[3]["timing/total_step_time"] == 44.74
    assert by_step[10]["validation/accuracy"] == 0.4 and "validation/accuracy" not in by_step[9]
    assert parsed.settings["max_steps"] == 50
    assert parsed.ending.status == "stopped"  # the log ends at step 20 of a planned 50


def test_hand_written_progress_lines_are_read_by_the_meaning_of_their_names(tmp_path):
    # Three loops' own prints: MiniMind's GRPO, a custom PPO, a key=value trainer
    minimind = "".join(
        f"Epoch:[1/1]({s}/500), Reward: {0.3 + s / 1000:.4f}, Fmt: 1.00, KL_ref: 0.0004, Actor Loss: 0.0001, Avg Len: 129, LR: 0.00000100\n"
        for s in range(1, 41)
    )
    parsed = parse_file(write(tmp_path, "r1_main.log", "nohup: ignoring input\n" + minimind))
    assert parsed.format == "key-value" and len(parsed.records) == 40 and parsed.settings["max_steps"] == 500
    assert parsed.records[0].values == {
        "reward": 0.301,
        "fmt": 1.0,
        "kl": 0.0004,
        "loss": 0.0001,
        "completion_length": 129,
        "learning_rate": 1e-06,
    }
    ppo = "".join(f"[timing] sample processed in 276.79s\nStep: {s} | Loss: -0.0011 | KL: {s / 1000}\n" for s in range(1, 31))
    parsed = parse_file(write(tmp_path, "ppo.log", ppo))
    assert parsed.format == "key-value" and [r.step for r in parsed.records] == list(range(1, 31))
    assert parsed.records[4].values == {"loss": -0.0011, "kl": 0.005}
    equals = "".join(f"step:{s} | reward=0.{s:02d} | kl=0.02 | grad_norm=0.9 | tokens/s=1200\n" for s in range(1, 31))
    parsed = parse_file(write(tmp_path, "train.log", equals))
    assert parsed.format == "key-value" and parsed.records[2].values == {"reward": 0.03, "kl": 0.02, "grad_norm": 0.9, "tokens_s": 1200}
    # A line with a step but one number is prose, not a record.
    assert parse_file(write(tmp_path, "mixed.log", ppo + "Step 3 of the recipe: add 2 eggs\n")).records[-1].step == 30
