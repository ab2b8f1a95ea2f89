"""Tests of the blocking client against a real agent process."""

import asyncio
import json
import math
import os
import re
import socket
import sys
import tempfile
import threading
import unittest
from unittest import mock

import lockagent
from harness import REPO, AgentTestCase, break_connection, drop_answer_with_connection, wait_until


def detached(client, session):
    """Whether the agent lists ``session`` as waiting to be resumed."""
    return any(s["session"] == session and not s["attached"] for s in client.list_sessions())


# Where the client's modules are, to tell its frames in a stack.
PACKAGE_DIR = os.path.dirname(os.path.abspath(lockagent.__file__))


def waits_in(thread, function):
    """Whether ``thread`` is blocked in a wait (an event's, a condition's)
    inside the client's ``function``, as its stack shows (CPython's
    sys._current_frames): how a test tells a call that blocks from one
    that is slow to return."""
    frame = sys._current_frames().get(thread.ident)
    if frame is None or frame.f_code.co_name != "wait" \
            or os.path.basename(frame.f_code.co_filename) != "threading.py":
        return False
    while frame is not None:
        if frame.f_code.co_name == function \
                and os.path.dirname(os.path.abspath(frame.f_code.co_filename)) == PACKAGE_DIR:
            return True
        frame = frame.f_back
    return False


class SocketPathTest(unittest.TestCase):
    def test_default_path_follows_the_agent(self):
        cases = [
            (0, {}, "/run/lockagent/agent.sock"),
            (1000, {"INVOCATION_ID": "x"}, "/run/lockagent/agent.sock"),
            (1000, {"NOTIFY_SOCKET": "/run/systemd/notify"}, "/run/lockagent/agent.sock"),
            (1000, {"XDG_RUNTIME_DIR": "/run/user/1000/"}, "/run/user/1000/lockagent.sock"),
            (1000, {"XDG_RUNTIME_DIR": "relative"}, "/tmp/lockagent-1000/agent.sock"),
            (1000, {"TMPDIR": "/var/tmp"}, "/var/tmp/lockagent-1000/agent.sock"),
            (1000, {}, "/tmp/lockagent-1000/agent.sock"),
        ]
        for euid, env, want in cases:
            with self.subTest(euid=euid, env=env):
                self.assertEqual(lockagent.default_socket_path(euid, env), want)

    def test_explicit_path_then_environment(self):
        env = {"LOCKAGENT_SOCKET": "/srv/la.sock", "XDG_RUNTIME_DIR": "/run/user/1"}
        self.assertEqual(lockagent.socket_path("/x.sock", env), "/x.sock")
        self.assertEqual(lockagent.socket_path(None, env), "/srv/la.sock")
        env["LOCKAGENT_SOCKET"] = ""
        self.assertEqual(lockagent.socket_path(None, env),
                         lockagent.default_socket_path(environ=env))


class PrivateDirTest(unittest.TestCase):
    """A socket in lockagent-UID in the temporary directory is used only if
    that directory is the user's own and private: anybody could make it."""

    def test_refused_unless_private(self):
        with tempfile.TemporaryDirectory() as tmp, \
                mock.patch.dict(os.environ, {"TMPDIR": tmp}):
            directory = os.path.join(tmp, "lockagent-%d" % os.geteuid())
            os.mkdir(directory, 0o777)
            os.chmod(directory, 0o777)
            path = os.path.join(directory, "agent.sock")
            with self.assertRaisesRegex(lockagent.AgentConnectionError, "not a directory private"):
                lockagent.Client(path=path).ping()
            with self.assertRaisesRegex(lockagent.AgentConnectionError, "not a directory private"):
                asyncio.run(lockagent.AsyncClient.connect(path=path))
            os.chmod(directory, 0o700)
            # Private: the client goes on to connect (and finds no agent).
            with self.assertRaisesRegex(lockagent.AgentConnectionError, "No such file"):
                lockagent.Client(path=path).ping()


