"""An aiohttp application served from a background thread, with bearer-token authentication.

`RestServer(app, host, port)` runs any aiohttp app (the store's REST API in `rest.app`, a job's
scale endpoint in `tenplex.elastic.http`) on its own event loop thread and stops it cleanly;
`bearer_auth(token)` is the middleware both use; `is_loopback(host)` says which hosts may serve
without a token.

Invariants:
- a `RestServer` is bound when its constructor returns, and `stop()` leaves no thread behind;
- with `bearer_auth`, a request without `Authorization: Bearer <token>` is refused (constant-time compare).
"""

from __future__ import annotations

import asyncio
import hmac
import ipaddress
import threading
from collections.abc import Awaitable, Callable

from aiohttp import web

__all__ = ["RestServer", "bearer_auth", "is_loopback"]


Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def _unauthorized(message: str) -> web.HTTPException:
    return web.HTTPUnauthorized(text=message, headers={"WWW-Authenticate": "Bearer"})


def bearer_auth(token: str, reject: Callable[[str], web.HTTPException] = _unauthorized
                ) -> Callable[[web.Request, Handler], Awaitable[web.StreamResponse]]:  # fmt: skip
    """Middleware refusing requests without `Authorization: Bearer <token>` (constant-time
    compare) with `reject(message)`, a 401. Raises ValueError for an empty token."""
    if not token:
        raise ValueError("token must be a non-empty string")
    expected = f"Bearer {token}".encode()

    @web.middleware
    async def check(request: web.Request, handler: Handler) -> web.StreamResponse:
        if not hmac.compare_digest(request.headers.get("Authorization", "").encode(), expected):
            raise reject("Authorization: missing or wrong bearer token")
        return await handler(request)

    return check


def is_loopback(host: str) -> bool:
    """True for "localhost" and loopback addresses (the hosts that may serve without a token)."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _run_loop(loop: asyncio.AbstractEventLoop) -> None:
    """The server thread: run `loop` until stopped, then close it with its executor's threads."""
    asyncio.set_event_loop(loop)
    try:
        loop.run_forever()
    finally:
        loop.run_until_complete(loop.shutdown_asyncgens())
        loop.run_until_complete(loop.shutdown_default_executor())
        loop.close()


class RestServer:
    """A running REST server on its own event loop thread; see `serve`.

    `host` and `port` are the bound address (`port` resolved when 0 was asked for); `url` is
    `http://host:port`. `stop()` (or leaving the `with` block) shuts it down, giving in-flight
    requests `shutdown_timeout` seconds, and leaves no thread behind; it is idempotent. Serves any
    aiohttp app (the store's here, a job's scale endpoint in `tenplex.elastic.http`).
    """

    def __init__(self, app: web.Application, host: str, port: int, shutdown_timeout: float = 60.0,
                 name: str = "tenplex-rest") -> None:  # fmt: skip
        self.host = host
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=_run_loop, args=(self._loop,), name=f"{name}-{host}", daemon=True)
        self._thread.start()
        self._runner = web.AppRunner(app, access_log=None, shutdown_timeout=shutdown_timeout)
        try:
            self.port = self._call(self._start(host, port))
        except BaseException:
            self.stop()
            raise

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}"

    async def _start(self, host: str, port: int) -> int:
        await self._runner.setup()
        await web.TCPSite(self._runner, host, port).start()
        return self._runner.addresses[0][1]

    def _call(self, coro):  # noqa: ANN001, ANN202
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result()

    def stop(self) -> None:
        if self._loop.is_closed():
            return
        try:
            self._call(self._runner.cleanup())
        finally:
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join()  # _run_loop closes the loop

    def __enter__(self) -> RestServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
