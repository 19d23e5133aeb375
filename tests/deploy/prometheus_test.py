#!/usr/bin/python3
"""A real Prometheus (Debian's `prometheus`) with deploy/prometheus/prometheus.yml, its targets
pointed at a real `backplane serve`, evaluates every rule of alerts.yaml and every query of the
Grafana dashboard deploy/grafana/backplane.json through its HTTP API (/api/v1/query): each
evaluates without error, each dashboard query returns series, and every metric a rule or a panel
names is in Prometheus.

The server has what the queries are about: a progressive rollout (a good build of the fixture
backend TestValid promoted), a trusted list, requests and a client error.

usage: prometheus_test.py BACKPLANE_EXECUTABLE SOURCE_DIR BUILD_BACKENDS_DIR
"""

import json
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.parse

import yaml

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from deploy_test_util import check, fail, http  # noqa: E402
from alert_test_util import (IDENTITY_REQUEST, VALID, digest_line, fixture, publish,  # noqa: E402
                             start_identity_server)

backplane, source, build_backends = (os.path.abspath(a) for a in sys.argv[1:4])
prometheus_dir = os.path.join(source, "deploy", "prometheus")

prometheus = shutil.which("prometheus")
if prometheus is None:
    if os.environ.get("CI") == "true":
        fail("prometheus is not installed (Debian package prometheus, installed by "
             "scripts/deps.sh; CI=true: no check is skipped)")
    print("skipped: prometheus is not installed (Debian package prometheus)")
    sys.exit(0)


def free_port():
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def query(url, expr):
    status, body = http("GET", f"{url}/api/v1/query?" + urllib.parse.urlencode({"query": expr}))
    if status != 200 or not isinstance(body, dict) or body.get("status") != "success":
        fail(f"query {expr!r}: {status} {body}")
    return body["data"]["result"]


def grafana_expr(expr):
    """A dashboard query as Grafana sends it: its variables replaced ($job, $instance: All)."""
    return (expr.replace("$__rate_interval", "1m").replace('"$job"', '".+"')
            .replace('"$instance"', '".+"'))


with open(os.path.join(prometheus_dir, "alerts.yaml")) as stream:
    rules = [rule for group in yaml.safe_load(stream)["groups"] for rule in group["rules"]]
with open(os.path.join(source, "deploy", "grafana", "backplane.json")) as stream:
    dashboard = json.load(stream)
panels = [(panel["title"], target["expr"]) for panel in dashboard["panels"]
          for target in panel["targets"]]
check(len(panels) >= 10, f"the dashboard has {len(panels)} queries")

with tempfile.TemporaryDirectory() as work:
    os.chmod(work, 0o755)
    trusted = os.path.join(work, "trusted.sha256")
    with open(trusted, "w") as stream:
        stream.write(digest_line(fixture(VALID)) +
                     digest_line(fixture("Test_ValidGoodFix_backend.so")))
    server, directory = start_identity_server(
        backplane, work, "served",
        '{"deploy_policy": "progressive", "watch_debounce_ms": 20, "trusted_backends_file": "' +
        trusted + '", "rollout": {"shadow_fraction": 0.5, "min_samples": 20, "steps": [50, 100],'
        ' "max_latency_regression": 1000}}')
    running = True

    def requests():
        while running:
            http("POST", server.url + "/v2/models/identity/infer", IDENTITY_REQUEST)
            time.sleep(0.01)

    traffic = threading.Thread(target=requests, daemon=True)
    traffic.start()
    prometheus_process = None
    try:
        # A client's error: backplane_inference_failures_total exists (code INVALID_ARGUMENT).
        status, _ = http("POST", server.url + "/v2/models/identity/infer", {"inputs": []})
        check(status == 400, "a bad request is refused (a failure series exists)")
        publish(directory, fixture("Test_ValidGoodFix_backend.so"))
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            _, rollout = http("GET", server.url + "/v2/backends/TestValid/rollout")
            if isinstance(rollout, dict) and rollout.get("phase") == "promoted":
                break
            time.sleep(0.2)
        check(isinstance(rollout, dict) and rollout.get("phase") == "promoted",
              f"a good build is rolled out and promoted: {rollout}")

        # The shipped configuration, with its target and intervals made the test's.
        with open(os.path.join(prometheus_dir, "prometheus.yml")) as stream:
            config = yaml.safe_load(stream)
        config["global"].update({"scrape_interval": "1s", "evaluation_interval": "1s"})
        config["rule_files"] = [os.path.join(prometheus_dir, name) for name in config["rule_files"]]
        job = config["scrape_configs"][0]
        check(job["job_name"] == "backplane", "prometheus.yml scrapes job backplane")
        job["scrape_interval"] = "1s"
        job["scrape_timeout"] = "1s"
        job["static_configs"] = [{"targets": [server.url.split("//", 1)[1]]}]
        config_path = os.path.join(work, "prometheus.yml")
        with open(config_path, "w") as stream:
            yaml.safe_dump(config, stream)
        port = free_port()
        log = open(os.path.join(work, "prometheus.log"), "w")
        prometheus_process = subprocess.Popen(
            [prometheus, f"--config.file={config_path}",
             f"--storage.tsdb.path={os.path.join(work, 'tsdb')}",
             f"--web.listen-address=127.0.0.1:{port}"], stdout=log, stderr=subprocess.STDOUT)
        url = f"http://127.0.0.1:{port}"

        # 70 s of scrapes: rate() over 1m windows has samples to work on.
        deadline = time.monotonic() + 90
        up = []
        while time.monotonic() < deadline and not up:
            time.sleep(0.5)
            try:  # refused, then 503 while Prometheus starts
                status, body = http("GET", f"{url}/api/v1/query?query=up%3D%3D1", timeout=5)
            except OSError:
                continue
            up = body["data"]["result"] if status == 200 and isinstance(body, dict) else []
        if not up:
            with open(os.path.join(work, "prometheus.log")) as stream:
                fail("Prometheus never scraped the server:\n" + stream.read())
        check(True, "Prometheus scrapes the server")
        time.sleep(70)

        names = set()
        for rule in rules:
            name = rule.get("alert") or rule["record"]
            query(url, rule["expr"])
            check(True, f"rule {name}: its expr evaluates")
            names |= set(re.findall(r"\b((?:backplane|process)_[a-z_]+)", rule["expr"]))
        for record in (rule["record"] for rule in rules if "record" in rule):
            if "failures" in record or "error_ratio" in record:
                continue  # no server-side failure here: empty is right
            check(query(url, record), f"recording rule {record} has series")
        for title, expr in panels:
            result = query(url, grafana_expr(expr))
            check(result, f"panel '{title}': {expr[:70]}... has series")
            names |= set(re.findall(r"\b((?:backplane|process)_[a-z_]+)", expr))
        for name in sorted(names):
            base = re.sub(r"_(bucket|sum|count)$", "", name)
            present = query(url, f'count({{__name__=~"{name}|{base}_bucket"}})')
            check(present, f"{name} is in Prometheus")
        alerts = query(url, 'ALERTS{alertstate="firing"}')
        check(not alerts, f"no alert fires on a healthy server with a good rollout: {alerts}")
    finally:
        running = False
        if prometheus_process is not None:
            prometheus_process.terminate()
            prometheus_process.wait(timeout=30)
        server.stop()
print("PASS: Prometheus evaluates every rule and dashboard query")
