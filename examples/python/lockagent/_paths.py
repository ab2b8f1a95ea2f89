"""Where the agent's socket is: found as the agent and ``lockagent ctl`` find it."""

from __future__ import annotations

import os
import stat
from typing import Mapping, Optional, Union

from ._errors import AgentConnectionError


def default_socket_path(euid: Optional[int] = None,
                        environ: Optional[Mapping[str, str]] = None) -> str:
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


def _private_dir(euid: Optional[int] = None, environ: Optional[Mapping[str, str]] = None) -> str:
    """The default socket's directory for a user without a runtime directory."""
    if euid is None:
        euid = os.geteuid()
    if environ is None:
        environ = os.environ
    tmp = environ.get("TMPDIR") or "/tmp"
    return os.path.normpath(os.path.join(tmp, "lockagent-%d" % euid))


def check_private(path: str) -> None:
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


def socket_path(path: Union[str, os.PathLike[str], None] = None,
                environ: Optional[Mapping[str, str]] = None) -> str:
    """Return ``path`` if given, else ``$LOCKAGENT_SOCKET``, else the default."""
    if path:
        return os.fspath(path)
    if environ is None:
        environ = os.environ
    return environ.get("LOCKAGENT_SOCKET") or default_socket_path(environ=environ)
