"""ditgate export: an integration file becomes cache-dit's own code in a copy of the installed cache-dit.

Fast tier: the code an export writes (adapter, functor module, planner module, activation lines) for the three
examples outside diffusers, resolved by cache-dit's own registries in a process that never imports ditgate;
exporting twice writes nothing; a tree that already registers the name is refused.
"""

from __future__ import annotations

import json
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
