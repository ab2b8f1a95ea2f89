"""What both clients share: the session, the leases, events and answers.

The transports (a thread and a socket, or asyncio streams) are in
``_sync`` and ``_asyncio``.
"""

from __future__ import annotations

import itertools
import json
import logging
import math
import os
import threading
from typing import (TYPE_CHECKING, Any, Callable, Dict, Generic, Optional, Protocol, TypeVar,
                    Union, cast)

from ._errors import (ERRORS, AgentConnectionError, AlreadyHeld, InvalidArgument, LineTooLong,
                      LockagentError, NotAcquired, ProtocolError, _NotSent)
from ._leases import (CONNECTION_LOST, EXPIRED, RESIGNED, SESSION_EXPIRED, SHUTDOWN, _CampaignBase,
                      _LeaseBase, holders, run_callback)
from ._paths import socket_path

if TYPE_CHECKING:
    from ._leases import AsyncLease, Lease

#: The protocol version this client speaks.
PROTOCOL_VERSION = 1

#: Seconds the client waits for an answer, and for a connection, by default.
DEFAULT_TIMEOUT = 10.0

# Seconds close() gives ending a session whose connection broke, when the
# client has no timeout.
END_WAIT = 5.0

# How many sessions a list asks for at a time: each page is a small answer.
LIST_PAGE = 100

# Seconds a failed send waits for the reader to read the agent's reason
# for closing the connection (a limit reached), if it gave one.
REASON_WAIT = 1.0

log = logging.getLogger("lockagent")

#: A JSON object: a request, an answer or an event, with the protocol's names.
Message = Dict[str, Any]

#: What an application gives as the socket's path.
PathArg = Union[str, "os.PathLike[str]", None]


def ms(seconds: object, what: str) -> int:
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


def wait_ms(wait: Optional[float]) -> int:
    """``wait`` in seconds (None, -1 or math.inf: without a limit) as the protocol's
    ``wait_ms``."""
    if wait is None or wait == -1 or wait == math.inf:
        return -1
    return ms(wait, "wait")


def encode(msg: Message) -> bytes:
    """``msg`` as a line; ValueError if it is not JSON (NaN, a lone surrogate)."""
    return (json.dumps(msg, ensure_ascii=False, allow_nan=False, separators=(",", ":"))
            .encode("utf-8") + b"\n")


def decode(line: bytes) -> Optional[Message]:
    """A line from the agent as a dict, or None for a blank or unreadable line."""
    line = line.strip()
    if not line:
        return None
    try:
        msg = json.loads(line.decode("utf-8"))
    except ValueError:
        log.warning("lockagent: unreadable line from the agent: %r", line[:200])
        return None
    return msg if isinstance(msg, dict) else None


L = TypeVar("L", bound=_LeaseBase)
C = TypeVar("C", bound="_CampaignBase[Any]")


class Pending(Generic[L, C]):
    """A request waiting for its answer, of a client whose leases are ``L``
    and campaigns ``C``."""

    __slots__ = ("key", "op", "arg", "meta", "waits", "response", "lease", "campaign",
                 "abandoned")

    def __init__(self, key: str, op: str, arg: Any = None, meta: Optional[str] = None,
                 waits: bool = False) -> None:
        self.key = key
        self.op = op
        self.arg = arg  # the name of an acquire, the lease id of a release, a campaign's args
        self.meta = meta
        self.waits = waits  # an acquire that waits: cancel it if abandoned
        self.response: Optional[Message] = None
        self.lease: Optional[L] = None
        self.campaign: Optional[C] = None  # started by a campaign request
        self.abandoned = False


class Conn(Protocol):
    """What the shared logic needs of a transport's connection."""

    #: The requests sent on it and not answered yet, by id.
    pending: dict[str, Any]
    #: The agent's reason for ending it, if it gave one: see Core._close_cause.
    cause: Optional[LockagentError]


# The ops whose answer the client takes in even when nobody waits for it.
_TAKEN_IN = frozenset(("acquire", "campaign", "release", "resign", "bye"))

