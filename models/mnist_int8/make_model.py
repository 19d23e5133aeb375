#!/usr/bin/python3
"""Writes 1/model.onnx: models/mnist/1/model.onnx quantized to int8 QDQ (PROVENANCE.md).

    /usr/bin/python3 models/mnist_int8/make_model.py --backplane build/release/bin/backplane

Calibration: 96 images made from the three test images of ../shared/data/models/mnist (shifted
by up to 3 pixels each way, with Gaussian pixel noise of 8), seed 20261207; rerunning it writes
the same bytes.
"""

import argparse
import pathlib
import subprocess
import tempfile

import numpy as np
import onnx
from onnx import numpy_helper

HERE = pathlib.Path(__file__).resolve().parent
ROOT = HERE.parent.parent
DATA = ROOT.parent / "shared" / "data" / "models" / "mnist"


def calibration_images(count: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    images = [numpy_helper.to_array(onnx.load_tensor(str(DATA / f"test_data_set_{i}" /
                                                         "input_0.pb"))) for i in range(3)]
    samples = []
    for k in range(count):
        dy, dx = rng.integers(-3, 4, size=2)
        image = np.roll(images[k % 3], (dy, dx), axis=(2, 3))
        samples.append(np.clip(image + rng.normal(0, 8, image.shape), 0, 255))
    return np.concatenate(samples).astype(np.float32)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--backplane", required=True)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as work:
        samples = pathlib.Path(work) / "calibration.npy"
        np.save(samples, calibration_images(96, 20261207))
        subprocess.run(["/usr/bin/python3", str(ROOT / "scripts" / "quantize_qdq.py"),
                        str(ROOT / "models" / "mnist" / "1" / "model.onnx"),
                        str(HERE / "1" / "model.onnx"), "--backplane", args.backplane,
                        "--calibration", str(samples)], check=True)


if __name__ == "__main__":
    main()
