// Load test (bounded, loopback only): 1,000 concurrent streaming chat requests through the HTTP
// layer. The generator is the scripted replayer (the tiny CPU engine cannot serve 1,000 streams on
// a 2-core CI box within the time bound; real_engine.test.js covers real-engine concurrency).
// Asserts: every request answered 200, every stream well-formed ([DONE] last, role first, one
// finish_reason, content equal to the script), no KV blocks in use afterwards; reports p50/p99 TTFT.
'use strict';
const test = require('node:test');
const assert = require('node:assert/strict');
const http = require('node:http');
const path = require('node:path');
const { startServer, metrics } = require('./harness');

const STREAMS = Number(process.env.OSSRT_LOAD_STREAMS || 1000);
const SCRIPT = path.join(__dirname, 'load_replies.json');

function streamOnce(port, agent) {
  return new Promise((resolve) => {
    const body = JSON.stringify({ model: 'gpt-oss', messages: [{ role: 'user', content: 'hi' }], stream: true, max_tokens: 64 });
    const started = process.hrtime.bigint();
    let ttft = null;
    const req = http.request({ host: '127.0.0.1', port, path: '/v1/chat/completions', method: 'POST', agent,
      headers: { 'content-type': 'application/json', 'content-length': Buffer.byteLength(body) } }, (res) => {
      let raw = '';
      res.setEncoding('utf8');
      res.on('data', (d) => {
        if (ttft === null && d.includes('"choices":[{')) ttft = Number(process.hrtime.bigint() - started) / 1e6;
        raw += d;
      });
      res.on('end', () => resolve({ status: res.statusCode, raw, ttft }));
      res.on('error', (e) => resolve({ status: -1, raw, error: String(e) }));
    });
    req.on('error', (e) => resolve({ status: -1, raw: '', error: String(e) }));
    req.end(body);
  });
}

function checkStream(raw) {
  const events = raw.split('\n\n');
  if (events.pop() !== '') return 'stream does not end with a blank line';
  if (events[events.length - 1] !== 'data: [DONE]') return 'last event is not [DONE]';
  let content = '';
  let finishes = 0;
  let first = true;
  for (const e of events.slice(0, -1)) {
    if (!e.startsWith('data: ')) return `bad event line: ${e.slice(0, 40)}`;
    const chunk = JSON.parse(e.slice(6));
    const c = chunk.choices[0];
    if (first && c.delta.role !== 'assistant') return 'first chunk has no role';
    first = false;
    if (c.delta.content) content += c.delta.content;
    if (c.finish_reason) finishes += 1;
  }
  if (finishes !== 1) return `finish_reason count ${finishes}`;
  if (content !== 'Load test reply with a dozen or so tokens in it.') return `content mismatch: ${content}`;
  return null;
}

test(`${STREAMS} concurrent streams: none dropped, all well-formed, no KV leak`, { timeout: 240000 }, async () => {
  const server = await startServer(['--scripted-replies', SCRIPT, '--max-num-seqs', String(STREAMS), '--max-queue', String(STREAMS * 2)]);
  try {
    const agent = new http.Agent({ keepAlive: false, maxSockets: Infinity });
    const t0 = Date.now();
    const results = await Promise.all(Array.from({ length: STREAMS }, () => streamOnce(server.port, agent)));
    const seconds = (Date.now() - t0) / 1000;
    const failures = results.filter((r) => r.status !== 200);
    assert.equal(failures.length, 0, `non-200: ${JSON.stringify(failures.slice(0, 3))}`);
    const malformed = results.map((r) => checkStream(r.raw)).filter((e) => e);
    assert.equal(malformed.length, 0, `malformed: ${malformed.slice(0, 3)}`);
    const ttfts = results.map((r) => r.ttft).sort((a, b) => a - b);
    const pct = (p) => ttfts[Math.min(ttfts.length - 1, Math.floor(p * ttfts.length))];
    console.log(`load: ${STREAMS} streams in ${seconds.toFixed(2)} s, TTFT p50 ${pct(0.5).toFixed(1)} ms, p99 ${pct(0.99).toFixed(1)} ms`);
    let m;
    for (let i = 0; i < 100; i++) {
      m = await metrics(server.baseURL);
      if (m.value('ossrt:kv_blocks_in_use') === 0 && m.value('vllm:num_requests_running') === 0) break;
      await new Promise((r) => setTimeout(r, 50));
    }
    assert.equal(m.value('ossrt:kv_blocks_in_use'), 0, 'KV blocks leaked');
    assert.equal(m.value('vllm:num_requests_running'), 0);
    assert.match(m.text, new RegExp(`vllm:request_success_total\\{model_name="gpt-oss",finished_reason="stop"\\} ${STREAMS}`));
  } finally {
    await server.stop();
  }
});
