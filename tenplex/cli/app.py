"""The `tenplex` command.

    tenplex compile SRC DST [--emit json|dot|text] [-o FILE] [--no-place-ranks]
                    [--max-message-bytes N] [--memory-budget N] [--baseline reference]
    tenplex verify PLAN SRC DST [--z3] [--execute-limit N]
    tenplex inspect PTC_OR_SPEC
    tenplex spec [SPEC] [--list] [-o FILE]

SRC, DST and PTC_OR_SPEC are PTC JSON files (`"format": "tenplex.ptc/1"`), JSON spec files, or
compact model specs such as `gpt-1.3b:tp2,pp2,dp2@4x4`. Sizes accept `65536`, `64KiB`, `1GiB`.

Errors: a `TenplexError`, an unwritable output or a usage error prints one line
`tenplex: error: <message>` on stderr and exits with code 2. Outputs are computed in full before
the file is written, and written atomically, so an error leaves no file behind.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path
from typing import Any

import click

from tenplex.cli.dataset import dataset
from tenplex.cli.job import job
from tenplex.cli.store import store
from tenplex.compiler import CompileOptions, Plan, check_plan, compile_plan, load_plan
from tenplex.compiler.emit import EMITTERS, human_bytes, plural, table
from tenplex.ir.errors import ParseError, TenplexError
from tenplex.ir.files import read_json, write_atomic
from tenplex.ir.ptc import PTC
from tenplex.ir.serialize import FORMAT as PTC_FORMAT
from tenplex.ir.serialize import dumps, ptc_from_json

EXIT_ERROR = 2
EXECUTE_LIMIT = 256 << 20


def _one_line(message: str) -> str:
    return "; ".join(line.strip() for line in str(message).splitlines() if line.strip())


def _fail(message: str, code: int = EXIT_ERROR) -> None:
    click.echo(f"tenplex: error: {_one_line(message)}", err=True)
    sys.exit(code)


class _Tenplex(click.Group):
    """Runs click in non-standalone mode so that every failure ends in one error line."""

    def main(self, *args: Any, standalone_mode: bool = True, **kwargs: Any) -> Any:
        if not standalone_mode:
            return super().main(*args, standalone_mode=False, **kwargs)
        try:
            code = super().main(*args, standalone_mode=False, **kwargs)
        except click.exceptions.NoArgsIsHelpError as e:
            click.echo(e.ctx.get_help())
            sys.exit(0)
        except click.UsageError as e:
            hint = f" (see '{e.ctx.command_path} --help')" if e.ctx else ""
            _fail(e.format_message() + hint)
        except click.ClickException as e:
            _fail(e.format_message())
        except click.Abort:
            _fail("aborted", 130)
        except TenplexError as e:
            _fail(str(e))
        except OSError as e:
            _fail(f"{e.filename or 'I/O'}: {e.strerror or e}")
        sys.exit(code if isinstance(code, int) else 0)


class _Size(click.ParamType):
    """A byte count: an integer with an optional binary unit (B, K/KiB, M/MiB, G/GiB, T/TiB)."""

    name = "size"
    _UNITS = {"": 0, "b": 0, "k": 10, "kib": 10, "m": 20, "mib": 20, "g": 30, "gib": 30, "t": 40, "tib": 40}

    def convert(self, value: Any, param: Any, ctx: Any) -> int:
        if isinstance(value, int):
            return value
        m = re.fullmatch(r"\s*(\d+)\s*([a-zA-Z]*)\s*", str(value))
        if not m or m[2].lower() not in self._UNITS:
            self.fail(f"{value!r} is not a size such as 65536, 64KiB, 64MiB or 1GiB", param, ctx)
        return int(m[1]) << self._UNITS[m[2].lower()]


SIZE = _Size()


def _frontend() -> Any:
    try:
        from tenplex.frontends import spec
    except ImportError as e:
        raise ParseError(f"model specs need tenplex.frontends, which cannot be imported ({e})") from None
    return spec


def load_state(arg: str) -> PTC:
    """A PTC from a PTC JSON file, a JSON spec file, a compact model spec, or a directory of the
    reference Tenplex's per-rank structure JSON (rank_map.json + rankNN/mp_rank_*.json).

    A file (an existing path, or any name ending in .json) is decoded as JSON: a document with a
    "format" key is parsed as a PTC, any other as a spec. Anything else is a compact spec.
    Raises ParseError or SpecError naming the argument.
    """
    path = Path(arg)
    if path.is_dir() and (path / "rank_map.json").is_file():  # the reference's structure JSON
        from tenplex.frameworks.structure.read import read_structure

        return read_structure(path)[0]
    if not (arg.endswith(".json") or path.is_file()):
        return _frontend().ptc_from_spec(arg)
    root = read_json(path)
    if isinstance(root, dict) and "format" in root:
        if root["format"] != PTC_FORMAT:
            raise ParseError(
                f"{arg}: format: expected {PTC_FORMAT!r} (a PTC) or a spec without a format, got {root['format']!r}"
            )
        return ptc_from_json(root, arg)
    return _frontend().spec_from_json(root, arg).build()


def _write(text: str, output: str | None) -> None:
    """Write to stdout, or atomically to `output` (complete or absent)."""
    if output is None or output == "-":
        click.echo(text, nl=False)
        return
    try:
        write_atomic(output, text)
    except OSError as e:
        raise click.ClickException(f"{output}: cannot write: {e.strerror or e}") from None
    click.echo(f"tenplex: wrote {output} ({human_bytes(len(text.encode()))})", err=True)


@click.group(name="tenplex", cls=_Tenplex, context_settings={"help_option_names": ["-h", "--help"]})
def cli() -> None:
    """Reconfigure the state of multi-dimensional parallel deep-learning jobs with verified,
    minimal plans. SRC/DST are PTC JSON files or model specs such as gpt-1.3b:tp2,pp2,dp2@4x4."""


def _placement_note(plan: Plan, dst: PTC) -> None:
    moved = sum(plan.allocation.mapping[pid] != devs for pid, devs in dst.allocation.items)
    if moved:
        click.echo(f"tenplex: note: place-ranks put {moved} of {len(dst.partitions)} partitions on other devices "
                   "than DST; launch each rank where the plan's allocation puts it", err=True)  # fmt: skip


@cli.command("compile")
@click.argument("src")
@click.argument("dst")
@click.option("--emit", type=click.Choice(sorted(EMITTERS)), default="json", show_default=True, help="Output format.")
@click.option("-o", "--output", metavar="FILE", help="Write here (atomically) instead of stdout.")
@click.option(
    "--place-ranks/--no-place-ranks",
    default=True,
    show_default=True,
    help="Permute dst ranks over dst devices to keep data in place.",
)
@click.option("--max-message-bytes", type=SIZE, help="Largest coalesced message (default 64MiB).")
@click.option("--memory-budget", type=SIZE, help="Peak buffer bytes per host and round (default 1GiB).")
@click.option(
    "--baseline",
    type=click.Choice(["reference"]),
    help="Choose sources as the reference Tenplex does (for comparison).",
)
def compile_cmd(src: str, dst: str, emit: str, output: str | None, place_ranks: bool,
                max_message_bytes: int | None, memory_budget: int | None, baseline: str | None) -> None:  # fmt: skip
    """Compile the plan that turns SRC's state into DST's."""
    sizes = {"max_message_bytes": max_message_bytes, "memory_budget_bytes": memory_budget}
    options = CompileOptions(
        place_ranks=place_ranks, baseline=baseline, **{k: v for k, v in sizes.items() if v is not None}
    )
    src_ptc, dst_ptc = load_state(src), load_state(dst)
    plan = compile_plan(src_ptc, dst_ptc, options)
    text = EMITTERS[emit](plan, src_ptc, dst_ptc)
    _write(text, output)
    _placement_note(plan, dst_ptc)


def _dst_state_bytes(dst: PTC) -> int:
    return sum(dst.nbytes_of(st) * len(dst.devices_of_subtensor(st.id)) for st in dst.subtensors)


def _execute(plan: Plan, src: PTC, dst: PTC, limit: int) -> str:
    size = _dst_state_bytes(dst)
    if size > limit:
        return f"execution: skipped (dst state {human_bytes(size)} exceeds --execute-limit {human_bytes(limit)})"
    from tenplex.runtime.oracle import check_execution

    check_execution(plan, src, dst)
    return f"execution: ok (in-process on arange sources, {human_bytes(size)} of dst state equal to the oracle byte for byte)"


def _certify(plan: Plan, src: PTC, dst: PTC) -> str:
    try:
        import z3  # noqa: F401
    except ImportError:
        raise click.ClickException("--z3 needs the z3-solver package (pip install z3-solver)") from None
    root = str(Path(__file__).resolve().parents[2])
    if (Path(root) / "proofs").is_dir() and root not in sys.path:
        sys.path.append(root)  # proofs/ lives beside tenplex/ in a source checkout
    try:
        from proofs.certificate import CertificateError, certify
    except ImportError as e:
        raise click.ClickException(f"--z3 needs proofs.certificate from a tenplex source checkout ({e})") from None
    try:
        cert = certify(plan, src, dst)
    except CertificateError as e:
        raise click.ClickException(f"z3 certificate failed: {e}") from None
    return (f"z3 certificate: ok ({plural(len(cert.instances), 'dst instance')}, {cert.queries} unsat queries, "
            f"{cert.seconds:.2f} s)")  # fmt: skip


@cli.command()
@click.argument("plan", type=click.Path(dir_okay=False))
@click.argument("src")
@click.argument("dst")
@click.option(
    "--z3", "use_z3", is_flag=True, help="Also certify the exact cover with z3 (needs proofs/ and z3-solver)."
)
@click.option("--execute-limit", type=SIZE, default=EXECUTE_LIMIT,
              help="Execute the plan in-process against the arange oracle when the dst state is at most this big (default 256MiB).")  # fmt: skip
def verify(plan: str, src: str, dst: str, use_z3: bool, execute_limit: int) -> None:
    """Check that PLAN turns SRC's state into DST's (exact cover, messages, stats), and run it
    against the arange oracle when the state is small."""
    the_plan = load_plan(plan)
    src_ptc, dst_ptc = load_state(src), load_state(dst)
    check_plan(the_plan, src_ptc, dst_ptc)
    lines = ["exact cover: ok (check_plan: every dst element written once, messages and stats consistent)"]
    lines.append(_execute(the_plan, src_ptc, dst_ptc, execute_limit))
    if use_z3:
        lines.append(_certify(the_plan, src_ptc, dst_ptc))
    s = the_plan.stats
    lines.append(f"plan verified: {plural(len(the_plan.ops), 'op')}, {plural(len(the_plan.messages), 'message')} in {plural(s.rounds, 'round')}; "
                 f"network {human_bytes(s.network_bytes)} (lower bound {human_bytes(s.network_lower_bound_bytes)})")  # fmt: skip
    click.echo("\n".join(lines))


@cli.command("inspect")
@click.argument("ptc_or_spec")
def inspect_cmd(ptc_or_spec: str) -> None:
    """Describe a PTC, spec or checkpoint directory (tenplex, Megatron-LM, DCP): layout, totals,
    and what deserves a look."""
    if Path(ptc_or_spec).is_dir():
        from tenplex.frameworks.formats import inspect

        click.echo("\n".join(inspect(ptc_or_spec)))
        return
    from tenplex.compiler.emit.describe import describe

    click.echo(describe(load_state(ptc_or_spec)), nl=False)


def _presets() -> str:
    presets = _frontend().PRESETS
    keys = ("kind", "num_layers", "hidden", "heads", "ffn_hidden", "vocab")
    rows = [[name, *(fields.get(k, "") for k in keys)] for name, fields in sorted(presets.items())]
    return (
        table(["preset", "kind", "layers", "hidden", "heads", "ffn", "vocab"], rows, align="llrrrrr", indent="") + "\n"
    )


@cli.command()
@click.argument("spec", required=False)
@click.option("--list", "list_presets", is_flag=True, help="List the model presets.")
@click.option("-o", "--output", metavar="FILE", help="Write SPEC's PTC JSON here instead of stdout.")
def spec(spec: str | None, list_presets: bool, output: str | None) -> None:
    """Print the PTC JSON of a model SPEC (e.g. gpt-tiny:tp2,pp2@1x4), or --list the presets."""
    if list_presets == (spec is not None):
        raise click.UsageError("give either SPEC or --list")
    _write(_presets() if list_presets else dumps(load_state(spec)), output)


@cli.command("reshard")
@click.argument("src_dir", type=click.Path(file_okay=False))
@click.option("--to", "dst", required=True, metavar="DST",
              help="Target layout: tp=4,pp=1[,dp=2][,vpp=2] (Megatron), a DTensor layout JSON (DCP), "
                   "a PTC JSON file or a model spec.")  # fmt: skip
@click.option("--out", "out_dir", required=True, type=click.Path(file_okay=False),
              help="Output checkpoint directory (must not exist; complete or absent).")  # fmt: skip
@click.option("--from", "src_fmt", type=click.Choice(["tenplex", "megatron", "dcp"]),
              help="Format of SRC_DIR (default: detected).")  # fmt: skip
@click.option("--format", "fmt", type=click.Choice(["tenplex", "megatron", "dcp"]),
              help="Format of OUT_DIR (default: SRC_DIR's).")  # fmt: skip
@click.option("--workers", type=click.IntRange(min=1), default=1, show_default=True,
              help="Local workers (1: in-process; >= 2: one agent process each).")  # fmt: skip
@click.option("--central", is_flag=True, help="Baseline (tenplex format only): gather on worker w0, then scatter.")
def reshard_cmd(src_dir: str, dst: str, out_dir: str, src_fmt: str | None, fmt: str | None, workers: int,
                central: bool) -> None:  # fmt: skip
    """Reshard the checkpoint SRC_DIR (tenplex, Megatron-LM or PyTorch DCP) to DST's layout."""
    from tenplex.frameworks.formats import FormatError, convert, detect

    src_fmt = src_fmt or detect(src_dir)
    if src_fmt == "tenplex" and fmt in (None, "tenplex"):
        _reshard_tenplex(src_dir, dst, out_dir, workers, central)
        return
    if central:
        raise FormatError("--central applies to tenplex checkpoint directories only")
    click.echo(convert(src_dir, dst, out_dir, load_state, src_fmt=src_fmt, fmt=fmt, workers=workers))


