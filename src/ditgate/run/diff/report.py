"""The files of a diff: `diff.md` (every module up to a few past the first divergence), `diff.json` and `diff.png`
(relative error against module order, the tolerance as a line)."""

from __future__ import annotations

import re

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


def _block_of(module: str) -> tuple[str, str | None]:
    """(component, block) of a module path: ("transformer", "transformer_blocks.3") for
    "transformer.transformer_blocks.3.attn.to_q"; block None outside a numbered block list."""
    parts = module.split(".")
    component = re.match(r"\w*", parts[0]).group(0) or parts[0]  # "text_encoder[out]" -> text_encoder
    for i in range(1, len(parts)):
        if parts[i].isdigit():
            return component, ".".join(parts[1:i + 1])
    return component, None


def plot(report: dict[str, Any], path: Path) -> None:
    """diff.png: each module's relative error in execution order (log scale), the tolerance, the first divergence;
    the components (text encoder, transformer, VAE) separated by lines and named, each block of a block list shaded
    in turn with its index, so a jump can be read as "in block 3 of single_transformer_blocks"."""
    import math

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    lines = report["lines"]
    values = [x.get("rel") for x in lines]
    top = max([v for v in values if v is not None and math.isfinite(v)] + [1.0]) * 10
    ys = [math.nan if x.get("skipped") is not None else max(top if v is None or not math.isfinite(v) else v, 1e-12)
          for x, v in zip(lines, values)]  # a per-rank tensor that was not compared leaves a gap
    fig, ax = plt.subplots(figsize=(10, 4))
    owners = [_block_of(x.get("module", "")) for x in lines]
    spans: list[tuple[tuple[str, str | None], int, int]] = []
    for i, owner in enumerate(owners):
        if spans and spans[-1][0] == owner:
            spans[-1] = (owner, spans[-1][1], i)
        else:
            spans.append((owner, i, i))
    shade, last_list = 0, None
    for (component, block), start, end in spans:
        if block is None:
            continue
        shade += 1
        if shade % 2:
            ax.axvspan(start - 0.5, end + 0.5, color="0.88", zorder=0, linewidth=0)
        block_list, number = block.rsplit(".", 1)
        if block_list != last_list:  # a new block list: a dotted boundary and its name inside the plot's top
            if last_list is not None:
                ax.axvline(start - 0.5, color="0.5", linewidth=0.6, linestyle=":")
            ax.text(start, 0.97, block_list.rsplit(".", 1)[-1], transform=ax.get_xaxis_transform(), ha="left",
                    va="top", fontsize=6, color="0.3")
        if end - start >= max(3, len(lines) // 60):  # room for its index above the plot
            ax.text((start + end) / 2, 1.0, number, transform=ax.get_xaxis_transform(), ha="center", va="bottom",
                    fontsize=6, color="0.35")
        last_list = block_list
    components: list[tuple[str, int, int]] = []
    for (component, _), start, end in spans:
        if components and components[-1][0] == component:
            components[-1] = (component, components[-1][1], end)
        else:
            components.append((component, start, end))
    for k, (component, start, end) in enumerate(components):
        if k:
            ax.axvline(start - 0.5, color="0.3", linewidth=0.8)
        if end - start >= len(lines) // 40:
            ax.text(start + 0.5, 0.02, component, transform=ax.get_xaxis_transform(), fontsize=7, color="0.2",
                    ha="left", va="bottom", rotation=90)
    ax.semilogy(range(len(ys)), ys, ".-", lw=0.8, ms=3, zorder=3)
    ax.axhline(report["tolerance"]["rel_max_abs"], color="tab:red", ls="--", lw=0.8, label="tolerance")
    index = _first_index(report)
    if index is not None:
        ax.axvline(index, color="tab:orange", lw=0.8, label=f"first: {report['named']}")
    ax.set_xlim(-0.5, len(ys) - 0.5)
    ax.set_xlabel("module (execution order); shaded: one block each, its index above")
    ax.set_ylabel("relative max-abs error")
    ax.set_title(f"{report['row']} vs {report['baseline']}", pad=14)
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=7, borderaxespad=0)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
