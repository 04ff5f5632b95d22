"""The installed package: a wheel built from the checkout, installed alone into a fresh virtual environment, runs
the commands from a folder outside the checkout with the data it ships (`ditgate/_data`), not the checkout's.

The fast tier builds, installs and runs the cheap commands plus one gated run (`ditgate run zoo:flux --rows
cache`); the full tier runs every command (scripts/wheel_smoke.py without --quick).
"""

from __future__ import annotations

import importlib.util
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _smoke():
    spec = importlib.util.spec_from_file_location("wheel_smoke", ROOT / "scripts" / "wheel_smoke.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _check(records, work: Path):
    failed = [f"ditgate {' '.join(r['args'])} -> {r['status']}\n{r.get('output', '')}" for r in records if not r["ok"]]
    assert not failed, "\n\n".join(failed)
    where = next(r for r in records if r["args"] == ["<data root>"])["output"]
    assert where.endswith("site-packages/ditgate/_data") and str(ROOT) not in where, where
    wheel = next((work / "dist").glob("ditgate-*.whl"))
    names = zipfile.ZipFile(wheel).namelist()
    smoke = _smoke()
    for part in smoke.DATA_PARTS:
        assert any(n.startswith(f"ditgate/_data/{part}") for n in names), f"the wheel ships no {part}"
    assert "ditgate/_data/checklists/gates.json" in names
    assert any(n.startswith("ditgate/twin/configs/flux1-dev/") for n in names)
    assert not any("__pycache__" in n for n in names)
    # the gated run read the packaged gate table, passed, and with -q printed nothing at all
    report = (work / "run" / "report.md").read_text()
    assert "**PASS**" in report and "| cache |" in report
    quiet = next(r for r in records if r["args"][:2] == ["run", "zoo:flux"])
    assert quiet["output"] == "", quiet["output"]


def test_wheel_runs_from_outside_the_checkout(tmp_path):
    smoke = _smoke()
    records = smoke.smoke(tmp_path, quick=True)
    _check(records, tmp_path)


@pytest.mark.full
def test_wheel_runs_every_command(tmp_path):
    smoke = _smoke()
    records = smoke.smoke(tmp_path, quick=False)
    _check(records, tmp_path)
    ran = {r["args"][0] for r in records}
    from ditgate.cli import command_modules

    assert set(command_modules()) <= ran, f"commands the smoke run skips: {set(command_modules()) - ran}"


def test_data_root_lookup_order(tmp_path, monkeypatch):
    from ditgate.core import paths
    from ditgate.core.errors import DitgateError

    monkeypatch.delenv(paths.ENV, raising=False)
    assert paths.data_root() == ROOT  # a checkout wins over the packaged copy
    monkeypatch.setenv(paths.ENV, str(tmp_path))
    with pytest.raises(DitgateError, match="holds no checklists/gates.json"):
        paths.data_root()
    (tmp_path / "checklists").mkdir()
    (tmp_path / "checklists" / "gates.json").write_text("{}")
    assert paths.data_root() == tmp_path.resolve()


def test_notebook_run_takes_the_model_as_its_second_word(run_cli):
    code, out, err = run_cli("notebook", "run", "inspect", "zoo:flux", "--model", "zoo:wan")
    assert code == 2 and err.strip().count("\n") == 0 and "two models given" in err
    code, out, err = run_cli("notebook", "run", "inspect")
    assert code == 2 and "no model" in err
