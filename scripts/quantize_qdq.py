#!/usr/bin/python3
"""Quantizes a float ONNX model to the QDQ form ONNX Runtime's static quantization writes.

    /usr/bin/python3 scripts/quantize_qdq.py FLOAT.onnx INT8.onnx \\
        --backplane build/release/server/backplane [--activations uint8|int8] \\
        [--calibration SAMPLES.npy | --samples 64 --seed 1 [--uniform LOW HIGH]]

Debian's python3 (onnx 1.12, numpy); no ONNX Runtime needed. What it writes, as
`onnxruntime.quantization.quantize_static(..., quant_format=QDQ, per_channel=True)` does after
its pre-processing:

- Pre-processing first: BatchNormalization folded into the Conv before it, a constant Add after a
  Conv folded into its bias, MatMul + constant Add into Gemm (ORT's basic graph fusions).
- Weights: int8, per output channel, symmetric (zero point 0, range [-127, 127]), each behind a
  DequantizeLinear on its channel axis (Conv: 0; Gemm: 0 with transB, else 1; MatMul: 1).
- Biases: int32 with scale input_scale × weight_scale[channel], zero point 0, behind a
  DequantizeLinear (what lets a runtime add them in the integer accumulator).
- Activations: a QuantizeLinear → DequantizeLinear pair on every float tensor a Conv, Gemm,
  MatMul, Add or MaxPool reads or writes, asymmetric uint8 (or int8) per tensor; ranges are the
  min and max over the calibration samples (ORT's default MinMax calibration), widened to hold 0.
  A Conv, Gemm, MatMul or Add whose only reader is a Relu or Clip is quantized after that
  activation, as ORT removes it into the range; the output of a MaxPool, Reshape or Flatten
  keeps its input's scale and zero point.

Calibration runs the float model with every quantized tensor made an output, on Backplane's own
`backplane run` (CpuRef): SAMPLES.npy holds the samples of the first input (stacked on axis 0),
or, without it, `--samples` samples are generated from `--seed` (standard normal, or uniform in
`--uniform LOW HIGH`).
Rerunning with the same arguments writes the same bytes.
"""

import argparse
import pathlib
import subprocess
import sys
import tempfile

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

QUANTIZED_OPS = {"Conv", "Gemm", "MatMul", "Add", "MaxPool"}
WEIGHTED_OPS = {"Conv", "Gemm", "MatMul"}
RANGE_ACTIVATIONS = {"Relu", "Clip"}
SAME_RANGE_OPS = {"MaxPool", "Reshape", "Flatten"}  # move or pick values, never make new ones


class Model:
    """The graph's nodes, initializers and who reads what."""

    def __init__(self, model: onnx.ModelProto):
        self.model = model
        self.graph = model.graph
        self.initializers = {t.name: t for t in self.graph.initializer}

    def constant(self, name: str):
        tensor = self.initializers.get(name)
        return None if tensor is None else numpy_helper.to_array(tensor)

    def set_constant(self, name: str, array: np.ndarray) -> None:
        tensor = numpy_helper.from_array(array, name)
        if name in self.initializers:
            self.graph.initializer.remove(self.initializers[name])
        self.graph.initializer.append(tensor)
        self.initializers[name] = tensor

    def readers(self, value: str) -> list:
        return [n for n in self.graph.node if value in n.input]

    def producer(self, value: str):
        return next((n for n in self.graph.node if value in n.output), None)

    def is_graph_output(self, value: str) -> bool:
        return any(o.name == value for o in self.graph.output)

    def attribute(self, node, name: str, default):
        for a in node.attribute:
            if a.name == name:
                return helper.get_attribute_value(a)
        return default


# --- pre-processing: ORT's basic fusions --------------------------------------------------------

