// ONNX Runtime's side of bench/ort_compare.sh (run by it; see there):
//
//   node bench/ort_compare.mjs ORT_DIR SECONDS MODEL.onnx...
//
// ORT_DIR holds node_modules/onnxruntime-node. For each model, one CPU session single-threaded
// (intraOpNumThreads 1, interOpNumThreads 1, sequential execution, default graph optimisations),
// an input of the model's fixed shape filled once, warm-up calls, then timed `session.run` calls
// until SECONDS have passed (at least 20 calls, at most 20000). Prints one line per model:
//
//   ort model=PATH calls=N median_us=M p90_us=P threads_added=T
//
// T: threads the process gained while the session was created and run. The first session of the
// process shows 1 (a thread the binding starts once); a session with an intra-op pool would add
// its threads (intraOpNumThreads 2 adds 1 more): 0 after the first means no pool.
//
// The times include the Node binding's per-call cost (a promise, N-API, output tensor objects);
// the script runs identity.onnx in the same process and subtracts its median.
import fs from 'node:fs';
import { createRequire } from 'node:module';
import path from 'node:path';

const [ortDir, secondsArg, ...models] = process.argv.slice(2);
if (!ortDir || !secondsArg || models.length === 0) {
  console.error('usage: node ort_compare.mjs ORT_DIR SECONDS MODEL.onnx...');
  process.exit(2);
}
const require = createRequire(path.join(path.resolve(ortDir), 'package.json'));
const ort = require('onnxruntime-node');
const seconds = Number(secondsArg);

const sessionOptions = {
  executionProviders: ['cpu'],
  intraOpNumThreads: 1,
  interOpNumThreads: 1,
  executionMode: 'sequential',
  graphOptimizationLevel: 'all',
};

function percentile(sorted, p) {
  return sorted[Math.floor(p * (sorted.length - 1))];
}

const threadCount = () => fs.readdirSync('/proc/self/task').length;
for (const model of models) {
  const threadsBefore = threadCount();
  const session = await ort.InferenceSession.create(model, sessionOptions);
  const feeds = {};
  for (const meta of session.inputMetadata) {
    const dims = meta.shape.map((d) => (typeof d === 'number' && d > 0 ? d : 1));
    const size = dims.reduce((a, b) => a * b, 1);
    const data = new Float32Array(size);
    let state = 12345;  // the same LCG as backplane_bench_compare: values in [0, 1)
    for (let i = 0; i < size; ++i) {
      state = (state * 1103515245 + 12345) % 2147483648;
      data[i] = state / 2147483648;
    }
    feeds[meta.name] = new ort.Tensor('float32', data, dims);
  }
  for (let i = 0; i < 20; ++i) await session.run(feeds);
  const times = [];
  const deadline = process.hrtime.bigint() + BigInt(Math.round(seconds * 1e9));
  while (times.length < 20 || (process.hrtime.bigint() < deadline && times.length < 20000)) {
    const start = process.hrtime.bigint();
    await session.run(feeds);
    times.push(Number(process.hrtime.bigint() - start) / 1000);
  }
  times.sort((a, b) => a - b);
  console.log(`ort model=${model} calls=${times.length} median_us=${percentile(times, 0.5).toFixed(2)} ` +
              `p90_us=${percentile(times, 0.9).toFixed(2)} threads_added=${threadCount() - threadsBefore}`);
  await session.release();
}
