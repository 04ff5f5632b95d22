# Sourced by the other scripts: picks the Python to use and exports it as $PY.
# An active virtual environment wins; otherwise the repository's own .venv (created when missing).
repo_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
if [ -n "${VIRTUAL_ENV:-}" ] && [ -x "$VIRTUAL_ENV/bin/python" ]; then
  PY="$VIRTUAL_ENV/bin/python"
else
  if [ ! -x "$repo_root/.venv/bin/python" ]; then
    echo "creating $repo_root/.venv" >&2
    python3 -m venv "$repo_root/.venv"
  fi
  PY="$repo_root/.venv/bin/python"
fi
export PY
