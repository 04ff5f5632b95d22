"""The phase notebooks: committed clean, and executed with papermill on real zoo models (real cache-dit, torchrun).

One `ditgate notebook run all --model zoo:flux` runs every image notebook of the route once (module fixture). Its rows
are the default rows of `ditgate run`, which the session already ran live on zoo:flux (tests/conftest.py): each
phase's run folder is seeded with them and the notebooks resume, so the route checks the notebooks themselves
(parameters, the runner call, tables, grids, JSON results, the final table) without computing those rows a second
time; the Wan video path through 30_cp resumes the same way from the session's zoo:wan run. Rows run live inside
notebooks too: a broken CP plan makes 30_cp (papermill itself, torchrun under it) fail with the gate's reason in the
notebook, and the audio and perf-matrix notebooks compute their rows.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import nbformat
import papermill
import pytest

from ditgate import zoo
from ditgate import notebooks
from ditgate.run.define import rows
from ditgate.notebooks import NOTEBOOKS, NotebookError

ROOT = Path(__file__).resolve().parents[1]
PLUGINS = Path(__file__).parent / "plugins"
ROUTE = [nb for nb in NOTEBOOKS if nb.in_all]
BY_PHASE = {nb.phase: nb for nb in NOTEBOOKS}
HAS_MATRIX = importlib.util.find_spec("ditgate.commands.model.matrix") is not None
HAS_AUDIO = "stable-audio" in zoo.ZOO


def _env() -> dict[str, str]:
    """This checkout's ditgate first on the path of the CLI and of the kernels it starts."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT / "src"), *filter(None, [env.get("PYTHONPATH")])])
    return env


def _ditgate(*args, timeout: float = 3600) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "ditgate", *map(str, args)], env=_env(), capture_output=True,
                          text=True, timeout=timeout, cwd=ROOT)


def _outputs(path: Path) -> list[dict]:
    node = nbformat.read(str(path), as_version=4)
    return [o for c in node.cells if c.cell_type == "code" for o in c.outputs]


def _shown(path: Path, mime: str) -> list[str]:
    return [o["data"][mime] for o in _outputs(path) if o.get("output_type") == "display_data" and mime in o["data"]]


def _readable(path: Path) -> str:
    """Check what an engineer reads in an executed notebook and return it rendered to HTML (nbconvert): no stderr
    cell (library messages, progress bars and ranks went to the folded log), no line printed twice, a PASS/FAIL
    banner, the run's table shown once, the log folded with its file."""
    from nbconvert import HTMLExporter

    outputs = _outputs(path)
    assert not [o for o in outputs if o.get("output_type") == "stream" and o.get("name") == "stderr"], \
        [o["text"][:300] for o in outputs if o.get("name") == "stderr"]
    printed = [line for o in outputs if o.get("output_type") == "stream" for line in o["text"].splitlines() if line]
    assert len(printed) == len(set(printed)), printed
    tables = [t for t in _shown(path, "text/markdown") if "| row | phase | ranks |" in t or "| row | tier |" in t]
    assert len(tables) <= 1
    html = _shown(path, "text/html")
    assert sum(">PASS<" in h or ">FAIL<" in h for h in html) == 1
    logs = [h for h in html if h.startswith("<details><summary>log:")]
    assert len(logs) == 1
    log_file = Path(logs[0].split("<code>")[1].split("</code>")[0])
    assert log_file.is_file()
    body, _ = HTMLExporter().from_filename(str(path))
    assert "<details>" in body and "<html" in body
    return body


# ------------------------------------------------------------------------------------------ committed notebooks


