#!/usr/bin/python3
"""Records the input series of deploy/prometheus/alerts_test.yaml from real `backplane serve`
processes, around each event an alert rule is about, and writes them into the test file.

Two servers, each serving a one-node Identity model on the fixture backend TestValid with
requests throughout, scraped once a second; the test maps each scrape to one minute. Events
happen between scrapes, and the recording goes on only once /metrics shows them, so every event
falls on the same scrape at each recording and the test's expectations stay put:

  rollout ("deploy_policy": "progressive", step_max_duration_s 0, on_inconclusive "hold")
    scrape  0  baseline
    scrape  6  a build whose outputs differ, rolled back by the policy (shadow divergence)
    scrape 16  a build that crashes its worker as a candidate (rejected: CRASHED)
    scrape 26  requests stop; a good build becomes the candidate and waits in shadow (stuck)
    scrapes 66 in all

  deploys (immediate deploys, "swap_policy": "pin", a trusted list)
    scrape  0  baseline
    scrape  6  a file that is not ELF (but listed) published as TestValid's (rejected: NOT_ELF)
    scrape 12  a build not on the trusted list (rejected: UNTRUSTED)
    scrape 18  the trusted list rewritten with junk (it trusts nothing)
    scrape 26  the list restored; a build failing on negative inputs published: the model stays
               pinned to the old generation, which drains for as long as the model is loaded
    scrape 62  the model loaded again onto the failing build: half its requests fail (INTERNAL)
    scrape 74  a build taking 0.6 s per request, the model loaded again onto it
    scrape 92  the model unloaded (not ready)
    scrapes 100 in all

usage: record_alert_series.py BACKPLANE_EXECUTABLE SOURCE_DIR BUILD_BACKENDS_DIR [TEST_FILE]
  TEST_FILE defaults to SOURCE_DIR/deploy/prometheus/alerts_test.yaml; the lines between
  "# recorded: <scenario> begin" and "# recorded: <scenario> end" are replaced.
"""

import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from deploy_test_util import check, fail, http  # noqa: E402
from alert_test_util import (IDENTITY_REQUEST, NEGATIVE_REQUEST, digest_line,  # noqa: E402
                             fixture, publish, sample, start_identity_server, write_atomically)

backplane, source, build_backends = (os.path.abspath(a) for a in sys.argv[1:4])
test_file = (os.path.abspath(sys.argv[4]) if len(sys.argv) > 4
             else os.path.join(source, "deploy", "prometheus", "alerts_test.yaml"))
VALID = "Test_Valid_backend.so"

# The families the rules read; everything else in /metrics is left out of the test file.
RECORDED = re.compile(
    r"^(backplane_inference_requests_total|backplane_inference_failures_total"
    r"|backplane_inference_request_duration_seconds_bucket|backplane_inference_requests_in_flight"
    r"|backplane_model_ready|backplane_backend_rollbacks_total"
    r"|backplane_backend_rejected_loads_total|backplane_backend_leaked_generations_total"
    r"|backplane_backend_generations|backplane_rollout_phase|backplane_trust_list_unreadable)"
    r"(\{.*\})? (\S+)$")


def reload_model(server, what):
    """Unload and load the identity model: a load of an unchanged model keeps its networks (and
    the generation a pinned model runs on); requests in the gap fail as UNAVAILABLE."""
    for verb in ("unload", "load"):
        status, body = http("POST", server.url + f"/v2/repository/models/identity/{verb}")
        check(status == 200, f"{what}: {verb} the model: {status} {body}")


class Requests:
    """Requests to the identity model until stopped; `negative` sends every other one with a
    negative element (ValidBreaksSome fails those)."""

    def __init__(self, server):
        self.server, self.running, self.paused, self.sent = server, True, False, 0
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self):
        while self.running:
            if self.paused:
                time.sleep(0.02)
                continue
            body = NEGATIVE_REQUEST if self.sent % 2 else IDENTITY_REQUEST
            try:
                http("POST", self.server.url + "/v2/models/identity/infer", body, timeout=10)
            except Exception:  # a refused connection at the end; the recording says the rest
                pass
            self.sent += 1
            time.sleep(0.005)

    def stop(self):
        self.running = False
        self.thread.join()


