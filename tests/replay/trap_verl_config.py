"""A resolved verl GRPO config as ``main_ppo`` pretty-prints it (:func:`verl_config`), and the
settings a careful reader takes from it (:func:`verl_settings_truth`): the verl traps in
``trap_verl`` dump it into their consoles."""

from __future__ import annotations

from typing import Any

__all__ = ["verl_config", "verl_settings_truth"]


def _fsdp_config(offload: bool) -> dict[str, Any]:
    return {"_target_": "verl.workers.config.FSDPEngineConfig", "entropy_checkpointing": False,
            "entropy_from_logits_with_chunking": False, "forward_only": False, "forward_prefetch": False,
            "fsdp_size": -1, "model_dtype": "fp32", "offload_policy": False, "optimizer_offload": offload,
            "param_offload": offload, "reshard_after_forward": True, "strategy": "fsdp",
            "ulysses_sequence_parallel_size": 1, "use_orig_params": False, "use_torch_compile": True,
            "wrap_policy": {"min_num_params": 0}}


def _profiler_config() -> dict[str, Any]:
    return {"_target_": "verl.utils.profiler.ProfilerConfig", "all_ranks": False, "enable": False, "ranks": [],
            "save_path": "outputs/profile", "tool": None,
            "tool_config": {"npu": {"_target_": "verl.utils.profiler.config.NPUToolConfig", "analysis": True,
                                    "contents": [], "discrete": False, "level": "level0"},
                            "nsys": {"_target_": "verl.utils.profiler.config.NsightToolConfig", "discrete": False},
                            "torch": {"_target_": "verl.utils.profiler.config.TorchProfilerToolConfig",
                                      "step_end": None, "step_start": 0},
                            "torch_memory": {"_target_": "verl.utils.profiler.config.TorchMemoryToolConfig",
                                             "stack_depth": 32, "trace_alloc_max_entries": 100000}}}


def _optim(lr: float, grad_clip: float, warmup_ratio: float, schedule: str) -> dict[str, Any]:
    return {"_target_": "verl.workers.config.FSDPOptimizerConfig", "betas": [0.9, 0.999], "clip_grad": grad_clip,
            "lr": lr, "lr_scheduler_type": schedule, "lr_warmup_steps": -1, "lr_warmup_steps_ratio": warmup_ratio,
            "min_lr_ratio": 0.0, "num_cycles": 0.5, "optimizer": "AdamW", "optimizer_impl": "torch.optim",
            "override_optimizer_config": None, "total_training_steps": -1, "warmup_style": schedule,
            "weight_decay": 0.01}


