"""ditgate export: an integration file becomes cache-dit's own code in a copy of the installed cache-dit.

Fast tier: the code an export writes (adapter, functor module, planner module, activation lines) for the three
examples outside diffusers, resolved by cache-dit's own registries in a process that never imports ditgate;
exporting twice writes nothing; a tree that already registers the name is refused; a file that fails its rows is
not exported; a read-only tree is refused in one line; both planner registries are activated in full. Full tier:
whole exports (gate run, proof without the file, the written test under pytest alone: a lean tp-2 one, the three
examples, FLUX.3), exporting again, a planted fault that fails the proof, cache-dit's own Flux planners.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import cache_dit
import pytest

from ditgate.export import ExportError, Names, Source, Tree, code_edits

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = {  # integration file, pipeline class, transformer class
    "tinymm": ("examples/tinymm/integration.py", "TinyMMPipeline", "TinyMMTransformer2DModel"),
    "tinyst": ("examples/tinyst/integration.py", "TinySTPipeline", "TinySTTransformer3DModel"),
    "tinymoe": ("examples/tinymoe/integration.py", "TinyMoEPipeline", "TinyMoETransformer2DModel"),
}


def copy_cache_dit(target: Path) -> Path:
    """A copy of the installed cache-dit package's folder (the package only, no bytecode)."""
    shutil.copytree(Path(cache_dit.__file__).parent, target / "cache_dit",
                    ignore=shutil.ignore_patterns("__pycache__"))
    return target


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    tree_dir = copy_cache_dit(tmp_path_factory.mktemp("cache-dit"))
    written = {}
    for name, (file, pipeline, transformer) in EXAMPLES.items():
        tree = Tree.open(tree_dir)
        code_edits(tree, Source.read(ROOT / file), Names.of(pipeline, transformer))
        written[name] = tree.write()
    return tree_dir, written


def _snapshot(root: Path) -> dict[str, str]:
    return {str(p.relative_to(root)): p.read_text() for p in sorted((root / "cache_dit").rglob("*.py"))}


def test_cache_dit_resolves_the_exported_code_without_ditgate(exported):
    tree_dir, written = exported
    assert "cache_dit/distributed/transformers/tinymm.py" in written["tinymm"]
    assert "cache_dit/caching/patch_functors/functor_tinyst.py" in written["tinyst"]  # the pairs patch
    probe = (
        "import json, sys, cache_dit\n"
        "from cache_dit.caching.block_adapters import BlockAdapterRegister as A\n"
        "from cache_dit.distributed.transformers.dispatch import (_ensure_cp_planners_activated,\n"
        "    _ensure_tp_planners_activated)\n"
        "from cache_dit.distributed.transformers.register import (ContextParallelismPlannerRegister as C,\n"
        "    TensorParallelismPlannerRegister as T)\n"
        "_ensure_cp_planners_activated(); _ensure_tp_planners_activated()\n"
        "names = ['TinyMMTransformer2DModel', 'TinySTTransformer3DModel', 'TinyMoETransformer2DModel', "
        "'FluxTransformer2DModel']\n"
        "print(json.dumps({'file': cache_dit.__file__, 'ditgate': 'ditgate' in sys.modules,\n"
        "  'adapters': [k for k in A._adapters if k.startswith('Tiny')],\n"
        "  'cp': [C.get_planner(n).__module__ for n in names], 'tp': [T.get_planner(n).__module__ for n in names]}))\n")
    out = subprocess.run([sys.executable, "-c", probe], cwd=tree_dir, env={"PYTHONPATH": str(tree_dir),
                         "PATH": "/usr/bin:/bin"}, capture_output=True, text=True, check=True)
    found = json.loads(out.stdout.strip().splitlines()[-1])
    assert found["file"] == str(tree_dir / "cache_dit" / "__init__.py") and not found["ditgate"]
    assert found["adapters"] == ["TinyMM", "TinyST", "TinyMoE"]
    mods = "cache_dit.distributed.transformers."
    assert found["cp"] == [mods + "tinymm", mods + "tinyst", mods + "tinymoe", mods + "flux"]  # Flux kept
    assert found["tp"] == [mods + "tinymm", mods + "tinyst", mods + "tinymoe", mods + "flux"]


