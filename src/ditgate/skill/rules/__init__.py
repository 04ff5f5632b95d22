"""The skill linter's rules and the run that applies them (`lint`): API names and values cache-dit must accept
(`apis`, `classnames`, `values`), command lines the CLI must parse (`commandlines`), links and routes (`links`,
`reading`), gate claims that must equal gates.json (`thresholds`), and the phases as data (`phases`).

May import: `ditgate.core`, `ditgate.skill` (the parsed skill and its spec), `ditgate.cli` (its parser).
"""
