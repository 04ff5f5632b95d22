#!/usr/bin/env bash
# The test suite: pytest (CPU, tiny offline models, real cache-dit, real torchrun) and the skill linter.
#   bash scripts/test.sh           the fast tier (what CI runs): every test not marked `full`
#   bash scripts/test.sh --full    the full tier: every test
# Further arguments go to pytest.
set -euo pipefail
. "$(dirname "$0")/env.sh"
cd "$repo_root"
tier=(-m "not full")
if [ "${1:-}" = "--full" ]; then
  tier=()
  shift
fi
"$PY" -m pytest -q "${tier[@]}" "$@"
"$PY" -m ditgate lint
