// Every command builds its model through one builder (src/runtime) from the same flags: given the
// same model options, `ossrt logits` (the model alone), `ossrt generate` and `ossrt serve` (the
// engine) must see the same logits, and `ossrt chat` the same memory plan. The logits file is the
// reference; generate's and the server's top logprobs must be its log-softmax. Once with the default
// weight format (f32 on the CPU) and once with `--quantization fp8`, whose name every command reports.
'use strict';
const test = require('node:test');
const assert = require('node:assert/strict');
const fs = require('node:fs');
const os = require('node:os');
const path = require('node:path');
const { spawnSync, spawn } = require('node:child_process');
const { startServer, rawPost } = require('./harness');

const bin = process.env.OSSRT_BIN || path.join(__dirname, '..', '..', 'build', 'ossrt');
// The same model options for every command (a seed other than 0, so a default could not match).
const BASE_MODEL = ['--model', 'tiny', '--load-format', 'dummy', '--weights-seed', '7', '--threads', '2'];
const MODEL = BASE_MODEL;
const ENGINE = ['--kv-cache-bytes', String(64 << 20), '--max-model-len', '1024', '--max-num-batched-tokens', '64'];
const PROMPT = Array.from({ length: 40 }, (_, i) => (i * 7919 + 13) % 150000);

function readNpyF32(file) {
  const buf = fs.readFileSync(file);
  const headerLen = buf.readUInt16LE(8);
  const header = buf.subarray(10, 10 + headerLen).toString('latin1');
  const shape = header.match(/'shape': \((\d+), (\d+)\)/).slice(1).map(Number);
  const data = new Float32Array(buf.buffer.slice(buf.byteOffset + 10 + headerLen, buf.byteOffset + buf.length));
  return { shape, row: (r) => data.subarray(r * shape[1], (r + 1) * shape[1]) };
}

function logSoftmax(row) {
  let max = -Infinity;
  for (const v of row) max = Math.max(max, v);
  let sum = 0;
  for (const v of row) sum += Math.exp(v - max);
  const lse = max + Math.log(sum);
  return (id) => row[id] - lse;
}

function run(args) {
  const r = spawnSync(bin, args, { encoding: 'utf8', timeout: 300000 });
  assert.equal(r.status, 0, `${args.join(' ')}\n${r.stderr}`);
  return r;
}

async function sameModelEverywhere(quantization, name) {
  const MODEL = [...BASE_MODEL, '--quantization', quantization];
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'ossrt-runtime-'));
  const ids = path.join(dir, 'ids.json');
  fs.writeFileSync(ids, JSON.stringify(PROMPT));
  run(['logits', ...MODEL, '--ids-file', ids, '--out', path.join(dir, 'logits.npy'), '--chunk', '16']);
  const logits = readNpyF32(path.join(dir, 'logits.npy'));
  assert.deepEqual(logits.shape, [PROMPT.length, 201088]);
  const last = logits.row(PROMPT.length - 1);
  const ref = logSoftmax(last);
  let argmax = 0;
  for (let i = 1; i < last.length; i++) if (last[i] > last[argmax]) argmax = i;

  const gen = run(['generate', ...MODEL, ...ENGINE, '--prompt-ids-file', ids, '--max-tokens', '1', '--temperature', '0',
    '--ignore-eos', '--format', 'json', '--logprobs', '5', '--verbose']);
  assert.match(gen.stderr, new RegExp(`quantization ${name}\\) on cpu`), gen.stderr);
  const out = JSON.parse(gen.stdout);
  assert.equal(out.ids[0], argmax, 'generate picks the logits file\'s argmax');
  for (const { id, logprob } of out.logprobs[0].top) {
    assert.ok(Math.abs(logprob - ref(id)) < 1e-4, `generate: token ${id} logprob ${logprob} vs ${ref(id)}`);
  }

  const server = await startServer([...MODEL, ...ENGINE], { timeoutMs: 180000 });
  try {
    const r = await rawPost(server.baseURL, '/v1/completions',
      JSON.stringify({ prompt: PROMPT, max_tokens: 1, temperature: 0, logprobs: 5, ignore_eos: true }));
    assert.equal(r.status, 200, r.text);
    const lp = r.json.choices[0].logprobs;
    assert.ok(Math.abs(lp.token_logprobs[0] - ref(argmax)) < 1e-4, `serve: ${lp.token_logprobs[0]} vs ${ref(argmax)}`);
    // Top alternatives come keyed by token text: compare the values, best first.
    const got = Object.values(lp.top_logprobs[0]).sort((a, b) => b - a);
    const want = Array.from(last.keys()).sort((a, b) => last[b] - last[a]).slice(0, got.length).map(ref);
    got.forEach((v, i) => assert.ok(Math.abs(v - want[i]) < 1e-4, `serve top ${i}: ${v} vs ${want[i]}`));
    const info = await (await fetch(`${server.baseURL}/v1/server_info`)).json();
    assert.equal(info.quantization, name);
    const metrics = await (await fetch(`${server.baseURL}/metrics`)).text();
    assert.match(metrics, new RegExp(`^ossrt:weight_format_info\\{[^}]*quantization="${name}"[^}]*\\} 1$`, 'm'));
  } finally {
    await server.stop();
  }
  return last;
}

test('logits, generate and serve build the same model from the same options', { timeout: 600000 }, async () => {
  const f32 = await sameModelEverywhere('auto', 'f32');
  const fp8 = await sameModelEverywhere('fp8', 'fp8');
  let d = 0;
  let n = 0;
  for (let i = 0; i < f32.length; i++) d += (fp8[i] - f32[i]) ** 2, n += f32[i] ** 2;
  assert.ok(Math.sqrt(d / n) > 1e-3, `fp8 moves the logits (relative L2 ${Math.sqrt(d / n)})`);
});

test('chat builds the same engine as generate from the same options (its memory plan line)', { timeout: 300000 }, async () => {
  const planOf = (stderr) => {
    const line = stderr.split('\n').find((l) => l.includes('memory plan'));
    assert.ok(line, stderr);
    return line.slice(line.indexOf('memory plan'));
  };
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'ossrt-runtime-'));
  const ids = path.join(dir, 'ids.json');
  fs.writeFileSync(ids, JSON.stringify(PROMPT));
  const gen = run(['generate', ...MODEL, ...ENGINE, '--prompt-ids-file', ids, '--max-tokens', '1', '--format', 'json']);
  const chat = spawnSync(bin, ['chat', ...MODEL, ...ENGINE, '--no-color', '--max-tokens', '4'],
    { input: 'hello\n/exit\n', encoding: 'utf8', timeout: 300000 });
  assert.equal(chat.status, 0, chat.stderr);
  const genPlan = planOf(gen.stderr);
  assert.equal(planOf(chat.stderr), genPlan);
  assert.match(genPlan, /KV cache .* = \d+ tokens/);
});
