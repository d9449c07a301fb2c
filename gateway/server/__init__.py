"""The gateway's HTTP server: uvicorn (httptools on uvloop) with kvgate's connection limits.

``run`` is ``uvicorn.run`` with three differences: the HTTP protocol is
``gateway.server.connections.GuardedProtocol`` (header and body deadlines, a head size limit, a
connection cap), the process may open the descriptors that cap needs, and every process
serving requests hands large buffers back to the system once freed.
"""

from __future__ import annotations

import ctypes
import logging
import resource
import sys
from typing import Any

import uvicorn
from uvicorn.config import STARTUP_FAILURE
from uvicorn.supervisors import Multiprocess

from gateway.config import Settings
from gateway.server.connections import Answers, GuardedProtocol, Limits, Reaper, Tally

log = logging.getLogger("kvgate.server")

# Descriptors a worker needs beside its clients' connections: the database pool, the
# journal, metrics files, peers, KV event sockets, logs.
RESERVED_FILES = 256
# Allocations from this size up get their own mapping, unmapped when freed.
MMAP_THRESHOLD = 128 * 1024
_M_MMAP_THRESHOLD = -3  # glibc's mallopt parameter


def limits(settings: Settings) -> Limits:
    """The connection limits the settings ask for."""
    return Limits(
        header_timeout_s=settings.header_timeout_s,
        body_timeout_s=settings.body_timeout_s,
        max_header_bytes=settings.max_header_bytes,
        max_connections=settings.max_connections,
    )


def allow_connections(wanted: int) -> int:
    """Raise the soft limit on open files as far as needed (and allowed); the connection
    cap it leaves room for. Each client connection may hold one to its upstream."""
    needed = 2 * wanted + RESERVED_FILES
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != resource.RLIM_INFINITY and soft < needed:
        raised = needed if hard == resource.RLIM_INFINITY else min(needed, hard)
        if raised > soft:
            resource.setrlimit(resource.RLIMIT_NOFILE, (raised, hard))
            soft = raised
    if soft == resource.RLIM_INFINITY or soft >= needed:
        return wanted
    allowed = max(1, (soft - RESERVED_FILES) // 2)
    log.warning(
        "KVGATE_MAX_CONNECTIONS=%d needs %d open files, the limit is %d: capping connections "
        "at %d per worker (raise `ulimit -n`)",
        wanted,
        needed,
        soft,
        allowed,
    )
    return allowed


def release_large_buffers() -> None:
    """Serve large allocations (request bodies, their JSON) from their own mappings.

    glibc raises its mmap threshold each time a mapped block is freed (up to 32 MiB), so
    after the first large bodies the next ones live on the heap, and the heap keeps those
    pages when they are freed: sixteen 3.9 MiB bodies left 67 MiB behind. A fixed
    threshold keeps them mapped, and freeing one gives its pages back at once.
    """
    try:
        libc = ctypes.CDLL("libc.so.6")
    except OSError:  # not glibc: its allocator's own policy applies
        return
    libc.mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD)


def write_bodies_unjoined() -> None:
    """Let aiohttp hand a request's head and large body to the transport as two buffers.

    On Python before 3.12.9 aiohttp joins them into one (``b"".join``): a whole copy of
    every body it sends, held until the socket has taken it (sixteen 3.9 MiB chat bodies
    through litellm kept five such copies at their peak). It does so because asyncio's own
    ``writelines`` had a flaw (CVE-2024-12254) until then; uvloop's, which every serving
    process runs on, queues the buffers as they are, as aiohttp does on later Pythons.
    """
    from aiohttp import http_writer

    http_writer.SKIP_WRITELINES = False


class GatewayConfig(uvicorn.Config):
    """uvicorn's Config with the connection limits the protocol reads (picklable: a worker
    process receives it whole)."""

    def __init__(self, app: Any, *, limits: Limits, **options: Any) -> None:
        super().__init__(app, http=GuardedProtocol, loop="uvloop", **options)
        self.limits = limits
        self.answers = Answers(limits)
        self.tally = Tally()
        self.reaper = Reaper()

    def load(self) -> None:
        """Load as uvicorn does, in the process that will serve (each worker's own)."""
        release_large_buffers()
        write_bodies_unjoined()
        super().load()


def run(app: Any, *, settings: Settings, workers: int = 1, **options: Any) -> None:
    """Serve ``app`` (an ASGI app, or an import string with ``workers`` > 1) until stopped."""
    wanted = limits(settings)
    cap = allow_connections(wanted.max_connections)
    config = GatewayConfig(
        app,
        limits=Limits(
            header_timeout_s=wanted.header_timeout_s,
            body_timeout_s=wanted.body_timeout_s,
            max_header_bytes=wanted.max_header_bytes,
            max_connections=cap,
        ),
        workers=workers,
        **options,
    )
    server = uvicorn.Server(config=config)
    try:
        if workers > 1:
            Multiprocess(config, sockets=[config.bind_socket()]).run()
        else:
            server.run()
    except KeyboardInterrupt:
        pass
    if workers == 1 and not server.started:
        sys.exit(STARTUP_FAILURE)