class ErrorMappingTest(unittest.TestCase):
    def test_every_protocol_code_has_its_exception(self):
        # The codes of docs/protocol.md's table of error codes.
        doc = os.path.join(REPO, "docs", "protocol.md")
        with open(doc, encoding="utf-8") as f:
            table = f.read().split("## Error codes", 1)[1].split("\n## ", 1)[0]
        codes = re.findall(r"^\| `([a-z_]+)` \|", table, re.M)
        self.assertIn("tokens_exhausted", codes)
        seen = set()
        for code in codes:
            cls = lockagent._errors.ERRORS[code]
            self.assertTrue(issubclass(cls, lockagent.ProtocolError))
            seen.add(cls)
        self.assertEqual(len(seen), len(codes))
        self.assertEqual(set(lockagent._errors.ERRORS), set(codes))


class ConnectTest(AgentTestCase):
    def test_hello_reports_the_session_and_the_agent(self):
        c = self.client(client="unit-test")
        self.assertTrue(c.session.startswith("s_"))
        self.assertTrue(c.resume_token)
        self.assertFalse(c.resumed)
        self.assertEqual(c.agent["backend"], "memory")
        self.assertEqual(c.agent["ttl_ms"]["default"], 15000)
        [mine] = [s for s in c.list_sessions() if s["session"] == c.session]
        self.assertEqual(mine["client"], "unit-test")
        self.assertEqual(mine["pid"], os.getpid())

    def test_finds_the_agent_through_the_environment(self):
        with mock.patch.dict(os.environ, {"LOCKAGENT_SOCKET": self.agent.socket}):
            with lockagent.Client() as c:
                self.assertEqual(c.path, self.agent.socket)
                c.ping()

    def test_no_agent(self):
        with self.assertRaises(lockagent.AgentConnectionError) as cm:
            lockagent.Client(os.path.join(self.agent.dir, "nobody.sock"))
        self.assertIsInstance(cm.exception, ConnectionError)

    def test_close_ends_the_session_and_releases_every_lease(self):
        c = lockagent.Client(self.agent.socket, session_ttl=60)
        a = c.acquire("c/1")
        b = c.acquire("c/2", scope="session")
        c.close()
        self.assertTrue(c.closed)
        for lease in (a, b):
            self.assertFalse(lease.active)
            self.assertFalse(lease.lost)
        other = self.client()
        other.acquire("c/1")
        other.acquire("c/2")
        with self.assertRaises(lockagent.AgentConnectionError):
            c.ping()


class ConcurrentCloseTest(AgentTestCase):
    def hold(self, c, method, when=lambda *args: True):
        """Hold c's ``method`` before it runs, for the calls ``when`` accepts.
        Returns (reached, go, ran): reached is set once a call waits, go
        lets it go on, and ran is set once the held call has returned."""
        reached, go, ran = threading.Event(), threading.Event(), threading.Event()
        original = getattr(c, method)

        def held(*args, **kwargs):
            if not when(*args):
                return original(*args, **kwargs)
            reached.set()
            go.wait()
            try:
                return original(*args, **kwargs)
            finally:
                ran.set()

        setattr(c, method, held)
        self.addCleanup(go.set)  # so that the client can close
        return reached, go, ran

    def test_a_second_close_returns_once_the_close_is_complete(self):
        other = self.client()
        # Connected: the first close() is held before its bye; just after a
        # break: before it resumes the session to end it.
        for broken in (False, True):
            with self.subTest(broken=broken):
                name = "close-twice/%s" % broken
                c = self.client(session_ttl=30)
                c.acquire(name, scope="session")
                if broken:
                    # Hidden, the socket lets no reconnect end the session first.
                    self.agent.hide_socket()
                    break_connection(c)
                    wait_until(lambda: not c.connected, what="the client to see the break")
                    reached, go, ran = self.hold(c, "_end_detached")
                else:
                    reached, go, ran = self.hold(c, "_call_on", lambda conn, op, *rest: op == "bye")
                first = threading.Thread(target=c.close)
                first.start()
                self.assertTrue(reached.wait(5), "the first close() did not get to its end")
                if broken:
                    self.agent.unhide_socket()
                seen = []

                def second_close():
                    c.close()
                    seen.append(ran.is_set())

                second = threading.Thread(target=second_close)
                second.start()
                wait_until(lambda: not second.is_alive() or waits_in(second, "close"),
                           what="the second close() to return or wait")
                go.set()
                second.join(10)
                first.join(10)
                self.assertFalse(first.is_alive() or second.is_alive())
                self.assertEqual(seen, [True], "the second close() returned before the first "
                                               "had ended the session")
                self.assertTrue(c.closed)
                self.assertFalse(c.connected)
                other.acquire(name)  # a try: free at once


