#!/usr/bin/python3
"""Records the alert tests' input series anew from today's server (record_alert_series.py) into a
copy of deploy/prometheus, and runs `promtool test rules` on it: the rules still fire on what the
server exports now, not only on what it exported when the committed series were recorded.

usage: record_alert_series_test.py BACKPLANE_EXECUTABLE SOURCE_DIR BUILD_BACKENDS_DIR
"""

import os
import shutil
import subprocess
import sys
import tempfile

source = os.path.abspath(sys.argv[2])
recorder = os.path.join(os.path.dirname(os.path.abspath(__file__)), "record_alert_series.py")
with tempfile.TemporaryDirectory() as work:
    for name in ("alerts.yaml", "alerts_test.yaml"):
        shutil.copy(os.path.join(source, "deploy", "prometheus", name), work)
    result = subprocess.run([sys.executable, recorder, *sys.argv[1:4],
                             os.path.join(work, "alerts_test.yaml")])
    sys.exit(result.returncode)
