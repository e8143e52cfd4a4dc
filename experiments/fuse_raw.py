"""Prototype: a read-only FUSE server speaking the kernel protocol on /dev/fuse directly (no
libfuse), to measure what the kernel allows that libfuse 3.14 cannot ask for: passthrough
(FOPEN_PASSTHROUGH + FUSE_DEV_IOC_BACKING_OPEN), FOPEN_DIRECT_IO with
FUSE_DIRECT_IO_ALLOW_MMAP and large requests, zero-message opens (FUSE_NO_OPEN_SUPPORT).

    python experiments/fuse_raw.py big [--mib 1024] [--rounds 3] [--only passthrough direct_io page_cache]
    python experiments/fuse_raw.py small [--kib 64] [--files 4096] [--rounds 3] [--configs ...]

`big`: one `.npy` (header + float32 data) served from a memory file three ways, each read by a
child (`python -m bench.fuse METHOD`) against the same bytes on tmpfs: `passthrough`
(FOPEN_PASSTHROUGH, the memory file as backing file), `direct_io` (FOPEN_DIRECT_IO with
FUSE_DIRECT_IO_ALLOW_MMAP: one copy per READ, `mmap` through the page cache), `page_cache` (what
libfuse views do: READ replies into the page cache, read out again).

`small`: many sample files of `--kib` KiB, 8 per directory, listed and read whole by a child,
against `os.pread` of the same bytes from one tmpfs file: `cached` (OPEN, READ, RELEASE per
file), `keep` (FOPEN_KEEP_CACHE), `no_open` (OPEN answered ENOSYS: the kernel stops sending
OPEN/RELEASE), `direct` (FOPEN_DIRECT_IO), `passthrough` (a memory file per sample), `push`
(no_open, and the server stores each listed directory's files into the kernel's page cache
with FUSE_NOTIFY_STORE as soon as READDIRPLUS made their inodes); `+pin` pins the server
threads to CPUs and the reader to CPU 0. FLUSH is answered ENOSYS (the kernel stops sending it).

Needs root (mount(2), and CAP_SYS_ADMIN for backing files). Prints one line per measurement.
What was learnt is in docs/design-notes.md ("FUSE views on the kernel protocol").
"""

from __future__ import annotations

import argparse
import ctypes
import errno
import json
import mmap
import os
import stat
import statistics
import struct
import subprocess
import sys
import tempfile
import threading
import time

import numpy as np

# ---- the protocol: fuse.kernel's, under the prototype's short names -------------------------
from tenplex.runtime.fuse import kernel  # noqa: E402 (after numpy: the module's import order)
from tenplex.runtime.fuse.kernel import (  # noqa: E402
    ATTR,
    BATCH_FORGET,
    DESTROY,
    FOPEN_CACHE_DIR,
    FOPEN_DIRECT_IO,
    FOPEN_KEEP_CACHE,
    FOPEN_PASSTHROUGH,
    FORGET,
    GETATTR,
    INIT,
    INTERRUPT,
    LOOKUP,
    MNT_DETACH,
    MS_NODEV,
    MS_NOSUID,
    MS_RDONLY,
    OPEN,
    OPENDIR,
    READ,
    READDIR,
    READDIRPLUS,
    RELEASE,
    RELEASEDIR,
    STATFS,
)

IN_HDR, OUT_HDR = kernel.IN_HEADER, kernel.OUT_HEADER
F_ASYNC_READ, F_BIG_WRITES, F_DO_READDIRPLUS = kernel.ASYNC_READ, kernel.BIG_WRITES, kernel.DO_READDIRPLUS
F_PARALLEL_DIROPS, F_MAX_PAGES, F_INIT_EXT = kernel.PARALLEL_DIROPS, kernel.MAX_PAGES, kernel.INIT_EXT
F_ALLOW_MMAP, F_PASSTHROUGH = kernel.DIRECT_IO_ALLOW_MMAP, kernel.PASSTHROUGH
F_NO_OPENDIR = 1 << 24  # zero-message opendir: only the prototype asks for it
LSEEK, STATX = 46, 52  # answered ENOSYS: only the prototype names them

libc = ctypes.CDLL(None, use_errno=True)  # its own mount(2): allow_other, no max_read
libc.mount.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_ulong, ctypes.c_char_p]
libc.umount2.argtypes = [ctypes.c_char_p, ctypes.c_int]


