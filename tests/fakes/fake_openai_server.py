"""FAKE OpenAI-compatible server for the engine lifecycle tests: injected faults with exact timing.

Not vLLM. It takes the argv tunelab gives ``vllm serve`` (``MODEL --host H --port P --api-key K
--served-model-name N [engine args...]``; unknown engine args are ignored) plus fault options, and serves
``/health``, ``/v1/models`` and ``/v1/completions`` with the stdlib HTTP server, so it starts in well under a
second. It logs one line per event to stdout (the trial's log file), e.g. ``FAKE completion 503 (1/3)``.

Faults (options may appear anywhere in argv):
    --mode ok            answer normally (after the other delays/failures)
    --mode hang          never bind the port; just stay alive
    --mode hang-health   bind and accept, but never answer any request
    --fail-completions N answer the first N completions with 503 (/health is 200 all along)
    --die-after-s S      exit with --exit-code (default 3) S seconds after start, children left alive
    --children N         start N child processes in the same process group (like EngineCore/workers)
    --ignore-sigterm     the server and its children ignore SIGTERM (only SIGKILL stops them)
    --reuse-port         bind with SO_REUSEPORT, as vLLM does
    --no-auth            accept any API key
    --write-tmp          write files into $TMPDIR and $VLLM_RPC_BASE_PATH (as vLLM's zmq sockets and caches)
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

_CHILD = "import signal, time\n{ign}\nwhile True:\n    time.sleep(0.2)\n"


def _log(msg: str) -> None:
    print(f"FAKE {msg}", flush=True)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("model")
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--api-key", default="")
    ap.add_argument("--served-model-name", default="fake")
    ap.add_argument("--mode", choices=["ok", "hang", "hang-health"], default="ok")
    ap.add_argument("--fail-completions", type=int, default=0)
    ap.add_argument("--die-after-s", type=float, default=None)
    ap.add_argument("--exit-code", type=int, default=3)
    ap.add_argument("--children", type=int, default=0)
    ap.add_argument("--ignore-sigterm", action="store_true")
    ap.add_argument("--reuse-port", action="store_true")
    ap.add_argument("--no-auth", action="store_true")
    ap.add_argument("--write-tmp", action="store_true")
    args, unknown = ap.parse_known_args(argv)
    _log(f"start pid={os.getpid()} port={args.port} model={args.served_model_name} ignored_args={unknown}")

    if args.ignore_sigterm:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    else:
        signal.signal(signal.SIGTERM, lambda *_: (_log("SIGTERM"), os._exit(0)))
    for _ in range(args.children):
        code = _CHILD.format(ign="signal.signal(signal.SIGTERM, signal.SIG_IGN)" if args.ignore_sigterm else "")
        p = subprocess.Popen([sys.executable, "-c", code])
        _log(f"child pid={p.pid}")
    if args.write_tmp:
        for var in ("TMPDIR", "VLLM_RPC_BASE_PATH"):
            d = os.environ.get(var)
            if d:
                os.makedirs(os.path.join(d, "fake_sub"), exist_ok=True)
                with open(os.path.join(d, "fake_sub", "state.bin"), "wb") as f:
                    f.write(b"\0" * 1024)
        _log("wrote tmp files")
    if args.die_after_s is not None:
        def die() -> None:
            time.sleep(args.die_after_s)
            _log(f"dying with code {args.exit_code}")
            os._exit(args.exit_code)

        threading.Thread(target=die, daemon=True).start()

    if args.mode == "hang":
        while True:
            time.sleep(1)

    state = {"completions": 0}
    lock = threading.Lock()

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *a) -> None:  # quiet: we log our own lines
            pass

        def _send(self, code: int, body: dict) -> None:
            data = json.dumps(body).encode()
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def _authorized(self) -> bool:
            if args.no_auth or not args.api_key:
                return True
            if self.headers.get("Authorization") == f"Bearer {args.api_key}":
                return True
            self._send(401, {"error": "Unauthorized"})
            return False

        def do_GET(self) -> None:
            if args.mode == "hang-health":
                time.sleep(3600)
            if self.path == "/health":
                self._send(200, {})
            elif self.path == "/v1/models":
                if self._authorized():
                    self._send(200, {"object": "list", "data": [{"id": args.served_model_name, "object": "model",
                                                                  "created": 0, "owned_by": "vllm"}]})
            else:
                self._send(404, {"error": "not found"})

        def do_POST(self) -> None:
            if args.mode == "hang-health":
                time.sleep(3600)
            n = int(self.headers.get("Content-Length") or 0)
            body = json.loads(self.rfile.read(n) or b"{}")
            if self.path != "/v1/completions":
                self._send(404, {"error": "not found"})
                return
            if not self._authorized():
                return
            with lock:
                state["completions"] += 1
                k = state["completions"]
            if k <= args.fail_completions:
                _log(f"completion 503 ({k}/{args.fail_completions})")
                self._send(503, {"error": "engine not ready"})
                return
            if body.get("model") != args.served_model_name:
                self._send(404, {"error": f"model {body.get('model')} does not exist"})
                return
            _log(f"completion 200 ({k})")
            self._send(200, {"id": f"cmpl-{k}", "object": "text_completion", "created": int(time.time()),
                             "model": args.served_model_name,
                             "choices": [{"index": 0, "text": " x", "finish_reason": "length"}],
                             "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}})

    class Server(ThreadingHTTPServer):
        daemon_threads = True

        def server_bind(self) -> None:
            self.socket.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            if args.reuse_port:
                self.socket.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
            super().server_bind()

    srv = Server((args.host, args.port), Handler)
    _log(f"listening on {args.host}:{args.port}")
    srv.serve_forever()


if __name__ == "__main__":
    main()
