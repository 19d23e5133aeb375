#!/usr/bin/python3
"""Writes models/mlp/1/model.onnx: a small multilayer perceptron with fixed, seeded weights.

features [batch, 4] -> Gemm(4x16) -> Relu -> Gemm(16x3) -> Softmax(axis=1) -> probabilities [batch, 3]

The weights are random (seed 20261129): the model demonstrates a second model beside MNIST, a
dynamic batch dimension and a Softmax output; it does not classify anything real. Run it with
Debian's python3 (`/usr/bin/python3`, package python3-onnx) from the repository root:

    /usr/bin/python3 models/mlp/make_model.py

The output is deterministic: the same numpy and onnx versions give byte-identical files.
"""
import pathlib

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

SEED = 20261129
FEATURES, HIDDEN, CLASSES = 4, 16, 3
# IR 8 / opset 13: what onnx 1.12 writes by default is newer than some readers accept, and
# Backplane imports opsets 13 and later only (Softmax changed meaning at 13).
IR_VERSION, OPSET = 8, 13


def main() -> None:
    rng = np.random.default_rng(SEED)
    w1 = (rng.standard_normal((FEATURES, HIDDEN)) / np.sqrt(FEATURES)).astype(np.float32)
    b1 = (0.1 * rng.standard_normal(HIDDEN)).astype(np.float32)
    w2 = (rng.standard_normal((HIDDEN, CLASSES)) / np.sqrt(HIDDEN)).astype(np.float32)
    b2 = (0.1 * rng.standard_normal(CLASSES)).astype(np.float32)

    nodes = [
        helper.make_node("Gemm", ["features", "w1", "b1"], ["hidden"], name="dense1"),
        helper.make_node("Relu", ["hidden"], ["hidden_relu"], name="relu1"),
        helper.make_node("Gemm", ["hidden_relu", "w2", "b2"], ["logits"], name="dense2"),
        helper.make_node("Softmax", ["logits"], ["probabilities"], name="softmax", axis=1),
    ]
    graph = helper.make_graph(
        nodes,
        "mlp",
        inputs=[helper.make_tensor_value_info("features", TensorProto.FLOAT, ["batch", FEATURES])],
        outputs=[
            helper.make_tensor_value_info("probabilities", TensorProto.FLOAT, ["batch", CLASSES])
        ],
        initializer=[
            numpy_helper.from_array(w1, "w1"),
            numpy_helper.from_array(b1, "b1"),
            numpy_helper.from_array(w2, "w2"),
            numpy_helper.from_array(b2, "b2"),
        ],
    )
    model = helper.make_model(
        graph,
        producer_name="backplane models/mlp/make_model.py",
        opset_imports=[helper.make_opsetid("", OPSET)],
    )
    model.ir_version = IR_VERSION
    onnx.checker.check_model(model)
    out = pathlib.Path(__file__).resolve().parent / "1" / "model.onnx"
    out.parent.mkdir(parents=True, exist_ok=True)
    onnx.save(model, out)
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
