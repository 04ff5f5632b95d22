import pytest

from ditgate import plugin
from ditgate.plugin import PluginError


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