class Node:
    def __init__(self, ino: int, mode: int, size: int = 0, data=None, backing: int | None = None, fopen: int = 0):
        self.ino, self.mode, self.size, self.data, self.backing, self.fopen = ino, mode, size, data, backing, fopen
        self.children: dict[bytes, Node] = {}


class Server:
    """A read-only tree of Nodes served on /dev/fuse by `threads` threads."""

    def __init__(self, mnt: str, *, want: int, max_pages: int = 256, threads: int = 2, no_open: bool = False,
                 timeout: float = 3600.0, pin: bool = False):
        self.mnt, self.want, self.max_pages, self.no_open, self.timeout = mnt, want, max_pages, no_open, timeout
        self.nodes: dict[int, Node] = {1: Node(1, stat.S_IFDIR | 0o755)}
        self.fd = os.open("/dev/fuse", os.O_RDWR | os.O_CLOEXEC)
        self.negotiated = 0
        self.push = False
        import queue
        self.pushq = queue.Queue()
        threading.Thread(target=self.pusher, daemon=True).start()
        self.counts: dict[int, int] = {}
        opts = f"fd={self.fd},rootmode=40000,user_id=0,group_id=0,allow_other,default_permissions".encode()
        if libc.mount(b"tenplex-fuse", mnt.encode(), b"fuse.tenplex-fuse", MS_RDONLY | MS_NOSUID | MS_NODEV, opts):
            raise OSError(ctypes.get_errno(), f"mount {mnt}")
        self.threads = [threading.Thread(target=self.loop, args=(i if pin else None,), daemon=True)
                        for i in range(threads)]
        for t in self.threads:
            t.start()

    def add(self, parent: Node, name: str, node: Node) -> Node:
        parent.children[name.encode()] = node
        self.nodes[node.ino] = node
        return node

    def backing(self, fd: int) -> int:
        return kernel.backing_open(self.fd, fd)

    def pusher(self) -> None:
        """FUSE_NOTIFY_STORE every file of a listed directory into the kernel's page cache."""
        while True:
            node = self.nodes[self.pushq.get()]
            for child in node.children.values():
                for _attempt in range(200):
                    if child.data is None:
                        break
                    body = struct.pack("<QQII", child.ino, 0, child.size, 0)
                    try:
                        os.writev(self.fd, [OUT_HDR.pack(OUT_HDR.size + len(body) + child.size, 4, 0), body, child.data])
                        self.counts["push"] = self.counts.get("push", 0) + 1
                        break
                    except OSError as e:
                        self.counts[f"push-{e.errno}"] = self.counts.get(f"push-{e.errno}", 0) + 1
                        time.sleep(0.00002)

    def close(self) -> None:
        libc.umount2(self.mnt.encode(), MNT_DETACH)
        os.close(self.fd)

    # -- replies
    def reply(self, unique: int, *parts) -> None:
        n = OUT_HDR.size + sum(len(p) for p in parts)
        os.writev(self.fd, [OUT_HDR.pack(n, 0, unique), *parts])

    def error(self, unique: int, err: int) -> None:
        os.write(self.fd, OUT_HDR.pack(OUT_HDR.size, -err, unique))

    def attr(self, node: Node) -> bytes:
        return ATTR.pack(node.ino, node.size, (node.size + 511) // 512, 0, 0, 0, 0, 0, 0, node.mode,
                         2 if node.mode & stat.S_IFDIR else 1, 0, 0, 0, 4096, 0)

    def entry(self, node: Node) -> bytes:
        t = int(self.timeout)
        return kernel.ENTRY.pack(node.ino, 0, t, t, 0, 0) + self.attr(node)

    # -- the loop
    def loop(self, cpu: int | None) -> None:
        if cpu is not None:
            os.sched_setaffinity(0, {cpu})
        size = (self.max_pages + 1) * 4096 + 4096
        buf = bytearray(size)
        view = memoryview(buf)
        while True:
            try:
                n = os.readv(self.fd, [buf])
            except OSError as e:
                if e.errno in (errno.EINTR, errno.EAGAIN, errno.ENOENT):
                    continue
                return  # ENODEV: unmounted
            length, op, unique, nodeid, *_ = IN_HDR.unpack_from(buf)
            self.counts[op] = self.counts.get(op, 0) + 1
            try:
                self.handle(op, unique, nodeid, view[IN_HDR.size:n])
            except OSError as e:
                if e.errno == errno.ENOENT and op != LOOKUP:
                    continue  # the request was interrupted
                raise

    def handle(self, op: int, unique: int, nodeid: int, arg: memoryview) -> None:
        if op == READ:
            fh, offset, size = kernel.READ_IN.unpack_from(arg)
            node = self.nodes[nodeid]
            data = node.data[offset: offset + size] if offset < node.size else b""
            self.reply(unique, data)
        elif op == LOOKUP:
            node = self.nodes[nodeid].children.get(bytes(arg[:-1]))
            if node is None:
                self.error(unique, errno.ENOENT)
            else:
                self.reply(unique, self.entry(node))
        elif op == OPEN:
            if self.no_open:
                self.error(unique, errno.ENOSYS)
                return
            node = self.nodes[nodeid]
            backing = node.backing if node.backing is not None else 0
            self.reply(unique, kernel.OPEN_OUT.pack(0, node.fopen, backing))
        elif op in (FORGET, BATCH_FORGET, INTERRUPT):
            return  # no reply
        elif op == GETATTR:
            t = int(self.timeout)
            self.reply(unique, kernel.ATTR_OUT.pack(t, 0, 0) + self.attr(self.nodes[nodeid]))
        elif op in (RELEASE, RELEASEDIR):
            self.reply(unique)
        elif op == OPENDIR:
            self.reply(unique, kernel.OPEN_OUT.pack(0, FOPEN_CACHE_DIR | FOPEN_KEEP_CACHE, 0))
        elif op in (READDIR, READDIRPLUS):
            fh, offset, size = kernel.READ_IN.unpack_from(arg)
            self.reply(unique, self.listing(self.nodes[nodeid], offset, size, op == READDIRPLUS))
            if self.push and op == READDIRPLUS and offset == 0:
                self.pushq.put(nodeid)
        elif op == INIT:
            self.init(unique, arg)
        elif op == STATFS:
            self.reply(unique, kernel.STATFS_OUT.pack(0, 0, 0, 0, 0, 4096, 255, 4096, 0))
        elif op == DESTROY:
            self.reply(unique)
        else:
            self.error(unique, errno.ENOSYS)

    def listing(self, node: Node, offset: int, size: int, plus: bool) -> bytes:
        out = bytearray()
        names = list(node.children.items())
        for k in range(offset, len(names)):
            name, child = names[k]
            dt = 4 if child.mode & stat.S_IFDIR else 8
            rec = kernel.DIRENT.pack(child.ino, k + 1, len(name), dt) + name
            rec += bytes(-len(rec) % 8)
            if plus:
                rec = self.entry(child) + rec
            if len(out) + len(rec) > size:
                break
            out += rec
        return bytes(out)

    def init(self, unique: int, arg: memoryview) -> None:
        major, minor, max_readahead, flags, flags2 = kernel.INIT_IN.unpack_from(arg)
        offered = flags | (flags2 << 32)
        want = self.want & offered
        self.negotiated = want
        want |= F_INIT_EXT
        out = kernel.INIT_OUT.pack(7, min(minor, 41), max_readahead, want & 0xFFFFFFFF, 64, 48,
                                   4096, 1, self.max_pages, 0, want >> 32, 1, 0)
        self.kernel_flags = offered
        self.reply(unique, out)


