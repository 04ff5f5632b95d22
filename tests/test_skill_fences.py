"""Every `bash runnable` fence of the installed skill runs from any folder.

The skill is installed (`ditgate skill install`) into a temporary project, `SKILL_DIR` is set to the installed
folder, and each line of each runnable fence is run from another temporary folder: bash expands it (variables,
quotes, `$(mktemp -d)`), then it runs in this process (`ditgate ...` through ditgate's own `main`, a Python script
through runpy), so the libraries are imported once. A trailing `# exits N` says the line must exit N (a planted
fault), otherwise it must exit 0. How a line runs, by what it costs on a CPU:

- full: `ditgate inspect`, `ditgate zoo build`, `ditgate lint`, the cache row of `zoo:flux` (the first gated row of
  route 2, about 8 s; `FULL_RUNS`, and a line asking for the same run again reuses its exit code), and the scripts
  that run in a few seconds (`mask_reorder.py`, `generate.py list`);
- dry: every other `ditgate run` line (multi-rank rows, the whole default matrix of a model: minutes on a CPU). Its
  arguments parse with ditgate's parser, its rows exist, its model resolves, its integration file loads as a plugin
  from this folder, and each row passes the run's own preflight (heads and tokens divide, the cache schedule fits).
  `ditgate checklist` and `ditgate notebook run` lines likewise: the checklist validates (the notebooks exist), the
  model resolves, the plugin loads. What those
  rows do is tested where they are built: test_runner, test_custom_model, test_hard_architectures, test_modular,
  test_audio, test_checklists; and tests/test_skill_modular.py runs references/modular_pipeline.md's lines in full;
- help: the recipe scripts that start gloo workers (`fused_qkv_tp.py`, `rope_global_slice.py`) run with `--help`
  here (the path resolves, the script imports and parses its arguments); tests/test_skill_recipes.py runs them in
  full, correct and with the recipe's step removed.

A line of any other kind fails the test until it is given one of these ways.
"""

from __future__ import annotations

import os
import re
import resource
import runpy
import subprocess
import sys
import time
from pathlib import Path

import pytest

from ditgate.skill import install_skill
from ditgate.skill.base import load_skill
from ditgate.skill.rules.commandlines import RUNNABLE, SHELL_FENCES, logical_lines

ROOT = Path(__file__).resolve().parents[1]
EXITS = re.compile(r"\s+#\s*exits\s+(\d+)\s*$")
FULL_RUNS = {"ditgate run zoo:flux --rows cache"}
FULL_SCRIPTS = {"mask_reorder.py": [], "generate.py": ["list"]}
HELP_SCRIPTS = {"fused_qkv_tp.py", "rope_global_slice.py"}
FULL_SUBCOMMANDS = {"inspect", "zoo", "lint"}
BUDGET_S = 60  # seconds of a quiet machine's wall; checked as CPU seconds (this process and its children, up to 3
# of them at once on 2 cores with torch's threads), since wall time on a loaded machine measures the load


def cpu_seconds() -> float:
    """CPU time of this process and of the children it has waited for."""
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    return time.process_time() + children.ru_utime + children.ru_stime


def runnable_lines(root: Path) -> list[tuple[str, int, str]]:
    lines = []
    for doc in load_skill(root).docs.values():
        for fence in doc.fences:
            if fence.language in SHELL_FENCES and RUNNABLE in fence.flags:
                lines += [(doc.rel, fence.line + offset, text) for offset, text in logical_lines(fence.content)
                          if text.strip() and not text.strip().startswith("#")]
    return lines


LINES = runnable_lines(ROOT)


@pytest.fixture(scope="module")
def installed(tmp_path_factory):
    started = time.perf_counter()
    [dest] = install_skill(tmp_path_factory.mktemp("project"), source=ROOT).paths
    elsewhere = tmp_path_factory.mktemp("elsewhere")
    state = {"dest": dest, "elsewhere": elsewhere, "runs": {}, "seconds": {}}
    yield state
    total = time.perf_counter() - started
    slow = sorted(state["seconds"].items(), key=lambda kv: -kv[1])[:5]
    print(f"\nrunnable fences: {len(LINES)} lines in {total:.1f} s; slowest: "
          + ", ".join(f"{name} {s:.1f} s" for name, s in slow))


