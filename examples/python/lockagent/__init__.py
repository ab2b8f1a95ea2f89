"""A client of lockagent, the per-host lock agent.

Python 3.9 or later, standard library only, typed (PEP 561). It speaks
the agent's wire protocol (newline-delimited JSON over a Unix socket, see
docs/protocol.md) and offers a blocking client, :class:`Client`, and an
asyncio one, :class:`AsyncClient`, with the same methods.

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


from ._asyncio import AsyncClient
from ._core import DEFAULT_TIMEOUT, PROTOCOL_VERSION
from ._errors import (AgentConnectionError, AgentTimeout, AlreadyHeld, BackendUnavailable,
                      BadRequest, CampaignEnded, Canceled, ForeignKey, InternalError,
                      InvalidArgument, InvalidName, LeaseLost, LimitExceeded, LineTooLong,
                      LockagentError, NotAcquired, NotHeld, PermissionDenied, ProtocolError,
                      SessionExpired, ShuttingDown, TokensExhausted, UnknownOp,
                      UpgradeFailed)
from ._leases import (BACKEND_UNAVAILABLE, BROKEN, CONNECTION_LOST, EXPIRED, RESIGNED,
                      SESSION_EXPIRED, SHUTDOWN, TAKEN_OVER, AsyncCampaign, AsyncLease, Campaign,
                      CheckResult, Holder, Lease, LockInfo)
from ._paths import default_socket_path, socket_path
from ._sync import Client

__all__ = [
    "AgentConnectionError",
    "AgentTimeout",
    "AlreadyHeld",
    "AsyncClient",
    "AsyncCampaign",
    "AsyncLease",
    "BACKEND_UNAVAILABLE",
    "BROKEN",
    "BackendUnavailable",
    "BadRequest",
    "CONNECTION_LOST",
    "Campaign",
    "CampaignEnded",
    "CheckResult",
    "Canceled",
    "Client",
    "DEFAULT_TIMEOUT",
    "EXPIRED",
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
    "PROTOCOL_VERSION",
    "PermissionDenied",
    "ProtocolError",
    "RESIGNED",
    "SESSION_EXPIRED",
    "SHUTDOWN",
    "SessionExpired",
    "ShuttingDown",
    "TAKEN_OVER",
    "TokensExhausted",
    "UnknownOp",
    "UpgradeFailed",
    "default_socket_path",
    "socket_path",
]

__version__ = "0.1.0"
