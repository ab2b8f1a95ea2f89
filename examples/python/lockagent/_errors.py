"""The errors the client raises: its own, and one for each of the protocol's codes."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Optional, Union

if TYPE_CHECKING:
    from ._leases import AsyncCampaign, AsyncLease, Campaign, Holder, Lease


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

    def __init__(self, name: str, reason: str, holders: list[Holder]) -> None:
        super().__init__("%s not acquired (%s)" % (name, reason))
        self.name = name
        self.reason = reason
        self.holders = holders


class LeaseLost(LockagentError):
    """Raised by :meth:`Lease.raise_if_lost` for a lease that was lost."""

    def __init__(self, lease: Union[Lease, AsyncLease]) -> None:
        super().__init__("lease %s on %s (token %d) was lost: %s"
                         % (lease.id, lease.name, lease.token, lease.lost_reason))
        self.lease = lease
        self.reason = lease.lost_reason


class CampaignEnded(LockagentError):
    """Raised by ``wait_elected`` for a campaign that has ended: ``reason`` is
    ``resigned``, ``connection_lost``, ``session_expired`` or ``shutdown``."""

    def __init__(self, campaign: Union[Campaign, AsyncCampaign]) -> None:
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

    def __init__(self, code: str, message: str, error: Optional[dict[str, Any]] = None) -> None:
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

    lease: Union[Lease, AsyncLease, None] = None


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


class UpgradeFailed(ProtocolError):
    """``upgrade_failed``: the agent's upgrade failed; it serves on as it was."""


class InternalError(ProtocolError):
    """``internal``: an unexpected error in the agent."""


#: The error class of each of the protocol's codes; an unknown code is a ProtocolError.
ERRORS: dict[str, type[ProtocolError]] = {
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
    "upgrade_failed": UpgradeFailed,
    "internal": InternalError,
}
