#!/usr/bin/python3
"""Checks Backplane's outputs against ONNX Runtime's for one case of bench/ort_compare.sh.

    /usr/bin/python3 bench/compare_outputs.py ORT_OUT_DIR BACKPLANE_OUT_DIR [--steps MODEL.onnx]
    /usr/bin/python3 bench/compare_outputs.py --self-test [SEED]

ORT_OUT_DIR holds output_I.f32 + output_I.json from bench/ort_compare.mjs; BACKPLANE_OUT_DIR holds
output_I.pb from `backplane run --output-dir`. Prints one line:

    outputs=K max_abs_error=E range=R relative_error=E/R pass=yes|no [problem=...]

The rule: for every output, max |backplane - ort| <= 1e-4 x (max - min of ORT's output), the
output's range (its largest magnitude when the range is 0, 1 when that is 0 too). Relative to the
range rather than per element: two correct float32 implementations sum in different orders, so an
element near 0 may differ by a large fraction of itself; against the range, 1e-4 still catches a
wrong pad, stride or missing bias, which move outputs by a large part of it. A shape that differs,
a missing file, or a NaN on either side fails the check, said in `problem`. E and R are of the
output with the largest relative error. Exit status 0 when the check passes, 1 when it does not.

With --steps (a quantized model, whose outputs come out of DequantizeLinear nodes) the rule is
issue 43's instead: every element within one quantization step of ORT's, the step being the scale
of the DequantizeLinear that writes the output; the line then also says `steps=` (the largest
|difference| in steps). Two int8 runtimes may round one accumulator to neighbouring steps.

--self-test checks the rule itself on seeded random cases (bench/ort_compare.sh runs it first):
random outputs of random shapes and offsets, one element moved by just under and just over the
tolerance (must pass, must fail), a shape that differs, a NaN, a constant output, and quantized
outputs one element 1 step (must pass) or 2 steps (must fail) away under --steps; it prints the
seed, and on a failure the case, so that `--self-test SEED` repeats it.
"""
import json
import pathlib
import sys
import tempfile

import numpy as np
import onnx
from onnx import numpy_helper

TOLERANCE = 1e-4  # of the output's range


def output_steps(model_path: pathlib.Path) -> list:
    """The quantization step of each graph output: the scale of the DequantizeLinear writing it."""
    model = onnx.load(model_path)
    constants = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
    writers = {out: node for node in model.graph.node for out in node.output}
    steps = []
    for output in model.graph.output:
        node = writers.get(output.name)
        if node is None or node.op_type != "DequantizeLinear" or node.input[1] not in constants:
            sys.exit(f"{model_path}: output {output.name} is not written by a DequantizeLinear "
                     "with a constant scale")
        steps.append(float(np.max(constants[node.input[1]])))
    return steps


def compare(ort_dir: pathlib.Path, backplane_dir: pathlib.Path,
            steps: list | None = None) -> tuple[str, bool]:
    count = 0
    worst = (0.0, 0.0, 0.0)  # relative, absolute, range
    worst_steps = 0.0
    while (ort_dir / f"output_{count}.json").exists():
        meta = json.loads((ort_dir / f"output_{count}.json").read_text())
        want = np.fromfile(ort_dir / f"output_{count}.f32", dtype="<f4")
        want = want.reshape(meta["dims"]).astype(np.float64)
        got_file = backplane_dir / f"output_{count}.pb"
        if not got_file.exists():
            return f"outputs={count} pass=no problem=no_{got_file.name}_from_backplane", False
        got = numpy_helper.to_array(onnx.load_tensor(str(got_file))).astype(np.float64)
        if got.shape != want.shape:
            return (f"outputs={count + 1} pass=no problem=output_{count}_shape_"
                    f"{list(got.shape)}_want_{list(want.shape)}"), False
        if np.isnan(got).any() or np.isnan(want).any():
            return f"outputs={count + 1} pass=no problem=output_{count}_has_NaN", False
        error = float(np.max(np.abs(got - want))) if want.size else 0.0
        spread = float(np.max(want) - np.min(want)) if want.size else 0.0
        scale = spread or (float(np.max(np.abs(want))) if want.size else 0.0) or 1.0
        if error / scale >= worst[0]:
            worst = (error / scale, error, spread)
        if steps is not None:
            worst_steps = max(worst_steps, error / steps[count])
        count += 1
    if count == 0:
        return "outputs=0 pass=no problem=no_output_from_ort", False
    # 1 + 1e-3: exactly one step, as float32 holds it 255 steps from zero (2^-24 x 255 of a step
    # each side); two steps apart stay far above.
    passed = worst_steps <= 1 + 1e-3 if steps is not None else worst[0] <= TOLERANCE
    in_steps = f" steps={worst_steps:.2f}" if steps is not None else ""
    return (f"outputs={count} max_abs_error={worst[1]:.2e} range={worst[2]:.3g} "
            f"relative_error={worst[0]:.2e}{in_steps} pass={'yes' if passed else 'no'}"), passed


