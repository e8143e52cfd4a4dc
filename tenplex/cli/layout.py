"""`tenplex layout`: the DTensor layout of a DCP (or Hugging Face) checkpoint, the file `tenplex reshard --to` takes.

    tenplex layout DCP_DIR [-o FILE] [--trust-pickles]

Prints the `tenplex.dtensor-layout/1` document of the layout DCP_DIR has now
(`frameworks.dtensor.mesh.source_layout`: the mesh its chunks suggest, the placements of each
tensor it cuts, `"*"` replicating the rest), one rule per line: a starting point to edit (the
mesh sizes, a placement) and pass to `tenplex reshard DCP_DIR --to FILE --out OUT`. The format,
with a worked example: docs/formats.md. Reads `.metadata` only, never tensor data.
"""

from __future__ import annotations

import json

import click

from tenplex.cli.common import write_output


def dumps_layout(doc: dict) -> str:
    """The layout JSON with one placement rule per line (easy to edit and to diff)."""
    rules = [f"    {json.dumps(k)}: {json.dumps(v)}" for k, v in doc["placements"].items()]
    return "\n".join([
        "{",
        f'  "format": {json.dumps(doc["format"])},',
        f'  "mesh": {json.dumps(doc["mesh"])},',
        '  "placements": {',
        ",\n".join(rules),
        "  }",
        "}",
    ]) + "\n"  # fmt: skip


@click.command("layout")
@click.argument("src_dir", metavar="DCP_DIR", type=click.Path(file_okay=False))
@click.option("-o", "--output", metavar="FILE", help="Write the layout here instead of stdout (atomically).")
@click.option("--trust-pickles", is_flag=True,
              help="Unpickle any class in DCP .metadata (it can run code): only for checkpoints from a source you trust.")  # fmt: skip
def layout_cmd(src_dir: str, output: str | None, trust_pickles: bool) -> None:
    """Print the DTensor layout (mesh, placements per FQN) of the DCP checkpoint DCP_DIR: edit
    the mesh and pass the file to `tenplex reshard DCP_DIR --to FILE`."""
    from tenplex.frameworks.dcp.index import ptc_of_index, read_index
    from tenplex.frameworks.dtensor.mesh import source_layout
    from tenplex.frameworks.formats import FormatError, detect

    fmt = detect(src_dir)
    if fmt == "hf":
        from tenplex.frameworks.hf.read import ptc_of_index as hf_ptc
        from tenplex.frameworks.hf.read import read_index as hf_index

        ptc = hf_ptc(hf_index(src_dir))
    elif fmt == "dcp":
        ptc = ptc_of_index(read_index(src_dir, trust_pickles=trust_pickles))
    else:
        raise FormatError(f"{src_dir}: a {fmt} checkpoint, not DCP or Hugging Face: DTensor layouts are for those "
                          "(reshard --to takes tp=N,pp=M for Megatron, a PTC JSON file or model spec otherwise)")  # fmt: skip
    layout = source_layout(ptc)
    write_output(dumps_layout(layout.to_json()), output)
