"""A reader of dataset FUSE views in its own process (a process must not read, with numpy, a
mount it serves). Plain Python and numpy only, so that it starts fast: no tenplex import.

Reads one JSON command per line on stdin and answers one JSON line on stdout. Bytes are reported
as sha256 hex digests; "ENOENT" (etc.) stands for a failed call. Commands:
    {"op": "view", "dir": D}          one whole view, by the generation seqlock (retries races):
                                      {"state", "files": {"step-S/NAME": [sha, size, loaded]},
                                      "steps": {"step-S.bin": STEP}} where `loaded` digests what
                                      numpy.load returns (or null)
    {"op": "snapshot", "dir": D}      one attempt, no retry: {"before", "after" (generations),
                                      "dirs": {step: [names]}, "files": {"step-S/NAME": sha},
                                      "steps": {"step-S.bin": STEP}}
A step file (STEP) is parsed here by the layout that docs/dataset.md documents, not by tenplex:
[generation, step, world, rank, [[id, sha], ...]], or "EBADMSG" where it breaks the layout.
    {"op": "ranges", "dir": D}        D/ranges.bin parsed here by its documented layout, each
                                      sample read from D/sources/FFFFFF by its range:
                                      {"step-S.bin": STEP} (what the step files must hold)
    {"op": "race", "dir": D, "count": N}   N snapshots back to back
    {"op": "open", "path": P}         keep P open; {"op": "read_open"} digests it from offset 0
    {"op": "opendir", "path": P}      keep directory P open; {"op": "listdir_open"} lists it
    {"op": "close"}                   close what "open" and "opendir" kept
    {"op": "cat", "path": P}          digest of P's bytes
    {"op": "state", "dir": D}         D/.state.json, parsed
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import sys

import numpy as np

STATE = ".state.json"


def digest(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def loaded_digest(path: str) -> str | None:
    """A digest of what numpy.load returns for a .npy/.npz file (arrays in name order)."""
    if not path.endswith((".npy", ".npz")):
        return None
    loaded = np.load(path, allow_pickle=False)
    if isinstance(loaded, np.ndarray):
        return digest(loaded.dtype.str.encode() + repr(loaded.shape).encode() + loaded.tobytes())
    with loaded:
        return digest(b"".join(n.encode() + loaded[n].tobytes() for n in sorted(loaded.files)))


def generation(root: str) -> int:
    with open(os.path.join(root, STATE), "rb") as f:
        return json.loads(f.read())["generation"]


def attempt(call, *args):
    try:
        return call(*args)
    except OSError as e:
        return errno.errorcode.get(e.errno, str(e.errno))


def read_bytes(path: str) -> bytes:
    with open(path, "rb") as f:
        return f.read()


def step_file(path: str) -> list:
    """[generation, step, world, rank, [[id, sha], ...]] of the step file at `path`."""
    data = read_bytes(path)
    if len(data) < 64 or data[:8] != b"TPLXSTEP":
        raise OSError(errno.EBADMSG, path)
    version, gen, step, world, rank, n, start = np.frombuffer(data, "<u8", 7, 8).tolist()
    rows = np.frombuffer(data, "<u8", 3 * n, 64).reshape(n, 3).tolist()
    ends = [start, *(o + k for _, o, k in rows)]
    if version != 1 or start % 4096 or any(data[64 + 24 * n : start]) or [o for _, o, _ in rows] != ends[:-1] or ends[-1] != len(data):
        raise OSError(errno.EBADMSG, path)
    return [gen, step, world, rank, [[i, digest(data[o : o + k])] for i, o, k in rows]]


def ranges(root: str) -> dict:
    """{"step-S.bin": STEP} of every step in `root`/ranges.bin, each sample read from its source."""
    data = read_bytes(os.path.join(root, "ranges.bin"))
    if len(data) < 80 or data[:8] != b"TPLXRNGS":
        raise OSError(errno.EBADMSG, root)
    version, gen, world, rank, first, steps, n, sources, width = np.frombuffer(data, "<u8", 9, 8).tolist()
    starts = np.frombuffer(data, "<u8", steps + 1, 80).tolist()
    rows = np.frombuffer(data, "<u8", 4 * n, 80 + 8 * (steps + 1)).reshape(n, 4).tolist()
    if version != 1 or width != 4 or len(data) != 80 + 8 * (steps + 1) + 32 * n or starts[-1] != n:
        raise OSError(errno.EBADMSG, root)
    fds = {f: os.open(os.path.join(root, "sources", f"{f:06d}"), os.O_RDONLY) for f in sorted({r[1] for r in rows})}
    try:
        return {f"step-{first + s:06d}.bin": [gen, first + s, world, rank,
                                              [[i, digest(os.pread(fds[f], k, o))] for i, f, o, k in rows[starts[s] : starts[s + 1]]]]
                for s in range(steps)}  # fmt: skip
    finally:
        for fd in fds.values():
            os.close(fd)


def snapshot(root: str) -> dict:
    before = attempt(generation, root)
    names = sorted(attempt(os.listdir, root))
    dirs = {d: attempt(lambda d=d: sorted(os.listdir(os.path.join(root, d))))
            for d in names if d.startswith("step-") and not d.endswith(".bin")}  # fmt: skip
    files = {f"{d}/{n}": attempt(lambda p: digest(read_bytes(p)), os.path.join(root, d, n))
             for d, names in dirs.items() if isinstance(names, list) for n in names}  # fmt: skip
    steps = {d: attempt(step_file, os.path.join(root, d)) for d in names if d.startswith("step-") and d.endswith(".bin")}
    return {"before": before, "after": attempt(generation, root), "dirs": dirs, "files": files, "steps": steps}


def view(root: str) -> dict:
    for _ in range(100):
        snap = snapshot(root)
        if snap["before"] == snap["after"] and not isinstance(snap["before"], str):
            files = {}
            for rel in snap["files"]:
                path = os.path.join(root, rel)
                data = read_bytes(path)
                files[rel] = [digest(data), len(data), loaded_digest(path)]
            state = json.loads(read_bytes(os.path.join(root, STATE)))
            if state["generation"] == snap["before"]:
                return {"state": state, "files": files, "steps": snap["steps"]}
    raise RuntimeError("no consistent view in 100 attempts")


def answer(cmd: dict, kept: dict[str, int]) -> object:
    op = cmd["op"]
    if op == "view":
        return view(cmd["dir"])
    if op == "snapshot":
        return snapshot(cmd["dir"])
    if op == "ranges":
        return ranges(cmd["dir"])
    if op == "race":
        return [snapshot(cmd["dir"]) for _ in range(cmd["count"])]
    if op in ("open", "opendir"):
        kept[op] = os.open(cmd["path"], os.O_RDONLY)
        return "ok"
    if op == "read_open":
        return digest(os.pread(kept["open"], 1 << 30, 0))
    if op == "listdir_open":
        return sorted(os.listdir(kept["opendir"]))
    if op == "close":
        for name in sorted(kept):
            os.close(kept.pop(name))
        return "ok"
    if op == "cat":
        return digest(read_bytes(cmd["path"]))
    if op == "state":
        return json.loads(read_bytes(os.path.join(cmd["dir"], STATE)))
    return f"unknown op {op!r}"


def main() -> None:
    kept: dict[str, int] = {}
    for line in sys.stdin:
        print(json.dumps(attempt(answer, json.loads(line), kept)), flush=True)


if __name__ == "__main__":
    main()