class AcquireTest(AgentTestCase):
    def test_try_is_granted_then_denied_with_the_holders(self):
        a, b = self.client(), self.client()
        lease = a.acquire("orders/42", meta="invoice run")
        self.assertTrue(lease.id.startswith("l_"))
        self.assertEqual((lease.name, lease.mode, lease.scope), ("orders/42", "exclusive",
                                                                  "connection"))
        self.assertEqual(lease.ttl_ms, 15000)
        self.assertGreater(lease.token, 0)
        with self.assertRaises(lockagent.NotAcquired) as cm:
            b.acquire("orders/42")
        self.assertEqual(cm.exception.reason, "held")
        [holder] = cm.exception.holders
        self.assertEqual((holder.mode, holder.token, holder.meta),
                         ("exclusive", lease.token, "invoice run"))

    def test_lock_context_manager_releases(self):
        a, b = self.client(), self.client()
        with a.lock("orders/1", wait=5) as lease:
            self.assertTrue(a.inspect("orders/1").locked)
        self.assertFalse(lease.active)
        self.assertFalse(lease.lost)
        self.assertFalse(a.inspect("orders/1").locked)
        self.assertGreater(b.acquire("orders/1").token, lease.token)

    def test_lock_context_manager_releases_on_error(self):
        a = self.client()
        with self.assertRaises(ZeroDivisionError):
            with a.lock("orders/1"):
                1 / 0
        self.assertFalse(a.inspect("orders/1").locked)

    def test_release_twice(self):
        lease = self.client().acquire("r/1")
        self.assertTrue(lease.release())
        self.assertFalse(lease.release())

    def _wait_in_thread(self, client, name, **kwargs):
        box = {}

        def run():
            try:
                box["lease"] = client.acquire(name, **kwargs)
            except Exception as e:
                box["error"] = e
        t = threading.Thread(target=run)
        t.start()
        self.addCleanup(t.join, 10)
        return t, box

    def _waiting(self, client, name):
        return any(w["name"] == name for s in client.list_sessions() for w in s["waiting"])

    def test_waiter_is_granted_on_release(self):
        a, b = self.client(), self.client()
        first = a.acquire("w/1")
        for wait in (5, None):
            with self.subTest(wait=wait):
                t, box = self._wait_in_thread(b, "w/1", wait=wait)
                wait_until(lambda: self._waiting(a, "w/1"), what="the acquire to wait")
                first.release()
                t.join(5)
                self.assertGreater(box["lease"].token, first.token)
                box["lease"].release()
                first = a.acquire("w/1")

    def test_wait_times_out(self):
        a, b = self.client(), self.client()
        a.acquire("w/1", meta="busy")
        with self.assertRaises(lockagent.NotAcquired) as cm:
            b.acquire("w/1", wait=0.05)
        self.assertEqual(cm.exception.reason, "timeout")
        self.assertEqual(cm.exception.holders[0].meta, "busy")

    def test_shared_with_a_limit(self):
        a, b, c, d = (self.client() for _ in range(4))
        s1 = a.acquire("sem/1", shared=True, limit=2)
        s2 = b.acquire("sem/1", shared=True, limit=2)
        self.assertEqual((s1.mode, s2.mode), ("shared", "shared"))
        with self.assertRaises(lockagent.NotAcquired):
            c.acquire("sem/1", shared=True, limit=2)
        with self.assertRaises(lockagent.NotAcquired):
            d.acquire("sem/1")
        info = d.inspect("sem/1")
        self.assertEqual((info.locked, info.mode, len(info.holders)), (True, "shared", 2))
        s1.release()
        c.acquire("sem/1", shared=True, limit=2)

    def test_ttl_and_scope(self):
        c = self.client(session_ttl=30)
        lease = c.acquire("t/1", ttl=2.5, scope="session")
        self.assertEqual((lease.ttl_ms, lease.scope), (2500, "session"))
        [listed] = [x for s in c.list_sessions() for x in s["leases"] if x["lease"] == lease.id]
        self.assertEqual(listed["scope"], "session")

    def test_meta_is_shown(self):
        c = self.client()
        c.acquire("m/1", meta="batch 7")
        self.assertEqual(c.inspect("m/1").holders[0].meta, "batch 7")
        [listed] = [x for s in c.list_sessions() for x in s["leases"]]
        self.assertEqual(listed["meta"], "batch 7")

    def test_mutual_exclusion_across_threads(self):
        clients = [self.client() for _ in range(4)]
        state = {"inside": 0, "max": 0, "tokens": []}
        mu = threading.Lock()

        def work(c):
            for _ in range(20):
                with c.lock("counter", wait=None) as lease:
                    with mu:
                        state["inside"] += 1
                        state["max"] = max(state["max"], state["inside"])
                        state["tokens"].append(lease.token)
                    with mu:
                        state["inside"] -= 1
        threads = [threading.Thread(target=work, args=(c,)) for c in clients]
        for t in threads:
            t.start()
        for t in threads:
            t.join(30)
        self.assertEqual(state["max"], 1)
        self.assertEqual(len(state["tokens"]), 80)
        self.assertEqual(state["tokens"], sorted(set(state["tokens"])))


