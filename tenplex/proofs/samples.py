"""Hand-built (src, dst) PTC pairs for the certificates: small, named, one layout feature each.

Every sample is a complete pair that `compile_plan` accepts. Builders take plain tuples so a
sample reads like its layout table: `_sub(id, tensor, shape, [(global_box, local_box), ...])`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from tenplex.ir import PTC, Allocation, Box, Device, Partition, Piece, SubTensor, TensorMeta, Topology, row_major_boxes

Pair = tuple[PTC, PTC]
BoxLike = tuple[Sequence[int], Sequence[int]]


def _box(b: BoxLike) -> Box:
    return Box(tuple(b[0]), tuple(b[1]))


def _sub(sid: str, tensor: str, shape: Sequence[int], pieces: Sequence[tuple[BoxLike, BoxLike]]) -> SubTensor:
    return SubTensor(sid, tensor, sid, tuple(shape), tuple(Piece(_box(g), _box(lo)) for g, lo in pieces))


def _ptc(
    tensors: dict[str, tuple[int, ...]],
    parts: dict[str, tuple[list[SubTensor], tuple[int, ...]]],
    hosts: dict[int, str],
) -> PTC:
    """`parts`: partition id -> (its sub-tensors, the devices holding it)."""
    return PTC(
        tensors=[TensorMeta(n, s, "float32") for n, s in tensors.items()],
        subtensors=[st for subs, _ in parts.values() for st in subs],
        partitions=[Partition(pid, [st.id for st in subs]) for pid, (subs, _) in parts.items()],
        allocation=Allocation({pid: devs for pid, (_, devs) in parts.items()}),
        topology=Topology(tuple(Device(d, h) for d, h in hosts.items())),
    )


def _rows(lo: int, hi: int, cols: int) -> BoxLike:
    return ((lo, 0), (hi, cols))


def _split_ptc(
    shape: tuple[int, int], tp: int, dim: int, devices: Sequence[Sequence[int]], hosts: dict[int, str]
) -> PTC:
    """Tensor `w` of `shape` split evenly along `dim` over `tp` ranks (rank r on devices[r])."""
    n = shape[dim] // tp
    local = tuple(n if d == dim else s for d, s in enumerate(shape))
    parts = {}
    for r in range(tp):
        start = tuple(r * n if d == dim else 0 for d in range(2))
        stop = tuple((r + 1) * n if d == dim else s for d, s in enumerate(shape))
        parts[f"tp{r}"] = ([_sub(f"w/tp{r}", "w", local, [((start, stop), ((0, 0), local))])], tuple(devices[r]))
    return _ptc({"w": shape}, parts, hosts)


HOSTS4 = {0: "h0", 1: "h0", 2: "h1", 3: "h1"}
HOSTS6 = {0: "h0", 1: "h0", 2: "h1", 3: "h1", 4: "h2", 5: "h2"}


def tp2_to_tp4_rows() -> Pair:
    return _split_ptc((8, 4), 2, 0, [[0], [1]], HOSTS4), _split_ptc((8, 4), 4, 0, [[0], [1], [2], [3]], HOSTS4)


def tp2_to_tp4_cols() -> Pair:
    return _split_ptc((4, 8), 2, 1, [[0], [1]], HOSTS4), _split_ptc((4, 8), 4, 1, [[0], [1], [2], [3]], HOSTS4)


def dp_two_hosts() -> Pair:
    """tp2 on host h0 -> dp4 (whole tensor replicated) on hosts h1 and h2: each host needs every
    row on two devices, so the plan sends it once per host and forwards it inside the host."""
    return _split_ptc((8, 4), 2, 0, [[0], [1]], HOSTS6), _split_ptc((8, 4), 1, 0, [[2, 3, 4, 5]], HOSTS6)


def _vocab_ptc(vocab: int, hidden: int, tp: int, multiple: int, devices: Sequence[int]) -> PTC:
    padded = -(-vocab // (multiple * tp)) * multiple * tp
    n = padded // tp
    parts = {}
    for r in range(tp):
        lo, hi = r * n, min((r + 1) * n, vocab)
        pieces = [(_rows(lo, hi, hidden), _rows(0, hi - lo, hidden))] if lo < hi else []
        parts[f"tp{r}"] = ([_sub(f"emb/tp{r}", "emb", (n, hidden), pieces)], (devices[r],))
    return _ptc({"emb": (vocab, hidden)}, parts, HOSTS4)


def vocab_padding() -> Pair:
    """V=10 rows padded to a multiple of 4·t: tp2 pads to 16 (8 a rank), tp4 to 16 (4 a rank)."""
    return _vocab_ptc(10, 3, 2, 4, [0, 1]), _vocab_ptc(10, 3, 4, 4, [0, 1, 2, 3])


def _glu_ptc(f: int, hidden: int, tp: int, devices: Sequence[int]) -> PTC:
    n = f // tp
    parts = {}
    for r in range(tp):
        pieces = [
            (_rows(r * n, (r + 1) * n, hidden), _rows(0, n, hidden)),
            (_rows(f + r * n, f + (r + 1) * n, hidden), _rows(n, 2 * n, hidden)),
        ]
        parts[f"tp{r}"] = ([_sub(f"fc1/tp{r}", "fc1", (2 * n, hidden), pieces)], (devices[r],))
    return _ptc({"fc1": (2 * f, hidden)}, parts, HOSTS4)


def glu_tp2_to_tp4() -> Pair:
    """SwiGLU fc1 [W; V] with f=8: rank r holds [W_r; V_r] as two pieces."""
    return _glu_ptc(8, 3, 2, [0, 1]), _glu_ptc(8, 3, 4, [0, 1, 2, 3])


def _flat_ptc(shape: tuple[int, int], cuts: Sequence[int], devices: Sequence[int]) -> PTC:
    """`w` flattened row-major and cut at `cuts` into 1-D fragments (a ZeRO buffer)."""
    parts = {}
    for r, (a, b) in enumerate(zip(cuts, cuts[1:])):
        pieces, at = [], 0
        for box in row_major_boxes(shape, a, b):
            pieces.append(((box.start, box.stop), ((at,), (at + box.volume,))))
            at += box.volume
        parts[f"dp{r}"] = ([_sub(f"w/dp{r}", "w", (b - a,), pieces)], (devices[r],))
    return _ptc({"w": shape}, parts, HOSTS4)


def zero_flat() -> Pair:
    """tp2 column split of a 6x4 -> three flat fragments [0,6) [6,18) [18,24) (rows 2..3 whole)."""
    return _split_ptc((6, 4), 2, 1, [[0], [1]], HOSTS4), _flat_ptc((6, 4), [0, 6, 18, 24], [1, 2, 3])


def zero_unflat() -> Pair:
    """The reverse: flat fragments -> tp2 rows (flat src pieces)."""
    return _flat_ptc((6, 4), [0, 6, 18, 24], [1, 2, 3]), _split_ptc((6, 4), 2, 0, [[0], [3]], HOSTS4)


SAMPLES: dict[str, Callable[[], Pair]] = {
    "tp2_to_tp4_rows": tp2_to_tp4_rows,
    "tp2_to_tp4_cols": tp2_to_tp4_cols,
    "dp_two_hosts": dp_two_hosts,
    "vocab_padding": vocab_padding,
    "glu_tp2_to_tp4": glu_tp2_to_tp4,
    "zero_flat": zero_flat,
    "zero_unflat": zero_unflat,
}