def test_exporting_twice_writes_nothing(exported):
    tree_dir, _ = exported
    before = _snapshot(tree_dir)
    for file, pipeline, transformer in EXAMPLES.values():
        tree = Tree.open(tree_dir)
        code_edits(tree, Source.read(ROOT / file), Names.of(pipeline, transformer))
        assert tree.changed() == {} and tree.write() == []
    assert _snapshot(tree_dir) == before


def test_a_name_the_tree_already_registers_is_refused(exported, tmp_path):
    tree_dir, _ = exported
    # cache-dit's own "Flux" entries would win over an export for FluxPipeline
    with pytest.raises(ExportError, match="already registers 'Flux'"):
        code_edits(Tree.open(tree_dir), Source.read(ROOT / "examples/plugins/flux_as_new.py"),
                   Names.of("FluxPipeline", "FluxTransformer2DModel"))
    # another file exported under a name the tree holds is refused too (the planner module differs)
    other = tmp_path / "integration.py"
    other.write_text((ROOT / EXAMPLES["tinymoe"][0]).read_text().replace("relayout: bool = True",
                                                                          "relayout: bool = False"))
    with pytest.raises(ExportError, match="already registers 'TinyMoE'"):
        code_edits(Tree.open(tree_dir), Source.read(other), Names.of("TinyMoEPipeline", "TinyMoETransformer2DModel"))


# -- the whole command: gate run, proof without the file, the written test under pytest alone ------------------------
def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "ditgate", *args], capture_output=True, text=True)


@pytest.fixture(scope="module")
def tinymoe_export(tmp_path_factory):
    """zoo:tinymoe (an MoE DiT outside diffusers) exported into a fresh copy of the installed cache-dit."""
    tree_dir = copy_cache_dit(tmp_path_factory.mktemp("tree-moe"))
    out = tmp_path_factory.mktemp("export-moe")
    done = _cli("export", "--integration", str(ROOT / EXAMPLES["tinymoe"][0]), "--model", "zoo:tinymoe",
                "--to", str(tree_dir), "--out", str(out), "--json")
    return tree_dir, out, done


@pytest.mark.full
def test_export_writes_proves_and_passes_its_own_test(tinymoe_export):
    tree_dir, out, done = tinymoe_export
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout)
    assert result["status"] == "exported" and result["gate_passed"] and result["proof_passed"]
    # the proof imported cache-dit from the staged tree, not from site-packages
    assert result["proof_cache_dit"].endswith("/cache_dit") and "site-packages" not in result["proof_cache_dit"]
    assert result["pytest"]["passed"] and "5 passed" in result["pytest"]["summary"]
    written = set(result["written"])
    assert {"cache_dit/distributed/transformers/tinymoe.py", "cache_dit/caching/block_adapters/adapters.py",
            "cache_dit/distributed/transformers/planners.py", "cache_dit/_utils/examples.py",
            "tests/test_tinymoe_parallel.py", "tests/tinymoe_twin/model_index.json",
            "tests/tinymoe_twin/code/tinymoe/transformer_tinymoe.py"} <= written
    assert not any(f.endswith(".safetensors") for f in written)  # the test carries configs, never weights
    patch = (out / "export.patch").read_text()
    assert patch.count("diff --git") == len(written) and "+@BlockAdapterRegister.register(\"TinyMoE\")" in patch
    pr = (out / "PR.md").read_text()
    assert "## Proof: the rows with no integration file" in pr and "| tp-2 | passed |" in pr
    # the written test, run again here by pytest alone on the real tree (no ditgate module in that process)
    code = ("import sys, pytest; rc = pytest.main(['-q', '-p', 'no:cacheprovider', '-k', 'caching_off or tp-2', "
            "sys.argv[1]]); sys.exit(99 if 'ditgate' in sys.modules else rc)")
    again = subprocess.run([sys.executable, "-c", code, str(tree_dir / "tests/test_tinymoe_parallel.py")],
                           capture_output=True, text=True, cwd=tree_dir / "tests",
                           env={"PYTHONPATH": str(tree_dir), "PATH": "/usr/bin:/bin", "HOME": str(tree_dir)})
    assert again.returncode == 0, again.stdout[-3000:]


