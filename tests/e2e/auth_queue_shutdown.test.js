// Server-level behaviour with the openai SDK: --api-key (401, /health open), a full queue (429 +
// Retry-After), a client that disconnects mid-stream (generation cancelled, KV freed), and SIGTERM
// draining an in-flight stream before a clean exit.
'use strict';
const test = require('node:test');
const assert = require('node:assert/strict');
const path = require('node:path');
const { startServer, rawPost, assertErrorShape, metrics } = require('./harness');

const SCRIPT = path.join(__dirname, 'scripted_replies.json');

test('api key: 401 without or with a wrong key, /health stays open', async () => {
  const server = await startServer(['--scripted-replies', SCRIPT, '--api-key', 'sk-test-123']);
  try {
    const health = await fetch(`${server.baseURL}/health`);
    assert.equal(health.status, 200);
    await assert.rejects(server.client({ apiKey: 'wrong' }).models.list(), (e) => e.status === 401);
    const r = await rawPost(server.baseURL, '/v1/chat/completions', '{}');
    assert.equal(r.status, 401); assertErrorShape(assert, r.json);
    const ok = await server.client({ apiKey: 'sk-test-123' }).chat.completions.create({ model: 'gpt-oss', messages: [{ role: 'user', content: 'hi' }] });
    assert.equal(ok.choices[0].message.content, 'Hello from ossrt!');
  } finally {
    await server.stop();
  }
});

test('queue full: 429 with Retry-After', async () => {
  const server = await startServer(['--scripted-replies', SCRIPT, '--max-queue', '0']);
  try {
    const r = await rawPost(server.baseURL, '/v1/chat/completions', JSON.stringify({ messages: [{ role: 'user', content: 'hi' }] }));
    assert.equal(r.status, 429); assertErrorShape(assert, r.json);
    assert.ok(Number(r.headers.get('retry-after')) >= 1);
    await assert.rejects(server.client().chat.completions.create({ model: 'gpt-oss', messages: [{ role: 'user', content: 'hi' }] }),
      (e) => e.status === 429);
  } finally {
    await server.stop();
  }
});

test('disconnect mid-stream cancels generation and frees KV blocks', async () => {
  const slow = path.join(__dirname, 'slow_replies.json');
  const server = await startServer(['--scripted-replies', slow]);
  try {
    const controller = new AbortController();
    const stream = await server.client().chat.completions.create(
      { model: 'gpt-oss', messages: [{ role: 'user', content: 'LONG_REPLY' }], stream: true, max_tokens: 2000 },
      { signal: controller.signal });
    let chunks = 0;
    // The SDK may end the iteration quietly or throw an AbortError: either way the client is gone.
    try {
      for await (const _ of stream) { if (++chunks === 3) controller.abort(); }
    } catch (_) { /* aborted */ }
    assert.ok(chunks >= 3);
    let m;
    for (let i = 0; i < 100; i++) {
      m = await metrics(server.baseURL);
      // The abort's final event reaches the HTTP side just after the generator lets go.
      if (m.value('vllm:num_requests_running') === 0 && /finished_reason="abort"/.test(m.text)) break;
      await new Promise((r) => setTimeout(r, 50));
    }
    assert.equal(m.value('vllm:num_requests_running'), 0);
    assert.equal(m.value('ossrt:kv_blocks_in_use'), 0);
    assert.match(m.text, /vllm:request_success_total\{model_name="gpt-oss",finished_reason="abort"\} 1/);
  } finally {
    await server.stop();
  }
});

test('SIGTERM drains an in-flight stream, refuses new work, exits 0', async () => {
  const slow = path.join(__dirname, 'slow_replies.json');
  const server = await startServer(['--scripted-replies', slow, '--drain-timeout', '20']);
  const client = server.client();
  const stream = await client.chat.completions.create({ model: 'gpt-oss', messages: [{ role: 'user', content: 'hi' }], stream: true, max_tokens: 40 });
  let content = '';
  let finish = null;
  let signalled = false;
  let exitPromise;
  for await (const chunk of stream) {
    if (!signalled) { signalled = true; exitPromise = server.stop('SIGTERM'); }
    if (chunk.choices.length && chunk.choices[0].delta.content) content += chunk.choices[0].delta.content;
    if (chunk.choices.length && chunk.choices[0].finish_reason) finish = chunk.choices[0].finish_reason;
  }
  assert.ok(finish === 'stop' || finish === 'length', `stream finished normally (${finish})`);
  assert.ok(content.length > 0);
  const exit = await exitPromise;
  assert.equal(exit.code, 0, server.output());
});
