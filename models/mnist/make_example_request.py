#!/usr/bin/python3
"""Writes models/mnist/example_request.json: a KServe v2 inference request for the MNIST model
holding test image 0 of the shared test data (`../shared/data/models/mnist/test_data_set_0`,
label 5), one row of 28 pixels per line. Run with Debian's python3 from the repository root:

    /usr/bin/python3 models/mnist/make_example_request.py [../shared/data/models/mnist]
"""
import pathlib
import sys

import onnx
from onnx import numpy_helper


def main() -> None:
    root = pathlib.Path(__file__).resolve().parent
    data = pathlib.Path(sys.argv[1]) if len(sys.argv) > 1 else root.parents[2] / "shared/data/models/mnist"
    image = numpy_helper.to_array(onnx.load_tensor(data / "test_data_set_0/input_0.pb"))
    label = int(numpy_helper.to_array(onnx.load_tensor(data / "test_data_set_0/output_0.pb")).argmax())
    assert image.shape == (1, 1, 28, 28), image.shape
    # Pixels are whole numbers 0..255: print them as integers (valid JSON numbers for FP32).
    rows = ",\n".join(
        "      " + ",".join(str(int(value)) for value in row) for row in image.reshape(28, 28)
    )
    text = (
        "{\n"
        f'  "id": "mnist-test-image-0-label-{label}",\n'
        '  "inputs": [{\n'
        '    "name": "Input3", "shape": [1, 1, 28, 28], "datatype": "FP32",\n'
        '    "data": [\n'
        f"{rows}\n"
        "    ]\n"
        "  }]\n"
        "}\n"
    )
    out = root / "example_request.json"
    out.write_text(text)
    print(f"wrote {out} (label {label})")


if __name__ == "__main__":
    main()
