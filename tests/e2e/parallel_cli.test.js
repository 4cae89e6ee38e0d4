// serve / generate with --tensor-parallel-size / --expert-parallel-size on the CPU (ranks as threads,
// docs/parallel.md): the same greedy ids and text as unsharded, and the refused flags' messages.
// The embedded tiny preset (16 q / 2 KV heads, 8 experts) accepts TP 2 and EP 4.
'use strict';
const test = require('node:test');
const assert = require('node:assert/strict');
const { spawnSync } = require('node:child_process');
const fs = require('node:fs');
const os = require('node:os');
const path = require('node:path');
const { startServer } = require('./harness');

const bin = process.env.OSSRT_BIN || path.join(__dirname, '..', '..', 'build', 'ossrt');

function generate(extra) {
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'ossrt-par-'));
  const ids = path.join(dir, 'ids.json');
  // 37 ids, prefilled in chunks of 8 (--max-num-batched-tokens), then 16 greedy tokens.
  fs.writeFileSync(ids, JSON.stringify(Array.from({ length: 37 }, (_, i) => (i * 7919 + 13) % 200000)));
  const r = spawnSync(bin, ['generate', '--prompt-ids-file', ids, '--format', 'json', '--temperature', '0',
    '--max-tokens', '16', '--ignore-eos', '--threads', '2', '--max-num-batched-tokens', '8', ...extra],
  { encoding: 'utf8', timeout: 120000 });
  fs.rmSync(dir, { recursive: true, force: true });
  return r;
}

test('generate: TP2, TP2xEP4 and EP4 all-to-all print the unsharded ids', { timeout: 300000 }, () => {
  const base = generate([]);
  assert.equal(base.status, 0, base.stderr);
  const want = JSON.parse(base.stdout);
  assert.equal(want.ids.length, 16);
  for (const flags of [['--tensor-parallel-size', '2'], ['--tensor-parallel-size', '2', '--expert-parallel-size', '4'],
    ['--expert-parallel-size', '4', '--expert-dispatch', 'all_to_all']]) {
    const r = generate([...flags, '--verbose']);
    assert.equal(r.status, 0, r.stderr);
    assert.deepEqual(JSON.parse(r.stdout).ids, want.ids, flags.join(' '));
    // The --verbose KV plan is per rank: under TP a rank caches 1 of the 2 KV heads; EP alone keeps both.
    if (flags.includes('--tensor-parallel-size')) assert.match(r.stderr, /x 1 kv heads x .*\n.*each caches 1 of the model's 2 kv heads/s);
    else assert.match(r.stderr, /full layers \d+ B per token \(2 x \d+ layers x 2 kv heads x/);
  }
});

test('generate: refused sizes name the flag', { timeout: 120000 }, () => {
  const dp = generate(['--data-parallel-size', '2']);
  assert.equal(dp.status, 1);
  assert.match(dp.stderr, /--data-parallel-size 2: the engine .* runs one scheduler/);
  const tp = generate(['--tensor-parallel-size', '3']);
  assert.equal(tp.status, 1);
  assert.match(tp.stderr, /--tensor-parallel-size 3 does not divide the model's 16 attention heads/);
  const ep = generate(['--expert-parallel-size', '0']);
  assert.notEqual(ep.status, 0);
  assert.match(ep.stderr, /--expert-parallel-size/);
});

test('serve: TP2xEP4 answers as unsharded; --data-parallel-size 2 is refused before listening', { timeout: 300000 }, async () => {
  const req = { model: 'gpt-oss', prompt: 'The capital of France is', max_tokens: 8, temperature: 0 };
  const texts = [];
  for (const flags of [[], ['--tensor-parallel-size', '2', '--expert-parallel-size', '4']]) {
    const server = await startServer(['--threads', '2', '--max-num-seqs', '4', '--kv-cache-bytes', '67108864', ...flags], { timeoutMs: 180000 });
    try {
      const r = await server.client().completions.create(req);
      assert.equal(r.usage.completion_tokens, 8);
      texts.push(r.choices[0].text);
    } finally {
      const exit = await server.stop('SIGTERM');
      assert.equal(exit.code, 0, server.output());
    }
  }
  assert.equal(texts[1], texts[0]);
  const refused = spawnSync(bin, ['serve', '--port', '0', '--data-parallel-size', '2'], { encoding: 'utf8', timeout: 60000 });
  assert.equal(refused.status, 1);
  assert.match(refused.stderr, /--data-parallel-size 2/);
  assert.doesNotMatch(refused.stdout, /listening/);
});
