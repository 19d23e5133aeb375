#!/usr/bin/python3
"""Writes the text classifier example (PROVENANCE.md): 1/model.onnx, example_request.json and
example_expected.json (the probabilities numpy computes for that request from the ONNX
definitions, which tests/server/encoder_serve_test.cpp compares the served answer with).

    /usr/bin/python3 models/text_classifier/make_model.py

The encoder is scripts/make_tiny_encoder.py's (opset 17, as torch.onnx.export writes one) with a
classification head on its pooled output: MatMul + Add to 2 classes, Softmax. Weights are random
(seed 20261207): it classifies nothing real. Rerunning writes the same bytes.
"""
import json
import pathlib
import sys

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent.parent / "scripts"))
import make_tiny_encoder as encoder  # noqa: E402

CLASSES = 2


def main() -> None:
    rng = np.random.default_rng(20261207)
    w = encoder.weights(rng)
    head_w = rng.normal(0, 0.5, (encoder.HIDDEN, CLASSES)).astype(np.float32)
    head_b = rng.normal(0, 0.1, (CLASSES,)).astype(np.float32)

    model = encoder.build(w, 17)
    graph = model.graph
    graph.initializer.extend([numpy_helper.from_array(head_w, "classifier_w"),
                              numpy_helper.from_array(head_b, "classifier_b")])
    graph.node.extend([
        helper.make_node("MatMul", ["pooled", "classifier_w"], ["logits_mm"], name="classifier"),
        helper.make_node("Add", ["logits_mm", "classifier_b"], ["logits"], name="classifier_bias"),
        helper.make_node("Softmax", ["logits"], ["probabilities"], name="softmax", axis=-1)])
    del graph.output[:]
    graph.output.append(helper.make_tensor_value_info("probabilities", TensorProto.FLOAT,
                                                      ["batch", CLASSES]))
    graph.name = "text_classifier"
    model.producer_name = "backplane models/text_classifier/make_model.py"
    onnx.checker.check_model(model, full_check=True)
    (HERE / "1").mkdir(exist_ok=True)
    onnx.save(model, HERE / "1" / "model.onnx")

    # Two sentences of token ids (the vocabulary is 50 ids), the second padded.
    ids = np.array([[1, 17, 23, 42, 8, 2], [1, 33, 5, 2, 0, 0]], np.int64)
    mask = np.array([[1, 1, 1, 1, 1, 1], [1, 1, 1, 1, 0, 0]], np.int64)
    _, pooled = encoder.reference(w, ids, mask, 17)
    logits = pooled.astype(np.float64) @ head_w + head_b
    probabilities = np.exp(logits - logits.max(-1, keepdims=True))
    probabilities /= probabilities.sum(-1, keepdims=True)
    request = {"id": "two-sentences",
               "inputs": [{"name": "input_ids", "shape": list(ids.shape), "datatype": "INT64",
                           "data": ids.flatten().tolist()},
                          {"name": "attention_mask", "shape": list(mask.shape),
                           "datatype": "INT64", "data": mask.flatten().tolist()}]}
    (HERE / "example_request.json").write_text(json.dumps(request) + "\n")
    expected = {"probabilities": [round(float(p), 7) for p in probabilities.flatten()]}
    (HERE / "example_expected.json").write_text(json.dumps(expected) + "\n")


if __name__ == "__main__":
    main()