@pytest.mark.parametrize("nb", NOTEBOOKS, ids=lambda nb: nb.stem)
def test_committed_notebook_is_valid_and_has_no_outputs(nb):
    node = nbformat.read(str(nb.path), as_version=nbformat.NO_CONVERT)
    nbformat.validate(node)
    code = [c for c in node.cells if c.cell_type == "code"]
    assert all(c.outputs == [] for c in code), "outputs are committed"
    assert all(c.execution_count is None for c in code), "execution counts are committed"
    tagged = [c for c in node.cells if "parameters" in c.metadata.get("tags", [])]
    assert len(tagged) == 1 and tagged[0].cell_type == "code"
    declared = papermill.inspect_notebook(str(nb.path))
    assert {"model", "out"} <= set(declared)
    assert {p["inferred_type_name"] for p in declared.values()} <= {"str", "int", "float", "bool"}  # all typed
    assert declared["model"]["default"] == f'"{nb.model}"'
    assert code[-1].source.startswith(f'result = nb.finish("{nb.phase}", ')  # writes <out>/<phase>.json, raises


def test_notebook_folder_holds_exactly_the_table():
    assert sorted(p.stem for p in notebooks.notebooks_dir().glob("*.ipynb")) == sorted(nb.stem for nb in NOTEBOOKS)


def test_committed_notebooks_are_what_the_script_writes(tmp_path):
    spec = importlib.util.spec_from_file_location("make_notebooks", ROOT / "scripts" / "make_notebooks.py")
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    assert script.main(["--check"]) == 0
    assert script.main(["--dir", str(tmp_path)]) == 0
    (tmp_path / "30_cp.ipynb").write_text((tmp_path / "30_cp.ipynb").read_text().replace("zoo:flux", "zoo:wan"))
    assert script.main(["--check", "--dir", str(tmp_path)]) == 1


def test_linter_finds_every_phase_notebook():
    from ditgate.skill import lint

    findings = [f.format() for f in lint(ROOT).findings if f.rule == "phase-files" and "notebook" in f.message]
    assert findings == []


# ---------------------------------------------------------------------------------------------- small pieces


def test_find_notebooks():
    assert [nb.stem for nb in notebooks.find("all")] == ["00_inspect", "10_baseline", "20_cache", "30_cp", "40_tp",
                                                         "50_tep", "60_vaep", "70_final"]
    assert [nb.stem for nb in notebooks.find("tp, 30_cp,cp")] == ["30_cp", "40_tp"]  # notebook order, once each
    assert [nb.stem for nb in notebooks.find("audio,perf_matrix")] == ["80_perf_matrix", "90_audio"]
    with pytest.raises(NotebookError, match="unknown notebook"):
        notebooks.find("cp,warp")


def test_kernel_choice():
    assert notebooks.choose_kernel(None, {"python3": "a", "ditgate": "b"}) == "ditgate"
    assert notebooks.choose_kernel(None, {"python3": "a"}) == "python3"
    assert notebooks.choose_kernel("mine", {"mine": "a", "ditgate": "b"}) == "mine"
    with pytest.raises(NotebookError, match="ipykernel install"):
        notebooks.choose_kernel(None, {"julia": "a"})
    with pytest.raises(NotebookError, match="no Jupyter kernel named 'nope'"):
        notebooks.choose_kernel("nope", {"python3": "a"})


def test_phase_rows_follow_the_default_rows_and_scale():
    default = {r.name: r for r in rows.DEFAULT_ROWS}
    for phase in ("cache", "cp", "tp", "tep", "vaep"):
        gated = [r for r in notebooks.phase_rows(phase) if r.phase == phase]
        assert gated == [r for r in rows.DEFAULT_ROWS if r.phase == phase]
    assert [r.name for r in notebooks.phase_rows("final", 4)] == ["baseline", "hybrid-u2xtp2"]
    assert notebooks.phase_rows("final", 4)[1] == default["hybrid-u2xtp2"]
    assert [r.name for r in notebooks.phase_rows("baseline")] == ["baseline"]
    assert [r.name for r in notebooks.phase_rows("audio")] == ["baseline", "cache"]
    four = {r.name: r for r in notebooks.phase_rows("cp", 4)}
    assert list(four) == ["baseline", "cp-ulysses-4", "cp-ring-4", "cache", "cache+ulysses-4"]
    assert four["cp-ring-4"].parallel == {"ring_size": 4} and four["cache+ulysses-4"].baseline == "cache"
    assert [r.world_size for r in notebooks.phase_rows("vaep", 8)] == [1, 8]
    six = notebooks.phase_rows("final", 6)[1]
    assert (six.name, six.parallel, six.world_size) == ("hybrid-u2xtp3", {"ulysses_size": 2, "tp_size": 3}, 6)
    with pytest.raises(Exception, match="even world_size"):
        notebooks.phase_rows("final", 2)


