// `ossrt bench` end to end on the CPU (docs/bench.md):
//  - `bench serve` against a real `ossrt serve` (tiny preset, CPU engine) on 127.0.0.1: a short
//    concurrency sweep whose JSON must agree with the server's own /metrics counters (requests,
//    prompt and output tokens), with ordered percentiles and aggregates that a recomputation from
//    the per-request records reproduces, and plots that render; a chat run replaying a JSONL file in which the server
//    refuses two requests, which must be reported with the server's error bodies, not dropped;
//  - `bench serve` against a stand-in for another vendor's server (only the HTTP API is used),
//    which refuses one request and breaks another off mid-stream;
//  - `bench cost` on tiny writes its tables, CSV and SVG plots; the SVGs parse as XML (xmllint)
//    and render to PNG with rsvg-convert;
//  - tools/maint/bench_index.py indexes a run folder made of those results;
//    a second run measures a list of formats (--quantization auto,bf16,mxfp4,fp8: f32 once, fp8);
//  - the refusals: an unknown --quantization, mxfp4 on a checkpoint with bf16 experts, and
//    `bench kernels` in a build without CUDA.
'use strict';
const test = require('node:test');
const assert = require('node:assert/strict');
const fs = require('node:fs');
const http = require('node:http');
const os = require('node:os');
const path = require('node:path');
const { spawn, spawnSync } = require('node:child_process');
// Against the sanitized server (scripts/test.sh's sanitizer stage) every bound scales by timeScale.
const { startServer, timeScale } = require('./harness');

const BIN = process.env.OSSRT_BIN || path.join(__dirname, '..', '..', 'build', 'ossrt');
const KEY = 'sk-bench-test';

// Runs ossrt asynchronously (the server's output pipes must keep draining meanwhile).
function run(args, { timeoutMs = 300000 * timeScale } = {}) {
  return new Promise((resolve) => {
    const p = spawn(BIN, args, { stdio: ['ignore', 'pipe', 'pipe'] });
    let stdout = '';
    let stderr = '';
    p.stdout.on('data', (d) => { stdout += d; });
    p.stderr.on('data', (d) => { stderr += d; });
    const timer = setTimeout(() => p.kill('SIGKILL'), timeoutMs);
    p.on('exit', (code) => { clearTimeout(timer); resolve({ code, stdout, stderr }); });
  });
}

// Every sample of a metric family summed (all label sets), from Prometheus text.
async function counters(baseURL) {
  const text = await (await fetch(`${baseURL}/metrics`)).text();
  const sum = (name, filter = () => true) => text.split('\n')
    .filter((l) => (l.startsWith(`${name}{`) || l.startsWith(`${name} `)) && filter(l))
    .reduce((acc, l) => acc + Number(l.slice(l.lastIndexOf(' ') + 1)), 0);
  return {
    requests: sum('vllm:request_success_total'),
    prompt: sum('vllm:prompt_tokens_total'),
    generation: sum('vllm:generation_tokens_total'),
    chat400: sum('http_requests_total', (l) => l.includes('handler="/v1/chat/completions"') && l.includes('status="400"')),
  };
}

// numpy.percentile's linear interpolation, written independently of the C++ one.
function pct(values, p) {
  if (!values.length) return 0;
  const s = [...values].sort((a, b) => a - b);
  const r = (p / 100) * (s.length - 1);
  const lo = Math.floor(r);
  const hi = Math.min(lo + 1, s.length - 1);
  return s[lo] + (s[hi] - s[lo]) * (r - lo);
}

function assertOrdered(summary, what) {
  const chain = [summary.min, summary.median, summary.p90, summary.p99, summary.max];
  for (let i = 1; i < chain.length; i += 1) {
    assert.ok(chain[i - 1] <= chain[i] + 1e-9, `${what}: min <= median <= p90 <= p99 <= max, got ${JSON.stringify(summary)}`);
  }
  assert.ok(summary.mean >= summary.min - 1e-9 && summary.mean <= summary.max + 1e-9, `${what}: mean within range`);
}

