"""`tenplex store ls|mount`: a saved state or checkpoint directory as a TensorStore, over FUSE.

    tenplex store ls STORE [--json]
    tenplex store mount STORE DIR [--write-back]

STORE is loaded by `tenplex.runtime.checkpoint.store_dir.open_dir` (a `tenplex.save` directory or
a checkpoint directory). `mount` serves the store read-only until SIGINT, SIGTERM or SIGHUP (or an
external unmount), then unmounts and exits 0. It runs in the foreground (start it with `&` to
background it); the mount is tuned for large reads (`tenplex.runtime.fuse.store`) and keeps the
page cache between opens, since only the mount changes its store. With `--write-back` the mount
is writable and on exit `write_back` puts the store back into STORE atomically; further signals
are ignored until that is done. A failed write-back loses the edits made through the mount (exit
2) and leaves STORE as it was.

Errors (missing STORE, DIR not a directory or already a mount point, FUSE unavailable) are one
`StoreDirError` line naming the path, exit status 2. `ls --json` prints one document
`tenplex.store-ls/1` (docs/cli.md): the store, its kind, counts, and every leaf's path, kind,
dtype, shape and bytes.
"""
from __future__ import annotations

import os
import signal
import threading

import click

from tenplex._signals import handling
from tenplex.cli.common import echo_json


# `import tenplex.cli` imports this module: the runtime (numpy I/O, stores, FUSE) loads in the commands
@click.group("store")
def store() -> None:
    """List or mount a saved state (tenplex.save) or a checkpoint directory (ptc.json)."""


@store.command("ls")
@click.argument("src", metavar="STORE")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON document (tenplex.store-ls/1) instead of a table.")
def ls_cmd(src: str, as_json: bool) -> None:
    """List STORE's leaves: path, dtype, shape and bytes (values show as `value`)."""
    from tenplex.compiler.emit import human_bytes, table
    from tenplex.runtime.checkpoint.store_dir import open_dir

    sd = open_dir(src)
    rows, leaves = [], []
    for leaf in sd.store.walk():
        m = sd.store.meta(leaf)
        rows.append([leaf, m.dtype or "value", "" if m.shape is None else str(list(m.shape)), m.nbytes])
        leaves.append({"path": leaf, "kind": m.kind, "dtype": m.dtype, "shape": None if m.shape is None else list(m.shape),
                       "bytes": m.nbytes})  # fmt: skip
    if as_json:
        echo_json({"format": "tenplex.store-ls/1", "store": src, "kind": sd.kind, "tensors": sd.tensors,
                   "bytes": sd.store.nbytes(), "leaves": leaves})  # fmt: skip
        return
    click.echo(f"{src}: {sd.kind}, {sd.tensors} tensors, {human_bytes(sd.store.nbytes())}")
    click.echo(table(["path", "dtype", "shape", "bytes"], rows, align="lllr", indent=""))


def check_mount_point(directory: str) -> str:
    """`directory` resolved; raises StoreDirError unless it is a directory FUSE can mount on."""
    from tenplex.runtime.checkpoint.store_dir import StoreDirError
    from tenplex.runtime.fuse import store as fuse

    real = os.path.realpath(directory)
    if not os.path.isdir(real):
        raise StoreDirError(f"{directory}: {'not a directory' if os.path.exists(real) else 'no such directory'}")
    if fuse.is_mounted(real):
        raise StoreDirError(f"{directory}: already a mount point (unmount it first: fusermount3 -u {real})")
    if (reason := fuse.fuse_unavailable_reason()) is not None:
        raise StoreDirError(f"{directory}: cannot mount: {reason}")
    return real


@store.command("mount")
@click.argument("src", metavar="STORE")
@click.argument("directory", metavar="DIR")
@click.option("--write-back", "writable", is_flag=True,
              help="Mount writable; on exit write the store back to STORE (atomically; unchanged on failure).")  # fmt: skip
def mount_cmd(src: str, directory: str, writable: bool) -> None:
    """Mount STORE at DIR until SIGINT/SIGTERM (read-only unless --write-back)."""
    from tenplex.compiler.emit import human_bytes
    from tenplex.runtime.checkpoint.store_dir import open_dir, write_back
    from tenplex.runtime.fuse import store as fuse

    real = check_mount_point(directory)
    sd = open_dir(src)
    stop = threading.Event()
    with handling(dict.fromkeys((signal.SIGINT, signal.SIGTERM, signal.SIGHUP), lambda *_: stop.set())):
        with fuse.mount(sd.store, real, read_only=not writable, keep_cache=True) as m:
            mode = "read-write, written back on exit" if writable else "read-only"
            click.echo(f"tenplex: mounted {src} at {m}: {sd.tensors} tensors, {human_bytes(sd.store.nbytes())}, {mode}")
            while not stop.wait(0.1) and fuse.is_mounted(m):
                pass
        if writable:  # still under our handlers: a second signal cannot cut the write-back short
            write_back(sd)
            click.echo(f"tenplex: wrote the store back to {src}")
