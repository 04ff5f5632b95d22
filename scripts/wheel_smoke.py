"""Build the wheel, install it into a fresh virtual environment and run ditgate's commands from a folder outside
the checkout, so that only what the wheel ships is used.

    python scripts/wheel_smoke.py [--work DIR] [--quick]

The new environment installs the wheel alone (`--no-deps`) and reaches every dependency through a `.pth` line to
the site-packages of the Python running this script, so nothing is downloaded. PYTHONPATH and DITGATE_SKILL_DIR
are cleared for the commands, so the checkout cannot leak in. `--quick` runs the cheap commands and one gated run
(`ditgate run zoo:flux --rows cache`); without it every command runs once. Exit 0 when every command did what it
should; each command's time is printed.
"""

from __future__ import annotations

import argparse
import ast
import json
import os
import shutil
import subprocess
import sys
import sysconfig
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _data_parts() -> tuple[str, ...]:
    """What the wheel ships as data (ditgate.core.paths.DATA_PARTS, read as setup.py reads it)."""
    tree = ast.parse((ROOT / "src" / "ditgate" / "core" / "paths.py").read_text())
    return next(tuple(ast.literal_eval(n.value)) for n in tree.body
                if isinstance(n, ast.AnnAssign) and getattr(n.target, "id", None) == "DATA_PARTS")


DATA_PARTS = _data_parts()


def build_wheel(dist: Path) -> Path:
    """`pip wheel --no-deps .` with the installed setuptools (no build isolation: nothing is downloaded), on a copy
    of the checkout's build inputs so that the build leaves nothing (build/, *.egg-info) in the checkout."""
    dist.mkdir(parents=True, exist_ok=True)
    source = dist.parent / "source"
    if source.exists():
        shutil.rmtree(source)
    skip = shutil.ignore_patterns("__pycache__", "*.pyc", "*.egg-info", ".ipynb_checkpoints")
    for name in ("pyproject.toml", "setup.py", "MANIFEST.in", "README.md", "LICENSE", "src", *DATA_PARTS):
        if (ROOT / name).is_dir():
            shutil.copytree(ROOT / name, source / name, ignore=skip)
        elif (ROOT / name).is_file():
            source.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / name, source / name)
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
                    "--disable-pip-version-check", "-w", str(dist), str(source)], check=True, cwd=dist)
    wheels = sorted(dist.glob("ditgate-*.whl"))
    if len(wheels) != 1:
        raise SystemExit(f"expected one wheel in {dist}, found {wheels}")
    return wheels[0]


