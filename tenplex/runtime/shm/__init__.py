"""A host's store, shared with the processes of its machine: training programs save into it and
load from it through shared memory, with no copy in between.

- wire.py: messages over a Unix stream socket, JSON with file descriptors attached;
- server.py: the agent's end (`StoreServer`): a thread per connected process, same-user only;
- client.py: the program's end (`StoreClient`): put arrays written into an arena, get arrays
  mapped from the store's arenas.
"""

from tenplex._lazy import lazy

__getattr__, __all__ = lazy(__name__, {"StoreClient": "client", "StoreServer": "server", "ShmError": "wire"})
