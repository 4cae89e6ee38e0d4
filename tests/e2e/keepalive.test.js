// Keep-alive: many sequential requests on one reused connection must all succeed. A disconnect
// monitor that mistook a spurious wake-up for EOF once dropped ~3% of them (ECONNRESET).
'use strict';
const test = require('node:test');
const assert = require('node:assert/strict');
const http = require('node:http');
const path = require('node:path');
const { startServer } = require('./harness');

let server;
test.before(async () => {
  server = await startServer(['--scripted-replies', path.join(__dirname, 'scripted_replies.json'),
    '--served-model-name', 'gpt-oss-test']);
});
test.after(async () => { await server.stop('SIGTERM'); });

function post(agent, route, body) {
  const data = JSON.stringify(body);
  return new Promise((resolve, reject) => {
    const req = http.request(`${server.baseURL}${route}`, {
      method: 'POST', agent, headers: { 'content-type': 'application/json', 'content-length': Buffer.byteLength(data) },
    }, (res) => {
      let text = '';
      res.on('data', (c) => { text += c; });
      res.on('end', () => resolve({ status: res.statusCode, text, socket: req.socket }));
    });
    req.on('error', reject);
    req.end(data);
  });
}

test('300 sequential requests on one keep-alive connection (plain and streamed)', { timeout: 120000 }, async () => {
  const agent = new http.Agent({ keepAlive: true, maxSockets: 1 });
  const sockets = new Set();
  let errors = 0;
  for (let i = 0; i < 300; i++) {
    const stream = i % 3 === 2;
    try {
      const r = await post(agent, '/v1/chat/completions',
        { model: 'gpt-oss-test', messages: [{ role: 'user', content: 'hi' }], stream });
      assert.equal(r.status, 200);
      if (stream) assert.ok(r.text.trimEnd().endsWith('data: [DONE]'));
      sockets.add(r.socket);
    } catch (e) {
      errors++;
    }
  }
  agent.destroy();
  assert.equal(errors, 0, 'no request failed');
  assert.equal(sockets.size, 1, 'the one connection was reused throughout');
});
