#!/usr/bin/env bash
# Lint, format check and type check, as CI runs them (after scripts/setup.sh).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
venv="${OTEL_RL_VENV:-$root/.venv}"
cd "$root"
"$venv/bin/ruff" check otel_rl tests benchmarks scripts
"$venv/bin/ruff" format --check otel_rl tests benchmarks scripts
"$venv/bin/pyright"
