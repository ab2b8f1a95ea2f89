"""Tests of the asyncio client against a real agent process."""

import asyncio
import time
import unittest

import lockagent
from harness import Agent, break_connection, drop_answer_with_connection


async def eventually(predicate, timeout=5.0, what="the condition"):
    """Poll an async ``predicate`` until it is true; fail after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        value = await predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError("timed out after %.1fs waiting for %s" % (timeout, what))
        await asyncio.sleep(0.005)


class AsyncAgentTestCase(unittest.IsolatedAsyncioTestCase):
    agent_config = ""

    def setUp(self):
        self.agent = Agent(self.agent_config)
        self.addCleanup(self.agent.cleanup)

    async def client(self, **kwargs):
        c = await lockagent.AsyncClient.connect(self.agent.socket, **kwargs)
        self.addAsyncCleanup(c.close)
        return c

    @staticmethod
    def unlocked(client, name):
        """A predicate for eventually: name is not locked."""
        async def predicate():
            return not (await client.inspect(name)).locked
        return predicate

    @staticmethod
    def ended(test):
        """A predicate for eventually from a plain one."""
        async def predicate():
            return test()
        return predicate

    async def waiting(self, client, name):
        return any(w["name"] == name for s in await client.list_sessions() for w in s["waiting"])


class AsyncOpsTest(AsyncAgentTestCase):
    async def test_async_with_client_and_lock(self):
        async with lockagent.AsyncClient(self.agent.socket, client="async") as c:
            self.assertTrue(c.session.startswith("s_"))
            async with c.lock("orders/42", wait=5, meta="m") as lease:
                self.assertIsInstance(lease, lockagent.AsyncLease)
                info = await c.inspect("orders/42")
                self.assertEqual((info.locked, info.holders[0].meta), (True, "m"))
            self.assertFalse(lease.active)
            self.assertFalse((await c.inspect("orders/42")).locked)
            lease = await c.lock("orders/42")
            self.assertTrue((await lease.check()).held)
        self.assertTrue(c.closed)
        self.assertFalse(lease.lost)
        self.assertFalse(lease.active)

    async def test_try_wait_and_timeout(self):
        a, b = await self.client(), await self.client()
        first = await a.acquire("w/1", meta="busy")
        with self.assertRaises(lockagent.NotAcquired) as cm:
            await b.acquire("w/1")
        self.assertEqual((cm.exception.reason, cm.exception.holders[0].meta), ("held", "busy"))
        with self.assertRaises(lockagent.NotAcquired) as cm:
            await b.acquire("w/1", wait=0.05)
        self.assertEqual(cm.exception.reason, "timeout")
        task = asyncio.ensure_future(b.acquire("w/1", wait=None))
        await eventually(lambda: self.waiting(a, "w/1"), what="the acquire to wait")
        self.assertTrue(await first.release())
        second = await asyncio.wait_for(task, 5)
        self.assertGreater(second.token, first.token)

    async def test_shared_limit_and_scope(self):
        a, b, c = await self.client(session_ttl=10), await self.client(), await self.client()
        s1 = await a.acquire("sem/1", shared=True, limit=2, scope="session", ttl=3)
        self.assertEqual((s1.mode, s1.scope, s1.ttl_ms), ("shared", "session", 3000))
        await b.acquire("sem/1", shared=True, limit=2)
        with self.assertRaises(lockagent.NotAcquired):
            await c.acquire("sem/1", shared=True, limit=2)

    async def test_cancelling_a_waiting_acquire_cancels_it_in_the_agent(self):
        a, b = await self.client(), await self.client()
        held = await a.acquire("c/1")
        task = asyncio.ensure_future(b.acquire("c/1", wait=None))
        await eventually(lambda: self.waiting(a, "c/1"), what="the acquire to wait")
        task.cancel()
        with self.assertRaises(asyncio.CancelledError):
            await task

        async def not_waiting():
            return not await self.waiting(a, "c/1")
        await eventually(not_waiting, what="the agent to cancel the acquire")
        await held.release()
        await b.acquire("c/1")

    async def test_lost_can_be_polled_awaited_and_called_back(self):
        holder, admin = await self.client(), await self.client()
        lease = await holder.acquire("b/1")
        got = []
        lease.add_lost_callback(got.append)
        self.assertFalse(await lease.wait_lost(0.01))
        self.assertEqual(await admin.break_lock("b/1"), 1)
        self.assertTrue(await lease.wait_lost(5))
        self.assertEqual((lease.lost, lease.lost_reason), (True, "broken"))
        self.assertEqual(got, [lease])
        self.assertEqual(await lease.check(), lockagent.CheckResult(False, lease.token, 0))
        self.assertFalse(await lease.release())

    async def test_ctl_break(self):
        c = await self.client()
        lease = await c.acquire("orders/9")
        out = await asyncio.get_running_loop().run_in_executor(
            None, self.agent.ctl, "break", "orders/9")
        self.assertEqual(out.returncode, 0, out.stderr)
        self.assertTrue(await lease.wait_lost(5))

    async def test_list_ping_call_and_errors(self):
        c = await self.client(client="lister")
        await c.ping()
        [mine] = [s for s in await c.list_sessions(all=True) if s["session"] == c.session]
        self.assertEqual(mine["client"], "lister")
        self.assertEqual((await c.call("ping"))["pong"], True)
        with self.assertRaises(lockagent.InvalidName) as cm:
            await c.acquire("bad name")
        self.assertEqual(cm.exception.code, "invalid_name")
        with self.assertRaises(lockagent.UnknownOp):
            await c.call("frobnicate")
        lease = await c.acquire("x")
        with self.assertRaises(lockagent.AlreadyHeld) as cm:
            await c.acquire("x")
        self.assertIs(cm.exception.lease, lease)
        with self.assertRaises(lockagent.LineTooLong):
            await c.call("ping", pad="x" * 70000)
        await c.ping()

    async def test_no_agent(self):
        with self.assertRaises(lockagent.AgentConnectionError):
            await lockagent.AsyncClient.connect(self.agent.socket + ".none")

    async def test_heartbeat(self):
        kept = await self.client(heartbeat=0.4)
        silent = await self.client(heartbeat=0.2, auto_heartbeat=False, reconnect=False)
        a = await kept.acquire("h/1")
        b = await silent.acquire("h/2")
        self.assertTrue(await b.wait_lost(5))
        self.assertEqual(b.lost_reason, "connection_lost")
        self.assertFalse(await a.wait_lost(1.6))
        self.assertTrue((await a.check()).held)
        self.assertTrue(silent.closed)


class AsyncConnectionLimitTest(AsyncAgentTestCase):
    agent_config = "limits {\n  max_connections_per_uid = 1\n}"

    async def test_a_refused_connection_says_why(self):
        async def connected():
            try:
                return await self.client()
            except lockagent.LockagentError:
                return None  # the harness's probe of the socket may still count
        await eventually(connected, what="a first connection")
        with self.assertRaises(lockagent.LimitExceeded) as cm:
            await lockagent.AsyncClient.connect(self.agent.socket)
        self.assertIn("too many connections", cm.exception.message)


class AsyncCloseWhileOpeningTest(AsyncAgentTestCase):
    @staticmethod
    def hold_open(c, stage):
        """Hold c's open() at ``stage`` ("connecting": before its connection
        exists; "hello": the agent has answered hello, the client has yet to
        take it in). Returns (reached, go): reached is set once open() waits
        there, and setting go lets it go on."""
        reached, go = asyncio.Event(), asyncio.Event()
        if stage == "connecting":
            connect = c._connect

            async def held_connect():
                reached.set()
                await go.wait()
                return await connect()

            c._connect = held_connect
        else:
            call_on = c._call_on

            async def held_call_on(conn, op, *args):
                result = await call_on(conn, op, *args)
                if op == "hello":
                    reached.set()
                    await go.wait()
                return result

            c._call_on = held_call_on
        return reached, go

    async def test_close_during_open_leaves_the_client_closed(self):
        other = await self.client()
        for stage in ("before", "connecting", "hello"):
            with self.subTest(stage=stage):
                name = "closing-" + stage
                # A grace period: a session left behind would outlive the test.
                c = lockagent.AsyncClient(self.agent.socket, client=name, session_ttl=30)
                self.addAsyncCleanup(c.close)
                if stage == "before":
                    await c.close()
                    opening = asyncio.ensure_future(c.open())
                else:
                    reached, go = self.hold_open(c, stage)
                    opening = asyncio.ensure_future(c.open())
                    await asyncio.wait_for(reached.wait(), 5)
                    # open() goes on once close() has begun, and waits for it.
                    asyncio.get_running_loop().call_soon(go.set)
                    await asyncio.wait_for(c.close(), 5)
                    self.assertTrue(opening.done(), "close() returned before open() ended")
                with self.assertRaisesRegex(lockagent.AgentConnectionError, "the client is closed"):
                    await opening
                self.assertTrue(c.closed)
                self.assertFalse(c.connected)
                with self.assertRaisesRegex(lockagent.AgentConnectionError, "the client is closed"):
                    await c.ping()
                left = [s for s in await other.list_sessions() if s["client"] == name]
                self.assertEqual(left, [], "no session is left behind")


class AsyncConcurrentCallsTest(AsyncAgentTestCase):
    def hold(self, c, method, when=lambda *args: True):
        """Hold c's ``method`` (a coroutine) before it runs, for the calls
        ``when`` accepts. Returns (reached, go, ran): reached is set once a
        call waits, go lets it go on, ran is set once a held call returned."""
        reached, go, ran = asyncio.Event(), asyncio.Event(), asyncio.Event()
        original = getattr(c, method)

        async def held(*args, **kwargs):
            if not when(*args):
                return await original(*args, **kwargs)
            reached.set()
            await go.wait()
            try:
                return await original(*args, **kwargs)
            finally:
                ran.set()

        setattr(c, method, held)
        self.addCleanup(go.set)  # so that the client can close
        return reached, go, ran

    @staticmethod
    async def call_concurrently(call, record):
        """Start ``call()`` in a task of its own, which then records
        ``record()`` (or the call's error); returns that task once the call
        has returned or waits."""
        entered = asyncio.Event()

        async def run():
            entered.set()
            try:
                await call()
            except Exception as e:
                return e
            return record()

        task = asyncio.ensure_future(run())
        # The task runs on from entered.set() until it waits or ends,
        # before this one is woken.
        await entered.wait()
        return task

    async def test_a_second_close_returns_once_the_close_is_complete(self):
        other = await self.client()
        # Connected: the first close() is held before its bye; just after a
        # break: before it resumes the session to end it.
        for broken in (False, True):
            with self.subTest(broken=broken):
                name = "close-twice/%s" % broken
                c = await self.client(session_ttl=30)
                await c.acquire(name, scope="session")
                if broken:
                    # Hidden, the socket lets no reconnect end the session first.
                    self.agent.hide_socket()
                    break_connection(c)
                    await eventually(self.ended(lambda: not c.connected),
                                     what="the client to see the break")
                    reached, go, ran = self.hold(c, "_end_detached")
                else:
                    reached, go, ran = self.hold(c, "_call_on", lambda conn, op, *rest: op == "bye")
                first = asyncio.ensure_future(c.close())
                await asyncio.wait_for(reached.wait(), 5)
                if broken:
                    self.agent.unhide_socket()
                second = await self.call_concurrently(c.close, ran.is_set)
                go.set()
                _, ended = await asyncio.wait_for(asyncio.gather(first, second), 10)
                self.assertTrue(ended, "the second close() returned before the first had "
                                       "ended the session")
                self.assertTrue(c.closed)
                self.assertFalse(c.connected)
                await other.acquire(name)  # a try: free at once

    async def test_a_second_open_waits_for_the_first_and_shares_its_outcome(self):
        other = await self.client()
        for outcome in ("connected", "failed", "cancelled"):
            with self.subTest(outcome=outcome):
                name = "open-twice-" + outcome
                c = lockagent.AsyncClient(self.agent.socket, client=name)
                self.addAsyncCleanup(c.close)
                reached, go, _ = self.hold(c, "_connect")
                first = asyncio.ensure_future(c.open())
                await asyncio.wait_for(reached.wait(), 5)
                if outcome == "failed":
                    self.agent.hide_socket()
                second = await self.call_concurrently(c.open, lambda: c.connected)
                if outcome == "cancelled":
                    # The second open() goes on in its place.
                    first.cancel()
                    with self.assertRaises(asyncio.CancelledError):
                        await first
                    self.assertFalse(second.done())
                go.set()
                if outcome == "failed":
                    with self.assertRaisesRegex(lockagent.AgentConnectionError, "cannot connect"):
                        await first
                    self.assertIs(await asyncio.wait_for(second, 5), first.exception())
                    self.agent.unhide_socket()
                    self.assertFalse(c.connected)
                    await c.open()  # after a failed open(), a new one tries again
                else:
                    if outcome == "connected":
                        await asyncio.wait_for(first, 5)
                    self.assertIs(await asyncio.wait_for(second, 5), True,
                                  "the second open() returned before the client was connected")
                self.assertTrue(c.connected)
                await c.ping()
                sessions = [s for s in await other.list_sessions() if s["client"] == name]
                self.assertEqual(len(sessions), 1, "one open() connected")


class AsyncAbandonTest(AsyncAgentTestCase):
    async def hold_answers(self, c):
        """Keep the client's reader from reading until the returned event is set."""
        go = asyncio.Event()
        read = c._conn.reader.read

        async def held_read(n):
            await go.wait()
            return await read(n)

        c._conn.reader.read = held_read
        self.addCleanup(go.set)  # so that the client can close
        # The read in progress is the one before the patch: a ping's answer
        # ends it, and the reader's next read is held.
        await c.ping()
        return go

    async def test_a_release_given_up_on_still_ends_the_lease(self):
        c = await self.client()
        other = await self.client()
        lease = await c.acquire("g/rel")
        go = await self.hold_answers(c)
        task = asyncio.ensure_future(lease.release())
        # The agent has carried it out; its answer waits to be read.
        await eventually(self.unlocked(other, "g/rel"), what="the release to be carried out")
        task.cancel()
        with self.assertRaises(asyncio.CancelledError):
            await task
        go.set()
        await eventually(self.ended(lambda: not lease.active), what="the lease to end")
        self.assertNotIn(lease, c.leases)
        self.assertFalse(await lease.release(), "it had ended")

    async def test_a_resign_given_up_on_still_ends_the_campaign(self):
        c = await self.client()
        other = await self.client()
        campaign = await c.campaign("g/lead")
        await asyncio.wait_for(campaign.wait_elected(), 5)
        go = await self.hold_answers(c)
        task = asyncio.ensure_future(campaign.resign())
        await eventually(self.unlocked(other, "g/lead"), what="the resign to be carried out")
        task.cancel()
        with self.assertRaises(asyncio.CancelledError):
            await task
        go.set()
        await eventually(self.ended(lambda: campaign.ended), what="the campaign to end")
        self.assertIsNone(campaign.leader)


class AsyncReconnectTest(AsyncAgentTestCase):
    async def test_a_grant_lost_with_the_connection_is_given_back_on_resume(self):
        c = await self.client(session_ttl=30)
        other = await self.client()
        drop_answer_with_connection(c, lambda msg: msg.get("acquired"))
        with self.assertRaises(lockagent.AgentConnectionError):
            await c.acquire("r/stray", scope="session")
        await eventually(self.unlocked(other, "r/stray"), 10, "the stray lease to be given back")
        self.assertTrue(c.resumed)
        self.assertEqual(c.leases, [])

    async def test_a_connection_that_ends_as_it_opens_is_opened_again(self):
        # The first reconnection ends right after its hello, before the
        # client installs it: the client connects again all the same.
        c = await self.client(session_ttl=30)
        lease = await c.acquire("r/o", scope="session")
        opened = c._open
        died = []

        async def open_then_die():
            conn = await opened()
            if not died:
                died.append(conn)
                conn.kill()
                await eventually(self.ended(lambda: conn.dead), what="the connection's end to be seen")
            return conn

        c._open = open_then_die
        break_connection(c)
        self.assertTrue((await asyncio.wait_for(lease.check(), 10)).held)
        self.assertEqual(len(died), 1)
        self.assertIsNot(c._conn, died[0])

    async def test_resume_after_a_broken_connection(self):
        events = []
        c = await self.client(session_ttl=30, on_event=events.append)
        conn_lease = await c.acquire("r/conn")
        sess_lease = await c.acquire("r/sess", scope="session")
        session = c.session
        break_connection(c)
        self.assertTrue(await conn_lease.wait_lost(5))
        self.assertEqual(conn_lease.lost_reason, "connection_lost")
        # The next request waits for the resumed connection.
        self.assertTrue((await sess_lease.check()).held)
        self.assertEqual((c.session, c.resumed), (session, True))
        self.assertFalse(sess_lease.lost)
        self.assertEqual(events, [])

    async def test_a_request_right_after_a_break_goes_to_the_next_connection(self):
        c = await self.client(session_ttl=30)
        lease = await c.acquire("r/1", scope="session")
        for _ in range(5):
            break_connection(c)
            self.assertTrue((await lease.check()).held)
        self.assertTrue(c.resumed)

    async def test_a_new_session_without_a_grace_period(self):
        c = await self.client()
        lease = await c.acquire("r/1", scope="session")
        session = c.session
        break_connection(c)
        self.assertTrue(await lease.wait_lost(5))
        await c.ping()
        self.assertNotEqual(c.session, session)

    async def test_close_right_after_a_break_ends_the_session(self):
        # Before the client saw the break, as it reconnects, and after.
        other = await self.client()
        for i, settle in enumerate((None, 0, 0.002, 0.05)):
            with self.subTest(settle=settle):
                c = await self.client(session_ttl=30)
                lease = await c.acquire("r/%d" % i, scope="session")
                camp = await c.campaign("e/%d" % i, scope="session")
                break_connection(c)
                if settle is not None:
                    await asyncio.sleep(settle)
                await c.close()
                await other.acquire("r/%d" % i)  # a try: free at once
                self.assertFalse(lease.active)
                self.assertEqual(c.leases, [])
                self.assertTrue(camp.ended)

    async def test_agent_shutdown(self):
        events = []
        c = await self.client(reconnect=False, on_event=events.append)
        lease = await c.acquire("s/1")
        await asyncio.get_running_loop().run_in_executor(None, self.agent.stop)
        self.assertTrue(await lease.wait_lost(5))
        self.assertEqual(lease.lost_reason, "shutdown")
        self.assertEqual(events[0]["event"], "shutdown")
        with self.assertRaises(lockagent.AgentConnectionError):
            await c.ping()


if __name__ == "__main__":
    unittest.main()
