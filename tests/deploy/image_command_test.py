#!/usr/bin/python3
"""The image's command line and configuration, run against the build.

Lays out a temporary root as deploy/Containerfile lays out the image (the config file where it
COPYs it, the build's backends and the example models in the VOLUME directories), rewrites only
the path prefix of deploy/config.json into that root (and the port to 0, so that parallel tests
never collide), starts the build's `backplane` with exactly the image's CMD arguments, and checks
readiness, an MNIST inference, the admin token from the environment and a clean SIGTERM.

usage: image_command_test.py BACKPLANE_EXECUTABLE SOURCE_DIR BUILD_BACKENDS_DIR
"""

import json
import os
import shutil
import subprocess
import sys
import tempfile

import yaml

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from deploy_test_util import Server, check, copy_backends, fail, http  # noqa: E402

backplane, source, build_backends = (os.path.abspath(a) for a in sys.argv[1:4])
deploy = os.path.join(source, "deploy")

with open(os.path.join(deploy, "Containerfile")) as stream:
    containerfile = stream.read().splitlines()
cmd = json.loads(next(line for line in containerfile if line.startswith("CMD "))[4:])
volumes = json.loads(next(line for line in containerfile if line.startswith("VOLUME "))[7:])
config_destination = next(line.split()[2] for line in containerfile
                          if line.startswith("COPY deploy/config.json "))
check(cmd[0] == "backplane" and "--config" in cmd, f"the image's CMD is {cmd}")
check(cmd[cmd.index("--config") + 1] == config_destination,
      f"the CMD reads the config file the image installs ({config_destination})")


def resolved(*arguments):
    result = subprocess.run([backplane, "serve", "--check-config", *arguments],
                            capture_output=True, text=True, timeout=30)
    if result.returncode != 0:
        fail(f"--check-config {' '.join(arguments)}: {result.stderr}")
    return json.loads(result.stdout)


with tempfile.TemporaryDirectory() as root:
    os.chmod(root, 0o755)
    with open(os.path.join(deploy, "config.json")) as stream:
        original = stream.read()
    rewritten = original.replace('"/var/lib/backplane/', f'"{root}/var/lib/backplane/')
    rewritten = rewritten.replace('"0.0.0.0:8000"', '"127.0.0.1:0"')
    rewritten = rewritten.replace('"0.0.0.0:8001"', '"127.0.0.1:0"')
    config_path = root + config_destination
    os.makedirs(os.path.dirname(config_path))
    with open(config_path, "w") as stream:
        stream.write(rewritten)
    # Nothing but the prefix and the port may differ.
    with tempfile.NamedTemporaryFile("w", suffix=".json") as copy:
        copy.write(original)
        copy.flush()
        before = resolved("--config", copy.name)
    after = resolved("--config", config_path)
    for key in before:
        if key in ("listen", "grpc_listen"):
            continue
        strip = (lambda value: value.replace(root, "", 1) if isinstance(value, str) else
                 [strip(v) for v in value] if isinstance(value, list) else value)
        if strip(after[key]) != before[key]:
            fail(f"rewriting the config changed '{key}': {before[key]} -> {after[key]}")
    check(sorted([after["models"], *after["backends"]]) == sorted(root + v for v in volumes),
          "the config's model and backend directories are the image's VOLUMEs")

    # The image's layout: what the Containerfile copies into the VOLUME directories.
    copy_backends(build_backends, after["backends"][0])
    shutil.copytree(os.path.join(source, "models"), after["models"])
    workdir = root + "/var/lib/backplane"

    argv = [backplane if a == "backplane" else config_path if a == config_destination else a
            for a in cmd]
    token = "image-test-token"
    env = {"BACKPLANE_ADMIN_TOKEN": token}  # as the Deployment sets it from its Secret
    os.environ.pop("BACKPLANE_BACKEND_PATHS", None)
    server = Server(argv, os.path.join(root, "serve.log"), env=env, cwd=workdir)
    try:
        status, body = http("GET", server.url + "/v2/health/ready")
        check(status == 200 and body == {"ready": True}, "GET /v2/health/ready: 200 ready")
        status, backend = http("GET", server.url + "/v2/backends/CpuRef")
        check(status == 200 and backend["file"].startswith(after["backends"][0] + "/"),
              "CpuRef is loaded from the image's backend volume")
        status, index = http("POST", server.url + "/v2/repository/index", {})
        check(status == 200 and sorted((m["name"], m["state"]) for m in index) ==
              [("mlp", "READY"), ("mnist", "READY"), ("mnist_int8", "READY"),
               ("text_classifier", "READY")],
              "every example model of the image's model volume is READY")
        with open(os.path.join(after["models"], "mnist", "example_request.json"), "rb") as stream:
            status, answer = http("POST", server.url + "/v2/models/mnist/infer", stream.read())
        logits = answer["outputs"][0]["data"] if status == 200 else []
        check(status == 200 and logits.index(max(logits)) == 5,
              "MNIST test image 0 is classified as a 5")
        status, _ = http("POST", server.url + "/v2/backends/CpuRef/pin")
        check(status == 401, "admin calls need the token from BACKPLANE_ADMIN_TOKEN (401 without)")
        status, _ = http("POST", server.url + "/v2/backends/CpuRef/pin", token=token)
        check(status == 200, "and succeed with it")
    finally:
        code, seconds = server.stop()
    with open(os.path.join(deploy, "kubernetes", "deployment.yaml")) as stream:
        pod = yaml.safe_load(stream)["spec"]["template"]["spec"]
    pre_stop = int(pod["containers"][0]["lifecycle"]["preStop"]["exec"]["command"][1])
    budget = pod["terminationGracePeriodSeconds"] - pre_stop
    check(code == 0, "SIGTERM: the server drains and exits 0")
    check(seconds < budget,
          f"it exits in {seconds:.2f} s, within the pod's {budget} s after preStop")
    log = server.log_text()
    check("stopped; every backend generation unloaded" in log, "every backend generation unloaded")
print("PASS: the image's command and configuration serve from the build")