def make_venv(venv: Path, wheel: Path) -> Path:
    """A fresh environment holding the wheel; its dependencies come from this Python's site-packages."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    python = venv / "bin" / "python"
    subprocess.run([sys.executable, "-m", "pip", "--python", str(python), "install", "--no-deps", "-q",
                    "--disable-pip-version-check", str(wheel)], check=True)
    site = subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                          check=True, capture_output=True, text=True).stdout.strip()
    # A path line in a .pth file adds that folder only (the .pth files inside it, such as an editable install's
    # finder, are not run), after the environment's own site-packages: the wheel's ditgate wins.
    Path(site, "zz_ditgate_deps.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    return venv / "bin"


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "DITGATE_SKILL_DIR", "VIRTUAL_ENV")}
    env.setdefault("HF_HUB_OFFLINE", "1")
    env.setdefault("TRANSFORMERS_OFFLINE", "1")
    return env


def commands(work: Path, quick: bool) -> list[tuple[list[str], int]]:
    """(arguments of `ditgate`, expected exit status), in the order they run; later ones read earlier outputs."""
    cheap = [
        (["--version"], 0),
        (["zoo", "list"], 0),
        (["notebook", "list"], 0),
        (["checklist", "--validate"], 0),
        (["skill", "install", "--target", str(work / "project")], 0),
        (["gate", "--phase", "cache", str(work / "a.npy"), str(work / "b.npy"), "--modality", "image"], 0),
        (["run", "zoo:flux", "--rows", "cache", "--out", str(work / "run"), "-q"], 0),
    ]
    if quick:
        return cheap
    return cheap + [
        (["lint"], 0),
        (["serve", "--stop"], 0),  # no server running: says so
        (["flops", "zoo:flux", "--height", "64", "--width", "64"], 0),
        (["inspect", "zoo:flux"], 0),
        (["checklist", "cache", "--model", "zoo:flux", "--from-run", str(work / "run"),
          "--out", str(work / "checklist")], 0),
        (["diff", "zoo:flux", "--row", "cp-ulysses-2", "--out", str(work / "diff")], 0),
        (["twin", "zoo:flux", str(work / "twin")], 0),
        (["zoo", "build", "flux", str(work / "flux")], 0),
        (["matrix", "zoo:flux", "--rows", "cache-fast", "--repeats", "1", "--warmup", "0", "--out", str(work / "matrix")],
         0),
        (["notebook", "run", "inspect", "zoo:flux", "--out", str(work / "notebooks"), "--kernel", "python3"], 0),
    ]


def smoke(work: Path, quick: bool = False) -> list[dict]:
    """Build, install and run; returns one record per command (args, status, seconds, tail of its output)."""
    import numpy as np

    work.mkdir(parents=True, exist_ok=True)
    (work / "dist").mkdir(exist_ok=True)
    outside = work / "outside"
    outside.mkdir(exist_ok=True)
    start = time.perf_counter()
    wheel = build_wheel(work / "dist")
    bin_dir = make_venv(work / "venv", wheel)
    records = [{"args": ["<build and install>"], "status": 0, "seconds": round(time.perf_counter() - start, 1),
                "wheel": wheel.name, "wheel_bytes": wheel.stat().st_size, "ok": True}]
    rng = np.random.default_rng(0)
    image = rng.random((32, 32, 3), dtype=np.float32)
    np.save(work / "a.npy", image)
    np.save(work / "b.npy", np.clip(image + rng.normal(0, 1e-3, image.shape).astype(np.float32), 0, 1))
    where = subprocess.run([str(bin_dir / "python"), "-c", "import ditgate.core.paths as p; print(p.data_root())"],
                           capture_output=True, text=True, cwd=outside, env=_env())
    records.append({"args": ["<data root>"], "status": where.returncode, "seconds": 0.0,
                    "output": where.stdout.strip() + where.stderr[-500:],
                    "ok": where.returncode == 0 and "site-packages" in where.stdout})
    for args, expected in commands(work, quick):
        began = time.perf_counter()
        done = subprocess.run([str(bin_dir / "ditgate"), *args], capture_output=True, text=True, cwd=outside,
                              env=_env())
        records.append({"args": args, "status": done.returncode, "expected": expected,
                        "seconds": round(time.perf_counter() - began, 1), "ok": done.returncode == expected,
                        "output": (done.stdout + done.stderr)[-1500:]})
    return records


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--work", type=Path, help="working folder (default: a new temporary one)")
    parser.add_argument("--quick", action="store_true", help="the cheap commands and one gated run only")
    parser.add_argument("--json", action="store_true", help="print the records as JSON")
    args = parser.parse_args(argv)
    work = args.work or Path(tempfile.mkdtemp(prefix="ditgate-wheel-"))
    records = smoke(work.resolve(), quick=args.quick)
    if args.json:
        print(json.dumps(records, indent=2))
    else:
        for record in records:
            mark = "ok  " if record["ok"] else "FAIL"
            print(f"{mark} {record['seconds']:6.1f} s  ditgate {' '.join(record['args'])}")
            if not record["ok"]:
                print("     " + record.get("output", "").replace("\n", "\n     "))
        print(f"wheel {records[0]['wheel']}: {records[0]['wheel_bytes'] / 1e3:.0f} kB; work folder {work}")
    return 0 if all(r["ok"] for r in records) else 1


if __name__ == "__main__":
    sys.exit(main())
