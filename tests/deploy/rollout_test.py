#!/usr/bin/python3
"""scripts/rollout.sh against three real `backplane serve` replicas on loopback.

Each replica has its own backend directory and the same admin token, and MNIST requests run
against all three throughout. In turn: a wrong token (nothing may change), a good new CpuRef
(every replica takes it), a canary that rejects the new file (the script stops there, the others
never load it, and everyone is unpinned on the restored file), and a canary that takes the file
but whose failure counter moves (the script rolls it back).

Then `--progressive` against three other replicas with "deploy_policy": "progressive", serving a
one-node Identity model on the fixture backend TestValid with requests to each throughout: a good
new build (every replica's rollout promotes it, canary first), a build whose outputs differ (the
canary's shadow comparison rolls it back; the others never load it), and a replica whose rollout
has no traffic (it times out and is aborted; the canary, promoted already, is rolled back).

usage: rollout_test.py BACKPLANE_EXECUTABLE SOURCE_DIR BUILD_BACKENDS_DIR
"""

import filecmp
import hashlib
import json
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


def backend(server, backend_id="CpuRef"):
    status, body = http("GET", f"{server.url}/v2/backends/{backend_id}")
    if status != 200:
        fail(f"GET /v2/backends/{backend_id} on {server.url}: {status} {body}")
    return body


def wait_for_generation(server, generation, timeout=10.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if backend(server)["active_generation"] == generation:
            return True
        time.sleep(0.05)
    return False


def run_rollout(new_file, servers, directories, token=TOKEN, soak=1, extra=(),
                backend_id="CpuRef", name=NAME):
    argv = [rollout, "--backend", backend_id, "--file", new_file, "--name", name,
            "--soak", str(soak), "--step-soak", "0", "--wait", "10", *extra]
    for directory in directories:
        argv += ["--publish-dir", directory]
    argv += [server.url for server in servers]
    env = dict(os.environ, BACKPLANE_ADMIN_TOKEN=token)
    result = subprocess.run(argv, capture_output=True, text=True, timeout=60, env=env)
    print(f"--- rollout.sh exited {result.returncode}:\n{result.stdout}{result.stderr}---")
    return result


class Traffic:
    """MNIST requests against every replica until stopped; counts what did not answer 200,
    a dropped or refused connection included (a thread that died on one would hide the rest)."""

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
                try:
                    status, body = http("POST", server.url + "/v2/models/mnist/infer",
                                        self.request)
                except Exception as error:  # no answer at all: OSError, a broken response
                    status, body = None, repr(error)
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

# ---- --progressive: each replica's own rollout controller judges the new build.
VALID = "Test_Valid_backend.so"
FIXTURES = os.path.join(os.path.dirname(build_backends), "tests", "fixtures", "lib")
# Decided within seconds at this traffic: 20 samples per phase and step. Latency verdicts are left
# to RolloutTest and the judge's tests: here the three servers share a loaded machine.
POLICY = {"shadow_fraction": 0.5, "min_samples": 20, "steps": [50, 100],
          "max_latency_regression": 1000}
IDENTITY_INPUT = [0.5, -1.0, 2.0, 8.25]
IDENTITY_REQUEST = {"inputs": [{"name": "x", "shape": [1, 4], "datatype": "FP32",
                                "data": IDENTITY_INPUT}]}


def identity_model():
    """The bytes of an ONNX model y = Identity(x), FP32 [1, 4] (IR 8, opset 13), in protobuf's
    wire format by hand: the deploy tests need no onnx package."""
    def varint(value):
        out = bytearray()
        while value > 0x7F:
            out.append(value & 0x7F | 0x80)
            value >>= 7
        return bytes(out + bytes([value]))

    def field(number, value):  # an integer (varint) or a length-delimited string or message
        if isinstance(value, int):
            return varint(number << 3) + varint(value)
        value = value.encode() if isinstance(value, str) else value
        return varint(number << 3 | 2) + varint(len(value)) + value

    def tensor(name):  # ValueInfoProto: name, TypeProto.tensor_type {FLOAT, shape [1, 4]}
        shape = field(1, field(1, 1)) + field(1, field(1, 4))
        return field(1, name) + field(2, field(1, field(1, 1) + field(2, shape)))

    node = field(1, "x") + field(2, "y") + field(4, "Identity")
    graph = field(1, node) + field(2, "identity") + field(11, tensor("x")) + field(12, tensor("y"))
    return field(1, 8) + field(8, field(1, "") + field(2, 13)) + field(7, graph)


def sha256_of(path):
    with open(path, "rb") as stream:
        return hashlib.sha256(stream.read()).hexdigest()


def rollout_of(server):
    status, body = http("GET", server.url + "/v2/backends/TestValid/rollout")
    if status != 200:
        fail(f"GET /v2/backends/TestValid/rollout on {server.url}: {status} {body}")
    return body


def generation_with(state, sha256):
    """The newest record of `state` (GET /v2/backends/ID) whose code has this digest, or None."""
    return next((g for g in state["generations"] if g["sha256"] == sha256), None)


def same_content(state, first, second):
    """Whether two generations of a GET /v2/backends/ID record hold the same build."""
    digests = {g["generation"]: g["sha256"] for g in state["generations"]}
    return first in digests and digests.get(first) == digests.get(second)


def runs(server, sha256):
    """Whether the replica serves that build, unpinned, with no rollout under way."""
    state = backend(server, "TestValid")
    active = next(g for g in state["generations"] if g["generation"] == state["active_generation"])
    return active["sha256"] == sha256 and not state["pinned"] and state["candidate_generation"] == 0


def wait_for_build(servers, sha256, timeout=30.0):
    """After a stop, each replica rolls the restored file out (the build it runs already) once it
    has seen enough traffic: wait until that is over everywhere."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if all(runs(server, sha256) for server in servers):
            return True
        time.sleep(0.1)
    return False


def said_before_stop(result, server, words):
    """Whether a line of the script's output before its STOP names `server` and has `words`."""
    return any(server.url in line and words in line
               for line in result.stdout.split("STOP")[0].splitlines())


class Requests:
    """Identity requests against one replica, one after another, until stopped. Keeps every
    answer but a 200 with the input as output: no client may see a failure, nor the outputs of a
    candidate that runs in shadow."""

    def __init__(self, server):
        self.server = server
        self.sent, self.wrong, self.paused = 0, [], False
        self.running = True
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self):
        while self.running:
            if self.paused:
                time.sleep(0.02)
                continue
            try:
                status, body = http("POST", self.server.url + "/v2/models/identity/infer",
                                    IDENTITY_REQUEST)
            except OSError as error:  # no answer at all
                status, body = None, str(error)
            self.sent += 1
            outputs = body.get("outputs") if isinstance(body, dict) else None
            if status != 200 or not outputs or outputs[0].get("data") != IDENTITY_INPUT:
                self.wrong.append((status, body))
            time.sleep(0.005)

    def stop(self):
        self.running = False
        self.thread.join()


