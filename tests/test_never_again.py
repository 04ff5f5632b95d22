"""The four things that must never happen: code from a model folder run without consent, a row whose feature did
nothing passing, two runs writing into one folder, and workers outliving the run that started them.

These tests drive the command line (`python -m ditgate` in a subprocess where the process itself matters, the
in-process CLI otherwise). The parallel ones share one hung worker group per test: a 2-rank reference row whose
integration makes rank 1 sleep, so the group stays alive until something ends it.
"""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

PLUGINS = Path(__file__).parent / "plugins"
SRC = Path(__file__).resolve().parents[1] / "src"


def _env():
    return dict(os.environ, PYTHONPATH=os.pathsep.join([str(SRC), os.environ.get("PYTHONPATH", "")]))


# -- 1. code inside the model folder is remote code, whatever sys.path says ------------------------------------------

def _evil_model(folder: Path, where: str) -> Path:
    """A model folder whose model_index.json names a module shipped beside it; importing it leaves folder/RAN."""
    folder.mkdir()
    code = "import pathlib\npathlib.Path(__file__).resolve().parent.joinpath('RAN').write_text('ran')\n" \
           "class EvilPipeline:\n    pass\nclass EvilModel:\n    pass\n"
    if where == "pipeline":
        index = {"_class_name": ["evilpipe", "EvilPipeline"]}
        (folder / "evilpipe.py").write_text(code)
    else:
        index = {"_class_name": "FluxPipeline", "transformer": ["evilpipe", "EvilModel"]}
        (folder / "transformer").mkdir()
        (folder / "transformer" / "evilpipe.py").write_text(code)
        (folder / "evilpipe.py").write_text(code)
    (folder / "model_index.json").write_text(json.dumps(index))
    return folder


@pytest.mark.parametrize("where", ["pipeline", "component"])
def test_model_folder_code_needs_consent_under_python_m(tmp_path, where):
    """`cd MODEL && python -m ditgate inspect .` puts MODEL on sys.path; its code must still not run."""
    model = _evil_model(tmp_path / "model", where)
    done = subprocess.run([sys.executable, "-m", "ditgate", "inspect", "."], cwd=model, env=_env(),
                          capture_output=True, text=True, timeout=300)
    assert not (model / "RAN").exists(), "code from the model folder ran without --trust-remote-code"
    assert done.returncode == 2, done.stderr[-2000:]
    assert "--trust-remote-code" in done.stderr and "Traceback" not in done.stderr


# -- 2. a row's proofs follow its phase ---------------------------------------------------------------------------

@pytest.mark.parametrize("phase", ["tp", "cp", "tep", "vaep", "hybrid", "cache", "quantization", "compile"])
def test_phase_without_its_feature_is_refused_before_anything_runs(run_cli, tmp_path, phase):
    rows = tmp_path / "rows.yaml"
    rows.write_text(f"- {{name: x, phase: {phase}}}\n")
    code, out, err = run_cli("run", "zoo:flux", "--rows-file", rows, "--out", tmp_path / "out")
    assert code == 2, (code, err[-2000:])
    assert "x" in err and phase in err and "Traceback" not in err
    assert not (tmp_path / "out").exists()


def test_rows_whose_feature_is_configured_but_leaves_no_trace_fail():
    """Every phase has a proof: a configured feature whose facts show nothing fails its proof."""
    from ditgate.run.judge import proofs
    from ditgate.run.define import rows

    base = rows.BASELINE
    empty = {"transformer_calls": 8, "last_block_calls": {}, "sharded": {}, "block_seq_len": {}}
    cases = {
        "cache": rows.Row("c", "cache", cache={"Fn_compute_blocks": 1}),
        "quantization": rows.Row("q", "quantization", quantize={"quant_type": "float8_per_row"}),
        "compile": rows.Row("k", "compile", compile=True),
        "tp": rows.Row("t", "tp", parallel={"tp_size": 2}),
        "cp": rows.Row("u", "cp", parallel={"ulysses_size": 2}),
    }
    for phase, row in cases.items():
        found = proofs.check(row, empty, base, empty)
        assert found and not all(p.passed for p in found), (phase, found)


# -- 3 and 4: a hung worker group, then a second run into its folder, then the parent killed ---------------------------

