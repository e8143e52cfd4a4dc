"""`python -m tenplex.proofs`: prove every lemma and certify the sample plans; print a table.

Exit status 0 when everything is proved, 1 otherwise (each failure's message is printed).
Model-spec plans (`gpt-tiny`, `llama-tiny`) are certified on a deterministic sample of their dst
instances (`--max-instances`) so the whole run stays well under a minute on two cores.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable, Iterator

from tenplex.compiler import compile_plan
from tenplex.ir.errors import TenplexError
from tenplex.proofs.certificate import certify
from tenplex.proofs.lemmas import LEMMAS
from tenplex.proofs.network import certify_network
from tenplex.proofs.samples import SAMPLES, Pair

SPEC_PAIRS = (
    ("gpt-tiny:tp2,pp2@1x4", "gpt-tiny:tp4,dp2@2x4"),
    ("llama-tiny:tp2,dp2,zero1@1x4", "llama-tiny:tp4,dp2,zero1@2x4"),
)

Row = tuple[str, str, str, int, float, str]  # (name, kind, result, queries, seconds, detail)


def spec_pairs() -> Iterator[tuple[str, Callable[[], Pair]]]:
    """(name, builder) of model-spec pairs; none when the frontends are not there."""
    try:
        from tenplex.frontends.spec import ptc_from_spec
    except ImportError:
        return
    for a, b in SPEC_PAIRS:
        yield f"{a} -> {b}", lambda a=a, b=b: (ptc_from_spec(a), ptc_from_spec(b))


def lemma_rows() -> Iterator[Row]:
    for name, lemma in LEMMAS.items():
        t0 = time.perf_counter()
        try:
            proved = lemma()
            yield name, "lemma", "proved", proved.queries, proved.seconds, ""
        except (AssertionError, TenplexError) as e:
            yield name, "lemma", "FAILED", 0, time.perf_counter() - t0, str(e)


def plan_row(name: str, build: Callable[[], Pair], max_instances: int | None, timeout_ms: int) -> Row:
    t0 = time.perf_counter()
    try:
        src, dst = build()
        plan = compile_plan(src, dst)
        cert = certify(plan, src, dst, timeout_ms=timeout_ms, max_instances=max_instances)
        net = certify_network(plan, src, dst, timeout_ms=timeout_ms)
    except (AssertionError, TenplexError) as e:
        return name, "plan", "FAILED", 0, time.perf_counter() - t0, str(e)
    sample = f" (sampled {len(cert.instances)}/{cert.total_instances})" if cert.sampled else ""
    detail = f"{len(cert.instances)} instances{sample}, {len(plan.ops)} ops, network {plan.stats.network_bytes} B = bound {plan.stats.network_lower_bound_bytes} B"
    return name, "plan", "certified", cert.queries + net.queries, time.perf_counter() - t0, detail


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tenplex.proofs", description=__doc__.splitlines()[0])
    parser.add_argument(
        "--max-instances", type=int, default=120, help="dst instances to certify per model-spec plan (default 120)"
    )
    parser.add_argument("--timeout-ms", type=int, default=10_000, help="z3 timeout per query")
    parser.add_argument("--no-lemmas", action="store_true", help="skip the symbolic lemmas")
    args = parser.parse_args(argv)
    began = time.perf_counter()
    rows: list[Row] = [] if args.no_lemmas else list(lemma_rows())
    rows += [plan_row(name, build, None, args.timeout_ms) for name, build in SAMPLES.items()]
    rows += [plan_row(name, build, args.max_instances, args.timeout_ms) for name, build in spec_pairs()]
    print(f"{'name':<58} {'kind':<6} {'result':<10} {'queries':>7} {'seconds':>8}  detail")
    for name, kind, result, queries, seconds, detail in rows:
        print(f"{name:<58} {kind:<6} {result:<10} {queries:>7} {seconds:>8.2f}  {detail}")
    failed = [r for r in rows if r[2] == "FAILED"]
    print(f"{len(rows) - len(failed)}/{len(rows)} proved in {time.perf_counter() - began:.1f} s")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
