"""The FUSE kernel protocol (`include/uapi/linux/fuse.h`, 7.41) as far as a read-only file system
served by `fuse.session` needs it: opcodes, INIT flags, the byte layouts of requests and replies,
and the ioctls of `/dev/fuse` that register passthrough backing files.

Every request read from `/dev/fuse` is a `fuse_in_header` (`IN_HEADER`) and its opcode's
arguments; every reply is a `fuse_out_header` (`OUT_HEADER`: length, -errno, the request's
`unique`) and its body, written with one `writev`. All integers are little-endian (x86-64 and
arm64 alike).
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import os
import stat
import struct

# opcodes (enum fuse_opcode)
LOOKUP, FORGET, GETATTR, READLINK = 1, 2, 3, 5
OPEN, READ, STATFS, RELEASE, FSYNC = 14, 15, 17, 18, 20
GETXATTR, LISTXATTR, FLUSH, INIT = 22, 23, 25, 26
OPENDIR, READDIR, RELEASEDIR, FSYNCDIR, ACCESS = 27, 28, 29, 30, 34
INTERRUPT, DESTROY, BATCH_FORGET, READDIRPLUS = 36, 38, 42, 44
NO_REPLY = frozenset({FORGET, BATCH_FORGET, INTERRUPT})

# INIT flags (64 bits: the high half travels in flags2, with FUSE_INIT_EXT)
ASYNC_READ, BIG_WRITES, AUTO_INVAL_DATA, DO_READDIRPLUS, ASYNC_DIO = 1 << 0, 1 << 5, 1 << 12, 1 << 13, 1 << 15
PARALLEL_DIROPS, MAX_PAGES, INIT_EXT = 1 << 18, 1 << 22, 1 << 30
DIRECT_IO_ALLOW_MMAP, PASSTHROUGH = 1 << 36, 1 << 37

# open reply flags (FOPEN_*)
FOPEN_DIRECT_IO, FOPEN_KEEP_CACHE, FOPEN_CACHE_DIR, FOPEN_PASSTHROUGH = 1 << 0, 1 << 1, 1 << 3, 1 << 7

MAJOR, MINOR = 7, 41  # the protocol version this module speaks (passthrough needs >= 40)
IN_HEADER = struct.Struct("<IIQQIIIHH")  # len, opcode, unique, nodeid, uid, gid, pid, total_extlen, pad
OUT_HEADER = struct.Struct("<IiQ")  # len, error (-errno), unique
INIT_IN = struct.Struct("<IIIII")  # major, minor, max_readahead, flags, flags2 (then unused[11])
# major, minor, max_readahead, flags, max_background, congestion_threshold, max_write, time_gran,
# max_pages, map_alignment, flags2, max_stack_depth, request_timeout (then unused[11])
INIT_OUT = struct.Struct("<IIIIHHIIHHIIH22x")
ATTR = struct.Struct("<QQQQQQIIIIIIIIII")  # fuse_attr: ino size blocks [amc]time [amc]timensec mode nlink uid gid rdev blksize flags
ENTRY = struct.Struct("<QQQQII")  # fuse_entry_out before its attr: nodeid, generation, entry/attr valid (s, ns)
ATTR_OUT = struct.Struct("<QII")  # attr_valid, attr_valid_nsec, dummy (then the attr)
OPEN_OUT = struct.Struct("<QIi")  # fh, open_flags, backing_id
READ_IN = struct.Struct("<QQI")  # fh, offset, size (then read_flags, lock_owner, flags)
RELEASE_IN = struct.Struct("<Q")  # fh (then flags, release_flags, lock_owner)
GETXATTR_IN = struct.Struct("<II")  # size, padding (then the name, NUL-terminated)
SIZE_OUT = struct.Struct("<II")  # fuse_getxattr_out: size, padding
DIRENT = struct.Struct("<QQII")  # ino, off (of the next entry), namelen, type (then the name, 8-aligned)
STATFS_OUT = struct.Struct("<QQQQQIIII24x")  # blocks bfree bavail files ffree bsize namelen frsize pad spare[6]
FORGET_ONE = struct.Struct("<QQ")  # nodeid, nlookup (BATCH_FORGET: count, dummy, then these)

# ioctls of /dev/fuse: _IOW(229, 1, struct fuse_backing_map {i32 fd; u32 flags; u64 padding}), _IOW(229, 2, u32)
BACKING_OPEN, BACKING_CLOSE = 0x4010E501, 0x4004E502
_libc = ctypes.CDLL(None, use_errno=True)
_libc.ioctl.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_void_p]
_libc.mount.argtypes = [ctypes.c_char_p] * 3 + [ctypes.c_ulong, ctypes.c_char_p]
_libc.umount2.argtypes = [ctypes.c_char_p, ctypes.c_int]
MS_RDONLY, MS_NOSUID, MS_NODEV, MNT_DETACH = 1, 2, 4, 2


def mount(dev: int, directory: str, fsname: str, max_read: int) -> None:
    """mount(2) a read-only FUSE file system served on the open `/dev/fuse` descriptor `dev` at
    `directory`, for this user only, the kernel checking modes (`default_permissions`), read
    requests of at most `max_read` bytes. Raises OSError (EPERM without CAP_SYS_ADMIN)."""
    opts = (f"fd={dev},rootmode=40000,user_id={os.geteuid()},group_id={os.getegid()},default_permissions,"
            f"max_read={max_read}")  # fmt: skip
    flags = MS_RDONLY | MS_NOSUID | MS_NODEV
    if _libc.mount(fsname.encode(), directory.encode(), f"fuse.{fsname}".encode(), flags, opts.encode()):
        e = ctypes.get_errno()
        raise OSError(e, f"mount(2) of {directory}: {os.strerror(e)}")


def unmount(directory: str) -> None:
    """Unmount `directory`, lazily if a file is still open (the connection lives on until `abort`)."""
    if _libc.umount2(directory.encode(), 0) and ctypes.get_errno() == errno.EBUSY:
        _libc.umount2(directory.encode(), MNT_DETACH)


def abort(device: str) -> None:
    """End the FUSE connection of the file system `device` ("0:N"): its requests and open files
    fail with ENOTCONN, and readers of its `/dev/fuse` get ENODEV."""
    with contextlib.suppress(OSError), open(f"/sys/fs/fuse/connections/{device.split(':')[1]}/abort", "w") as f:
        f.write("1")


def backing_open(dev: int, fd: int) -> int:
    """Register the open file `fd` with the FUSE connection of `dev`; its backing id (> 0), which
    an OPEN reply with `FOPEN_PASSTHROUGH` names. Raises OSError (EPERM without CAP_SYS_ADMIN,
    EOPNOTSUPP when the connection did not negotiate passthrough)."""
    arg = ctypes.create_string_buffer(struct.pack("<iIQ", fd, 0, 0), 16)
    got = _libc.ioctl(dev, BACKING_OPEN, arg)
    if got < 0:
        e = ctypes.get_errno()
        raise OSError(e, f"FUSE_DEV_IOC_BACKING_OPEN: {os.strerror(e)}")
    return got


def backing_close(dev: int, backing_id: int) -> None:
    """Drop a backing id (files opened with it keep their backing file). Raises OSError."""
    arg = ctypes.c_uint32(backing_id)
    if _libc.ioctl(dev, BACKING_CLOSE, ctypes.byref(arg)) < 0:
        e = ctypes.get_errno()
        raise OSError(e, f"FUSE_DEV_IOC_BACKING_CLOSE: {os.strerror(e)}")


def attr(ino: int, mode: int, size: int, nlink: int, uid: int, gid: int, time_ns: int) -> bytes:
    """A `fuse_attr` (88 bytes): all three times are `time_ns`."""
    s, ns = divmod(time_ns, 10**9)
    return ATTR.pack(ino, size, (size + 511) // 512, s, s, s, ns, ns, ns, mode, nlink, uid, gid, 0, 4096, 0)


def entry(ino: int, attrs: bytes, timeout: float) -> bytes:
    """A `fuse_entry_out` (128 bytes): `ino` and its attributes, both valid for `timeout` s."""
    s, ns = int(timeout), int(timeout % 1 * 1e9)
    return ENTRY.pack(ino, 0, s, s, ns, ns) + attrs


def dirent(ino: int, next_offset: int, name: bytes, mode: int) -> bytes:
    """A `fuse_dirent`, padded to 8 bytes; its type from `mode`."""
    kind = stat.S_IFMT(mode) >> 12  # DT_DIR 4, DT_REG 8
    rec = DIRENT.pack(ino, next_offset, len(name), kind) + name
    return rec + bytes(-len(rec) % 8)
