"""A client of lockagent, the per-host lock agent, in one file.

Python 3.9 or later, standard library only: copy this file into your
application. It speaks the agent's wire protocol (newline-delimited JSON
over a Unix socket, see docs/protocol.md) and offers a blocking client,
:class:`Client`, and an asyncio one, :class:`AsyncClient`, with the same
methods.

    import lockagent

    with lockagent.Client(client="billing-worker") as client:
        with client.lock("orders/42", wait=5, meta="invoice run") as lease:
            write_invoice(order=42, fencing_token=lease.token)

    async with lockagent.AsyncClient(client="billing-worker") as client:
        async with client.lock("orders/42", wait=5) as lease:
            await write_invoice(order=42, fencing_token=lease.token)

Durations given to the client (``wait``, ``ttl``, ``session_ttl``,
``heartbeat``, ``timeout``) are in seconds, as floats or ints. Results keep
the protocol's names and units (``ttl_ms``, ``expires_in_ms``).

The socket is found like the agent and ``lockagent ctl`` find it: an
explicit path, else ``LOCKAGENT_SOCKET``, else the default path (see
:func:`default_socket_path`).

Losing a lease
--------------
A lease can end without a release: an admin breaks it, the agent cannot
renew it, the agent stops, or the connection breaks. **A broken connection
means every connection-scoped lease is lost**, at once, whether or not the
client reconnects. Session-scoped leases survive a broken connection when
the session has a grace period (``session_ttl`` > 0): the client
reconnects and resumes the session, and only loses them if the resume is
refused. Each lease tells it in three ways:

- poll: ``lease.lost`` (and ``lease.lost_reason``), or
  ``lease.raise_if_lost()`` before a write;
- wait: ``lease.wait_lost(timeout)`` (``await lease.wait_lost()`` with
  asyncio);
- callback: ``lease.add_lost_callback(fn)``, called with the lease.

A lease whose ``release()`` raised because the connection broke before the
answer is not reported lost if the resumed session no longer has it: it
ends as released (a campaign whose ``resign()`` did so, as resigned).

A lost lease may still be in use by a process that has not looked yet (a
pause, a slow disk). Pass ``lease.token``, the fencing token, to whatever
the lock protects, and have it refuse tokens smaller than the largest it
has seen.
"""

import asyncio
import collections
import itertools
import json
import logging
import math
import os
import socket
import stat
import threading
import time

__all__ = [
    "AgentConnectionError",
    "AgentTimeout",
    "AlreadyHeld",
    "AsyncClient",
    "AsyncCampaign",
    "AsyncLease",
    "BackendUnavailable",
    "BadRequest",
    "Campaign",
    "CampaignEnded",
    "CheckResult",
    "Canceled",
    "Client",
    "ForeignKey",
    "Holder",
    "InternalError",
    "InvalidArgument",
    "InvalidName",
    "Lease",
    "LeaseLost",
    "LimitExceeded",
    "LineTooLong",
    "LockInfo",
    "LockagentError",
    "NotAcquired",
    "NotHeld",
    "PermissionDenied",
    "ProtocolError",
    "SessionExpired",
    "ShuttingDown",
    "TokensExhausted",
    "UnknownOp",
    "default_socket_path",
    "socket_path",
]

__version__ = "0.1.0"

#: The protocol version this client speaks.
PROTOCOL_VERSION = 1

#: Seconds the client waits for an answer, and for a connection, by default.
DEFAULT_TIMEOUT = 10.0

# Seconds close() gives ending a session whose connection broke, when the
# client has no timeout.
_END_WAIT = 5.0

# How many sessions a list asks for at a time: each page is a small answer.
_LIST_PAGE = 100

# Seconds a failed send waits for the reader to read the agent's reason
# for closing the connection (a limit reached), if it gave one.
_REASON_WAIT = 1.0

# Why a lease was lost. The first four come from the agent's `lost` event;
# the others are the client's own.
#: The backend no longer has the lease, or its deadline passed unrenewed.
EXPIRED = "expired"
#: A renewal found another lease holding the name.
TAKEN_OVER = "taken_over"
#: An admin ended it (``lockagent ctl break``).
BROKEN = "broken"
#: Renewals failed until the lease's deadline.
BACKEND_UNAVAILABLE = "backend_unavailable"
#: The connection to the agent broke; the lease's scope ended with it.
CONNECTION_LOST = "connection_lost"
#: The session could not be resumed after the connection broke.
SESSION_EXPIRED = "session_expired"
#: The agent is stopping and releases every lease.
SHUTDOWN = "shutdown"
#: A campaign was resigned.
RESIGNED = "resigned"

_log = logging.getLogger("lockagent")


def default_socket_path(euid=None, environ=None):
    """Return the agent's default socket path, as the agent computes it.

    ``/run/lockagent/agent.sock`` for root and systemd services, else
    ``$XDG_RUNTIME_DIR/lockagent.sock``, else ``lockagent-UID/agent.sock``
    in ``$TMPDIR`` (``/tmp``). ``euid`` and ``environ`` default to the
    process's own.
    """
    if euid is None:
        euid = os.geteuid()
    if environ is None:
        environ = os.environ
    if euid == 0 or environ.get("INVOCATION_ID") or environ.get("NOTIFY_SOCKET"):
        return "/run/lockagent/agent.sock"
    runtime = environ.get("XDG_RUNTIME_DIR", "")
    if os.path.isabs(runtime):
        return os.path.normpath(os.path.join(runtime, "lockagent.sock"))
    return os.path.join(_private_dir(euid, environ), "agent.sock")


def _private_dir(euid=None, environ=None):
    """The default socket's directory for a user without a runtime directory."""
    if euid is None:
        euid = os.geteuid()
    if environ is None:
        environ = os.environ
    tmp = environ.get("TMPDIR") or "/tmp"
    return os.path.normpath(os.path.join(tmp, "lockagent-%d" % euid))


def _check_private(path):
    """Refuse a socket in the private directory unless it is the user's own.

    Anybody could have made that directory in the temporary directory and
    serve an agent of theirs there.
    """
    directory = os.path.dirname(os.path.normpath(path))
    if directory != _private_dir():
        return
    try:
        st = os.lstat(directory)
    except OSError as e:
        raise AgentConnectionError("cannot connect to the agent at %s: %s" % (path, e)) from e
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.geteuid() or st.st_mode & 0o077:
        raise AgentConnectionError(
            "cannot connect to the agent at %s: %s is not a directory private to uid %d"
            % (path, directory, os.geteuid()))


def socket_path(path=None, environ=None):
    """Return ``path`` if given, else ``$LOCKAGENT_SOCKET``, else the default."""
    if path:
        return os.fspath(path)
    if environ is None:
        environ = os.environ
    return environ.get("LOCKAGENT_SOCKET") or default_socket_path(environ=environ)


# ---------------------------------------------------------------- errors


class LockagentError(Exception):
    """The base of every error this module raises."""


class AgentConnectionError(LockagentError, ConnectionError):
    """The agent cannot be reached, or the connection ended before an answer."""


class _NotSent(AgentConnectionError):
    """A request that never reached the agent: its connection had ended."""


