"""The asyncio client: streams, read by a task of their own."""

from __future__ import annotations

import asyncio
import time
from typing import TYPE_CHECKING, Any, Awaitable, Callable, Generator, Optional, Union

from ._core import (DEFAULT_TIMEOUT, END_WAIT, LIST_PAGE, REASON_WAIT, Core, Message, PathArg,
                    Pending, decode, encode, log)
from ._errors import (AgentConnectionError, AgentTimeout, LockagentError, NotHeld, ProtocolError,
                      SessionExpired, _NotSent)
from ._leases import RESIGNED, AsyncCampaign, AsyncLease, LockInfo, holders
from ._paths import check_private

if TYPE_CHECKING:
    from types import TracebackType


class _AsyncPending(Pending[AsyncLease, AsyncCampaign]):
    __slots__ = ("done",)

    def __init__(self, key: str, op: str, arg: Any, meta: Optional[str], waits: bool) -> None:
        super().__init__(key, op, arg, meta, waits)
        self.done: asyncio.Future[None] = asyncio.get_running_loop().create_future()


class _AsyncConn:
    """One connection to the agent, read by its own task."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader = reader
        self.writer = writer
        self.pending: dict[str, _AsyncPending] = {}  # by request id
        self.dead = False
        self.cause: Optional[LockagentError] = None  # see Core._close_cause
        self.task: Optional[asyncio.Task[None]] = None
        self.drain_lock = asyncio.Lock()

    async def send(self, data: bytes) -> None:
        self.writer.write(data)
        async with self.drain_lock:
            await self.writer.drain()

    def kill(self) -> None:
        """Break the connection; its reader sees the end and cleans up."""
        self.writer.transport.abort()

    async def read_to_end(self, timeout: float) -> None:
        """Give its reader up to ``timeout`` seconds to read what is left:
        the agent's reason for closing it, if it gave one."""
        if self.task is not None and self.task is not asyncio.current_task():
            await asyncio.wait([self.task], timeout=timeout)


class _AsyncLockContext:
    """What :meth:`AsyncClient.lock` returns: use with ``async with`` or ``await``."""

    def __init__(self, acquire: Callable[[], Awaitable[AsyncLease]]) -> None:
        self._acquire = acquire
        self._lease: Optional[AsyncLease] = None

    def __await__(self) -> Generator[Any, None, AsyncLease]:
        return self._acquire().__await__()

    async def __aenter__(self) -> AsyncLease:
        self._lease = await self._acquire()
        return self._lease

    async def __aexit__(self, exc_type: Optional[type[BaseException]],
                        exc: Optional[BaseException], tb: Optional[TracebackType]) -> None:
        if self._lease is not None:
            await self._lease.__aexit__(exc_type, exc, tb)


class _GaveUp:
    """The outcome of an AsyncClient.open() that was cancelled (or interrupted)."""


_GAVE_UP = _GaveUp()


