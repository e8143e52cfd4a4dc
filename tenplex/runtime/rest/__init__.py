"""The paper's REST API over a host's `TensorStore` (aiohttp).

- `app`: the endpoints (`/query`, `/upload`, `/list`, `/delete`), `make_app` and `serve`;
- `ranges`: the `range` parameter (`parse_range`);
- `server`: `RestServer` (an aiohttp app on a background thread), `bearer_auth`, `is_loopback`.
"""

from tenplex.runtime.rest.app import CHUNK_BYTES, make_app, serve
from tenplex.runtime.rest.ranges import RangeError, parse_range
from tenplex.runtime.rest.server import RestServer, bearer_auth, is_loopback

__all__ = ["CHUNK_BYTES", "RangeError", "RestServer", "bearer_auth", "is_loopback", "make_app", "parse_range", "serve"]
