"""Shared pytest fixtures. Each block is owned by the test suite that needs it; add yours as a new block."""

from __future__ import annotations

import faulthandler

# ---------------------------------------------------------------------------------------------- MQTT broker
# A real broker on 127.0.0.1 at a free port: mosquitto when it is on PATH (.ci/run installs it), else the
# embeddable amqtt broker (pip install amqtt) run in a subprocess, so tests can stop, restart and kill it like
# the real thing. Tests that need it are marked @pytest.mark.mqtt.
import os
import shutil
import signal
import socket
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

# pytest-xdist's workers run with COLUMNS=80 and LINES=24 in their environment, and a program started from a test
# inherits them: Textual takes them over the terminal's own size, so kvtop in a 120x40 tmux pane drew an 80x24
# screen and the tmux tests failed only in parallel. Nothing here needs them (a terminal's size comes from the pty).
for _name in ("COLUMNS", "LINES"):
    os.environ.pop(_name, None)

# A suite started as a background job of a non-interactive shell (`.ci/run &`, a CI runner's script) starts with
# SIGINT ignored, and an ignored signal stays ignored across exec: every kvtop a test starts then ignores the Ctrl-C
# the SIGINT tests send, and exits 0 at its own end instead of 130 (test_trust and test_sim_forked failed so). A
# handler of Python's own is not inherited (exec resets it to the default), so the programs the tests start get
# SIGINT's default again, as from a terminal.
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)