@pytest.mark.full
def test_exporting_again_is_a_no_op(tinymoe_export):
    tree_dir, _, _ = tinymoe_export
    before = _snapshot(tree_dir)
    again = _cli("export", "--integration", str(ROOT / EXAMPLES["tinymoe"][0]), "--model", "zoo:tinymoe",
                 "--to", str(tree_dir), "--json")
    assert again.returncode == 0 and json.loads(again.stdout)["status"] == "unchanged"
    assert _snapshot(tree_dir) == before


@pytest.mark.full
def test_a_lean_export_proves_only_what_its_rows_cover_and_runs_its_test_alone(tmp_path):
    """zoo:tinymoe with --rows tp-2: the TP planner is exported and proven (no file, the staged tree first on the
    import path; the written test under pytest without ditgate); the adapter and the CP plan, which no chosen row
    proves, are not; exporting again writes nothing."""
    tree_dir = copy_cache_dit(tmp_path / "tree")
    args = ("export", "--integration", str(ROOT / EXAMPLES["tinymoe"][0]), "--model", "zoo:tinymoe", "--to",
            str(tree_dir), "--rows", "tp-2", "--json")
    done = _cli(*args, "--out", str(tmp_path / "out"))
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout)
    assert result["status"] == "exported" and result["gate_passed"] and result["proof_passed"]
    assert "site-packages" not in result["proof_cache_dit"]
    assert result["pytest"]["passed"] and result["pytest"]["summary"].startswith("1 passed, 2 skipped")
    assert [item.split(":")[0] for item in result["left_out"]] == ["block_adapter", "cp_plan"]
    planner = (tree_dir / "cache_dit/distributed/transformers/tinymoe.py").read_text()
    assert "TinyMoETensorParallelismPlanner" in planner and "ContextParallelismPlanner" not in planner
    assert 'register("TinyMoE")' not in (tree_dir / "cache_dit/caching/block_adapters/adapters.py").read_text()
    assert "tests/tinymoe_twin/code/tinymoe/transformer_tinymoe.py" in result["written"]
    assert not any(f.endswith((".safetensors", "integration.py")) for f in result["written"])
    assert (tmp_path / "out" / "export.patch").read_text().count("diff --git") == len(result["written"])
    before = _snapshot(tree_dir)
    again = _cli(*args)
    assert again.returncode == 0 and json.loads(again.stdout)["status"] == "unchanged"
    assert _snapshot(tree_dir) == before
    # an example of the same name that differs (edited since) is refused, not registered twice
    examples = tree_dir / "cache_dit/_utils/examples.py"
    examples.write_text(examples.read_text().replace("num_inference_steps=", "num_inference_steps=1 + "))
    edited = _cli(*args)
    assert edited.returncode == 2 and "already registers the example 'tinymoe'" in edited.stderr


@pytest.mark.full
def test_a_file_that_fails_its_rows_is_not_exported(tmp_path):
    """A TP plan that multiplies gates with gates fails tp-2: exit 1, the table says why, nothing written."""
    fresh = copy_cache_dit(tmp_path / "fresh")
    pristine = _snapshot(fresh)
    bad = _cli("export", "--integration", str(ROOT / "examples/tinymoe/integration_wrong_swiglu_halves.py"),
               "--model", "zoo:tinymoe", "--to", str(fresh), "--rows", "tp-2", "--out", str(tmp_path / "out"))
    assert bad.returncode == 1, bad.stderr[-2000:]
    assert "Not exported: the integration file fails its rows" in bad.stdout and "| tp-2 | failed |" in bad.stdout
    assert _snapshot(fresh) == pristine and not (fresh / "tests").exists()


