#!/usr/bin/env bash
# Create .venv and install otel-rl with its test and torch extras; a no-op when nothing changed.
# Sourced by scripts/demo.sh and scripts/test.sh, so each is one command on a fresh clone.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
venv="${OTEL_RL_VENV:-$root/.venv}"
python="${PYTHON:-python3}"
# PyTorch from PyPI: its CUDA build, which also runs on CPU (~4 GB with its nvidia-* wheels).
# Override with TORCH_SPEC (e.g. "torch>=2.1", or a CPU wheel from your own index).
torch_spec="${TORCH_SPEC:-torch==2.13.0}"

stamp="$venv/.otel-rl-setup"
want="$(cat "$root/pyproject.toml" "$root/scripts/setup.sh" | sha256sum | cut -d' ' -f1) $torch_spec"
if [ -x "$venv/bin/python" ] && [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then
  return 0 2>/dev/null || exit 0
fi
echo "otel-rl: setting up $venv (first run only)..." >&2
if [ ! -x "$venv/bin/python" ]; then
  "$python" -m venv "$venv"
fi
log="$(mktemp)"
pip_install() {
  if ! "$venv/bin/python" -m pip install --quiet "$@" >"$log" 2>&1; then
    grep -v "^WARNING: Location" "$log" >&2 || true
    echo "otel-rl: set-up failed: pip install $*" >&2
    exit 1
  fi
}
pip_install --upgrade pip
# torch first, so the [torch] extra is already satisfied by it.
pip_install "$torch_spec"
# [dashboards]: grafana-foundation-sdk, pinned in pyproject.toml to the Grafana 11.6 build.
pip_install -e "$root[test,torch,tensorboard,wandb,swanlab,mlflow,analyze,dashboards]"
# The frameworks the integration tests run for real, at the versions they were tested with.
# The constraint keeps torch at the version above; verl and ms-swift pin versions of transformers
# and trl that conflict with TRL 1.x, so they go in without their (GPU-heavy) dependencies
# plus the few light ones their tracking, callback and agent-loop modules import (hydra-core
# needs omegaconf < 2.4).
constraints="$(mktemp)"
printf 'torch==2.13.0\n' >"$constraints"
if [ "$torch_spec" = "torch==2.13.0" ]; then cons=(-c "$constraints"); else cons=(); fi
pip_install "${cons[@]}" "ray==2.60.0" "trl==1.16.0" "transformers==5.23.0" "accelerate==1.15.0" "datasets==5.2.0"
pip_install --no-deps "verl==0.9.1" "ms-swift==4.6.0"
pip_install "${cons[@]}" "tensordict==0.8.3" "omegaconf==2.3.1" "hydra-core==1.3.8" "orjson" "codetiming==1.4.0" \
  "modelscope==1.40.2" "modelscope-hub==0.5.1" "json_repair" "msgspec" "dacite" "aiohttp" "einops" "peft==0.21.2"
# OpenRLHF pins DeepSpeed, flash-attn, vLLM and Ray builds for GPUs: it goes in without them, with
# DeepSpeed itself (its ops build on first use, never here) and the light modules its trainer imports.
pip_install --no-deps "openrlhf==0.11.2" "deepspeed==0.19.6" "torchdata==0.11.0" "pylatexenc==2.11" "hjson==3.1.0" \
  "py-cpuinfo==9.0.0" "msgpack==1.2.4" "ninja==1.13.2"
# AReaL pins its own torch, transformers and hydra: it goes in without them, with the light modules
# that importing its StatsLogger, stats_tracker, workflow executor and PPO actor pulls in.
pip_install --no-deps "areal==1.0.4" "colorlog==6.12.0" "tenacity==9.2.1" "flask==3.1.3" "blinker==1.9.0" \
  "itsdangerous==2.2.0" "lark==1.3.1" "uvloop==0.23.0" "numba==0.68.1" "llvmlite==0.50.0" "aiofiles==25.1.0" \
  "openai==3.57.0" "jiter==0.19.0" "trackio==0.43.0" "gradio_client==2.7.2" "tabulate==0.10.0" "pybase64==1.5.1"
rm -f "$constraints"
rm -f "$log"
"$venv/bin/python" -c "import otel_rl, torch, pytest" || { echo "otel-rl: set-up failed (see pip output above)" >&2; exit 1; }
echo "$want" > "$stamp"
