"""Kernel receive timestamps for the load generator's sockets (Linux ``SO_TIMESTAMPNS``).

Why: a timestamp taken when a Python event loop gets round to reading a socket is late by however long
the loop was busy with other streams or the process was descheduled. On a shared 2-core machine that is
0.1-6 ms at p99 and tens of ms under load, and it lands in every TTFT, ITL, TPOT and E2EL. With
``SO_TIMESTAMPNS`` the kernel stamps each received segment when it is queued on the socket, and
``recvmsg`` hands that stamp over with the bytes, so a late read no longer makes a late timestamp.

What the stamp means for TCP: the kernel reports the receive time of the *last* segment that a
``recvmsg`` copied from. A read that holds one SSE event (the usual case: servers write one event per
send, with ``TCP_NODELAY``) gets that event's arrival time. A read that holds several events, because the
client fell behind, gets the arrival time of the last of them for all of them: never later than the read
itself, so never worse than a stamp taken at the read.

The kernel stamp is on CLOCK_REALTIME; it is mapped onto ``time.perf_counter()`` (CLOCK_MONOTONIC on
Linux) with the offset between the two clocks read at the same read, so an NTP step between the segment's
arrival and the read (microseconds to milliseconds) is the only way for the mapping to go wrong. A mapped
stamp that is later than the read, or more than :data:`MAX_READ_DELAY_S` before it, is treated as wrong and
the read time is used instead.
"""

from __future__ import annotations

import socket
import struct
import sys
import time

__all__ = ["MAX_READ_DELAY_S", "enable", "recv_stamped"]

# Linux asm-generic and x86 ABIs: SO_TIMESTAMPNS (== SCM_TIMESTAMPNS) is 35, a struct timespec of two longs.
# Python's socket module does not export it; the value is only used on Linux.
_SO_TIMESTAMPNS = getattr(socket, "SO_TIMESTAMPNS", 35)
_TIMESPEC = struct.Struct("@ll")
_ANC_BUF = socket.CMSG_SPACE(_TIMESPEC.size) if hasattr(socket, "CMSG_SPACE") else 64

#: A kernel stamp more than this long before the read is not believed (a clock step): the read time is used.
MAX_READ_DELAY_S = 60.0


def enable(sock: socket.socket) -> bool:
    """Ask the kernel to stamp every segment received on ``sock``. Returns True when it will (Linux), False
    where the option is missing (then :func:`recv_stamped` returns read times only). Never raises."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        sock.setsockopt(socket.SOL_SOCKET, _SO_TIMESTAMPNS, 1)
    except OSError:
        return False
    return True


def recv_stamped(sock: socket.socket, bufsize: int, kernel: bool) -> tuple[bytes, float, float | None]:
    """One ``recvmsg`` on a non-blocking socket.

    Args:
        sock: a connected TCP socket (non-blocking).
        bufsize: most bytes to read.
        kernel: whether :func:`enable` succeeded on this socket (asks for the ancillary data).

    Returns:
        ``(data, read_perf, kernel_perf)``: the bytes (``b''`` at EOF), ``time.perf_counter()`` right after
        the read returned, and the kernel's receive stamp of the last segment read on the same perf_counter scale
        (None when there is none, or when it is not plausible: later than the read or more than
        :data:`MAX_READ_DELAY_S` before it).

    Raises:
        BlockingIOError / InterruptedError: nothing to read yet. OSError: the connection failed.
    """
    data, anc, _flags, _addr = sock.recvmsg(bufsize, _ANC_BUF if kernel else 0)
    t_read = time.perf_counter()
    t_kernel = None
    for level, kind, raw in anc:
        if level == socket.SOL_SOCKET and kind == _SO_TIMESTAMPNS and len(raw) >= _TIMESPEC.size:
            sec, ns = _TIMESPEC.unpack_from(raw)
            # realtime -> perf_counter with the offset read now: the two calls are ~100 ns apart.
            tk = sec + ns * 1e-9 - (time.time() - time.perf_counter())
            if t_read - MAX_READ_DELAY_S <= tk <= t_read + 1e-4:
                t_kernel = min(tk, t_read)
    return data, t_read, t_kernel
