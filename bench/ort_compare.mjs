// ONNX Runtime's side of bench/ort_compare.sh (run by it, one round of one case; see there):
//
//   node bench/ort_compare.mjs ORT_DIR SECONDS THREADS IDENTITY.onnx MODEL.onnx INPUT_STEM OUT_DIR
//
// ORT_DIR holds node_modules/onnxruntime-node. Two CPU sessions with the same options
// (intraOpNumThreads THREADS, interOpNumThreads 1, sequential execution, default graph
// optimisations, ORT's default spinning of its pool threads: what a user of the binding gets): the
// 1-element IDENTITY model, then MODEL, then IDENTITY again. Each gets 20 warm-up calls, then timed
// `session.run` calls until SECONDS have passed (at least 20, at most 20000). MODEL's one input is
// INPUT_STEM.f32 (raw little-endian float32) with the name and shape of INPUT_STEM.json, both
// written by bench/make_compare_models.py --input beside the INPUT_STEM.pb that Backplane reads:
// the two sides compute on the same float32 values, no generator to keep in step across
// languages. The outputs of the first call go to OUT_DIR/output_I.f32 (raw float32) and
// OUT_DIR/output_I.json ({"name", "dims"}), I in the model's output order. Prints three lines:
//
//   ort model=IDENTITY threads=THREADS calls=N median_us=M p90_us=P threads_added=T
//   ort model=MODEL threads=THREADS calls=N median_us=M p90_us=P threads_added=T
//   ort model=IDENTITY threads=THREADS calls=N median_us=M p90_us=P threads_added=T
//
// T: threads the process gained while that session was created and run. The first session shows
// 1 (a thread the binding starts once) plus its pool's; a session with an intra-op pool of 2 adds
// 1 thread (the caller is the other): 0 on the second line means no pool of its own.
//
// The times include the Node binding's per-call cost (a promise, N-API, tensor objects). The
// IDENTITY median, measured in the same process with the same options just before and just after,
// is that cost alone: the script subtracts the smaller of the two from MODEL's median (noise only
// adds to a median; one identity run that caught a busy moment had doubled it).
import fs from 'node:fs';
import { createRequire } from 'node:module';
import path from 'node:path';

const [ortDir, secondsArg, threadsArg, identityModel, model, inputStem, outDir] =
    process.argv.slice(2);
if (!outDir) {
  console.error('usage: node ort_compare.mjs ORT_DIR SECONDS THREADS IDENTITY.onnx MODEL.onnx ' +
                'INPUT_STEM OUT_DIR');
  process.exit(2);
}
const require = createRequire(path.join(path.resolve(ortDir), 'package.json'));
const ort = require('onnxruntime-node');
const seconds = Number(secondsArg);
const threads = Number(threadsArg);
if (!(seconds > 0) || !Number.isInteger(threads) || threads < 1) {
  console.error(`ort_compare.mjs: SECONDS must be > 0 and THREADS an integer >= 1, got ` +
                `${secondsArg} and ${threadsArg}`);
  process.exit(2);
}

const sessionOptions = {
  executionProviders: ['cpu'],
  intraOpNumThreads: threads,
  interOpNumThreads: 1,
  executionMode: 'sequential',
  graphOptimizationLevel: 'all',
};

function percentile(sorted, p) {
  return sorted[Math.floor(p * (sorted.length - 1))];
}

function readInput(stem) {
  const { name, dims } = JSON.parse(fs.readFileSync(`${stem}.json`, 'utf8'));
  const bytes = fs.readFileSync(`${stem}.f32`);
  const count = dims.reduce((a, b) => a * b, 1);
  if (bytes.length !== 4 * count) {
    throw new Error(`${stem}.f32 holds ${bytes.length} bytes, its shape [${dims}] needs ${4 * count}`);
  }
  // A copy into an aligned buffer: Buffer's may be a slice of a pool at any offset.
  const data = new Float32Array(count);
  new Uint8Array(data.buffer).set(bytes);
  return { [name]: new ort.Tensor('float32', data, dims) };
}

const threadCount = () => fs.readdirSync('/proc/self/task').length;

async function timeSession(modelPath, feeds, writeOutputs) {
  const threadsBefore = threadCount();
  const session = await ort.InferenceSession.create(modelPath, sessionOptions);
  const first = await session.run(feeds);
  if (writeOutputs) {
    fs.mkdirSync(outDir, { recursive: true });
    session.outputNames.forEach((name, i) => {
      const tensor = first[name];
      if (tensor.type !== 'float32') throw new Error(`output ${name} is ${tensor.type}, not float32`);
      fs.writeFileSync(path.join(outDir, `output_${i}.f32`), Buffer.from(tensor.data.buffer,
          tensor.data.byteOffset, tensor.data.byteLength));
      fs.writeFileSync(path.join(outDir, `output_${i}.json`),
                       JSON.stringify({ name, dims: tensor.dims }));
    });
  }
  for (let i = 0; i < 19; ++i) await session.run(feeds);
  const times = [];
  const deadline = process.hrtime.bigint() + BigInt(Math.round(seconds * 1e9));
  while (times.length < 20 || (process.hrtime.bigint() < deadline && times.length < 20000)) {
    const start = process.hrtime.bigint();
    await session.run(feeds);
    times.push(Number(process.hrtime.bigint() - start) / 1000);
  }
  times.sort((a, b) => a - b);
  console.log(`ort model=${modelPath} threads=${threads} calls=${times.length} ` +
              `median_us=${percentile(times, 0.5).toFixed(2)} ` +
              `p90_us=${percentile(times, 0.9).toFixed(2)} threads_added=${threadCount() - threadsBefore}`);
  await session.release();
}

const identityFeeds = { x: new ort.Tensor('float32', new Float32Array([0.5]), [1]) };
await timeSession(identityModel, identityFeeds, false);
await timeSession(model, readInput(inputStem), true);
await timeSession(identityModel, identityFeeds, false);
