"""references/modular_pipeline.md's commands run as written, in full (the full tier): every line of its `bash runnable` fences, on
the installed skill, from another folder (tests/test_skill_fences.py runs the expensive ones dry to stay fast).

They cover the modular route end to end: zoo:flux3 (a Flux3ModularPipeline, no standard class) inspected and gated
with its plugin (cache, cp-ulysses-2), the plugin with the wrong calls-per-step flag failing (`# exits 1`), the
cache checklist and the cache notebook on the modular folder, and the zoo Flux folder inspected and gated as
FluxModularPipeline.
"""

from __future__ import annotations

import pytest
from test_skill_fences import EXITS, LINES, expand

from ditgate.skill import install_skill

ROOT = __import__("pathlib").Path(__file__).resolve().parents[1]
MODULAR = [(rel, line, text) for rel, line, text in LINES if rel == "references/modular_pipeline.md"]


@pytest.fixture(scope="module")
def installed(tmp_path_factory):
    [dest] = install_skill(tmp_path_factory.mktemp("project"), source=ROOT).paths
    return dest, tmp_path_factory.mktemp("elsewhere")


def test_the_reference_shows_the_route():
    texts = " ".join(text for _, _, text in MODULAR)
    for needed in ("inspect zoo:flux3", "--rows cache", "cp-ulysses-2", "integration_wrong_cfg.py", "checklist cache",
                   "notebook run cache", "--pipeline diffusers:FluxModularPipeline"):
        assert needed in texts, needed


@pytest.mark.full  # ~55 s; test_skill_fences runs these lines dry in the fast tier
@pytest.mark.parametrize("rel, line, text", MODULAR, ids=[f"{rel}:{line}" for rel, line, _ in MODULAR])
def test_modular_command_runs_as_written(installed, rel, line, text, monkeypatch, capsys):
    from ditgate.cli import main

    dest, elsewhere = installed
    monkeypatch.chdir(elsewhere)
    monkeypatch.setenv("SKILL_DIR", str(dest))
    match = EXITS.search(text)
    expected = int(match.group(1)) if match else 0
    words = expand(EXITS.sub("", text), dest, elsewhere)
    assert words[0] == "ditgate", text
    args = words[1:]
    if args[0] == "run":
        args += ["--out", str(elsewhere / f"run-{line}")]
    code = main(args)
    out = capsys.readouterr()
    assert code == expected, f"{rel}:{line} `{text}` exited {code}, expected {expected}\n{out.out[-4000:]}\n" \
                             f"{out.err[-4000:]}"
