"""Leases and campaigns, of both clients, and the results that describe them."""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from typing import (TYPE_CHECKING, Any, Callable, Generic, NamedTuple, Optional, TypeVar,
                    Union, cast)

from ._errors import CampaignEnded, LeaseLost, LockagentError, NotHeld

if TYPE_CHECKING:
    from types import TracebackType

    from ._asyncio import AsyncClient
    from ._sync import Client

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


class Holder(NamedTuple):
    """A live lease on a name, as a denied acquire or :meth:`Client.inspect` reports it."""

    mode: str
    token: int
    meta: str
    host: str
    expires_in_ms: int


class LockInfo(NamedTuple):
    """What :meth:`Client.inspect` reports about a name."""

    locked: bool
    mode: Optional[str]
    holders: list[Holder]
    last_token: int
    queued: int


class CheckResult(NamedTuple):
    """What :meth:`Lease.check` reports: confirmed with the backend at the time of the call."""

    held: bool
    token: int
    expires_in_ms: int


def holders(raw: Optional[list[dict[str, Any]]]) -> list[Holder]:
    """The ``holders`` of an answer."""
    return [Holder(h.get("mode", ""), h.get("token", 0), h.get("meta", ""), h.get("host", ""),
                   h.get("expires_in_ms", 0)) for h in raw or ()]


def run_callback(fn: Callable[..., object], *args: Any) -> None:
    """Call an application's callback; its bug must not stop the client's reader."""
    try:
        fn(*args)
    except Exception:
        _log.exception("lockagent: callback %r failed", fn)


_Self = TypeVar("_Self", bound="_LeaseBase")


class _LeaseBase:
    """The state of a lease, shared by :class:`Lease` and :class:`AsyncLease`."""

    def __init__(self, fields: dict[str, Any], meta: Optional[str]) -> None:
        #: The lease id: names the lease in release, check and lost events.
        self.id: str = fields["lease"]
        #: The lock's name.
        self.name: str = fields.get("name", "")
        #: ``exclusive`` or ``shared``.
        self.mode: str = fields.get("mode", "exclusive")
        #: ``connection`` or ``session``.
        self.scope: str = fields.get("scope", "connection")
        #: The fencing token: larger for every later grant of the name.
        self.token: int = fields.get("token", 0)
        #: The backend lease duration, in milliseconds (the agent renews it).
        self.ttl_ms: Optional[int] = fields.get("ttl_ms")
        #: The ``meta`` given to the acquire.
        self.meta = meta or ""
        self._ended = False
        self._lost_reason: Optional[str] = None
        self._callbacks: list[Callable[[Any], object]] = []
        self._mu = threading.Lock()

    def __repr__(self) -> str:
        state = "lost: %s" % self._lost_reason if self._lost_reason else (
            "ended" if self._ended else "held")
        return "<%s %s %s token=%s %s, %s>" % (type(self).__name__, self.name, self.mode,
                                               self.token, self.scope, state)

    @property
    def lost(self) -> bool:
        """True once the lease is lost. Stop using what it protects."""
        return self._lost_reason is not None

    @property
    def lost_reason(self) -> Optional[str]:
        """Why the lease was lost (``expired``, ``broken``, ``connection_lost``…), or None."""
        return self._lost_reason

    @property
    def active(self) -> bool:
        """True while the lease is neither released nor lost, as far as the client knows."""
        return not self._ended

    def raise_if_lost(self) -> None:
        """Raise :class:`LeaseLost` if the lease was lost."""
        if self._lost_reason is not None:
            raise LeaseLost(cast("Union[Lease, AsyncLease]", self))

    def add_lost_callback(self: _Self, fn: Callable[[_Self], object]) -> None:
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
            run_callback(fn, self)

    def _end(self, lost_reason: Optional[str]) -> None:
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
                run_callback(fn, self)

    def _signal(self) -> None:
        raise NotImplementedError

    def _check_result(self, result: dict[str, Any]) -> CheckResult:
        return CheckResult(bool(result.get("held")), result.get("token", self.token),
                           result.get("expires_in_ms", 0))


class Lease(_LeaseBase):
    """A granted lock, held through a :class:`Client`.

    A context manager: leaving the ``with`` block releases it.
    """

    def __init__(self, client: Client, fields: dict[str, Any], meta: Optional[str]) -> None:
        super().__init__(fields, meta)
        self._client = client
        self._lost_event = threading.Event()

    def _signal(self) -> None:
        self._lost_event.set()

    def wait_lost(self, timeout: Optional[float] = None) -> bool:
        """Block until the lease is lost or released, up to ``timeout`` seconds.

        Returns True if the lease was lost.
        """
        self._lost_event.wait(timeout)
        return self.lost

    def release(self) -> bool:
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

    def check(self) -> CheckResult:
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

    def __enter__(self) -> Lease:
        return self

    def __exit__(self, exc_type: Optional[type[BaseException]],
                 exc: Optional[BaseException], tb: Optional[TracebackType]) -> None:
        try:
            self.release()
        except LockagentError:
            if exc_type is None:
                raise


