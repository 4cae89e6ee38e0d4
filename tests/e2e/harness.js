// Starts `ossrt serve` on 127.0.0.1 with a free port and gives tests an `openai` SDK client.
// Used by every e2e test; the binary comes from $OSSRT_BIN (set by ctest) or build/ossrt.
'use strict';
const { spawn } = require('node:child_process');
const path = require('node:path');

const repoRoot = path.resolve(__dirname, '..', '..');
const sdk = require(path.join(repoRoot, 'third_party/npm/node_modules/openai'));
const OpenAI = sdk.OpenAI || sdk.default || sdk;

function ossrtBinary() {
  return process.env.OSSRT_BIN || path.join(repoRoot, 'build', 'ossrt');
}

// Resolves once /health says 200. Rejects if the process exits or `timeoutMs` passes.
// `binary`: what to run instead of ossrt (a wrapper that execs it, e.g. under a lower fd limit).
async function startServer(args, { timeoutMs = 120000, env = {}, binary = ossrtBinary() } = {}) {
  const proc = spawn(binary, ['serve', '--host', '127.0.0.1', '--port', '0', ...args], {
    stdio: ['ignore', 'pipe', 'pipe'],
    env: { ...process.env, ...env },
  });
  let output = '';
  let exited = null;
  proc.on('exit', (code, signal) => { exited = { code, signal }; });
  const port = await new Promise((resolve, reject) => {
    const timer = setTimeout(() => reject(new Error(`server did not listen in time:\n${output}`)), timeoutMs);
    const onData = (buf) => {
      output += buf.toString();
      const m = output.match(/listening on http:\/\/127\.0\.0\.1:(\d+)/);
      if (m) { clearTimeout(timer); resolve(Number(m[1])); }
    };
    proc.stdout.on('data', onData);
    proc.stderr.on('data', (buf) => { output += buf.toString(); });
    proc.on('exit', () => { clearTimeout(timer); reject(new Error(`server exited early:\n${output}`)); });
  });
  const baseURL = `http://127.0.0.1:${port}`;
  const deadline = Date.now() + timeoutMs;
  let healthSeen503 = false;
  for (;;) {
    if (exited) throw new Error(`server exited while loading:\n${output}`);
    try {
      const r = await fetch(`${baseURL}/health`);
      if (r.status === 200) break;
      if (r.status === 503) healthSeen503 = true;
    } catch (_) { /* not yet */ }
    if (Date.now() > deadline) throw new Error(`server not healthy in time:\n${output}`);
    await new Promise((r) => setTimeout(r, 50));
  }
  const server = {
    proc, port, baseURL, healthSeen503,
    output: () => output,
    client: (opts = {}) => new OpenAI({ baseURL: `${baseURL}/v1`, apiKey: opts.apiKey || 'unused', maxRetries: 0, ...opts }),
    async stop(signal = 'SIGTERM') {
      if (exited) return exited;
      const done = new Promise((resolve) => proc.on('exit', (code, sig) => resolve({ code, signal: sig })));
      proc.kill(signal);
      return done;
    },
  };
  return server;
}

// Raw HTTP for what the SDK cannot send (malformed JSON, oversized bodies).
async function rawPost(baseURL, route, body, headers = {}) {
  const r = await fetch(`${baseURL}${route}`, {
    method: 'POST', headers: { 'content-type': 'application/json', ...headers }, body,
  });
  const text = await r.text();
  let json = null;
  try { json = JSON.parse(text); } catch (_) { /* not JSON */ }
  return { status: r.status, headers: r.headers, text, json };
}

// Every OpenAI error body has exactly this shape.
function assertErrorShape(assert, body) {
  assert.ok(body && body.error, `error body: ${JSON.stringify(body)}`);
  for (const key of ['message', 'type', 'param', 'code']) assert.ok(key in body.error, `error.${key} missing`);
  assert.equal(typeof body.error.message, 'string');
}

async function metrics(baseURL) {
  const text = await (await fetch(`${baseURL}/metrics`)).text();
  const value = (name, labels = '') => {
    const line = text.split('\n').find((l) => l.startsWith(`${name}${labels} `) || (labels === '' && l.startsWith(`${name}{`)));
    return line ? Number(line.slice(line.lastIndexOf(' ') + 1)) : undefined;
  };
  return { text, value };
}

// Waits for a condition instead of a fixed time: polls `fn` (sync or async) until it returns a
// truthy value, which it returns; throws with `what` after `timeoutMs`.
async function waitFor(fn, { timeoutMs = 10000, intervalMs = 50, what = 'condition' } = {}) {
  const deadline = Date.now() + timeoutMs;
  for (;;) {
    let value;
    try { value = await fn(); } catch (_) { value = undefined; }
    if (value) return value;
    if (Date.now() > deadline) throw new Error(`timed out after ${timeoutMs} ms waiting for ${what}`);
    await new Promise((r) => setTimeout(r, intervalMs));
  }
}

// The sanitizer stage of scripts/test.sh runs these tests against an ASan+UBSan server (it exports
// ASAN_OPTIONS), which is several times slower: bounds on latency scale by this factor there, and
// the heaviest loads shrink.
const underSanitizer = Boolean(process.env.ASAN_OPTIONS);
const timeScale = underSanitizer ? 5 : 1;

module.exports = { startServer, rawPost, assertErrorShape, metrics, waitFor, OpenAI, repoRoot, underSanitizer, timeScale };