class AgentTimeout(LockagentError, TimeoutError):
    """The agent did not answer within the client's timeout."""


class NotAcquired(LockagentError):
    """An acquire was denied: ``reason`` is ``held`` (a try) or ``timeout``.

    ``holders`` lists the live leases on the name when it was denied
    (:class:`Holder`); it may be empty.
    """

    def __init__(self, name, reason, holders):
        super().__init__("%s not acquired (%s)" % (name, reason))
        self.name = name
        self.reason = reason
        self.holders = holders


class LeaseLost(LockagentError):
    """Raised by :meth:`Lease.raise_if_lost` for a lease that was lost."""

    def __init__(self, lease):
        super().__init__("lease %s on %s (token %d) was lost: %s"
                         % (lease.id, lease.name, lease.token, lease.lost_reason))
        self.lease = lease
        self.reason = lease.lost_reason


class CampaignEnded(LockagentError):
    """Raised by ``wait_elected`` for a campaign that has ended: ``reason`` is
    ``resigned``, ``connection_lost``, ``session_expired`` or ``shutdown``."""

    def __init__(self, campaign):
        super().__init__("campaign %s for %s ended: %s"
                         % (campaign.id, campaign.name, campaign.ended_reason))
        self.campaign = campaign
        self.reason = campaign.ended_reason


class ProtocolError(LockagentError):
    """The agent answered a request with an error.

    ``code`` is the protocol's stable error code (a subclass exists for each
    known one), ``message`` the agent's text, ``error`` the whole error
    object as sent.
    """

    code = None

    def __init__(self, code, message, error=None):
        super().__init__("%s: %s" % (code, message))
        self.code = code
        self.message = message
        self.error = error if error is not None else {"code": code, "message": message}


class BadRequest(ProtocolError):
    """``bad_request``: the agent could not read the request."""


class UnknownOp(ProtocolError):
    """``unknown_op``: the agent does not know this op."""


class LineTooLong(ProtocolError):
    """``line_too_long``: the request line was too long; the agent closed the connection."""


class InvalidName(ProtocolError):
    """``invalid_name``: a lock name that is empty, too long or has a forbidden character."""


class InvalidArgument(ProtocolError):
    """``invalid_argument``: an argument of the wrong type or out of bounds.

    The client raises it too, without sending the request, for an argument
    that JSON cannot carry: NaN, infinity, a string with a lone surrogate.
    """


class NotHeld(ProtocolError):
    """``not_held``: the lease (or campaign) is not this session's."""


class AlreadyHeld(ProtocolError):
    """``already_held``: the session already holds the name.

    ``lease`` is the client's :class:`Lease` for it, when the client knows
    it; ``error["lease"]`` has the fields the agent sent.
    """

    lease = None


class Canceled(ProtocolError):
    """``canceled``: a waiting acquire was cancelled, or its session ended."""


class PermissionDenied(ProtocolError):
    """``permission_denied``: the agent's ACL denies this peer."""


class LimitExceeded(ProtocolError):
    """``limit_exceeded``: too many sessions, leases or waiters."""


class SessionExpired(ProtocolError):
    """``session_expired``: the session to resume is unknown or has ended."""


class BackendUnavailable(ProtocolError):
    """``backend_unavailable``: the agent could not reach its backend."""


class ForeignKey(ProtocolError):
    """``foreign_key``: the backend holds data for the lock that the agent did not write."""


class TokensExhausted(ProtocolError):
    """``tokens_exhausted``: the name has no fencing token left below 2^53."""


class ShuttingDown(ProtocolError):
    """``shutting_down``: the agent is stopping."""


class InternalError(ProtocolError):
    """``internal``: an unexpected error in the agent."""


_ERRORS = {
    "bad_request": BadRequest,
    "unknown_op": UnknownOp,
    "line_too_long": LineTooLong,
    "invalid_name": InvalidName,
    "invalid_argument": InvalidArgument,
    "not_held": NotHeld,
    "already_held": AlreadyHeld,
    "canceled": Canceled,
    "permission_denied": PermissionDenied,
    "limit_exceeded": LimitExceeded,
    "session_expired": SessionExpired,
    "backend_unavailable": BackendUnavailable,
    "foreign_key": ForeignKey,
    "tokens_exhausted": TokensExhausted,
    "shutting_down": ShuttingDown,
    "internal": InternalError,
}


# ---------------------------------------------------------------- results

#: A live lease on a name, as a denied acquire or :meth:`Client.inspect` reports it.
Holder = collections.namedtuple("Holder", "mode token meta host expires_in_ms")

#: What :meth:`Client.inspect` reports about a name.
LockInfo = collections.namedtuple("LockInfo", "locked mode holders last_token queued")

#: What :meth:`Lease.check` reports: confirmed with the backend at the time of the call.
CheckResult = collections.namedtuple("CheckResult", "held token expires_in_ms")


def _holders(raw):
    return [Holder(h.get("mode"), h.get("token"), h.get("meta", ""), h.get("host", ""),
                   h.get("expires_in_ms")) for h in raw or ()]


def _ms(seconds, what):
    """Convert a duration in seconds to whole milliseconds, rounding up.

    Raises InvalidArgument (nothing is sent) unless it is a finite number of
    seconds, 0 or more."""
    if isinstance(seconds, bool) or not isinstance(seconds, (int, float)):
        raise InvalidArgument("invalid_argument", "%s must be a number of seconds, not %r"
                              % (what, seconds))
    try:
        if math.isfinite(seconds) and seconds >= 0:
            return int(math.ceil(seconds * 1000))
    except OverflowError:  # a float too large, or an int too large for one
        pass
    raise InvalidArgument("invalid_argument", "%s must be a finite number of seconds, "
                          "0 or more, not %r" % (what, seconds))


def _wait_ms(wait):
    """``wait`` in seconds (None, -1 or math.inf: without a limit) as the protocol's
    ``wait_ms``."""
    if wait is None or wait == -1 or wait == math.inf:
        return -1
    return _ms(wait, "wait")


# ---------------------------------------------------------------- leases


