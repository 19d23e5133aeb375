"""Helpers for the deployment tests: real `backplane serve` processes on loopback, HTTP calls.

Debian's /usr/bin/python3 runs these (python3-yaml); only the standard library besides yaml.
"""

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request

LISTENING = re.compile(r"listening on (http://\S+)")


def fail(message):
    print(f"FAIL: {message}", file=sys.stderr)
    sys.exit(1)


def check(condition, message):
    if not condition:
        fail(message)
    print(f"ok: {message}")


class Server:
    """One `backplane serve` process; its stderr goes to `log_path`."""

    def __init__(self, argv, log_path, env=None, cwd=None):
        self.argv = argv
        self.log_path = log_path
        self.log = open(log_path, "w")
        merged = dict(os.environ)
        merged.update(env or {})
        self.process = subprocess.Popen(argv, stdout=self.log, stderr=subprocess.STDOUT,
                                        env=merged, cwd=cwd)
        self.url = self._wait_for_listening()

    def _wait_for_listening(self, timeout=30.0):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with open(self.log_path) as log:
                found = LISTENING.search(log.read())
            if found:
                return found.group(1).replace("0.0.0.0", "127.0.0.1")
            if self.process.poll() is not None:
                fail(f"{' '.join(self.argv)} exited with {self.process.returncode} before "
                     f"listening:\n{self.log_text()}")
            time.sleep(0.05)
        self.kill()
        fail(f"{' '.join(self.argv)} did not log 'listening on' within {timeout} s:\n"
             f"{self.log_text()}")

    def log_text(self):
        with open(self.log_path) as log:
            return log.read()

    def stop(self, timeout=30.0):
        """SIGTERM, as Kubernetes sends it; returns (exit code, seconds to exit)."""
        if self.process.poll() is not None:
            return self.process.returncode, 0.0
        start = time.monotonic()
        self.process.send_signal(signal.SIGTERM)
        try:
            code = self.process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            fail(f"{self.argv[0]} did not exit within {timeout} s of SIGTERM")
        return code, time.monotonic() - start

    def kill(self):
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait()


def http(method, url, body=None, token=None, timeout=30):
    """(status, parsed JSON or text). Never raises for an HTTP error status."""
    data = None
    if body is not None:
        data = body if isinstance(body, bytes) else json.dumps(body).encode()
    request = urllib.request.Request(url, data=data, method=method)
    if token:
        request.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            status, text = response.status, response.read().decode()
    except urllib.error.HTTPError as error:
        status, text = error.code, error.read().decode()
    try:
        return status, json.loads(text)
    except ValueError:
        return status, text


def copy_backends(build_backends, target, prefix=""):
    """The build's backend files (those whose names start with `prefix`) into `target` (mode
    0755: the loader refuses a directory others can write), as the image's `cp -a` does."""
    os.makedirs(target, mode=0o755, exist_ok=True)
    os.chmod(target, 0o755)
    for name in os.listdir(build_backends):
        if not name.startswith(prefix):
            continue
        source = os.path.join(build_backends, name)
        destination = os.path.join(target, name)
        if os.path.islink(source):
            os.symlink(os.readlink(source), destination)
        else:
            shutil.copy2(source, destination)
