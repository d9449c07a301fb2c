"""An OTLP/HTTP traces receiver on loopback, decoding the real protobuf it is sent."""

from __future__ import annotations

import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.trace.v1.trace_pb2 import Span


class Receiver:
    """An OTLP/HTTP traces endpoint: every span it is sent, decoded from protobuf."""

    def __init__(self) -> None:
        self.spans: list[tuple[dict[str, Any], Span]] = []
        self.content_types: set[str] = set()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers["content-length"]))
                receiver.content_types.add(self.headers["content-type"])
                request = ExportTraceServiceRequest.FromString(body)
                for resource_spans in request.resource_spans:
                    resource = attributes(resource_spans.resource.attributes)
                    for scope_spans in resource_spans.scope_spans:
                        receiver.spans.extend((resource, s) for s in scope_spans.spans)
                self.send_response(200)
                self.send_header("content-type", "application/x-protobuf")
                self.send_header("content-length", "0")
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def wait(self, count: int, timeout_s: float = 20.0) -> list[tuple[dict[str, Any], Span]]:
        deadline = time.monotonic() + timeout_s
        while len(self.spans) < count and time.monotonic() < deadline:
            time.sleep(0.05)
        assert len(self.spans) == count, self.spans
        return self.spans


def attributes(values: Any) -> dict[str, Any]:
    """OTLP KeyValues as a dict of Python values."""
    out: dict[str, Any] = {}
    for kv in values:
        kind = kv.value.WhichOneof("value")
        out[kv.key] = getattr(kv.value, kind)
    return out