class _LeaseBase:
    """The state of a lease, shared by :class:`Lease` and :class:`AsyncLease`."""

    def __init__(self, client, fields, meta):
        self._client = client
        #: The lease id: names the lease in release, check and lost events.
        self.id = fields["lease"]
        #: The lock's name.
        self.name = fields.get("name")
        #: ``exclusive`` or ``shared``.
        self.mode = fields.get("mode", "exclusive")
        #: ``connection`` or ``session``.
        self.scope = fields.get("scope", "connection")
        #: The fencing token: larger for every later grant of the name.
        self.token = fields.get("token")
        #: The backend lease duration, in milliseconds (the agent renews it).
        self.ttl_ms = fields.get("ttl_ms")
        #: The ``meta`` given to the acquire.
        self.meta = meta or ""
        self._ended = False
        self._lost_reason = None
        self._callbacks = []
        self._mu = threading.Lock()

    def __repr__(self):
        state = "lost: %s" % self._lost_reason if self._lost_reason else (
            "ended" if self._ended else "held")
        return "<%s %s %s token=%s %s, %s>" % (type(self).__name__, self.name, self.mode,
                                               self.token, self.scope, state)

    @property
    def lost(self):
        """True once the lease is lost. Stop using what it protects."""
        return self._lost_reason is not None

    @property
    def lost_reason(self):
        """Why the lease was lost (``expired``, ``broken``, ``connection_lost``…), or None."""
        return self._lost_reason

    @property
    def active(self):
        """True while the lease is neither released nor lost, as far as the client knows."""
        return not self._ended

    def raise_if_lost(self):
        """Raise :class:`LeaseLost` if the lease was lost."""
        if self._lost_reason is not None:
            raise LeaseLost(self)

    def add_lost_callback(self, fn):
        """Call ``fn(lease)`` when the lease is lost; at once if it already is.

        Callbacks are not called for a lease that is released. They run on
        the client's reader (a thread, or the event loop for asyncio): keep
        them short, and make no blocking request from them.
        """
        with self._mu:
            if not self._ended:
                self._callbacks.append(fn)
                return
        if self._lost_reason is not None:
            _run_callback(fn, self)

    def _end(self, lost_reason):
        """Mark the lease ended: lost with ``lost_reason``, or released if None."""
        with self._mu:
            if self._ended:
                return
            self._ended = True
            self._lost_reason = lost_reason
            callbacks, self._callbacks = self._callbacks, []
        self._signal()
        if lost_reason is not None:
            for fn in callbacks:
                _run_callback(fn, self)

    def _signal(self):
        raise NotImplementedError

    def _check_result(self, result):
        return CheckResult(bool(result.get("held")), result.get("token", self.token),
                           result.get("expires_in_ms", 0))


def _run_callback(fn, *args):
    try:
        fn(*args)
    except Exception:  # a callback's bug must not stop the client's reader
        _log.exception("lockagent: callback %r failed", fn)


class Lease(_LeaseBase):
    """A granted lock, held through a :class:`Client`.

    A context manager: leaving the ``with`` block releases it.
    """

    def __init__(self, client, fields, meta):
        super().__init__(client, fields, meta)
        self._lost_event = threading.Event()

    def _signal(self):
        self._lost_event.set()

    def wait_lost(self, timeout=None):
        """Block until the lease is lost or released, up to ``timeout`` seconds.

        Returns True if the lease was lost.
        """
        self._lost_event.wait(timeout)
        return self.lost

    def release(self):
        """Release the lease. Returns False if it had already ended."""
        if self._ended:
            return False
        self._client._releasing(self.id)
        try:
            self._client._call("release", {"lease": self.id}, arg=self.id)
        except NotHeld:
            # Lost meanwhile (its lost event is on its way), or released
            # by a call given up on: either way it has ended.
            self._end(None)
            return False
        self._end(None)
        return True

    def check(self):
        """Ask the agent to confirm with the backend that the lease is held.

        Returns a :class:`CheckResult`; ``held`` is False (and the lease
        lost) if it is not.
        """
        if self._ended:
            return CheckResult(False, self.token, 0)
        try:
            result = self._client._call("check", {"lease": self.id})
        except NotHeld:
            return CheckResult(False, self.token, 0)
        return self._check_result(result)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        try:
            self.release()
        except LockagentError:
            if exc[0] is None:
                raise
        return False


class AsyncLease(_LeaseBase):
    """A granted lock, held through an :class:`AsyncClient`.

    An async context manager: leaving the ``async with`` block releases it.
    """

    def __init__(self, client, fields, meta):
        super().__init__(client, fields, meta)
        self._lost_event = asyncio.Event()

    def _signal(self):
        self._lost_event.set()

    async def wait_lost(self, timeout=None):
        """Wait until the lease is lost or released, up to ``timeout`` seconds.

        Returns True if the lease was lost.
        """
        try:
            await asyncio.wait_for(self._lost_event.wait(), timeout)
        except asyncio.TimeoutError:
            pass
        return self.lost

    async def release(self):
        """Release the lease. Returns False if it had already ended."""
        if self._ended:
            return False
        self._client._releasing(self.id)
        try:
            await self._client._call("release", {"lease": self.id}, arg=self.id)
        except NotHeld:
            # Lost meanwhile (its lost event is on its way), or released
            # by a call given up on: either way it has ended.
            self._end(None)
            return False
        self._end(None)
        return True

    async def check(self):
        """Ask the agent to confirm with the backend that the lease is held."""
        if self._ended:
            return CheckResult(False, self.token, 0)
        try:
            result = await self._client._call("check", {"lease": self.id})
        except NotHeld:
            return CheckResult(False, self.token, 0)
        return self._check_result(result)

    async def __aenter__(self):
        return self

    async def __aexit__(self, *exc):
        try:
            await self.release()
        except LockagentError:
            if exc[0] is None:
                raise
        return False


# ---------------------------------------------------------------- campaigns


class _CampaignBase:
    """The state of a campaign, shared by :class:`Campaign` and :class:`AsyncCampaign`.

    A campaign is the session's standing bid for leadership of a name: the
    agent grants it the name's exclusive lock (a term) whenever it is free,
    and contends again on its own when a term's lease ends, until the
    campaign is resigned or its scope ends.
    """

    def __init__(self, client, campaign_id, name, scope, ttl_ms, meta):
        self._client = client
        #: The campaign id, as the agent named it.
        self.id = campaign_id
        #: The name contended for.
        self.name = name
        #: ``connection`` or ``session``: of the campaign and of each term's lease.
        self.scope = scope or "connection"
        self._ttl_ms = ttl_ms
        self._meta = meta
        self._leader = None
        self._ended_reason = None
        self._callbacks = []
        self._mu = threading.Lock()

    def __repr__(self):
        state = ("ended: %s" % self._ended_reason if self._ended_reason else
                 "leader" if self.leader else "contending")
        return "<%s %s %s>" % (type(self).__name__, self.name, state)

    @property
    def leader(self):
        """The lease of the current term while this session leads, else None."""
        lease = self._leader
        return lease if lease is not None and lease.active else None

    @property
    def ended(self):
        """True once the campaign was resigned or its scope ended."""
        return self._ended_reason is not None

    @property
    def ended_reason(self):
        """Why the campaign ended (``resigned``, ``connection_lost``…), or None."""
        return self._ended_reason

    def add_elected_callback(self, fn):
        """Call ``fn(lease)`` each time the campaign wins a term, and at once
        for a current one. Runs on the client's reader, like lost callbacks."""
        with self._mu:
            self._callbacks.append(fn)
        lease = self.leader
        if lease is not None:
            _run_callback(fn, lease)

    def _elected(self, lease):
        with self._mu:
            self._leader = lease
            callbacks = list(self._callbacks)
        lease.add_lost_callback(lambda _: self._changed())
        self._changed()
        for fn in callbacks:
            _run_callback(fn, lease)

    def _end(self, reason):
        with self._mu:
            if self._ended_reason is not None:
                return
            self._ended_reason = reason
            self._callbacks = []
        self._changed()

    def _changed(self):
        raise NotImplementedError

    def _outcome(self):
        """The leader's lease, or CampaignEnded raised; None while contending."""
        lease = self.leader
        if lease is not None:
            return lease
        if self._ended_reason is not None:
            raise CampaignEnded(self)
        return None


