import pytest

from ditgate.core import plugin
from ditgate.core.plugin import PluginError


def test_plugin_file_is_imported_once_per_process(tmp_path):
    f = tmp_path / "integ.py"
    f.write_text("COUNT = globals().get('COUNT', 0) + 1\n"
                 "IMPORTS = []\nIMPORTS.append(1)\n"
                 "def block_adapter(pipe):\n    return None\n")
    first = plugin.load(f)
    second = plugin.load(f)
    assert first.block_adapter is second.block_adapter  # the same module object: no second import


def test_plugin_errors(tmp_path):
    with pytest.raises(PluginError, match="does not exist"):
        plugin.load(tmp_path / "missing.py")
    empty = tmp_path / "empty.py"
    empty.write_text("X = 1\n")
    with pytest.raises(PluginError, match="defines none of block_adapter, cp_plan, tp_plan"):
        plugin.load(empty)
    broken = tmp_path / "broken.py"
    broken.write_text("raise RuntimeError('boom')\n")
    with pytest.raises(PluginError, match="importing integration file .* failed: RuntimeError"):
        plugin.load(broken)
    wrong = tmp_path / "wrong.py"
    wrong.write_text("cp_plan = 3\n")
    with pytest.raises(PluginError, match="cp_plan must be a function"):
        plugin.load(wrong)


def test_planners_come_first_and_are_taken_back(tmp_path):
    from cache_dit.distributed.transformers.register import (ContextParallelismPlannerRegister,
                                                              TensorParallelismPlannerRegister)

    f = tmp_path / "plans.py"
    f.write_text("def cp_plan(transformer, pc):\n    return {}\n"
                 "def tp_plan(transformer, mesh, pc):\n    return []\n")
    integration = plugin.load(f)
    cp, tp = ContextParallelismPlannerRegister._cp_planner_registry, TensorParallelismPlannerRegister._tp_planner_registry
    before = (dict(cp), dict(tp))
    assert before[0]["FluxTransformer2DModel"].__name__ == "FluxContextParallelismPlanner"
    undo = integration.register_planners(["FluxTransformer2DModel"])
    assert next(iter(cp)) == "FluxTransformer2DModel" and cp["FluxTransformer2DModel"].__name__ == "PluginCPPlanner"
    assert next(iter(tp)) == "FluxTransformer2DModel" and tp["FluxTransformer2DModel"].__name__ == "PluginTPPlanner"
    undo()
    assert (dict(cp), dict(tp)) == before
