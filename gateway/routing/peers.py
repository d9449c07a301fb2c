"""Routing state shared between the workers of one gateway (``kvgate serve --workers N``).

Each worker routes with its own approximate index, learned from its own placements and
corrected by the cached tokens its responses report. Alone, two workers would learn
different pictures of the same replicas: a conversation's second turn, landing on the
other worker, would find no replica holding its prefix and be placed afresh, missing the
cache its first turn filled. So every worker tells the others what it changed, and
applies what they tell it, in the same way it applies its own:

    placed    (deployment, replica, block hashes)         ceiling.observe + index.record
    corrected (deployment, replica, hashes, reported, predicted)        index.correct
    turn      (deployment, interaction, hashes, prompt tokens, block)   prefix breakers:
              the interaction's latest request (gateway/serving/breaks.py)

The messages are unix datagrams, one per change per peer (a few microseconds to send,
never awaited), to a socket per worker in a directory named after the journal directory,
which the workers of one gateway share. A peer whose socket is full or gone misses
that message; the index it keeps is a cache of beliefs that the replicas' reports
correct, so a missed message costs a cache hit at worst, never a wrong bill.

What is not shared: in-flight counts (each worker counts its own requests; the replicas'
own queue lengths, read from their /metrics every second by every worker, are the common
view of load), health marks (every worker checks every replica), and replicas' KV event
streams, which every worker consumes itself when they are configured (exact routing is
consistent between workers by construction).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import os
import socket
import struct
import tempfile
from array import array
from collections.abc import Callable, Sequence
from pathlib import Path

log = logging.getLogger("kvgate.peers")

PLACED, CORRECTED, HELLO, TURN = 1, 2, 3, 4  # HELLO: a worker started; look for peers again
_HEADER = struct.Struct("=BHHII")  # kind, deployment length, replica length, reported, predicted
# A datagram larger than the socket buffer cannot be sent; a prompt of 16,000 blocks (a
# quarter of a million tokens at 16 a block) fits with room to spare.
MAX_HASHES = 16_000
RECEIVE_BYTES = 1 << 20

Apply = Callable[[int, str, str, Sequence[int], int, int], None]


def peer_directory(journal_dir: Path) -> Path:
    """Where the workers of the gateway that writes ``journal_dir`` find each other: short
    (unix socket paths have a 108-byte limit) and the same for every worker."""
    digest = hashlib.sha256(str(journal_dir.resolve()).encode()).hexdigest()[:16]
    return Path(tempfile.gettempdir()) / f"kvgate-peers-{digest}"


def encode(
    kind: int,
    deployment: str,
    replica: str,
    hashes: Sequence[int],
    reported: int = 0,
    predicted: int = 0,
) -> bytes:
    """One datagram for the peers: a header, both names, and at most MAX_HASHES hashes."""
    names = deployment.encode() + replica.encode()
    header = _HEADER.pack(
        kind, len(deployment.encode()), len(replica.encode()), reported, predicted
    )
    return header + names + array("Q", hashes[:MAX_HASHES]).tobytes()


def decode(data: bytes) -> tuple[int, str, str, array[int], int, int]:
    """The kind, deployment, replica, hashes, reported and predicted a datagram holds."""
    kind, dlen, rlen, reported, predicted = _HEADER.unpack_from(data)
    start = _HEADER.size
    deployment = data[start : start + dlen].decode()
    replica = data[start + dlen : start + dlen + rlen].decode()
    hashes = array("Q")
    hashes.frombytes(data[start + dlen + rlen :])
    return kind, deployment, replica, hashes, reported, predicted


class PeerLink:
    """This worker's socket, and the other workers' sockets it sends its changes to."""

    def __init__(self, directory: Path, apply: Apply, *, name: str | None = None) -> None:
        self.directory = directory
        self._apply = apply
        # <pid>-<name>: the pid tells whether a socket's worker is alive.
        self.path = directory / f"{os.getpid()}-{name or 'worker'}.sock"
        self._socket: socket.socket | None = None
        self._peers: list[str] = []
        self.sent = 0
        self.received = 0
        self.dropped = 0

    @property
    def peers(self) -> int:
        """How many other workers' sockets changes are sent to."""
        return len(self._peers)

    @property
    def leads(self) -> bool:
        """Whether this worker has the lowest pid of the live workers it knows: the one that
        does what only one of them should (reconciliation's samples and checks)."""
        mine = os.getpid()
        return all(int(Path(peer).name.split("-", 1)[0]) > mine for peer in self._peers)

    def open(self) -> None:
        """Bind this worker's socket, find the others', and tell them this worker started."""
        self.directory.mkdir(mode=0o700, parents=True, exist_ok=True)
        with contextlib.suppress(FileNotFoundError):
            self.path.unlink()  # a dead process of the same pid left it
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        sock.setblocking(False)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4 << 20)
        sock.bind(str(self.path))
        self._socket = sock
        asyncio.get_running_loop().add_reader(sock.fileno(), self._receive)
        self.refresh()
        # Workers that started before this one would otherwise learn of it only at their
        # next refresh, and until then keep their changes from it.
        self._send(encode(HELLO, "", "", ()))

    def close(self) -> None:
        """Stop reading, close the socket and remove its file."""
        if self._socket is None:
            return
        with contextlib.suppress(Exception):
            asyncio.get_running_loop().remove_reader(self._socket.fileno())
        self._socket.close()
        self._socket = None
        with contextlib.suppress(FileNotFoundError):
            self.path.unlink()

    def refresh(self) -> None:
        """List the live peers' sockets; remove those their process left behind."""
        peers = []
        for path in self.directory.glob("*.sock"):
            if path == self.path:
                continue
            if _alive(path.stem.split("-", 1)[0]):
                peers.append(str(path))
            else:
                with contextlib.suppress(FileNotFoundError):
                    path.unlink()
        self._peers = sorted(peers)

    # -- sending --------------------------------------------------------------------------

    def placed(self, deployment: str, replica: str, hashes: Sequence[int]) -> None:
        """Tell the other workers that a prompt's blocks were placed on the replica."""
        if self._peers:
            self._send(encode(PLACED, deployment, replica, hashes))

    def corrected(
        self, deployment: str, replica: str, hashes: Sequence[int], reported: int, predicted: int
    ) -> None:
        """Tell the other workers the replica reported other cached blocks than predicted."""
        if self._peers:
            self._send(encode(CORRECTED, deployment, replica, hashes, reported, predicted))

    def turn(
        self, deployment: str, key: str, hashes: Sequence[int], prompt_tokens: int, block: int
    ) -> None:
        """An interaction's latest request (its key in the replica's place)."""
        if self._peers:
            self._send(encode(TURN, deployment, key, hashes, prompt_tokens, block))

    def _send(self, data: bytes) -> None:
        sock = self._socket
        if sock is None:
            return
        for peer in self._peers:
            try:
                sock.sendto(data, peer)
                self.sent += 1
            except OSError:
                # Full (a busy peer) or gone (a stopped one): this change is lost to it.
                self.dropped += 1

    # -- receiving ------------------------------------------------------------------------

    def _receive(self) -> None:
        sock = self._socket
        if sock is None:
            return
        for _ in range(256):  # then let requests run; the rest wait for the next turn
            try:
                data = sock.recv(RECEIVE_BYTES)
            except BlockingIOError:
                return
            try:
                message = decode(data)
                if message[0] == HELLO:
                    self.refresh()
                else:
                    self._apply(*message)
            except Exception:  # a malformed message must never stop the loop
                log.exception("peer message not applied")
            self.received += 1


def _alive(pid: str) -> bool:
    try:
        os.kill(int(pid), 0)
    except (ValueError, ProcessLookupError):
        return False
    except PermissionError:
        return True
    return True