class OpsTest(AgentTestCase):
    def test_check(self):
        c = self.client()
        lease = c.acquire("k/1")
        r = c.acquire("k/2").check()
        self.assertTrue(r.held)
        r = lease.check()
        self.assertEqual((r.held, r.token), (True, lease.token))
        self.assertGreater(r.expires_in_ms, 0)
        c.break_lock("k/1")
        self.assertEqual(lease.check(), lockagent.CheckResult(False, lease.token, 0))

    def test_inspect(self):
        c = self.client()
        self.assertEqual(c.inspect("never/locked"), lockagent.LockInfo(False, None, [], 0, 0))
        lease = c.acquire("i/1")
        lease.release()
        info = c.inspect("i/1")
        self.assertEqual((info.locked, info.last_token), (False, lease.token))
        # A waiter shows as queued.
        held = c.acquire("i/2")
        waiter = self.client()
        t = threading.Thread(target=lambda: waiter.acquire("i/2", wait=10).release())
        t.start()
        wait_until(lambda: c.inspect("i/2").queued == 1, what="the waiter to queue")
        held.release()
        t.join(10)
        self.assertEqual(c.inspect("i/2").queued, 0)

    def test_list_all(self):
        a, b = self.client(client="a"), self.client(client="b")
        b.acquire("l/1")
        sessions = a.list_sessions(all=True)
        self.assertEqual({s["client"] for s in sessions}, {"a", "b"})
        [sb] = [s for s in sessions if s["session"] == b.session]
        self.assertEqual([x["name"] for x in sb["leases"]], ["l/1"])

    def test_break_signals_lost_every_way(self):
        holder, admin = self.client(), self.client()
        lease = holder.acquire("b/1")
        called = threading.Event()
        got = []
        lease.add_lost_callback(lambda l: (got.append(l.lost_reason), called.set()))
        self.assertFalse(lease.lost)
        self.assertFalse(lease.wait_lost(0))
        self.assertEqual(admin.break_lock("b/1"), 1)
        self.assertTrue(lease.wait_lost(5))
        self.assertTrue(called.wait(5))
        self.assertEqual(got, ["broken"])
        self.assertTrue(lease.lost)
        self.assertEqual(lease.lost_reason, lockagent.BROKEN)
        with self.assertRaises(lockagent.LeaseLost) as cm:
            lease.raise_if_lost()
        self.assertEqual(cm.exception.reason, "broken")
        late = []
        lease.add_lost_callback(lambda l: late.append(l))
        self.assertEqual(late, [lease])
        self.assertFalse(lease.release())
        self.assertEqual(admin.break_lock("b/1"), 0)

    def test_ctl_break_is_seen_as_lost(self):
        events = []
        c = self.client(on_event=events.append)
        lease = c.acquire("orders/9")
        out = self.agent.ctl("break", "orders/9")
        self.assertEqual(out.returncode, 0, out.stderr)
        self.assertTrue(lease.wait_lost(5))
        self.assertEqual(lease.lost_reason, "broken")
        self.assertEqual(events[0]["event"], "lost")
        self.assertEqual(events[0]["token"], lease.token)
        self.assertEqual(c.leases, [])

    def test_call_any_op(self):
        c = self.client()
        self.assertEqual(c.call("ping"), {"id": "2", "ok": True, "pong": True})