def write_case(root: pathlib.Path, want: np.ndarray, got: np.ndarray) -> tuple:
    ort_dir, backplane_dir = root / "ort", root / "backplane"
    for directory in (ort_dir, backplane_dir):
        directory.mkdir(parents=True, exist_ok=True)
        for old in directory.iterdir():
            old.unlink()
    want.astype("<f4").tofile(ort_dir / "output_0.f32")
    (ort_dir / "output_0.json").write_text(json.dumps({"name": "y", "dims": list(want.shape)}))
    onnx.save_tensor(numpy_helper.from_array(got.astype(np.float32), "y"),
                     str(backplane_dir / "output_0.pb"))
    return ort_dir, backplane_dir


def self_test(seed: int) -> None:
    print(f"compare_outputs.py --self-test {seed}")
    rng = np.random.default_rng(seed)
    with tempfile.TemporaryDirectory() as scratch:
        root = pathlib.Path(scratch)

        def expect(case: str, want: np.ndarray, got: np.ndarray, passes: bool,
                   steps: list | None = None) -> None:
            line, passed = compare(*write_case(root, want, got), steps)
            if passed != passes:
                sys.exit(f"self-test FAILED (seed {seed}): {case}: want "
                         f"{'pass' if passes else 'fail'}, got: {line}")

        for trial in range(200):
            shape = tuple(rng.integers(1, 6, size=rng.integers(1, 4)))
            offset, spread = rng.uniform(-100, 100), 10.0 ** rng.uniform(-3, 3)
            want = (offset + spread * rng.random(shape)).astype(np.float32)
            scale = float(want.max() - want.min()) or float(np.abs(want).max()) or 1.0
            index = tuple(rng.integers(0, n) for n in shape)
            case = f"trial {trial}: shape {shape}, offset {offset:.3g}, spread {spread:.3g}"
            # Moved in float64, then stored as float32: keep clear of the rounding at the edge.
            for factor, passes in ((0.5, True), (2.0, False)):
                got = want.astype(np.float64)
                got[index] += factor * TOLERANCE * scale
                if abs(np.float32(got[index]) - want[index]) == 0:
                    continue  # below float32's resolution at this magnitude: nothing to check
                expect(f"{case}, one element moved by {factor} x tolerance", want, got, passes)
            expect(f"{case}, identical", want, want, True)
            expect(f"{case}, another shape", want, want.reshape(-1, 1) if want.ndim == 1 else
                   want.reshape(-1), False)
            nan = want.copy()
            nan[index] = np.nan
            expect(f"{case}, a NaN", want, nan, False)
        for trial in range(50):  # --steps: whole quantization steps apart
            step = float(np.float32(10.0 ** rng.uniform(-4, 1)))
            shape = tuple(rng.integers(1, 6, size=2))
            want = (rng.integers(0, 256, size=shape) - rng.integers(0, 256)) * np.float64(step)
            index = tuple(rng.integers(0, n) for n in shape)
            for moved, passes in ((1, True), (-1, True), (2, False)):
                got = want.copy()
                got[index] += moved * step
                expect(f"steps trial {trial}: step {step:.3g}, one element {moved} step(s) away",
                       want.astype(np.float32), got, passes, [step])
        constant = np.full((2, 3), 4.0, dtype=np.float32)
        expect("a constant output, equal", constant, constant, True)
        expect("a constant output, moved by 1e-3 of its magnitude", constant, constant * 1.001,
               False)
    print("self-test passed")


def main() -> None:
    if len(sys.argv) in (2, 3) and sys.argv[1] == "--self-test":
        seed = int(sys.argv[2]) if len(sys.argv) == 3 else int(np.random.default_rng().integers(1 << 31))
        self_test(seed)
        return
    if len(sys.argv) not in (3, 5) or len(sys.argv) == 5 and sys.argv[3] != "--steps":
        sys.exit("usage: compare_outputs.py ORT_OUT_DIR BACKPLANE_OUT_DIR [--steps MODEL.onnx]\n"
                 "       compare_outputs.py --self-test [SEED]")
    steps = output_steps(pathlib.Path(sys.argv[4])) if len(sys.argv) == 5 else None
    line, passed = compare(pathlib.Path(sys.argv[1]), pathlib.Path(sys.argv[2]), steps)
    print(line)
    sys.exit(0 if passed else 1)


if __name__ == "__main__":
    main()
