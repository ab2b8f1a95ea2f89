"""The harness itself: what the user has set up (an agent running,
LOCKAGENT_SOCKET exported as the README says, XDG_RUNTIME_DIR, systemd's
variables) never reaches the processes the tests start."""

import os
import shutil
import socket
import subprocess
import tempfile
import unittest
from unittest import mock

from harness import Agent, clean_env, lockagent_bin


class HostileEnvironmentTest(unittest.TestCase):
    def setUp(self):
        self.users = tempfile.mkdtemp(prefix="la-users", dir="/tmp")
        self.addCleanup(shutil.rmtree, self.users, True)
        # The user's agent: a socket that accepts connections, which an
        # agent takes for a live agent's, both where LOCKAGENT_SOCKET and
        # where XDG_RUNTIME_DIR lead. Nothing accepts: a connection made
        # stays queued for the check at the end.
        sock = os.path.join(self.users, "lockagent.sock")
        self.users_agent = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.addCleanup(self.users_agent.close)
        self.users_agent.bind(sock)
        self.users_agent.listen(8)
        env = mock.patch.dict(os.environ, {
            "LOCKAGENT_SOCKET": sock,
            "XDG_RUNTIME_DIR": self.users,
            "HOME": self.users,
            "XDG_STATE_HOME": self.users,
            "NOTIFY_SOCKET": os.path.join(self.users, "notify"),
            "INVOCATION_ID": "1f2e",
            "CREDENTIALS_DIRECTORY": self.users,
        })
        env.start()
        self.addCleanup(env.stop)

    def assert_users_agent_not_reached(self):
        self.users_agent.settimeout(0.05)
        with self.assertRaises(socket.timeout, msg="a connection to the user's agent"):
            self.users_agent.accept()[0].close()

    def test_an_agent_starts_on_the_socket_of_its_config(self):
        agent = Agent()
        self.addCleanup(agent.cleanup)
        status = agent.ctl("status")
        self.assertEqual(status.returncode, 0, status.stderr)
        agent.stop()
        self.assert_users_agent_not_reached()

    def test_a_client_command_given_no_socket_does_not_find_the_users_agent(self):
        r = subprocess.run([lockagent_bin(), "ctl", "status"], capture_output=True, text=True,
                           timeout=10, env=clean_env())
        self.assertEqual(r.returncode, 1, r.stderr)
        self.assertIn("cannot reach the agent", r.stderr)
        self.assertNotIn(self.users, r.stderr)
        self.assert_users_agent_not_reached()

    def test_clean_env_keeps_none_of_the_users_settings(self):
        env = clean_env(LOCKAGENT_SOCKET="/tmp/la-test.sock")
        self.assertEqual(env["LOCKAGENT_SOCKET"], "/tmp/la-test.sock")
        passed = [k for k in ("NOTIFY_SOCKET", "INVOCATION_ID", "XDG_STATE_HOME",
                              "CREDENTIALS_DIRECTORY") if k in env]
        self.assertEqual(passed, [], "passed on")
        self.assertEqual(env["XDG_RUNTIME_DIR"], env["HOME"])
        self.assertFalse(env["HOME"].startswith(self.users), env["HOME"])
        self.assertNotIn("LOCKAGENT_SOCKET", clean_env())


if __name__ == "__main__":
    unittest.main()