// An SVG is well-formed XML (xmllint) and a real renderer from Debian (rsvg-convert) draws it.
function renders(svg) {
  const name = path.basename(svg);
  const lint = spawnSync('xmllint', ['--noout', svg], { encoding: 'utf8' });
  assert.equal(lint.status, 0, `${name} is well-formed XML: ${lint.stderr}`);
  const png = svg.replace(/\.svg$/, '.png');
  const render = spawnSync('rsvg-convert', ['-o', png, svg], { encoding: 'utf8' });
  assert.equal(render.status, 0, `rsvg-convert ${name}: ${render.stderr}`);
  const bytes = fs.readFileSync(png);
  assert.ok(bytes.length > 1000, `${name}: a real image`);
  assert.equal(bytes.subarray(1, 4).toString(), 'PNG');
}

const near = (a, b, what, tol = 1e-6) => assert.ok(Math.abs(a - b) <= tol * Math.max(1, Math.abs(b)), `${what}: ${a} vs ${b}`);

let server;
let tmp;
test.before(async () => {
  tmp = fs.mkdtempSync(path.join(os.tmpdir(), 'ossrt-bench-'));
  server = await startServer(['--api-key', KEY, '--max-model-len', '512', '--max-num-seqs', '8', '--threads', '2'],
    { timeoutMs: 180000 * timeScale });
});
test.after(async () => {
  if (server) {
    const exit = await server.stop('SIGTERM');
    assert.equal(exit.code, 0, server.output());
  }
  fs.rmSync(tmp, { recursive: true, force: true });
});

