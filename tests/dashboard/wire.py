"""A browser session without the browser: Streamlit's websocket and its protobufs.

It says what Streamlit's frontend says (``BackMsg.rerun_script`` with the page's URL path
and the widgets' values) and keeps every ``ForwardMsg`` the server sends back, raw, so a
test can look for data anywhere in them: elements, Arrow tables, chart specs, page lists.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any

from streamlit.proto.BackMsg_pb2 import BackMsg
from streamlit.proto.Element_pb2 import Element
from streamlit.proto.ForwardMsg_pb2 import ForwardMsg
from streamlit.proto.WidgetStates_pb2 import WidgetState
from websockets.sync.client import ClientConnection, connect

PAGES = ("", "tenants", "models", "routing", "requests")  # the URL paths st.navigation serves


@dataclass
class Run:
    """What the server sent for one rerun, until the script finished."""

    messages: list[ForwardMsg] = field(default_factory=list)
    raw: bytearray = field(default_factory=bytearray)

    def elements(self) -> Iterable[Element]:
        for message in self.messages:
            if message.WhichOneof("type") == "delta" and message.delta.HasField("new_element"):
                yield message.delta.new_element

    def text(self) -> str:
        return self.raw.decode("utf-8", errors="replace")

    def errors(self) -> list[str]:
        return [e.alert.body for e in self.elements() if e.WhichOneof("type") == "alert"]

    def widget_id(self, kind: str, label: str) -> str:
        """The id of the widget of ``kind`` (text_input, button, ...) labelled ``label``."""
        for element in self.elements():
            if element.WhichOneof("type") == kind and getattr(element, kind).label == label:
                return str(getattr(element, kind).id)
        raise LookupError(f"no {kind} labelled {label!r} in this run")


class Session:
    """One websocket session with a Streamlit server (a browser tab, as the server sees it)."""

    def __init__(self, base_url: str, *, headers: dict[str, str] | None = None) -> None:
        host = base_url.removeprefix("http://")
        connection = connect(
            f"ws://{host}/_stcore/stream",
            subprotocols=["streamlit"],  # type: ignore[list-item]
            origin=f"http://{host}",  # type: ignore[arg-type]
            additional_headers=headers or {},
            max_size=None,
            open_timeout=30,
        )
        self.socket: ClientConnection = connection.__enter__()  # closed by close()

    def run(
        self, page: str = "", widgets: Iterable[WidgetState] = (), timeout_s: float = 60
    ) -> Run:
        """Ask for a rerun of ``page`` (a URL path) with these widget values; its output."""
        message = BackMsg()
        message.rerun_script.page_name = page
        message.rerun_script.query_string = ""
        message.rerun_script.widget_states.widgets.extend(widgets)
        self.socket.send(message.SerializeToString())
        run = Run()
        deadline = time.monotonic() + timeout_s
        while True:
            data = self.socket.recv(timeout=max(deadline - time.monotonic(), 0.001))
            assert isinstance(data, bytes)
            run.raw += data
            forward = ForwardMsg()
            forward.ParseFromString(data)
            run.messages.append(forward)
            if (
                forward.WhichOneof("type") == "script_finished"
                and forward.script_finished != ForwardMsg.FINISHED_EARLY_FOR_RERUN
            ):
                return run

    def sign_in(self, password: str, page: str = "") -> Run:
        """Fill in the sign-in form and submit it, as a person would; the run that follows."""
        form = self.run(page)
        return self.run(page, submit(form, password))

    def close(self) -> None:
        self.socket.close()

    def __enter__(self) -> Session:
        return self

    def __exit__(self, *exc: type[BaseException] | BaseException | TracebackType | None) -> None:
        self.close()


def submit(form: Run, password: str) -> list[WidgetState]:
    """The widget values a browser sends when the sign-in form is submitted."""
    typed = WidgetState(id=form.widget_id("text_input", "Dashboard password"))
    typed.string_value = password
    pressed = WidgetState(id=form.widget_id("button", "Sign in"))
    pressed.trigger_value = True
    return [typed, pressed]


def found(haystack: Any, needles: Iterable[str]) -> list[str]:
    """Which of ``needles`` occur in ``haystack`` (bytes of messages, or text)."""
    data = haystack if isinstance(haystack, bytes | bytearray) else str(haystack).encode()
    return [n for n in needles if n.encode() in data]
