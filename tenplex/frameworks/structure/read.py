"""Read the reference Tenplex's per-rank structure directories as PTCs (docs/reference-tenplex.md §2.3, §2.4).

`read_structure(dir)` takes one configuration directory (`.../ppXX/mpXX/dpXX/`), measures the
model and layout from its tensor shapes (`structure.model`: heads assumed = hidden/64 unless
`heads=` is given, see there), builds the frontend's PTC for them (one host holding every rank,
as `read_megatron` does), and checks every tensor leaf of every rank file against that PTC
(`structure.check`). `write_structure` (`structure.write`) is the reverse; `inspect_structure`
says in plain words what a directory holds and what is wrong with it.

Unlike the reference, optimizer state is bound to parameters by name, never by model_keys.json
order; where that order would bind differently, the notes say so.

Invariants (StructureError naming the file and the key path):
- rank_map.json is a full (pp, mp, dp) grid in Megatron's order, and a `ppXX/mpXX/dpXX`
  directory name agrees with it;
- exactly the dp_rank-0 ranks have a rank directory, each with exactly its rank file;
- model_keys.json lists, for each of them, the tensor key paths of the rank's model in order;
- every rank agrees on the iteration; every tensor matches the PTC (`structure.check`).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import attrs

from tenplex.frameworks.megatron.meta import cluster_for
from tenplex.frameworks.megatron.names import Naming
from tenplex.frameworks.structure.check import Checker, Rank, order_note
from tenplex.frameworks.structure.files import (
    MODEL_KEYS,
    RANK_DIR,
    RANK_MAP,
    RankMap,
    StructureError,
    grid_from_dir_name,
    load_json,
    model_key_paths,
    rank_dir_name,
    rank_file_name,
    read_rank_map,
)
from tenplex.frameworks.structure.model import Derived, Options, derive
from tenplex.frameworks.structure.write import write_structure
from tenplex.frontends.model import ModelSpec
from tenplex.frontends.parallel import ParallelConfig
from tenplex.frontends.transformer import build_ptc, stage_params
from tenplex.ir.ptc import PTC

__all__ = ["StructureError", "StructureInfo", "inspect_structure", "read_structure", "write_structure"]


@attrs.frozen
class StructureInfo:
    """What a structure directory says: the measured model and layout, and notes in plain words
    (assumptions such as the head count, the precision, the tied head, reference quirks)."""

    config_dir: Path
    model: ModelSpec
    parallel: ParallelConfig  # fitted: dp is set
    precision: str  # fp16 | bf16 | fp32
    naming: Naming
    iteration: Any
    files: tuple[Path, ...] = attrs.field(converter=tuple)  # every file read, rank files in rank order
    notes: tuple[str, ...] = attrs.field(converter=tuple)

    @property
    def tp(self) -> int:
        return self.parallel.tp

    @property
    def pp(self) -> int:
        return self.parallel.pp

    @property
    def dp(self) -> int:
        return self.parallel.world // (self.tp * self.pp)


def read_structure(config_dir: str | os.PathLike, *, heads: int | None = None, vocab: int | None = None,
                   dtype: str | None = None, tied: bool | None = None) -> tuple[PTC, StructureInfo]:  # fmt: skip
    """The PTC of one configuration directory and what was measured or assumed to build it.

    `heads` (not measurable; default hidden // 64), `vocab` (the true size; default every padded
    row), `dtype` (only used without optimizer state: fp16 | bf16 | fp32 or float names) and
    `tied` (only for mcore names with PP > 1) supply what the shapes do not say. The head count
    changes no shard of multi-head attention (QKV rows split contiguously over TP whatever it
    is; it only decides which TP degrees fit); with grouped-query attention it decides
    query_groups, so pass `heads=` for GQA models (`structure.model` explains).

    Raises:
        StructureError: naming the file and the key path that is missing, malformed or does not
            match the PTC.
    """
    root = Path(config_dir)
    if not root.is_dir():
        raise StructureError(f"{root}: not a directory")
    grid = read_rank_map(root / RANK_MAP)
    named, precision = grid_from_dir_name(root)
    if named is not None and named != grid:
        raise StructureError(f"{root}: the directory names tp={named.tp}, pp={named.pp}, dp={named.dp}, but "
                             f"{RANK_MAP} numbers tp={grid.tp}, pp={grid.pp}, dp={grid.dp}")  # fmt: skip
    files = rank_files(root, grid)
    data = {key: load_json(file, f"rank pp={key[0]}, tp={key[1]}") for key, file in files.items()}
    keys = _model_keys(root / MODEL_KEYS, grid)
    options = Options(heads, vocab, dtype, tied, precision)
    derived = derive([(files[p, 0], data[p, 0]) for p in range(grid.pp)], grid, options)
    notes = [*derived.notes, *_check_ranks(files, data, keys, grid, derived)]
    notes.append("rng_state tensors are not part of the PTC (re-derived per rank)")
    ptc = build_ptc(derived.model, derived.parallel, cluster_for(derived.parallel))
    read = (root / RANK_MAP, root / MODEL_KEYS, *files.values())
    info = StructureInfo(root, derived.model, derived.parallel, derived.precision, derived.naming,
                         data[0, 0].get("iteration"), read, notes)  # fmt: skip
    return ptc, info


def _check_ranks(files: dict[tuple[int, int], Path], data: dict[tuple[int, int], Any], keys: dict[str, Any],
                 grid: RankMap, derived: Derived) -> list[str]:  # fmt: skip
    """Check every rank file and its model_keys.json entry; the notes they give."""
    checker, misbound = Checker(derived.model, derived.parallel, derived.naming), []
    iteration = data[0, 0].get("iteration")
    for (pp, tp), file in files.items():
        rank = Rank(file, data[pp, tp], stage_params(derived.model, derived.parallel, pp), pp, tp)
        by_index = checker.check(rank)
        entry = _check_keys(keys, grid.rank(pp, tp), rank, file.parent.parent / MODEL_KEYS)
        note = order_note(rank, derived.naming, by_index, entry) if by_index else None
        misbound += [note] if note else []
        if rank.data.get("iteration") != iteration:
            raise StructureError(
                f"{file}: key 'iteration' is {rank.data.get('iteration')!r}, rank 0 says {iteration!r}"
            )
    if not misbound:
        return []
    return [f"model_keys.json order, split [weight decay, no weight decay] as the reference binds optimizer state "
            f"(docs/reference-tenplex.md §3.5), differs from binding by name on {len(misbound)} rank(s) ({misbound[0]}); tenplex "
            f"binds by name"]  # fmt: skip


def rank_files(root: Path, grid: RankMap) -> dict[tuple[int, int], Path]:
    """{(pp, tp): rank file} of the dp_rank-0 ranks, in rank order.

    Raises:
        StructureError: a rank file is missing, or a rank directory or file the layout lacks.
    """
    out = {(p, t): root / rank_dir_name(grid.rank(p, t)) / rank_file_name(t, p, grid.pp)
           for p in range(grid.pp) for t in range(grid.tp)}  # fmt: skip
    wanted = {f.parent.name: f.name for f in out.values()}
    for entry in sorted(root.iterdir()):
        m = RANK_DIR.fullmatch(entry.name)
        if m is None:
            continue
        if not entry.is_dir():
            raise StructureError(f"{entry}: a rank directory name, but not a directory")
        if entry.name not in wanted:
            rank = int(m[1])
            why = f"dp_rank {rank // grid.tp % grid.dp} > 0" if rank < grid.world else f"beyond {grid.world} ranks"
            raise StructureError(f"{entry}: unexpected rank directory ({why}: only dp_rank-0 ranks save)")
        for file in sorted(entry.iterdir()):
            if file.suffix == ".json" and file.name != wanted[entry.name]:
                raise StructureError(f"{file}: unexpected rank file (with pp={grid.pp} it is {wanted[entry.name]})")
    for (p, t), file in out.items():
        if not file.is_file():
            raise StructureError(f"{file}: missing (rank {grid.rank(p, t)}: pp={p}, mp={t}, dp=0)")
    return out


def _model_keys(file: Path, grid: RankMap) -> dict[str, Any]:
    doc = load_json(file, "model key order")
    want = {str(grid.rank(p, t)) for p in range(grid.pp) for t in range(grid.tp)}
    if not isinstance(doc, dict):
        raise StructureError(f'{file}: expected an object {{"<rank>": [[key path], ...]}}')
    for key in sorted(doc.keys() ^ want, key=lambda k: (len(k), k)):
        raise StructureError(f"{file}: key '{key}' " + ("missing" if key in want else "is not a dp_rank-0 rank"))
    return doc


def _check_keys(doc: dict[str, Any], rank_id: int, rank: Rank, file: Path) -> list[list[Any]]:
    got, want = doc[str(rank_id)], model_key_paths(rank.data, rank.file)
    if got == want:
        return got
    if not isinstance(got, list) or len(got) != len(want):
        size = len(got) if isinstance(got, list) else type(got).__name__
        raise StructureError(
            f"{file}: key '{rank_id}' lists {size} key paths, {rank.file} has {len(want)} model tensors"
        )
    i = next(i for i, (a, b) in enumerate(zip(got, want)) if a != b)
    raise StructureError(f"{file}: key '{rank_id}/{i}' is {got[i]}, but tensor {i} of {rank.file} is {want[i]}")


def inspect_structure(config_dir: str | os.PathLike) -> list[str]:
    """Plain-words findings: layout, model, precision and notes.

    Raises:
        StructureError: the directory does not read (as `read_structure`): a structure that
            cannot be used is not described as if it could."""
    root = Path(config_dir)
    grid = read_rank_map(root / RANK_MAP)
    out = [f"layout: tp={grid.tp}, pp={grid.pp}, dp={grid.dp} ({grid.world} ranks, {grid.tp * grid.pp} rank files)"]
    _, info = read_structure(root)
    m = info.model
    pos = f"learned positions {m.max_position}" if m.max_position else "RoPE"
    groups = f" in {m.query_groups} query groups" if m.query_groups != m.heads else ""
    out.append(f"model: {m.kind}, {m.num_layers} layers, hidden {m.hidden}, {m.heads} heads{groups} of {m.head_dim}, "
               f"ffn {m.ffn_hidden}{' (swiglu)' if m.glu else ''}, vocab {m.vocab}, {pos}, {m.norm}, "
               f"{'tied' if m.tied_embeddings else 'untied'} head, optimizer {m.optimizer}")  # fmt: skip
    out.append(f"precision: {info.precision}; iteration {info.iteration}; {len(info.files)} files read")
    return out + [f"note: {n}" for n in info.notes] + ["problems: none"]