class AsyncLease(_LeaseBase):
    """A granted lock, held through an :class:`AsyncClient`.

    An async context manager: leaving the ``async with`` block releases it.
    """

    def __init__(self, client: AsyncClient, fields: dict[str, Any],
                 meta: Optional[str]) -> None:
        super().__init__(fields, meta)
        self._client = client
        self._lost_event = asyncio.Event()

    def _signal(self) -> None:
        self._lost_event.set()

    async def wait_lost(self, timeout: Optional[float] = None) -> bool:
        """Wait until the lease is lost or released, up to ``timeout`` seconds.

        Returns True if the lease was lost.
        """
        try:
            await asyncio.wait_for(self._lost_event.wait(), timeout)
        except asyncio.TimeoutError:
            pass
        return self.lost

    async def release(self) -> bool:
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

    async def check(self) -> CheckResult:
        """Ask the agent to confirm with the backend that the lease is held."""
        if self._ended:
            return CheckResult(False, self.token, 0)
        try:
            result = await self._client._call("check", {"lease": self.id})
        except NotHeld:
            return CheckResult(False, self.token, 0)
        return self._check_result(result)

    async def __aenter__(self) -> AsyncLease:
        return self

    async def __aexit__(self, exc_type: Optional[type[BaseException]],
                        exc: Optional[BaseException], tb: Optional[TracebackType]) -> None:
        try:
            await self.release()
        except LockagentError:
            if exc_type is None:
                raise


_L = TypeVar("_L", bound=_LeaseBase)


class _CampaignBase(Generic[_L]):
    """The state of a campaign, shared by :class:`Campaign` and :class:`AsyncCampaign`.

    A campaign is the session's standing bid for leadership of a name: the
    agent grants it the name's exclusive lock (a term) whenever it is free,
    and contends again on its own when a term's lease ends, until the
    campaign is resigned or its scope ends.
    """

    def __init__(self, campaign_id: str, name: str, scope: Optional[str],
                 ttl_ms: Optional[int], meta: Optional[str]) -> None:
        #: The campaign id, as the agent named it.
        self.id = campaign_id
        #: The name contended for.
        self.name = name
        #: ``connection`` or ``session``: of the campaign and of each term's lease.
        self.scope = scope or "connection"
        self._ttl_ms = ttl_ms
        self._meta = meta
        self._leader: Optional[_L] = None
        self._ended_reason: Optional[str] = None
        self._callbacks: list[Callable[[_L], object]] = []
        self._mu = threading.Lock()

    def __repr__(self) -> str:
        state = ("ended: %s" % self._ended_reason if self._ended_reason else
                 "leader" if self.leader else "contending")
        return "<%s %s %s>" % (type(self).__name__, self.name, state)

    @property
    def leader(self) -> Optional[_L]:
        """The lease of the current term while this session leads, else None."""
        lease = self._leader
        return lease if lease is not None and lease.active else None

    @property
    def ended(self) -> bool:
        """True once the campaign was resigned or its scope ended."""
        return self._ended_reason is not None

    @property
    def ended_reason(self) -> Optional[str]:
        """Why the campaign ended (``resigned``, ``connection_lost``…), or None."""
        return self._ended_reason

    def add_elected_callback(self, fn: Callable[[_L], object]) -> None:
        """Call ``fn(lease)`` each time the campaign wins a term, and at once
        for a current one. Runs on the client's reader, like lost callbacks."""
        with self._mu:
            self._callbacks.append(fn)
        lease = self.leader
        if lease is not None:
            run_callback(fn, lease)

    def _elected(self, lease: _L) -> None:
        with self._mu:
            self._leader = lease
            callbacks = list(self._callbacks)
        lease.add_lost_callback(lambda _: self._changed())
        self._changed()
        for fn in callbacks:
            run_callback(fn, lease)

    def _end(self, reason: str) -> None:
        with self._mu:
            if self._ended_reason is not None:
                return
            self._ended_reason = reason
            self._callbacks = []
        self._changed()

    def _changed(self) -> None:
        raise NotImplementedError

    def _outcome(self) -> Optional[_L]:
        """The leader's lease, or CampaignEnded raised; None while contending."""
        lease = self.leader
        if lease is not None:
            return lease
        if self._ended_reason is not None:
            raise CampaignEnded(cast("Union[Campaign, AsyncCampaign]", self))
        return None


class Campaign(_CampaignBase[Lease]):
    """A campaign of a :class:`Client`. A context manager: leaving the
    ``with`` block resigns it."""

    def __init__(self, client: Client, campaign_id: str, name: str, scope: Optional[str],
                 ttl_ms: Optional[int], meta: Optional[str]) -> None:
        super().__init__(campaign_id, name, scope, ttl_ms, meta)
        self._client = client
        self._cond = threading.Condition()

    def _changed(self) -> None:
        with self._cond:
            self._cond.notify_all()

    def wait_elected(self, timeout: Optional[float] = None) -> Optional[Lease]:
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

    def resign(self) -> bool:
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

    def __enter__(self) -> Campaign:
        return self

    def __exit__(self, exc_type: Optional[type[BaseException]],
                 exc: Optional[BaseException], tb: Optional[TracebackType]) -> None:
        try:
            self.resign()
        except LockagentError:
            if exc_type is None:
                raise


class AsyncCampaign(_CampaignBase[AsyncLease]):
    """A campaign of an :class:`AsyncClient`. An async context manager:
    leaving the ``async with`` block resigns it."""

    def __init__(self, client: AsyncClient, campaign_id: str, name: str, scope: Optional[str],
                 ttl_ms: Optional[int], meta: Optional[str]) -> None:
        super().__init__(campaign_id, name, scope, ttl_ms, meta)
        self._client = client
        self._event = asyncio.Event()

    def _changed(self) -> None:
        self._event.set()
        self._event = asyncio.Event()

    async def wait_elected(self, timeout: Optional[float] = None) -> Optional[AsyncLease]:
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

    async def resign(self) -> bool:
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

    async def __aenter__(self) -> AsyncCampaign:
        return self

    async def __aexit__(self, exc_type: Optional[type[BaseException]],
                        exc: Optional[BaseException], tb: Optional[TracebackType]) -> None:
        try:
            await self.resign()
        except LockagentError:
            if exc_type is None:
                raise
