"""z3 proofs of tenplex's plans: per-plan certificates (`certificate`: every dst element written
exactly once with the right data; `network`: network bytes at the lower bound), lemmas over
symbolic sizes (`lemmas`), and hand-built sample PTC pairs (`samples`). `python -m tenplex.proofs`
runs them all; `tenplex verify PLAN SRC DST --z3` certifies one plan.

Needs the z3-solver package (`pip install 'tenplex[proofs]'`); the rest of tenplex never imports
this package, so it installs and runs without z3.
"""