def fold_batch_norms(m: Model) -> None:
    for bn in [n for n in m.graph.node if n.op_type == "BatchNormalization"]:
        conv = m.producer(bn.input[0])
        if conv is None or conv.op_type != "Conv" or len(m.readers(conv.output[0])) != 1:
            continue
        scale, bias, mean, var = (m.constant(name) for name in bn.input[1:5])
        w = m.constant(conv.input[1])
        if any(x is None for x in (scale, bias, mean, var, w)):
            continue
        factor = scale / np.sqrt(var + m.attribute(bn, "epsilon", 1e-5))
        b = m.constant(conv.input[2]) if len(conv.input) > 2 else np.zeros(w.shape[0], np.float32)
        m.set_constant(conv.input[1], (w * factor.reshape(-1, 1, 1, 1)).astype(np.float32))
        bias_name = conv.input[2] if len(conv.input) > 2 else conv.input[1] + "_bias"
        m.set_constant(bias_name, ((b - mean) * factor + bias).astype(np.float32))
        if len(conv.input) < 3:
            conv.input.append(bias_name)
        conv.output[0] = bn.output[0]
        m.graph.node.remove(bn)
        for name in bn.input[1:5]:
            if not m.readers(name):
                m.graph.initializer.remove(m.initializers.pop(name))


def fold_constant_adds(m: Model) -> None:
    for add in [n for n in m.graph.node if n.op_type == "Add"]:
        constant_side = [i for i, name in enumerate(add.input) if name in m.initializers]
        if len(constant_side) != 1:
            continue
        addend = m.constant(add.input[constant_side[0]])
        node = m.producer(add.input[1 - constant_side[0]])
        if node is None or len(m.readers(node.output[0])) != 1:
            continue
        if node.op_type == "Conv" and m.constant(node.input[1]) is not None:
            channels = m.constant(node.input[1]).shape[0]
            if addend.size != channels or addend.shape[-2:] not in ((), (1, 1)) and addend.ndim > 1:
                continue
            bias = m.constant(node.input[2]) if len(node.input) > 2 else 0
            name = node.input[2] if len(node.input) > 2 else node.name + "_bias"
            m.set_constant(name, (bias + addend.reshape(-1)).astype(np.float32))
            if len(node.input) < 3:
                node.input.append(name)
        elif node.op_type == "MatMul" and m.constant(node.input[1]) is not None \
                and m.constant(node.input[1]).ndim == 2 \
                and addend.size == m.constant(node.input[1]).shape[1]:
            name = node.name + "_bias" if node.name else node.output[0] + "_bias"
            m.set_constant(name, addend.reshape(-1).astype(np.float32))
            node.op_type = "Gemm"
            node.input.append(name)
        else:
            continue
        node.output[0] = add.output[0]
        m.graph.node.remove(add)


# --- where the Q/DQ pairs go ---------------------------------------------------------------------

def quantization_points(m: Model) -> tuple[list, dict]:
    """The float tensors to quantize in graph order, and the tensors that share another's range."""
    points: list = []
    shares: dict = {}

    def add(value: str) -> None:
        if value and value not in m.initializers and value not in points:
            points.append(value)

    for node in m.graph.node:
        if node.op_type not in QUANTIZED_OPS:
            continue
        for value in node.input[:1] if node.op_type in WEIGHTED_OPS else node.input:
            add(value)
        out = node.output[0]
        readers = m.readers(out)
        if node.op_type != "MaxPool" and len(readers) == 1 \
                and readers[0].op_type in RANGE_ACTIVATIONS and not m.is_graph_output(out):
            out = readers[0].output[0]
        add(out)
    for value in points:
        producer = m.producer(value)
        if producer is not None and producer.op_type in SAME_RANGE_OPS \
                and producer.input[0] in points:
            shares[value] = shares.get(producer.input[0], producer.input[0])
    return points, shares


# --- calibration on backplane run ---------------------------------------------------------------

