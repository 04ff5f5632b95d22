#!/usr/bin/env bash
# The test suite: pytest (CPU, tiny offline models, real cache-dit, real torchrun) and the skill linter.
set -euo pipefail
. "$(dirname "$0")/env.sh"
cd "$repo_root"
"$PY" -m pytest -q "$@"
"$PY" -m ditgate lint