def expand(text: str, skill_dir: Path, cwd: Path) -> list[str]:
    """The words bash makes of one command line (no globbing), in `cwd` with SKILL_DIR set."""
    script = f"set -f; words=( {text} ); printf '%s\\0' \"${{words[@]}}\""
    done = subprocess.run(["bash", "-c", script], cwd=cwd, capture_output=True, text=True, timeout=30, check=False,
                          env=dict(os.environ, SKILL_DIR=str(skill_dir)))
    assert done.returncode == 0, done.stderr
    return done.stdout.split("\0")[:-1]


def run_script(path: str, argv: list[str]) -> int:
    saved = sys.argv, list(sys.path)
    sys.argv = [path, *argv]
    try:
        runpy.run_path(path, run_name="__main__")
        return 0
    except SystemExit as exc:
        return exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    finally:
        sys.argv, sys.path[:] = saved


def dry_run(argv: list[str]) -> int:
    """What `ditgate run ARGV` checks before it loads any weights, done here without running a row."""
    from ditgate.cli import build_parser
    from ditgate.commands.model.options import model_from
    from ditgate.core import plugin
    from ditgate.core.loader import pipeline_class, read_index, resolve
    from ditgate.run.define import preflight
    from ditgate.run.define import rows as rows_mod

    args = build_parser().parse_args(argv)
    base = rows_mod.load_rows(args.rows_file) if args.rows_file else list(rows_mod.DEFAULT_ROWS)
    rows = rows_mod.select(base, args.rows)
    model_path = resolve(args.model)
    if args.pipeline is not None:                # the class imports and fits the folder
        assert pipeline_class(model_path, read_index(model_path), args.pipeline) is not None
    request = model_from(args).request
    if args.integration is not None:
        assert args.integration.is_file(), f"--integration {args.integration} does not resolve from {Path.cwd()}"
        assert plugin.load(args.integration) is not None
    refused = {row.name: why for row in rows
               if (why := preflight.why_not(row, model_path=model_path, request=request, device="cpu"))}
    assert not refused, refused
    return 0


def dry_checklist(argv: list[str]) -> int:
    """What `ditgate checklist PHASE --model MODEL` (or `ditgate matrix MODEL`) needs before it runs its rows: the
    checklist is valid, the model resolves, the integration file loads from this folder."""
    from ditgate.checklists import validate_all
    from ditgate.cli import build_parser
    from ditgate.core import plugin
    from ditgate.core.loader import resolve

    args = build_parser().parse_args(argv)
    if args.command == "checklist":
        assert validate_all(args.phase.split(","))
    resolve(args.model)
    if args.integration is not None:
        assert args.integration.is_file(), f"--integration {args.integration} does not resolve from {Path.cwd()}"
        assert plugin.load(args.integration) is not None
    return 0


def dry_notebook(argv: list[str]) -> int:
    """What `ditgate notebook run NAME MODEL -p integration FILE` needs before papermill starts: the
    notebooks exist, the model resolves, the integration file loads from this folder."""
    from ditgate.cli import build_parser
    from ditgate.core import plugin
    from ditgate.core.loader import resolve
    from ditgate.notebooks.catalog import find

    args = build_parser().parse_args(argv)
    assert find(args.names)
    resolve(args.model or args.model_option)
    for key, value in args.parameter or []:
        if key == "integration":
            assert Path(value).is_file(), f"-p integration {value} does not resolve from {Path.cwd()}"
            assert plugin.load(value) is not None
    return 0


