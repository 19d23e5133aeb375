#!/usr/bin/python3
"""deploy/prometheus/alerts_test.yaml passes `promtool test rules`, and tests every rule of
alerts.yaml: each alert fires in at least one case (exp_alerts not empty) and each recording rule
is evaluated by a promql_expr_test or an alert that fires. The series it runs on were recorded
from real servers (record_alert_series.py, DeployTest.AlertSeriesRecordedAgain).

usage: alert_rules_test.py BACKPLANE_EXECUTABLE SOURCE_DIR BUILD_BACKENDS_DIR
"""

import os
import re
import shutil
import subprocess
import sys

import yaml

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from deploy_test_util import check, fail  # noqa: E402

source = os.path.abspath(sys.argv[2])
prometheus_dir = os.path.join(source, "deploy", "prometheus")

with open(os.path.join(prometheus_dir, "alerts.yaml")) as stream:
    rules = [rule for group in yaml.safe_load(stream)["groups"] for rule in group["rules"]]
with open(os.path.join(prometheus_dir, "alerts_test.yaml")) as stream:
    tests = yaml.safe_load(stream)["tests"]

fired = {case["alertname"] for test in tests for case in test.get("alert_rule_test", [])
         if case.get("exp_alerts")}
quiet = {case["alertname"] for test in tests for case in test.get("alert_rule_test", [])
         if not case.get("exp_alerts")}
evaluated = " ".join(case["expr"] for test in tests for case in test.get("promql_expr_test", []))
for rule in rules:
    if "alert" in rule:
        check(rule["alert"] in fired and rule["alert"] in quiet,
              f"alert {rule['alert']} is tested firing and quiet")
for rule in rules:
    if "record" in rule:
        used_by_fired = any(rule["record"] in other["expr"] for other in rules
                            if other.get("alert") in fired)
        check(re.search(re.escape(rule["record"]) + r"\b", evaluated) or used_by_fired,
              f"recording rule {rule['record']} is evaluated by a test")

promtool = shutil.which("promtool")
if not promtool:
    if os.environ.get("CI") == "true":
        fail("promtool is not installed (Debian package prometheus, installed by scripts/deps.sh;"
             " CI=true: no check is skipped)")
    print("skipped: promtool test rules (Debian package prometheus not installed)")
    sys.exit(0)
result = subprocess.run([promtool, "test", "rules", "alerts_test.yaml"], cwd=prometheus_dir,
                        capture_output=True, text=True)
print(result.stdout + result.stderr)
check(result.returncode == 0, "promtool test rules deploy/prometheus/alerts_test.yaml passes")
print("PASS: every alert rule is tested")