class AsyncClient(Core[AsyncLease, AsyncCampaign]):
    """An asyncio client of the agent, with the arguments and methods of
    :class:`Client`; the methods that talk to the agent are coroutines.

    ::

        async with lockagent.AsyncClient(client="worker") as client:
            async with client.lock("orders/42", wait=5) as lease:
                ...

    or ``client = await AsyncClient.connect(...)`` and ``await
    client.close()``. Cancelling a task that waits in :meth:`acquire`
    cancels the acquire in the agent. Callbacks and ``on_event`` run on the
    event loop: keep them short; they may start tasks.

    :meth:`close` wins over an :meth:`open` still under way (connecting, or
    waiting for the answer to ``hello``): close() waits for that open to
    stop and returns with the client closed, and the open raises
    :class:`AgentConnectionError` ("the client is closed") once it has
    ended the session its ``hello`` opened, if any. A closed client cannot
    be opened again.

    Concurrent calls from several tasks are safe: an :meth:`open` called
    while another is under way waits for it and shares its outcome (it
    returns once the client is connected, or raises the other's error),
    and every :meth:`close` returns only once the close is complete.
    """

    # Made by the first open(), on its event loop: an asyncio.Event of
    # Python 3.9 belongs to the loop current when it is made.
    _up: asyncio.Event  # set while connected, and once closed
    _stop: asyncio.Event

    def __init__(self, path: PathArg = None, *, client: str = "", session_ttl: float = 0,
                 heartbeat: Optional[float] = None, auto_heartbeat: bool = True,
                 reconnect: bool = True, timeout: Optional[float] = DEFAULT_TIMEOUT,
                 on_event: Optional[Callable[[Message], object]] = None) -> None:
        super().__init__(path, client, session_ttl, heartbeat, auto_heartbeat, reconnect,
                         timeout, on_event)
        self._conn: Optional[_AsyncConn] = None
        self._opened = False
        # The outcome of the last open(), done once it has ended: None if it
        # connected, its exception if it failed, _GAVE_UP if it was cancelled.
        self._opening: Optional[asyncio.Future[Union[None, Exception, _GaveUp]]] = None
        # The task that closes the client, once close() is called.
        self._closing: Optional[asyncio.Future[None]] = None
        self._tasks: list[asyncio.Future[None]] = []

    @classmethod
    async def connect(cls, path: PathArg = None, *, client: str = "", session_ttl: float = 0,
                      heartbeat: Optional[float] = None, auto_heartbeat: bool = True,
                      reconnect: bool = True, timeout: Optional[float] = DEFAULT_TIMEOUT,
                      on_event: Optional[Callable[[Message], object]] = None) -> AsyncClient:
        """Create a client and connect it."""
        client_ = cls(path, client=client, session_ttl=session_ttl, heartbeat=heartbeat,
                      auto_heartbeat=auto_heartbeat, reconnect=reconnect, timeout=timeout,
                      on_event=on_event)
        await client_.open()
        return client_

    def _new_lease(self, fields: Message, meta: Optional[str]) -> AsyncLease:
        return AsyncLease(self, fields, meta)

    def _new_campaign(self, campaign_id: str, name: str, scope: Optional[str],
                      ttl_ms: Optional[int], meta: Optional[str]) -> AsyncCampaign:
        return AsyncCampaign(self, campaign_id, name, scope, ttl_ms, meta)

    async def open(self) -> None:
        """Connect and say hello (``async with`` does it).

        Returns at once if the client is connected already. Called while
        another task's open() is under way, it connects nothing itself: it
        waits for that open() and shares its outcome, returning once the
        client is connected, or raising the error that open() raised (should
        that open() be cancelled instead, this one opens the client). After
        an open() that failed, a new call tries again.

        Raises :class:`AgentConnectionError` ("the client is closed") if
        :meth:`close` was called before it, or is called while it connects:
        the session its ``hello`` opened, if any, is then ended first.
        """
        while True:
            if self._close_called:
                raise AgentConnectionError("the client is closed")
            opening = self._opening
            if opening is None:
                break
            if not opening.done():
                # Another task opens the client: its outcome is this call's.
                outcome = await asyncio.shield(opening)
                if isinstance(outcome, _GaveUp):
                    continue  # cancelled: open it here (unless another waiter does)
                if outcome is not None:
                    raise outcome
                return
            if opening.result() is None:
                return  # open already
            break  # the last open() failed or was cancelled: try again
        if not self._opened:
            self._up, self._stop = asyncio.Event(), asyncio.Event()
        self._opened = True
        opening = self._opening = asyncio.get_running_loop().create_future()
        result: Union[None, Exception, _GaveUp] = _GAVE_UP
        try:
            try:
                conn = await self._open()
            except LockagentError as e:
                if self._close_called:
                    raise AgentConnectionError("the client is closed") from e
                raise
            if self._close_called:
                # Closed while it said hello: end the session it opened.
                await self._bye(conn)
                raise AgentConnectionError("the client is closed")
            if conn.dead:
                raise AgentConnectionError("the connection to the agent at %s ended as it opened"
                                           % self.path)
            self._conn = conn
            self._up.set()
            if self.heartbeat and self.auto_heartbeat:
                self._tasks.append(asyncio.ensure_future(self._beat(self.heartbeat / 3.0)))
            result = None
        except Exception as e:
            result = e
            raise
        finally:
            opening.set_result(result)

    async def __aenter__(self) -> AsyncClient:
        await self.open()
        return self

    async def __aexit__(self, exc_type: Optional[type[BaseException]],
                        exc: Optional[BaseException], tb: Optional[TracebackType]) -> None:
        await self.close()

    @property
    def connected(self) -> bool:
        """True while the client has a connection to the agent."""
        return self._conn is not None

    # -- ops

    async def acquire(self, name: str, *, wait: Optional[float] = 0, shared: bool = False,
                      limit: Optional[int] = None, scope: Optional[str] = None,
                      ttl: Optional[float] = None, meta: Optional[str] = None) -> AsyncLease:
        """Acquire the lock ``name`` and return its :class:`AsyncLease`.

        The arguments and errors are those of :meth:`Client.acquire`.
        """
        args = self._acquire_args(name, wait, shared, limit, scope, ttl, meta)
        return self._granted(await self._request("acquire", args, arg=name, meta=meta))

    def lock(self, name: str, *, wait: Optional[float] = 0, shared: bool = False,
             limit: Optional[int] = None, scope: Optional[str] = None,
             ttl: Optional[float] = None, meta: Optional[str] = None) -> _AsyncLockContext:
        """Acquire ``name`` for an ``async with`` block, which releases it at its end."""
        return _AsyncLockContext(lambda: self.acquire(name, wait=wait, shared=shared,
                                                      limit=limit, scope=scope, ttl=ttl,
                                                      meta=meta))

    async def campaign(self, name: str, *, scope: Optional[str] = None,
                       ttl: Optional[float] = None, meta: Optional[str] = None
                       ) -> AsyncCampaign:
        """Start contending for leadership of ``name``: an :class:`AsyncCampaign`.

        See :meth:`Client.campaign`.
        """
        args = self._campaign_args(name, scope, ttl, meta)
        return self._started(await self._request("campaign", args, arg=args))

    async def inspect(self, name: str) -> LockInfo:
        """Who holds ``name``: a :class:`LockInfo`."""
        r = await self._call("inspect", {"name": name})
        return LockInfo(bool(r.get("locked")), r.get("mode"), holders(r.get("holders")),
                        r.get("last_token", 0), r.get("queued", 0))

    async def list_sessions(self, all: bool = False) -> list[Message]:
        """The sessions of this uid (every session with ``all``, for admins), as dicts."""
        sessions: list[Message] = (
            await self._list(lambda args: self._call("list", args), all))["sessions"]
        return sessions

    @staticmethod
    async def _list(call: Callable[[Message], Awaitable[Message]], all: bool = False) -> Message:
        """Every page of a list, as one answer."""
        args: Message = {"limit": LIST_PAGE}
        sessions: list[Message] = []
        if all:
            args["all"] = True
        while True:
            page = await call(args)
            sessions += page.get("sessions") or []
            if page.get("next") is None:
                return {"sessions": sessions}
            args["after"] = page["next"]

    async def break_lock(self, name: str) -> int:
        """End every lease on ``name`` (admins only); returns how many ended."""
        broken: int = (await self._call("break", {"name": name})).get("broken", 0)
        return broken

    async def ping(self) -> None:
        """Ask the agent for a pong; keeps a heartbeat alive."""
        await self._call("ping", {})

    async def call(self, op: str, **args: Any) -> Message:
        """Send any op with ``args`` and return the agent's answer as a dict."""
        return await self._call(op, args)

    async def close(self) -> None:
        """End the session (``bye``: every lease is released) and the connection.

        A session with a ``session_ttl`` whose connection broke is resumed on
        a new connection to be ended, so that its leases are not left held
        for the grace period. Every lease and campaign of the client ends
        then, released and resigned, even when the session could not be
        reached. An :meth:`open` under way ends first: it
        raises AgentConnectionError, and its session, if any, is ended.

        Safe to call more than once, from any task: every call returns once
        the close is complete, a call made while another task closes the
        client too (the calls share one close). Cancelling a call stops
        only its wait: the close goes on.
        """
        if self._closing is None:
            self._close_called = self._closed = True
            if self._opened:
                self._stop.set()
                self._up.set()
            self._closing = asyncio.ensure_future(self._close())
        await asyncio.shield(self._closing)

    async def _close(self) -> None:
        if not self._opened:
            return
        if self._opening is not None:
            await asyncio.shield(self._opening)
        conn = self._conn
        if conn is not None:
            await self._bye(conn)
        await asyncio.gather(*self._tasks, return_exceptions=True)
        await self._end_detached()
        # The session ended, as bye ends it: what a broken connection left
        # to a resume is released.
        self._end_leases(lambda lease: True, None)
        self._end_campaigns(lambda campaign: True, RESIGNED)

    async def _end_detached(self) -> None:
        """Ends the session if its connection broke before ``bye`` was
        answered (see _detached), so that its leases do not stay held."""
        if not self._detached():
            return

        async def end() -> None:
            reader, writer = await asyncio.open_unix_connection(self.path)
            try:
                writer.write(self._end_lines())
                await writer.drain()
                while await reader.read(65536):  # the agent closes after bye
                    pass
            finally:
                writer.close()

        try:
            await asyncio.wait_for(end(), self.timeout or END_WAIT)
        except (OSError, asyncio.TimeoutError) as e:
            log.info("lockagent: ending the session at %s: %s", self.path, e)

    # -- transport

    async def _connect(self) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        """A new connection to the agent's socket: its reader and writer."""
        check_private(self.path)
        try:
            return await asyncio.wait_for(asyncio.open_unix_connection(self.path), self.timeout)
        except (OSError, asyncio.TimeoutError) as e:
            raise AgentConnectionError("cannot connect to the agent at %s: %s"
                                       % (self.path, e)) from e

    async def _open(self) -> _AsyncConn:
        """Connect and say hello, resuming the session if it can."""
        reader, writer = await self._connect()
        if self._close_called:
            writer.close()  # closed while it connected: no session to open
            raise AgentConnectionError("the client is closed")
        conn = _AsyncConn(reader, writer)
        conn.task = asyncio.ensure_future(self._read(conn))
        self._tasks = [task for task in self._tasks if not task.done()]
        self._tasks.append(conn.task)
        try:
            if self._resumable():
                try:
                    result = await self._call_on(conn, "hello", self._hello_args(True))
                except SessionExpired:
                    self._resume_refused()
                    result = await self._call_on(conn, "hello", self._hello_args(False))
            else:
                result = await self._call_on(conn, "hello", self._hello_args(False))
            self._apply_hello(result)
            if self.resumed:
                for lease in self._session_leases():
                    try:
                        await self._call_on(conn, "check", {"lease": lease.id})
                        self._kept(lease)
                    except NotHeld:
                        self._forget(lease)
                    except ProtocolError:
                        pass  # the backend cannot say now: renewals will
                listing = await self._list(lambda args: self._call_on(conn, "list", args))
                self._forget_campaigns(listing)
                for op, args in self._strays(listing):
                    try:
                        await self._call_on(conn, op, args)
                    except ProtocolError:
                        pass
        except AgentConnectionError as e:
            conn.kill()
            await conn.read_to_end(self.timeout or END_WAIT)  # the reason, if any
            raise self._open_failed(conn, e)
        except BaseException:
            conn.kill()
            raise
        return conn

    async def _read(self, conn: _AsyncConn) -> None:
        buf = bytearray()
        try:
            while True:
                chunk = await conn.reader.read(65536)
                if not chunk:
                    break
                start = len(buf)
                buf += chunk
                end = buf.find(b"\n", start)
                while end >= 0:
                    msg = decode(bytes(buf[:end]))
                    del buf[:end + 1]
                    if msg is not None:
                        conn.cause = self._close_cause(msg)
                        if "event" in msg and "id" not in msg:
                            self._on_event(msg)
                        else:
                            self._on_answer(conn, msg)
                    end = buf.find(b"\n")
        except OSError:
            pass
        except asyncio.CancelledError:
            self._closed = True  # the event loop is going away: do not reconnect
            raise
        finally:
            await self._on_conn_end(conn)

    def _on_answer(self, conn: _AsyncConn, msg: Message) -> None:
        key = msg.get("id")
        pending = conn.pending.pop(key, None) if isinstance(key, str) else None
        if pending is None:
            return
        send = self._on_response(pending, msg)
        pending.response = msg
        if not pending.done.done():
            pending.done.set_result(None)
        if send is not None:
            self._send_quiet(conn, send)

    async def _on_conn_end(self, conn: _AsyncConn) -> None:
        conn.dead = True
        pending, conn.pending = conn.pending, {}
        conn.writer.close()
        for p in pending.values():
            if not p.done.done():
                p.done.set_result(None)  # no response: the caller raises AgentConnectionError
        if self._conn is not conn:
            return
        self._conn = None
        self._up.clear()
        self._connection_ended()
        if self.reconnect and not self._closed:
            await self._reconnect()
        else:
            self._closed = True
            self._stop.set()
            self._up.set()

    async def _reconnect(self) -> None:
        delay = 0.05
        while not self._stop.is_set():
            try:
                conn = await self._open()
            except LockagentError as e:
                log.info("lockagent: reconnecting to %s: %s", self.path, e)
                try:
                    await asyncio.wait_for(self._stop.wait(), delay)
                except asyncio.TimeoutError:
                    pass
                delay = min(delay * 2, 2.0)
                continue
            if self._closed:
                await self._bye(conn)
                return
            if conn.dead:
                # It ended before it was installed, and found nothing to
                # reconnect (see _on_conn_end): try again.
                try:
                    await asyncio.wait_for(self._stop.wait(), delay)
                except asyncio.TimeoutError:
                    pass
                continue
            self._conn = conn
            self._up.set()
            return

    async def _bye(self, conn: _AsyncConn) -> None:
        try:
            await self._call_on(conn, "bye", {})
        except LockagentError:
            pass
        conn.kill()

    async def _beat(self, period: float) -> None:
        while True:
            try:
                await asyncio.wait_for(self._stop.wait(), period)
                return
            except asyncio.TimeoutError:
                pass
            if self._conn is not None:
                self._send_quiet(self._conn, {"op": "ping"})

    def _send_quiet(self, conn: _AsyncConn, msg: Message) -> None:
        """Send a request whose answer nobody waits for."""
        msg = dict(msg, id=self._next_id())
        try:
            conn.writer.write(encode(msg))
        except (OSError, RuntimeError):
            conn.kill()

    async def _connection(self, broken: Optional[_AsyncConn] = None) -> _AsyncConn:
        """The current connection (other than ``broken``), waiting up to the
        timeout for a reconnect."""
        if not self._opened and not self._closed:
            raise AgentConnectionError("the client is not open: use async with, "
                                       "AsyncClient.connect or open()")
        deadline = None if self.timeout is None else time.monotonic() + self.timeout
        while self._conn is None or self._conn is broken:
            if self._closed:
                raise AgentConnectionError("the client is closed")
            remaining = None if deadline is None else deadline - time.monotonic()
            if remaining is not None and remaining <= 0:
                raise AgentConnectionError("not connected to the agent at %s" % self.path)
            if self._conn is broken:
                self._up.clear()  # its reader has yet to see the end
            try:
                await asyncio.wait_for(self._up.wait(), remaining)
            except asyncio.TimeoutError:
                pass
        return self._conn

    async def _call(self, op: str, args: Message, arg: Any = None,
                    meta: Optional[str] = None) -> Message:
        """Send a request, on the next connection if the current one breaks
        before it is sent; the agent's answer, or its error raised."""
        return self._result(await self._request(op, args, arg, meta))

    async def _request(self, op: str, args: Message, arg: Any = None,
                       meta: Optional[str] = None) -> _AsyncPending:
        """_call's request, answered."""
        conn = await self._connection()
        while True:
            try:
                return await self._request_on(conn, op, args, arg, meta)
            except _NotSent as e:
                if not self.reconnect:
                    raise AgentConnectionError(str(e)) from e.__cause__
            # The connection broke before the request could reach the agent:
            # send it on the next one.
            conn = await self._connection(broken=conn)

    async def _call_on(self, conn: _AsyncConn, op: str, args: Message, arg: Any = None,
                       meta: Optional[str] = None) -> Message:
        """Send a request on ``conn``; the agent's answer, or its error raised."""
        return self._result(await self._request_on(conn, op, args, arg, meta))

    async def _request_on(self, conn: _AsyncConn, op: str, args: Message, arg: Any = None,
                          meta: Optional[str] = None) -> _AsyncPending:
        """_call_on's request, answered."""
        if conn.dead or conn.writer.transport.is_closing():
            raise _NotSent("the connection to the agent ended") from conn.cause
        key = self._next_id()
        msg = {"id": key, "op": op}
        msg.update(args)
        data = self._line(msg)
        pending = _AsyncPending(key, op, arg, meta,
                                waits=op == "acquire" and args.get("wait_ms", 0) != 0)
        conn.pending[key] = pending
        timeout = self._call_timeout(op, args)
        try:
            await conn.send(data)
            await asyncio.wait_for(asyncio.shield(pending.done), timeout)
        except asyncio.TimeoutError:
            assert timeout is not None  # a wait without one does not run out
            self._abandon(conn, pending)
            raise AgentTimeout("the agent did not answer %s within %.1fs"
                               % (op, timeout)) from None
        except OSError as e:
            # The agent closed the connection, maybe saying why first: the
            # reader reads that to the end before it is killed.
            await conn.read_to_end(REASON_WAIT)
            conn.kill()
            raise AgentConnectionError("sending %s to the agent: %s" % (op, e)) from e
        except BaseException:  # cancelled: give up the request
            self._abandon(conn, pending)
            raise
        if pending.response is None:
            raise AgentConnectionError("the connection to the agent ended before the answer "
                                       "to %s" % op) from conn.cause
        return pending

    def _abandon(self, conn: _AsyncConn, pending: _AsyncPending) -> None:
        send = self._abandoned(conn, pending)
        if send is not None and not conn.dead:
            self._send_quiet(conn, send)