def run_line(text: str, words: list[str], state: dict) -> tuple[str, int]:
    """(how it ran, exit code)"""
    from ditgate.cli import main

    if words[0] == "ditgate":
        args = words[1:]
        if args[0] == "run" and text.strip() in FULL_RUNS:
            key = text.strip()
            if key not in state["runs"]:
                state["runs"][key] = main([*args, "--out", str(state["elsewhere"] / f"run-{len(state['runs'])}")])
            return "full", state["runs"][key]
        if args[0] == "run":
            return "dry", dry_run(args)
        if args[0] in ("checklist", "matrix"):
            return "dry", dry_checklist(args)
        if args[:2] == ["notebook", "run"]:
            return "dry", dry_notebook(args)
        if args[0] in FULL_SUBCOMMANDS:
            return "full", main(args)
    elif words[0] in ("python", "python3") and len(words) > 1:
        script = Path(words[1])
        assert script.is_file() and script.resolve().is_relative_to(state["dest"].resolve()), (
            f"{script} is not a file of the installed skill")
        if script.name in FULL_SCRIPTS and words[2:] == FULL_SCRIPTS[script.name]:
            return "full", run_script(str(script), words[2:])
        if script.name in HELP_SCRIPTS:
            return "help", run_script(str(script), ["--help"])
    pytest.fail(f"no way to run `{' '.join(words)}` is defined here: add it to the modes of {Path(__file__).name}")


def test_the_installed_copy_is_self_contained(installed):
    """Every path the installed skill cites (links, `references/...`, `examples/...`, `$SKILL_DIR/...` in fences)
    resolves inside the installed folder: the linter, run on the copy, finds nothing."""
    from ditgate.skill import lint

    dest = installed["dest"]
    assert sorted(p.name for p in dest.iterdir()) == ["SKILL.md", "checklists", "examples", "notebooks", "references"]
    report = lint(dest)
    assert report.findings == [], [f.format() for f in report.findings]


def test_a_file_missing_from_the_installed_copy_fails_lint(tmp_path):
    """An installation without a file the skill cites (an example a fence runs) is not self-contained: lint says
    where it is cited."""
    from ditgate.skill import LintConfig, lint

    [dest] = install_skill(tmp_path / "project", source=ROOT).paths
    (dest / "examples" / "flux3" / "integration_wrong_cfg.py").unlink()
    report = lint(dest, LintConfig(disabled=frozenset({"api", "command"})))
    assert {(f.rule, f.file) for f in report.errors} == {("route", "references/modular_pipeline.md"),
                                                         ("link", "references/modular_pipeline.md")}, \
        [f.format() for f in report.errors]


@pytest.mark.parametrize("rel, line, text", LINES, ids=[f"{rel}:{line}" for rel, line, _ in LINES])
def test_runnable_fence_line_runs_from_another_folder(installed, rel, line, text, monkeypatch, capsys):
    assert (installed["dest"] / rel).is_file()
    monkeypatch.chdir(installed["elsewhere"])
    monkeypatch.setenv("SKILL_DIR", str(installed["dest"]))
    match = EXITS.search(text)
    expected = int(match.group(1)) if match else 0
    text = EXITS.sub("", text)
    words = expand(text, installed["dest"], installed["elsewhere"])
    started = cpu_seconds()
    how, code = run_line(text, words, installed)
    installed["seconds"][f"{rel}:{line}"] = cpu_seconds() - started
    out = capsys.readouterr()
    if how == "dry":
        expected = 0                     # the checks passed; what the rows then do is tested where they are built
    assert code == expected, f"{rel}:{line} ({how}) `{text}` exited {code}, expected {expected}\n{out.out[-3000:]}" \
                             f"\n{out.err[-3000:]}"


def test_every_runnable_line_is_run_and_the_fences_stay_cheap(installed):
    """Runs last in this file: the lines above ran, each in one of the ways the docstring lists, within budget."""
    ran = installed["seconds"]
    assert len(ran) == len(LINES), "some runnable lines did not run"
    assert sum(ran.values()) < BUDGET_S * 3, f"the runnable fences took {sum(ran.values()):.0f} s of CPU: {ran}"
