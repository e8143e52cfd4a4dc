"""The z3 proof layer: lemmas prove, certificates pass on valid plans and fail, with a
counterexample that a concrete recount confirms, on deliberately broken ones."""

from __future__ import annotations

import attrs
import numpy as np
import pytest
import z3

from tenplex.compiler import CopyOp, FillOp, compile_plan
from tenplex.compiler.plan import Plan
from tenplex.ir import PTC
from tenplex.proofs.certificate import CertificateError, certify
from tenplex.proofs.encode import LocalFrame
from tenplex.proofs.lemmas import LEMMAS, LemmaError, _in, exactly_one, prove
from tenplex.proofs.network import certify_network
from tenplex.proofs.samples import SAMPLES
from tenplex.runtime.arrays import region

pytestmark = pytest.mark.z3


def compiled(name: str) -> tuple[Plan, PTC, PTC]:
    src, dst = SAMPLES[name]()
    return compile_plan(src, dst), src, dst


def broken(plan: Plan, ops) -> Plan:
    return attrs.evolve(plan, ops=tuple(ops))


def write_counts(plan: Plan, dst: PTC, sid: str, device: int) -> np.ndarray:
    """Concrete oracle: how often each local element of (sid, device) is written, through the
    runtime's own piece mapping (`region`)."""
    st = dst.subtensor_map[sid]
    counts = np.zeros(st.shape, dtype=np.int64)
    for op in plan.ops:
        if isinstance(op, FillOp | CopyOp) and (op.dst_subtensor, op.dst_device) == (sid, device):
            if isinstance(op, FillOp):
                counts[op.box.to_slices()] += 1
            else:
                region(counts, st.pieces[op.dst_piece], op.box)[...] += 1
    return counts


def expect_failure(plan: Plan, src: PTC, dst: PTC, match: str, **kw) -> CertificateError:
    with pytest.raises(CertificateError, match=match) as info:
        certify(plan, src, dst, **kw)
    return info.value


@pytest.mark.parametrize("name", sorted(LEMMAS))
def test_lemma_proves(name):
    proved = LEMMAS[name]()
    assert proved.queries > 0


def test_lemma_refutes_a_naive_glu_split():
    """Splitting the fused [W; V] by contiguous rows would put up rows in gate slots."""
    q, n = z3.Ints("q n")
    t, f = 2, 2 * n
    holders = [(_in(q, r * 2 * n, (r + 1) * 2 * n), q - r * 2 * n) for r in range(t)]
    claim = z3.And(exactly_one([h for h, _ in holders]), *[z3.Implies(h, (lo < n) == (q < f)) for h, lo in holders])
    with pytest.raises(LemmaError, match="counterexample"):
        prove("naive glu", claim, [n >= 1, _in(q, 0, 2 * f)])


@pytest.mark.parametrize("name", sorted(SAMPLES))
def test_samples_certify(name):
    plan, src, dst = compiled(name)
    cert = certify(plan, src, dst)
    assert not cert.sampled and cert.queries >= len(cert.instances)
    assert sum(cert.queries_by_subtensor().values()) == cert.queries
    assert certify(plan, src, dst, split_over=0).queries >= cert.queries  # per-piece mode
    assert certify_network(plan, src, dst).queries >= 1


@pytest.mark.parametrize("name", sorted(SAMPLES))
def test_cover_encoding_matches_runtime_mapping(name):
    """z3's `covers` agrees with the runtime's piece views at every local index of every write."""
    plan, _, dst = compiled(name)
    for i, op in enumerate(plan.ops):
        if not isinstance(op, FillOp | CopyOp):
            continue
        st = dst.subtensor_map[op.dst_subtensor]
        want = write_counts(broken(plan, [op]), dst, st.id, op.dst_device)
        frame = LocalFrame(st)
        hit = frame.covers(op)  # creates the flat decode constraints
        solver = z3.Solver()
        solver.add(*frame.decode, hit)
        for x in np.ndindex(*st.shape):
            got = solver.check(*[v == c for v, c in zip(frame.x, x)])
            assert (got == z3.sat) == bool(want[x]), (name, i, x)


def test_dropped_copy_leaves_a_hole():
    plan, src, dst = compiled("tp2_to_tp4_rows")
    e = expect_failure(
        broken(plan, plan.ops[:1] + plan.ops[2:]),
        src,
        dst,
        r"'w/tp1' on device 1: local index \(\d+, \d+\) is covered by 0 writes",
    )
    assert write_counts(broken(plan, plan.ops[:1] + plan.ops[2:]), dst, e.subtensor, e.device)[e.index] == 0


