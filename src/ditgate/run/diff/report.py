"""The files of a diff: `diff.md` (every module up to a few past the first divergence), `diff.json` and `diff.png`
(relative error against module order, the tolerance as a line)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from ditgate.run.exec import files as store

WINDOW = 3  # modules shown (and kept whole on the second pass) past the first divergence
BEFORE = 2  # and before it


def _first_index(report: dict[str, Any]) -> int | None:
    return next((i for i, x in enumerate(report["lines"]) if x["module"] == report["first"]), None)


def table(report: dict[str, Any], before: int = BEFORE + 1, after: int = WINDOW) -> list[dict[str, Any]]:
    """The lines shown: every module up to a few past the first divergence (the last few when none diverged)."""
    lines, index = report["lines"], _first_index(report)
    if index is None:
        return lines[-(before + after):]
    return lines[:index + after + 1]


def markdown(report: dict[str, Any]) -> str:
    from ditgate.gates.verdicts import format_value

    out = [f"## diff: {report['row']} against {report['baseline']} ({report['dtype']}, {report['device']})", "",
           f"- tolerance: relative max-abs {report['tolerance']['rel_max_abs']:g} ({report['tolerance']['source']})",
           f"- modules compared: {report['modules']}; wall time {report.get('wall_s', 0):.1f} s",
           f"- first divergence: **{report['named'] or 'none'}** — {report['reason']}", "",
           "| # | module | shape | max-abs | rel | PSNR dB | status | gathered |", "|---|---|---|---|---|---|---|---|"]
    for x in table(report):
        mark = " **<-**" if x["module"] == report["first"] else ""
        out.append(f"| {x['index']} | {x['module']}{mark} | {x.get('shape')} | {_num(x.get('max_abs'))} | "
                   f"{_num(x.get('rel'))} | {format_value('psnr', x.get('psnr'))} | {x['status']}"
                   f"{' (exact)' if x.get('exact') else ''} | {x.get('gathered', '')} |")
    return "\n".join(out) + "\n"


def _num(value) -> str:
    return "-" if value is None else f"{value:.3g}"


def write(out: Path, report: dict[str, Any]) -> None:
    from ditgate.gates.verdicts import json_ready

    store.write_text(out / "diff.json", json.dumps(json_ready(report), indent=1))
    store.write_text(out / "diff.md", markdown(report))
    plot(report, out / "diff.png")


def plot(report: dict[str, Any], path: Path) -> None:
    import math

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    lines = report["lines"]
    values = [x.get("rel") for x in lines]
    top = max([v for v in values if v is not None and math.isfinite(v)] + [1.0]) * 10
    ys = [max(top if v is None or not math.isfinite(v) else v, 1e-12) for v in values]
    fig, ax = plt.subplots(figsize=(9, 3.5))
    ax.semilogy(range(len(ys)), ys, ".-", lw=0.8, ms=3)
    ax.axhline(report["tolerance"]["rel_max_abs"], color="tab:red", ls="--", lw=0.8, label="tolerance")
    index = _first_index(report)
    if index is not None:
        ax.axvline(index, color="tab:orange", lw=0.8, label=f"first: {report['named']}")
    ax.set_xlabel("module (execution order)")
    ax.set_ylabel("relative max-abs error")
    ax.set_title(f"{report['row']} vs {report['baseline']}")
    ax.legend(loc="upper left", fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