def _reshard_tenplex(src_dir: str, dst: str, out_dir: str, workers: int, central: bool) -> None:
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from tenplex.runtime.reshard import reshard

    columns = (TextColumn("rounds"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
    with Progress(*columns, console=Console(stderr=True), transient=True) as progress:
        task = progress.add_task("rounds", total=None)

        def on_round(done: int, total: int) -> None:
            progress.update(task, completed=done, total=total)

        result = reshard(src_dir, load_state(dst), out_dir, workers=workers, central=central, on_round=on_round)
    click.echo(result.summary())


@cli.command("agent")
@click.option("--name", required=True, help="The host name plans use for this agent.")
@click.option("--control", required=True, metavar="PATH|HOST:PORT",
              help="Where runtimes connect: a Unix socket path, or HOST:PORT (needs a token).")  # fmt: skip
@click.option("--token-file", type=click.Path(dir_okay=False, exists=True),
              help="File holding the shared token (default $TENPLEX_AGENT_TOKEN).")  # fmt: skip
@click.option("--ucx-ip", metavar="IP", help="Open a UCX TCP listener on IP for agents on other nodes.")
@click.option("--ucx-port", type=click.IntRange(0, 65535), default=0, show_default=True)
@click.option("--rest", metavar="[HOST]:PORT", help="Also serve the store over the REST API here.")
@click.option("--timeout", type=float, default=30.0, show_default=True, help="Seconds any UCX wait may take.")
def agent_cmd(name: str, control: str, token_file: str | None, ucx_ip: str | None, ucx_port: int,
              rest: str | None, timeout: float) -> None:  # fmt: skip
    """Run this host's agent (store + UCX worker [+ REST]) until SIGTERM or a runtime's stop."""
    import os
    from pathlib import Path

    from tenplex.runtime.agent.server import TOKEN_ENV, run_agent

    token = Path(token_file).read_text().strip() if token_file else os.environ.get(TOKEN_ENV)
    run_agent(name, control, token, ucx_ip, ucx_port, rest, timeout)


cli.add_command(dataset)
cli.add_command(job)
cli.add_command(store)


def main(argv: list[str] | None = None) -> None:
    """The console-script entry point."""
    cli.main(args=argv, prog_name="tenplex")


if __name__ == "__main__":
    main()