def test_a_read_only_tree_is_refused_in_one_line(tmp_path):
    tree_dir = copy_cache_dit(tmp_path / "ro")
    command = [sys.executable, "-m", "ditgate", "export", "--integration", str(ROOT / EXAMPLES["tinymm"][0]),
               "--model", "zoo:tinymm", "--to", str(tree_dir)]
    if os.geteuid() == 0:  # root writes through any mode bits: mount the tree read-only in a private namespace
        if shutil.which("unshare") is None:
            pytest.skip("running as root without unshare: no way to make a folder read-only here")
        probe = subprocess.run(["unshare", "-m", "sh", "-c", f"mount --bind -o ro {tree_dir} {tree_dir}"],
                               capture_output=True)
        if probe.returncode != 0:
            pytest.skip("running as root and cannot mount a folder read-only here")
        command = ["unshare", "-m", "sh", "-c", f'mount --bind -o ro "$0" "$0" && exec "$@"', str(tree_dir),
                   *command]
    else:
        for path in [tree_dir, *tree_dir.rglob("*")]:
            path.chmod(path.stat().st_mode & ~0o222)
    before = _snapshot(tree_dir)
    done = subprocess.run(command, capture_output=True, text=True, cwd=tmp_path)
    assert done.returncode == 2, done.stderr
    assert done.stderr.strip().splitlines() == [f"ditgate: error: {tree_dir} is not writable"]
    assert _snapshot(tree_dir) == before


@pytest.mark.full
@pytest.mark.parametrize("name", ["tinymm", "tinyst"])
def test_examples_export_and_prove(name, tmp_path):
    """TinyMM (joint attention with a padding mask, masked ring attention, GQA) and TinyST (a factorized video DiT
    whose temporal blocks split on dimension 0): exported, proven without the file, their tests pass alone."""
    tree_dir = copy_cache_dit(tmp_path / "tree")
    done = _cli("export", "--integration", str(ROOT / EXAMPLES[name][0]), "--model", f"zoo:{name}", "--to",
                str(tree_dir), "--out", str(tmp_path / "out"), "--json")
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout)
    assert result["status"] == "exported" and result["proof_passed"] and result["pytest"]["passed"]
    assert f"cache_dit/distributed/transformers/{name}.py" in result["written"]
    proof = json.loads((tmp_path / "out" / "proof" / "report.json").read_text())
    assert proof["integration"] is None and proof["versions"]["cache_dit_from"] == result["proof_cache_dit"]
    assert {r["name"]: r["status"] for r in proof["rows"] if r.get("phase")} == {
        "cache": "passed", "cp-ulysses-2": "passed", "cp-ring-2": "passed", "tp-2": "passed"}
    probe = ("import json; from cache_dit._utils.examples import ExampleRegister as E; "
             f"print(json.dumps([E.get_default('{name}'), '{name}' in E.list_examples()]))")
    listed = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, cwd=tree_dir,
                            env={"PYTHONPATH": str(tree_dir), "PATH": "/usr/bin:/bin", "HOME": str(tmp_path)})
    assert json.loads(listed.stdout.strip().splitlines()[-1])[1], listed.stderr[-2000:]  # cache-dit-generate's
    if name == "tinyst":  # the pairs patch moved into a functor module; the CP proof saw dimension 0 split
        assert "cache_dit/caching/patch_functors/functor_tinyst.py" in result["written"]
        ulysses = next(r for r in proof["rows"] if r["name"] == "cp-ulysses-2")
        assert "temporal_blocks: 128 on dimension 0 split into 64 per rank" in ulysses["proofs"][0]["detail"]


@pytest.mark.full
def test_cache_dits_own_planners_still_work_in_an_exported_tree(exported, tmp_path):
    """zoo:flux, which cache-dit already supports, through the tree the three examples were exported into: its
    Flux adapter and planners are found and every row passes with no integration file."""
    tree_dir, _ = exported
    done = _cli("run", "zoo:flux", "--cache-dit", str(tree_dir), "--rows", "cache,cp-ulysses-2,tp-2",
                "--out", str(tmp_path / "run"), "--json", "-q")
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
    report = json.loads(done.stdout)
    assert report["integration"] is None
    assert report["versions"]["cache_dit_from"] == str(tree_dir / "cache_dit")
    assert all(r["status"] == "passed" for r in report["rows"] if r.get("phase"))


