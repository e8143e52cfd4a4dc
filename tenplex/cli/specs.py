"""`tenplex inspect` and `tenplex spec`: describe a PTC, spec or checkpoint; print a spec's PTC.

    tenplex inspect PTC_OR_SPEC_OR_DIR [--trust-pickles] [--json]
    tenplex spec [SPEC] [--list] [-o FILE]

`inspect --json` prints one document `tenplex.inspect/1` (docs/cli.md) with the facts of the text:
the source, its kind (`ptc`, `spec` or `checkpoint`), a checkpoint's format and findings, and the
PTC's partitions, totals and notes (`ptc_facts`).
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

import click

from tenplex.cli.common import echo_json, frontend, load_state, write_output
from tenplex.compiler.emit import table
from tenplex.ir.ptc import PTC
from tenplex.ir.serialize import dumps

JSON_FORMAT = "tenplex.inspect/1"


@click.command("inspect")
@click.argument("ptc_or_spec")
@click.option("--trust-pickles", is_flag=True,
              help="Unpickle any class in Megatron rank files and DCP .metadata (they can run code): "
                   "only for checkpoints from a source you trust.")  # fmt: skip
@click.option("--json", "as_json", is_flag=True, help="Print one JSON document (tenplex.inspect/1) instead of text.")
def inspect_cmd(ptc_or_spec: str, trust_pickles: bool, as_json: bool) -> None:
    """Describe a PTC, spec or checkpoint directory (tenplex, Megatron-LM, DCP): layout, totals,
    and what deserves a look. A checkpoint that cannot be read is an error (exit code 2)."""
    from tenplex.compiler.emit.describe import describe

    if Path(ptc_or_spec).is_dir():
        from tenplex.frameworks.formats import inspect, inspect_report

        if not as_json:
            click.echo("\n".join(inspect(ptc_or_spec, trust_pickles=trust_pickles)))
            return
        fmt, findings, ptc = inspect_report(ptc_or_spec, trust_pickles=trust_pickles)
        echo_json({"format": JSON_FORMAT, "source": ptc_or_spec, "kind": "checkpoint", "checkpoint_format": fmt,
                   "findings": findings, "ptc": ptc_facts(ptc, describe(ptc))})  # fmt: skip
        return
    ptc = load_state(ptc_or_spec)
    if not as_json:
        click.echo(describe(ptc), nl=False)
        return
    kind = "ptc" if ptc_or_spec.endswith(".json") or Path(ptc_or_spec).is_file() else "spec"
    echo_json({"format": JSON_FORMAT, "source": ptc_or_spec, "kind": kind, "ptc": ptc_facts(ptc, describe(ptc))})


def ptc_facts(ptc: PTC, description: str) -> dict[str, Any]:
    """The facts `describe(ptc)` states, as JSON: partitions, totals, and its notes (taken from
    `description`, its text, so that both say the same)."""
    partitions = []
    for part in ptc.partitions:
        devices = ptc.allocation.devices_of(part.id)
        hosts = {ptc.topology.host_of(d) for d in devices}
        partitions.append({"id": part.id, "devices": list(devices), "hosts": [h for h in ptc.topology.hosts if h in hosts],
                           "subtensors": len(part.subtensors), "bytes": _bytes(ptc, part),
                           "values": [name for name, _ in part.values]})  # fmt: skip
    count, nbytes = Counter(t.dtype for t in ptc.tensors), Counter()
    for t in ptc.tensors:
        nbytes[t.dtype] += t.nbytes
    notes = description.rpartition("\nnotes:\n")[2].splitlines()
    return {
        "partitions": partitions,
        "totals": {
            "tensors": len(ptc.tensors),
            "logical_bytes": sum(nbytes.values()),
            "by_dtype": {d: {"tensors": count[d], "bytes": nbytes[d]} for d in sorted(count)},
            "subtensors": len(ptc.subtensors),
            "partitions": len(ptc.partitions),
            "held_bytes": sum(p["bytes"] * len(p["devices"]) for p in partitions),
            "devices": len(ptc.topology.devices),
            "devices_holding": len(ptc.allocation.by_device),
            "hosts": list(ptc.topology.hosts),
        },
        "notes": [n.strip().removeprefix("- ") for n in notes if n.strip()],
    }


def _bytes(ptc: PTC, part: Any) -> int:
    return sum(ptc.nbytes_of(ptc.subtensor_map[sid]) for sid in part.subtensors)


def _presets() -> str:
    presets = frontend().PRESETS
    keys = ("kind", "num_layers", "hidden", "heads", "ffn_hidden", "vocab")
    rows = [[name, *(fields.get(k, "") for k in keys)] for name, fields in sorted(presets.items())]
    return (
        table(["preset", "kind", "layers", "hidden", "heads", "ffn", "vocab"], rows, align="llrrrrr", indent="") + "\n"
    )


@click.command()
@click.argument("spec", required=False)
@click.option("--list", "list_presets", is_flag=True, help="List the model presets.")
@click.option("-o", "--output", metavar="FILE", help="Write SPEC's PTC JSON here instead of stdout.")
def spec(spec: str | None, list_presets: bool, output: str | None) -> None:
    """Print the PTC JSON of a model SPEC (e.g. gpt-tiny:tp2,pp2@1x4), or --list the presets."""
    if list_presets == (spec is not None):
        raise click.UsageError("give either SPEC or --list")
    write_output(_presets() if list_presets else dumps(load_state(spec)), output)
