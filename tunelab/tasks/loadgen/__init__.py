"""The load generator: exact-length prompts and an async streaming client that records raw timings.

It produces *raw request records* (the contract with ``tasks.metrics.derive_request``): one dict per request
with the send time, the arrival time of every streamed chunk that carried generated text, the end time, the
server's usage and finish reason. Derived metrics (TTFT, ITL, TPOT, E2EL) are computed from these elsewhere,
in one place (``tasks.metrics``).

One module per job, each with the design choices behind it in its docstring:

* :mod:`.prompts`: prompts of an exact token count with the server's own tokenizer (:class:`PromptBuilder`);
* :mod:`.transport`: one streaming request and its timings: tunelab's own HTTP/1.1 transport with the
  kernel's receive stamps (:class:`RawPool`, :func:`send_streaming_raw`; its docstring says why tunelab keeps
  it) and httpx (:func:`send_streaming`), the :class:`Clock`, :func:`make_client`;
* :mod:`.scheduler`: a window's prompts sent on a load profile's schedule (concurrency slots or send offsets),
  in one event loop or over several load processes (:class:`ShardSpec`), :func:`run_level`,
  :class:`LevelResult`;
* :mod:`.sessions`: multi-turn chat sessions, each turn carrying the conversation so far, c sessions in
  flight (:func:`run_sessions`).

The names below are the public ones (``from tunelab.tasks.loadgen import run_level``).
"""

from tunelab.tasks.loadgen.prompts import PromptBuilder, PromptLengthError
from tunelab.tasks.loadgen.scheduler import LevelResult, ShardSpec, _rx_fields, run_level
from tunelab.tasks.loadgen.sessions import run_sessions
from tunelab.tasks.loadgen.transport import (Clock, RawPool, RxStats, make_client, prewarm_connections,
                                             send_streaming, send_streaming_raw)

__all__ = [
    "Clock",
    "PromptBuilder",
    "PromptLengthError",
    "send_streaming",
    "run_level",
    "run_sessions",
    "LevelResult",
    "ShardSpec",
    "make_client",
    "prewarm_connections",
    "RawPool",
    "RxStats",
    "send_streaming_raw",
]
