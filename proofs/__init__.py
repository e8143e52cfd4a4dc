"""z3 proofs for tenplex (never imported by `tenplex`): per-plan certificates (`certificate`,
`network`), lemmas over symbolic sizes (`lemmas`), and hand-built sample PTC pairs (`samples`).
`python -m proofs` runs them all."""
