#!/usr/bin/env bash
# Set up (first run only) and run the demo: a real GRPO run on CPU with telemetry.
# Arguments go to `otel-rl demo` (see --help), e.g. scripts/demo.sh --steps 40 --algo ppo
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
. "$root/scripts/setup.sh"
cd "$root"
exec "${OTEL_RL_VENV:-$root/.venv}/bin/otel-rl" demo "$@"
