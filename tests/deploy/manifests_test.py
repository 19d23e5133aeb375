#!/usr/bin/python3
"""The Kubernetes and KServe manifests of deploy/ agree with the server they run.

Checked without a cluster: kinds and API versions; the ConfigMap's config.json is deploy/config.json
verbatim and `backplane serve --check-config` accepts it; ports match the configuration; the
probes and scrape paths are endpoints a real `backplane serve` answers 200 on; the Deployment's
command is the image's CMD; the grace period covers preStop and the server's drain; the KServe
runtime's arguments resolve to /mnt/models and its port; the alerting rules parse and name metrics
the server exports.

usage: manifests_test.py BACKPLANE_EXECUTABLE SOURCE_DIR BUILD_BACKENDS_DIR
"""

import json
import os
import re
import shutil
import subprocess
import sys
import tempfile

import yaml

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from deploy_test_util import Server, check, copy_backends, fail, http  # noqa: E402

backplane, source, build_backends = (os.path.abspath(a) for a in sys.argv[1:4])
deploy = os.path.join(source, "deploy")


def load_documents(directory):
    documents = {}
    for name in sorted(os.listdir(directory)):
        if name.endswith(".yaml"):
            with open(os.path.join(directory, name)) as stream:
                for document in yaml.safe_load_all(stream):
                    if document:
                        documents[(document["kind"], document["metadata"]["name"])] = document
    return documents


def check_config(*arguments):
    """backplane serve --check-config ARGUMENTS: (exit code, resolved config or None, stderr)."""
    result = subprocess.run([backplane, "serve", "--check-config", *arguments],
                            capture_output=True, text=True, timeout=30,
                            env={k: v for k, v in os.environ.items()
                                 if k != "BACKPLANE_ADMIN_TOKEN"})
    resolved = json.loads(result.stdout) if result.returncode == 0 else None
    return result.returncode, resolved, result.stderr


def port_of(listen):
    return int(listen.rsplit(":", 1)[1])


def resolve_port(container, port):
    """A probe's port: a number, or the name of one of the container's ports."""
    if isinstance(port, int):
        return port
    for declared in container.get("ports", []):
        if declared.get("name") == port:
            return declared["containerPort"]
    fail(f"port '{port}' is not a port of container {container['name']}")


def containerfile_cmd():
    with open(os.path.join(deploy, "Containerfile")) as stream:
        commands = [line for line in stream if line.startswith("CMD ")]
    if len(commands) != 1:
        fail(f"the Containerfile has {len(commands)} CMD lines, not one")
    return json.loads(commands[0][4:])


def containerfile_user():
    with open(os.path.join(deploy, "Containerfile")) as stream:
        users = [line.split()[1] for line in stream if line.startswith("USER ")]
    return [int(part) for part in users[-1].split(":")]


kube = load_documents(os.path.join(deploy, "kubernetes"))
kserve = load_documents(os.path.join(deploy, "kserve"))
http_paths = set()  # every path a probe or a scraper will GET, checked against a real server

# ---- Kubernetes' naming conventions (what the API server would refuse).
DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")
PORT_NAME = re.compile(r"^(?=.{1,15}$)(?=.*[a-z])[a-z0-9]+(-[a-z0-9]+)*$")  # IANA_SVC_NAME
QUANTITY = re.compile(r"^[0-9]+(\.[0-9]+)?(m|Ki|Mi|Gi|Ti|k|M|G|T)?$")


def containers_of(document):
    spec = document.get("spec", {})
    pod = spec.get("template", {}).get("spec", spec)
    return pod.get("initContainers", []) + pod.get("containers", [])


