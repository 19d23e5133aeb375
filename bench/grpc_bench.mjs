// gRPC (raw_input_contents) against REST JSON on MNIST, side by side in one run: for each
// concurrency, every client sends requests back to back for DURATION seconds; prints requests/s
// and the median and p99 latency per transport.
//   node grpc_bench.mjs <grpc_service.proto> <grpc HOST:PORT> <http://HOST:PORT> <request.json>
// Run from a folder whose node_modules holds @grpc/grpc-js and @grpc/proto-loader
// (bench/grpc_bench.sh arranges it).
import fs from "node:fs";
import http from "node:http";
import grpc from "@grpc/grpc-js";
import protoLoader from "@grpc/proto-loader";

const [protoFile, grpcTarget, restUrl, requestFile] = process.argv.slice(2);
const duration = Number(process.env.DURATION ?? 5) * 1000;
const concurrencies = (process.env.CLIENTS ?? "1 4").split(" ").map(Number);

const restBody = fs.readFileSync(requestFile);
const request = JSON.parse(restBody);
const input = request.inputs[0];
const rawRequest = {
  model_name: "mnist",
  inputs: [{name: input.name, datatype: input.datatype, shape: input.shape}],
  raw_input_contents: [Buffer.from(new Float32Array(input.data.flat(Infinity)).buffer)],
};

const definition = protoLoader.loadSync(protoFile, {keepCase: true, longs: Number});
const inference = grpc.loadPackageDefinition(definition).inference;

function grpcClient() {
  // One channel per client: each client is its own connection, as the REST clients are.
  const client = new inference.GRPCInferenceService(grpcTarget, grpc.credentials.createInsecure(),
                                                    {"grpc.use_local_subchannel_pool": 1});
  return () => new Promise((resolve, reject) => client.ModelInfer(
      rawRequest, (error, response) => error ? reject(error) : resolve(response)));
}

function restClient() {
  const agent = new http.Agent({keepAlive: true, maxSockets: 1});
  const url = new URL("/v2/models/mnist/infer", restUrl);
  return () => new Promise((resolve, reject) => {
    const call = http.request(url, {method: "POST", agent,
                                    headers: {"Content-Type": "application/json",
                                              "Content-Length": restBody.length}},
                              (response) => {
                                const chunks = [];
                                response.on("data", (chunk) => chunks.push(chunk));
                                response.on("end", () => response.statusCode === 200
                                    ? resolve(JSON.parse(Buffer.concat(chunks)))
                                    : reject(new Error(`HTTP ${response.statusCode}`)));
                              });
    call.on("error", reject);
    call.end(restBody);
  });
}

async function run(makeClient, clients) {
  const latencies = [];
  const callers = Array.from({length: clients}, makeClient);
  // Warm-up: connections open and the first inference done before timing.
  await Promise.all(callers.map((call) => call()));
  const end = performance.now() + duration;
  await Promise.all(callers.map(async (call) => {
    while (performance.now() < end) {
      const start = performance.now();
      await call();
      latencies.push(performance.now() - start);
    }
  }));
  latencies.sort((a, b) => a - b);
  const at = (q) => latencies[Math.min(latencies.length - 1, Math.floor(q * latencies.length))];
  return {rps: latencies.length / (duration / 1000), p50: at(0.5), p99: at(0.99)};
}

console.log("transport          clients  requests/s  p50 ms  p99 ms");
for (const clients of concurrencies) {
  // Alternate the transports so that neither always runs on a warmer machine.
  for (const [name, make] of [["REST JSON", restClient], ["gRPC raw", grpcClient]]) {
    const result = await run(make, clients);
    console.log(`${name.padEnd(18)} ${String(clients).padStart(7)}  ` +
                `${result.rps.toFixed(0).padStart(10)}  ${result.p50.toFixed(2).padStart(6)}  ` +
                `${result.p99.toFixed(2).padStart(6)}`);
  }
}
process.exit(0);
