#!/usr/bin/python3
"""Writes a tiny BERT-like encoder layer as torch.onnx.export writes one, with its test data
computed by numpy from the ONNX definitions, for the end-to-end tests on CpuRef
(tests/runtime/encoder_network_test.cpp, tests/server/encoder_serve_test.cpp).

  /usr/bin/python3 scripts/make_tiny_encoder.py tests/data

writes two variants: tiny_encoder (opset 17, described below) and tiny_encoder_opset14 (every
LayerNormalization decomposed, as opsets before 17 export it, and the mask applied with Equal,
Expand and Where instead of arithmetic).

Needs onnx (1.12 is Debian's) and numpy; no torch, no download. The graph has what an export
has: int64 token ids and attention mask with symbolic batch and sequence; embeddings by Gather
(words, positions sliced to the sequence by a Shape chain, token types from ConstantOfShape);
LayerNormalization (opset 17) after the embeddings and after the FFN, its decomposed form
(ReduceMean, Sub, Pow, Sqrt, Div) after attention; Q/K/V MatMuls whose heads are split by a
Reshape to a target computed Shape -> Gather -> Unsqueeze -> Concat; attention with a 4-D batched
MatMul, a scale, the mask built by Unsqueeze, Cast, Sub and Mul; Softmax; GELU as Erf; a Tanh
pooler on the first token. Each test_data_set_N holds input_0.pb (ids), input_1.pb (mask) and
output_0.pb (last hidden state), output_1.pb (pooled).
"""
import math
import os
import sys

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

VOCAB, HIDDEN, HEADS, FFN, MAX_POS, TYPES = 50, 16, 2, 32, 64, 2
HEAD = HIDDEN // HEADS
EPS = 1e-12


def weights(rng):
    w = {}
    w["word"] = rng.normal(0, 0.5, (VOCAB, HIDDEN))
    w["pos"] = rng.normal(0, 0.5, (MAX_POS, HIDDEN))
    w["type"] = rng.normal(0, 0.5, (TYPES, HIDDEN))
    for name in ("emb_ln", "attn_ln", "ffn_ln"):
        w[name + "_g"] = rng.normal(1, 0.1, (HIDDEN,))
        w[name + "_b"] = rng.normal(0, 0.1, (HIDDEN,))
    for name in ("q", "k", "v", "o", "pool"):
        w[name + "_w"] = rng.normal(0, 0.3, (HIDDEN, HIDDEN))
        w[name + "_b"] = rng.normal(0, 0.1, (HIDDEN,))
    w["ffn1_w"] = rng.normal(0, 0.3, (HIDDEN, FFN))
    w["ffn1_b"] = rng.normal(0, 0.1, (FFN,))
    w["ffn2_w"] = rng.normal(0, 0.3, (FFN, HIDDEN))
    w["ffn2_b"] = rng.normal(0, 0.1, (HIDDEN,))
    return {k: v.astype(np.float32) for k, v in w.items()}


