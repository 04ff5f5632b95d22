"""The table of hostile inputs the tests try, per command, counted from the tests' own tables (pytest's collection
of tests/test_bad_inputs.py and tests/test_never_again.py, both tiers), never by hand.

    python scripts/hostile_cases.py            print the table
    python scripts/hostile_cases.py --write    also rewrite it in README.md between the `<!-- hostile-cases -->` markers
"""

from __future__ import annotations

import collections
import re
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
START, END = "<!-- hostile-cases:start -->", "<!-- hostile-cases:end -->"
FILES = ("tests/test_bad_inputs.py", "tests/test_never_again.py")
COMMANDS = {"run", "diff", "inspect", "twin", "checklist", "matrix", "gate", "flops", "zoo", "skill", "lint",
            "export", "scaffold", "serve"}
REFUSED = "exit 2, one line"
# tests of one case each (or a table of their own), by test function: (command, how each case ends)
SINGLE = {
    "test_a_tampered_store_entry_is_computed_again": ("store", "entry removed, row computed again"),
    "test_a_store_that_cannot_be_written_costs_only_time": ("store", "nothing stored, no error"),
    "test_a_server_folder_not_private_is_refused_and_ignored": ("serve", "exit 2, one line; clients ignore it"),
    "test_a_socket_another_user_listens_on_is_ignored": ("serve", "clients ignore it"),
    "test_lint_reports_links_out_of_the_skill_and_broken_links": ("lint", "exit 1, each link named"),
    "test_a_full_disk_says_disk_full_with_the_file": ("run", REFUSED),
    "test_a_run_on_a_full_disk_says_disk_full": ("run", REFUSED),
    "test_corrupt_result_json_is_run_again": ("run", "the row runs again"),
    "test_overwrite_replaces_only_what_ditgate_made": ("zoo", REFUSED),
    "test_skill_force_replaces_only_an_installed_skill": ("skill", REFUSED),
    "test_ditgate_alone_prints_the_help": ("cli", "exit 0, the help"),
    "test_argparse_rejections_are_one_line": ("cli", REFUSED),
}


def classify(item) -> tuple[str, str]:
    name, params, module = item.function.__name__, getattr(getattr(item, "callspec", None), "params", {}), item.module
    if name == "test_bad_input_exits_2_with_one_line":
        first = module.CASES[params["name"]][0][0]
        return (first if first in COMMANDS else "command typo"), REFUSED
    if name == "test_every_model_command_refuses_bad_models_and_options":
        return module.MODEL_CASES[params["name"]][0], REFUSED
    if name == "test_no_row_and_reserved_names_are_refused":
        return params["argv"][0], REFUSED
    if module.__name__.endswith("test_never_again"):
        return "never-again (remote code, phases, lock, orphans, resume, hints)", "exit 2 or the process checked"
    return SINGLE.get(name, ("other", "see the test"))


def count() -> dict[str, collections.Counter]:
    table: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)

    class Collect:
        def pytest_collection_modifyitems(self, items):
            for item in items:
                command, how = classify(item)
                table[command][how] += 1
                table[command]["full" if item.get_closest_marker("full") else "fast"] += 1
            items[:] = []

    code = pytest.main(["--collect-only", "-q", "-p", "no:cacheprovider", "-m", "", *(str(ROOT / f) for f in FILES)],
                       plugins=[Collect()])
    if code not in (0, 5):  # 5: no test left to run, as intended
        sys.exit(f"collecting the tests failed (pytest exit {code})")
    return table


def markdown(table: dict[str, collections.Counter]) -> str:
    lines = ["| command | cases | fast / full tier | how each ends |", "|---|---|---|---|"]
    total = 0
    for command in sorted(table, key=lambda c: (-(table[c]["fast"] + table[c]["full"]), c)):
        row = table[command]
        cases = row["fast"] + row["full"]
        total += cases
        ends = "; ".join(f"{how} ({n})" for how, n in row.items() if how not in ("fast", "full"))
        lines.append(f"| {command} | {cases} | {row['fast']} / {row['full']} | {ends} |")
    lines.append(f"| all | {total} | {sum(r['fast'] for r in table.values())} / "
                 f"{sum(r['full'] for r in table.values())} | |")
    return "\n".join(lines)


def main() -> None:
    text = markdown(count())
    print(text)
    if "--write" in sys.argv[1:]:
        readme = README.read_text()
        block = f"{START}\n{text}\n{END}"
        if START not in readme:
            sys.exit(f"README.md has no {START} marker")
        README.write_text(re.sub(re.escape(START) + r".*?" + re.escape(END), lambda m: block, readme, flags=re.S))


if __name__ == "__main__":
    main()