test('bench serve: a concurrency sweep agrees with the server\'s own counts', { timeout: 300000 * timeScale }, async () => {
  const before = await counters(server.baseURL);
  const dir = path.join(tmp, 'serve');
  const r = await run(['bench', 'serve', '--base-url', `${server.baseURL}/v1`, '--api-key', KEY,
    '--dataset', 'random', '--input-len', '24', '--output-len', '6', '--range-ratio', '0.5', '--ignore-eos',
    '--max-concurrency', '1,4', '--num-prompts', '3,6', '--seed', '7', '--slo', 'ttft=600000,tpot=600000',
    '--gpus', '2', '--result-dir', dir]);
  assert.equal(r.code, 0, r.stderr + r.stdout);
  assert.doesNotMatch(r.stderr, /\[=+/, 'no progress bar when stderr is not a terminal');
  const table = r.stdout.slice(r.stdout.lastIndexOf('ossrt bench serve:'));
  assert.match(table, /concurrency/);
  assert.match(table, /TTFT p99/);

  const out = JSON.parse(fs.readFileSync(path.join(dir, 'serve.json'), 'utf8'));
  assert.equal(out.model, 'gpt-oss', 'the model came from /v1/models');
  assert.equal(out.server.models.data[0].id, 'gpt-oss');
  const info = out.server.server_info;
  assert.match(info.commit, /^([0-9a-f]{40}(\+dirty)?|unknown)$/);
  assert.equal(info.backend, 'cpu');
  assert.equal(info.model.name, 'tiny');
  assert.equal(info.quantization, 'f32');
  const metricsText = await (await fetch(`${server.baseURL}/metrics`)).text();
  assert.match(metricsText, /^ossrt:weight_format_info\{[^}]*quantization="f32"[^}]*\} 1$/m);
  assert.match(metricsText, /^ossrt:weight_format_info\{[^}]*backend="cpu"[^}]*\} 1$/m);
  assert.equal(info.engine.max_model_len, 512);
  assert.equal(out.settings.endpoint, '/v1/completions');
  assert.deepEqual(out.settings.max_concurrency, [1, 4]);
  assert.equal(out.runs.length, 2);

  const after = await counters(server.baseURL);
  let outputs = 0;
  let prompts = 0;
  let requests = 0;
  for (const [i, run] of out.runs.entries()) {
    const n = [3, 6][i];
    assert.equal(run.num_prompts, n);
    assert.equal(run.completed, n);
    assert.equal(run.failed, 0);
    assert.equal(run.requests.length, n);
    assert.ok(run.max_concurrent_requests <= [1, 4][i], `cap ${[1, 4][i]} held: ${run.max_concurrent_requests}`);
    requests += run.requests.length;
    for (const q of run.requests) {
      assert.equal(q.success, true);
      assert.equal(q.output_tokens_source, 'usage');
      assert.equal(q.output_tokens, q.expected_output_len, 'ignore_eos: every answer runs to max_tokens');
      assert.equal(q.server_prompt_tokens, q.prompt_len, 'token-id prompts have exact lengths');
      assert.ok(q.prompt_len >= 12 && q.prompt_len <= 36);
      assert.ok(q.ttft_s > 0 && q.ttft_s <= q.e2el_s, 'TTFT within E2EL');
      assert.equal(q.itl_s.length, q.chunks - 1);
      outputs += q.output_tokens;
      prompts += q.prompt_len;
    }
    // Aggregates recomputed from the records.
    const ok = run.requests.filter((q) => q.success);
    assert.equal(run.total_output_tokens, ok.reduce((a, q) => a + q.output_tokens, 0));
    assert.equal(run.total_input_tokens, ok.reduce((a, q) => a + q.prompt_len, 0));
    near(run.output_throughput, run.total_output_tokens / run.duration_s, 'output tok/s');
    near(run.request_throughput, n / run.duration_s, 'req/s');
    near(run.ttft_ms.median, pct(ok.map((q) => q.ttft_s * 1000), 50), 'TTFT median');
    near(run.ttft_ms.p99, pct(ok.map((q) => q.ttft_s * 1000), 99), 'TTFT p99');
    near(run.e2el_ms.p90, pct(ok.map((q) => q.e2el_s * 1000), 90), 'E2EL p90');
    near(run.itl_ms.median, pct(ok.flatMap((q) => q.itl_s.map((x) => x * 1000)), 50), 'ITL median (pooled)');
    near(run.tpot_ms.mean, ok.filter((q) => q.output_tokens > 1)
      .reduce((a, q) => a + (q.e2el_s - q.ttft_s) / (q.output_tokens - 1) * 1000, 0) / ok.filter((q) => q.output_tokens > 1).length, 'TPOT mean');
    for (const m of ['ttft_ms', 'tpot_ms', 'itl_ms', 'e2el_ms']) assertOrdered(run[m], m);
    assert.equal(run.good_requests, n, 'generous SLOs: every request is good');
    near(run.request_goodput, run.request_throughput, 'goodput');
    assert.equal(run.spec_decode, null, 'no speculation: no acceptance figures');
  }
  // The server counted exactly what the benchmark reports.
  assert.equal(after.requests - before.requests, requests);
  assert.equal(after.generation - before.generation, outputs);
  assert.equal(after.prompt - before.prompt, prompts);

  const summary = fs.readFileSync(path.join(dir, 'serve_summary.csv'), 'utf8').trim().split('\n');
  assert.equal(summary.length, 3);
  assert.match(summary[0], /^max_concurrency,num_prompts,completed,failed/);
  assert.equal(fs.readFileSync(path.join(dir, 'serve_requests.csv'), 'utf8').trim().split('\n').length, 1 + 9);
  // The seed's cost arithmetic on the measured throughput (--gpus 2 at $3.00 per GPU-hour).
  for (const run of out.runs) {
    near(run.output_throughput_per_gpu, run.output_throughput / 2, 'tok/s per GPU');
    near(run.usd_per_m_output, 3 * 2 / 3600 / run.output_throughput * 1e6, '$/M output');
    near(run.tok_s_per_user, 1000 / run.tpot_ms.mean, 'tok/s per user');
  }
  for (const name of ['serve_throughput.svg', 'serve_latency.svg']) renders(path.join(dir, name));
  const svg = fs.readFileSync(path.join(dir, 'serve_throughput.svg'), 'utf8');
  for (const label of ['C=1', 'C=4']) assert.ok(svg.includes(label), label);
});

