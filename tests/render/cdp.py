"""A small Chrome DevTools Protocol client for driving headless Chromium in tests.

Only what the viewer tests need: open a page, evaluate script, click at a point, collect console
errors and network requests, take a screenshot. Chromium is started with its own throw-away
profile and stopped by its process id.
"""

from __future__ import annotations

import base64
import json
import shutil
import os
import signal
import subprocess
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

CHROMIUM_FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--remote-debugging-port=0",
    "--window-size=1400,900",
)


def find_chromium() -> str | None:
    for candidate in ("/usr/bin/chromium", "chromium", "chromium-browser", "google-chrome"):
        found = shutil.which(candidate)
        if found:
            return found
    return None


class Page:
    """One browser tab over a DevTools websocket; events are kept in arrival order."""

    def __init__(self, socket: Any) -> None:
        self.socket = socket
        self.events: list[dict[str, Any]] = []
        self._next_id = 0

    def send(self, method: str, **params: Any) -> dict[str, Any]:
        self._next_id += 1
        message_id = self._next_id
        self.socket.send(json.dumps({"id": message_id, "method": method, "params": params}))
        while True:
            message = json.loads(self.socket.recv())
            if message.get("id") == message_id:
                if "error" in message:
                    raise RuntimeError(f"{method} failed: {message['error']}")
                return message.get("result", {})
            self.events.append(message)

    def wait_for(self, event: str, timeout_s: float = 15.0) -> dict[str, Any]:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            for message in self.events:
                if message.get("method") == event:
                    return message
            self.socket.settimeout(max(deadline - time.monotonic(), 0.01))
            try:
                self.events.append(json.loads(self.socket.recv()))
            finally:
                self.socket.settimeout(None)
        raise TimeoutError(f"no {event} within {timeout_s} s")

    def evaluate(self, expression: str) -> Any:
        result = self.send(
            "Runtime.evaluate", expression=expression, returnByValue=True, awaitPromise=True
        )
        if "exceptionDetails" in result:
            raise RuntimeError(f"script failed: {result['exceptionDetails']}")
        return result["result"].get("value")

    def click(self, x: float, y: float) -> None:
        for kind in ("mouseMoved", "mousePressed", "mouseReleased"):
            self.send(
                "Input.dispatchMouseEvent",
                type=kind,
                x=x,
                y=y,
                button="left",
                clickCount=0 if kind == "mouseMoved" else 1,
            )

    def screenshot(self, path: Path) -> None:
        data = self.send("Page.captureScreenshot", format="png")["data"]
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(base64.b64decode(data))

    def console_errors(self) -> list[str]:
        errors = []
        for message in self.events:
            method, params = message.get("method"), message.get("params", {})
            if method == "Runtime.exceptionThrown":
                errors.append(json.dumps(params["exceptionDetails"])[:500])
            elif method == "Runtime.consoleAPICalled" and params.get("type") in ("error", "assert"):
                errors.append(json.dumps(params.get("args"))[:500])
            elif method == "Log.entryAdded" and params["entry"].get("level") == "error":
                errors.append(params["entry"].get("text", ""))
        return errors

    def requested_urls(self) -> list[str]:
        return [
            m["params"]["request"]["url"]
            for m in self.events
            if m.get("method") == "Network.requestWillBeSent"
        ]


@contextmanager
def open_page(chromium: str, url: str) -> Iterator[Page]:
    """Start Chromium, load ``url`` with console, log and network events recorded."""
    import websocket  # test dependency: websocket-client

    with tempfile.TemporaryDirectory(prefix="llmc-chromium-") as profile:
        process = subprocess.Popen(
            [chromium, *CHROMIUM_FLAGS, f"--user-data-dir={profile}", "about:blank"],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
        try:
            port = _devtools_port(Path(profile), process)
            socket = websocket.create_connection(
                _page_socket_url(port), timeout=30, suppress_origin=True
            )
            try:
                page = Page(socket)
                for domain in ("Page", "Runtime", "Log", "Network"):
                    page.send(f"{domain}.enable")
                page.send("Page.navigate", url=url)
                page.wait_for("Page.loadEventFired")
                yield page
            finally:
                socket.close()
        finally:
            # the whole session: Chromium's helper processes write into the profile too, and
            # one still writing when the folder is removed failed its cleanup now and then
            for sig in (signal.SIGTERM, signal.SIGKILL):
                try:
                    os.killpg(process.pid, sig)
                except ProcessLookupError:
                    break  # every process of the session has exited
                try:
                    process.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    continue
            process.wait(timeout=10)


def _devtools_port(profile: Path, process: subprocess.Popen[bytes], timeout_s: float = 30.0) -> int:
    """Chromium writes the port it chose for ``--remote-debugging-port=0`` into the profile."""
    marker = profile / "DevToolsActivePort"
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"chromium exited with status {process.returncode}")
        if marker.exists():
            lines = marker.read_text().splitlines()
            if lines and lines[0].isdigit():
                return int(lines[0])
        time.sleep(0.05)
    raise TimeoutError("chromium did not open its DevTools port")


def _page_socket_url(port: int, timeout_s: float = 15.0) -> str:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/json/list", timeout=5) as response:
            targets = json.loads(response.read())
        pages = [t for t in targets if t.get("type") == "page"]
        if pages:
            return pages[0]["webSocketDebuggerUrl"]
        time.sleep(0.05)
    raise TimeoutError("chromium opened no page")
