"""The README's code samples, each run as a file, as a reader saves it, on the
Python that runs the tests, against a real agent."""

import os
import re
import subprocess
import sys

import lockagent
from harness import REPO, AgentTestCase, clean_env


def python_samples(path):
    """The ```python blocks of the markdown file ``path``, in order."""
    with open(path, encoding="utf-8") as f:
        text = f.read()
    return re.findall(r"^```python\n(.*?)^```$", text, re.M | re.S)


class ReadmeTest(AgentTestCase):
    def test_every_sample_runs_as_a_file(self):
        samples = python_samples(os.path.join(REPO, "examples", "python", "README.md"))
        self.assertTrue(samples, "the README's python blocks")
        # The package under test: the one beside the tests, or the installed one.
        package_root = os.path.dirname(os.path.dirname(os.path.abspath(lockagent.__file__)))
        check = self.client()
        for i, sample in enumerate(samples):
            with self.subTest(sample=i):
                path = os.path.join(self.agent.dir, "sample%d.py" % i)
                with open(path, "w", encoding="utf-8") as f:
                    f.write(sample)
                out = subprocess.run([sys.executable, path], capture_output=True, text=True,
                                     timeout=30, cwd=self.agent.dir,
                                     env=clean_env(LOCKAGENT_SOCKET=self.agent.socket,
                                                   PYTHONPATH=package_root))
                self.assertEqual((out.returncode, out.stderr), (0, ""), out.stdout)
                # What it says it wrote under the lock carries the token the
                # agent granted last, and the lock is free again.
                written = re.fullmatch(r"order 42 written with fencing token (\d+)\n", out.stdout)
                self.assertIsNotNone(written, out.stdout)
                state = check.inspect("orders/42")
                self.assertEqual((state.locked, state.last_token), (False, int(written.group(1))))