def test_parameters_are_typed_as_declared():
    cp = BY_PHASE["cp"]
    typed = notebooks.notebook_parameters(cp, {"steps": "4", "resume": "yes", "timeout": "30", "model": "zoo:wan",
                                               "tier": "B"})
    assert typed == {"steps": 4, "resume": True, "timeout": 30.0, "model": "zoo:wan"}  # tier: not a cp parameter
    with pytest.raises(NotebookError, match="steps takes int"):
        notebooks.notebook_parameters(cp, {"steps": "four"})


def test_gates_parameter_judges_with_another_table(tmp_path):
    from ditgate.core.errors import GateConfigError

    table = json.loads((ROOT / "checklists" / "gates.json").read_text())
    for check in table["phases"]["cache"]["modalities"]["image"]["checks"]:
        if check["metric"] == "psnr":
            check["value"] = 1000
    strict = tmp_path / "strict.json"
    strict.write_text(json.dumps(table))
    report = notebooks.run_phase("cache", "zoo:flux", tmp_path, steps=4, gates=str(strict), progress=None)
    cache = {r["name"]: r for r in report["rows"]}["cache"]
    assert cache["status"] == "failed" and any("is not > 1000 dB" in reason for reason in cache["reasons"])
    with pytest.raises(notebooks.GateFailed, match="cache gate failed: cache: PSNR"):
        notebooks.finish("cache", report, tmp_path)
    assert json.loads((tmp_path / "cache.json").read_text())["gates"] == str(strict)
    (tmp_path / "broken.json").write_text("{}")
    with pytest.raises(GateConfigError):  # refused before any row runs
        notebooks.run_phase("cache", "zoo:flux", tmp_path / "again", gates=str(tmp_path / "broken.json"))
    assert not (tmp_path / "again").exists()


def test_a_reference_output_with_nan_fails_the_phase(tmp_path):
    import numpy as np

    from ditgate.run.exec import files as store

    run_dir = tmp_path / "baseline"
    store.write_array(store.row_dir(run_dir, "baseline") / "output.npy", np.array([[[0.5, np.nan, 0.2]]], np.float32))
    report = {"model": "zoo:flux", "passed": True, "run_dir": str(run_dir),
              "rows": [{"name": "baseline", "phase": None, "status": "reference", "reasons": []}]}
    with pytest.raises(notebooks.GateFailed, match="baseline: the reference output contains NaN or Inf"):
        notebooks.finish("baseline", report, tmp_path)
    store.write_array(store.row_dir(run_dir, "baseline") / "output.npy", np.full((1, 1, 3), 0.5, np.float32))
    assert notebooks.finish("baseline", report, tmp_path)["passed"]