def _descendants(pid: int) -> set[int]:
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                ppid = int(Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(ppid, []).append(int(entry))
    found, todo = set(), [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            if child not in found:
                found.add(child)
                todo.append(child)
    return found


def _alive(pid: int) -> bool:
    """True while any thread of `pid` runs: a killed process's main thread is a zombie before its other threads
    (and the files they share, a folder lock among them) are gone."""
    try:
        tasks = list(Path(f"/proc/{pid}/task").iterdir())
    except OSError:
        return False
    for task in tasks:
        try:
            if (task / "stat").read_text().rsplit(")", 1)[1].split()[0] not in ("Z", "X"):
                return True
        except OSError:
            continue
    return False


@pytest.fixture()
def hung_run(tmp_path):
    """`ditgate run` in a subprocess, stopped inside a 2-rank group (rank 1 sleeps): (process, out, worker pids)."""
    rows = tmp_path / "rows.yaml"
    rows.write_text("- {name: hang, baseline: null, parallel: {ulysses_size: 2}}\n"  # a reference row ...
                    "- {name: after, phase: cp, baseline: hang, parallel: {ulysses_size: 2}}\n")  # ... compared with
    out = tmp_path / "out"
    proc = subprocess.Popen([sys.executable, "-m", "ditgate", "run", "zoo:flux", "--rows-file", str(rows),
                             "--integration", str(PLUGINS / "flux_rank1_hangs.py"), "--out", str(out),
                             "--timeout", "600"], env=_env(), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    workers: set[int] = set()
    try:
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline:
            stages = [json.loads(p.read_text()) for p in out.glob("groups/*/rank*.status.json")]
            if len(stages) == 2 and {s.get("stage") for s in stages} & {"apply", "run", "barrier"}:
                break
            assert proc.poll() is None, proc.stderr.read().decode()[-3000:]
            time.sleep(0.5)
        else:
            pytest.fail("the worker group never started")
        workers = _descendants(proc.pid)
        assert len(workers) >= 2  # the two ranks (forked from the run on CPU; under torchrun elsewhere)
        yield proc, out, workers
    finally:
        for pid in [proc.pid, *workers]:  # never leave a process behind, whatever the test found
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        proc.wait()


def _gone_within(pids: set[int], seconds: float) -> set[int]:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        left = {p for p in pids if _alive(p)}
        if not left:
            return set()
        time.sleep(0.5)
    return {p for p in pids if _alive(p)}


def test_two_runs_into_one_folder_are_refused_and_a_stale_lock_is_recognised(hung_run, run_cli):
    proc, out, workers = hung_run
    for extra in ([], ["--resume"]):
        code, _, err = run_cli("run", "zoo:flux", "--rows", "baseline", "--out", out, *extra)
        assert code == 2, err[-2000:]
        assert f"pid {proc.pid}" in err and "Traceback" not in err
    proc.kill()
    proc.wait()
    assert not _gone_within(workers, 60)
    # the lock of the killed run is stale: a --resume takes the folder over
    code, out_text, err = run_cli("run", "zoo:flux", "--rows", "baseline", "--out", out, "--resume",
                                  "--integration", PLUGINS / "flux_rank1_hangs.py", "--json")
    assert code == 0, err[-2000:]
    assert json.loads(out_text)["rows"][0]["name"] == "baseline"


@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGTERM], ids=["SIGKILL", "SIGTERM"])
def test_workers_die_with_their_parent(hung_run, sig):
    proc, out, workers = hung_run
    os.kill(proc.pid, sig)
    left = _gone_within(workers, 60)
    assert not left, f"processes left after {sig.name} of the parent: {sorted(left)}"
    proc.wait(timeout=60)
    if sig == signal.SIGTERM:  # handled like SIGINT: the run ends cleanly, exit 143
        assert proc.returncode == 128 + signal.SIGTERM, proc.stderr.read().decode()[-2000:]


EVIL = '''
import pathlib
pathlib.Path({marker!r}).write_text("ran")


class EvilPipe:
    pass
'''


@pytest.mark.parametrize("case", ["linked-package", "linked-module", "beside-the-folder"])
@pytest.mark.parametrize("command", ["inspect", pytest.param("run", marks=pytest.mark.full)])
def test_model_folder_code_never_runs_without_consent_under_python_m(tmp_path, case, command):
    """The probe's cases: code the model folder names runs only with --trust-remote-code, whatever the working folder
    (`python -m` puts it on sys.path) or links say: a package linked into the folder from outside, a linked module
    file, a package beside the folder reached through the working folder."""
    import subprocess
    import sys

    root = Path(__file__).resolve().parents[1]
    model, outside = tmp_path / "model", tmp_path / "outside"
    model.mkdir()
    outside.mkdir()
    marker = tmp_path / "RAN"
    name = {"linked-package": "gpkg", "linked-module": "gmod", "beside-the-folder": "gnear"}[case]
    (model / "model_index.json").write_text(json.dumps({"_class_name": [name, "EvilPipe"]}))
    if case == "linked-package":
        (outside / name).mkdir()
        (outside / name / "__init__.py").write_text(EVIL.format(marker=str(marker)))
        (model / name).symlink_to(outside / name, target_is_directory=True)
        cwd, target = model, "."
    elif case == "linked-module":
        (outside / f"{name}.py").write_text(EVIL.format(marker=str(marker)))
        (model / f"{name}.py").symlink_to(outside / f"{name}.py")
        cwd, target = model, "."
    else:
        (tmp_path / name).mkdir()
        (tmp_path / name / "__init__.py").write_text(EVIL.format(marker=str(marker)))
        cwd, target = tmp_path, "model"
    argv = [sys.executable, "-m", "ditgate", command, target]
    argv += ["--json"] if command == "inspect" else ["--rows", "cache", "--out", str(tmp_path / "run")]
    env = dict(os.environ, PYTHONPATH=str(root / "src"))
    done = subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=300)
    assert not marker.exists(), f"the model folder's code ran: {done.stderr[-2000:]}"
    assert done.returncode == 2 and "--trust-remote-code" in done.stderr, done.stderr[-2000:]
    assert "Traceback" not in done.stderr


