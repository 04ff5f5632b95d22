import gc
import weakref

from ditgate import zoo
from ditgate.run.exec import execute
from ditgate.core import request
from ditgate.run.define import rows


def test_a_finished_row_frees_its_pipeline(monkeypatch):
    path = zoo.materialize("zoo:flux")
    req = request.build(zoo.read_meta(path), steps=2)
    loaded = []
    original = execute.load

    def spy(*args, **kwargs):
        pipe = original(*args, **kwargs)
        loaded.append(weakref.ref(pipe.transformer))
        return pipe

    monkeypatch.setattr(execute, "load", spy)
    gc.disable()  # only run_row's own collection may free it
    try:
        execute.run_row(rows.Row("cache", "cache", cache=rows.DEFAULT_CACHE), path, req)
        assert loaded[0]() is None, "the row's transformer is still alive after run_row returned"
    finally:
        gc.enable()