class Core(Generic[L, C]):
    """What both clients share: the session, the leases, events and answers.

    The transport (a thread and a socket, or asyncio streams) is the
    subclass's, and so are its leases and campaigns (``L``, ``C``). Every
    method here runs without blocking.
    """

    def __init__(self, path: PathArg, client: str, session_ttl: float,
                 heartbeat: Optional[float], auto_heartbeat: bool, reconnect: bool,
                 timeout: Optional[float], on_event: Optional[Callable[[Message], object]]
                 ) -> None:
        self.path = socket_path(path)
        self.client_name = client
        self.session_ttl = session_ttl
        self.heartbeat = heartbeat
        self.auto_heartbeat = auto_heartbeat
        self.reconnect = reconnect
        self.timeout = timeout
        self.on_event = on_event
        #: The session id (changes when a new session replaces an expired one).
        self.session: Optional[str] = None
        #: The secret that resumes the session.
        self.resume_token: Optional[str] = None
        #: True if the current connection resumed the session.
        self.resumed = False
        #: The agent's description from ``hello``: version, backend, limits.
        self.agent: Optional[Message] = None
        self._hello: Message = {"version": PROTOCOL_VERSION}
        if client:
            self._hello["client"] = client
        if session_ttl:
            self._hello["session_ttl_ms"] = ms(session_ttl, "session_ttl")
        if heartbeat:
            self._hello["heartbeat_ms"] = ms(heartbeat, "heartbeat")
        self._mu = threading.Lock()
        self._leases: dict[str, L] = {}
        self._campaigns: dict[str, C] = {}
        # The leases being released and the campaigns being resigned: their
        # ids, until the answer is read or a resume finds out what became of
        # them (the answer went down with the connection).
        self._ending: set[str] = set()
        self._ids = itertools.count(1)
        self._closed = False
        self._close_called = False
        self._said_bye = False

    def _new_lease(self, fields: Message, meta: Optional[str]) -> L:
        """A lease of this client's kind."""
        raise NotImplementedError

    def _new_campaign(self, campaign_id: str, name: str, scope: Optional[str],
                      ttl_ms: Optional[int], meta: Optional[str]) -> C:
        """A campaign of this client's kind."""
        raise NotImplementedError

    def _next_id(self) -> str:
        return str(next(self._ids))

    def _hello_args(self, resume: bool) -> Message:
        args = dict(self._hello)
        if resume:
            args["resume"] = {"session": self.session, "token": self.resume_token}
        return args

    def _resumable(self) -> bool:
        return bool(self.session_ttl) and self.reconnect and self.session is not None

    def _detached(self) -> bool:
        """True if the session outlives its connection, which ended without
        an answered ``bye``: the agent keeps it, and its leases, for
        ``session_ttl``."""
        return bool(self.session_ttl) and self.session is not None and not self._said_bye

    def _end_lines(self) -> bytes:
        """The requests that end a detached session: resume it, then ``bye``.
        Should the session be gone, the ``bye`` ends the new one."""
        return (encode(dict(self._hello_args(True), id="end-hello", op="hello"))
                + encode({"id": "end-bye", "op": "bye"}))

    def _apply_hello(self, result: Message) -> None:
        self.session = result.get("session")
        self.resume_token = result.get("resume_token")
        self.resumed = bool(result.get("resumed"))
        self.agent = result.get("agent")

    def _campaign_args(self, name: str, scope: Optional[str], ttl: Optional[float],
                       meta: Optional[str]) -> Message:
        args: Message = {"name": name}
        if scope is not None:
            args["scope"] = scope
        if ttl is not None:
            args["ttl_ms"] = ms(ttl, "ttl")
        if meta:
            args["meta"] = meta
        return args

    def _acquire_args(self, name: str, wait: Optional[float], shared: bool,
                      limit: Optional[int], scope: Optional[str], ttl: Optional[float],
                      meta: Optional[str]) -> Message:
        args: Message = {"name": name, "wait_ms": wait_ms(wait)}
        if shared:
            args["mode"] = "shared"
        if limit is not None:
            args["limit"] = limit
        if scope is not None:
            args["scope"] = scope
        if ttl is not None:
            args["ttl_ms"] = ms(ttl, "ttl")
        if meta:
            args["meta"] = meta
        return args

    def _line(self, msg: Message) -> bytes:
        """``msg`` as a request line; too long for the agent: LineTooLong, unsent;
        not JSON (NaN, infinity, a lone surrogate): InvalidArgument, unsent."""
        try:
            data = encode(msg)
        except ValueError as e:  # UnicodeEncodeError is one
            raise InvalidArgument("invalid_argument", "the %s request cannot be sent as JSON: %s"
                                  % (msg.get("op"), e)) from e
        limit = (self.agent or {}).get("max_line_bytes")
        if limit and len(data) - 1 > limit:
            raise LineTooLong("line_too_long", "the %s request is %d bytes; the agent reads at "
                              "most %d" % (msg.get("op"), len(data) - 1, limit))
        return data

    def _call_timeout(self, op: str, args: Message) -> Optional[float]:
        """The client's own bound on waiting for an answer; None: no bound."""
        if self.timeout is None:
            return None
        wait: float = args.get("wait_ms", 0) if op == "acquire" else 0
        if wait < 0:
            return None
        return self.timeout + wait / 1000.0

    def _error(self, msg: Message) -> ProtocolError:
        err: Message = msg.get("error") or {}
        code = err.get("code", "internal")
        exc = ERRORS.get(code, ProtocolError)(code, err.get("message", ""), err)
        if isinstance(exc, AlreadyHeld):
            held: Message = err.get("lease") or {}
            lease_id: str = held.get("lease", "")
            with self._mu:
                exc.lease = cast("Union[Lease, AsyncLease, None]", self._leases.get(lease_id))
        return exc

    def _close_cause(self, msg: Message) -> Optional[ProtocolError]:
        """The error of an answer to no request (``"id": null``), else None.

        Kept as the connection's ``cause`` while it is the last line read:
        the agent says why it refuses a connection (``limit_exceeded``) or
        closes one (``line_too_long``) with such an answer, then closes it.
        """
        if "id" in msg and msg["id"] is None and not msg.get("ok"):
            return self._error(msg)
        return None

    def _open_failed(self, conn: Conn, e: AgentConnectionError) -> LockagentError:
        """The error to raise for a connection that ended as it opened, with
        ``e``: the agent's reason if it gave one, else a public ``e``."""
        if conn.cause is not None:
            return conn.cause
        if isinstance(e, _NotSent):
            err = AgentConnectionError(str(e))
            err.__cause__ = e.__cause__
            return err
        return e

    def _on_response(self, pending: Pending[L, C], msg: Message) -> Optional[Message]:
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
            campaign = self._new_campaign(msg["campaign"], args["name"], args.get("scope"),
                                          args.get("ttl_ms"), args.get("meta"))
            with self._mu:
                self._campaigns[campaign.id] = campaign
            pending.campaign = campaign
        elif pending.op == "resign" and ok:
            self._resigned(pending.arg)
        elif granted:
            lease = self._new_lease(msg, pending.meta)
            with self._mu:
                self._leases[lease.id] = lease
            pending.lease = lease
        elif pending.op == "release" and ok:
            released: str = pending.arg
            self._end_leases(lambda lease: lease.id == released, None)
        elif pending.op == "bye" and ok:
            self._said_bye = True
            self._end_leases(lambda lease: True, None)
            self._end_campaigns(lambda campaign: True, RESIGNED)
        return None

    def _abandoned(self, conn: Conn, pending: Pending[L, C]) -> Optional[Message]:
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

    def _result(self, pending: Pending[L, C]) -> Message:
        """The answer to a request: raised as an error if it is one."""
        msg = pending.response
        if msg is None:
            raise AgentConnectionError("the connection to the agent ended before the answer "
                                       "to %s" % pending.op)
        if not msg.get("ok"):
            raise self._error(msg)
        return msg

    def _granted(self, pending: Pending[L, C]) -> L:
        """The lease an acquire was granted, or NotAcquired raised."""
        msg = self._result(pending)
        if pending.lease is None:
            raise NotAcquired(pending.arg, msg.get("reason", ""), holders(msg.get("holders")))
        return pending.lease

    def _started(self, pending: Pending[L, C]) -> C:
        """The campaign a campaign request started."""
        self._result(pending)
        if pending.campaign is None:
            raise ProtocolError("internal", "the agent started no campaign")
        return pending.campaign

    def _on_event(self, msg: Message) -> None:
        kind = msg.get("event")
        if kind == "lost":
            with self._mu:
                lease = self._leases.pop(msg.get("lease", ""), None)
            if lease is not None:
                lease._end(msg.get("reason") or EXPIRED)
        elif kind == "elected":
            with self._mu:
                campaign = self._campaigns.get(msg.get("campaign", ""))
            if campaign is not None:
                fields = {"lease": msg.get("lease"), "name": msg.get("name"),
                          "mode": "exclusive", "scope": campaign.scope,
                          "token": msg.get("token"), "ttl_ms": campaign._ttl_ms}
                term = self._new_lease(fields, campaign._meta)
                with self._mu:
                    self._leases[term.id] = term
                campaign._elected(term)
        elif kind == "shutdown":
            self._end_leases(lambda lease: True, SHUTDOWN)
            self._end_campaigns(lambda campaign: True, SHUTDOWN)
        if self.on_event is not None:
            run_callback(self.on_event, msg)

    def _end_leases(self, which: Callable[[L], bool], reason: Optional[str]) -> None:
        """End the leases for which ``which(lease)`` is true."""
        with self._mu:
            ended = [lease for lease in self._leases.values() if which(lease)]
            for lease in ended:
                del self._leases[lease.id]
        for lease in ended:
            lease._end(reason)

    def _releasing(self, key: str) -> None:
        """A release of the lease, or resign of the campaign, ``key`` is about
        to be sent (see _ending)."""
        with self._mu:
            self._ending.add(key)

    def _resigned(self, campaign_id: str) -> None:
        """The campaign was resigned: it ends, and its term's lease is released."""
        with self._mu:
            campaign = self._campaigns.pop(campaign_id, None)
        if campaign is not None:
            lease = campaign.leader
            if lease is not None:
                self._end_leases(lambda known: known is lease, None)
            campaign._end(RESIGNED)

    def _end_campaigns(self, which: Callable[[C], bool], reason: str) -> None:
        """End the campaigns for which ``which(campaign)`` is true."""
        with self._mu:
            ended = [c for c in self._campaigns.values() if which(c)]
            for campaign in ended:
                del self._campaigns[campaign.id]
        for campaign in ended:
            campaign._end(reason)

    def _connection_ended(self) -> None:
        """The connection broke: its leases and campaigns are lost, and the
        session's too unless it will be resumed."""
        if self._resumable() and not self._closed:
            self._end_leases(lambda lease: lease.scope != "session", CONNECTION_LOST)
            self._end_campaigns(lambda campaign: campaign.scope != "session", CONNECTION_LOST)
        else:
            self._end_leases(lambda lease: True, CONNECTION_LOST)
            self._end_campaigns(lambda campaign: True, CONNECTION_LOST)

    def _session_leases(self) -> list[L]:
        with self._mu:
            return [lease for lease in self._leases.values() if lease.scope == "session"]

    def _strays(self, listing: Message) -> list[tuple[str, Message]]:
        """What the resumed session has and the client does not know, started
        by a request whose answer went down with the connection: a list of
        requests that give it back (a campaign's resign ends its term too)."""
        with self._mu:
            known, campaigns = set(self._leases), set(self._campaigns)
        for session in listing.get("sessions") or []:
            if session.get("session") != self.session:
                continue
            give_back: list[tuple[str, Message]] = []
            terms = set()
            for c in session.get("campaigns") or []:
                terms.add(c.get("lease"))
                if c.get("campaign") not in campaigns:
                    give_back.append(("resign", {"campaign": c.get("campaign")}))
            for lease in session.get("leases") or []:
                if lease["lease"] not in known and lease["lease"] not in terms:
                    give_back.append(("release", {"lease": lease["lease"]}))
            return give_back
        return []

    def _forget(self, lease: L) -> None:
        """A resumed session no longer has ``lease``, and no event said why
        (it was sent to the connection that broke): it is lost, unless the
        client was releasing it, or resigning its campaign: then it was
        released, the answer lost with the connection."""
        with self._mu:
            released = lease.id in self._ending or any(
                c.id in self._ending and c._leader is lease for c in self._campaigns.values())
            self._ending.discard(lease.id)
        self._end_leases(lambda known: known is lease, None if released else EXPIRED)

    def _kept(self, lease: L) -> None:
        """A resumed session still has ``lease``: a release of it was not carried out."""
        with self._mu:
            self._ending.discard(lease.id)

    def _forget_campaigns(self, listing: Message) -> None:
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

    def _resume_refused(self) -> None:
        with self._mu:
            self._ending.clear()
        self._end_leases(lambda lease: True, SESSION_EXPIRED)
        self._end_campaigns(lambda campaign: True, SESSION_EXPIRED)
        self.session = self.resume_token = None

    @property
    def leases(self) -> list[L]:
        """The leases the client holds, as far as it knows."""
        with self._mu:
            return list(self._leases.values())

    @property
    def closed(self) -> bool:
        """True once :meth:`close` was called, or the connection ended for good."""
        return self._closed
