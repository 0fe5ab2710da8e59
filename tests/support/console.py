"""The web console as the tests run it: ``tidelog console`` as a child process on a free
loopback port, and Debian's Chromium driven by Playwright, with every request the page makes
recorded.

Chromium is Debian's (/usr/bin/chromium, from ./dev setup); Playwright's own browsers are
never downloaded. Both are always stopped by the fixture that started them, by PID.
"""

from __future__ import annotations

import base64
import json
import os
import signal
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from tests.support.waiting import NotYet, wait_until
from tests.system.group_worker import die_with_parent
from tidelog.broker.zookeeper.zkserver import find_free_port

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync"]


def browser_problem() -> str | None:
    """Why the browser tests cannot run here, or None."""
    if not os.path.exists(CHROMIUM):
        return f"{CHROMIUM} is missing (./dev setup installs Debian's chromium)"
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        return "playwright is not installed (requirements-dev-lock.txt)"
    return None


def artifacts_dir(tmp_path_factory: Any) -> Path:
    """TIDELOG_TEST_ARTIFACTS/console when set (CI keeps it), else a pytest temporary directory."""
    root = os.environ.get("TIDELOG_TEST_ARTIFACTS")
    path = Path(root) / "console" if root else tmp_path_factory.mktemp("console-artifacts")
    path.mkdir(parents=True, exist_ok=True)
    return path


class ConsoleProcess:
    def __init__(self, bootstrap: str, log_path: Path, refresh_ms: int = 500, extra_args: list[str] | None = None,
                 env: dict[str, str] | None = None, ssl_context: Any = None, auth: tuple[str, str] | None = None):
        """``ssl_context``: the console serves HTTPS (``extra_args`` name its certificate) and
        is reached with this context; ``auth``: the login the test's own requests send."""
        self.port = find_free_port()
        self.url = f"{'https' if ssl_context else 'http'}://127.0.0.1:{self.port}"
        self.log_path = log_path
        self.args = [sys.executable, "-m", "tidelog.broker.cli", "console", "--bootstrap", bootstrap,
                     "--port", str(self.port), "--refresh-ms", str(refresh_ms), *(extra_args or [])]
        self.env = dict(os.environ, PYTHONUNBUFFERED="1", **(env or {}))
        self.ssl_context = ssl_context
        self.auth = auth
        self.proc: subprocess.Popen | None = None

    def start(self, timeout: float = 60.0) -> None:
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(self.args, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                         env=self.env, start_new_session=True, preexec_fn=die_with_parent)
        wait_until(self._serving, timeout, f"the console on {self.url} (log {self.log_path})", interval=0.2)

    def _serving(self) -> bool:
        if self.proc is not None and self.proc.poll() is not None:
            raise AssertionError(f"the console exited with {self.proc.returncode}: "
                                 f"{self.log_path.read_text(errors='replace')[-3000:]}")
        return self.get("/api/overview").get("brokers") is not None

    def get(self, path: str) -> dict:
        return self.request("GET", path)[1]

    def request(self, method: str, path: str, body: Any = None, auth: tuple[str, str] | None = None
                ) -> tuple[int, dict]:
        """(status, JSON answer) of a request to the console, with ``auth`` or the default login."""
        headers = {"Content-Type": "application/json"}
        login = auth or self.auth
        if login is not None:
            headers["Authorization"] = "Basic " + base64.b64encode(f"{login[0]}:{login[1]}".encode()).decode()
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(self.url + path, data=data, method=method, headers=headers)
        try:
            with urllib.request.urlopen(req, timeout=30, context=self.ssl_context) as r:
                return r.status, json.loads(r.read())
        except urllib.error.HTTPError as e:
            raw = e.read() or b"{}"
            try:
                return e.code, json.loads(raw)
            except ValueError:
                return e.code, {"text": raw.decode(errors="replace")}

    def stop(self) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(15)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


class Browser:
    """One headless Chromium with a fresh profile, and the URLs of every request its pages made."""

    def __init__(self, profile: Path):
        from playwright.sync_api import sync_playwright

        self.requests: list[str] = []
        self._playwright = sync_playwright().start()
        try:
            self.context = self._playwright.chromium.launch_persistent_context(
                str(profile), executable_path=CHROMIUM, args=CHROMIUM_ARGS, headless=True,
                viewport={"width": 1280, "height": 900})
        except BaseException:
            self._playwright.stop()
            raise
        self.context.on("request", lambda request: self.requests.append(request.url))
        self.page = self.context.pages[0] if self.context.pages else self.context.new_page()
        self.page.set_default_timeout(30000)

    def close(self) -> None:
        try:
            self.context.close()
        finally:
            self._playwright.stop()


def poll(condition: Any, timeout: float, message: str) -> Any:
    """``wait_until`` for page conditions: a Playwright error (an element not there yet)
    counts as "not yet"."""
    from playwright.sync_api import Error as PlaywrightError

    def attempt() -> Any:
        try:
            return condition()
        except PlaywrightError as e:
            return NotYet(str(e).splitlines()[0])
    return wait_until(attempt, timeout, message, interval=0.2)
