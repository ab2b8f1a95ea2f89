"""The blocking client: a socket, read by a thread of its own."""

from __future__ import annotations

import socket
import threading
import time
from typing import TYPE_CHECKING, Any, Callable, Optional

from ._core import (DEFAULT_TIMEOUT, END_WAIT, LIST_PAGE, REASON_WAIT, Core, Message, PathArg,
                    Pending, decode, encode, log)
from ._errors import (AgentConnectionError, AgentTimeout, LockagentError, NotHeld, ProtocolError,
                      SessionExpired, _NotSent)
from ._leases import RESIGNED, Campaign, Lease, LockInfo, holders
from ._paths import check_private

if TYPE_CHECKING:
    from types import TracebackType

# Set on a client's reader threads: a request made there would wait for
# the thread itself.
_reader_thread = threading.local()


class _SyncPending(Pending[Lease, Campaign]):
    __slots__ = ("done",)

    def __init__(self, key: str, op: str, arg: Any, meta: Optional[str], waits: bool) -> None:
        super().__init__(key, op, arg, meta, waits)
        self.done = threading.Event()


class _SyncConn:
    """One connection to the agent, read by its own thread."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.wmu = threading.Lock()
        # Request id -> its _SyncPending, guarded by the client's _answer_mu.
        self.pending: dict[str, _SyncPending] = {}
        self.dead = False
        self.cause: Optional[LockagentError] = None  # see Core._close_cause
        self.reader: Optional[threading.Thread] = None

    def send(self, data: bytes) -> None:
        with self.wmu:
            self.sock.sendall(data)

    def kill(self) -> None:
        """Break the connection; its reader sees the end and cleans up."""
        try:
            self.sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass


class Client(Core[Lease, Campaign]):
    """A blocking client of the agent; safe to share between threads.

    It connects and says ``hello`` at once (raising
    :class:`AgentConnectionError` if the agent cannot be reached, or the
    agent's error, such as :class:`LimitExceeded`, if it refuses the
    connection), reads
    the agent's answers and events on a thread of its own, and reconnects
    when the connection breaks.

    - ``path``: the socket; default ``$LOCKAGENT_SOCKET``, else the default path.
    - ``client``: a name shown by ``lockagent ctl list``.
    - ``session_ttl``: seconds the session outlives a broken connection.
      With it, session-scoped leases survive a reconnect: the client
      resumes the session. 0 (default): the session ends with its
      connection, and every lease with it.
    - ``heartbeat``: seconds without a line after which the agent treats
      the connection as dropped. The client then pings every third of it
      on a thread of its own, unless ``auto_heartbeat`` is False: then the
      application must call :meth:`ping` often enough, so that a hung
      application loses its connection-scoped locks.
    - ``reconnect``: reconnect when the connection breaks (default True).
      Requests made meanwhile wait for the new connection, up to
      ``timeout``. False: the client is closed when its connection breaks.
    - ``timeout``: seconds to wait for the agent's answer (beyond an
      acquire's own ``wait``) and for a connection; None: no limit.
    - ``on_event``: called with every event the agent sends (a dict), on
      the client's reader thread.
    """

    def __init__(self, path: PathArg = None, *, client: str = "", session_ttl: float = 0,
                 heartbeat: Optional[float] = None, auto_heartbeat: bool = True,
                 reconnect: bool = True, timeout: Optional[float] = DEFAULT_TIMEOUT,
                 on_event: Optional[Callable[[Message], object]] = None) -> None:
        super().__init__(path, client, session_ttl, heartbeat, auto_heartbeat, reconnect,
                         timeout, on_event)
        self._cond = threading.Condition(self._mu)
        self._answer_mu = threading.Lock()
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self._conn: Optional[_SyncConn] = None
        self._close_done = threading.Event()  # set once the first close() has ended
        conn = self._open()
        with self._cond:
            if conn.dead:
                raise AgentConnectionError("the connection to the agent at %s ended as it opened"
                                           % self.path)
            self._conn = conn
        if heartbeat and auto_heartbeat:
            self._start_thread(self._beat, "lockagent-heartbeat", heartbeat / 3.0)

    def __enter__(self) -> Client:
        return self

    def __exit__(self, exc_type: Optional[type[BaseException]],
                 exc: Optional[BaseException], tb: Optional[TracebackType]) -> None:
        self.close()

    def _new_lease(self, fields: Message, meta: Optional[str]) -> Lease:
        return Lease(self, fields, meta)

    def _new_campaign(self, campaign_id: str, name: str, scope: Optional[str],
                      ttl_ms: Optional[int], meta: Optional[str]) -> Campaign:
        return Campaign(self, campaign_id, name, scope, ttl_ms, meta)

    @property
    def connected(self) -> bool:
        """True while the client has a connection to the agent."""
        return self._conn is not None

    # -- ops

    def acquire(self, name: str, *, wait: Optional[float] = 0, shared: bool = False,
                limit: Optional[int] = None, scope: Optional[str] = None,
                ttl: Optional[float] = None, meta: Optional[str] = None) -> Lease:
        """Acquire the lock ``name`` and return its :class:`Lease`.

        - ``wait``: 0 (default) tries once; N waits up to N seconds; None,
          ``math.inf`` or -1 (the protocol's ``wait_ms`` -1) waits until
          granted. Any other negative number raises :class:`InvalidArgument`.
        - ``shared``: a shared lock instead of an exclusive one; ``limit``
          caps the shared holders (a counting semaphore).
        - ``scope``: ``"connection"`` (default) or ``"session"``.
        - ``ttl``: the backend lease duration in seconds (the agent's default if None).
        - ``meta``: text shown to ``inspect`` and ``lockagent ctl list``.

        Raises :class:`NotAcquired` if the lock is held (a try) or the wait
        ran out, and :class:`AlreadyHeld` if this session holds it already.
        """
        args = self._acquire_args(name, wait, shared, limit, scope, ttl, meta)
        return self._granted(self._request("acquire", args, arg=name, meta=meta))

    def lock(self, name: str, *, wait: Optional[float] = 0, shared: bool = False,
             limit: Optional[int] = None, scope: Optional[str] = None,
             ttl: Optional[float] = None, meta: Optional[str] = None) -> Lease:
        """Acquire ``name`` for a ``with`` block, which releases it at its end.

        Takes the arguments of :meth:`acquire`::

            with client.lock("orders/42", wait=5) as lease:
                ...
        """
        return self.acquire(name, wait=wait, shared=shared, limit=limit, scope=scope, ttl=ttl,
                            meta=meta)

    def campaign(self, name: str, *, scope: Optional[str] = None, ttl: Optional[float] = None,
                 meta: Optional[str] = None) -> Campaign:
        """Start contending for leadership of ``name``: a :class:`Campaign`.

        Returns at once. The session leads while it holds the name's
        exclusive lock, granted by the agent as a term whenever the name is
        free; ``campaign.wait_elected()`` returns the term's lease. When a
        term's lease ends the agent contends again on its own, until
        :meth:`Campaign.resign` or the end of the ``scope``. ``ttl`` and
        ``meta`` are those of each term's lease::

            with client.campaign("leader/billing") as campaign:
                lease = campaign.wait_elected()
                while not lease.lost:
                    lead(fencing_token=lease.token)
        """
        args = self._campaign_args(name, scope, ttl, meta)
        return self._started(self._request("campaign", args, arg=args))

    def inspect(self, name: str) -> LockInfo:
        """Who holds ``name``: a :class:`LockInfo`."""
        r = self._call("inspect", {"name": name})
        return LockInfo(bool(r.get("locked")), r.get("mode"), holders(r.get("holders")),
                        r.get("last_token", 0), r.get("queued", 0))

    def list_sessions(self, all: bool = False) -> list[Message]:
        """The sessions of this uid (every session with ``all``, for admins), as dicts."""
        sessions: list[Message] = self._list(lambda args: self._call("list", args),
                                             all)["sessions"]
        return sessions

    @staticmethod
    def _list(call: Callable[[Message], Message], all: bool = False) -> Message:
        """Every page of a list, as one answer."""
        args: Message = {"limit": LIST_PAGE}
        sessions: list[Message] = []
        if all:
            args["all"] = True
        while True:
            page = call(args)
            sessions += page.get("sessions") or []
            if page.get("next") is None:
                return {"sessions": sessions}
            args["after"] = page["next"]

    def break_lock(self, name: str) -> int:
        """End every lease on ``name`` (admins only); returns how many ended."""
        broken: int = self._call("break", {"name": name}).get("broken", 0)
        return broken

    def ping(self) -> None:
        """Ask the agent for a pong; keeps a heartbeat alive."""
        self._call("ping", {})

    def call(self, op: str, **args: Any) -> Message:
        """Send any op with ``args`` and return the agent's answer as a dict."""
        return self._call(op, args)

    def close(self) -> None:
        """End the session (``bye``: every lease is released) and the connection.

        A session with a ``session_ttl`` whose connection broke is resumed on
        a new connection to be ended, so that its leases are not left held
        for the grace period. Every lease and campaign of the client ends
        then, released and resigned, even when the session could not be
        reached. Not to be called from a callback.

        Safe to call more than once, from any thread: every call returns
        once the close is complete, a call made while another thread closes
        the client too (it waits for that close to end).
        """
        self._not_on_reader()
        conn = None
        with self._cond:
            first = not self._close_called
            if first:
                self._close_called = self._closed = True
                conn = self._conn
                self._cond.notify_all()
        if not first:
            self._close_done.wait()
            return
        try:
            self._stop.set()
            if conn is not None:
                self._bye(conn)
            for t in self._threads:
                t.join(self.timeout)
            self._end_detached()
            # The session ended, as bye ends it: what a broken connection
            # left to a resume is released.
            self._end_leases(lambda lease: True, None)
            self._end_campaigns(lambda campaign: True, RESIGNED)
        finally:
            self._close_done.set()

    def _end_detached(self) -> None:
        """Ends the session if its connection broke before ``bye`` was
        answered (see _detached), so that its leases do not stay held."""
        if not self._detached():
            return
        try:
            with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
                sock.settimeout(self.timeout or END_WAIT)
                sock.connect(self.path)
                sock.sendall(self._end_lines())
                while sock.recv(65536):  # the agent closes after bye
                    pass
        except OSError as e:
            log.info("lockagent: ending the session at %s: %s", self.path, e)

    # -- transport

    def _start_thread(self, target: Callable[..., object], name: str,
                      *args: Any) -> threading.Thread:
        t = threading.Thread(target=target, name=name, args=args, daemon=True)
        self._threads = [old for old in self._threads if old.is_alive()]
        self._threads.append(t)
        t.start()
        return t

    def _not_on_reader(self) -> None:
        if getattr(_reader_thread, "client", None) is self:
            raise RuntimeError("lockagent: a request from a callback would block the client's "
                               "reader; hand the work to another thread")

    def _open(self) -> _SyncConn:
        """Connect and say hello, resuming the session if it can."""
        check_private(self.path)
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.settimeout(self.timeout)
            sock.connect(self.path)
            sock.settimeout(None)
        except OSError as e:
            sock.close()
            raise AgentConnectionError("cannot connect to the agent at %s: %s"
                                       % (self.path, e)) from e
        conn = _SyncConn(sock)
        reader = conn.reader = self._start_thread(self._read, "lockagent-reader", conn)
        try:
            if self._resumable():
                try:
                    result = self._call_on(conn, "hello", self._hello_args(True))
                except SessionExpired:
                    self._resume_refused()
                    result = self._call_on(conn, "hello", self._hello_args(False))
            else:
                result = self._call_on(conn, "hello", self._hello_args(False))
            self._apply_hello(result)
            if self.resumed:
                for lease in self._session_leases():
                    try:
                        self._call_on(conn, "check", {"lease": lease.id})
                        self._kept(lease)
                    except NotHeld:
                        self._forget(lease)
                    except ProtocolError:
                        pass  # the backend cannot say now: renewals will
                listing = self._list(lambda args: self._call_on(conn, "list", args))
                self._forget_campaigns(listing)
                for op, args in self._strays(listing):
                    try:
                        self._call_on(conn, op, args)
                    except ProtocolError:
                        pass
        except AgentConnectionError as e:
            conn.kill()
            reader.join(self.timeout or END_WAIT)  # it reads the agent's reason, if any
            raise self._open_failed(conn, e)
        except BaseException:
            conn.kill()
            raise
        return conn

    def _read(self, conn: _SyncConn) -> None:
        _reader_thread.client = self
        try:
            with conn.sock.makefile("rb") as f:
                for line in f:
                    msg = decode(line)
                    if msg is None:
                        continue
                    conn.cause = self._close_cause(msg)
                    if "event" in msg and "id" not in msg:
                        self._on_event(msg)
                    else:
                        self._on_answer(conn, msg)
        except (OSError, ValueError):
            pass
        finally:
            self._on_conn_end(conn)

    def _on_answer(self, conn: _SyncConn, msg: Message) -> None:
        key = msg.get("id")
        with self._answer_mu:
            pending = conn.pending.pop(key, None) if isinstance(key, str) else None
            if pending is None:
                return
            send = self._on_response(pending, msg)
            pending.response = msg
        pending.done.set()
        if send is not None:
            self._send_quiet(conn, send)

    def _on_conn_end(self, conn: _SyncConn) -> None:
        with self._answer_mu:
            conn.dead = True
            pending, conn.pending = conn.pending, {}
        conn.sock.close()
        for p in pending.values():
            p.done.set()  # no response: the caller raises AgentConnectionError
        with self._cond:
            active = self._conn is conn
            if active:
                self._conn = None
        if not active:
            return
        self._connection_ended()
        if self.reconnect and not self._closed:
            self._reconnect()
        else:
            with self._cond:
                self._closed = True
                self._cond.notify_all()
            self._stop.set()

    def _reconnect(self) -> None:
        delay = 0.05
        while not self._stop.is_set():
            try:
                conn = self._open()
            except LockagentError as e:
                log.info("lockagent: reconnecting to %s: %s", self.path, e)
                self._stop.wait(delay)
                delay = min(delay * 2, 2.0)
                continue
            with self._cond:
                closed = self._closed
                if not closed and not conn.dead:
                    self._conn = conn
                    self._cond.notify_all()
                    return
            if closed:
                self._bye(conn)  # closed meanwhile
                return
            # It ended before it was installed, and found nothing to
            # reconnect (see _on_conn_end): try again.
            self._stop.wait(delay)

    def _bye(self, conn: _SyncConn) -> None:
        try:
            self._call_on(conn, "bye", {})
        except LockagentError:
            pass
        conn.kill()

    def _beat(self, period: float) -> None:
        while not self._stop.wait(period):
            conn = self._conn
            if conn is not None:
                self._send_quiet(conn, {"op": "ping"})

    def _send_quiet(self, conn: _SyncConn, msg: Message) -> None:
        """Send a request whose answer nobody waits for."""
        try:
            conn.send(encode(dict(msg, id=self._next_id())))
        except OSError:
            conn.kill()

    def _connection(self, broken: Optional[_SyncConn] = None) -> _SyncConn:
        """The current connection (other than ``broken``), waiting up to the
        timeout for a reconnect."""
        self._not_on_reader()
        deadline = None if self.timeout is None else time.monotonic() + self.timeout
        with self._cond:
            while self._conn is None or self._conn is broken:
                if self._closed:
                    raise AgentConnectionError("the client is closed")
                remaining = None if deadline is None else deadline - time.monotonic()
                if remaining is not None and remaining <= 0:
                    raise AgentConnectionError("not connected to the agent at %s" % self.path)
                self._cond.wait(remaining)
            return self._conn

    def _call(self, op: str, args: Message, arg: Any = None, meta: Optional[str] = None
              ) -> Message:
        """Send a request, on the next connection if the current one breaks
        before it is sent; the agent's answer, or its error raised."""
        return self._result(self._request(op, args, arg, meta))

    def _request(self, op: str, args: Message, arg: Any = None, meta: Optional[str] = None
                 ) -> _SyncPending:
        """_call's request, answered."""
        conn = self._connection()
        while True:
            try:
                return self._request_on(conn, op, args, arg, meta)
            except _NotSent as e:
                if not self.reconnect:
                    raise AgentConnectionError(str(e)) from e.__cause__
            # The connection broke before the request could reach the agent:
            # send it on the next one.
            conn = self._connection(broken=conn)

    def _call_on(self, conn: _SyncConn, op: str, args: Message, arg: Any = None,
                 meta: Optional[str] = None) -> Message:
        """Send a request on ``conn``; the agent's answer, or its error raised."""
        return self._result(self._request_on(conn, op, args, arg, meta))

    def _request_on(self, conn: _SyncConn, op: str, args: Message, arg: Any = None,
                    meta: Optional[str] = None) -> _SyncPending:
        """_call_on's request, answered."""
        key = self._next_id()
        msg = {"id": key, "op": op}
        msg.update(args)
        data = self._line(msg)
        pending = _SyncPending(key, op, arg, meta,
                               waits=op == "acquire" and args.get("wait_ms", 0) != 0)
        with self._answer_mu:
            if conn.dead:
                raise _NotSent("the connection to the agent ended") from conn.cause
            conn.pending[key] = pending
        try:
            conn.send(data)
        except OSError as e:
            # sendall failed: the line's end, at least, never left. The
            # agent closed the connection, maybe saying why first: the
            # reader reads that to the end before it is killed.
            with self._answer_mu:
                conn.pending.pop(key, None)
            if conn.reader is not None and conn.reader is not threading.current_thread():
                conn.reader.join(REASON_WAIT)
            conn.kill()
            raise _NotSent("sending %s to the agent: %s" % (op, e)) from e
        timeout = self._call_timeout(op, args)
        try:
            answered = pending.done.wait(timeout)
        except BaseException:  # KeyboardInterrupt: give up the request
            self._abandon(conn, pending)
            raise
        if not answered:
            assert timeout is not None  # a wait without one does not run out
            self._abandon(conn, pending)
            raise AgentTimeout("the agent did not answer %s within %.1fs" % (op, timeout))
        if pending.response is None:
            raise AgentConnectionError("the connection to the agent ended before the answer "
                                       "to %s" % op) from conn.cause
        return pending

    def _abandon(self, conn: _SyncConn, pending: _SyncPending) -> None:
        with self._answer_mu:
            send = self._abandoned(conn, pending)
        if send is not None:
            self._send_quiet(conn, send)
