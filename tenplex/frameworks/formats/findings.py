"""Plain-words findings about a checkpoint directory of any format (`tenplex inspect`)."""

from __future__ import annotations

from tenplex.frameworks.formats.kinds import detect
from tenplex.ir.ptc import PTC


def inspect(path: str, *, trust_pickles: bool = False) -> list[str]:
    """Plain-words findings about a checkpoint directory of any format.

    Raises the format reader's error (a TenplexError naming the file) when the checkpoint
    cannot be read; findings that do not stop it from being read are lines of the result."""
    fmt, findings, ptc = inspect_report(path, trust_pickles=trust_pickles)
    if fmt != "tenplex":
        return findings
    from tenplex.compiler.emit.describe import describe

    return [*findings, *describe(ptc).splitlines()]


def inspect_report(path: str, *, trust_pickles: bool = False) -> tuple[str, list[str], PTC]:
    """(format, findings, the PTC of the layout) of a checkpoint directory; `inspect` prints
    the findings (and, for a tenplex directory, the PTC's description). Raises like `inspect`."""
    fmt = detect(path)
    if fmt == "structure":
        from tenplex.frameworks.structure.read import inspect_structure, read_structure

        return fmt, inspect_structure(path), read_structure(path)[0]
    if fmt == "megatron":
        from tenplex.frameworks.megatron.read import read_megatron
        from tenplex.frameworks.megatron.reshard import megatron_findings

        ckpt = read_megatron(path, trust_pickles=trust_pickles)
        return fmt, megatron_findings(ckpt), ckpt.ptc
    if fmt == "deepspeed":
        from tenplex.frameworks.deepspeed.read import read_deepspeed
        from tenplex.frameworks.deepspeed.reshard import deepspeed_findings

        ptc, _, _, meta = read_deepspeed(path, trust_pickles=trust_pickles)
        return fmt, deepspeed_findings(path, meta, ptc), ptc
    if fmt == "megatron-dist":
        from tenplex.frameworks.megatron_dist.describe import findings
        from tenplex.frameworks.megatron_dist.read import read_megatron_dist

        ckpt = read_megatron_dist(path, trust_pickles=trust_pickles)
        return fmt, findings(ckpt), ckpt.ptc
    if fmt == "dcp":
        from tenplex.frameworks.dcp.describe import inspect_dcp
        from tenplex.frameworks.dcp.index import ptc_of_index, read_index

        index = read_index(path, trust_pickles=trust_pickles)  # once: a trusted pickle may do anything
        return fmt, inspect_dcp(path, index=index), ptc_of_index(index)
    if fmt == "hf":
        from tenplex.frameworks.hf.inspect import inspect_hf
        from tenplex.frameworks.hf.read import ptc_of_index as hf_ptc
        from tenplex.frameworks.hf.read import read_index as hf_index

        hf = hf_index(path)
        return fmt, inspect_hf(path, hf), hf_ptc(hf)
    from tenplex.runtime.checkpoint.directory import read_checkpoint

    return fmt, [f"tenplex checkpoint directory {path}"], read_checkpoint(path)[0]
