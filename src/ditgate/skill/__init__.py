"""The skill's own tooling: lint it (`ditgate lint`) and install it where agents look (`ditgate skill install`).

May import: `ditgate.core`, and `ditgate.cli` (the linter parses the skill's command lines with the CLI's own
parser).
"""

from ditgate.skill.install import InstallResult, install_skill
from ditgate.skill.rules.lint import RULE_IDS, RULES, Finding, LintConfig, LintReport, lint

__all__ = ["RULES", "RULE_IDS", "Finding", "LintConfig", "LintReport", "lint", "install_skill", "InstallResult"]
