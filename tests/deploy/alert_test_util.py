"""What the alert tests share (record_alert_series.py, prometheus_test.py): a `backplane serve`
on an Identity model served by the fixture backend TestValid, its builds, safe publishing.

Both scripts take BACKPLANE_EXECUTABLE SOURCE_DIR BUILD_BACKENDS_DIR: the fixtures are built
beside the backends (BUILD_BACKENDS_DIR/../tests/fixtures/lib).
"""

import hashlib
import os
import shutil
import sys

from deploy_test_util import Server, fail

FIXTURES = os.path.join(os.path.dirname(os.path.abspath(sys.argv[3])), "tests", "fixtures",
                        "lib")
VALID = "Test_Valid_backend.so"
IDENTITY_REQUEST = {"inputs": [{"name": "x", "shape": [1, 4], "datatype": "FP32",
                                "data": [0.5, 1.0, 2.0, 8.25]}]}
NEGATIVE_REQUEST = {"inputs": [{"name": "x", "shape": [1, 4], "datatype": "FP32",
                                "data": [0.5, -1.0, 2.0, 8.25]}]}


def identity_model():
    """y = Identity(x), FP32 [1, 4], in protobuf's wire format (as rollout_test.py writes it)."""
    def varint(value):
        out = bytearray()
        while value > 0x7F:
            out.append(value & 0x7F | 0x80)
            value >>= 7
        return bytes(out + bytes([value]))

    def field(number, value):
        if isinstance(value, int):
            return varint(number << 3) + varint(value)
        value = value.encode() if isinstance(value, str) else value
        return varint(number << 3 | 2) + varint(len(value)) + value

    def tensor(name):
        shape = field(1, field(1, 1)) + field(1, field(1, 4))
        return field(1, name) + field(2, field(1, field(1, 1) + field(2, shape)))

    node = field(1, "x") + field(2, "y") + field(4, "Identity")
    graph = field(1, node) + field(2, "identity") + field(11, tensor("x")) + field(12, tensor("y"))
    return field(1, 8) + field(8, field(1, "") + field(2, 13)) + field(7, graph)


def fixture(name):
    path = os.path.realpath(os.path.join(FIXTURES, name))
    if not os.path.isfile(path):
        fail(f"no {name} in {FIXTURES}: build the test fixtures (target backplane_fixtures)")
    return path


def digest_line(path):
    """The line `backplane check --digest` (and sha256sum) prints for `path`."""
    with open(path, "rb") as stream:
        return f"{hashlib.sha256(stream.read()).hexdigest()}  {os.path.basename(path)}\n"


def publish(directory, built, name=VALID):
    """Write-temp + rename into place, the safe publish (DESIGN.md, loading rule 7)."""
    temporary = os.path.join(directory, ".publish.tmp")
    shutil.copyfile(built, temporary)
    os.chmod(temporary, 0o755)
    os.rename(temporary, os.path.join(directory, name))


def write_atomically(path, text):
    with open(path + ".tmp", "w") as stream:
        stream.write(text)
    os.chmod(path + ".tmp", 0o644)
    os.rename(path + ".tmp", path)


def sample(text, series):
    """The value of `series` (name{labels} as exported) in exposition `text`, or None."""
    for line in text.splitlines():
        if line.startswith(series + " "):
            return float(line.rsplit(" ", 1)[1])
    return None


def start_identity_server(backplane, work, name, config):
    """A server with config `config` (JSON text) serving model "identity" on TestValid's first
    build, from WORK/NAME; returns (server, its backend directory)."""
    directory = os.path.join(work, name, "backends")
    os.makedirs(directory, mode=0o755)
    os.chmod(directory, 0o755)
    publish(directory, fixture(VALID))
    models = os.path.join(work, name, "models")
    os.makedirs(os.path.join(models, "identity", "1"))
    with open(os.path.join(models, "identity", "1", "model.onnx"), "wb") as stream:
        stream.write(identity_model())
    with open(os.path.join(models, "identity", "config.json"), "w") as stream:
        stream.write('{"backends": ["TestValid"]}')
    config_path = os.path.join(work, name, "serve.json")
    with open(config_path, "w") as stream:
        stream.write(config)
    server = Server([backplane, "serve", "--config", config_path, "--listen", "127.0.0.1:0",
                     "--grpc-listen", "off", "--models", models, "--backends", directory],
                    os.path.join(work, f"{name}.log"))
    return server, directory