for (kind, name), document in sorted({**kube, **kserve}.items()):
    if not DNS_LABEL.match(name):
        fail(f"{kind} name '{name}' is not a DNS-1123 label")
    for container in containers_of(document):
        if not DNS_LABEL.match(container["name"]):
            fail(f"{kind} {name}: container name '{container['name']}' is not a DNS-1123 label")
        for port in container.get("ports", []):
            if "name" in port and not PORT_NAME.match(port["name"]):
                fail(f"{kind} {name}: port name '{port['name']}' is not an IANA_SVC_NAME")
            if not 1 <= port["containerPort"] <= 65535:
                fail(f"{kind} {name}: containerPort {port['containerPort']} out of range")
        for bound in container.get("resources", {}).values():
            for resource, quantity in bound.items():
                if not QUANTITY.match(str(quantity)):
                    fail(f"{kind} {name}: {resource} '{quantity}' is not a quantity")
    # Labels and annotations are string maps: an unquoted true or 8000 is refused.
    spec = document.get("spec", {})
    for where in (document["metadata"], spec.get("template", {}).get("metadata", {}), spec):
        for field in ("labels", "annotations"):
            for key, value in (where.get(field) or {}).items():
                if not isinstance(value, str):
                    fail(f"{kind} {name}: {field[:-1]} {key} must be a string, got {value!r}")
check(True, "names, port names, quantities, labels and annotations follow Kubernetes' conventions")

# ---- The configuration: one source of truth, accepted by the server.
with open(os.path.join(deploy, "config.json")) as stream:
    config_text = stream.read()
check(set(kind for kind, _ in kube) == {"Deployment", "Service", "ConfigMap"},
      "deploy/kubernetes holds a Deployment, a Service and a ConfigMap")
configmap = kube[("ConfigMap", "backplane-config")]
check(configmap["apiVersion"] == "v1", "ConfigMap is v1")
check(configmap["data"]["config.json"] == config_text,
      "the ConfigMap's config.json is deploy/config.json verbatim")
with tempfile.TemporaryDirectory() as work:
    embedded = os.path.join(work, "config.json")
    with open(embedded, "w") as stream:
        stream.write(configmap["data"]["config.json"])
    code, config, errors = check_config("--config", embedded)
    check(code == 0, "backplane serve --check-config accepts the ConfigMap's config" +
      ("" if code == 0 else f": {errors}"))
    # The check must be able to fail: a key the server does not know.
    broken = os.path.join(work, "broken.json")
    with open(broken, "w") as stream:
        stream.write(config_text.replace('"listen"', '"listne"'))
    code, _, errors = check_config("--config", broken)
    check(code == 1 and "unknown key 'listne'" in errors,
          "--check-config refuses a misspelt key and names it")
http_port = port_of(config["listen"])
check(config["listen"].startswith("0.0.0.0:"), "the server listens on every interface in a pod")
grpc_port = port_of(config["grpc_listen"])
check(config["grpc_listen"].startswith("0.0.0.0:"), "gRPC listens on every interface in a pod")
check(config["admin_token"] is None, "no admin token in the config file (it is a Secret)")

# ---- The Deployment.
deployment = kube[("Deployment", "backplane")]
check(deployment["apiVersion"] == "apps/v1", "Deployment is apps/v1")
pod = deployment["spec"]["template"]
check(deployment["spec"]["selector"]["matchLabels"].items() <= pod["metadata"]["labels"].items(),
      "the Deployment's selector matches its pod labels")
spec = pod["spec"]
containers = {c["name"]: c for c in spec["containers"]}
server = containers["backplane"]
check(server["command"] == containerfile_cmd(),
      f"the container runs the image's CMD {containerfile_cmd()}")
config_path = server["command"][server["command"].index("--config") + 1]
ports = {p["name"]: p["containerPort"] for p in server["ports"]}
check(ports == {"http": http_port, "grpc": grpc_port},
      f"the container ports are the configured HTTP port {http_port} and gRPC port {grpc_port}")
probes = {name: server[name] for name in ("readinessProbe", "livenessProbe", "startupProbe")}
check(probes["readinessProbe"]["httpGet"]["path"] == "/v2/health/ready",
      "readiness probes /v2/health/ready")
check(probes["livenessProbe"]["httpGet"]["path"] == "/v2/health/live",
      "liveness probes /v2/health/live")
for name, probe in probes.items():
    check(resolve_port(server, probe["httpGet"]["port"]) == http_port,
          f"{name} uses the HTTP port")
    http_paths.add(probe["httpGet"]["path"])
annotations = pod["metadata"]["annotations"]
check(annotations["prometheus.io/scrape"] == "true" and
      int(annotations["prometheus.io/port"]) == http_port and
      annotations["prometheus.io/path"] == "/metrics",
      "Prometheus scrape annotations point at /metrics on the HTTP port")