@pytest.mark.full
def test_a_modular_pipeline_cache_dit_does_not_support_is_exported_as_far_as_it_goes(tmp_path):
    """zoo:flux3, a survey pipeline cache-dit 1.5.3 does not support (modular-only; its name starts with the adapter
    prefix `Flux`, whose adapter refuses it): the adapter goes in ahead of Flux's, cache-dit resolves the exported
    planners for its transformer, the rows pass with no file, the written test passes alone, and PR.md says what
    cache-dit would need for the rest."""
    tree_dir = copy_cache_dit(tmp_path / "tree")
    done = _cli("export", "--integration", str(ROOT / "examples/flux3/integration.py"), "--model", "zoo:flux3",
                "--to", str(tree_dir), "--out", str(tmp_path / "out"), "--json")
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout)
    assert result["status"] == "exported" and result["proof_passed"] and result["pytest"]["passed"]
    assert "cache_dit/_utils/examples.py" not in result["written"]  # cache-dit-generate cannot load it
    assert any("enable_cache to accept a ModularPipeline" in item for item in result["upstream"])
    adapters = (tree_dir / "cache_dit/caching/block_adapters/adapters.py").read_text()
    assert adapters.index('register("Flux3")') < adapters.index('register("Flux")')
    probe = ("from cache_dit.distributed.transformers.dispatch import _ensure_cp_planners_activated as a, "
             "_ensure_tp_planners_activated as b\n"
             "from cache_dit.distributed.transformers.register import ContextParallelismPlannerRegister as C, "
             "TensorParallelismPlannerRegister as T\n"
             "a(); b(); print(C.get_planner('Flux3Transformer2DModel').__module__, "
             "T.get_planner('Flux3Transformer2DModel').__module__)")
    found = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, cwd=tree_dir,
                           env={"PYTHONPATH": str(tree_dir), "PATH": "/usr/bin:/bin", "HOME": str(tmp_path)})
    assert found.stdout.split()[-2:] == ["cache_dit.distributed.transformers.flux3"] * 2, found.stderr[-2000:]
    assert "What cache-dit would need" in (tmp_path / "out" / "PR.md").read_text()


