#!/usr/bin/python3
"""Rewrites fixed-batch models into their symbolic-batch form, as exporters write them.

    /usr/bin/python3 bench/make_symbolic_batch.py IN.onnx OUT.onnx [IN.onnx OUT.onnx]...

The first dimension of every graph input and output becomes the symbolic `N`, and the graph's
value_info (inferred shapes that would pin the batch) is dropped; weights and nodes are untouched.
For bench/shape_program_bench.sh, on the models of bench/make_compare_models.py. Debian's python3
(package python3-onnx).
"""
import sys

import onnx


def main() -> None:
    args = sys.argv[1:]
    if not args or len(args) % 2:
        sys.exit(__doc__)
    for source, target in zip(args[::2], args[1::2]):
        model = onnx.load(source)
        for value in list(model.graph.input) + list(model.graph.output):
            value.type.tensor_type.shape.dim[0].dim_param = "N"
        del model.graph.value_info[:]
        onnx.checker.check_model(model)
        onnx.save(model, target)


if __name__ == "__main__":
    main()