def test_duplicated_fill_writes_twice():
    plan, src, dst = compiled("vocab_padding")
    k = next(i for i, op in enumerate(plan.ops) if isinstance(op, FillOp))
    bad = broken(plan, plan.ops + (plan.ops[k],))
    e = expect_failure(bad, src, dst, "covered by 2 writes")
    assert e.writers == (k, len(plan.ops)) and f"op {k} fill local box" in str(e)
    assert write_counts(bad, dst, e.subtensor, e.device)[e.index] == 2


def test_duplicated_copy_into_flat_piece_writes_twice():
    plan, src, dst = compiled("zero_flat")
    k = next(
        i
        for i, op in enumerate(plan.ops)
        if isinstance(op, CopyOp) and dst.subtensor_map[op.dst_subtensor].pieces[op.dst_piece].flat
    )
    bad = broken(plan, plan.ops + (plan.ops[k],))
    for split_over in (256, 0):
        e = expect_failure(bad, src, dst, "covered by 2 writes", split_over=split_over)
        assert write_counts(bad, dst, e.subtensor, e.device)[e.index] == 2


def test_shifted_copy_box_is_caught():
    plan, src, dst = compiled("tp2_to_tp4_rows")
    shifted = attrs.evolve(plan.ops[1], box=plan.ops[1].box.translate((1, 0)))
    e = expect_failure(
        broken(plan, (plan.ops[0], shifted, *plan.ops[2:])),
        src,
        dst,
        r"global point \(\d+, \d+\) of op 1 copy global box \[\[3, 5\], \[0, 4\]\]",
    )
    assert e.writers == (1,) and not plan.ops[1].box.translate((1, 0)).contains(
        dst.subtensor_map["w/tp1"].pieces[0].global_box
    )


def test_shifted_fill_overlaps_a_copy():
    plan, src, dst = compiled("vocab_padding")
    k = next(i for i, op in enumerate(plan.ops) if isinstance(op, FillOp) and op.box.start[0] > 0)
    bad = broken(
        plan, [attrs.evolve(op, box=op.box.translate((-1, 0))) if i == k else op for i, op in enumerate(plan.ops)]
    )
    e = expect_failure(bad, src, dst, "covered by 2 writes")
    assert write_counts(bad, dst, e.subtensor, e.device)[e.index] == 2


def test_wrong_src_piece_is_caught():
    plan, src, dst = compiled("glu_tp2_to_tp4")
    bad = broken(plan, (attrs.evolve(plan.ops[0], src_piece=1), *plan.ops[1:]))
    e = expect_failure(bad, src, dst, r"op 0 copy .* from 'fc1/tp0' piece 1 .* not held by its source")
    assert e.index is not None and not src.subtensor_map["fc1/tp0"].pieces[1].global_box.contains(plan.ops[0].box)


def test_forward_without_its_predecessor_is_caught():
    plan, src, dst = compiled("dp_two_hosts")
    expect_failure(
        attrs.evolve(plan, edges=()),
        src,
        dst,
        r"\(forward from dst\) is outside its dst piece .* or not held by its source",
    )


def test_write_to_a_device_without_the_subtensor_is_caught():
    plan, src, dst = compiled("tp2_to_tp4_cols")
    expect_failure(
        broken(plan, (attrs.evolve(plan.ops[0], dst_device=3), *plan.ops[1:])), src, dst, "which does not hold it"
    )


def test_network_certificate_catches_a_second_transfer():
    """Replacing an in-host forward by a second network copy keeps the cover exact but sends
    rows into host h1 twice."""
    plan, src, dst = compiled("dp_two_hosts")
    k = next(i for i, op in enumerate(plan.ops) if isinstance(op, CopyOp) and op.src_side == "dst")
    feeder = next(plan.ops[a] for a, b in plan.edges if b == k)
    resend = attrs.evolve(
        plan.ops[k],
        src_side="src",
        src_device=feeder.src_device,
        src_subtensor=feeder.src_subtensor,
        src_piece=feeder.src_piece,
    )
    bad = broken(plan, [resend if i == k else op for i, op in enumerate(plan.ops)])
    certify(bad, src, dst)
    with pytest.raises(CertificateError, match="crosses the network but arrives 2 times"):
        certify_network(bad, src, dst)


def test_sampling_certifies_a_subset():
    plan, src, dst = compiled("glu_tp2_to_tp4")
    cert = certify(plan, src, dst, max_instances=2, seed=1)
    assert cert.sampled and len(cert.instances) == 2 and cert.total_instances == 4


def test_model_spec_plan_certifies():
    spec = pytest.importorskip("tenplex.frontends.spec")
    src, dst = spec.ptc_from_spec("llama-tiny:tp2,dp2,zero1@1x4"), spec.ptc_from_spec("llama-tiny:tp4,dp2,zero1@2x4")
    plan = compile_plan(src, dst)
    cert = certify(plan, src, dst, max_instances=40)
    assert len(cert.instances) == 40
    certify_network(plan, src, dst)
