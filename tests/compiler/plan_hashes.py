"""Golden plan hashes: sha256 of `dumps_plan` for a fixed set of problems, so a change to the
compiler can show that it leaves every plan byte-identical.

The set (`problem_set()`): GPT-3 175B at 1024 -> 768 and 2048 -> 1536 GPUs; every named bench case of small size
(the paper's cases, the quick ones) under four option sets; 300 random problems drawn by
hypothesis from `tests.problems` with one fixed seed (and 16 more for the suite's subset). `tests/compiler/plan_hashes.json` holds,
per problem, the sha256 of its inputs (the PTCs' text and the options: so a change of
hypothesis or of the spec frontend shows as changed *inputs*, not as a compiler change) and of
its plan.

    python -m tests.compiler.plan_hashes            # compare every plan with the goldens
    python -m tests.compiler.plan_hashes --write    # record them (only from a known-good commit)
    python -m tests.compiler.plan_hashes --only 175b --only random-00

`tests/compiler/test_plan_hashes.py` compares a small subset in the suite.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import attrs

from tenplex.compiler import CompileOptions, compile_plan, dumps_plan
from tenplex.ir import PTC, dumps

GOLDEN = Path(__file__).with_name("plan_hashes.json")
RANDOM_PROBLEMS = 300
RANDOM_SEED = 20261125
QUICK_RANDOM = 16
QUICK_CASES = ("gpt-1.3b,layers=8 (2,4,2)→(2,4,1)", "gpt-1.3b,layers=8 (2,4,1)→(2,2,1)")
MiB = 1 << 20

OPTION_SETS = {
    "default": CompileOptions(),
    "unplaced": CompileOptions(place_ranks=False),
    "reference": CompileOptions(baseline="reference"),
    "small": CompileOptions(max_message_bytes=MiB, memory_budget_bytes=4 * MiB),
}
BIG = {  # GPT-3 175B pp16 -> pp12 (bench.cases' scaling series)
    "175b 1024->768": ("gpt-175b:tp8,pp16,dp8@128x8", "gpt-175b:tp8,pp12,dp8@96x8"),
    "175b 2048->1536": ("gpt-175b:tp8,pp16,dp16@256x8", "gpt-175b:tp8,pp12,dp16@192x8"),
}

Problem = tuple[str, Callable[[], tuple[PTC, PTC, CompileOptions]]]


def _spec_cases() -> list[tuple[str, str, str]]:
    from bench.cases import COMPILE_CASES, QUICK_COMPILE_CASES, bytes_cases, paper_cases

    small = [c for c in COMPILE_CASES if c.gpus is None]
    cases = paper_cases() + bytes_cases(quick=True) + QUICK_COMPILE_CASES + small
    return [(c.name, c.src, c.dst) for c in cases]


def _from_specs(src: str, dst: str, options: CompileOptions) -> Callable[[], tuple[PTC, PTC, CompileOptions]]:
    def build() -> tuple[PTC, PTC, CompileOptions]:
        from tenplex.frontends.spec import ptc_from_spec

        return ptc_from_spec(src), ptc_from_spec(dst), options

    return build


def random_problems(n: int = RANDOM_PROBLEMS) -> list[tuple[PTC, PTC, CompileOptions]]:
    """The first `n` (problem, options) pairs that hypothesis draws with `RANDOM_SEED`."""
    from hypothesis import HealthCheck, Phase, given, seed, settings

    from tests.problems import compile_options, problems

    drawn: list[tuple[PTC, PTC, CompileOptions]] = []

    @seed(RANDOM_SEED)
    @settings(max_examples=n, database=None, phases=[Phase.generate], deadline=None, derandomize=False,
              suppress_health_check=list(HealthCheck))  # fmt: skip
    @given(problems(), compile_options())
    def draw(problem, options) -> None:
        drawn.append((*problem, options))

    with _no_local_constants():
        draw()
    return drawn


@contextlib.contextmanager
def _no_local_constants() -> Iterator[None]:
    """Hypothesis mixes literals of the modules loaded so far (tenplex's, the suite's helpers')
    into what it draws, so the same seed drew other problems after other tests had run, and
    would after any edit of a literal in tenplex. Drawing with none makes the set depend on
    the seed and hypothesis's version only (a version change shows as changed inputs)."""
    from hypothesis.internal.conjecture import providers

    saved = providers._get_local_constants
    providers._get_local_constants = providers.Constants
    providers.CONSTANTS_CACHE.cache.clear()  # allowed constants computed with the local ones
    try:
        yield
    finally:
        providers._get_local_constants = saved
        providers.CONSTANTS_CACHE.cache.clear()


def _random(prefix: str, n: int) -> Iterator[Problem]:
    drawn: list = []  # drawn on first use (hypothesis takes ~40 ms a problem)
    for i in range(n):

        def build(i: int = i) -> tuple[PTC, PTC, CompileOptions]:
            if not drawn:
                drawn.extend(random_problems(n))
            return drawn[i]

        yield f"{prefix}-{i:03d}", build


def problem_set(quick: bool = False) -> Iterator[Problem]:
    """(name, build) for every problem, in a fixed order; `build` makes its inputs. `quick`:
    the suite's subset (two small cases under every option set, `QUICK_RANDOM` random ones:
    hypothesis draws another sequence for another count, so they have their own names)."""
    if not quick:
        for name, (src, dst) in BIG.items():
            yield name, _from_specs(src, dst, CompileOptions())
    for name, src, dst in _spec_cases():
        if not quick or name in QUICK_CASES:
            for label, options in OPTION_SETS.items():
                yield f"{name} [{label}]", _from_specs(src, dst, options)
    if not quick:
        yield from _random("random", RANDOM_PROBLEMS)
    yield from _random("quick-random", QUICK_RANDOM)


def sha(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def hashes(src: PTC, dst: PTC, options: CompileOptions) -> dict[str, str]:
    """sha256 of the inputs (both PTCs' text and the options) and of the compiled plan's JSON."""
    inputs = dumps(src) + dumps(dst) + json.dumps(attrs.asdict(options), sort_keys=True)
    return {"inputs": sha(inputs), "plan": sha(dumps_plan(compile_plan(src, dst, options)))}


def load_golden() -> dict[str, dict[str, str]]:
    return json.loads(GOLDEN.read_text())


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--write", action="store_true", help="record the goldens instead of comparing")
    ap.add_argument("--quick", action="store_true", help="only the suite's subset")
    ap.add_argument("--only", action="append", default=[], help="problems whose name contains this (repeatable)")
    args = ap.parse_args(argv)
    golden = {} if args.write else load_golden()
    got, bad = {}, []
    for name, build in problem_set(args.quick):
        if args.only and not any(s in name for s in args.only):
            continue
        got[name] = h = hashes(*build())
        want = golden.get(name)
        if not args.write and h != want:
            what = "inputs changed (regenerate from a known-good commit)" if want and h["inputs"] != want["inputs"] else "PLAN CHANGED"
            bad.append(name)
            print(f"{name}: {what}", flush=True)
    if args.write:
        GOLDEN.write_text(json.dumps(load_golden() | got if GOLDEN.exists() else got, indent=1, sort_keys=True) + "\n")
        print(f"wrote {len(got)} hashes to {GOLDEN}")
        return 0
    print(f"{len(got) - len(bad)} of {len(got)} plans byte-identical")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