http_paths.add(annotations["prometheus.io/path"])
requests = server["resources"]["requests"]
check("cpu" in requests and "memory" in requests, "CPU and memory requests are set")
check(float(requests["cpu"]) == config["inference_threads"],
      "inference_threads matches the CPU request (TBB sees every core of the node)")
# Grace: preStop sleep + the server's drain. The drain answers requests in flight, cutting slow
# clients after read_timeout_ms and write_timeout_ms; 10 s more for unloading.
pre_stop = server["lifecycle"]["preStop"]["exec"]["command"]
check(pre_stop[0] == "sleep", "preStop sleeps while the endpoints are removed")
drain_bound = (config["read_timeout_ms"] + config["write_timeout_ms"]) / 1000 + 10
grace = spec["terminationGracePeriodSeconds"]
check(grace > int(pre_stop[1]) + drain_bound,
      f"terminationGracePeriodSeconds {grace} > preStop {pre_stop[1]} s + drain {drain_bound} s")
token = next(e for e in server["env"] if e["name"] == "BACKPLANE_ADMIN_TOKEN")
check(token["valueFrom"]["secretKeyRef"]["name"] == "backplane-admin",
      "the admin token comes from the Secret backplane-admin")
uid, gid = containerfile_user()
check(spec["securityContext"]["runAsUser"] == uid and spec["securityContext"]["runAsGroup"] == gid
      and spec["securityContext"]["runAsNonRoot"], f"runs as the image's user {uid}:{gid}")
check("fsGroup" not in spec["securityContext"],
      "no fsGroup (it would make the backend directory group-writable)")
volumes = {v["name"]: v for v in spec["volumes"]}
mounts = {m["mountPath"]: m for m in server["volumeMounts"]}
config_mount = mounts[os.path.dirname(config_path)]
check(volumes[config_mount["name"]]["configMap"]["name"] == "backplane-config",
      f"the ConfigMap is mounted where --config reads it ({config_path})")
for path in [config["models"], *config["backends"], "/tmp"]:
    check(path in mounts, f"{path} is a mounted volume")
# The image declares its VOLUMEs there: a mount on a parent would leave the runtime's own
# anonymous volumes covering them.
with open(os.path.join(deploy, "Containerfile")) as stream:
    image_volumes = json.loads(next(l for l in stream if l.startswith("VOLUME "))[7:])
check(sorted(image_volumes) == sorted([config["models"], *config["backends"]]),
      "the image's VOLUMEs are the config's model and backend directories")

# ---- The Service.
service = kube[("Service", "backplane")]
check(service["apiVersion"] == "v1", "Service is v1")
check(service["spec"]["selector"].items() <= pod["metadata"]["labels"].items(),
      "the Service selects the Deployment's pods")
service_ports = {p["name"]: p for p in service["spec"]["ports"]}
check(resolve_port(server, service_ports["http"]["targetPort"]) == http_port,
      "the Service's http port targets the server's port")
check(resolve_port(server, service_ports["grpc"]["targetPort"]) == grpc_port,
      "the Service's grpc port targets the server's gRPC port")

# ---- KServe.
check(set(kind for kind, _ in kserve) == {"ServingRuntime", "InferenceService"},
      "deploy/kserve holds a ServingRuntime and an InferenceService")
runtime = kserve[("ServingRuntime", "backplane")]
check(runtime["apiVersion"] == "serving.kserve.io/v1alpha1", "ServingRuntime is v1alpha1")
formats = runtime["spec"]["supportedModelFormats"]
check([f["name"] for f in formats] == ["onnx"], "the runtime supports the onnx format")
check(runtime["spec"]["protocolVersions"] == ["v2"],
      "protocolVersions is v2 only (the container routes the REST port)")
runtime_container = runtime["spec"]["containers"][0]
check(runtime_container["name"] == "kserve-container",
      "the container is named kserve-container, as KServe requires")