def build(w, opset):
    """opset 17: LayerNormalization nodes and an additive mask; 14: decomposed layer norms and a
    Where mask."""
    nodes, inits = [], [numpy_helper.from_array(v, k) for k, v in w.items()]

    def const(name, value, dtype=np.int64):
        inits.append(numpy_helper.from_array(np.array(value, dtype=dtype), name))
        return name

    def node(op, inputs, outputs, **attrs):
        nodes.append(helper.make_node(op, inputs, outputs, name=outputs[0], **attrs))
        return outputs[0]

    # position_ids buffer [1, MAX_POS], sliced to the sequence: a Shape chain feeds Slice's end.
    const("position_ids", np.arange(MAX_POS)[None, :])
    const("i0", 0)
    const("i1", 1)
    const("axes0", [0])
    const("axes1", [1])
    const("start0", [0])
    node("Shape", ["input_ids"], ["ids_shape"])
    node("Gather", ["ids_shape", "i0"], ["batch"], axis=0)
    node("Gather", ["ids_shape", "i1"], ["seq"], axis=0)
    node("Unsqueeze", ["batch", "axes0"], ["batch_1"])
    node("Unsqueeze", ["seq", "axes0"], ["seq_1"])
    node("Slice", ["position_ids", "start0", "seq_1", "axes1"], ["pos_ids"])
    node("ConstantOfShape", ["ids_shape"], ["type_ids"],
         value=helper.make_tensor("zero", TensorProto.INT64, [1], [0]))
    node("Gather", ["word", "input_ids"], ["word_emb"])
    node("Gather", ["pos", "pos_ids"], ["pos_emb"])
    node("Gather", ["type", "type_ids"], ["type_emb"])
    node("Add", ["word_emb", "pos_emb"], ["emb_sum0"])
    node("Add", ["emb_sum0", "type_emb"], ["emb_sum"])
    const("two_f", 2.0, np.float32)
    const("eps_f", EPS, np.float32)

    def decomposed_layer_norm(x, prefix, out):
        node("ReduceMean", [x], [prefix + "_mean"], axes=[-1])
        node("Sub", [x, prefix + "_mean"], [prefix + "_centered"])
        node("Pow", [prefix + "_centered", "two_f"], [prefix + "_sq"])
        node("ReduceMean", [prefix + "_sq"], [prefix + "_var"], axes=[-1])
        node("Add", [prefix + "_var", "eps_f"], [prefix + "_var_eps"])
        node("Sqrt", [prefix + "_var_eps"], [prefix + "_std"])
        node("Div", [prefix + "_centered", prefix + "_std"], [prefix + "_norm"])
        node("Mul", [prefix + "_norm", prefix + "_g"], [prefix + "_scaled"])
        node("Add", [prefix + "_scaled", prefix + "_b"], [out])

    def layer_norm_node(x, prefix, out):
        if opset >= 17:
            node("LayerNormalization", [x, prefix + "_g", prefix + "_b"], [out], axis=-1,
                 epsilon=EPS)
        else:
            decomposed_layer_norm(x, prefix, out)

    layer_norm_node("emb_sum", "emb_ln", "h0")

    # Heads: Reshape to [batch, seq, HEADS, HEAD] with a computed target, then Transpose.
    const("heads_dims", [HEADS, HEAD])
    node("Concat", ["batch_1", "seq_1", "heads_dims"], ["heads_shape"], axis=0)
    for name in ("q", "k", "v"):
        node("MatMul", ["h0", name + "_w"], [name + "_mm"])
        node("Add", [name + "_mm", name + "_b"], [name + "_lin"])
        node("Reshape", [name + "_lin", "heads_shape"], [name + "_split"])
    node("Transpose", ["q_split"], ["q_heads"], perm=[0, 2, 1, 3])
    node("Transpose", ["k_split"], ["k_heads_t"], perm=[0, 2, 3, 1])
    node("Transpose", ["v_split"], ["v_heads"], perm=[0, 2, 1, 3])
    node("MatMul", ["q_heads", "k_heads_t"], ["scores_raw"])
    const("scale", math.sqrt(HEAD), np.float32)
    node("Div", ["scores_raw", "scale"], ["scores_scaled"])
    const("axes12", [1, 2])
    node("Unsqueeze", ["attention_mask", "axes12"], ["mask4"])
    const("one_f", 1.0, np.float32)
    const("big_neg", -10000.0, np.float32)
    if opset >= 17:
        # Extended attention mask: (1 - mask[:, None, None, :].float()) * -10000.
        node("Cast", ["mask4"], ["mask4f"], to=TensorProto.FLOAT)
        node("Sub", ["one_f", "mask4f"], ["inverted"])
        node("Mul", ["inverted", "big_neg"], ["mask_add"])
        node("Add", ["scores_scaled", "mask_add"], ["scores"])
    else:
        # scores.masked_fill(mask[:, None, None, :] == 0, -10000), the mask expanded first.
        node("Equal", ["mask4", "i0"], ["masked"])
        node("Shape", ["scores_scaled"], ["scores_shape"])
        node("Expand", ["masked", "scores_shape"], ["masked_full"])
        node("Where", ["masked_full", "big_neg", "scores_scaled"], ["scores"])
    node("Softmax", ["scores"], ["probs"], axis=-1)
    node("MatMul", ["probs", "v_heads"], ["context_heads"])
    node("Transpose", ["context_heads"], ["context_t"], perm=[0, 2, 1, 3])
    const("hidden_dim", [HIDDEN])
    node("Concat", ["batch_1", "seq_1", "hidden_dim"], ["merge_shape"], axis=0)
    node("Reshape", ["context_t", "merge_shape"], ["context"])
    node("MatMul", ["context", "o_w"], ["o_mm"])
    node("Add", ["o_mm", "o_b"], ["o_lin"])
    node("Add", ["o_lin", "h0"], ["attn_res"])
    # Decomposed in both variants, as opsets before 17 export it.
    decomposed_layer_norm("attn_res", "attn_ln", "h1")
    # FFN with GELU as Erf: x * 0.5 * (1 + erf(x / sqrt(2))).
    node("MatMul", ["h1", "ffn1_w"], ["ffn1_mm"])
    node("Add", ["ffn1_mm", "ffn1_b"], ["ffn1"])
    const("sqrt2", math.sqrt(2.0), np.float32)
    const("half", 0.5, np.float32)
    node("Div", ["ffn1", "sqrt2"], ["gelu_div"])
    node("Erf", ["gelu_div"], ["gelu_erf"])
    node("Add", ["gelu_erf", "one_f"], ["gelu_1p"])
    node("Mul", ["ffn1", "gelu_1p"], ["gelu_mul"])
    node("Mul", ["gelu_mul", "half"], ["gelu"])
    node("MatMul", ["gelu", "ffn2_w"], ["ffn2_mm"])
    node("Add", ["ffn2_mm", "ffn2_b"], ["ffn2"])
    node("Add", ["ffn2", "h1"], ["ffn_res"])
    layer_norm_node("ffn_res", "ffn_ln", "last_hidden_state")
    # Pooler: the first token, Gemm-like MatMul + Add, Tanh.
    node("Gather", ["last_hidden_state", "i0"], ["first_token"], axis=1)
    node("MatMul", ["first_token", "pool_w"], ["pool_mm"])
    node("Add", ["pool_mm", "pool_b"], ["pool_lin"])
    node("Tanh", ["pool_lin"], ["pooled"])

    graph = helper.make_graph(
        nodes, "tiny_encoder",
        [helper.make_tensor_value_info("input_ids", TensorProto.INT64, ["batch", "sequence"]),
         helper.make_tensor_value_info("attention_mask", TensorProto.INT64,
                                       ["batch", "sequence"])],
        [helper.make_tensor_value_info("last_hidden_state", TensorProto.FLOAT,
                                       ["batch", "sequence", HIDDEN]),
         helper.make_tensor_value_info("pooled", TensorProto.FLOAT, ["batch", HIDDEN])],
        inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)],
                              producer_name="backplane make_tiny_encoder.py")
    model.ir_version = 8
    onnx.checker.check_model(model, full_check=True)
    return model