test('bench serve: refused requests are reported with the server\'s error bodies', { timeout: 300000 * timeScale }, async () => {
  const file = path.join(tmp, 'requests.jsonl');
  const chat = (content, extra = {}) => JSON.stringify({ messages: [{ role: 'user', content }], max_completion_tokens: 4, ...extra });
  fs.writeFileSync(file, [
    chat('first question'),
    chat('a refused request', { max_completion_tokens: -5 }),
    chat('second question'),
    chat('far too long '.repeat(400)),
    chat('third question'),
  ].join('\n') + '\n');
  const before = await counters(server.baseURL);
  const dir = path.join(tmp, 'file');
  const r = await run(['bench', 'serve', '--base-url', server.baseURL, '--api-key', KEY, '--endpoint', '/v1/chat/completions',
    '--model', 'gpt-oss', '--dataset', 'file', '--dataset-path', file, '--num-prompts', '5', '--warmup', '1',
    '--max-concurrency', '2', '--request-rate', '50', '--ignore-eos', '--extra-body', '{"reasoning_effort":"low"}',
    '--result-dir', dir]);
  assert.equal(r.code, 0, r.stderr + r.stdout);
  assert.match(r.stdout, /Failed requests:\s+2/);
  const out = JSON.parse(fs.readFileSync(path.join(dir, 'serve.json'), 'utf8'));
  const run0 = out.runs[0];
  assert.equal(run0.completed, 3);
  assert.equal(run0.failed, 2);
  assert.equal(run0.warmup_requests, 1);
  assert.equal(run0.warmup_failed, 0);
  const failed = run0.requests.filter((q) => !q.success);
  assert.deepEqual(failed.map((q) => q.index), [1, 3]);
  for (const q of failed) {
    assert.equal(q.http_status, 400);
    assert.match(q.error, /^HTTP 400: \{"error"/, 'the body is kept as the server sent it');
  }
  assert.match(failed[0].error, /max_completion_tokens/);
  assert.match(failed[1].error, /context/);
  assert.equal(run0.errors.length, 2);
  assert.equal(run0.errors.reduce((a, e) => a + e.count, 0), 2);
  for (const q of run0.requests.filter((x) => x.success)) assert.equal(q.output_tokens, 4);
  const after = await counters(server.baseURL);
  assert.equal(after.requests - before.requests, 3 + 1, 'three measured requests and the warm-up succeeded');
  assert.equal(after.generation - before.generation, 4 * 4);
  assert.equal(after.chat400 - before.chat400, 2, 'the server refused exactly the two the benchmark reports');
});

// A stand-in for another vendor's OpenAI-compatible server (Node's http: chunked bodies, CRLF
// event endings, keep-alive comments, no /v1/server_info): it records what it was sent and answers
// by arrival order: the third request is refused (503), the fifth breaks off mid-stream.
function startMockServer() {
  const seen = [];
  const srv = http.createServer((req, res) => {
    if (req.method === 'GET' && req.url === '/v1/models') {
      res.writeHead(200, { 'content-type': 'application/json' });
      res.end(JSON.stringify({ object: 'list', data: [{ id: 'mock-model', object: 'model' }] }));
      return;
    }
    if (req.method !== 'POST' || req.url !== '/v1/completions') {
      res.writeHead(404, { 'content-type': 'application/json' });
      res.end(JSON.stringify({ error: { message: `no route ${req.url}` } }));
      return;
    }
    let body = '';
    req.on('data', (d) => { body += d; });
    req.on('end', async () => {
      const j = JSON.parse(body);
      const k = seen.length;
      seen.push({ body: j, auth: req.headers.authorization });
      if (k === 2) {
        res.writeHead(503, { 'content-type': 'application/json' });
        res.end(JSON.stringify({ error: { message: 'overloaded, try later', type: 'server_error' } }));
        return;
      }
      res.writeHead(200, { 'content-type': 'text/event-stream', 'cache-control': 'no-cache' });
      const sleep = (ms) => new Promise((r) => setTimeout(r, ms));
      const chunk = (o) => res.write(`data: ${JSON.stringify(o)}\r\n\r\n`);
      await sleep(30);
      res.write(': keep-alive\r\n\r\n');
      for (let i = 0; i < j.max_tokens; i += 1) {
        if (k === 4 && i === 2) { res.destroy(); return; }
        chunk({ id: `c${k}`, object: 'text_completion', model: j.model,
          choices: [{ index: 0, text: ` t${i}`, finish_reason: i + 1 === j.max_tokens ? 'length' : null }] });
        await sleep(5);
      }
      chunk({ id: `c${k}`, object: 'text_completion', model: j.model, choices: [],
        usage: { prompt_tokens: j.prompt.length, completion_tokens: j.max_tokens, total_tokens: j.prompt.length + j.max_tokens } });
      res.end('data: [DONE]\r\n\r\n');
    });
  });
  return new Promise((resolve) => srv.listen(0, '127.0.0.1', () => resolve({ srv, seen, port: srv.address().port })));
}

test('bench serve against another OpenAI-compatible server: only the HTTP API is used', { timeout: 120000 * timeScale }, async () => {
  const mock = await startMockServer();
  try {
    const dir = path.join(tmp, 'mock');
    const r = await run(['bench', 'serve', '--base-url', `http://127.0.0.1:${mock.port}/v1`, '--api-key', 'sk-other',
      '--input-len', '20', '--output-len', '5', '--num-prompts', '6', '--max-concurrency', '2', '--seed', '3',
      '--result-dir', dir]);
    assert.equal(r.code, 0, r.stderr + r.stdout);
    assert.equal(mock.seen.length, 6, 'every request reached the server once');
    for (const { body, auth } of mock.seen) {
      assert.equal(auth, 'Bearer sk-other');
      assert.equal(body.model, 'mock-model', 'the model named by /v1/models');
      assert.equal(body.stream, true);
      assert.deepEqual(body.stream_options, { include_usage: true });
      assert.equal(body.prompt.length, 20, 'a token-id prompt of the exact length');
      assert.equal(body.max_tokens, 5);
    }
    const out = JSON.parse(fs.readFileSync(path.join(dir, 'serve.json'), 'utf8'));
    assert.equal(out.server.server_info.status, 404, 'no metadata route: recorded, not fatal');
    const run0 = out.runs[0];
    assert.equal(run0.completed, 4);
    assert.equal(run0.failed, 2);
    assert.equal(run0.total_output_tokens, 4 * 5);
    assert.equal(run0.total_input_tokens, 4 * 20);
    assert.ok(run0.max_concurrent_requests <= 2);
    const messages = run0.errors.map((e) => e.message).join('\n');
    assert.match(messages, /HTTP 503: .*overloaded, try later/);
    assert.match(messages, /reading the answer/);
    for (const q of run0.requests.filter((x) => x.success)) {
      assert.equal(q.output_tokens, 5);
      assert.equal(q.chunks, 5);
      assert.equal(q.itl_s.length, 4);
      assert.equal(q.finish_reason, 'length');
      assert.ok(q.ttft_s >= 0.029, `the server waited 30 ms before its first token: ${q.ttft_s}`);
      assert.ok(q.e2el_s >= q.ttft_s + 4 * 0.0045, `five tokens 5 ms apart: ${q.e2el_s}`);
    }
    assert.match(r.stdout, /Failed requests:\s+2/);
  } finally {
    mock.srv.close();
  }
});

test('bench cost on tiny: tables, CSV and SVG plots that parse and render', { timeout: 300000 * timeScale }, async () => {
  const dir = path.join(tmp, 'cost');
  const r = await run(['bench', 'cost', '--threads', '2', '--max-model-len', '512', '--input-lens', '16,64',
    '--batch-sizes', '1,2,4', '--contexts', '16,64', '--decode-steps', '4', '--warmup-steps', '1', '--repeats', '1',
    '--usd-per-hour', '3', '--result-dir', dir]);
  assert.equal(r.code, 0, r.stderr + r.stdout);
  assert.match(r.stdout, /Prefill: one request alone/);
  assert.match(r.stdout, /Decode: B requests decoding together/);
  assert.match(r.stdout, /quantization: f32 \(one runtime per format/);
  const out = JSON.parse(fs.readFileSync(path.join(dir, 'cost.json'), 'utf8'));
  assert.equal(out.model, 'tiny');
  assert.equal(out.gpus, 1);
  assert.equal(out.prefill.length, 2);
  assert.equal(out.decode.length, 6);
  for (const p of out.prefill) {
    assert.equal(p.skipped, null);
    assert.ok(p.latency_s > 0);
    near(p.usd_per_m_input, 3 / 3600 / (p.input_len / p.latency_s) * 1e6, 'prefill $/M');
  }
  for (const p of out.decode) {
    assert.equal(p.skipped, null, JSON.stringify(p));
    assert.equal(p.measured_steps, 4);
    assert.ok(p.tok_s_per_gpu > 0 && p.tok_s_per_user > 0);
    near(p.tok_s_per_user, 1 / p.itl_mean_s, 'per-user speed is 1 / ITL');
    near(p.usd_per_m_output, 3 / 3600 / p.tok_s_per_gpu * 1e6, 'decode $/M');
    assert.ok(p.mean_context >= p.context);
  }
  const csv = fs.readFileSync(path.join(dir, 'cost_decode.csv'), 'utf8').trim().split('\n');
  assert.equal(csv.length, 1 + 6);
  assert.equal(fs.readFileSync(path.join(dir, 'cost_prefill.csv'), 'utf8').trim().split('\n').length, 1 + 2);
  for (const name of ['cost_decode.svg', 'cost_throughput.svg', 'cost_prefill.svg']) renders(path.join(dir, name));
  const decodeSvg = fs.readFileSync(path.join(dir, 'cost_decode.svg'), 'utf8');
  for (const label of ['B=1', 'B=2', 'B=4', '16 ctx, f32', '64 ctx, f32']) assert.ok(decodeSvg.includes(label), label);

  // A sweep split over two runs (as over two device calls), merged without the engine. The second
  // measures a list of formats in one run: auto, bf16 and mxfp4 are all f32 on the CPU (measured
  // once), fp8 gets its own runtime and its own points.
  const dir2 = path.join(tmp, 'cost2');
  const r2 = await run(['bench', 'cost', '--threads', '2', '--max-model-len', '512', '--no-prefill', '--batch-sizes', '1,2',
    '--contexts', '32', '--decode-steps', '4', '--warmup-steps', '1', '-q', 'auto,bf16,mxfp4,fp8', '--result-dir', dir2]);
  assert.equal(r2.code, 0, r2.stderr + r2.stdout);
  const second = JSON.parse(fs.readFileSync(path.join(dir2, 'cost.json'), 'utf8'));
  assert.equal(second.prefill.length, 0);
  assert.deepEqual(second.decode.map((p) => `${p.quantization} ${p.batch}`), ['f32 1', 'f32 2', 'fp8 1', 'fp8 2']);
  assert.equal(second.engine.quantization, 'f32,fp8');
  assert.match(second.engine.per_quantization.fp8.describe, /quantization fp8\) on cpu/);
  assert.match(second.engine.per_quantization.f32.describe, /quantization f32\) on cpu/);
  assert.match(r2.stdout, /quantization: f32, fp8 \(one runtime per format/);
  assert.match(r2.stdout, /^\s*fp8\s+32\s+2\s/m);
  const merged = path.join(tmp, 'cost_merged');
  const m = await run(['bench', 'cost', '--from-json', `${dir}/cost.json,${dir2}/cost.json`, '--result-dir', merged]);
  assert.equal(m.code, 0, m.stderr + m.stdout);
  const all = JSON.parse(fs.readFileSync(path.join(merged, 'cost.json'), 'utf8'));
  assert.equal(all.decode.length, 6 + 4);
  // Every point carried over unchanged, in (quantization, context, batch) order: the second run's
  // context 32 falls between the first run's 16 and 64.
  const key = (p) => [p.quantization, p.context, p.batch];
  const expected = [...out.decode, ...second.decode].sort((a, b) =>
    a.quantization.localeCompare(b.quantization) || a.context - b.context || a.batch - b.batch);
  assert.deepEqual(all.decode, expected, 'points carried over unchanged, sorted');
  assert.deepEqual(all.decode.map(key).map((k) => `${k[0]} ${k[1]}`),
    ['f32 16', 'f32 16', 'f32 16', 'f32 32', 'f32 32', 'f32 64', 'f32 64', 'f32 64', 'fp8 32', 'fp8 32']);
  assert.equal(all.settings.merged_runs.length, 2);
  renders(path.join(merged, 'cost_decode.svg'));
  assert.ok(fs.readFileSync(path.join(merged, 'cost_decode.svg'), 'utf8').includes('32 ctx, f32'));
});

test('bench/results index: a run folder of serve and cost results gets its row', { timeout: 60000 * timeScale }, () => {
  // Runs after the serve and cost tests: their result folders become one run folder.
  const results = path.join(tmp, 'results');
  const runDir = path.join(results, '20261202_cpu_tiny_f32_test');
  fs.mkdirSync(runDir, { recursive: true });
  fs.cpSync(path.join(tmp, 'serve'), path.join(runDir, 'serve_24_6'), { recursive: true });
  fs.cpSync(path.join(tmp, 'cost'), path.join(runDir, 'cost'), { recursive: true });
  const r = spawnSync('python3', [path.join(__dirname, '..', '..', 'tools', 'maint', 'bench_index.py'), '--results', results],
    { encoding: 'utf8' });
  assert.equal(r.status, 0, r.stderr);
  const readme = fs.readFileSync(path.join(results, 'README.md'), 'utf8');
  const serve = JSON.parse(fs.readFileSync(path.join(runDir, 'serve_24_6', 'serve.json'), 'utf8'));
  const row = readme.split('\n').find((l) => l.startsWith('| [20261202_cpu_tiny_f32_test]'));
  assert.ok(row, readme);
  assert.match(row, /\| tiny \| f32 \|/);
  assert.match(row, /serve 24\/6: C=1 /);
  assert.ok(row.includes(`C=4 ${Math.round(serve.runs[1].output_throughput).toLocaleString('en-US')} tok/s`), row);
  assert.match(row, /cost: .*decode 16: B=1 /);
  // Run again: the table is replaced, not appended.
  spawnSync('python3', [path.join(__dirname, '..', '..', 'tools', 'maint', 'bench_index.py'), '--results', results]);
  assert.equal(fs.readFileSync(path.join(results, 'README.md'), 'utf8'), readme);
});

test('bench refusals: an unknown --quantization, mxfp4 without MXFP4 experts, kernels without CUDA', { timeout: 120000 * timeScale }, async () => {
  const q = await run(['bench', 'cost', '--quantization', 'auto,int8', '--input-lens', '16', '--batch-sizes', '1', '--contexts', '16']);
  assert.notEqual(q.code, 0);
  assert.match(q.stderr, /--quantization: int8 not in \{auto,bf16,mxfp4,fp8,mxfp4-fp8\}/);
  const bf16Experts = path.join(__dirname, '..', 'golden', 'bf16_single');
  const m = await run(['bench', 'cost', '--model', bf16Experts, '-q', 'fp8,mxfp4', '--threads', '2', '--input-lens', '16',
    '--batch-sizes', '1', '--contexts', '16']);
  assert.notEqual(m.code, 0);
  assert.match(m.stderr, /^error: --quantization mxfp4: the experts of bf16_single are not MXFP4/m);
  assert.doesNotMatch(m.stdout, /Prefill/, 'refused before anything is measured');
  const help = await run(['bench', 'kernels', '--help']);
  assert.equal(help.code, 0);
  for (const flag of ['--models', '--decode-tokens', '--prefill-tokens', '--iterations', '--result-dir']) assert.match(help.stdout, new RegExp(flag));
  const k = await run(['bench', 'kernels', '--models', 'gpt-oss-20b', '--iterations', '1']);
  assert.notEqual(k.code, 0);
  assert.match(k.stderr, /built without CUDA|needs a CUDA GPU/);
});