class ErrorsTest(AgentTestCase):
    agent_config = "limits {\n  max_leases_per_session = 2\n}"

    def assertCode(self, exc_class, code, fn, *args, **kwargs):
        with self.assertRaises(exc_class) as cm:
            fn(*args, **kwargs)
        self.assertIsInstance(cm.exception, lockagent.ProtocolError)
        self.assertEqual(cm.exception.code, code)
        self.assertTrue(cm.exception.message)
        return cm.exception

    def test_protocol_errors(self):
        c = self.client()
        self.assertCode(lockagent.InvalidName, "invalid_name", c.acquire, "has space")
        self.assertCode(lockagent.InvalidName, "invalid_name", c.inspect, "")
        self.assertCode(lockagent.InvalidArgument, "invalid_argument", c.acquire, "x", ttl=0.5)
        self.assertCode(lockagent.InvalidArgument, "invalid_argument", c.acquire, "x", limit=2)
        self.assertCode(lockagent.InvalidArgument, "invalid_argument", c.acquire, "x",
                        meta="m" * 300)
        self.assertCode(lockagent.UnknownOp, "unknown_op", c.call, "frobnicate")
        self.assertCode(lockagent.BadRequest, "bad_request", c.call, "hello")
        self.assertCode(lockagent.NotHeld, "not_held", c.call, "release", lease="l_nope")
        self.assertCode(lockagent.NotHeld, "not_held", c.call, "check", lease="l_nope")
        lease = c.acquire("x")
        e = self.assertCode(lockagent.AlreadyHeld, "already_held", c.acquire, "x")
        self.assertIs(e.lease, lease)
        self.assertEqual(e.error["lease"]["token"], lease.token)
        c.acquire("y")
        self.assertCode(lockagent.LimitExceeded, "limit_exceeded", c.acquire, "z")
        # The connection is still good after every error.
        c.ping()

    def test_line_too_long_is_refused_before_it_is_sent(self):
        c = self.client()
        self.assertCode(lockagent.LineTooLong, "line_too_long", c.call, "ping", pad="x" * 70000)
        c.ping()
        self.assertTrue(c.connected)

    def test_an_argument_json_cannot_carry_is_refused_unsent(self):
        c = self.client(timeout=2)
        for name, kwargs in (("n/1", {"shared": True, "limit": float("nan")}),
                             ("n/1", {"shared": True, "limit": float("inf")}),
                             ("a\ud800", {}), ("n/1", {"meta": "\udfff"})):
            with self.subTest(name=name, kwargs=kwargs):
                self.assertCode(lockagent.InvalidArgument, "invalid_argument", c.acquire, name,
                                **kwargs)
                self.assertEqual(c._conn.pending, {})
        c.ping()

    def test_a_duration_that_is_not_finite_is_refused_unsent(self):
        c = self.client(timeout=2)
        for kwargs in ({"ttl": float("nan")}, {"ttl": float("inf")}, {"ttl": -1},
                       {"ttl": "15"}, {"ttl": 1e306}, {"ttl": 10**400}, {"wait": float("nan")},
                       {"wait": -2}):
            with self.subTest(kwargs=kwargs):
                self.assertCode(lockagent.InvalidArgument, "invalid_argument", c.acquire, "n/1",
                                **kwargs)
                self.assertEqual(c._conn.pending, {})
        for kwargs in ({"session_ttl": float("nan")}, {"heartbeat": float("inf")}):
            with self.subTest(kwargs=kwargs):
                self.assertCode(lockagent.InvalidArgument, "invalid_argument", self.client,
                                **kwargs)
        # Infinity, None and -1 are a wait without a limit: each waits for a
        # holder that lets go after longer than the client's own timeout.
        waiter, holder = self.client(timeout=0.3), self.client()
        for i, wait in enumerate((math.inf, None, -1)):
            with self.subTest(wait=wait):
                name = "w/%d" % i
                held = holder.acquire(name)
                timer = threading.Timer(0.6, held.release)
                timer.start()
                self.addCleanup(timer.cancel)
                granted = waiter.acquire(name, wait=wait)
                self.assertTrue(granted.token)
                granted.release()

    def test_a_request_given_up_on_is_forgotten(self):
        c = self.client(timeout=0.3)
        on_answer = c._on_answer
        c._on_answer = lambda conn, msg: None if "locked" in msg else on_answer(conn, msg)
        with self.assertRaises(lockagent.AgentTimeout):
            c.inspect("x")
        self.assertEqual(c._conn.pending, {})
        c._on_answer = on_answer
        c.ping()

    def test_timeout_and_connection_errors_are_builtin_kinds(self):
        self.assertTrue(issubclass(lockagent.AgentTimeout, TimeoutError))
        self.assertTrue(issubclass(lockagent.AgentConnectionError, ConnectionError))
        self.assertTrue(issubclass(lockagent.NotAcquired, lockagent.LockagentError))


