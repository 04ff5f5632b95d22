import pytest

from ditgate.run.define import rows
from ditgate.run.define.rows import RowError


def test_default_rows_follow_the_integration_order_and_world_sizes():
    names = [r.name for r in rows.DEFAULT_ROWS]
    assert names == ["baseline", "cache", "cp-ulysses-2", "cp-ring-2", "tp-2", "tp-2+tep", "tp-2+vaep",
                     "cache+ulysses-2", "hybrid-u2xtp2"]
    sizes = {r.name: r.world_size for r in rows.DEFAULT_ROWS}
    assert sizes["baseline"] == sizes["cache"] == 1 and sizes["hybrid-u2xtp2"] == 4
    assert all(sizes[n] == 2 for n in names[2:8])


def test_select_adds_baselines_in_dependency_order():
    chosen = [r.name for r in rows.select(rows.DEFAULT_ROWS, "cache+ulysses-2,tp-2+vaep")]
    assert chosen == ["baseline", "cache", "cache+ulysses-2", "baseline-tiled", "tp-2+vaep"]


def test_select_rejects_unknown_rows():
    with pytest.raises(RowError, match="unknown row.*nope"):
        rows.select(rows.DEFAULT_ROWS, "cache,nope")


def test_rows_from_yaml(tmp_path):
    f = tmp_path / "rows.yaml"
    f.write_text("rows:\n"
                 "  - {name: u4, phase: cp, parallel: {ulysses_size: 4}}\n"
                 "  - name: fast-cache\n    phase: cache\n    cache: {Fn_compute_blocks: 1, residual_diff_threshold: 0.3}\n")
    loaded = rows.load_rows(f)
    assert [r.name for r in loaded] == ["u4", "fast-cache"] and loaded[0].world_size == 4
    assert [r.name for r in rows.select(loaded, None)] == ["baseline", "u4", "fast-cache"]


@pytest.mark.parametrize("text, message", [
    ("- {name: x, phase: warp}\n", "unknown phase 'warp'"),
    ("- {name: x, colour: red}\n", "unknown row field"),
    ("- {phase: cp}\n", "needs a name"),
    ("- {name: 'a b', phase: cp}\n", "without spaces"),
    ("- {name: x, phase: tp, parallel: {tp_size: 0}}\n", "positive integer"),
    ("name: x\n", "list of rows"),
    ("- [unclosed\n", "not valid YAML"),
])
def test_bad_rows_file(tmp_path, text, message):
    f = tmp_path / "rows.yaml"
    f.write_text(text)
    with pytest.raises(RowError, match=message):
        rows.load_rows(f)


def test_cycle_is_refused():
    a = rows.Row("a", "cp", baseline="b")
    b = rows.Row("b", "cp", baseline="a")
    with pytest.raises(RowError, match="cycle"):
        rows.select([a, b], "a")


def test_fingerprint_tracks_configuration_not_description():
    a = rows.Row("x", "cache", cache={"Fn_compute_blocks": 1}, description="one")
    b = rows.Row("x", "cache", cache={"Fn_compute_blocks": 1}, description="two")
    c = rows.Row("x", "cache", cache={"Fn_compute_blocks": 2})
    assert a.fingerprint() == b.fingerprint() != c.fingerprint()