def test_cli_refuses_bad_requests_before_starting_a_kernel(run_cli, tmp_path):
    code, _, err = run_cli("notebook", "run", "cp", "--model", "zoo:flux", "--out", tmp_path, "-p", "colour", "red")
    assert code == 2 and "colour" in err
    code, _, err = run_cli("notebook", "run", "cp", "--model", "zoo:flux", "--out", tmp_path, "-p", "steps", "x")
    assert code == 2 and "steps takes int" in err
    code, _, err = run_cli("notebook", "run", "cp", "--model", "zoo:flux", "--kernel", "nope")
    assert code == 2 and "no Jupyter kernel named 'nope'" in err
    code, _, err = run_cli("notebook", "run", "cp", "--model", "zoo:flux", "-p", "model", "zoo:wan")
    assert code == 2 and "give model as MODEL, not -p model" in err
    assert not list(tmp_path.iterdir())
    code, out, _ = run_cli("notebook", "list")
    assert code == 0 and all(nb.stem in out for nb in NOTEBOOKS) and "world_size: int = 4" in out


@pytest.mark.full
def test_stops_at_the_first_failure_unless_keep_going(tmp_path):
    missing = tmp_path / "no-such-model"
    done = _ditgate("notebook", "run", "baseline,cache", "--model", missing, "--out", tmp_path / "a")
    assert done.returncode == 1
    summary = {n["notebook"]: n for n in json.loads((tmp_path / "a" / "notebooks.json").read_text())["notebooks"]}
    assert summary["10_baseline"]["status"] == "error" and "does not exist" in summary["10_baseline"]["reason"]
    assert summary["20_cache"]["status"] == "not run"
    assert "NOT RUN" in done.stdout and "ModelNotFoundError" in done.stdout
    done = _ditgate("notebook", "run", "baseline,cache", "--model", missing, "--out", tmp_path / "b", "--keep-going")
    assert done.returncode == 1
    summary = json.loads((tmp_path / "b" / "notebooks.json").read_text())["notebooks"]
    assert [n["status"] for n in summary] == ["error", "error"]
    assert (tmp_path / "b" / "20_cache.ipynb").is_file()


# ------------------------------------------------------------------------------------- the route on zoo:flux


def _seed(out: Path, run_dir: Path) -> None:
    """Give each phase notebook's run folder (`out/<phase>`) the finished rows of `run_dir` that it would run."""
    from ditgate.run.runner import copy_finished_rows

    for nb in ROUTE:
        if nb.kind != "inspect":
            copy_finished_rows(run_dir, out / nb.phase, [r.name for r in notebooks.phase_rows(nb.phase, nb.world_size)])


@pytest.fixture(scope="module")
def flux_route(tmp_path_factory, flux_default_run):
    out = tmp_path_factory.mktemp("notebooks") / "flux"
    _seed(out, flux_default_run[1])
    done = _ditgate("notebook", "run", "all", "--model", "zoo:flux", "--out", out, "-p", "resume", "True")
    return done, out


@pytest.mark.full  # the fast tier runs the CP (broken plan), audio and perf-matrix notebooks live
def test_every_route_notebook_passes_on_flux(flux_route):
    done, out = flux_route
    assert done.returncode == 0, done.stdout + done.stderr[-4000:]
    summary = json.loads((out / "notebooks.json").read_text())
    assert summary["kernel"] in ("ditgate", "python3")
    assert [(n["notebook"], n["status"]) for n in summary["notebooks"]] == [(nb.stem, "passed") for nb in ROUTE]
    for nb in ROUTE:
        assert f"{nb.stem}" in done.stdout and (out / f"{nb.stem}.ipynb").is_file()