class ConnectionLimitTest(AgentTestCase):
    agent_config = "limits {\n  max_connections_per_uid = 1\n}"

    def connect(self):
        try:
            return self.client()
        except lockagent.LockagentError:
            return None  # the harness's probe of the socket may still count

    def test_a_refused_connection_says_why(self):
        wait_until(self.connect, what="a first connection")
        with self.assertRaises(lockagent.LimitExceeded) as cm:
            lockagent.Client(self.agent.socket)
        self.assertEqual(cm.exception.code, "limit_exceeded")
        self.assertIn("too many connections", cm.exception.message)


class PermissionTest(AgentTestCase):
    agent_config = "acl {\n  admin_uids = []\n}"

    def test_admin_ops_are_denied(self):
        c = self.client()
        with self.assertRaises(lockagent.PermissionDenied) as cm:
            c.break_lock("p/1")
        self.assertEqual(cm.exception.code, "permission_denied")
        with self.assertRaises(lockagent.PermissionDenied):
            c.list_sessions(all=True)


class HeartbeatTest(AgentTestCase):
    def test_the_client_keeps_its_heartbeat(self):
        c = self.client(heartbeat=0.4)
        lease = c.acquire("h/1")
        # Four heartbeat periods pass without the application sending anything.
        self.assertFalse(lease.wait_lost(1.6))
        self.assertTrue(lease.check().held)

    def test_a_silent_application_loses_its_locks(self):
        c = self.client(heartbeat=0.2, auto_heartbeat=False, reconnect=False)
        lease = c.acquire("h/1")
        self.assertTrue(lease.wait_lost(5))
        self.assertEqual(lease.lost_reason, lockagent.CONNECTION_LOST)
        wait_until(lambda: c.closed, what="the client to close")
        self.assertFalse(self.client().inspect("h/1").locked)


