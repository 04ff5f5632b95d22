import gc
import weakref

from ditgate.core import loader
from ditgate.core.model import Model
from ditgate.run.exec import execute
from ditgate.run.define import rows


def test_a_finished_row_frees_its_pipeline(monkeypatch):
    model = Model.open("zoo:flux", steps=2)
    loaded = []
    original = loader.load

    def spy(*args, **kwargs):
        pipe = original(*args, **kwargs)
        loaded.append(weakref.ref(pipe.transformer))
        return pipe

    monkeypatch.setattr(loader, "load", spy)
    gc.disable()  # only run_row's own collection may free it
    try:
        execute.run_row(rows.Row("cache", "cache", cache=rows.DEFAULT_CACHE), model)
        assert loaded[0]() is None, "the row's transformer is still alive after run_row returned"
    finally:
        gc.enable()