class Campaign(_CampaignBase):
    """A campaign of a :class:`Client`. A context manager: leaving the
    ``with`` block resigns it."""

    def __init__(self, *args):
        super().__init__(*args)
        self._cond = threading.Condition()

    def _changed(self):
        with self._cond:
            self._cond.notify_all()

    def wait_elected(self, timeout=None):
        """Block until this session leads, up to ``timeout`` seconds.

        Returns the term's :class:`Lease` (at once while leading), or None
        on timeout. Raises :class:`CampaignEnded` if the campaign ended.
        """
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._cond:
            while True:
                lease = self._outcome()
                if lease is not None:
                    return lease
                remaining = None if deadline is None else deadline - time.monotonic()
                if remaining is not None and remaining <= 0:
                    return None
                self._cond.wait(remaining)

    def resign(self):
        """Stop contending, and release the leadership lease if held.

        Returns False if the campaign had already ended (in the agent too:
        it is marked ended then, and ``wait_elected`` raises CampaignEnded).
        """
        if self.ended:
            return False
        self._client._releasing(self.id)
        try:
            self._client._call("resign", {"campaign": self.id}, arg=self.id)
        except NotHeld:
            # Resigned meanwhile, by a call whose answer was lost: it has ended.
            self._client._resigned(self.id)
            return False
        return True

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        try:
            self.resign()
        except LockagentError:
            if exc[0] is None:
                raise
        return False


class AsyncCampaign(_CampaignBase):
    """A campaign of an :class:`AsyncClient`. An async context manager:
    leaving the ``async with`` block resigns it."""

    def __init__(self, *args):
        super().__init__(*args)
        self._event = asyncio.Event()

    def _changed(self):
        self._event.set()
        self._event = asyncio.Event()

    async def wait_elected(self, timeout=None):
        """Wait until this session leads, up to ``timeout`` seconds.

        Returns the term's :class:`AsyncLease`, or None on timeout. Raises
        :class:`CampaignEnded` if the campaign ended.
        """
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            lease = self._outcome()
            if lease is not None:
                return lease
            remaining = None if deadline is None else deadline - time.monotonic()
            if remaining is not None and remaining <= 0:
                return None
            try:
                await asyncio.wait_for(self._event.wait(), remaining)
            except asyncio.TimeoutError:
                pass

    async def resign(self):
        """Stop contending, and release the leadership lease if held.

        Returns False if the campaign had already ended (in the agent too:
        it is marked ended then, and ``wait_elected`` raises CampaignEnded).
        """
        if self.ended:
            return False
        self._client._releasing(self.id)
        try:
            await self._client._call("resign", {"campaign": self.id}, arg=self.id)
        except NotHeld:
            # Resigned meanwhile, by a call whose answer was lost: it has ended.
            self._client._resigned(self.id)
            return False
        return True

    async def __aenter__(self):
        return self

    async def __aexit__(self, *exc):
        try:
            await self.resign()
        except LockagentError:
            if exc[0] is None:
                raise
        return False


# ---------------------------------------------------------------- shared logic


class _Pending:
    """A request waiting for its answer."""

    __slots__ = ("key", "op", "arg", "meta", "waits", "response", "lease", "campaign",
                 "abandoned", "done")

    def __init__(self, key, op, arg=None, meta=None, waits=False):
        self.key = key
        self.op = op
        self.arg = arg  # the name of an acquire, the lease id of a release
        self.meta = meta
        self.waits = waits  # an acquire that waits: cancel it if abandoned
        self.response = None
        self.lease = None
        self.campaign = None  # the campaign started by a campaign request
        self.abandoned = False
        self.done = None  # a threading.Event or an asyncio.Future


# The ops whose answer the client takes in even when nobody waits for it.
_TAKEN_IN = frozenset(("acquire", "campaign", "release", "resign", "bye"))