arguments = runtime_container["args"]
check(arguments[:2] == ["backplane", "serve"], "the runtime runs backplane serve")
with tempfile.TemporaryDirectory() as work:
    # The image's config file stands where the arguments expect it; its paths do not exist here.
    image_config = os.path.join(work, "config.json")
    with open(image_config, "w") as stream:
        stream.write(config_text)
    rewritten = [image_config if a == "/etc/backplane/config.json" else a for a in arguments[2:]]
    code, runtime_config, errors = check_config(*rewritten)
check(code == 0, "--check-config accepts the runtime's arguments" +
      ("" if code == 0 else f": {errors}"))
check(runtime_config["models"] == "/mnt/models", "KServe's /mnt/models is the model repository")
kserve_port = port_of(runtime_config["listen"])
check([p["containerPort"] for p in runtime_container["ports"]] == [kserve_port],
      f"the runtime's container port is the port it listens on ({kserve_port})")
for name in ("readinessProbe", "livenessProbe"):
    probe = runtime_container[name]["httpGet"]
    check(probe["port"] == kserve_port, f"the runtime's {name} uses port {kserve_port}")
    http_paths.add(probe["path"])
check(int(runtime["spec"]["annotations"]["prometheus.kserve.io/port"]) == kserve_port,
      "KServe's metrics annotations point at the runtime's port")
http_paths.add(runtime["spec"]["annotations"]["prometheus.kserve.io/path"])
service_mnist = kserve[("InferenceService", "mnist")]
check(service_mnist["apiVersion"] == "serving.kserve.io/v1beta1", "InferenceService is v1beta1")
predictor = service_mnist["spec"]["predictor"]["model"]
check(predictor["runtime"] == "backplane" and predictor["modelFormat"]["name"] == "onnx",
      "the MNIST InferenceService uses the backplane runtime's onnx format")
check(predictor["protocolVersion"] in runtime["spec"]["protocolVersions"],
      "its protocol is one the runtime speaks")
check(re.match(r"^[a-z]+://", predictor["storageUri"]) is not None, "it has a storageUri")

# ---- Every probe and scrape path is a real endpoint of the server.
with tempfile.TemporaryDirectory() as work:
    copy_backends(build_backends, os.path.join(work, "backends"))
    running = Server([backplane, "serve", "--listen", "127.0.0.1:0", "--grpc-listen", "127.0.0.1:0",
                      "--models", os.path.join(source, "models"),
                      "--backends", os.path.join(work, "backends")],
                     os.path.join(work, "serve.log"))
    try:
        for path in sorted(http_paths):
            status, _ = http("GET", running.url + path)
            check(status == 200, f"GET {path} answers 200 on a running server")
        # The alerting rules name metrics the server exports.
        _, metrics = http("GET", running.url + "/metrics")
        exported = set(re.findall(r"^# TYPE (\S+) (\S+)", metrics, re.M))
        names = {name for name, _ in exported}
        names |= {f"{name}_{suffix}" for name, kind in exported if kind == "histogram"
                  for suffix in ("bucket", "sum", "count")}
        # (backplane_trust_* exist only with a trust policy, which this server has not:
        # prometheus_test.py evaluates every rule against one that has.)
        with open(os.path.join(deploy, "prometheus", "alerts.yaml")) as stream:
            groups = yaml.safe_load(stream)["groups"]
        for rule in (rule for group in groups for rule in group["rules"]):
            used = set(re.findall(r"\b(backplane_[a-z_]+)", rule["expr"]))
            used = {name for name in used if not name.startswith("backplane_trust_")}
            name = rule.get("alert") or rule["record"]
            check(used <= names, f"rule {name} uses exported metrics ({', '.join(sorted(used))})")
    finally:
        running.stop()
promtool = shutil.which("promtool")
if promtool:
    result = subprocess.run([promtool, "check", "rules", os.path.join(deploy, "prometheus",
                                                                      "alerts.yaml")],
                            capture_output=True, text=True)
    check(result.returncode == 0, "promtool check rules accepts deploy/prometheus/alerts.yaml" +
          ("" if result.returncode == 0 else f": {result.stdout}{result.stderr}"))
else:
    if os.environ.get("CI") == "true":
        fail("promtool is not installed (Debian package prometheus, installed by scripts/deps.sh;"
             " CI=true: no check is skipped)")
    print("skipped: promtool check rules (Debian package prometheus not installed)")
print("PASS: manifests agree with the server")
