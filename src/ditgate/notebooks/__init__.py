"""Notebooks: what the cells of `notebooks/NN_phase.ipynb` call (`from ditgate import notebooks as nb`), and running
the notebooks in order with papermill.

May import: `ditgate.core`, `ditgate.zoo`, `ditgate.gates`, `ditgate.inspect`, `ditgate.run`, `ditgate.perf`.
Never imports `ditgate.checklists` or `ditgate.commands`.
"""

from ditgate.notebooks.catalog import NOTEBOOKS, ROW_PHASE, GateFailed, Notebook, NotebookError, find, notebooks_dir
from ditgate.notebooks.cells import (
    collect,
    finish,
    inspect,
    inspect_result,
    phase_rows,
    results_dir,
    results_table,
    run_matrix,
    run_phase,
    show,
    show_results,
)
from ditgate.notebooks.execution import (
    Outcome,
    choose_kernel,
    failure,
    notebook_parameters,
    parameters,
    run_notebooks,
    summary,
)

__all__ = ["NOTEBOOKS", "ROW_PHASE", "Notebook", "find", "notebooks_dir", "GateFailed", "NotebookError", "collect",
           "finish", "inspect", "inspect_result", "phase_rows", "results_dir", "results_table", "run_matrix",
           "run_phase", "show", "show_results", "Outcome", "choose_kernel", "failure", "notebook_parameters",
           "parameters", "run_notebooks", "summary"]