class _Core:
    """What both clients share: the session, the leases, events and answers.

    The transport (a thread and a socket, or asyncio streams) is the
    subclass's. Every method here runs without blocking.
    """

    _lease_class = None
    _campaign_class = None

    def __init__(self, path, client, session_ttl, heartbeat, auto_heartbeat, reconnect,
                 timeout, on_event):
        self.path = socket_path(path)
        self.client_name = client
        self.session_ttl = session_ttl
        self.heartbeat = heartbeat
        self.auto_heartbeat = auto_heartbeat
        self.reconnect = reconnect
        self.timeout = timeout
        self.on_event = on_event
        #: The session id (changes when a new session replaces an expired one).
        self.session = None
        #: The secret that resumes the session.
        self.resume_token = None
        #: True if the current connection resumed the session.
        self.resumed = False
        #: The agent's description from ``hello``: version, backend, limits.
        self.agent = None
        self._hello = {"version": PROTOCOL_VERSION}
        if client:
            self._hello["client"] = client
        if session_ttl:
            self._hello["session_ttl_ms"] = _ms(session_ttl, "session_ttl")
        if heartbeat:
            self._hello["heartbeat_ms"] = _ms(heartbeat, "heartbeat")
        self._mu = threading.Lock()
        self._leases = {}
        self._campaigns = {}
        # The leases being released and the campaigns being resigned: their
        # ids, until the answer is read or a resume finds out what became of
        # them (the answer went down with the connection).
        self._ending = set()
        self._ids = itertools.count(1)
        self._closed = False
        self._close_called = False
        self._said_bye = False

    def _next_id(self):
        return str(next(self._ids))

    def _hello_args(self, resume):
        args = dict(self._hello)
        if resume:
            args["resume"] = {"session": self.session, "token": self.resume_token}
        return args

    def _resumable(self):
        return bool(self.session_ttl) and self.reconnect and self.session is not None

    def _detached(self):
        """True if the session outlives its connection, which ended without
        an answered ``bye``: the agent keeps it, and its leases, for
        ``session_ttl``."""
        return bool(self.session_ttl) and self.session is not None and not self._said_bye

    def _end_lines(self):
        """The requests that end a detached session: resume it, then ``bye``.
        Should the session be gone, the ``bye`` ends the new one."""
        return (_encode(dict(self._hello_args(True), id="end-hello", op="hello"))
                + _encode({"id": "end-bye", "op": "bye"}))

    def _apply_hello(self, result):
        self.session = result.get("session")
        self.resume_token = result.get("resume_token")
        self.resumed = bool(result.get("resumed"))
        self.agent = result.get("agent")

    def _campaign_args(self, name, scope, ttl, meta):
        args = {"name": name}
        if scope is not None:
            args["scope"] = scope
        if ttl is not None:
            args["ttl_ms"] = _ms(ttl, "ttl")
        if meta:
            args["meta"] = meta
        return args

    def _acquire_args(self, name, wait, shared, limit, scope, ttl, meta):
        args = {"name": name, "wait_ms": _wait_ms(wait)}
        if shared:
            args["mode"] = "shared"
        if limit is not None:
            args["limit"] = limit
        if scope is not None:
            args["scope"] = scope
        if ttl is not None:
            args["ttl_ms"] = _ms(ttl, "ttl")
        if meta:
            args["meta"] = meta
        return args

    def _line(self, msg):
        """``msg`` as a request line; too long for the agent: LineTooLong, unsent;
        not JSON (NaN, infinity, a lone surrogate): InvalidArgument, unsent."""
        try:
            data = _encode(msg)
        except ValueError as e:  # UnicodeEncodeError is one
            raise InvalidArgument("invalid_argument", "the %s request cannot be sent as JSON: %s"
                                  % (msg.get("op"), e)) from e
        limit = (self.agent or {}).get("max_line_bytes")
        if limit and len(data) - 1 > limit:
            raise LineTooLong("line_too_long", "the %s request is %d bytes; the agent reads at "
                              "most %d" % (msg.get("op"), len(data) - 1, limit))
        return data

    def _call_timeout(self, op, args):
        """The client's own bound on waiting for an answer; None: no bound."""
        if self.timeout is None:
            return None
        wait_ms = args.get("wait_ms", 0) if op == "acquire" else 0
        if wait_ms < 0:
            return None
        return self.timeout + wait_ms / 1000.0

    def _error(self, msg):
        err = msg.get("error") or {}
        code = err.get("code", "internal")
        exc = _ERRORS.get(code, ProtocolError)(code, err.get("message", ""), err)
        if isinstance(exc, AlreadyHeld):
            lease_id = (err.get("lease") or {}).get("lease")
            with self._mu:
                exc.lease = self._leases.get(lease_id)
        return exc

    def _close_cause(self, msg):
        """The error of an answer to no request (``"id": null``), else None.

        Kept as the connection's ``cause`` while it is the last line read:
        the agent says why it refuses a connection (``limit_exceeded``) or
        closes one (``line_too_long``) with such an answer, then closes it.
        """
        if "id" in msg and msg["id"] is None and not msg.get("ok"):
            return self._error(msg)
        return None

    def _open_failed(self, conn, e):
        """The error to raise for a connection that ended as it opened, with
        ``e``: the agent's reason if it gave one, else a public ``e``."""
        if conn.cause is not None:
            return conn.cause
        if isinstance(e, _NotSent):
            err = AgentConnectionError(str(e))
            err.__cause__ = e.__cause__
            return err
        return e

    def _on_response(self, pending, msg):
        """Take an answer in. Returns a request to send (a release) or None.

        Runs on the reader, so that a lease is known before any event about
        it is read.
        """
        ok = bool(msg.get("ok"))
        granted = pending.op == "acquire" and ok and msg.get("acquired")
        started = pending.op == "campaign" and ok and msg.get("campaign")
        if pending.op in ("release", "resign"):
            with self._mu:
                self._ending.discard(pending.arg)
        if pending.abandoned:
            # Nobody waits for this grant any more: give it back. A
            # release, resign or bye given up on was carried out all the
            # same, and is taken in below.
            if granted:
                return {"op": "release", "lease": msg["lease"]}
            if started:
                return {"op": "resign", "campaign": msg["campaign"]}
        if started:
            args = pending.arg
            campaign = self._campaign_class(self, msg["campaign"], args["name"],
                                            args.get("scope"), args.get("ttl_ms"),
                                            args.get("meta"))
            with self._mu:
                self._campaigns[campaign.id] = campaign
            pending.campaign = campaign
        elif pending.op == "resign" and ok:
            self._resigned(pending.arg)
        elif granted:
            lease = self._lease_class(self, msg, pending.meta)
            with self._mu:
                self._leases[lease.id] = lease
            pending.lease = lease
        elif pending.op == "release" and ok:
            self._end_leases(lambda lease: lease.id == pending.arg, None)
        elif pending.op == "bye" and ok:
            self._said_bye = True
            self._end_leases(lambda lease: True, None)
            self._end_campaigns(lambda campaign: True, RESIGNED)
        return None

    def _abandoned(self, conn, pending):
        """A request to send for a request whose caller gave up, or None.

        Marks an unanswered request abandoned (its grant, if one comes, is
        released on arrival) and cancels it if it waits; forgets one whose
        answer would change nothing; gives back a lease granted to a caller
        that stopped waiting just as it came.
        """
        if pending.response is None:
            pending.abandoned = True
            if pending.op not in _TAKEN_IN:
                conn.pending.pop(pending.key, None)
            return {"op": "cancel", "target": pending.key} if pending.waits else None
        if pending.lease is not None:
            return {"op": "release", "lease": pending.lease.id}
        if pending.campaign is not None:
            return {"op": "resign", "campaign": pending.campaign.id}
        return None

    def _result(self, pending):
        """The outcome of an answered request: a result, or an exception raised."""
        msg = pending.response
        if not msg.get("ok"):
            raise self._error(msg)
        if pending.op == "acquire":
            if pending.lease is not None:
                return pending.lease
            raise NotAcquired(pending.arg, msg.get("reason"), _holders(msg.get("holders")))
        if pending.campaign is not None:
            return pending.campaign
        return msg

    def _on_event(self, msg):
        kind = msg.get("event")
        if kind == "lost":
            with self._mu:
                lease = self._leases.pop(msg.get("lease"), None)
            if lease is not None:
                lease._end(msg.get("reason") or EXPIRED)
        elif kind == "elected":
            with self._mu:
                campaign = self._campaigns.get(msg.get("campaign"))
            if campaign is not None:
                fields = {"lease": msg.get("lease"), "name": msg.get("name"),
                          "mode": "exclusive", "scope": campaign.scope,
                          "token": msg.get("token"), "ttl_ms": campaign._ttl_ms}
                lease = self._lease_class(self, fields, campaign._meta)
                with self._mu:
                    self._leases[lease.id] = lease
                campaign._elected(lease)
        elif kind == "shutdown":
            self._end_leases(lambda lease: True, SHUTDOWN)
            self._end_campaigns(lambda campaign: True, SHUTDOWN)
        if self.on_event is not None:
            _run_callback(self.on_event, msg)

    def _end_leases(self, which, reason):
        """End the leases for which ``which(lease)`` is true."""
        with self._mu:
            ended = [lease for lease in self._leases.values() if which(lease)]
            for lease in ended:
                del self._leases[lease.id]
        for lease in ended:
            lease._end(reason)

    def _releasing(self, key):
        """A release of the lease, or resign of the campaign, ``key`` is about
        to be sent (see _ending)."""
        with self._mu:
            self._ending.add(key)

    def _resigned(self, campaign_id):
        """The campaign was resigned: it ends, and its term's lease is released."""
        with self._mu:
            campaign = self._campaigns.pop(campaign_id, None)
        if campaign is not None:
            lease = campaign.leader
            if lease is not None:
                self._end_leases(lambda known: known is lease, None)
            campaign._end(RESIGNED)

    def _end_campaigns(self, which, reason):
        """End the campaigns for which ``which(campaign)`` is true."""
        with self._mu:
            ended = [c for c in self._campaigns.values() if which(c)]
            for campaign in ended:
                del self._campaigns[campaign.id]
        for campaign in ended:
            campaign._end(reason)

    def _connection_ended(self):
        """The connection broke: its leases and campaigns are lost, and the
        session's too unless it will be resumed."""
        if self._resumable() and not self._closed:
            self._end_leases(lambda lease: lease.scope != "session", CONNECTION_LOST)
            self._end_campaigns(lambda campaign: campaign.scope != "session", CONNECTION_LOST)
        else:
            self._end_leases(lambda lease: True, CONNECTION_LOST)
            self._end_campaigns(lambda campaign: True, CONNECTION_LOST)

    def _session_leases(self):
        with self._mu:
            return [lease for lease in self._leases.values() if lease.scope == "session"]

    def _strays(self, listing):
        """What the resumed session has and the client does not know, started
        by a request whose answer went down with the connection: a list of
        requests that give it back (a campaign's resign ends its term too)."""
        with self._mu:
            known, campaigns = set(self._leases), set(self._campaigns)
        for session in listing.get("sessions") or []:
            if session.get("session") != self.session:
                continue
            give_back, terms = [], set()
            for c in session.get("campaigns") or []:
                terms.add(c.get("lease"))
                if c.get("campaign") not in campaigns:
                    give_back.append(("resign", {"campaign": c.get("campaign")}))
            for lease in session.get("leases") or []:
                if lease["lease"] not in known and lease["lease"] not in terms:
                    give_back.append(("release", {"lease": lease["lease"]}))
            return give_back
        return []

    def _forget(self, lease):
        """A resumed session no longer has ``lease``, and no event said why
        (it was sent to the connection that broke): it is lost, unless the
        client was releasing it, or resigning its campaign: then it was
        released, the answer lost with the connection."""
        with self._mu:
            released = lease.id in self._ending or any(
                c.id in self._ending and c._leader is lease for c in self._campaigns.values())
            self._ending.discard(lease.id)
        self._end_leases(lambda known: known is lease, None if released else EXPIRED)

    def _kept(self, lease):
        """A resumed session still has ``lease``: a release of it was not carried out."""
        with self._mu:
            self._ending.discard(lease.id)

    def _forget_campaigns(self, listing):
        """End the session campaigns the client knows and the resumed session
        (its ``list`` entry) no longer runs. Only a resign ends the campaign
        of a live session: the client's own, whose answer went down with the
        connection, or one sent by a connection that took the session over."""
        for session in listing.get("sessions") or []:
            if session.get("session") != self.session:
                continue
            running = {c.get("campaign") for c in session.get("campaigns") or []}
            with self._mu:
                known = list(self._campaigns.values())
            for campaign in known:
                if campaign.id not in running:
                    lease = campaign.leader
                    if lease is not None:  # its check could not tell: it is gone
                        self._forget(lease)
                    self._resigned(campaign.id)
            with self._mu:
                self._ending.difference_update(c.id for c in known)
            return

    def _resume_refused(self):
        with self._mu:
            self._ending.clear()
        self._end_leases(lambda lease: True, SESSION_EXPIRED)
        self._end_campaigns(lambda campaign: True, SESSION_EXPIRED)
        self.session = self.resume_token = None

    @property
    def leases(self):
        """The leases the client holds, as far as it knows."""
        with self._mu:
            return list(self._leases.values())

    @property
    def closed(self):
        """True once :meth:`close` was called, or the connection ended for good."""
        return self._closed


