#!/usr/bin/python3
# An MLP exported the way a trained one is: Gemm+Relu per hidden layer, a last Gemm, a symbolic
# batch dimension "N", seeded weights (the same file every run). Debian's python3-onnx:
#   /usr/bin/python3 bench/make_mlp.py OUT.onnx 784 2048 2048 10
import sys
import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper
rng = np.random.default_rng(20261202)
sizes = [int(size) for size in sys.argv[2:]]
nodes, inits, last = [], [], "x"
for i, (n_in, n_out) in enumerate(zip(sizes, sizes[1:])):
    w = (rng.standard_normal((n_in, n_out)) / np.sqrt(n_in)).astype(np.float32)
    b = (0.01 * rng.standard_normal(n_out)).astype(np.float32)
    inits += [numpy_helper.from_array(w, f"w{i}"), numpy_helper.from_array(b, f"b{i}")]
    out = "y" if i == len(sizes) - 2 else f"h{i}"
    gemm = out if out == "y" else f"g{i}"
    nodes.append(helper.make_node("Gemm", ["x" if i == 0 else last, f"w{i}", f"b{i}"], [gemm]))
    if out != "y":
        nodes.append(helper.make_node("Relu", [gemm], [out]))
    last = out
graph = helper.make_graph(
    nodes, "mlp",
    [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 784])],
    [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 10])], inits)
model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
model.ir_version = 8
onnx.save(model, sys.argv[1])
