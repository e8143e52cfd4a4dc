"""Point-to-point UCX transport between processes (`ucxx-cu12`): `UcxPeer` and what it returns.

Layers, lowest first: `wire` (tags, headers, addresses), `cancel` (a command's cancel flag), `worker` (the UCX worker, waiting with
deadlines), `exchange` (a batch of sends and receives progressed together), `peer` (endpoints,
messages, acknowledged close). ucxx is imported when a peer is made, not when this package is.
"""

from tenplex.runtime.transport.errors import TransportError
from tenplex.runtime.transport.ucx.peer import ANY, UcxPeer
from tenplex.runtime.transport.ucx.worker import Received, UcxEndpoint, import_ucx, ucx_available

__all__ = ["ANY", "Received", "TransportError", "UcxEndpoint", "UcxPeer", "import_ucx", "ucx_available"]