def _encode(msg):
    """``msg`` as a line; ValueError if it is not JSON (NaN, a lone surrogate)."""
    return (json.dumps(msg, ensure_ascii=False, allow_nan=False, separators=(",", ":"))
            .encode("utf-8") + b"\n")


def _decode(line):
    """A line from the agent as a dict, or None for a blank or unreadable line."""
    line = line.strip()
    if not line:
        return None
    try:
        msg = json.loads(line.decode("utf-8"))
    except ValueError:
        _log.warning("lockagent: unreadable line from the agent: %r", line[:200])
        return None
    return msg if isinstance(msg, dict) else None



# ---------------------------------------------------------------- blocking client

# Set on a client's reader threads: a request made there would wait for
# the thread itself.
_reader_thread = threading.local()


class _SyncConn:
    """One connection to the agent, read by its own thread."""

    def __init__(self, sock):
        self.sock = sock
        self.wmu = threading.Lock()
        self.pending = {}  # request id -> _Pending, guarded by the client's _answer_mu
        self.dead = False
        self.cause = None  # see _Core._close_cause
        self.reader = None

    def send(self, data):
        with self.wmu:
            self.sock.sendall(data)

    def kill(self):
        """Break the connection; its reader sees the end and cleans up."""
        try:
            self.sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass


class Client(_Core):
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

    _lease_class = Lease
    _campaign_class = Campaign

    def __init__(self, path=None, *, client="", session_ttl=0, heartbeat=None,
                 auto_heartbeat=True, reconnect=True, timeout=DEFAULT_TIMEOUT, on_event=None):
        super().__init__(path, client, session_ttl, heartbeat, auto_heartbeat, reconnect,
                         timeout, on_event)
        self._cond = threading.Condition(self._mu)
        self._answer_mu = threading.Lock()
        self._stop = threading.Event()
        self._threads = []
        self._conn = None
        self._close_done = threading.Event()  # set once the first close() has ended
        conn = self._open()
        with self._cond:
            if conn.dead:
                raise AgentConnectionError("the connection to the agent at %s ended as it opened"
                                           % self.path)
            self._conn = conn
        if heartbeat and auto_heartbeat:
            self._start_thread(self._beat, "lockagent-heartbeat")

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False

    @property
    def connected(self):
        """True while the client has a connection to the agent."""
        return self._conn is not None

    # -- ops

    def acquire(self, name, *, wait=0, shared=False, limit=None, scope=None, ttl=None,
                meta=None):
        """Acquire the lock ``name`` and return its :class:`Lease`.

        - ``wait``: 0 (default) tries once; N waits up to N seconds; None
          (or ``math.inf``) waits until granted.
        - ``shared``: a shared lock instead of an exclusive one; ``limit``
          caps the shared holders (a counting semaphore).
        - ``scope``: ``"connection"`` (default) or ``"session"``.
        - ``ttl``: the backend lease duration in seconds (the agent's default if None).
        - ``meta``: text shown to ``inspect`` and ``lockagent ctl list``.

        Raises :class:`NotAcquired` if the lock is held (a try) or the wait
        ran out, and :class:`AlreadyHeld` if this session holds it already.
        """
        args = self._acquire_args(name, wait, shared, limit, scope, ttl, meta)
        return self._call("acquire", args, arg=name, meta=meta)

    def lock(self, name, **kwargs):
        """Acquire ``name`` for a ``with`` block, which releases it at its end.

        Takes the arguments of :meth:`acquire`::

            with client.lock("orders/42", wait=5) as lease:
                ...
        """
        return self.acquire(name, **kwargs)

    def campaign(self, name, *, scope=None, ttl=None, meta=None):
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
        return self._call("campaign", args, arg=args)

    def inspect(self, name):
        """Who holds ``name``: a :class:`LockInfo`."""
        r = self._call("inspect", {"name": name})
        return LockInfo(bool(r.get("locked")), r.get("mode"), _holders(r.get("holders")),
                        r.get("last_token", 0), r.get("queued", 0))

    def list_sessions(self, all=False):
        """The sessions of this uid (every session with ``all``, for admins), as dicts."""
        return self._list(lambda args: self._call("list", args), all)["sessions"]

    @staticmethod
    def _list(call, all=False):
        """Every page of a list, as one answer."""
        args, sessions = {"limit": _LIST_PAGE}, []
        if all:
            args["all"] = True
        while True:
            page = call(args)
            sessions += page.get("sessions") or []
            if page.get("next") is None:
                return {"sessions": sessions}
            args["after"] = page["next"]

    def break_lock(self, name):
        """End every lease on ``name`` (admins only); returns how many ended."""
        return self._call("break", {"name": name}).get("broken", 0)

    def ping(self):
        """Ask the agent for a pong; keeps a heartbeat alive."""
        self._call("ping", {})

    def call(self, op, **args):
        """Send any op with ``args`` and return the agent's answer as a dict."""
        return self._call(op, args)

    def close(self):
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

    def _end_detached(self):
        """Ends the session if its connection broke before ``bye`` was
        answered (see _detached), so that its leases do not stay held."""
        if not self._detached():
            return
        try:
            with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
                sock.settimeout(self.timeout or _END_WAIT)
                sock.connect(self.path)
                sock.sendall(self._end_lines())
                while sock.recv(65536):  # the agent closes after bye
                    pass
        except OSError as e:
            _log.info("lockagent: ending the session at %s: %s", self.path, e)

    # -- transport

    def _start_thread(self, target, name, *args):
        t = threading.Thread(target=target, name=name, args=args, daemon=True)
        self._threads = [old for old in self._threads if old.is_alive()]
        self._threads.append(t)
        t.start()
        return t

    def _not_on_reader(self):
        if getattr(_reader_thread, "client", None) is self:
            raise RuntimeError("lockagent: a request from a callback would block the client's "
                               "reader; hand the work to another thread")

    def _open(self):
        """Connect and say hello, resuming the session if it can."""
        _check_private(self.path)
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
        conn.reader = self._start_thread(self._read, "lockagent-reader", conn)
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
            conn.reader.join(self.timeout or _END_WAIT)  # it reads the agent's reason, if any
            raise self._open_failed(conn, e)
        except BaseException:
            conn.kill()
            raise
        return conn

    def _read(self, conn):
        _reader_thread.client = self
        try:
            with conn.sock.makefile("rb") as f:
                for line in f:
                    msg = _decode(line)
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

    def _on_answer(self, conn, msg):
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

    def _on_conn_end(self, conn):
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

    def _reconnect(self):
        delay = 0.05
        while not self._stop.is_set():
            try:
                conn = self._open()
            except LockagentError as e:
                _log.info("lockagent: reconnecting to %s: %s", self.path, e)
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

    def _bye(self, conn):
        try:
            self._call_on(conn, "bye", {})
        except LockagentError:
            pass
        conn.kill()

    def _beat(self):
        while not self._stop.wait(self.heartbeat / 3.0):
            conn = self._conn
            if conn is not None:
                self._send_quiet(conn, {"op": "ping"})

    def _send_quiet(self, conn, msg):
        """Send a request whose answer nobody waits for."""
        try:
            conn.send(_encode(dict(msg, id=self._next_id())))
        except OSError:
            conn.kill()

    def _connection(self, broken=None):
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

    def _call(self, op, args, arg=None, meta=None):
        conn = self._connection()
        while True:
            try:
                return self._call_on(conn, op, args, arg, meta)
            except _NotSent as e:
                if not self.reconnect:
                    raise AgentConnectionError(str(e)) from e.__cause__
            # The connection broke before the request could reach the agent:
            # send it on the next one.
            conn = self._connection(broken=conn)

    def _call_on(self, conn, op, args, arg=None, meta=None):
        key = self._next_id()
        msg = {"id": key, "op": op}
        msg.update(args)
        data = self._line(msg)
        pending = _Pending(key, op, arg, meta, waits=op == "acquire" and args.get("wait_ms", 0) != 0)
        pending.done = threading.Event()
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
            if conn.reader is not threading.current_thread():
                conn.reader.join(_REASON_WAIT)
            conn.kill()
            raise _NotSent("sending %s to the agent: %s" % (op, e)) from e
        timeout = self._call_timeout(op, args)
        try:
            answered = pending.done.wait(timeout)
        except BaseException:  # KeyboardInterrupt: give up the request
            self._abandon(conn, pending)
            raise
        if not answered:
            self._abandon(conn, pending)
            raise AgentTimeout("the agent did not answer %s within %.1fs" % (op, timeout))
        if pending.response is None:
            raise AgentConnectionError("the connection to the agent ended before the answer "
                                       "to %s" % op) from conn.cause
        return self._result(pending)

    def _abandon(self, conn, pending):
        with self._answer_mu:
            send = self._abandoned(conn, pending)
        if send is not None:
            self._send_quiet(conn, send)


# ---------------------------------------------------------------- asyncio client


class _AsyncConn:
    """One connection to the agent, read by its own task."""

    def __init__(self, reader, writer):
        self.reader = reader
        self.writer = writer
        self.pending = {}  # request id -> _Pending
        self.dead = False
        self.cause = None  # see _Core._close_cause
        self.task = None
        self.drain_lock = asyncio.Lock()

    async def send(self, data):
        self.writer.write(data)
        async with self.drain_lock:
            await self.writer.drain()

    def kill(self):
        """Break the connection; its reader sees the end and cleans up."""
        self.writer.transport.abort()


class _AsyncLockContext:
    """What :meth:`AsyncClient.lock` returns: use with ``async with`` or ``await``."""

    def __init__(self, client, name, kwargs):
        self._client = client
        self._name = name
        self._kwargs = kwargs
        self._lease = None

    def __await__(self):
        return self._client.acquire(self._name, **self._kwargs).__await__()

    async def __aenter__(self):
        self._lease = await self._client.acquire(self._name, **self._kwargs)
        return self._lease

    async def __aexit__(self, *exc):
        return await self._lease.__aexit__(*exc)


# The outcome of an AsyncClient.open() that was cancelled (or interrupted).
_GAVE_UP = object()