class ReconnectTest(AgentTestCase):
    def test_a_campaign_started_for_nobody_is_resigned_on_resume(self):
        c = self.client(session_ttl=30)
        other = self.client()
        drop_answer_with_connection(c, lambda msg: msg.get("campaign"))
        with self.assertRaises(lockagent.AgentConnectionError):
            c.campaign("r/lead", scope="session")
        wait_until(lambda: c.connected and c.resumed, 10, "the client to resume")
        wait_until(lambda: not other.inspect("r/lead").locked, 10,
                   "the stray campaign to be resigned")
        sessions = [s for s in other.list_sessions() if s["session"] == c.session]
        self.assertEqual(sessions[0]["campaigns"], [])

    def test_a_grant_lost_with_the_connection_is_given_back_on_resume(self):
        # The agent grants a session-scoped acquire, and the connection
        # breaks before the client reads the answer: after the resume, the
        # session holds a lease the client never heard of; it gives it back.
        c = self.client(session_ttl=30)
        other = self.client()
        drop_answer_with_connection(c, lambda msg: msg.get("acquired"))
        with self.assertRaises(lockagent.AgentConnectionError):
            c.acquire("r/stray", scope="session")
        wait_until(lambda: c.connected and c.resumed, 10, "the client to resume")
        wait_until(lambda: not other.inspect("r/stray").locked, 10,
                   "the stray lease to be given back")
        self.assertEqual(c.leases, [])

    def test_a_connection_that_ends_as_it_opens_is_opened_again(self):
        # The first reconnection ends right after its hello, before the
        # client installs it: the client connects again all the same.
        c = self.client(session_ttl=30)
        lease = c.acquire("r/o", scope="session")
        opened = c._open
        died = []

        def open_then_die():
            conn = opened()
            if not died:
                died.append(conn)
                conn.kill()
                wait_until(lambda: conn.dead, what="the connection's end to be seen")
            return conn

        c._open = open_then_die
        break_connection(c)
        wait_until(lambda: c._conn is not None and c._conn not in died, 10,
                   "a live connection to be installed")
        self.assertTrue(lease.check().held)
        self.assertEqual(len(died), 1)

    def test_a_release_whose_answer_was_lost_is_not_reported_lost(self):
        c = self.client(session_ttl=30)
        lease = c.acquire("r/rel", scope="session")
        lost = []
        lease.add_lost_callback(lost.append)
        drop_answer_with_connection(c, lambda msg: msg.get("released"))
        with self.assertRaises(lockagent.AgentConnectionError):
            lease.release()
        wait_until(lambda: c.connected and c.resumed, 10, "the client to resume")
        wait_until(lambda: not lease.active, 10, "the lease to end")
        self.assertFalse(lease.lost)
        self.assertEqual(lost, [])
        self.assertEqual(c.leases, [])

    def test_broken_connection_loses_connection_leases(self):
        c = self.client()
        lease = c.acquire("r/1")
        got = []
        lease.add_lost_callback(got.append)
        session = c.session
        break_connection(c)
        self.assertTrue(lease.wait_lost(5))
        self.assertEqual(lease.lost_reason, "connection_lost")
        self.assertEqual(got, [lease])
        # A session without a grace period ends with its connection: the
        # client opens a new one.
        wait_until(lambda: c.connected, what="the client to reconnect")
        self.assertNotEqual(c.session, session)
        self.assertFalse(c.resumed)
        self.assertGreater(c.acquire("r/1").token, lease.token)

    def test_resume_keeps_session_leases(self):
        c = self.client(session_ttl=30)
        conn_lease = c.acquire("r/conn")
        sess_lease = c.acquire("r/sess", scope="session")
        session = c.session
        break_connection(c)
        self.assertTrue(conn_lease.wait_lost(5))
        wait_until(lambda: c.connected and c.resumed, what="the session to be resumed")
        self.assertEqual(c.session, session)
        self.assertFalse(sess_lease.lost)
        self.assertTrue(sess_lease.check().held)
        other = self.client()
        other.acquire("r/conn")
        with self.assertRaises(lockagent.NotAcquired):
            other.acquire("r/sess")
        self.assertTrue(sess_lease.release())
        other.acquire("r/sess")

    def test_a_request_right_after_a_break_goes_to_the_next_connection(self):
        c = self.client(session_ttl=30)
        lease = c.acquire("r/1", scope="session")
        for _ in range(5):
            break_connection(c)
            self.assertTrue(lease.check().held)
        self.assertTrue(c.resumed)

    def test_events_missed_while_detached_arrive_on_resume(self):
        c = self.client(session_ttl=30)
        lease = c.acquire("r/1", scope="session")
        hidden = self.agent.hide_socket()
        break_connection(c)
        watcher = lockagent.Client(hidden)
        self.addCleanup(watcher.close)
        wait_until(lambda: detached(watcher, c.session), what="the session to be detached")
        out = self.agent.ctl("break", "r/1", socket_path=hidden)
        self.assertEqual(out.returncode, 0, out.stderr)
        self.assertFalse(lease.lost)
        # A request made while the client is reconnecting waits for it.
        box = {}
        t = threading.Thread(target=lambda: box.setdefault("info", c.inspect("r/1")))
        t.start()
        self.agent.unhide_socket()
        t.join(10)
        self.assertFalse(box["info"].locked)
        self.assertTrue(c.resumed)
        self.assertTrue(lease.wait_lost(5))
        self.assertEqual(lease.lost_reason, "broken")

    def test_a_lease_gone_without_an_event_is_lost_on_resume(self):
        c = self.client(session_ttl=30)
        lease = c.acquire("r/1", scope="session")
        hidden = self.agent.hide_socket()
        break_connection(c)
        watcher = lockagent.Client(hidden)
        self.addCleanup(watcher.close)
        wait_until(lambda: detached(watcher, c.session), what="the session to be detached")
        # Another connection takes the session over and releases the lease:
        # the session gets no event for it.
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s, s.makefile("rwb") as f:
            s.connect(hidden)
            for req in ({"id": 1, "op": "hello", "resume": {"session": c.session,
                                                          "token": c.resume_token}},
                        {"id": 2, "op": "release", "lease": lease.id}):
                f.write(json.dumps(req).encode() + b"\n")
                f.flush()
                self.assertTrue(json.loads(f.readline())["ok"])
        wait_until(lambda: detached(watcher, c.session), what="the session to be detached")
        self.agent.unhide_socket()
        self.assertTrue(lease.wait_lost(10))
        self.assertEqual(lease.lost_reason, lockagent.EXPIRED)
        wait_until(lambda: c.connected, what="the client to reconnect")
        self.assertTrue(c.resumed)

    def test_resume_refused_loses_session_leases(self):
        c = self.client(session_ttl=1)
        lease = c.acquire("r/1", scope="session")
        session = c.session
        hidden = self.agent.hide_socket()
        break_connection(c)
        watcher = lockagent.Client(hidden)
        self.addCleanup(watcher.close)
        wait_until(lambda: all(s["session"] != session for s in watcher.list_sessions()),
                   what="the detached session to end")
        self.agent.unhide_socket()
        self.assertTrue(lease.wait_lost(10))
        self.assertEqual(lease.lost_reason, lockagent.SESSION_EXPIRED)
        wait_until(lambda: c.connected, what="a new session")
        self.assertNotEqual(c.session, session)
        self.assertFalse(c.resumed)
        c.acquire("r/1", scope="session")

    def test_without_reconnect_the_client_closes(self):
        c = self.client(session_ttl=30, reconnect=False)
        a = c.acquire("r/1")
        b = c.acquire("r/2", scope="session")
        break_connection(c)
        self.assertTrue(a.wait_lost(5))
        self.assertTrue(b.wait_lost(5))
        wait_until(lambda: c.closed, what="the client to close")
        with self.assertRaises(lockagent.AgentConnectionError):
            c.ping()

    def test_close_right_after_a_break_ends_the_session(self):
        # Before the client saw the break, as it reconnects, and after.
        for i, settle in enumerate((None, 0.002, 0.05)):
            with self.subTest(settle=settle):
                c = self.client(session_ttl=30)
                lease = c.acquire("r/%d" % i, scope="session")
                camp = c.campaign("e/%d" % i, scope="session")
                break_connection(c)
                if settle is not None:
                    threading.Event().wait(settle)
                c.close()
                self.client().acquire("r/%d" % i)  # a try: free at once
                self.assertFalse(lease.active)
                self.assertEqual(c.leases, [])
                self.assertTrue(camp.ended)

    def test_close_while_detached_ends_what_the_client_holds(self):
        # The session cannot be reached to be ended (its socket hidden): the
        # client's leases and campaigns end all the same.
        c = self.client(session_ttl=30)
        lease = c.acquire("d/1", scope="session")
        camp = c.campaign("d/2", scope="session")
        self.agent.hide_socket()
        self.addCleanup(self.agent.unhide_socket)
        break_connection(c)
        wait_until(lambda: not c.connected, what="the client to see the break")
        self.assertTrue(lease.active, "a session-scoped lease waits for the resume")
        c.close()
        self.assertFalse(lease.active)
        self.assertTrue(camp.ended)
        self.assertEqual(c.leases, [])

    def test_without_reconnect_close_ends_the_session(self):
        c = self.client(session_ttl=30, reconnect=False)
        c.acquire("r/1", scope="session")
        break_connection(c)
        wait_until(lambda: c.closed, what="the client to close")
        c.close()
        self.client().acquire("r/1")

    def test_agent_shutdown_loses_every_lease(self):
        events = []
        c = self.client(session_ttl=30, reconnect=False, on_event=events.append)
        a = c.acquire("s/1")
        b = c.acquire("s/2", scope="session")
        self.agent.stop()
        self.assertTrue(a.wait_lost(5))
        self.assertTrue(b.wait_lost(5))
        self.assertEqual((a.lost_reason, b.lost_reason), ("shutdown", "shutdown"))
        self.assertIn("shutdown", [e["event"] for e in events])

    def test_reconnects_after_an_agent_restart(self):
        c = self.client()
        lease = c.acquire("s/1")
        self.agent.stop()
        self.assertTrue(lease.wait_lost(5))
        self.agent.start()
        wait_until(lambda: c.connected, 10, "the client to reconnect")
        self.assertGreater(c.acquire("s/1").token, lease.token)


if __name__ == "__main__":
    unittest.main()