def erf(x):
    return np.vectorize(math.erf)(x)


def layer_norm(x, g, b):
    mean = x.mean(-1, keepdims=True)
    var = ((x - mean) ** 2).mean(-1, keepdims=True)
    return (x - mean) / np.sqrt(var + EPS) * g + b


def reference(w, ids, mask, opset):
    """The encoder in float64 numpy, written from the ONNX definitions of its nodes."""
    w = {k: v.astype(np.float64) for k, v in w.items()}
    batch, seq = ids.shape
    h = w["word"][ids] + w["pos"][np.arange(seq)][None] + w["type"][np.zeros_like(ids)]
    h0 = layer_norm(h, w["emb_ln_g"], w["emb_ln_b"])

    def heads(x):
        return x.reshape(batch, seq, HEADS, HEAD).transpose(0, 2, 1, 3)

    q, k, v = (heads(h0 @ w[n + "_w"] + w[n + "_b"]) for n in ("q", "k", "v"))
    scores = q @ k.transpose(0, 1, 3, 2) / math.sqrt(HEAD)
    if opset >= 17:
        scores = scores + (1.0 - mask[:, None, None, :].astype(np.float64)) * -10000.0
    else:
        scores = np.where(mask[:, None, None, :] == 0, -10000.0, scores)
    scores = np.exp(scores - scores.max(-1, keepdims=True))
    probs = scores / scores.sum(-1, keepdims=True)
    context = (probs @ v).transpose(0, 2, 1, 3).reshape(batch, seq, HIDDEN)
    h1 = layer_norm(context @ w["o_w"] + w["o_b"] + h0, w["attn_ln_g"], w["attn_ln_b"])
    f = h1 @ w["ffn1_w"] + w["ffn1_b"]
    f = f * 0.5 * (1.0 + erf(f / math.sqrt(2.0)))
    out = layer_norm(f @ w["ffn2_w"] + w["ffn2_b"] + h1, w["ffn_ln_g"], w["ffn_ln_b"])
    pooled = np.tanh(out[:, 0] @ w["pool_w"] + w["pool_b"])
    return out.astype(np.float32), pooled.astype(np.float32)


def write(out_dir, opset, rng, w):
    os.makedirs(out_dir, exist_ok=True)
    onnx.save(build(w, opset), os.path.join(out_dir, "model.onnx"))
    # (batch, sequence), padding at the end of each row
    for index, (batch, seq) in enumerate([(2, 5), (1, 7), (3, 1)]):
        ids = rng.integers(0, VOCAB, (batch, seq)).astype(np.int64)
        mask = np.ones((batch, seq), np.int64)
        for row in range(batch):
            padding = rng.integers(0, seq)  # at least one real token
            if padding:
                mask[row, seq - padding:] = 0
        outputs = reference(w, ids, mask, opset)
        data_dir = os.path.join(out_dir, "test_data_set_%d" % index)
        os.makedirs(data_dir, exist_ok=True)
        for i, (name, array) in enumerate([("input_ids", ids), ("attention_mask", mask)]):
            with open(os.path.join(data_dir, "input_%d.pb" % i), "wb") as f:
                f.write(numpy_helper.from_array(array, name).SerializeToString())
        for i, (name, array) in enumerate(zip(["last_hidden_state", "pooled"], outputs)):
            with open(os.path.join(data_dir, "output_%d.pb" % i), "wb") as f:
                f.write(numpy_helper.from_array(array, name).SerializeToString())


def main():
    out_dir = sys.argv[1] if len(sys.argv) > 1 else "tests/data"
    rng = np.random.default_rng(42)
    w = weights(rng)
    write(os.path.join(out_dir, "tiny_encoder"), 17, rng, w)
    write(os.path.join(out_dir, "tiny_encoder_opset14"), 14, rng, w)


if __name__ == "__main__":
    main()
