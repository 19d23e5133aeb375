#!/usr/bin/python3
"""Writes the models of bench/ort_compare.sh, and the inputs both sides read, into a build-tree
directory (never the repo).

    /usr/bin/python3 bench/make_compare_models.py OUT_DIR
    /usr/bin/python3 bench/make_compare_models.py --input MODEL.onnx BATCH OUT_STEM

Debian's python3 (package python3-onnx, onnx 1.12); the `python3` first on PATH may lack onnx.
Opset 13 / IR 8, seeded random weights (the numbers are meaningless, the work is not). Every model
passes onnx.checker with full shape inference before it is written.

Fixed shapes (the batch is part of the file):

  mlp_b1.onnx, mlp_b64.onnx     input [B,784] -> Gemm 784x512 + Relu -> Gemm 512x512 + Relu
                                -> Gemm 512x10 -> [B,10]     (3 Gemm, 2 Relu: 5 layers)
  lenet_b1.onnx, lenet_b64.onnx input [B,1,28,28] -> Conv 1->6 5x5 pad 2 + Relu + MaxPool 2x2
                                -> Conv 6->16 5x5 + Relu + MaxPool 2x2 -> Flatten (400)
                                -> Gemm 400x120 + Relu -> Gemm 120x84 + Relu -> Gemm 84x10
                                (LeNet-5's shape: 2 Conv, 2 MaxPool, 3 Gemm; 12 layers)
  residual_block.onnx           input [2,16,32,32] -> Conv 3x3 + BN + Relu -> depthwise Conv 3x3
                                dilation 2 + BN + Relu -> Conv 1x1 + BN -> Add(input) -> Relu
  identity.onnx                 input [1] -> Identity -> [1]: what a call costs the ORT Node
                                binding when the model does nothing (subtracted from ORT's times)

Symbolic batch (the first dimension is "N", as exporters write it; the same weights as above for
the MLP and the LeNet, so that a fixed and a symbolic file compute the same function):

  mlp_n.onnx, lenet_n.onnx      the models above with input [N,...]
  resnet_n.onnx                 ResNet-like, torchvision's resnet18 structure, narrower and shorter
                                [N,3,64,64]: stem Conv 7x7 s2 pad 3 (no bias) + BN + Relu +
                                MaxPool 3x3 s2 pad 1; stage 1: 2 basic blocks at 32 channels
                                (Conv 3x3 + BN + Relu, Conv 3x3 + BN, Add(shortcut), Relu); stage
                                2: 2 basic blocks at 64 channels, the first with stride 2 and the
                                projection shortcut (Conv 1x1 s2 + BN); GlobalAveragePool, Flatten,
                                Gemm 64->10. 37 layers.
  mobilenetv2_n.onnx            MobileNetV2-like, torchvision's mobilenet_v2 structure, narrower
                                [N,3,96,96]: stem Conv 3x3 s2 + BN + Relu6; inverted residual
                                blocks (t, c, s) = (1, 8, 1), (6, 12, 2), (6, 12, 1), (6, 16, 2),
                                (6, 16, 1): 1x1 expand Conv + BN + Relu6 (not for t = 1),
                                depthwise 3x3 Conv + BN + Relu6, 1x1 project Conv + BN, residual Add
                                when the stride is 1 and the channels stay; last Conv 1x1 16->128 +
                                BN + Relu6; GlobalAveragePool, Flatten, Gemm 128->10. Relu6 is
                                Clip(x, min, max) with min 0 and max 6 as initializer inputs (opset
                                13), as torch.onnx exports it. 48 layers.
  squeezenet_n.onnx             SqueezeNet-like, torchvision's squeezenet1_1 structure, channels
                                halved [N,3,66,66]: Conv 3x3 s2 3->32 + Relu, MaxPool 3x3 s2
                                ceil_mode, Fire(8, 32, 32) x2, MaxPool ceil_mode, Fire(16, 64, 64)
                                x2, MaxPool ceil_mode, Fire(24, 96, 96) x2, Fire(32, 128, 128) x2
                                (Fire(s, e1, e3): squeeze 1x1 + Relu, expand 1x1 + Relu and expand
                                3x3 pad 1 + Relu, Concat on channels), Dropout 0.5, Conv 1x1
                                256->10 + Relu, GlobalAveragePool, Flatten. 66 layers.
  resnet_bottleneck_n.onnx      ResNet-50-like, torchvision's Bottleneck (v1.5: the stride on the
                                3x3) [N,3,64,64]: the stem above (32 channels); bottlenecks
                                (width 16, out 64) x2, the first with a projection shortcut;
                                (width 32, out 128, stride 2) x2; GlobalAveragePool, Gemm 128->10.
  mobilenetv3_n.onnx            MobileNetV3-like, torchvision's mobilenet_v3_small's first five
                                blocks [N,3,96,96] (opset 14 for HardSwish): expand 1x1, depthwise
                                3x3/5x5, squeeze-and-excite (GlobalAveragePool, 1x1 + Relu, 1x1 +
                                HardSigmoid, broadcast Mul), project 1x1, residual Add; Relu or
                                HardSwish; last Conv 1x1 + HardSwish, Gemm + HardSwish, Gemm.
  inception_n.onnx              Inception-like, torchvision's InceptionA with a quarter of the
                                channels [N,3,64,64]: two stem convolutions and a max pool, then 2
                                blocks of four branches (1x1 | 1x1 -> 5x5 | 1x1 -> 3x3 -> 3x3 |
                                AveragePool 3x3 count_include_pad=0 -> 1x1) joined by Concat.
  densenet_n.onnx               DenseNet-like, torchvision's dense layers (growth 12) [N,3,64,64]:
                                stem 7x7 + max pool; 2 dense blocks of 4 layers (BN, Relu, 1x1,
                                BN, Relu, 3x3, Concat with everything before) with a transition
                                (BN, Relu, 1x1 halving the channels, AveragePool 2x2) between.

Why these input sizes rather than ImageNet's 3x224x224: on the 2 shared cores one run of a
224x224 model takes tens of milliseconds, so a benchmark of a few seconds per case would time a
handful of calls. 64x64 and 96x96 keep one batch-1 run between about 0.1 and 5 ms on both sides
while every layer type, stride and channel change of the real block structure stays.
SqueezeNet's 66x66 is chosen so that every MaxPool has an input whose (size - 3) is odd: there,
ceil_mode changes the output size (32 -> 16 -> 8 -> 4 rows instead of 15 -> 7 -> 3), so an
implementation that ignores it gives the wrong shape and fails the output check.

--input writes OUT_STEM.pb (a TensorProto named after the model's first input, as
`backplane run --input` reads it), OUT_STEM.f32 (the same values, raw little-endian float32) and
OUT_STEM.json ({"name", "dims"}; what bench/ort_compare.mjs reads): the input's shape with a
symbolic dimension set to BATCH (a fixed first dimension must equal BATCH), values uniform in
[-1, 1) from a generator seeded by OUT_STEM's file name. Both sides read these files, so they
compute on exactly the same float32 values.

The output is deterministic for given numpy and onnx versions.
"""
import json
import pathlib
import sys
import zlib

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

