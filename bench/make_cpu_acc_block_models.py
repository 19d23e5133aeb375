#!/usr/bin/python3
"""Writes the block models of docs/performance.md's "CpuAcc: residual fusion, new ops, two threads"
into OUT_DIR (a build-tree directory, never the repo); backplane_bench_compare runs them.

    /usr/bin/python3 bench/make_cpu_acc_block_models.py OUT_DIR

Debian's python3 (python3-onnx). Fixed shapes (batch in the file name), opset 13, seeded weights,
the layer structure of torchvision's blocks as exported (Conv, BatchNormalization, activation):

  resnet_b1/b4      [B,3,64,64] -> Conv 7x7 s2 (16) + BN + Relu -> MaxPool 3 s2 -> basic block 16
                    -> basic block 32 s2 with a projection shortcut -> GlobalAveragePool -> Flatten
                    -> Gemm 32x10                         (residual Add after a Conv+BN: 2 per model)
  mobilenet_b1/b4   [B,3,64,64] -> Conv 3x3 s2 (16) + BN + Clip(0,6) -> 2 inverted residual blocks
                    (1x1 expand x4 + BN + Clip, depthwise 3x3 + BN + Clip, 1x1 project + BN, Add)
                    -> GlobalAveragePool -> Flatten -> Gemm 16x10          (Relu6 exported as Clip)
  squeezenet_b1/b4  [B,3,64,64] -> Conv 3x3 s2 (32) + Relu -> MaxPool 3 s2 -> 2 Fire modules
                    (squeeze 1x1 + Relu, expand 1x1 and 3x3 + Relu, Concat) -> Dropout -> Conv 1x1
                    (10) + Relu -> GlobalAveragePool -> Flatten           (Dropout, Concat)
"""
import pathlib
import sys

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

SEED = 20261202


class Model:
    def __init__(self, name, batch):
        self.rng = np.random.default_rng(SEED)
        self.name, self.batch = name, batch
        self.nodes, self.inits, self.count = [], [], 0

    def fresh(self, stem):
        self.count += 1
        return f"{stem}{self.count}"

    def const(self, stem, array):
        name = self.fresh(stem)
        self.inits.append(numpy_helper.from_array(np.asarray(array), name))
        return name

    def node(self, op, inputs, **attributes):
        out = self.fresh(op.lower())
        self.nodes.append(helper.make_node(op, inputs, [out], name=out, **attributes))
        return out

    def conv_bn(self, x, c_in, c_out, k, stride=1, group=1):
        w = self.const("w", self.rng.normal(0, (2.0 / (k * k * c_in / group)) ** 0.5,
                                            (c_out, c_in // group, k, k)).astype(np.float32))
        y = self.node("Conv", [x, w], kernel_shape=[k, k], strides=[stride, stride],
                      pads=[k // 2] * 4, group=group)
        params = [self.rng.uniform(0.5, 1.5, c_out), self.rng.uniform(-0.2, 0.2, c_out),
                  self.rng.uniform(-0.2, 0.2, c_out), self.rng.uniform(0.5, 1.5, c_out)]
        names = [self.const("bn", p.astype(np.float32)) for p in params]
        return self.node("BatchNormalization", [y] + names)

    def relu6(self, x):
        return self.node("Clip", [x, self.const("lo", np.float32(0)), self.const("hi", np.float32(6))])

    def head(self, x, c_in, classes=10):
        y = self.node("Flatten", [self.node("GlobalAveragePool", [x])])
        w = self.const("fc", self.rng.normal(0, 0.1, (classes, c_in)).astype(np.float32))
        b = self.const("fcb", np.zeros(classes, np.float32))
        return self.node("Gemm", [y, w, b], transB=1)

    def save(self, out_dir, output, shape_out):
        graph = helper.make_graph(
            self.nodes, self.name,
            [helper.make_tensor_value_info("x", TensorProto.FLOAT, [self.batch, 3, 64, 64])],
            [helper.make_tensor_value_info(output, TensorProto.FLOAT, shape_out)], self.inits)
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
        model.ir_version = 8
        onnx.checker.check_model(model)
        onnx.save(model, str(out_dir / f"{self.name}_b{self.batch}.onnx"))


def basic_block(m, x, c_in, c_out, stride):
    y = m.node("Relu", [m.conv_bn(x, c_in, c_out, 3, stride)])
    y = m.conv_bn(y, c_out, c_out, 3)
    shortcut = x if stride == 1 and c_in == c_out else m.conv_bn(x, c_in, c_out, 1, stride)
    return m.node("Relu", [m.node("Add", [y, shortcut])])


def resnet(batch, out_dir):
    m = Model("resnet", batch)
    y = m.node("Relu", [m.conv_bn("x", 3, 16, 7, 2)])
    y = m.node("MaxPool", [y], kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1])
    y = basic_block(m, y, 16, 16, 1)
    y = basic_block(m, y, 16, 32, 2)
    m.save(out_dir, m.head(y, 32), [batch, 10])


def inverted_residual(m, x, c):
    y = m.relu6(m.conv_bn(x, c, 4 * c, 1))
    y = m.relu6(m.conv_bn(y, 4 * c, 4 * c, 3, 1, group=4 * c))
    y = m.conv_bn(y, 4 * c, c, 1)
    return m.node("Add", [y, x])


def mobilenet(batch, out_dir):
    m = Model("mobilenet", batch)
    y = m.relu6(m.conv_bn("x", 3, 16, 3, 2))
    y = inverted_residual(m, y, 16)
    y = inverted_residual(m, y, 16)
    m.save(out_dir, m.head(y, 16), [batch, 10])


def fire(m, x, c_in, squeeze, expand):
    def conv_relu(v, ci, co, k):
        w = m.const("w", m.rng.normal(0, (2.0 / (k * k * ci)) ** 0.5, (co, ci, k, k)).astype(np.float32))
        b = m.const("b", np.zeros(co, np.float32))
        return m.node("Relu", [m.node("Conv", [v, w, b], kernel_shape=[k, k], pads=[k // 2] * 4)])
    s = conv_relu(x, c_in, squeeze, 1)
    return m.node("Concat", [conv_relu(s, squeeze, expand, 1), conv_relu(s, squeeze, expand, 3)], axis=1)


def squeezenet(batch, out_dir):
    m = Model("squeezenet", batch)
    w = m.const("w", m.rng.normal(0, 0.2, (32, 3, 3, 3)).astype(np.float32))
    y = m.node("Relu", [m.node("Conv", ["x", w], kernel_shape=[3, 3], strides=[2, 2], pads=[1] * 4)])
    y = m.node("MaxPool", [y], kernel_shape=[3, 3], strides=[2, 2])
    y = fire(m, y, 32, 8, 32)
    y = fire(m, y, 64, 8, 32)
    y = m.node("Dropout", [y])
    w = m.const("w", m.rng.normal(0, 0.1, (10, 64, 1, 1)).astype(np.float32))
    y = m.node("Relu", [m.node("Conv", [y, w], kernel_shape=[1, 1])])
    y = m.node("Flatten", [m.node("GlobalAveragePool", [y])])
    m.save(out_dir, y, [batch, 10])


def main():
    out_dir = pathlib.Path(sys.argv[1])
    out_dir.mkdir(parents=True, exist_ok=True)
    for batch in (1, 4):
        resnet(batch, out_dir)
        mobilenet(batch, out_dir)
        squeezenet(batch, out_dir)


if __name__ == "__main__":
    main()