@pytest.mark.parametrize("nb", ROUTE, ids=lambda nb: nb.stem)
@pytest.mark.full  # the fast tier reads papermill's exit status in test_stops_at_the_first_failure_unless_keep_going
def test_papermill_and_the_json_result_agree(flux_route, nb):
    _, out = flux_route
    executed = nbformat.read(str(out / f"{nb.stem}.ipynb"), as_version=4)
    assert all(c.execution_count is not None for c in executed.cells if c.cell_type == "code")  # every cell ran
    assert not [o for o in _outputs(out / f"{nb.stem}.ipynb") if o.get("output_type") == "error"]
    assert notebooks.failure(out / f"{nb.stem}.ipynb") is None
    result = json.loads((out / f"{nb.phase}.json").read_text())
    assert result["phase"] == nb.phase and result["passed"] is True and result["reasons"] == []
    if nb.kind == "inspect":
        assert result["block_lists"] and all(b["pattern"] for b in result["block_lists"])
        assert (out / "plan.md").read_text().strip()
        assert any("Block lists" in text for text in _shown(out / f"{nb.stem}.ipynb", "text/markdown"))
        return
    expected = [r.name for r in notebooks.phase_rows(nb.phase, nb.world_size)]
    assert [r["name"] for r in result["rows"]] == expected
    assert all(r["status"] in ("passed", "reference") for r in result["rows"])
    report = json.loads((Path(result["run_dir"]) / "report.json").read_text())
    assert report["passed"] and report["model"] == "zoo:flux"
    assert all(r["resumed"] for r in report["rows"])  # seeded from the session's run, not computed again
    tables = _shown(out / f"{nb.stem}.ipynb", "text/markdown")
    assert any(all(f"| {name} |" in t for name in expected) for t in tables)  # the results table is shown
    body = _readable(out / f"{nb.stem}.ipynb")
    assert ">PASS<" in body and (nb.phase == "baseline" or "threshold" in body and "margin" in body)
    assert _shown(out / f"{nb.stem}.ipynb", "image/png")  # and the image grid


@pytest.mark.full
def test_final_notebook_gathers_every_phase(flux_route):
    _, out = flux_route
    final = json.loads((out / "final.json").read_text())
    assert final["phases"] == {nb.phase: True for nb in ROUTE if nb.phase != "final"}
    table = (out / "results.md").read_text()
    for name in ("cache", "cp-ulysses-2", "cp-ring-2", "cache+ulysses-2", "tp-2", "tp-2+tep", "tp-2+vaep",
                 "hybrid-u2xtp2"):
        assert f"| {name} |" in table and "PASSED" in table.split(f"| {name} |")[1].splitlines()[0]
    assert any("hybrid-u2xtp2" in t and "tp-2+vaep" in t for t in _shown(out / "70_final.ipynb", "text/markdown"))


@pytest.mark.full
def test_inspect_gate_fails_when_a_block_list_has_no_pattern(flux_route, tmp_path):
    _, out = flux_route
    anatomy = json.loads((out / "inspect.json").read_text())["anatomy"]
    anatomy["block_lists"][1].update(pattern=None, pattern_reason="the block returns three tensors")
    with pytest.raises(notebooks.GateFailed, match="single_transformer_blocks: no cache-dit ForwardPattern fits "
                                                   r"\(the block returns three tensors\)"):
        notebooks.finish("inspect", anatomy, tmp_path)
    assert json.loads((tmp_path / "inspect.json").read_text())["passed"] is False


# ------------------------------------------------------------------------------------------ video, failures


@pytest.mark.full  # the fast tier checks zoo:wan's rows in test_runner
def test_wan_video_through_the_cp_notebook(tmp_path, wan_default_run):
    from ditgate.run.runner import copy_finished_rows

    copy_finished_rows(wan_default_run[1], tmp_path / "cp", [r.name for r in notebooks.phase_rows("cp")])
    done = _ditgate("notebook", "run", "cp", "--model", "zoo:wan", "--out", tmp_path, "-p", "resume", "True")
    assert done.returncode == 0, done.stdout + done.stderr[-4000:]
    result = json.loads((tmp_path / "cp.json").read_text())
    assert result["passed"] and result["model"] == "zoo:wan"
    assert all(r["resumed"] for r in json.loads((Path(result["run_dir"]) / "report.json").read_text())["rows"])
    gated = [r for r in result["rows"] if r["phase"] == "cp"]
    assert [r["name"] for r in gated] == ["cp-ulysses-2", "cp-ring-2", "cache+ulysses-2"]
    assert {r["modality"] for r in gated} == {"video"}
    assert all("psnr_frame_min" in r["metrics"] for r in gated)
    assert _shown(tmp_path / "30_cp.ipynb", "image/png")