_AMQTT_MAIN = textwrap.dedent("""
    import asyncio, sys
    from amqtt.broker import Broker

    async def main(port):
        broker = Broker({
            "listeners": {"default": {"type": "tcp", "bind": f"127.0.0.1:{port}", "max_connections": 1000}},
            "plugins": {"amqtt.plugins.authentication.AnonymousAuthPlugin": {"allow_anonymous": True}},
        })
        await broker.start()
        await asyncio.Event().wait()

    asyncio.run(main(int(sys.argv[1])))
""")


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _port_open(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.settimeout(0.2)
        return s.connect_ex(("127.0.0.1", port)) == 0


class MqttBroker:
    """A broker subprocess: ``url(prefix)``, ``stop()``, ``start()``, ``restart()``, ``kill()``."""

    def __init__(self, workdir: Path, kind: str | None = None, port: int | None = None,
                 users: dict[str, str] | None = None):
        self.kind = kind or ("mosquitto" if shutil.which("mosquitto") else "amqtt")
        self.host = "127.0.0.1"
        self.port = port or free_port()
        self.workdir = workdir
        self.users = users or {}
        self.log = workdir / f"{self.kind}-{self.port}.log"
        self.proc: subprocess.Popen[bytes] | None = None

    def url(self, prefix: str = "", user: str | None = None) -> str:
        return f"mqtt://{user + '@' if user else ''}{self.host}:{self.port}/{prefix}"

    def _command(self) -> list[str]:
        if self.kind == "mosquitto":
            conf = self.workdir / f"mosquitto-{self.port}.conf"
            lines = [f"listener {self.port} {self.host}", "persistence false"]
            if hasattr(os, "geteuid") and os.geteuid() == 0:
                # Started as root, mosquitto drops to user "mosquitto", who cannot read pytest's 0700 tmp dirs.
                lines.append("user root")
            if self.users:
                pwfile = self.workdir / f"passwd-{self.port}"
                pwfile.write_text("".join(f"{u}:{p}\n" for u, p in self.users.items()))
                pwfile.chmod(0o600)
                # mosquitto_passwd -U hashes the plain-text file in place (mosquitto 2 refuses plain text).
                subprocess.run(["mosquitto_passwd", "-U", str(pwfile)], check=True, capture_output=True)
                lines += ["allow_anonymous false", f"password_file {pwfile}"]
            else:
                lines.append("allow_anonymous true")
            conf.write_text("\n".join(lines) + "\n")
            return ["mosquitto", "-c", str(conf)]
        if self.users:
            pytest.skip("broker authentication is tested with mosquitto only")
        return [sys.executable, "-c", _AMQTT_MAIN, str(self.port)]

    def start(self, timeout: float = 10.0) -> None:
        assert self.proc is None or self.proc.poll() is not None, "broker already running"
        with self.log.open("ab") as log:
            self.proc = subprocess.Popen(self._command(), stdout=log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + timeout
        while not _port_open(self.port):
            if self.proc.poll() is not None:
                raise RuntimeError(f"{self.kind} exited with {self.proc.returncode}: {self.log.read_text()[-2000:]}")
            if time.monotonic() > deadline:
                self.kill()
                raise RuntimeError(f"{self.kind} did not listen on {self.port} within {timeout} s")
            time.sleep(0.02)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
        # Wait until the port is free again, so a restart can bind it (the listener closes with the process).
        deadline = time.monotonic() + 5
        while _port_open(self.port) and time.monotonic() < deadline:
            time.sleep(0.02)

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(5)

    def restart(self, down_s: float = 0.0) -> None:
        self.stop()
        time.sleep(down_s)
        self.start()


def _broker_available(kind: str | None) -> str | None:
    if kind == "mosquitto" or (kind is None and shutil.which("mosquitto")):
        return None if shutil.which("mosquitto") else "mosquitto is not on PATH"
    try:
        import amqtt  # noqa: F401
    except ImportError:
        return "no MQTT broker: install mosquitto (apt-get install mosquitto) or amqtt (pip install amqtt)"
    return None


@pytest.fixture
def mqtt_broker(tmp_path: Path) -> Iterator[MqttBroker]:
    """A running broker (mosquitto, else amqtt; ``KVTOP_TEST_BROKER=amqtt`` forces amqtt)."""
    kind = os.environ.get("KVTOP_TEST_BROKER") or None
    why = _broker_available(kind)
    if why:
        pytest.skip(why)
    broker = MqttBroker(tmp_path, kind)
    broker.start()
    try:
        yield broker
    finally:
        broker.kill()


@pytest.fixture
def mqtt_broker_auth(tmp_path: Path) -> Iterator[MqttBroker]:
    """A mosquitto that requires user ``kv`` with password ``s3cret-pw-91`` (skips without mosquitto_passwd)."""
    if not shutil.which("mosquitto") or not shutil.which("mosquitto_passwd"):
        pytest.skip("needs mosquitto and mosquitto_passwd")
    broker = MqttBroker(tmp_path, "mosquitto", users={"kv": "s3cret-pw-91"})
    broker.start()
    try:
        yield broker
    finally:
        broker.kill()


# ---------------------------------------------------------------------------------------------- hang guard
@pytest.fixture(autouse=True)
def _fail_instead_of_hanging() -> Iterator[None]:
    """A dead engine thread would leave generate()/result() waiting forever: a test still running after 90 s
    ends the run with every thread's traceback instead (pytest-timeout is not a dependency; the slowest test
    takes ~20 s on the 2-core CI machine)."""
    faulthandler.dump_traceback_later(90, exit=True)
    yield
    faulthandler.cancel_dump_traceback_later()


# ---------------------------------------------------------------------------------------------- settings file
@pytest.fixture(autouse=True)
def _private_config_home(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> None:
    """The dashboard remembers its theme and layout in the settings file (kvtop.settings.remember_choices): no test,
    nor a kvtop a test starts, may read or write the user's own ~/.config/kvtop (KVTOP_CONFIG unset too)."""
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path_factory.getbasetemp() / "xdg-config"))
    monkeypatch.delenv("KVTOP_CONFIG", raising=False)


# ---------------------------------------------------------------------------------------------- dashboard clock
@pytest.fixture
def frozen_ui_clock(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """The dashboard's uptime and log times from a fixed clock, in UTC whatever the machine's zone, so snapshots
    and pilot tests see the same screen everywhere (harlequin freezes its clock the same way). Imported lazily:
    only the UI tests may pull in Textual."""
    import time

    from recordings import FROZEN_NOW

    from kvtop.ui import app as app_module

    monkeypatch.setattr(app_module, "wall_clock", lambda: FROZEN_NOW)
    monkeypatch.setenv("TZ", "UTC")
    time.tzset()
    yield
    monkeypatch.undo()
    time.tzset()


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """The suite runs in parallel (pytest-xdist, ``-n auto --dist loadgroup`` in pyproject.toml): the tests that
    drive a real terminal (tmux) wait for the screen with deadlines, and two of them at once beside the other
    workers missed theirs on a loaded 2-core box (a 1,000-source fleet and a replay each want a core): they run
    one after another, on one worker."""
    for item in items:
        if item.get_closest_marker("tmux") is not None:
            item.add_marker(pytest.mark.xdist_group("terminal"))