class Recording:
    """Scrapes of one server: scrape() appends one; until() waits (unrecorded) for an event."""

    def __init__(self, server, labels):
        self.server, self.labels, self.scrapes, self.events = server, labels, [], []

    def metrics(self):
        status, text = http("GET", self.server.url + "/metrics")
        if status != 200:
            fail(f"GET /metrics on {self.server.url}: {status}")
        return text

    def scrape(self, count=1):
        for _ in range(count):
            series = {}
            for line in self.metrics().splitlines():
                found = RECORDED.match(line)
                if found:
                    series[found.group(1) + (found.group(2) or "{}")] = float(found.group(3))
            self.scrapes.append(series)
            time.sleep(1.0)

    def until(self, what, condition, timeout=60.0):
        self.events.append(f"scrape {len(self.scrapes)}: {what}")
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if condition(self.metrics()):
                print(f"ok: {self.events[-1]}")
                return
            time.sleep(0.1)
        fail(f"{what}: not seen in /metrics within {timeout} s:\n{self.server.log_text()}")

    def input_series(self, indent):
        """promtool input_series: one entry per series, '_' where a scrape lacked it, runs of
        one value written as 'VxN' (N+1 samples)."""
        names = sorted({name for scrape in self.scrapes for name in scrape})
        lines = []
        for name in names:
            values = [scrape.get(name) for scrape in self.scrapes]
            tokens, i = [], 0
            while i < len(values):
                j = i
                while j + 1 < len(values) and values[j + 1] == values[i]:
                    j += 1
                text = "_" if values[i] is None else format(values[i], "g")
                if j == i:
                    tokens.append(text)
                elif values[i] is None:
                    tokens.append(f"_x{j - i + 1}")
                else:
                    tokens.append(f"{text}x{j - i}")
                i = j + 1
            labels = name[name.index("{") + 1:-1]
            target = ",".join(f'{k}="{v}"' for k, v in self.labels.items())
            series = name[:name.index("{")] + "{" + (labels + "," if labels else "") + target + "}"
            lines.append(f"{indent}- series: '{series}'")
            lines.append(f"{indent}  values: '{' '.join(tokens)}'")
        return lines


def record_rollout(work):
    server, directory = start_identity_server(
        backplane, work, "rollout",
        '{"deploy_policy": "progressive", "watch_debounce_ms": 20, "rollout": {'
        '"shadow_fraction": 0.5, "min_samples": 20, "steps": [50, 100],'
        ' "max_latency_regression": 1000, "step_max_duration_s": 0, "on_inconclusive": "hold"}}')
    requests = Requests(server)
    recording = Recording(server, {"job": "backplane", "instance": "rollout:8000"})
    rollbacks = 'backplane_backend_rollbacks_total{backend="TestValid",by="policy"}'
    try:
        recording.scrape(6)
        publish(directory, fixture("Test_ValidNext_backend.so"))
        recording.until("a build whose outputs differ, rolled back by the policy",
                        lambda text: sample(text, rollbacks) == 1)
        recording.scrape(10)
        publish(directory, fixture("Test_ValidCrashesAlways_backend.so"))
        recording.until("a candidate that crashes its worker, rejected (CRASHED)",
                        lambda text: sample(text, 'backplane_backend_rejected_loads_total'
                                            '{backend="TestValid",reason="CRASHED"}') == 1)
        recording.scrape(10)
        requests.paused = True
        time.sleep(0.5)
        publish(directory, fixture("Test_ValidGoodFix_backend.so"))
        recording.until("no requests; a good build waits in shadow",
                        lambda text: sample(text, 'backplane_rollout_phase'
                                            '{backend="TestValid",phase="shadow"}') == 1)
        recording.scrape(40)
        check(sample(recording.metrics(), rollbacks) == 1,
              "rollout: one rollback by the policy in all (the crash is a rejection)")
    finally:
        requests.stop()
        server.stop()
    return recording