def calibrate(m: Model, points: list, samples: np.ndarray, backplane: str) -> dict:
    """min and max of each point over the samples, from one float run per sample or batch."""
    inferred = onnx.shape_inference.infer_shapes(m.model)
    types = {v.name: v for v in list(inferred.graph.value_info) + list(inferred.graph.output)}
    augmented = onnx.ModelProto()
    augmented.CopyFrom(m.model)
    existing = [o.name for o in augmented.graph.output]
    for p in points:
        if p not in existing:
            augmented.graph.output.append(types.get(p) or helper.make_tensor_value_info(
                p, TensorProto.FLOAT, None))
    names = [o.name for o in augmented.graph.output]
    graph_input = next(i for i in m.graph.input if i.name not in m.initializers)
    first_dim = graph_input.type.tensor_type.shape.dim[0]
    batches = [samples] if first_dim.dim_param or not first_dim.dim_value else \
        [samples[i:i + first_dim.dim_value] for i in range(0, len(samples), first_dim.dim_value)]
    ranges = {p: [np.inf, -np.inf] for p in points}
    with tempfile.TemporaryDirectory() as work:
        work = pathlib.Path(work)
        onnx.save(augmented, work / "augmented.onnx")
        for batch in batches:
            onnx.save_tensor(numpy_helper.from_array(batch.astype(np.float32), graph_input.name),
                             str(work / "input.pb"))
            subprocess.run([backplane, "run", str(work / "augmented.onnx"), "--prefer", "CpuRef",
                            "--input", str(work / "input.pb"), "--output-dir", str(work / "out")],
                           check=True, stdout=subprocess.DEVNULL)
            for i, name in enumerate(names):
                if name in ranges:
                    values = numpy_helper.to_array(onnx.load_tensor(str(work / "out" /
                                                                        f"output_{i}.pb")))
                    ranges[name][0] = min(ranges[name][0], float(values.min()))
                    ranges[name][1] = max(ranges[name][1], float(values.max()))
    return ranges


def activation_parameters(low: float, high: float, unsigned: bool) -> tuple[np.float32, int]:
    qmin, qmax = (0, 255) if unsigned else (-128, 127)
    low, high = min(low, 0.0), max(high, 0.0)
    scale = np.float32((high - low) / (qmax - qmin)) if high > low else np.float32(1.0)
    zero_point = int(np.clip(np.round(qmin - low / scale), qmin, qmax))
    return scale, zero_point


# --- the rewrite ---------------------------------------------------------------------------------

def insert_pairs(m: Model, parameters: dict, unsigned: bool) -> None:
    zp_type = np.uint8 if unsigned else np.int8
    new_nodes = []
    for value, (scale, zero_point) in parameters.items():
        m.set_constant(value + "_scale", np.array(scale, np.float32))
        m.set_constant(value + "_zero_point", np.array(zero_point, zp_type))
        source = value
        readers = m.readers(value)
        if m.is_graph_output(value):  # the graph's output keeps its name: on the DequantizeLinear
            source = value + "_float"
            m.producer(value).output[0] = source
            dequantized = value
        else:
            dequantized = value + "_dequantized"
            for node in readers:
                for i, name in enumerate(node.input):
                    if name == value:
                        node.input[i] = dequantized
        args = [value + "_scale", value + "_zero_point"]
        new_nodes.append((source, [
            helper.make_node("QuantizeLinear", [source] + args, [value + "_quantized"],
                             name=value + "_QuantizeLinear"),
            helper.make_node("DequantizeLinear", [value + "_quantized"] + args, [dequantized],
                             name=value + "_DequantizeLinear")]))
    # Each pair right after what produces its tensor (graph inputs: at the front): topological.
    nodes = list(m.graph.node)
    for source, pair in new_nodes:
        producer = m.producer(source)
        at = nodes.index(producer) + 1 if producer is not None else 0
        nodes[at:at] = pair
    del m.graph.node[:]
    m.graph.node.extend(nodes)


