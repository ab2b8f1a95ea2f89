"""Test support: a real lockagent process per test, and deadline-bound polls.

The binary is ``$LOCKAGENT_BIN`` if set, else built once per test run from
the repository's ``./cmd/lockagent``. The repository is the one the tests
are in, or ``$LOCKAGENT_REPO``: the tests of an installed client run from
a copy, away from the checkout.
"""

import atexit
import os
import shutil
import socket
import subprocess
import tempfile
import time
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.environ.get("LOCKAGENT_REPO") or os.path.dirname(os.path.dirname(HERE))

# What would lead a process the tests start to another agent
# (LOCKAGENT_SOCKET overrides an agent's config, and the README has its
# reader export it), to the host's systemd or to the user's directories,
# besides every LOCKAGENT_ variable: the tests never depend on the shell
# they run in.
_SCRUBBED = ("HOME", "XDG_RUNTIME_DIR", "XDG_STATE_HOME", "NOTIFY_SOCKET", "INVOCATION_ID",
             "LISTEN_FDS", "LISTEN_PID", "LISTEN_FDNAMES", "WATCHDOG_USEC", "WATCHDOG_PID",
             "JOURNAL_STREAM", "CREDENTIALS_DIRECTORY")

_binary = None
_home = None


def lockagent_bin():
    """The lockagent binary under test, built on first use with the race
    detector (an agent that reports a race fails its test: see Agent.cleanup)."""
    global _binary
    if _binary is None:
        _binary = os.environ.get("LOCKAGENT_BIN")
        if not _binary:
            out = tempfile.mkdtemp(prefix="la-bin")
            atexit.register(shutil.rmtree, out, True)
            path = os.path.join(out, "lockagent")
            subprocess.run(["go", "build", "-race", "-o", path, "./cmd/lockagent"], cwd=REPO,
                           check=True)
            _binary = path
    return _binary


def clean_env(**extra):
    """The test's environment for a process it starts (an agent, a client
    command, an example), with ``extra`` set: without ``_SCRUBBED`` and the
    LOCKAGENT_ variables, HOME and XDG_RUNTIME_DIR a directory of the test
    run's, so that a default socket or state directory the process derives
    lies there."""
    global _home
    if _home is None:
        _home = tempfile.mkdtemp(prefix="la-home")
        atexit.register(shutil.rmtree, _home, True)
    env = {k: v for k, v in os.environ.items()
           if k not in _SCRUBBED and not k.startswith("LOCKAGENT_")}
    env.update(HOME=_home, XDG_RUNTIME_DIR=_home)
    env.update(extra)
    return env


def wait_until(predicate, timeout=5.0, what="the condition"):
    """Poll ``predicate`` until it returns a true value, which is returned;
    fail after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError("timed out after %.1fs waiting for %s" % (timeout, what))
        time.sleep(0.005)


def drop_answer_with_connection(client, pick):
    """Break the client's connection as the first answer ``pick`` accepts
    arrives, unread: as if the connection broke just before it."""
    on_answer = client._on_answer

    def drop(conn, msg):
        if pick(msg):
            client._on_answer = on_answer
            conn.kill()
            return
        on_answer(conn, msg)

    client._on_answer = drop


def can_connect(path):
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        s.connect(path)
        return True
    except OSError:
        return False
    finally:
        s.close()


class Agent:
    """A lockagent process with its socket and state in a temporary directory.

    ``config`` is HCL added to the generated configuration file.
    """

    def __init__(self, config=""):
        self.dir = tempfile.mkdtemp(prefix="la", dir="/tmp")  # socket paths are short
        self.socket = os.path.join(self.dir, "a.sock")
        self.config = os.path.join(self.dir, "agent.hcl")
        self.log = os.path.join(self.dir, "agent.log")
        with open(self.config, "w") as f:
            f.write('socket { path = "%s" }\nstate_dir = "%s"\n%s\n'
                    % (self.socket, os.path.join(self.dir, "state"), config))
        self.proc = None
        self.start()

    def start(self):
        with open(self.log, "ab") as log:
            # A race-detecting agent exits without the detector's second of
            # sleep.
            self.proc = subprocess.Popen([lockagent_bin(), "agent", "-config", self.config],
                                         stdout=log, stderr=subprocess.STDOUT,
                                         env=clean_env(GORACE="atexit_sleep_ms=0"))
        wait_until(lambda: self.proc.poll() is not None or can_connect(self.socket), 10,
                   "the agent to listen")
        if self.proc.poll() is not None:
            raise AssertionError("the agent exited with %s:\n%s" % (self.proc.returncode,
                                                                    self.read_log()))

    def stop(self):
        """Stop the agent with SIGTERM, as an operator would."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()

    def cleanup(self):
        self.stop()
        log = self.read_log()
        shutil.rmtree(self.dir, ignore_errors=True)
        if "WARNING: DATA RACE" in log:
            raise AssertionError("the agent reported a data race:\n" + log)

    def read_log(self):
        with open(self.log, errors="replace") as f:
            return f.read()

    def ctl(self, *args, socket_path=None):
        """Run ``lockagent ctl ARGS`` against this agent; the completed process."""
        return subprocess.run([lockagent_bin(), "ctl"] + list(args), capture_output=True,
                              text=True, timeout=10,
                              env=clean_env(LOCKAGENT_SOCKET=socket_path or self.socket))

    def hide_socket(self):
        """Move the socket file away: new connections fail, existing ones live on.
        Returns the path it is reachable at meanwhile."""
        hidden = self.socket + ".hidden"
        os.rename(self.socket, hidden)
        return hidden

    def unhide_socket(self):
        os.rename(self.socket + ".hidden", self.socket)


class AgentTestCase(unittest.TestCase):
    """A test case with a fresh agent per test (``self.agent``)."""

    agent_config = ""

    def setUp(self):
        self.agent = Agent(self.agent_config)
        self.addCleanup(self.agent.cleanup)

    def client(self, **kwargs):
        """A Client of this test's agent, closed at the end of the test."""
        import lockagent
        c = lockagent.Client(self.agent.socket, **kwargs)
        self.addCleanup(c.close)
        return c


def break_connection(client):
    """Cut a client's connection to the agent, as a failure would: both ends
    see it end, and nothing is said first."""
    client._conn.kill()
