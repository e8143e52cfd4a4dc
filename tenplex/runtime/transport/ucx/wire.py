"""Wire format of the UCX transport: tags, message headers, peer addresses, TCP hellos.

Tags (64 bits) carry a kind in the top 4 bits and the sender's 24-bit peer id below it, so a
receiver can match one sender exactly or any sender (mask the id out):

    HDR   kind=1 | src id | user tag (36 bits)      the 40-byte header of a message
    DATA  kind=2 | src id | sequence (36 bits)      its payload, matched to the header exactly
    FIN   kind=3 | src id | 0                       acknowledged close
    MSG   kind=4 | src id | message id (36 bits)    a headerless message of an `exchange`
    CTL   kind=5 | src id | message id (36 bits)    a headerless control message of an `exchange`
                                                    (its ids never match a MSG's)

A header is `<4s I Q Q Q Q`: magic, src id, message id, nbytes, sequence, reserved.
A peer address is `TPXA`, the peer id, the peer's name and the UCX worker address.
"""

from __future__ import annotations

import struct

from tenplex.runtime.transport.errors import TransportError

HDR, DATA, FIN, MSG, CTL = 1, 2, 3, 4, 5
KIND_SHIFT = 60
ID_BITS = 24
ID_SHIFT = 36
LOW_MASK = (1 << ID_SHIFT) - 1
ID_MASK = ((1 << ID_BITS) - 1) << ID_SHIFT
FULL_MASK = (1 << 64) - 1
ANY_SOURCE_MASK = FULL_MASK & ~ID_MASK
MAX_USER_TAG = LOW_MASK

_HEADER = struct.Struct("<4sIQQQQ")
HEADER_SIZE = _HEADER.size  # 40
_MAGIC = b"TPXM"
_ADDR = struct.Struct("<4sIH")
_ADDR_MAGIC = b"TPXA"
HELLO_SIZE = 256
_HELLO = struct.Struct("<4sIH")
_HELLO_MAGIC = b"TPXH"


def make_tag(kind: int, src: int, low: int) -> int:
    return (kind << KIND_SHIFT) | (src << ID_SHIFT) | (low & LOW_MASK)


def check_user_tag(user_tag: int) -> None:
    if not 0 <= user_tag <= MAX_USER_TAG:
        raise TransportError(f"tag {user_tag} out of range [0, {MAX_USER_TAG}]")


def pack_header(src: int, message_id: int, nbytes: int, seq: int) -> bytes:
    return _HEADER.pack(_MAGIC, src, message_id, nbytes, seq, 0)


def unpack_header(raw: bytes) -> tuple[int, int, int, int]:
    """(src id, message id, nbytes, sequence) of a received header."""
    magic, src, message_id, nbytes, seq, _ = _HEADER.unpack(raw)
    if magic != _MAGIC:
        raise TransportError(f"corrupt message header {raw[:8]!r}: magic is not {_MAGIC!r}")
    return src, message_id, nbytes, seq


def pack_address(peer_id: int, name: str, ucx_address: bytes) -> bytes:
    raw = name.encode()
    return _ADDR.pack(_ADDR_MAGIC, peer_id, len(raw)) + raw + ucx_address


def unpack_address(address: bytes) -> tuple[int, str, bytes]:
    """(peer id, name, UCX worker address) of an address from `UcxPeer.address`."""
    address = bytes(address)
    if len(address) < _ADDR.size or address[:4] != _ADDR_MAGIC:
        raise TransportError(f"not a tenplex UCX peer address (starts with {address[:8]!r})")
    _, peer_id, n = _ADDR.unpack_from(address)
    start = _ADDR.size
    return peer_id, address[start:start + n].decode(), address[start + n:]


def pack_hello(peer_id: int, name: str) -> bytes:
    raw = name.encode()[: HELLO_SIZE - _HELLO.size]
    return (_HELLO.pack(_HELLO_MAGIC, peer_id, len(raw)) + raw).ljust(HELLO_SIZE, b"\0")


def unpack_hello(raw: bytes) -> tuple[int, str]:
    magic, peer_id, n = _HELLO.unpack_from(raw)
    if magic != _HELLO_MAGIC:
        raise TransportError(f"TCP peer sent no tenplex hello (got {bytes(raw[:8])!r})")
    return peer_id, bytes(raw[_HELLO.size:_HELLO.size + n]).decode(errors="replace")
