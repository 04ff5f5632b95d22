#!/usr/bin/env bash
# Install ditgate with everything it needs, then run the default phase matrix on the tiny Flux of the zoo (CPU).
#   bash scripts/setup.sh            install + run
#   bash scripts/setup.sh --no-run   install only
set -euo pipefail
. "$(dirname "$0")/env.sh"
cd "$repo_root"
"$PY" -c 'import sys; sys.exit(sys.version_info < (3, 10))' || { echo "ditgate needs Python >= 3.10" >&2; exit 1; }
if "$PY" -c "import torch" 2>/dev/null; then
  echo "keeping the installed torch $("$PY" -c 'import torch; print(torch.__version__)')"
else
  # Install torch before anything that depends on it, so that no other package pulls a build we did not choose.
  "$PY" -m pip install "torch==2.13.0"
fi
"$PY" -m pip install -e ".[test]"
"$PY" -m ipykernel install --sys-prefix --name ditgate --display-name "ditgate" >/dev/null
if [ "${1:-}" != "--no-run" ]; then
  "$PY" -m ditgate run zoo:flux
fi