with tempfile.TemporaryDirectory() as work:
    os.chmod(work, 0o755)
    original = os.path.realpath(os.path.join(FIXTURES, VALID))
    if not os.path.isfile(original):
        fail(f"no {VALID} in {FIXTURES}: build the test fixtures (target backplane_fixtures)")
    # TestValid's other builds: the same outputs (a good fix), and outputs 1000 higher.
    good = os.path.realpath(os.path.join(FIXTURES, "Test_ValidGoodFix_backend.so"))
    diverging = os.path.realpath(os.path.join(FIXTURES, "Test_ValidNext_backend.so"))
    models = os.path.join(work, "models")
    os.makedirs(os.path.join(models, "identity", "1"))
    with open(os.path.join(models, "identity", "1", "model.onnx"), "wb") as stream:
        stream.write(identity_model())
    with open(os.path.join(models, "identity", "config.json"), "w") as stream:
        json.dump({"backends": ["TestValid"]}, stream)
    config = os.path.join(work, "serve.json")
    with open(config, "w") as stream:
        json.dump({"deploy_policy": "progressive", "rollout": POLICY}, stream)

    directories, servers = [], []
    for replica in range(3):
        directory = os.path.join(work, f"replica{replica}", "backends")
        copy_backends(FIXTURES, directory, prefix=VALID)
        directories.append(directory)
        servers.append(Server([backplane, "serve", "--config", config, "--listen", "127.0.0.1:0",
                               "--grpc-listen", "off", "--models", models,
                               "--backends", directory, "--admin-token", TOKEN],
                              os.path.join(work, f"progressive{replica}.log")))
    canary, others = servers[0], servers[1:]
    loads = [Requests(server) for server in servers]
    progressive = ["--progressive", "--rollout-timeout", "30"]
    try:
        check(all(runs(s, sha256_of(original)) for s in servers),
              "three progressive replicas serve TestValid's first build")

        # ---- A good build: each replica's rollout promotes it, the canary's before the others.
        result = run_rollout(good, servers, directories, backend_id="TestValid", name=VALID,
                             extra=progressive)
        check(result.returncode == 0, "--progressive, a good new build: exit 0")
        rollouts = [rollout_of(s) for s in servers]
        states = [backend(s, "TestValid") for s in servers]
        check(all(r["phase"] == "promoted" and r["decided_by"] == "policy" and
                  r["promoted_generation"] == b["active_generation"] != r["stable_generation"]
                  and same_content(b, r["candidate_generation"], b["active_generation"])
                  for r, b in zip(rollouts, states)),
              "every replica's rollout promoted its candidate by the numbers: its build is active")
        check([(h["phase"], h["weight_percent"]) for h in rollouts[0]["history"]] ==
              [("shadow", 0), ("canary", 50), ("canary", 100), ("promoted", 100)],
              "the canary's went through shadow, canary at 50 % and 100 %, promoted")
        order = [result.stdout.find(f"{s.url}: generation {r['candidate_generation']} {what}")
                 for s, r in zip(servers, rollouts) for what in ("is a candidate", "promoted")]
        check(0 <= order[0] and order == sorted(order),
              "the canary promoted it before the next replica was given it, and so on")
        check(all(runs(s, sha256_of(good)) for s in servers),
              "every replica runs the new build, unpinned, no rollout under way")

        # ---- Outputs that differ: the canary's shadow comparison rolls it back; stop there.
        noticed = [o.log_text().count("is pinned to generation") for o in others]
        result = run_rollout(diverging, servers, directories, backend_id="TestValid", name=VALID,
                             extra=progressive)
        check(result.returncode == 1, "--progressive, a build whose outputs differ: exit 1")
        check(f"STOP: {canary.url} rolled generation" in result.stdout and
              "back (decided_by policy): shadow: " in result.stdout and
              "samples differ from the stable outputs" in result.stdout,
              "the canary's rollout rolled it back by its shadow comparison; the script stopped")
        rolled_back = generation_with(backend(canary, "TestValid"), sha256_of(diverging))
        check(rolled_back is not None and rolled_back["state"] == "rejected" and
              rolled_back["reason"].startswith("ROLLED_BACK: policy: shadow:"),
              f"the canary keeps the record: rejected, ROLLED_BACK by the policy ({rolled_back})")
        for other, before in zip(others, noticed):
            check(not said_before_stop(result, other, "candidate") and
                  generation_with(backend(other, "TestValid"), sha256_of(diverging)) is None,
                  f"{other.url} never loaded the diverging build")
            check(other.log_text().count("is pinned to generation") > before,
                  f"{other.url} noticed the file while pinned and left it alone")
        check(all(filecmp.cmp(os.path.join(d, VALID), good, shallow=False) for d in directories),
              "the previous file is back in every backend directory")
        check(wait_for_build(servers, sha256_of(good)),
              "every replica serves the previous build, unpinned, once the restored file's own "
              "rollout is over")

        # ---- A replica without traffic: its rollout times out and is aborted; the canary,
        # promoted already, is rolled back.
        loads[1].paused = True
        result = run_rollout(original, servers, directories, backend_id="TestValid", name=VALID,
                             extra=["--progressive", "--rollout-timeout", "8"])
        loads[1].paused = False
        check(result.returncode == 1 and
              f"STOP: {others[0].url}: the rollout of generation" in result.stdout and
              "did not end within 8 s (shadow at 0 %" in result.stdout,
              "a rollout that does not end within --rollout-timeout stops the rollout: exit 1")
        check(f"{others[0].url}: aborted the rollout of generation" in result.stdout,
              "that replica's rollout was aborted")
        aborted = generation_with(backend(others[0], "TestValid"), sha256_of(original))
        check(aborted is not None and aborted["state"] == "rejected" and
              aborted["reason"].startswith("ROLLED_BACK: operator: aborted"),
              f"its candidate is recorded as rolled back by the operator ({aborted})")
        check(said_before_stop(result, canary, "promoted") and
              f"{canary.url}: rolled back to the previous version" in result.stdout,
              "the canary had promoted the build, and was rolled back")
        check(not said_before_stop(result, others[1], "candidate"),
              f"{others[1].url} never got the build")
        check(wait_for_build(servers, sha256_of(good)),
              "every replica serves the previous build again, unpinned, nothing under way")
    finally:
        for load in loads:
            load.stop()
        for server in servers:
            server.stop()
    check(all(load.sent > 100 for load in loads) and not any(load.wrong for load in loads),
          f"{[load.sent for load in loads]} Identity requests to the replicas, each answered 200 "
          f"with its input ({[load.wrong[:3] for load in loads if load.wrong]})")
print("PASS: rollout.sh stops at a bad canary and rolls back, by its own numbers or the servers'")