def record_deploys(work):
    trusted = os.path.join(work, "trusted.sha256")
    # The file that is not ELF is on the list too: the list is checked before anything else, and
    # an unlisted file is UNTRUSTED whatever it holds.
    junk = os.path.join(work, "not-elf")
    with open(junk, "w") as stream:
        stream.write("this is not an ELF file\n")
    listed = "".join(digest_line(path) for path in
                     (fixture(VALID), fixture("Test_ValidBreaksSome_backend.so"),
                      fixture("Test_ValidVerySlow_backend.so"), junk))
    write_atomically(trusted, listed)
    server, directory = start_identity_server(
        backplane, work, "deploys",
        '{"swap_policy": "pin", "watch_debounce_ms": 20, "rescan_interval_ms": 200,'
        ' "trusted_backends_file": "' + trusted + '"}')
    requests = Requests(server)
    recording = Recording(server, {"job": "backplane", "instance": "deploys:8000"})
    rejected = 'backplane_backend_rejected_loads_total{backend="TestValid",reason="%s"}'
    try:
        recording.scrape(6)
        publish(directory, junk)
        recording.until("a file that is not ELF", lambda t: sample(t, rejected % "NOT_ELF") == 1)
        recording.scrape(6)
        publish(directory, fixture("Test_ValidBuild3_backend.so"))
        recording.until("a build not on the trusted list",
                        lambda t: sample(t, rejected % "UNTRUSTED") == 1)
        recording.scrape(6)
        write_atomically(trusted, "this is not a digest list\n")
        recording.until("the trusted list unreadable",
                        lambda t: sample(t, "backplane_trust_list_unreadable") == 1)
        recording.scrape(8)
        write_atomically(trusted, listed)
        publish(directory, fixture("Test_ValidBreaksSome_backend.so"))
        draining = 'backplane_backend_generations{backend="TestValid",state="draining"}'
        recording.until("the list restored; a new build while the model is pinned (draining)",
                        lambda t: sample(t, "backplane_trust_list_unreadable") == 0
                        and sample(t, draining) == 1)
        recording.scrape(36)
        reload_model(server, "onto the failing build")
        recording.until("the model on the build failing negative inputs (INTERNAL)",
                        lambda t: (sample(t, 'backplane_inference_failures_total'
                                          '{model="identity",code="INTERNAL"}') or 0) > 0
                        and sample(t, draining) == 0)
        recording.scrape(12)
        swaps = 'backplane_backend_swaps_total{backend="TestValid"}'
        swapped = sample(recording.metrics(), swaps)
        publish(directory, fixture("Test_ValidVerySlow_backend.so"))
        deadline = time.monotonic() + 30  # activated (the model stays pinned until loaded again)
        while sample(recording.metrics(), swaps) == swapped and time.monotonic() < deadline:
            time.sleep(0.1)
        reload_model(server, "onto the slow build")
        slow = ('backplane_inference_request_duration_seconds_bucket'
                '{model="identity",le="0.5"}')
        total = ('backplane_inference_request_duration_seconds_bucket'
                 '{model="identity",le="+Inf"}')
        before = sample(recording.metrics(), total) - sample(recording.metrics(), slow)
        recording.until("the model on a build taking 0.6 s a request",
                        lambda t: sample(t, total) - sample(t, slow) > before)
        recording.scrape(18)
        status, body = http("POST", server.url + "/v2/repository/models/identity/unload")
        check(status == 200, f"the model unloads: {status} {body}")
        recording.until("the model unloaded",
                        lambda t: sample(t, 'backplane_model_ready'
                                         '{model="identity",version=""}') == 0)
        recording.scrape(8)
    finally:
        requests.stop()
        server.stop()
    return recording


def write(recordings):
    with open(test_file) as stream:
        lines = stream.read().split("\n")
    for name, recording in recordings.items():
        begin = next((i for i, line in enumerate(lines)
                      if line.strip() == f"# recorded: {name} begin"), None)
        end = next((i for i, line in enumerate(lines)
                    if line.strip() == f"# recorded: {name} end"), None)
        if begin is None or end is None or end < begin:
            fail(f"{test_file}: no '# recorded: {name} begin' ... 'end' lines")
        indent = lines[begin][:len(lines[begin]) - len(lines[begin].lstrip())]
        body = [f"{indent}# {event}" for event in recording.events]
        body += recording.input_series(indent)
        lines[begin + 1:end] = body
    with open(test_file, "w") as stream:
        stream.write("\n".join(lines))
    print(f"wrote the recorded series into {test_file}")


with tempfile.TemporaryDirectory() as work:
    os.chmod(work, 0o755)
    recordings = {"rollout": record_rollout(work), "deploys": record_deploys(work)}
    check(len(recordings["rollout"].scrapes) == 66, "rollout: 66 scrapes")
    check(len(recordings["deploys"].scrapes) == 100, "deploys: 100 scrapes")
    write(recordings)
    promtool = shutil.which("promtool")
    if promtool:
        result = subprocess.run([promtool, "test", "rules", test_file], capture_output=True,
                                text=True, cwd=os.path.dirname(test_file))
        print(result.stdout + result.stderr)
        check(result.returncode == 0, "promtool test rules passes on the new recording")
    elif os.environ.get("CI") == "true":
        fail("promtool is not installed (Debian package prometheus, installed by scripts/deps.sh;"
             " CI=true: no check is skipped)")
    else:
        print("skipped: promtool test rules (Debian package prometheus not installed)")
print("PASS: alert series recorded")
