"""Control calls to a running server (``/tokenize``, ``/metrics``, ``/reset_prefix_cache``, ``/v1/models``,
``/health``) that survive one dropped connection.

A measured window's requests go over a pool of keep-alive connections; a control call made right after it may
get one the server has just closed (seen on an H200: ``httpx.ReadError`` on the ``/tokenize`` call after a c=32
window, which failed the whole trial as ``measurement_error`` after its boot and two windows). Such an error is
transient: :func:`control_call` retries it on a fresh connection (a one-off client with no keep-alive whose
transport retries connection set-up, ``httpx.AsyncHTTPTransport(retries=...)``), a bounded number of times with
a growing pause, and records each retry against the client (:func:`take_retries`), so the window that had them
says so. A server that is really gone still fails: after :data:`CONTROL_ATTEMPTS` attempts the last error is
raised as it came. Status codes are the caller's business (a 404 or 500 is an answer, never retried).

Transient errors: ``httpx.ReadError``, ``httpx.WriteError``, ``httpx.ConnectError``, ``httpx.RemoteProtocolError``
(the server closed the connection before answering). Timeouts are not retried: a server that does not answer in
the call's timeout is not a dropped connection.
"""

from __future__ import annotations

import asyncio
import weakref
from typing import Any

import httpx

__all__ = ["CONTROL_ATTEMPTS", "CONTROL_BACKOFF_S", "CONNECT_RETRIES", "TRANSIENT_ERRORS", "control_call",
           "control_call_sync", "take_retries"]

#: Attempts of one control call in all (the first on the caller's client, the rest each on a fresh connection).
CONTROL_ATTEMPTS = 4
#: Pause before retry k (1-based) is ``CONTROL_BACKOFF_S * 2 ** (k - 1)`` seconds: 0.2, 0.4, 0.8 (1.4 s in all).
CONTROL_BACKOFF_S = 0.2
#: Connection set-up retries inside each fresh attempt (httpx's transport retries connect errors only).
CONNECT_RETRIES = 2
#: Errors of a dropped or refused connection, retried.
TRANSIENT_ERRORS: tuple[type[Exception], ...] = (httpx.ReadError, httpx.WriteError, httpx.ConnectError,
                                                 httpx.RemoteProtocolError)

# Retries made per client, until taken: "<METHOD> <path>: <error type>: <text> (attempt k ok|failed)".
_RETRIES: "weakref.WeakKeyDictionary[httpx.AsyncClient, list[str]]" = weakref.WeakKeyDictionary()


def take_retries(client: httpx.AsyncClient) -> list[str]:
    """The retries :func:`control_call` made with ``client`` since the last call of this function (and forgets
    them), one line each: ``'POST /tokenize: ReadError: ... -> ok on attempt 2'``."""
    return _RETRIES.pop(client, [])


def _fresh(client: httpx.AsyncClient) -> httpx.AsyncClient:
    """A one-off client to the same server (base URL, headers, timeout) that keeps no connection alive: every
    request on it opens a new one."""
    return httpx.AsyncClient(base_url=client.base_url, headers=client.headers, timeout=client.timeout,
                             limits=httpx.Limits(max_keepalive_connections=0),
                             transport=httpx.AsyncHTTPTransport(retries=CONNECT_RETRIES))


async def control_call(client: httpx.AsyncClient, method: str, path: str, **kwargs: Any) -> httpx.Response:
    """``client.request(method, path, **kwargs)``, retried on a fresh connection after a transient error.

    Args:
        client: the measurement's client (its base URL and headers are reused for a retry).
        method: ``GET`` / ``POST``; path: e.g. ``/tokenize``; kwargs: passed to ``httpx.AsyncClient.request``
            (``json=``, ``timeout=``).

    Returns:
        The response, whatever its status (the caller checks it).

    Raises:
        One of :data:`TRANSIENT_ERRORS`: still failing after :data:`CONTROL_ATTEMPTS` attempts (the server is
        gone); any other ``httpx.HTTPError`` (a timeout) at once.
    """
    try:
        return await client.request(method, path, **kwargs)
    except TRANSIENT_ERRORS as e:
        first = e
    log = _RETRIES.setdefault(client, [])
    what = f"{method} {path}: {type(first).__name__}: {first}"
    last: Exception = first
    for k in range(2, CONTROL_ATTEMPTS + 1):
        await asyncio.sleep(CONTROL_BACKOFF_S * 2 ** (k - 2))
        try:
            async with _fresh(client) as fresh:
                r = await fresh.request(method, path, **kwargs)
        except TRANSIENT_ERRORS as e:
            last = e
            continue
        log.append(f"{what} -> ok on attempt {k}")
        return r
    log.append(f"{what} -> failed {CONTROL_ATTEMPTS} attempts (last: {type(last).__name__}: {last})")
    raise last


def control_call_sync(base_url: str, method: str, path: str, **kwargs: Any) -> httpx.Response:
    """:func:`control_call` for a caller that is not a coroutine (the trial flow asking ``/health`` after a failed
    measurement): a one-off client to ``base_url``, run on an event loop of its own in a helper thread (so it works
    whether or not the calling thread runs a loop). Retries are not recorded (the client is gone after).

    Returns / Raises: as :func:`control_call`.
    """
    import concurrent.futures

    async def go() -> httpx.Response:
        async with httpx.AsyncClient(base_url=base_url) as client:
            return await control_call(client, method, path, **kwargs)

    with concurrent.futures.ThreadPoolExecutor(max_workers=1) as ex:
        return ex.submit(lambda: asyncio.run(go())).result()