def test_every_tp_planner_is_activated_after_the_cp_ones():
    """cache-dit activates each registry only while it is empty, and a module registers its CP and TP planners
    together: after the CP activation, TP-only modules (Mochi's, an exported TP-only planner) were never imported
    and tp-2 failed 'No planner registered' in the proof of a TP-only export. ditgate activates both in full."""
    code = ("import json\n"
            "from cache_dit.distributed.transformers.dispatch import _ensure_cp_planners_activated as cp, "
            "_ensure_tp_planners_activated as tp\n"
            "from cache_dit.distributed.transformers.register import TensorParallelismPlannerRegister as T\n"
            "def found(): return [n for n, _ in T._tp_planner_registry.items() if n in ('Mochi', 'HunyuanDiT')]\n"
            "cp(); tp(); plain = found()\n"
            "from ditgate.core.plugin import activate_cache_dit_planners\n"
            "activate_cache_dit_planners(); print(json.dumps([plain, found()]))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    plain, ours = json.loads(out.stdout.strip().splitlines()[-1])
    assert plain == [] and sorted(ours) == ["HunyuanDiT", "Mochi"]


@pytest.mark.full
def test_an_export_that_fails_its_proof_writes_nothing(tmp_path):
    """Planted: TinyMoE's TP layout set by a statement the file runs at import. The file passes tp-2 (the statement
    ran); the export moves definitions, not statements, so the proof without the file fails: exit 1, nothing
    written, and PR.md names the statement."""
    text = (ROOT / EXAMPLES["tinymoe"][0]).read_text()
    original = "def tp_plan(transformer, tp_mesh, parallelism_config):\n    return shard_blocks(transformer, tp_mesh)\n"
    assert original in text
    planted = tmp_path / "integration.py"
    planted.write_text(text.replace(original, "LAYOUT = {}\nLAYOUT.update(relayout=True)  # run at import\n\n\n"
                                    "def tp_plan(transformer, tp_mesh, parallelism_config):\n"
                                    "    return shard_blocks(transformer, tp_mesh, relayout=LAYOUT['relayout'])\n"))
    fresh = copy_cache_dit(tmp_path / "tree")
    pristine = _snapshot(fresh)
    done = _cli("export", "--integration", str(planted), "--model", "zoo:tinymoe", "--to", str(fresh), "--rows",
                "tp-2", "--out", str(tmp_path / "out"))
    assert done.returncode == 1, done.stderr[-2000:]
    pr = (tmp_path / "out" / "PR.md").read_text()
    assert "Not exported: the proof failed" in pr and "LAYOUT.update(relayout=True)" in pr
    proof = next(line for line in pr.splitlines() if line.startswith("| tp-2 |") and "KeyError" in line)
    assert "'relayout'" in proof
    assert _snapshot(fresh) == pristine and not (fresh / "tests").exists()


@pytest.mark.full
def test_a_scaffolded_plugin_exports_with_its_helpers_and_proves_without_ditgate(run_cli, tmp_path):
    """The plugin `ditgate scaffold zoo:tinymoe` writes routes attention through cache-dit's dispatcher and runs
    its router on the gathered sequence with helpers written into it (RoutedAttention, GatheredRouting, the
    switches they read). Exported, those helpers move into the planner module with the imports they use: the
    export's gate run, its proof without the file and its written test under pytest without ditgate pass, and no
    written file imports ditgate. The BlockLoop functor the scaffold writes for Chroma moves into a functor
    module that cache-dit's registry resolves in a process without ditgate."""
    plugin = tmp_path / "tinymoe_scaffolded.py"
    code, _, err = run_cli("scaffold", "zoo:tinymoe", "--out", plugin, "--no-run")
    assert code == 0, err
    assert "class RoutedAttention" in plugin.read_text() and "class GatheredRouting" in plugin.read_text()
    tree_dir = copy_cache_dit(tmp_path / "tree")
    done = _cli("export", "--integration", str(plugin), "--model", "zoo:tinymoe", "--to", str(tree_dir),
                "--rows", "cache,cp-ulysses-2,tp-2", "--out", str(tmp_path / "out"), "--json")
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout)
    assert result["status"] == "exported" and result["gate_passed"] and result["proof_passed"], result
    assert result["pytest"]["passed"] and not result["left_out"], result["pytest"]
    planner = (tree_dir / "cache_dit/distributed/transformers/tinymoe.py").read_text()
    for name in ("class RoutedAttention", "def route_attention", "class GatheredRouting", "def gather_routing",
                 "def _cp_config_of", "GATHER_ROUTING = True", "REORDER_MASK = True", "import inspect"):
        assert name in planner, name
    for rel in result["written"]:
        text = (tree_dir / rel).read_text() if rel.endswith(".py") else ""
        assert "import ditgate" not in text and "from ditgate" not in text, rel
    chroma = tmp_path / "chroma_scaffolded.py"
    code, _, err = run_cli("scaffold", "zoo:pipe/chroma", "--out", chroma, "--no-run")
    assert code == 0, err
    tree = Tree.open(tree_dir)
    code_edits(tree, Source.read(chroma), Names.of("MyChromaPipeline", "MyChromaTransformer2DModel"))
    assert "cache_dit/caching/patch_functors/functor_mychroma.py" in tree.write()
    probe = ("import sys\nfrom cache_dit.caching.patch_functors.functor_mychroma import BlockLoop\n"
             "import cache_dit\nassert issubclass(BlockLoop, cache_dit.PatchFunctor)\n"
             "print('ditgate' in sys.modules)\n")
    out = subprocess.run([sys.executable, "-c", probe], cwd=tree_dir, env={"PYTHONPATH": str(tree_dir),
                         "PATH": "/usr/bin:/bin"}, capture_output=True, text=True)
    assert out.returncode == 0 and out.stdout.strip().splitlines()[-1] == "False", out.stderr[-2000:]