def wait_mounted(mnt: str) -> None:
    os.stat(mnt)  # INIT is answered before the first request returns


# ---- measurements ------------------------------------------------------------------------------
def child(method: str, path: str, buf: int, passes: int = 2) -> float:
    env = {**os.environ, "PYTHONPATH": os.path.dirname(os.path.dirname(os.path.abspath(__file__)))}
    out = subprocess.run([sys.executable, "-m", "bench.fuse", method, path, str(buf), str(passes)],
                         capture_output=True, text=True, env=env, timeout=600)
    if out.returncode:
        print(out.stderr[-2000:], file=sys.stderr)
        return float("nan")
    return max(json.loads(out.stdout)["gbps"])


def big(args) -> None:
    size = args.mib << 20
    array = np.arange(size // 4, dtype=np.float32)
    hdr = npy_header(array, pad_to=4096)
    tmp = tempfile.mkdtemp(dir="/dev/shm", prefix="fuse-proto-")
    np.save(f"{tmp}/t.npy", array)
    # the backing file: a memfd that is the whole .npy (header page + data)
    mfd = os.memfd_create("tenplex-npy", os.MFD_CLOEXEC)
    os.ftruncate(mfd, len(hdr) + array.nbytes)
    m = mmap.mmap(mfd, len(hdr) + array.nbytes)
    m[: len(hdr)] = hdr
    np.frombuffer(m, np.uint8, array.nbytes, len(hdr))[:] = array.view(np.uint8)
    image = np.frombuffer(m, np.uint8)
    mnt = tempfile.mkdtemp(prefix="fuse-proto-mnt-")
    configs = {
        "passthrough": dict(want=F_PASSTHROUGH | F_ASYNC_READ, fopen=FOPEN_PASSTHROUGH),
        "direct_io": dict(want=F_ALLOW_MMAP | F_MAX_PAGES | F_ASYNC_READ, fopen=FOPEN_DIRECT_IO),
        "page_cache": dict(want=F_MAX_PAGES | F_ASYNC_READ, fopen=0),
    }
    methods = [("read", 1 << 20), ("read", 16 << 20), ("mmap", 0)]
    results: dict[tuple, list[float]] = {}
    for r in range(args.rounds):
        for name, cfg in configs.items():
            if args.only and name not in args.only:
                continue
            s = Server(mnt, want=cfg["want"], max_pages=args.max_pages)
            try:
                wait_mounted(mnt)
                backing = s.backing(mfd) if cfg["fopen"] & FOPEN_PASSTHROUGH else None
                s.add(s.nodes[1], "t.npy", Node(2, stat.S_IFREG | 0o444, image.size, image, backing, cfg["fopen"]))
                if r == 0:
                    print(f"{name}: kernel flags {s.kernel_flags:#x}, negotiated {s.negotiated:#x}", flush=True)
                for method, b in methods:
                    anchor = child(method, f"{tmp}/t.npy", b)
                    got = child(method, f"{mnt}/t.npy", b)
                    results.setdefault((name, method, b), []).append(got / anchor)
                    print(f"  round {r} {name:12s} {method} {b >> 20:2d} MiB: {got:6.2f} GB/s vs tmpfs {anchor:6.2f}"
                          f" = {got / anchor:.2f}x  (load {os.getloadavg()[0]:.1f})", flush=True)
            finally:
                s.close()
    print("summary (min/median/max of the ratio to tmpfs):")
    for (name, method, b), q in results.items():
        print(f"  {name:12s} {method} {b >> 20:2d} MiB: {min(q):.2f} / {statistics.median(q):.2f} / {max(q):.2f}")
    os.unlink(f"{tmp}/t.npy")
    os.rmdir(tmp)
    os.rmdir(mnt)


def npy_header(array: np.ndarray, pad_to: int) -> bytes:
    import io

    out = io.BytesIO()
    np.lib.format.write_array_header_1_0(out, {"descr": np.lib.format.dtype_to_descr(array.dtype),
                                               "fortran_order": False, "shape": array.shape})
    h = out.getvalue()
    # pad the header dict with spaces so that the data starts at `pad_to` (format allows it)
    extra = pad_to - len(h)
    hlen = struct.unpack_from("<H", h, 8)[0] + extra
    return h[:8] + struct.pack("<H", hlen) + h[10:-1] + b" " * extra + b"\n"


SMALL_READER = r"""
import os, sys, time, json
root = sys.argv[1]
def once():
    n = 0
    t0 = time.perf_counter()
    for d in sorted(os.listdir(root)):
        for name in sorted(os.listdir(os.path.join(root, d))):
            with open(os.path.join(root, d, name), 'rb', buffering=0) as f:
                n += len(f.read())
    return time.perf_counter() - t0, n
print(json.dumps([once() for _ in range(int(sys.argv[2]))]))
"""

DIRECT_READER = r"""
import os, sys, time, json
path, size, count = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
def once():
    fd = os.open(path, os.O_RDONLY); n = 0
    t0 = time.perf_counter()
    for k in range(count):
        n += len(os.pread(fd, size, k * size))
    t = time.perf_counter() - t0; os.close(fd); return t, n
print(json.dumps([once() for _ in range(int(sys.argv[4]))]))
"""


def run_py(code: str, *argv, cpu: int | None = None) -> list:
    pre = ["taskset", "-c", str(cpu)] if cpu is not None else []
    out = subprocess.run([*pre, sys.executable, "-c", code, *map(str, argv)], capture_output=True, text=True,
                         timeout=600)
    if out.returncode:
        print(out.stderr[-2000:], file=sys.stderr)
        return [[float("nan"), 0]]
    return json.loads(out.stdout)


def small(args) -> None:
    size, count = args.kib << 10, args.files
    data = np.random.default_rng(0).integers(0, 256, size * count, dtype=np.uint8)
    tmp = tempfile.mkdtemp(dir="/dev/shm", prefix="fuse-proto-")
    with open(f"{tmp}/data.bin", "wb") as f:
        f.write(data.tobytes())
    mnt = tempfile.mkdtemp(prefix="fuse-proto-mnt-")
    per_dir = 8
    # per-sample memfds (the passthrough case needs one backing file per sample)
    memfds = []
    if "passthrough" in args.configs:
        for k in range(count):
            fd = os.memfd_create("s", os.MFD_CLOEXEC)
            os.write(fd, data[k * size:(k + 1) * size])
            memfds.append(fd)
    configs = {
        "cached": dict(want=F_DO_READDIRPLUS | F_ASYNC_READ | F_PARALLEL_DIROPS, fopen=0, no_open=False),
        "keep": dict(want=F_DO_READDIRPLUS | F_ASYNC_READ | F_PARALLEL_DIROPS, fopen=FOPEN_KEEP_CACHE, no_open=False),
        "no_open": dict(want=F_DO_READDIRPLUS | F_ASYNC_READ | F_PARALLEL_DIROPS, fopen=0, no_open=True),
        "direct": dict(want=F_DO_READDIRPLUS | F_ASYNC_READ | F_PARALLEL_DIROPS | F_ALLOW_MMAP, fopen=FOPEN_DIRECT_IO,
                       no_open=False),
        "passthrough": dict(want=F_DO_READDIRPLUS | F_ASYNC_READ | F_PARALLEL_DIROPS | F_PASSTHROUGH,
                            fopen=FOPEN_PASSTHROUGH, no_open=False),
        "push": dict(want=F_DO_READDIRPLUS | F_ASYNC_READ | F_PARALLEL_DIROPS, fopen=0, no_open=True),
    }
    results: dict[str, list[float]] = {}
    for r in range(args.rounds):
        direct = min(t for t, _ in run_py(DIRECT_READER, f"{tmp}/data.bin", size, count, 3))
        print(f"round {r}: direct {count / direct:9.0f} files/s ({direct / count * 1e6:.1f} us/file)", flush=True)
        for name in args.configs:
            cfg = configs[name.split("+")[0]]
            s = Server(mnt, want=cfg["want"], no_open=cfg["no_open"], threads=args.threads, pin="pin" in name)
            s.push = name.startswith("push")
            try:
                wait_mounted(mnt)
                ino = 2
                for d in range(0, count, per_dir):
                    dn = s.add(s.nodes[1], f"step-{d:06d}", Node(ino, stat.S_IFDIR | 0o755))
                    ino += 1
                    for k in range(d, min(d + per_dir, count)):
                        backing = s.backing(memfds[k]) if cfg["fopen"] & FOPEN_PASSTHROUGH else None
                        s.add(dn, f"{k:06d}.bin", Node(ino, stat.S_IFREG | 0o444, size,
                                                       data[k * size:(k + 1) * size], backing, cfg["fopen"]))
                        ino += 1
                s.counts.clear()
                t = run_py(SMALL_READER, mnt, 1, cpu=0 if "pin" in name else None)[0][0]
                counts = dict(s.counts)
            finally:
                s.close()
            results.setdefault(name, []).append(direct / t)
            print(f"  {name:16s} {count / t:9.0f} files/s ({t / count * 1e6:6.1f} us/file) = {direct / t:.2f}x direct"
                  f"  requests {counts}  (load {os.getloadavg()[0]:.1f})", flush=True)
    print("summary (min/median/max vs direct):")
    for name, q in results.items():
        print(f"  {name:16s} {min(q):.2f} / {statistics.median(q):.2f} / {max(q):.2f}")
    for fd in memfds:
        os.close(fd)
    os.unlink(f"{tmp}/data.bin")
    os.rmdir(tmp)
    os.rmdir(mnt)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("what", choices=["big", "small"])
    p.add_argument("--mib", type=int, default=1024)
    p.add_argument("--kib", type=int, default=64)
    p.add_argument("--files", type=int, default=4096)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--max-pages", type=int, default=256)
    p.add_argument("--only", nargs="*")
    p.add_argument("--configs", nargs="*", default=["cached", "keep", "no_open", "direct", "passthrough"])
    args = p.parse_args()
    big(args) if args.what == "big" else small(args)


if __name__ == "__main__":
    main()
