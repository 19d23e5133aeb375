#!/usr/bin/python3
"""scripts/rollout.sh against three real `backplane serve` replicas on loopback.

Each replica has its own backend directory and the same admin token, and MNIST requests run
against all three throughout. In turn: a wrong token (nothing may change), a good new CpuRef
(every replica takes it), a canary that rejects the new file (the script stops there, the others
never load it, and everyone is unpinned on the restored file), and a canary that takes the file
but whose failure counter moves (the script rolls it back).

usage: rollout_test.py BACKPLANE_EXECUTABLE SOURCE_DIR BUILD_BACKENDS_DIR
"""

import filecmp
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from deploy_test_util import Server, check, copy_backends, fail, http  # noqa: E402

backplane, source, build_backends = (os.path.abspath(a) for a in sys.argv[1:4])
rollout = os.path.join(source, "scripts", "rollout.sh")
NAME = "Backplane_CpuRef_backend.so"
TOKEN = "rollout-test-token"


def backend(server):
    status, body = http("GET", server.url + "/v2/backends/CpuRef")
    if status != 200:
        fail(f"GET /v2/backends/CpuRef on {server.url}: {status} {body}")
    return body


def wait_for_generation(server, generation, timeout=10.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if backend(server)["active_generation"] == generation:
            return True
        time.sleep(0.05)
    return False


def run_rollout(new_file, servers, directories, token=TOKEN, soak=1, extra=()):
    argv = [rollout, "--backend", "CpuRef", "--file", new_file, "--name", NAME,
            "--soak", str(soak), "--step-soak", "0", "--wait", "10", *extra]
    for directory in directories:
        argv += ["--publish-dir", directory]
    argv += [server.url for server in servers]
    env = dict(os.environ, BACKPLANE_ADMIN_TOKEN=token)
    result = subprocess.run(argv, capture_output=True, text=True, timeout=60, env=env)
    print(f"--- rollout.sh exited {result.returncode}:\n{result.stdout}{result.stderr}---")
    return result


class Traffic:
    """MNIST requests against every replica until stopped; counts what did not answer 200."""

    def __init__(self, servers, request):
        self.servers, self.request = servers, request
        self.sent, self.failed, self.paused = 0, [], set()
        self.running = True
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self):
        while self.running:
            for server in self.servers:
                if server.url in self.paused:
                    continue
                status, body = http("POST", server.url + "/v2/models/mnist/infer", self.request)
                self.sent += 1
                if status != 200:
                    self.failed.append((server.url, status, body))
            time.sleep(0.1)

    def stop(self):
        self.running = False
        self.thread.join()


