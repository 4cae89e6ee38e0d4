// The real Engine on the embedded default model (`tiny` preset, dummy weights, CPU): random weights
// do not speak Harmony, so content is arbitrary; what is checked is the contract: 200s, shapes,
// usage arithmetic, max_tokens -> length, stream framing, concurrent streams, and no KV leak.
'use strict';
const test = require('node:test');
const assert = require('node:assert/strict');
const { startServer, metrics } = require('./harness');

let server;
let client;
test.before(async () => {
  server = await startServer(['--max-model-len', '1024', '--max-num-seqs', '16', '--threads', '2'], { timeoutMs: 180000 });
  client = server.client();
});
test.after(async () => {
  const exit = await server.stop('SIGTERM');
  assert.equal(exit.code, 0, server.output());
});

test('chat non-stream on the tiny engine', { timeout: 120000 }, async () => {
  const r = await client.chat.completions.create({ model: 'gpt-oss', messages: [{ role: 'user', content: 'Hello' }], max_tokens: 8, temperature: 0 });
  assert.equal(r.object, 'chat.completion');
  assert.ok(['length', 'stop', 'tool_calls'].includes(r.choices[0].finish_reason));
  assert.ok(r.usage.completion_tokens <= 8 && r.usage.completion_tokens >= 1);
  assert.equal(r.usage.total_tokens, r.usage.prompt_tokens + r.usage.completion_tokens);
  assert.ok(r.usage.prompt_tokens > 50, 'Harmony system message rendered');
  const content = r.choices[0].message.content ?? '';
  assert.ok(!content.includes('<|start|>') && !content.includes('<|channel|>'));
});

test('greedy stream equals greedy non-stream on the tiny engine', { timeout: 120000 }, async () => {
  const req = { model: 'gpt-oss', messages: [{ role: 'user', content: 'Count to three' }], max_tokens: 12, temperature: 0 };
  const n = await client.chat.completions.create(req);
  let content = '';
  let reasoning = '';
  let usage = null;
  for await (const c of await client.chat.completions.create({ ...req, stream: true, stream_options: { include_usage: true } })) {
    if (c.usage) usage = c.usage;
    if (!c.choices.length) continue;
    content += c.choices[0].delta.content || '';
    reasoning += c.choices[0].delta.reasoning || '';
  }
  assert.equal(content, n.choices[0].message.content ?? '');
  assert.equal(reasoning, n.choices[0].message.reasoning ?? '');
  assert.equal(usage.completion_tokens, n.usage.completion_tokens);
});

test('completions on the tiny engine, seeded sampling reproducible', { timeout: 120000 }, async () => {
  const req = { model: 'gpt-oss', prompt: 'The capital of France is', max_tokens: 6, temperature: 1.0, seed: 42 };
  const a = await client.completions.create(req);
  const b = await client.completions.create(req);
  assert.equal(a.choices[0].text, b.choices[0].text);
  assert.equal(a.usage.completion_tokens, b.usage.completion_tokens);
});

test('16 concurrent streams on the tiny engine, no KV leak', { timeout: 180000 }, async () => {
  const runs = Array.from({ length: 16 }, (_, i) => (async () => {
    let chunks = 0;
    let finish = null;
    for await (const c of await client.chat.completions.create({ model: 'gpt-oss', messages: [{ role: 'user', content: `request ${i}` }], stream: true, max_tokens: 6 })) {
      chunks++;
      if (c.choices.length && c.choices[0].finish_reason) finish = c.choices[0].finish_reason;
    }
    return { chunks, finish };
  })());
  const results = await Promise.all(runs);
  for (const r of results) assert.ok(r.finish, 'every stream finished');
  let m;
  for (let i = 0; i < 100; i++) {
    m = await metrics(server.baseURL);
    if (m.value('vllm:num_requests_running') === 0) break;
    await new Promise((r) => setTimeout(r, 50));
  }
  assert.equal(m.value('vllm:num_requests_running'), 0);
  assert.equal(m.value('vllm:kv_cache_usage_perc'), 0);
});

// Chat logprobs on the real engine: shape, ranges, ordering, and the greedy identity "the chosen
// token is the most likely one" (temperature 0), non-stream and stream.
function checkLogprobEntries(entries, topN) {
  for (const e of entries) {
    assert.equal(typeof e.token, 'string');
    assert.ok(Number.isFinite(e.logprob) && e.logprob <= 0, `logprob ${e.logprob}`);
    assert.ok(Array.isArray(e.bytes) && e.bytes.every((b) => Number.isInteger(b) && b >= 0 && b < 256), 'bytes');
    const decoded = Buffer.from(e.bytes).toString('utf8');
    if (!decoded.includes('\uFFFD')) assert.equal(decoded, e.token, 'bytes spell the token');
    assert.equal(e.top_logprobs.length, topN);
    let mass = 0;
    for (let k = 0; k < e.top_logprobs.length; k++) {
      const t = e.top_logprobs[k];
      assert.ok(t.logprob <= 0 && Array.isArray(t.bytes) && typeof t.token === 'string');
      if (k > 0) assert.ok(t.logprob <= e.top_logprobs[k - 1].logprob, 'top_logprobs sorted, most likely first');
      mass += Math.exp(t.logprob);
    }
    assert.ok(mass <= 1 + 1e-4, `top probabilities sum to ${mass}`);
    // Greedy: the chosen token is the arg-max, so its logprob is the top entry's.
    if (topN > 0) assert.ok(Math.abs(e.logprob - e.top_logprobs[0].logprob) < 1e-5, `${e.logprob} vs top ${e.top_logprobs[0].logprob}`);
  }
}

test('chat logprobs + top_logprobs, non-stream and stream, on the tiny engine', { timeout: 180000 }, async () => {
  const req = { model: 'gpt-oss', messages: [{ role: 'user', content: 'Say something' }], max_tokens: 6, temperature: 0, logprobs: true, top_logprobs: 4 };
  const n = await client.chat.completions.create(req);
  const entries = n.choices[0].logprobs.content;
  assert.equal(entries.length, n.usage.completion_tokens, 'one entry per generated token');
  checkLogprobEntries(entries, 4);

  const streamed = [];
  let usage = null;
  for await (const c of await client.chat.completions.create({ ...req, stream: true, stream_options: { include_usage: true } })) {
    if (c.usage) usage = c.usage;
    if (c.choices.length && c.choices[0].logprobs) streamed.push(...c.choices[0].logprobs.content);
  }
  assert.equal(streamed.length, usage.completion_tokens);
  checkLogprobEntries(streamed, 4);
  assert.deepEqual(streamed.map((e) => e.token), entries.map((e) => e.token), 'greedy stream picks the same tokens');
  for (let i = 0; i < entries.length; i++) assert.ok(Math.abs(streamed[i].logprob - entries[i].logprob) < 1e-3);

  const none = await client.chat.completions.create({ ...req, top_logprobs: 0 });
  checkLogprobEntries(none.choices[0].logprobs.content, 0);
  const off = await client.chat.completions.create({ ...req, logprobs: false, top_logprobs: undefined });
  assert.equal(off.choices[0].logprobs, null);
});
