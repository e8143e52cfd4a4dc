"""`tenplex inspect` and `tenplex spec`: describe a PTC, spec or checkpoint; print a spec's PTC.

    tenplex inspect PTC_OR_SPEC_OR_DIR [--trust-pickles]
    tenplex spec [SPEC] [--list] [-o FILE]
"""

from __future__ import annotations

from pathlib import Path

import click

from tenplex.cli.common import frontend, load_state, write_output
from tenplex.compiler.emit import table
from tenplex.ir.serialize import dumps


@click.command("inspect")
@click.argument("ptc_or_spec")
@click.option("--trust-pickles", is_flag=True,
              help="Unpickle any class in Megatron rank files and DCP .metadata (they can run code): "
                   "only for checkpoints from a source you trust.")  # fmt: skip
def inspect_cmd(ptc_or_spec: str, trust_pickles: bool) -> None:
    """Describe a PTC, spec or checkpoint directory (tenplex, Megatron-LM, DCP): layout, totals,
    and what deserves a look. A checkpoint that cannot be read is an error (exit code 2)."""
    if Path(ptc_or_spec).is_dir():
        from tenplex.frameworks.formats import inspect

        click.echo("\n".join(inspect(ptc_or_spec, trust_pickles=trust_pickles)))
        return
    from tenplex.compiler.emit.describe import describe

    click.echo(describe(load_state(ptc_or_spec)), nl=False)


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