with tempfile.TemporaryDirectory() as work:
    os.chmod(work, 0o755)
    good = os.path.join(work, "new", NAME)
    os.makedirs(os.path.dirname(good))
    shutil.copy2(os.path.realpath(os.path.join(build_backends, NAME)), good)
    # A new version cut short: a complete ELF header whose sections lie past the end.
    truncated = os.path.join(work, "bad", NAME)
    os.makedirs(os.path.dirname(truncated))
    with open(good, "rb") as whole, open(truncated, "wb") as part:
        part.write(whole.read(os.path.getsize(good) // 2))
    os.chmod(truncated, 0o755)

    directories, servers = [], []
    for replica in range(3):
        directory = os.path.join(work, f"replica{replica}", "backends")
        # CpuRef only: generation numbers count every backend of a process (docs/operators.md),
        # and the checks below follow CpuRef's.
        copy_backends(build_backends, directory, prefix="Backplane_CpuRef_backend.so")
        directories.append(directory)
        servers.append(Server([backplane, "serve", "--listen", "127.0.0.1:0", "--grpc-listen", "off",
                               "--models", os.path.join(source, "models"),
                               "--backends", directory, "--admin-token", TOKEN],
                              os.path.join(work, f"replica{replica}.log")))
    canary, others = servers[0], servers[1:]
    with open(os.path.join(source, "models", "mnist", "example_request.json"), "rb") as stream:
        traffic = Traffic(servers, stream.read())
    try:
        check([backend(s)["active_generation"] for s in servers] == [1, 1, 1],
              "three replicas serve CpuRef generation 1")

        # ---- A wrong token: refused before anything is pinned or published.
        before = [os.stat(os.path.join(d, NAME)) for d in directories]
        result = run_rollout(good, servers, directories, token="wrong")
        check(result.returncode == 3 and "could not pin" in result.stderr,
              "a wrong admin token: exit 3, 'could not pin'")
        check([os.stat(os.path.join(d, NAME)) for d in directories] == before,
              "nothing was published")
        check(not any(backend(s)["pinned"] for s in servers), "no replica is left pinned")

        # ---- A good version: canary first, then the others; everyone on generation 2.
        result = run_rollout(good, servers, directories)
        check(result.returncode == 0, "a good new version rolls out: exit 0")
        check(result.stdout.find(f"{canary.url}: generation 2 active") <
              result.stdout.find(f"{others[0].url}: generation 2 active"),
              "the canary took it before the others")
        states = [backend(s) for s in servers]
        check([b["active_generation"] for b in states] == [2, 2, 2] and
              not any(b["pinned"] for b in states) and not any(b["rejected"] for b in states),
              "every replica runs generation 2, unpinned, nothing rejected")
        check(all(filecmp.cmp(os.path.join(d, NAME), good, shallow=False) for d in directories),
              "the new file is in every backend directory")

        # ---- A canary that rejects the new file: stop there, restore, unpin.
        result = run_rollout(truncated, servers, directories)
        check(result.returncode == 1, "a rejected canary stops the rollout: exit 1")
        check(f"STOP: {canary.url} rejected the new file" in result.stdout,
              "it stopped at the canary, which rejected the file")
        check(all(f"{o.url}: generation 3 active (was" not in result.stdout.split("STOP")[0]
                  for o in others),
              "no other replica was given the file before the stop")
        canary_state = backend(canary)
        check(len(canary_state["rejected"]) == 1 and
              canary_state["rejected"][0]["reason"] == "ELF_TRUNCATED",
              "the canary's rejected list has the file (ELF_TRUNCATED)")
        for other in others:
            state = backend(other)
            check(state["rejected"] == [] and not state["pinned"],
                  f"{other.url} never tried the bad file and is unpinned again")
            check("is pinned to generation 2" in other.log_text(),
                  f"{other.url} noticed a new file while pinned and left it alone")
        check(all(filecmp.cmp(os.path.join(d, NAME), good, shallow=False) for d in directories),
              "the previous file is back in every backend directory")
        # The restored file is a new file to each replica: the others load it as generation 3,
        # the canary as 4 (its rejected attempt used 3).
        check(wait_for_generation(canary, 4) and all(wait_for_generation(o, 3) for o in others),
              "every replica runs the restored file (canary 4, others 3), none the bad one")

        # ---- A canary that takes the file but whose failure counter moves: roll it back.
        outcome = {}

        def break_canary():
            # Once the canary runs the new generation, make it fail requests (503: the model is
            # unloaded), as a bad backend would, during its soak.
            if not wait_for_generation(canary, 5, timeout=20):
                outcome["error"] = "the canary never took generation 5"
                return
            traffic.paused.add(canary.url)
            time.sleep(0.3)  # the traffic's request to the canary in flight, if any, finishes
            status, _ = http("POST", canary.url + "/v2/repository/models/mnist/unload",
                             token=TOKEN)
            outcome["unload"] = status
            for _ in range(3):
                http("POST", canary.url + "/v2/models/mnist/infer", traffic.request)

        breaker = threading.Thread(target=break_canary)
        breaker.start()
        result = run_rollout(good, servers, directories, soak=5)  # room for slow (sanitizer) builds
        breaker.join()
        check(outcome.get("unload") == 200, f"the canary's model was unloaded ({outcome})")
        check(result.returncode == 1 and
              "server-side inference failures moved (+3, allowed 0)" in result.stdout,
              "failures on the canary stop the rollout: exit 1")
        check(f"{canary.url}: rolled back to the previous version" in result.stdout,
              "the canary is rolled back")
        check(all(f"{o.url}: generation 4 active" not in result.stdout for o in others) and
              [backend(o)["active_generation"] for o in others] == [4, 4],
              "no other replica took the new version; they load the restored file (4)")
        status, _ = http("POST", canary.url + "/v2/repository/models/mnist/load", token=TOKEN)
        traffic.paused.discard(canary.url)
        check(status == 200, "the canary's model loads again")
        canary_state = backend(canary)
        check(not canary_state["pinned"] and canary_state["active_generation"] >= 6,
              "the canary is unpinned, on the previous version (rollback, then the restored file)")
        check(not any(backend(o)["pinned"] for o in others), "the others are unpinned")

        # ---- Publishing by command, with no way to restore: the others must stay pinned.
        publish = " && ".join(
            f'install -m 0755 "$ROLLOUT_FILE" {d}/.incoming && '
            f'mv -f {d}/.incoming {d}/"$ROLLOUT_NAME"'
            for d in directories)
        result = run_rollout(truncated, servers, [], extra=["--publish-command", publish])
        check(result.returncode == 3 and "stay PINNED" in result.stdout,
              "a rejected canary without --restore-command: exit 3, the others stay pinned")
        check([backend(o)["pinned"] for o in others] == [True, True] and
              not backend(canary)["pinned"], "the others are pinned, the canary is not")
        for directory in directories:
            shutil.copy2(good, os.path.join(directory, ".restore"))
            os.rename(os.path.join(directory, ".restore"), os.path.join(directory, NAME))
        for other in others:
            status, answer = http("POST", other.url + "/v2/backends/CpuRef/unpin", token=TOKEN)
            check(status == 200 and answer["action"] == "activated",
                  f"{other.url}: unpinned by hand once the file is restored, it takes it")
    finally:
        traffic.stop()
        for server in servers:
            server.stop()
    check(traffic.sent > 0 and traffic.failed == [],
          f"{traffic.sent} MNIST requests during the rollouts, none failed "
          f"(except the canary's own, on purpose)")
print("PASS: rollout.sh stops at a bad canary and rolls back")
