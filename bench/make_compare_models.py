#!/usr/bin/python3
"""Writes the models of bench/ort_compare.sh into OUT_DIR (a build-tree directory, never the repo).

    /usr/bin/python3 bench/make_compare_models.py OUT_DIR

Debian's python3 (package python3-onnx); the `python3` first on PATH may lack onnx. Every model has
fixed shapes (the batch is part of the file), opset 13 / IR 8, seeded random weights (the numbers
are meaningless, the work is not):

  mlp_b1.onnx, mlp_b64.onnx     input [B,784] -> Gemm 784x512 + Relu -> Gemm 512x512 + Relu
                                -> Gemm 512x10 -> [B,10]     (3 Gemm, 2 Relu: 5 layers)
  lenet_b1.onnx, lenet_b64.onnx input [B,1,28,28] -> Conv 1->6 5x5 pad 2 + Relu + MaxPool 2x2
                                -> Conv 6->16 5x5 + Relu + MaxPool 2x2 -> Flatten (400)
                                -> Gemm 400x120 + Relu -> Gemm 120x84 + Relu -> Gemm 84x10
                                (LeNet-5's shape: 2 Conv, 2 MaxPool, 3 Gemm; 12 layers)
  identity.onnx                 input [1] -> Identity -> [1]: what a call costs the ORT Node
                                binding when the model does nothing (subtracted from ORT's times)

The output is deterministic for given numpy and onnx versions.
"""
import pathlib
import sys

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

SEED = 20261130
IR_VERSION, OPSET = 8, 13


def save(graph: onnx.GraphProto, path: pathlib.Path) -> None:
    model = helper.make_model(
        graph,
        producer_name="backplane bench/make_compare_models.py",
        opset_imports=[helper.make_opsetid("", OPSET)],
    )
    model.ir_version = IR_VERSION
    onnx.checker.check_model(model)
    onnx.save(model, path)


def dense(rng, name, inputs, outputs):
    w = (rng.standard_normal((inputs, outputs)) / np.sqrt(inputs)).astype(np.float32)
    b = (0.1 * rng.standard_normal(outputs)).astype(np.float32)
    return [numpy_helper.from_array(w, f"{name}_w"), numpy_helper.from_array(b, f"{name}_b")]


def conv_weights(rng, name, cin, cout, k):
    w = (rng.standard_normal((cout, cin, k, k)) / np.sqrt(cin * k * k)).astype(np.float32)
    b = (0.1 * rng.standard_normal(cout)).astype(np.float32)
    return [numpy_helper.from_array(w, f"{name}_w"), numpy_helper.from_array(b, f"{name}_b")]


def mlp(batch: int) -> onnx.GraphProto:
    rng = np.random.default_rng(SEED)
    init = dense(rng, "fc1", 784, 512) + dense(rng, "fc2", 512, 512) + dense(rng, "fc3", 512, 10)
    nodes = [
        helper.make_node("Gemm", ["x", "fc1_w", "fc1_b"], ["h1"], name="fc1"),
        helper.make_node("Relu", ["h1"], ["a1"], name="relu1"),
        helper.make_node("Gemm", ["a1", "fc2_w", "fc2_b"], ["h2"], name="fc2"),
        helper.make_node("Relu", ["h2"], ["a2"], name="relu2"),
        helper.make_node("Gemm", ["a2", "fc3_w", "fc3_b"], ["y"], name="fc3"),
    ]
    return helper.make_graph(
        nodes,
        f"mlp_b{batch}",
        inputs=[helper.make_tensor_value_info("x", TensorProto.FLOAT, [batch, 784])],
        outputs=[helper.make_tensor_value_info("y", TensorProto.FLOAT, [batch, 10])],
        initializer=init,
    )


def lenet(batch: int) -> onnx.GraphProto:
    rng = np.random.default_rng(SEED + 1)
    init = (
        conv_weights(rng, "conv1", 1, 6, 5)
        + conv_weights(rng, "conv2", 6, 16, 5)
        + dense(rng, "fc1", 400, 120)
        + dense(rng, "fc2", 120, 84)
        + dense(rng, "fc3", 84, 10)
    )
    pool = dict(kernel_shape=[2, 2], strides=[2, 2])
    nodes = [
        helper.make_node("Conv", ["x", "conv1_w", "conv1_b"], ["c1"], name="conv1",
                         kernel_shape=[5, 5], pads=[2, 2, 2, 2]),
        helper.make_node("Relu", ["c1"], ["r1"], name="relu1"),
        helper.make_node("MaxPool", ["r1"], ["p1"], name="pool1", **pool),
        helper.make_node("Conv", ["p1", "conv2_w", "conv2_b"], ["c2"], name="conv2",
                         kernel_shape=[5, 5]),
        helper.make_node("Relu", ["c2"], ["r2"], name="relu2"),
        helper.make_node("MaxPool", ["r2"], ["p2"], name="pool2", **pool),
        helper.make_node("Flatten", ["p2"], ["f"], name="flatten", axis=1),
        helper.make_node("Gemm", ["f", "fc1_w", "fc1_b"], ["h1"], name="fc1"),
        helper.make_node("Relu", ["h1"], ["a1"], name="relu3"),
        helper.make_node("Gemm", ["a1", "fc2_w", "fc2_b"], ["h2"], name="fc2"),
        helper.make_node("Relu", ["h2"], ["a2"], name="relu4"),
        helper.make_node("Gemm", ["a2", "fc3_w", "fc3_b"], ["y"], name="fc3"),
    ]
    return helper.make_graph(
        nodes,
        f"lenet_b{batch}",
        inputs=[helper.make_tensor_value_info("x", TensorProto.FLOAT, [batch, 1, 28, 28])],
        outputs=[helper.make_tensor_value_info("y", TensorProto.FLOAT, [batch, 10])],
        initializer=init,
    )


def identity() -> onnx.GraphProto:
    return helper.make_graph(
        [helper.make_node("Identity", ["x"], ["y"], name="identity")],
        "identity",
        inputs=[helper.make_tensor_value_info("x", TensorProto.FLOAT, [1])],
        outputs=[helper.make_tensor_value_info("y", TensorProto.FLOAT, [1])],
    )


def main() -> None:
    if len(sys.argv) != 2:
        sys.exit("usage: make_compare_models.py OUT_DIR")
    out = pathlib.Path(sys.argv[1])
    out.mkdir(parents=True, exist_ok=True)
    for batch in (1, 64):
        save(mlp(batch), out / f"mlp_b{batch}.onnx")
        save(lenet(batch), out / f"lenet_b{batch}.onnx")
    save(identity(), out / "identity.onnx")
    print(f"wrote the models of bench/ort_compare.sh into {out}")


if __name__ == "__main__":
    main()