@pytest.mark.full
def test_resume_never_reports_an_earlier_runs_result_for_a_parallel_row(run_cli, tmp_path):
    """The probe's case: a parallel row whose definition changed between runs ran again under --resume, and the
    worker group's poll read the earlier run's rows/NAME/result.json (PASSED) before the ranks wrote theirs, so a
    row that now crashes was reported PASSED. The stale result is discarded before the row runs."""
    plugin = Path(__file__).parent / "plugins" / "flux_rank1_crashes.py"  # ring: correct; ulysses: rank 1 raises
    first, second = tmp_path / "ring.yaml", tmp_path / "ulysses.yaml"
    first.write_text("- {name: x, phase: cp, parallel: {ring_size: 2}}")
    second.write_text("- {name: x, phase: cp, parallel: {ulysses_size: 2}}")
    out = tmp_path / "run"
    code, _, err = run_cli("run", "zoo:flux", "--rows-file", first, "--integration", plugin, "--out", out)
    assert code == 0, err[-2000:]
    code, _, err = run_cli("run", "zoo:flux", "--rows-file", second, "--integration", plugin, "--out", out,
                           "--resume")
    row = next(r for r in json.loads((out / "report.json").read_text())["rows"] if r["name"] == "x")
    assert code == 1 and row["status"] == "error", row
    assert any("planted failure on rank 1" in reason for reason in row["reasons"]), row["reasons"]


# -- hints match the failure: a hang is not a wrong plan -------------------------------------------------------------

def test_a_hung_group_gets_the_hang_hint_not_a_plan_hint():
    """The probe's case: a rank that hung in a CP row was told to check the CP plan's gathers and RoPE grid, which
    produce wrong numbers, not hangs. A group stopped for no progress gets the hang's hint, for every phase."""
    from ditgate.run.judge.hints import HANG_HINT, HINTS, hint_for

    message = "no progress for the timeout, group killed: rank 1 in row 'cp-ulysses-2' at stage 'apply'"
    for phase in ("cp", "tp", "hybrid", "cache"):
        assert hint_for(phase, message, {"timed_out": True}) == HANG_HINT
        assert HINTS[phase] not in hint_for(phase, message, {"timed_out": True})
    assert "--timeout" in HANG_HINT and "collective" in HANG_HINT
    # a rank that raised (a shape error in a split) still gets the plan's hint
    assert hint_for("cp", "rank 1 failed in row 'x' at stage 'run': RuntimeError: shape mismatch") == HINTS["cp"]