@pytest.mark.full
def test_broken_cp_plan_fails_the_cp_notebook_with_the_gate_reason(tmp_path):
    executed = tmp_path / "30_cp.ipynb"
    done = subprocess.run([sys.executable, "-m", "papermill", str(BY_PHASE["cp"].path), str(executed),
                           "-k", notebooks.choose_kernel(None), "-p", "model", "zoo:flux",
                           "-p", "integration", str(PLUGINS / "flux_cp_no_gather.py"), "-p", "rows", "cp-ulysses-2",
                           "-p", "out", str(tmp_path)], env=_env(), capture_output=True, text=True, timeout=1800)
    assert done.returncode != 0  # papermill's exit status ...
    result = json.loads((tmp_path / "cp.json").read_text())
    assert result["passed"] is False  # ... and the JSON result agree
    reason = " ".join(result["reasons"])
    assert "cp-ulysses-2" in reason and "_ContextParallelOutput" in reason and "gather" in reason
    ename, evalue = notebooks.failure(executed)
    assert ename == "GateFailed" and "_ContextParallelOutput" in evalue and "cp-ulysses-2" in evalue
    cells = [c for c in nbformat.read(str(executed), as_version=4).cells if c.cell_type == "code"]
    assert [o["ename"] for o in cells[-1].outputs if o["output_type"] == "error"] == ["GateFailed"]  # the last cell
    assert "GateFailed" in done.stderr
    # what the engineer reads: the FAIL banner, the gate, where the row departs from its baseline, no traceback
    body = _readable(executed)
    assert ">FAIL<" in body and "Where cp-ulysses-2 departs from its baseline" in body and "proj_out" in body
    error = next(o for o in cells[-1].outputs if o["output_type"] == "error")
    assert error["traceback"] == [f"GateFailed: {error['evalue']}"]  # the verdict, not a trace into ditgate


# ---------------------------------------------------------------------------------- routes of other modules


@pytest.mark.skipif(not HAS_AUDIO, reason="zoo:stable-audio (the audio route's zoo model) is not in this checkout")
@pytest.mark.full
def test_audio_notebook_on_stable_audio(tmp_path):
    done = _ditgate("notebook", "run", "audio", "--model", "zoo:stable-audio", "--out", tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr[-4000:]
    result = json.loads((tmp_path / "audio.json").read_text())
    by_name = {r["name"]: r for r in result["rows"]}
    assert result["passed"] and by_name["cache"]["modality"] == "audio" and by_name["cache"]["status"] == "passed"
    assert _shown(tmp_path / "90_audio.ipynb", "text/html")  # the audio players


@pytest.mark.skipif(not HAS_MATRIX, reason="`ditgate matrix` (ditgate.commands.model.matrix, ditgate.perf.matrix) is not in this "
                                           "checkout")
@pytest.mark.full
def test_perf_matrix_notebook(tmp_path):
    done = _ditgate("notebook", "run", "perf_matrix", "--model", "zoo:flux", "--out", tmp_path,
                    "-p", "rows", "cache-fast", "-p", "warmup", "0", "-p", "repeats", "1")
    assert done.returncode == 0, done.stdout + done.stderr[-4000:]
    result = json.loads((tmp_path / "perf_matrix.json").read_text())
    assert result["passed"] and {r["name"] for r in result["rows"]} >= {"baseline", "cache-fast"}
    assert any("| cache-fast |" in t for t in _shown(tmp_path / "80_perf_matrix.ipynb", "text/markdown"))
    assert _shown(tmp_path / "80_perf_matrix.ipynb", "image/png")  # speedup against PSNR
    body = _readable(tmp_path / "80_perf_matrix.ipynb")
    assert ">PASS<" in body and ">FAIL<" not in body