def quantize_weights(m: Model, parameters: dict) -> None:
    dequantizers = []
    for node in m.graph.node:
        if node.op_type not in WEIGHTED_OPS or len(node.input) < 2:
            continue
        w = m.constant(node.input[1])
        if w is None or (node.op_type == "MatMul" and w.ndim != 2):
            continue
        if node.op_type == "Conv":
            axis = 0
        elif node.op_type == "Gemm":
            axis = 0 if m.attribute(node, "transB", 0) else 1
        else:
            axis = 1
        moved = np.moveaxis(w, axis, 0).reshape(w.shape[axis], -1)
        peak = np.abs(moved).max(axis=1)
        w_scale = np.where(peak > 0, peak / 127, 1).astype(np.float32)
        shape = [1] * w.ndim
        shape[axis] = -1
        q = np.clip(np.round(w / w_scale.reshape(shape)), -127, 127).astype(np.int8)
        name = node.input[1]
        dequantizers.append(per_axis_constant(m, name, q, w_scale, np.int8, axis))
        bias_index = 2
        x = node.input[0].removesuffix("_dequantized")
        if len(node.input) > bias_index and x in parameters \
                and m.constant(node.input[bias_index]) is not None:
            b = m.constant(node.input[bias_index])
            if node.op_type == "Gemm" and m.attribute(node, "beta", 1.0) != 1.0:
                continue
            b_scale = (parameters[x][0] * w_scale).astype(np.float32)
            qb = np.round(b.reshape(-1) / b_scale).astype(np.int32)
            dequantizers.append(per_axis_constant(m, node.input[bias_index], qb, b_scale,
                                                  np.int32, 0))
    nodes = dequantizers + list(m.graph.node)
    del m.graph.node[:]
    m.graph.node.extend(nodes)


def per_axis_constant(m: Model, name: str, q: np.ndarray, scale: np.ndarray, zp_type,
                      axis: int) -> onnx.NodeProto:
    """Replaces the float initializer `name` by q, scale and zero point, and the node that
    dequantizes them back into `name`."""
    m.graph.initializer.remove(m.initializers.pop(name))
    m.set_constant(name + "_quantized", q)
    m.set_constant(name + "_scale", scale)
    m.set_constant(name + "_zero_point", np.zeros(scale.shape, zp_type))
    return helper.make_node(
        "DequantizeLinear", [name + "_quantized", name + "_scale", name + "_zero_point"], [name],
        name=name + "_DequantizeLinear", axis=axis)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("float_model", type=pathlib.Path)
    parser.add_argument("output", type=pathlib.Path)
    parser.add_argument("--backplane", required=True, help="the backplane executable")
    parser.add_argument("--activations", choices=("uint8", "int8"), default="uint8")
    parser.add_argument("--calibration", type=pathlib.Path, help=".npy of input samples")
    parser.add_argument("--samples", type=int, default=64)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--uniform", type=float, nargs=2, metavar=("LOW", "HIGH"),
                        help="generate samples uniform in [LOW, HIGH) instead of standard normal")
    args = parser.parse_args()

    model = onnx.load(args.float_model)
    opset = next(o for o in model.opset_import if o.domain in ("", "ai.onnx"))
    if opset.version < 13:
        model = onnx.version_converter.convert_version(model, 13)
    m = Model(model)
    fold_batch_norms(m)
    fold_constant_adds(m)
    points, shares = quantization_points(m)

    graph_input = next(i for i in m.graph.input if i.name not in m.initializers)
    if args.calibration:
        samples = np.load(args.calibration).astype(np.float32)
    else:
        dims = [d.dim_value or 1 for d in graph_input.type.tensor_type.shape.dim][1:]
        rng = np.random.default_rng(args.seed)
        shape = [args.samples] + dims
        samples = (rng.uniform(*args.uniform, size=shape) if args.uniform else
                   rng.standard_normal(shape)).astype(np.float32)
    ranges = calibrate(m, points, samples, args.backplane)
    unsigned = args.activations == "uint8"
    parameters = {p: activation_parameters(*ranges[p], unsigned) for p in points}
    for value, source in shares.items():
        parameters[value] = parameters[source]

    insert_pairs(m, parameters, unsigned)
    quantize_weights(m, parameters)
    model.producer_name = "backplane scripts/quantize_qdq.py"
    onnx.checker.check_model(model, full_check=True)
    onnx.save(model, args.output)
    print(f"{args.output}: {len(points)} activations quantized ({args.activations}), "
          f"{sum(n.op_type in WEIGHTED_OPS for n in m.graph.node)} weighted layers",
          file=sys.stderr)


if __name__ == "__main__":
    main()