SEED = 20261130
IR_VERSION, OPSET = 8, 13
BATCH = "N"  # the symbolic batch dimension's name


def save(graph: onnx.GraphProto, path: pathlib.Path, opset: int = OPSET) -> None:
    model = helper.make_model(
        graph,
        producer_name="backplane bench/make_compare_models.py",
        opset_imports=[helper.make_opsetid("", opset)],
    )
    model.ir_version = IR_VERSION
    # full_check runs shape inference too: a wrong attribute (a pad, a channel count) fails here,
    # not as a confusing error in one of the two runtimes.
    onnx.checker.check_model(model, full_check=True)
    onnx.save(model, path)


class Graph:
    """Collects the nodes and seeded initializers of one model; names come from the layer names."""

    def __init__(self, seed: int):
        self.rng = np.random.default_rng(seed)
        self.nodes: list[onnx.NodeProto] = []
        self.initializers: list[onnx.TensorProto] = []

    def constant(self, name: str, array: np.ndarray) -> str:
        self.initializers.append(numpy_helper.from_array(array.astype(np.float32), name))
        return name

    def node(self, op: str, inputs: list[str], name: str, **attributes) -> str:
        self.nodes.append(helper.make_node(op, inputs, [name], name=name, **attributes))
        return name

    def gemm(self, x: str, name: str, inputs: int, outputs: int) -> str:
        w = self.rng.standard_normal((inputs, outputs)) / np.sqrt(inputs)
        b = 0.1 * self.rng.standard_normal(outputs)
        return self.node("Gemm", [x, self.constant(f"{name}_w", w),
                                  self.constant(f"{name}_b", b)], name)

    def conv(self, x: str, name: str, cin: int, cout: int, k: int, stride: int = 1,
             pad: int = 0, group: int = 1, dilation: int = 1, bias: bool = True) -> str:
        w = self.rng.standard_normal((cout, cin // group, k, k)) / np.sqrt(cin // group * k * k)
        inputs = [x, self.constant(f"{name}_w", w)]
        if bias:
            inputs.append(self.constant(f"{name}_b", 0.1 * self.rng.standard_normal(cout)))
        return self.node("Conv", inputs, name, kernel_shape=[k, k], strides=[stride, stride],
                         pads=[pad] * 4, group=group, dilations=[dilation, dilation])

    def batch_norm(self, x: str, name: str, channels: int) -> str:
        # Statistics as a trained network has them: scale near 1, small shifts, variance near 1
        # (never near 0, which would only amplify the float rounding both sides differ in).
        scale = 1 + 0.1 * self.rng.standard_normal(channels)
        bias = 0.1 * self.rng.standard_normal(channels)
        mean = 0.1 * self.rng.standard_normal(channels)
        var = 1 + 0.2 * self.rng.random(channels)
        return self.node("BatchNormalization",
                         [x] + [self.constant(f"{name}_{part}", value) for part, value in
                                (("scale", scale), ("bias", bias), ("mean", mean), ("var", var))],
                         name, epsilon=1e-5)

    def conv_bn(self, x: str, name: str, cin: int, cout: int, k: int, stride: int = 1,
                group: int = 1, dilation: int = 1) -> str:
        """Conv without bias + BatchNormalization: how torchvision's blocks are built."""
        pad = dilation * (k - 1) // 2
        c = self.conv(x, name, cin, cout, k, stride, pad, group, dilation, bias=False)
        return self.batch_norm(c, f"{name}_bn", cout)

    def relu6(self, x: str, name: str) -> str:
        # torch.onnx (opset >= 11) exports ReLU6 as Clip with min and max as inputs.
        if not any(init.name == "relu6_min" for init in self.initializers):
            self.constant("relu6_min", np.array(0.0))
            self.constant("relu6_max", np.array(6.0))
        return self.node("Clip", [x, "relu6_min", "relu6_max"], name)

    def relu(self, x: str, name: str) -> str:
        return self.node("Relu", [x], name)

    def global_pool_flatten(self, x: str) -> str:
        return self.node("Flatten", [self.node("GlobalAveragePool", [x], "avgpool")], "flatten",
                         axis=1)

    def make(self, name: str, x_shape: list, y_shape: list) -> onnx.GraphProto:
        """The graph x -> ... -> y, where the last node added computes y."""
        self.nodes[-1].output[0] = "y"
        return helper.make_graph(
            self.nodes, name,
            inputs=[helper.make_tensor_value_info("x", TensorProto.FLOAT, x_shape)],
            outputs=[helper.make_tensor_value_info("y", TensorProto.FLOAT, y_shape)],
            initializer=self.initializers)


def mlp(batch) -> onnx.GraphProto:
    g = Graph(SEED)
    h = g.node("Relu", [g.gemm("x", "fc1", 784, 512)], "relu1")
    h = g.node("Relu", [g.gemm(h, "fc2", 512, 512)], "relu2")
    g.gemm(h, "fc3", 512, 10)
    return g.make(f"mlp_b{batch}", [batch, 784], [batch, 10])


def lenet(batch) -> onnx.GraphProto:
    g = Graph(SEED + 1)
    pool = dict(kernel_shape=[2, 2], strides=[2, 2])
    h = g.node("Relu", [g.conv("x", "conv1", 1, 6, 5, pad=2)], "relu1")
    h = g.node("MaxPool", [h], "pool1", **pool)
    h = g.node("Relu", [g.conv(h, "conv2", 6, 16, 5)], "relu2")
    h = g.node("MaxPool", [h], "pool2", **pool)
    h = g.node("Flatten", [h], "flatten", axis=1)
    h = g.node("Relu", [g.gemm(h, "fc1", 400, 120)], "relu3")
    h = g.node("Relu", [g.gemm(h, "fc2", 120, 84)], "relu4")
    g.gemm(h, "fc3", 84, 10)
    return g.make(f"lenet_b{batch}", [batch, 1, 28, 28], [batch, 10])


def residual_block() -> onnx.GraphProto:
    g = Graph(SEED + 2)
    h = g.node("Relu", [g.conv_bn("x", "conv1", 16, 16, 3)], "relu1")
    h = g.node("Relu", [g.conv_bn(h, "dwconv", 16, 16, 3, group=16, dilation=2)], "relu2")
    h = g.conv_bn(h, "project", 16, 16, 1)
    g.node("Relu", [g.node("Add", [h, "x"], "add")], "relu3")
    return g.make("residual_block", [2, 16, 32, 32], [2, 16, 32, 32])


def resnet() -> onnx.GraphProto:
    g = Graph(SEED + 3)
    h = g.node("Relu", [g.conv_bn("x", "stem", 3, 32, 7, stride=2)], "stem_relu")
    h = g.node("MaxPool", [h], "stem_pool", kernel_shape=[3, 3], strides=[2, 2], pads=[1] * 4)

    def basic_block(x: str, name: str, cin: int, cout: int, stride: int) -> str:
        b = g.node("Relu", [g.conv_bn(x, f"{name}_conv1", cin, cout, 3, stride)], f"{name}_relu1")
        b = g.conv_bn(b, f"{name}_conv2", cout, cout, 3)
        shortcut = x if stride == 1 and cin == cout else \
            g.conv_bn(x, f"{name}_downsample", cin, cout, 1, stride)
        return g.node("Relu", [g.node("Add", [b, shortcut], f"{name}_add")], f"{name}_relu2")

    h = basic_block(h, "layer1_0", 32, 32, 1)
    h = basic_block(h, "layer1_1", 32, 32, 1)
    h = basic_block(h, "layer2_0", 32, 64, 2)  # the projection shortcut
    h = basic_block(h, "layer2_1", 64, 64, 1)
    h = g.node("Flatten", [g.node("GlobalAveragePool", [h], "avgpool")], "flatten", axis=1)
    g.gemm(h, "fc", 64, 10)
    return g.make("resnet_n", [BATCH, 3, 64, 64], [BATCH, 10])


def mobilenetv2() -> onnx.GraphProto:
    g = Graph(SEED + 4)
    h = g.relu6(g.conv_bn("x", "stem", 3, 16, 3, stride=2), "stem_relu6")
    channels = 16
    for index, (expand, out, stride) in enumerate(
            [(1, 8, 1), (6, 12, 2), (6, 12, 1), (6, 16, 2), (6, 16, 1)]):
        name = f"block{index}"
        hidden = channels * expand
        b = h
        if expand != 1:
            b = g.relu6(g.conv_bn(b, f"{name}_expand", channels, hidden, 1), f"{name}_relu6a")
        b = g.relu6(g.conv_bn(b, f"{name}_dw", hidden, hidden, 3, stride, group=hidden),
                    f"{name}_relu6b")
        b = g.conv_bn(b, f"{name}_project", hidden, out, 1)
        h = g.node("Add", [h, b], f"{name}_add") if stride == 1 and channels == out else b
        channels = out
    h = g.relu6(g.conv_bn(h, "last", channels, 128, 1), "last_relu6")
    h = g.node("Flatten", [g.node("GlobalAveragePool", [h], "avgpool")], "flatten", axis=1)
    g.gemm(h, "classifier", 128, 10)
    return g.make("mobilenetv2_n", [BATCH, 3, 96, 96], [BATCH, 10])


def squeezenet() -> onnx.GraphProto:
    g = Graph(SEED + 5)
    pool = dict(kernel_shape=[3, 3], strides=[2, 2], ceil_mode=1)

    def fire(x: str, name: str, cin: int, squeeze: int, expand: int) -> str:
        s = g.node("Relu", [g.conv(x, f"{name}_squeeze", cin, squeeze, 1)], f"{name}_squeeze_relu")
        e1 = g.node("Relu", [g.conv(s, f"{name}_expand1x1", squeeze, expand, 1)],
                    f"{name}_expand1x1_relu")
        e3 = g.node("Relu", [g.conv(s, f"{name}_expand3x3", squeeze, expand, 3, pad=1)],
                    f"{name}_expand3x3_relu")
        return g.node("Concat", [e1, e3], f"{name}_concat", axis=1)

    h = g.node("Relu", [g.conv("x", "conv1", 3, 32, 3, stride=2)], "relu1")
    h = g.node("MaxPool", [h], "pool1", **pool)
    h = fire(h, "fire2", 32, 8, 32)
    h = fire(h, "fire3", 64, 8, 32)
    h = g.node("MaxPool", [h], "pool3", **pool)
    h = fire(h, "fire4", 64, 16, 64)
    h = fire(h, "fire5", 128, 16, 64)
    h = g.node("MaxPool", [h], "pool5", **pool)
    h = fire(h, "fire6", 128, 24, 96)
    h = fire(h, "fire7", 192, 24, 96)
    h = fire(h, "fire8", 192, 32, 128)
    h = fire(h, "fire9", 256, 32, 128)
    h = g.node("Dropout", [h], "dropout")  # ratio 0.5 by default; inference: the identity
    h = g.node("Relu", [g.conv(h, "classifier_conv", 256, 10, 1)], "classifier_relu")
    g.node("Flatten", [g.node("GlobalAveragePool", [h], "avgpool")], "flatten", axis=1)
    return g.make("squeezenet_n", [BATCH, 3, 66, 66], [BATCH, 10])


def resnet_bottleneck() -> onnx.GraphProto:
    g = Graph(SEED + 6)
    h = g.relu(g.conv_bn("x", "stem", 3, 32, 7, stride=2), "stem_relu")
    h = g.node("MaxPool", [h], "stem_pool", kernel_shape=[3, 3], strides=[2, 2], pads=[1] * 4)

    def bottleneck(x: str, name: str, cin: int, width: int, stride: int) -> str:
        # torchvision's ResNet v1.5: the stride is on the 3x3 convolution; expansion 4.
        cout = 4 * width
        b = g.relu(g.conv_bn(x, f"{name}_conv1", cin, width, 1), f"{name}_relu1")
        b = g.relu(g.conv_bn(b, f"{name}_conv2", width, width, 3, stride), f"{name}_relu2")
        b = g.conv_bn(b, f"{name}_conv3", width, cout, 1)
        shortcut = x if stride == 1 and cin == cout else \
            g.conv_bn(x, f"{name}_downsample", cin, cout, 1, stride)
        return g.relu(g.node("Add", [b, shortcut], f"{name}_add"), f"{name}_relu3")

    h = bottleneck(h, "layer1_0", 32, 16, 1)
    h = bottleneck(h, "layer1_1", 64, 16, 1)
    h = bottleneck(h, "layer2_0", 64, 32, 2)
    h = bottleneck(h, "layer2_1", 128, 32, 1)
    g.gemm(g.global_pool_flatten(h), "fc", 128, 10)
    return g.make("resnet_bottleneck_n", [BATCH, 3, 64, 64], [BATCH, 10])


def mobilenetv3() -> onnx.GraphProto:
    g = Graph(SEED + 7)

    def activation(x: str, name: str, kind: str) -> str:
        return g.relu(x, name) if kind == "RE" else g.node("HardSwish", [x], name)

    def squeeze_excite(x: str, name: str, channels: int) -> str:
        squeezed = max(8, channels // 4)
        s = g.node("GlobalAveragePool", [x], f"{name}_pool")
        s = g.relu(g.conv(s, f"{name}_fc1", channels, squeezed, 1), f"{name}_relu")
        s = g.node("HardSigmoid", [g.conv(s, f"{name}_fc2", squeezed, channels, 1)],
                   f"{name}_gate", alpha=1 / 6, beta=0.5)  # torch's Hardsigmoid
        return g.node("Mul", [x, s], f"{name}_scale")

    h = g.node("HardSwish", [g.conv_bn("x", "stem", 3, 16, 3, stride=2)], "stem_hswish")
    channels = 16
    # (kernel, expanded, out, squeeze-excite, activation, stride): torchvision's
    # mobilenet_v3_small, its first five blocks.
    for index, (k, expanded, out, se, kind, stride) in enumerate(
            [(3, 16, 16, True, "RE", 2), (3, 64, 24, False, "RE", 2), (3, 72, 24, False, "RE", 1),
             (5, 96, 40, True, "HS", 2), (5, 240, 40, True, "HS", 1)]):
        name = f"block{index}"
        b = h
        if expanded != channels:
            b = activation(g.conv_bn(b, f"{name}_expand", channels, expanded, 1),
                           f"{name}_act_a", kind)
        b = activation(g.conv_bn(b, f"{name}_dw", expanded, expanded, k, stride, group=expanded),
                       f"{name}_act_b", kind)
        if se:
            b = squeeze_excite(b, f"{name}_se", expanded)
        b = g.conv_bn(b, f"{name}_project", expanded, out, 1)
        h = g.node("Add", [h, b], f"{name}_add") if stride == 1 and channels == out else b
        channels = out
    h = g.node("HardSwish", [g.conv_bn(h, "last", channels, 240, 1)], "last_hswish")
    h = g.node("HardSwish", [g.gemm(g.global_pool_flatten(h), "fc1", 240, 128)], "fc1_hswish")
    g.gemm(h, "classifier", 128, 10)
    return g.make("mobilenetv3_n", [BATCH, 3, 96, 96], [BATCH, 10])


def inception() -> onnx.GraphProto:
    g = Graph(SEED + 8)

    def conv_relu(x: str, name: str, cin: int, cout: int, k: int, stride: int = 1) -> str:
        return g.relu(g.conv_bn(x, name, cin, cout, k, stride), f"{name}_relu")

    def inception_a(x: str, name: str, cin: int, pool_features: int) -> str:
        # torchvision's InceptionA, channels quartered: 1x1 | 1x1 -> 5x5 | 1x1 -> 3x3 -> 3x3 |
        # average pool (count_include_pad=False, as torchvision exports it) -> 1x1.
        b1 = conv_relu(x, f"{name}_b1", cin, 16, 1)
        b5 = conv_relu(conv_relu(x, f"{name}_b5_1", cin, 12, 1), f"{name}_b5_2", 12, 16, 5)
        b3 = conv_relu(x, f"{name}_b3_1", cin, 16, 1)
        b3 = conv_relu(conv_relu(b3, f"{name}_b3_2", 16, 24, 3), f"{name}_b3_3", 24, 24, 3)
        bp = g.node("AveragePool", [x], f"{name}_pool", kernel_shape=[3, 3], strides=[1, 1],
                    pads=[1] * 4, count_include_pad=0)
        bp = conv_relu(bp, f"{name}_bp", cin, pool_features, 1)
        return g.node("Concat", [b1, b5, b3, bp], f"{name}_concat", axis=1)

    h = conv_relu("x", "stem1", 3, 16, 3, stride=2)
    h = conv_relu(h, "stem2", 16, 32, 3)
    h = g.node("MaxPool", [h], "stem_pool", kernel_shape=[3, 3], strides=[2, 2])
    h = inception_a(h, "mixed_5b", 32, 8)   # 16 + 16 + 24 + 8 = 64 channels
    h = inception_a(h, "mixed_5c", 64, 16)  # 72 channels
    g.gemm(g.global_pool_flatten(h), "fc", 72, 10)
    return g.make("inception_n", [BATCH, 3, 64, 64], [BATCH, 10])


def densenet() -> onnx.GraphProto:
    g = Graph(SEED + 9)
    growth = 12

    def dense_layer(x: str, name: str, cin: int) -> str:
        # torchvision's DenseNet: pre-activation BN -> Relu -> Conv 1x1 (4 x growth) -> BN ->
        # Relu -> Conv 3x3 (growth), concatenated to everything before it.
        b = g.relu(g.batch_norm(x, f"{name}_bn1", cin), f"{name}_relu1")
        b = g.conv(b, f"{name}_conv1", cin, 4 * growth, 1, bias=False)
        b = g.relu(g.batch_norm(b, f"{name}_bn2", 4 * growth), f"{name}_relu2")
        b = g.conv(b, f"{name}_conv2", 4 * growth, growth, 3, pad=1, bias=False)
        return g.node("Concat", [x, b], f"{name}_concat", axis=1)

    h = g.relu(g.conv_bn("x", "stem", 3, 24, 7, stride=2), "stem_relu")
    h = g.node("MaxPool", [h], "stem_pool", kernel_shape=[3, 3], strides=[2, 2], pads=[1] * 4)
    channels = 24
    for block in range(2):
        for layer in range(4):
            h = dense_layer(h, f"block{block}_layer{layer}", channels)
            channels += growth
        if block == 0:  # the transition: BN, Relu, Conv 1x1 halving the channels, AveragePool
            h = g.relu(g.batch_norm(h, "transition_bn", channels), "transition_relu")
            h = g.conv(h, "transition_conv", channels, channels // 2, 1, bias=False)
            h = g.node("AveragePool", [h], "transition_pool", kernel_shape=[2, 2],
                       strides=[2, 2])
            channels //= 2
    h = g.relu(g.batch_norm(h, "final_bn", channels), "final_relu")
    g.gemm(g.global_pool_flatten(h), "classifier", channels, 10)
    return g.make("densenet_n", [BATCH, 3, 64, 64], [BATCH, 10])


def identity() -> onnx.GraphProto:
    return helper.make_graph(
        [helper.make_node("Identity", ["x"], ["y"], name="identity")],
        "identity",
        inputs=[helper.make_tensor_value_info("x", TensorProto.FLOAT, [1])],
        outputs=[helper.make_tensor_value_info("y", TensorProto.FLOAT, [1])],
    )


def write_models(out: pathlib.Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    for batch in (1, 64):
        save(mlp(batch), out / f"mlp_b{batch}.onnx")
        save(lenet(batch), out / f"lenet_b{batch}.onnx")
    save(mlp(BATCH), out / "mlp_n.onnx")
    save(lenet(BATCH), out / "lenet_n.onnx")
    save(residual_block(), out / "residual_block.onnx")
    save(resnet(), out / "resnet_n.onnx")
    save(mobilenetv2(), out / "mobilenetv2_n.onnx")
    save(squeezenet(), out / "squeezenet_n.onnx")
    save(resnet_bottleneck(), out / "resnet_bottleneck_n.onnx")
    save(mobilenetv3(), out / "mobilenetv3_n.onnx", opset=14)  # HardSwish is opset 14
    save(inception(), out / "inception_n.onnx")
    save(densenet(), out / "densenet_n.onnx")
    save(identity(), out / "identity.onnx")
    print(f"wrote the models of bench/ort_compare.sh into {out}")


def write_input(model_path: pathlib.Path, batch: int, stem: pathlib.Path) -> None:
    model = onnx.load(model_path)
    initializers = {init.name for init in model.graph.initializer}
    graph_inputs = [i for i in model.graph.input if i.name not in initializers]
    if len(graph_inputs) != 1:
        sys.exit(f"{model_path}: {len(graph_inputs)} graph inputs; the benchmark feeds exactly one")
    declared = graph_inputs[0]
    if declared.type.tensor_type.elem_type != TensorProto.FLOAT:
        sys.exit(f"{model_path}: input {declared.name} is not float32")
    dims = []
    for axis, dim in enumerate(declared.type.tensor_type.shape.dim):
        if dim.HasField("dim_value"):
            if axis == 0 and dim.dim_value != batch:
                sys.exit(f"{model_path}: input {declared.name} has the fixed batch "
                         f"{dim.dim_value}, not {batch}")
            dims.append(dim.dim_value)
        elif axis == 0:
            dims.append(batch)
        else:
            sys.exit(f"{model_path}: input {declared.name} has a symbolic dimension {axis} "
                     f"({dim.dim_param or '?'}); only the batch may be symbolic here")
    # zlib.crc32, not hash(): Python salts str hashes per process.
    rng = np.random.default_rng([SEED, zlib.crc32(stem.name.encode())])
    values = rng.uniform(-1, 1, size=dims).astype(np.float32)
    stem.parent.mkdir(parents=True, exist_ok=True)
    onnx.save_tensor(numpy_helper.from_array(values, declared.name), str(stem) + ".pb")
    values.astype("<f4").tofile(str(stem) + ".f32")
    pathlib.Path(str(stem) + ".json").write_text(json.dumps({"name": declared.name,
                                                             "dims": dims}))


def main() -> None:
    if len(sys.argv) == 2:
        write_models(pathlib.Path(sys.argv[1]))
    elif len(sys.argv) == 5 and sys.argv[1] == "--input":
        write_input(pathlib.Path(sys.argv[2]), int(sys.argv[3]), pathlib.Path(sys.argv[4]))
    else:
        sys.exit("usage: make_compare_models.py OUT_DIR\n"
                 "       make_compare_models.py --input MODEL.onnx BATCH OUT_STEM")


if __name__ == "__main__":
    main()