class AsyncClient(_Core):
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

    _lease_class = AsyncLease
    _campaign_class = AsyncCampaign

    def __init__(self, path=None, *, client="", session_ttl=0, heartbeat=None,
                 auto_heartbeat=True, reconnect=True, timeout=DEFAULT_TIMEOUT, on_event=None):
        super().__init__(path, client, session_ttl, heartbeat, auto_heartbeat, reconnect,
                         timeout, on_event)
        self._conn = None
        self._opened = False
        # The outcome of the last open(), done once it has ended: None if it
        # connected, its exception if it failed, _GAVE_UP if it was cancelled.
        self._opening = None
        self._closing = None  # the task that closes the client, once close() is called
        self._tasks = []
        self._up = None  # set while connected, and once closed
        self._stop = None

    @classmethod
    async def connect(cls, path=None, **kwargs):
        """Create a client and connect it."""
        client = cls(path, **kwargs)
        await client.open()
        return client

    async def open(self):
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
                if outcome is _GAVE_UP:
                    continue  # cancelled: open it here (unless another waiter does)
                if outcome is not None:
                    raise outcome
                return
            if opening.result() is None:
                return  # open already
            break  # the last open() failed or was cancelled: try again
        self._opened = True
        if self._up is None:
            self._up = asyncio.Event()
            self._stop = asyncio.Event()
        opening = self._opening = asyncio.get_running_loop().create_future()
        outcome = _GAVE_UP
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
                self._tasks.append(asyncio.ensure_future(self._beat()))
            outcome = None
        except Exception as e:
            outcome = e
            raise
        finally:
            opening.set_result(outcome)

    async def __aenter__(self):
        await self.open()
        return self

    async def __aexit__(self, *exc):
        await self.close()
        return False

    @property
    def connected(self):
        """True while the client has a connection to the agent."""
        return self._conn is not None

    # -- ops

    async def acquire(self, name, *, wait=0, shared=False, limit=None, scope=None, ttl=None,
                      meta=None):
        """Acquire the lock ``name`` and return its :class:`AsyncLease`.

        The arguments and errors are those of :meth:`Client.acquire`.
        """
        args = self._acquire_args(name, wait, shared, limit, scope, ttl, meta)
        return await self._call("acquire", args, arg=name, meta=meta)

    def lock(self, name, **kwargs):
        """Acquire ``name`` for an ``async with`` block, which releases it at its end."""
        return _AsyncLockContext(self, name, kwargs)

    async def campaign(self, name, *, scope=None, ttl=None, meta=None):
        """Start contending for leadership of ``name``: an :class:`AsyncCampaign`.

        See :meth:`Client.campaign`.
        """
        args = self._campaign_args(name, scope, ttl, meta)
        return await self._call("campaign", args, arg=args)

    async def inspect(self, name):
        """Who holds ``name``: a :class:`LockInfo`."""
        r = await self._call("inspect", {"name": name})
        return LockInfo(bool(r.get("locked")), r.get("mode"), _holders(r.get("holders")),
                        r.get("last_token", 0), r.get("queued", 0))

    async def list_sessions(self, all=False):
        """The sessions of this uid (every session with ``all``, for admins), as dicts."""
        return (await self._list(lambda args: self._call("list", args), all))["sessions"]

    @staticmethod
    async def _list(call, all=False):
        """Every page of a list, as one answer."""
        args, sessions = {"limit": _LIST_PAGE}, []
        if all:
            args["all"] = True
        while True:
            page = await call(args)
            sessions += page.get("sessions") or []
            if page.get("next") is None:
                return {"sessions": sessions}
            args["after"] = page["next"]

    async def break_lock(self, name):
        """End every lease on ``name`` (admins only); returns how many ended."""
        return (await self._call("break", {"name": name})).get("broken", 0)

    async def ping(self):
        """Ask the agent for a pong; keeps a heartbeat alive."""
        await self._call("ping", {})

    async def call(self, op, **args):
        """Send any op with ``args`` and return the agent's answer as a dict."""
        return await self._call(op, args)

    async def close(self):
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

    async def _close(self):
        if not self._opened:
            return
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

    async def _end_detached(self):
        """Ends the session if its connection broke before ``bye`` was
        answered (see _detached), so that its leases do not stay held."""
        if not self._detached():
            return

        async def end():
            reader, writer = await asyncio.open_unix_connection(self.path)
            try:
                writer.write(self._end_lines())
                await writer.drain()
                while await reader.read(65536):  # the agent closes after bye
                    pass
            finally:
                writer.close()

        try:
            await asyncio.wait_for(end(), self.timeout or _END_WAIT)
        except (OSError, asyncio.TimeoutError) as e:
            _log.info("lockagent: ending the session at %s: %s", self.path, e)

    # -- transport

    async def _connect(self):
        """A new connection to the agent's socket: its reader and writer."""
        _check_private(self.path)
        try:
            return await asyncio.wait_for(asyncio.open_unix_connection(self.path), self.timeout)
        except (OSError, asyncio.TimeoutError) as e:
            raise AgentConnectionError("cannot connect to the agent at %s: %s"
                                       % (self.path, e)) from e

    async def _open(self):
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
            await asyncio.wait([conn.task], timeout=self.timeout or _END_WAIT)  # the reason, if any
            raise self._open_failed(conn, e)
        except BaseException:
            conn.kill()
            raise
        return conn

    async def _read(self, conn):
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
                    msg = _decode(bytes(buf[:end]))
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

    def _on_answer(self, conn, msg):
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

    async def _on_conn_end(self, conn):
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

    async def _reconnect(self):
        delay = 0.05
        while not self._stop.is_set():
            try:
                conn = await self._open()
            except LockagentError as e:
                _log.info("lockagent: reconnecting to %s: %s", self.path, e)
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

    async def _bye(self, conn):
        try:
            await self._call_on(conn, "bye", {})
        except LockagentError:
            pass
        conn.kill()

    async def _beat(self):
        while True:
            try:
                await asyncio.wait_for(self._stop.wait(), self.heartbeat / 3.0)
                return
            except asyncio.TimeoutError:
                pass
            if self._conn is not None:
                self._send_quiet(self._conn, {"op": "ping"})

    def _send_quiet(self, conn, msg):
        """Send a request whose answer nobody waits for."""
        msg = dict(msg, id=self._next_id())
        try:
            conn.writer.write(_encode(msg))
        except (OSError, RuntimeError):
            conn.kill()

    async def _connection(self, broken=None):
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

    async def _call(self, op, args, arg=None, meta=None):
        conn = await self._connection()
        while True:
            try:
                return await self._call_on(conn, op, args, arg, meta)
            except _NotSent as e:
                if not self.reconnect:
                    raise AgentConnectionError(str(e)) from e.__cause__
            # The connection broke before the request could reach the agent:
            # send it on the next one.
            conn = await self._connection(broken=conn)

    async def _call_on(self, conn, op, args, arg=None, meta=None):
        if conn.dead or conn.writer.transport.is_closing():
            raise _NotSent("the connection to the agent ended") from conn.cause
        key = self._next_id()
        msg = {"id": key, "op": op}
        msg.update(args)
        data = self._line(msg)
        pending = _Pending(key, op, arg, meta, waits=op == "acquire" and args.get("wait_ms", 0) != 0)
        pending.done = asyncio.get_running_loop().create_future()
        conn.pending[key] = pending
        timeout = self._call_timeout(op, args)
        try:
            await conn.send(data)
            await asyncio.wait_for(asyncio.shield(pending.done), timeout)
        except asyncio.TimeoutError:
            self._abandon(conn, pending)
            raise AgentTimeout("the agent did not answer %s within %.1fs" % (op, timeout)) from None
        except OSError as e:
            # The agent closed the connection, maybe saying why first: the
            # reader reads that to the end before it is killed.
            if conn.task is not asyncio.current_task():
                await asyncio.wait([conn.task], timeout=_REASON_WAIT)
            conn.kill()
            raise AgentConnectionError("sending %s to the agent: %s" % (op, e)) from e
        except BaseException:  # cancelled: give up the request
            self._abandon(conn, pending)
            raise
        if pending.response is None:
            raise AgentConnectionError("the connection to the agent ended before the answer "
                                       "to %s" % op) from conn.cause
        return self._result(pending)

    def _abandon(self, conn, pending):
        send = self._abandoned(conn, pending)
        if send is not None and not conn.dead:
            self._send_quiet(conn, send)