def verl_config(*, max_prompt_length: int = 512, max_response_length: int = 128, train_batch_size: int = 32,
                ppo_mini_batch_size: int = 32, n: int = 8, lr: float = 1e-6, grad_clip: float = 1.0,
                use_kl_loss: bool = False, kl_loss_coef: float = 0.001, use_kl_in_reward: bool = False,
                kl_coef: float = 0.001, total_epochs: int = 15, total_training_steps: int | None = 335,
                save_freq: int = 50, test_freq: int = -1, val_before_train: bool = False,
                experiment: str = "qwen2.5_7b_grpo") -> dict[str, Any]:
    """A resolved verl GRPO config (the shape of verl/trainer/config/ppo_trainer.yaml after Hydra),
    with the decoys a reader must not take: the critic's own lr and optim, rollout.val_kwargs.n,
    the optimizer's total_training_steps -1, the ref's log-prob settings."""
    actor = {
        "_target_": "verl.workers.config.FSDPActorConfig",
        "checkpoint": {"_target_": "verl.trainer.config.CheckpointConfig", "async_save": False,
                       "load_contents": ["model", "optimizer", "extra"], "save_contents": ["model", "optimizer", "extra"]},
        "clip_ratio": 0.2, "clip_ratio_c": 3.0, "clip_ratio_high": 0.2, "clip_ratio_low": 0.2,
        "entropy_checkpointing": False, "entropy_coeff": 0, "entropy_from_logits_with_chunking": False,
        "fsdp_config": _fsdp_config(False), "grad_clip": grad_clip, "kl_loss_coef": kl_loss_coef,
        "kl_loss_type": "low_var_kl", "loss_agg_mode": "token-mean",
        "optim": _optim(lr, grad_clip, 0.0, "constant"),
        "policy_loss": {"_target_": "verl.workers.config.PolicyLossConfig", "clip_cov_lb": 1.0, "clip_cov_ratio": 0.0002,
                        "clip_cov_ub": 5.0, "kl_cov_ratio": 0.0002, "loss_mode": "vanilla", "ppo_kl_coef": 0.1},
        "ppo_epochs": 1, "ppo_max_token_len_per_gpu": 16384, "ppo_micro_batch_size": None,
        "ppo_micro_batch_size_per_gpu": 8, "ppo_mini_batch_size": ppo_mini_batch_size,
        "profiler": _profiler_config(), "shuffle": False, "strategy": "fsdp",
        "ulysses_sequence_parallel_size": 1, "use_dynamic_bsz": False, "use_fused_kernels": False,
        "use_kl_loss": use_kl_loss, "use_remove_padding": True, "use_torch_compile": True,
    }
    rollout = {
        "_target_": "verl.workers.config.RolloutConfig", "agent": {"_target_": "verl.workers.config.AgentLoopConfig",
                                                                    "agent_loop_config_path": None,
                                                                    "custom_async_server": {"name": None, "path": None},
                                                                    "num_workers": 8},
        "calculate_log_probs": False, "disable_log_stats": True, "do_sample": True, "dtype": "bfloat16",
        "enable_chunked_prefill": True, "enforce_eager": False, "engine_kwargs": {"sglang": {}, "vllm": {}},
        "free_cache_engine": True, "gpu_memory_utilization": 0.6, "ignore_eos": False, "layered_summon": False,
        "load_format": "dummy", "log_prob_max_token_len_per_gpu": 16384, "log_prob_micro_batch_size": None,
        "log_prob_micro_batch_size_per_gpu": 32, "log_prob_use_dynamic_bsz": False, "max_model_len": None,
        "max_num_batched_tokens": 8192, "max_num_seqs": 1024, "mode": "async",
        "multi_turn": {"_target_": "verl.workers.config.MultiTurnConfig", "enable": False, "format": "hermes",
                       "interaction_config_path": None, "max_assistant_turns": None, "max_parallel_calls": 1,
                       "max_tool_response_length": 256, "max_user_turns": None, "tool_config_path": None,
                       "tool_response_truncate_side": "middle", "use_inference_chat_template": False},
        "n": n, "name": "vllm", "prompt_length": max_prompt_length, "response_length": max_response_length,
        "temperature": 1.0, "tensor_model_parallel_size": 2, "top_k": -1, "top_p": 1,
        "trace": {"_target_": "verl.workers.config.TraceConfig", "backend": None, "token2text": False},
        "val_kwargs": {"_target_": "verl.workers.config.SamplingConfig", "do_sample": False, "n": 1,
                       "temperature": 0, "top_k": -1, "top_p": 1.0},
    }
    model = {"_target_": "verl.workers.config.HFModelConfig", "custom_chat_template": None,
             "enable_activation_offload": False, "enable_gradient_checkpointing": True, "exclude_modules": None,
             "external_lib": None, "fused_kernel_options": {"impl_backend": "torch"}, "lora_alpha": 16,
             "lora_rank": 0, "override_config": {}, "path": "Qwen/Qwen2.5-7B-Instruct", "target_modules": "all-linear",
             "trust_remote_code": False, "use_fused_kernels": False, "use_liger": False, "use_remove_padding": True,
             "use_shm": False}
    ref = {"fsdp_config": _fsdp_config(True), "log_prob_max_token_len_per_gpu": 16384, "log_prob_micro_batch_size": None,
           "log_prob_micro_batch_size_per_gpu": 32, "log_prob_use_dynamic_bsz": False, "profiler": _profiler_config(),
           "strategy": "fsdp", "ulysses_sequence_parallel_size": 1, "use_torch_compile": True}
    critic = {"_target_": "verl.workers.config.FSDPCriticConfig", "checkpoint": actor["checkpoint"],
              "cliprange_value": 0.5, "enable": None, "forward_max_token_len_per_gpu": 32768,
              "forward_micro_batch_size": None, "forward_micro_batch_size_per_gpu": None, "grad_clip": 1.0,
              "loss_agg_mode": "token-mean",
              "model": {"_target_": "verl.workers.config.FSDPCriticModelCfg", "enable_activation_offload": False,
                        "enable_gradient_checkpointing": True, "external_lib": None, "fsdp_config": _fsdp_config(False),
                        "lora_alpha": 16, "lora_rank": 0, "override_config": {}, "path": "~/models/deepseek-llm-7b-chat",
                        "target_modules": "all-linear", "tokenizer_path": "Qwen/Qwen2.5-7B-Instruct",
                        "trust_remote_code": False, "use_remove_padding": False, "use_shm": False},
              "optim": _optim(1e-5, 1.0, 0.0, "constant"), "ppo_epochs": 1, "ppo_max_token_len_per_gpu": 32768,
              "ppo_micro_batch_size": None, "ppo_micro_batch_size_per_gpu": None, "ppo_mini_batch_size": 256,
              "rollout_n": n, "shuffle": False, "strategy": "fsdp",
              "ulysses_sequence_parallel_size": 1, "use_dynamic_bsz": False}
    return {
        "actor_rollout_ref": {"actor": actor, "hybrid_engine": True, "model": model, "nccl_timeout": 600, "ref": ref,
                              "rollout": rollout},
        "algorithm": {"_target_": "verl.trainer.config.AlgoConfig", "adv_estimator": "grpo", "gamma": 1.0,
                      "kl_ctrl": {"_target_": "verl.trainer.config.KLControlConfig", "horizon": 10000,
                                  "kl_coef": kl_coef, "target_kl": 0.1, "type": "fixed"},
                      "kl_penalty": "kl", "lam": 1.0, "norm_adv_by_std_in_grpo": True,
                      "pf_ppo": {"reweight_method": "pow", "weight_pow": 2.0}, "use_kl_in_reward": use_kl_in_reward,
                      "use_pf_ppo": False},
        "critic": critic,
        "custom_reward_function": {"name": "compute_score", "path": None},
        "data": {"apply_chat_template_kwargs": {}, "custom_cls": {"name": None, "path": None},
                 "dataloader_num_workers": 8, "datagen": {"name": None, "path": None},
                 "filter_overlong_prompts": True, "filter_overlong_prompts_workers": 1, "image_key": "images",
                 "max_prompt_length": max_prompt_length, "max_response_length": max_response_length,
                 "prompt_key": "prompt", "return_full_prompt": False, "return_multi_modal_inputs": True,
                 "return_raw_chat": False, "return_raw_input_ids": False, "reward_fn_key": "data_source",
                 "sampler": {"class_name": None, "class_path": None}, "shuffle": True, "tokenizer": None,
                 "train_batch_size": train_batch_size, "train_files": "~/data/gsm8k/train.parquet",
                 "truncation": "error", "trust_remote_code": False, "use_shm": False, "val_batch_size": None,
                 "val_files": "~/data/gsm8k/test.parquet", "validation_shuffle": False, "video_key": "videos"},
        "global_profiler": {"_target_": "verl.utils.profiler.ProfilerConfig", "global_tool_config": {
            "nsys": {"_target_": "verl.utils.profiler.config.NsightToolConfig", "controller_nsight_options": {
                "cuda-graph-trace": "graph", "cuda-memory-usage": "true", "trace": "cuda,nvtx,cublas,ucx"},
                "discrete": False, "worker_nsight_options": {"capture-range": "cudaProfilerApi",
                                                             "capture-range-end": None, "cuda-graph-trace": "graph",
                                                             "cuda-memory-usage": "true", "kill": "none",
                                                             "trace": "cuda,nvtx,cublas,ucx"}}},
            "profile_continuous_steps": False, "save_path": "outputs/profile", "steps": None, "tool": None},
        "ray_kwargs": {"ray_init": {"num_cpus": None}, "timeline_json_file": None},
        "reward_model": {"enable": False, "forward_max_token_len_per_gpu": 32768, "launch_reward_fn_async": False,
                         "max_length": None, "micro_batch_size": None, "micro_batch_size_per_gpu": None,
                         "model": {"external_lib": None, "fsdp_config": _fsdp_config(False),
                                   "input_tokenizer": "Qwen/Qwen2.5-7B-Instruct",
                                   "path": "~/models/FsfairX-LLaMA3-RM-v0.1", "trust_remote_code": False,
                                   "use_fused_kernels": False, "use_remove_padding": False, "use_shm": False},
                         "reward_manager": "naive",
                         "sandbox_fusion": {"max_concurrent": 64, "memory_limit_mb": 1024, "url": None},
                         "strategy": "fsdp", "ulysses_sequence_parallel_size": 1, "use_dynamic_bsz": False},
        "trainer": {"balance_batch": True, "critic_warmup": 0,
                    "default_hdfs_dir": None, "default_local_dir": f"checkpoints/verl_grpo_gsm8k/{experiment}",
                    "del_local_ckpt_after_load": False, "device": "cuda", "esi_redundant_time": 0,
                    "experiment_name": experiment, "log_val_generations": 0, "logger": ["console", "wandb"],
                    "max_actor_ckpt_to_keep": None, "max_critic_ckpt_to_keep": None, "n_gpus_per_node": 8,
                    "nnodes": 1, "project_name": "verl_grpo_gsm8k", "ray_wait_register_center_timeout": 300,
                    "resume_from_path": None, "resume_mode": "auto", "rollout_data_dir": None, "save_freq": save_freq,
                    "test_freq": test_freq, "total_epochs": total_epochs, "total_training_steps": total_training_steps,
                    "use_legacy_worker_impl": "auto", "val_before_train": val_before_train, "val_only": False,
                    "validation_data_dir": None},
    }


def verl_settings_truth(cfg: dict[str, Any]) -> dict[str, Any]:
    """The settings of a run with this config: the actor's lr and clip, rollout n, the KL in effect."""
    actor = cfg["actor_rollout_ref"]["actor"]
    algo = cfg["algorithm"]
    if actor["use_kl_loss"]:
        kl = actor["kl_loss_coef"]
    elif algo["use_kl_in_reward"]:
        kl = algo["kl_ctrl"]["kl_coef"]
    else:
        kl = 0.0  # neither KL term is on: nothing holds the policy near the reference
    settings = {
        "max_response_length": cfg["data"]["max_response_length"], "train_batch_size": cfg["data"]["train_batch_size"],
        "kl_coef": kl, "use_kl_loss": actor["use_kl_loss"], "use_kl_in_reward": algo["use_kl_in_reward"],
        "learning_rate": actor["optim"]["lr"], "grad_clip": actor["grad_clip"],
        "group_size": cfg["actor_rollout_ref"]["rollout"]["n"], "num_epochs": cfg["trainer"]["total_epochs"],
    }
    if cfg["trainer"]["total_training_steps"] is not None:
        settings["max_steps"] = cfg["trainer"]["total_training_steps"]
    return settings
