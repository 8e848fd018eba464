"""OpenRLHF's console as a Ray job prints it: the actor prefix, the asynchronous trainer's variant,
bare nan, an evaluation summary, and a damaged line. The lines follow the format strings of
openrlhf 0.11.2 (ppo_trainer.py:551 and :598, ppo_trainer_async.py:244, utils/logging_utils.py);
tests/integrations/test_openrlhf.py replays what OpenRLHF's own trainer printed."""

from __future__ import annotations

import math
from pathlib import Path

from otel_rl.replay import detect_format, parse_file

LOG = """\
(PPOTrainer pid=4711) INFO 11-30 04:15:58 ppo_trainer.py:224] Sample: ['1 + 1 = 2', 1.0]
(PPOTrainer pid=4711) INFO 11-30 04:15:59 ppo_trainer.py:551] ✨ Global step 1: {'policy_loss': 0.1, 'actor_grad_norm': 1.5, 'vllm_kl': 0.002, 'timing/generation': 41.2, 'dynamic_filtering_pass_rate': None}
(PPOTrainer pid=4711) INFO 11-30 04:16:40 ppo_trainer.py:551] ✨ Global step 2: {'policy_loss': nan, 'actor_grad_norm': 2.5, 'vllm_kl': 0.004, 'timing/generation': 40.9}
(PPOTrainer pid=4711) INFO 11-30 04:16:41 ppo_trainer.py:585] ⏰ Evaluation start time: 2026-11-30 04:16:41
(PPOTrainer pid=4711) INFO 11-30 04:16:50 ppo_trainer.py:598] ✨ Evaluation completed in 0:00:09, global_step 2, eval_metrics: {'eval_gsm8k_pass1': 0.45, 'eval_num_samples': 8.0}
(TrainingActor pid=4712) INFO 11-30 04:17:30 ppo_trainer_async.py:244] Global step 3: {'policy_loss': 0.3, 'actor_grad_norm': 3.5, 'vllm_kl': 0.006}
(PPOTrainer pid=4711) INFO 11-30 04:18:10 ppo_trainer.py:551] ✨ Global step 4: {'policy_loss': 0.4, 'actor_grad_norm':
"""


def test_every_step_line_and_the_evaluation_are_read_and_a_cut_line_is_named(tmp_path: Path) -> None:
    path = tmp_path / "train.log"
    path.write_text(LOG, encoding="utf-8")
    assert detect_format(path) == "openrlhf-console"
    parsed = parse_file(path)
    assert parsed.framework == "openrlhf"
    assert [r.step for r in parsed.records] == [1, 2, 3]
    first, second, third = parsed.records
    assert first.values == {"policy_loss": 0.1, "actor_grad_norm": 1.5, "vllm_kl": 0.002, "timing/generation": 41.2,
                            "dynamic_filtering_pass_rate": None}  # fmt: skip
    assert math.isnan(second.values["policy_loss"])
    assert second.values["eval/eval_gsm8k_pass1"] == 0.45 and second.values["eval/eval_num_samples"] == 8.0
    assert third.values == {"policy_loss": 0.3, "actor_grad_norm": 3.5, "vllm_kl": 0.006}
    (cut,) = parsed.problems  # the last line, cut short: named, not read as a step
    assert cut.line == 7 and "not a Python dict" in cut.reason
