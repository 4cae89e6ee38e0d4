// Speculative decoding from the command line (docs/engine.md, "Speculative decoding"), on the CPU
// with the embedded tiny preset:
//  - `generate --speculative-config` (ngram) prints the ids plain decoding prints, greedy and
//    seeded sampled alike, and `--verbose` reports the drafting (the mean acceptance length,
//    1 + accepted / drafts, when there were guesses);
//  - structured outputs speculate (replay drafter): the same JSON as plain decoding, guesses accepted;
//  - `bench serve` against a speculating server reports the run's spec_decode counters, equal to the
//    difference of the server's own /metrics counters, with vLLM's mean acceptance length;
//  - `bench cost --decode-text` measures ngram on a forced code-editing answer.
// The tiny preset's dummy weights never repeat themselves, so the ngram drafter finds nothing to
// guess here: these tests check the plumbing; the acceptance itself is the unit tests' subject
// (engine_speculative_test, engine_speculative_sampling_test, bench_spec_decode_test).
'use strict';
const test = require('node:test');
const assert = require('node:assert/strict');
const fs = require('node:fs');
const os = require('node:os');
const path = require('node:path');
const { spawn, spawnSync } = require('node:child_process');
const { startServer, timeScale } = require('./harness');

const BIN = process.env.OSSRT_BIN || path.join(__dirname, '..', '..', 'build', 'ossrt');
const SPEC = JSON.stringify({ method: 'ngram', num_speculative_tokens: 3, prompt_lookup_max: 3 });

function generate(ids, extra) {
  return spawnSync(BIN, ['generate', '--prompt-ids-file', ids, '--format', 'json', '--max-tokens', '40', '--ignore-eos',
    '--threads', '2', ...extra], { encoding: 'utf8', timeout: 120000 * timeScale });
}

test('generate: ngram speculation prints plain decoding\'s ids and the mean acceptance length', { timeout: 300000 * timeScale }, () => {
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'ossrt-spec-'));
  const ids = path.join(dir, 'ids.json');
  // A phrase repeated: the ngram drafter finds it at once.
  const phrase = [1000, 2000, 3000, 4000, 5000];
  fs.writeFileSync(ids, JSON.stringify([...phrase, ...phrase, ...phrase]));
  for (const sampling of [['--temperature', '0'], ['--temperature', '0.8', '--top-k', '40', '--seed', '11']]) {
    const plain = generate(ids, sampling);
    assert.equal(plain.status, 0, plain.stderr);
    const spec = generate(ids, [...sampling, '--speculative-config', SPEC, '--verbose']);
    assert.equal(spec.status, 0, spec.stderr);
    assert.deepEqual(JSON.parse(spec.stdout).ids, JSON.parse(plain.stdout).ids, `${sampling.join(' ')}: the same ids`);
    const m = spec.stderr.match(/speculative decoding \(ngram, k = 3\): (\d+) verify steps with guesses, (\d+) of (\d+) guesses accepted, mean acceptance length ([0-9.]+)/);
    if (m) {
      const [drafts, accepted, proposed, length] = [Number(m[1]), Number(m[2]), Number(m[3]), Number(m[4])];
      assert.ok(drafts > 0 && accepted <= proposed, spec.stderr);
      assert.ok(Math.abs(length - (1 + accepted / drafts)) < 0.006, `${length} vs 1 + ${accepted} / ${drafts}`);
    } else {
      assert.match(spec.stderr, /speculative decoding \(ngram, k = 3\): the drafter had no guess at any step/);
    }
  }
  fs.rmSync(dir, { recursive: true, force: true });
});

// Every sample of a metric family summed (all label sets), from Prometheus text.
async function specCounters(baseURL) {
  const text = await (await fetch(`${baseURL}/metrics`)).text();
  const sum = (name) => text.split('\n').filter((l) => l.startsWith(`${name}{`))
    .reduce((acc, l) => acc + Number(l.slice(l.lastIndexOf(' ') + 1)), 0);
  return {
    drafts: sum('vllm:spec_decode_num_drafts'),
    draftTokens: sum('vllm:spec_decode_num_draft_tokens'),
    accepted: sum('vllm:spec_decode_num_accepted_tokens'),
  };
}

test('bench serve: a speculating server\'s acceptance over the run', { timeout: 300000 * timeScale }, async () => {
  const server = await startServer(['--max-model-len', '512', '--max-num-seqs', '4', '--threads', '2',
    '--speculative-config', SPEC], { timeoutMs: 180000 * timeScale });
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'ossrt-spec-bench-'));
  try {
    // Warm the counters first, so the run's figures are a difference, not the totals.
    const warm = await fetch(`${server.baseURL}/v1/completions`, { method: 'POST', headers: { 'content-type': 'application/json' },
      body: JSON.stringify({ model: 'gpt-oss', prompt: [7, 8, 9, 7, 8, 9, 7, 8], max_tokens: 24, temperature: 0, ignore_eos: true }) });
    assert.equal(warm.status, 200);
    const before = await specCounters(server.baseURL);
    const r = await new Promise((resolve) => {
      const p = spawn(BIN, ['bench', 'serve', '--base-url', `${server.baseURL}/v1`, '--dataset', 'random', '--input-len', '16',
        '--output-len', '32', '--ignore-eos', '--max-concurrency', '2', '--num-prompts', '4', '--seed', '3', '--result-dir', dir],
      { stdio: ['ignore', 'pipe', 'pipe'] });
      let out = '';
      p.stdout.on('data', (d) => { out += d; });
      p.stderr.on('data', (d) => { out += d; });
      p.on('exit', (code) => resolve({ code, out }));
    });
    assert.equal(r.code, 0, r.out);
    const after = await specCounters(server.baseURL);
    const run = JSON.parse(fs.readFileSync(path.join(dir, 'serve.json'), 'utf8')).runs[0];
    const sd = run.spec_decode;
    assert.ok(sd, 'spec_decode reported');
    assert.equal(sd.num_drafts, after.drafts - before.drafts);
    assert.equal(sd.num_draft_tokens, after.draftTokens - before.draftTokens);
    assert.equal(sd.num_accepted_tokens, after.accepted - before.accepted);
    if (sd.num_drafts > 0) {
      assert.ok(Math.abs(sd.mean_acceptance_length - (1 + sd.num_accepted_tokens / sd.num_drafts)) < 1e-9);
      assert.match(r.out, /Acceptance length:\s+[0-9.]+/);
    } else {
      assert.equal(sd.mean_acceptance_length, null, 'no verify step: no acceptance length');
      assert.match(r.out, /Acceptance length:\s+-/);
    }
  } finally {
    fs.rmSync(dir, { recursive: true, force: true });
    const exit = await server.stop('SIGTERM');
    assert.equal(exit.code, 0, server.output());
  }
});

test('bench cost with the replay drafter: the acceptance length follows the set rate', { timeout: 300000 * timeScale }, () => {
  // A benchmark drafter (engine/replay_drafter.h): a recording pass of the same prompts, then the
  // measured pass replays it, each guess right with probability a. With k = 3: a = 1 gives every
  // guess accepted (length 4), a = 0 none (length 1); the point says which drafter it measured.
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'ossrt-replay-'));
  for (const [rate, want] of [[1, 4], [0, 1]]) {
    const out = path.join(dir, `rate${rate}`);
    const r = spawnSync(BIN, ['bench', 'cost', '--threads', '2', '--max-model-len', '512', '--no-prefill',
      '--batch-sizes', '1', '--contexts', '16', '--decode-steps', '6', '--warmup-steps', '1', '--result-dir', out,
      '--speculative-config', JSON.stringify({ method: 'replay', num_speculative_tokens: 3, replay_acceptance_rate: rate })],
    { encoding: 'utf8', timeout: 240000 * timeScale });
    assert.equal(r.status, 0, r.stderr + r.stdout);
    const point = JSON.parse(fs.readFileSync(path.join(out, 'cost.json'), 'utf8')).decode[0];
    assert.equal(point.skipped, null, JSON.stringify(point));
    assert.match(point.drafter, /^replay \(a benchmark drafter/);
    // The measured pass's prefill step verifies nothing; every decode step verifies 3 guesses.
    assert.ok(Math.abs(point.mean_acceptance_length - want) < 1e-9, JSON.stringify(point));
    assert.match(r.stdout, /acceptance length \d\.\d\d \(replay/);
    if (rate === 1) assert.ok(point.tok_s_per_user > 0);
  }
});

test('bench cost --decode-text: ngram on a forced code-editing answer guesses from the prompt', { timeout: 300000 * timeScale }, () => {
  // bench/prompts/code_edit.json asks to repeat a module with a rename; the outputs are forced to the
  // edited module, so the ngram drafter finds most of the answer in the prompt (acceptance length
  // well above 1) although the tiny preset's dummy weights would never write it. A window the
  // continuation cannot cover is skipped with the reason.
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'ossrt-dtext-'));
  const text = path.join(__dirname, '..', '..', 'bench', 'prompts', 'code_edit.json');
  const run = (steps, out) => spawnSync(BIN, ['bench', 'cost', '--threads', '2', '--max-model-len', '4096', '--no-prefill',
    '--batch-sizes', '1', '--decode-steps', String(steps), '--warmup-steps', '1', '--decode-text', text,
    '--result-dir', path.join(dir, out), '--speculative-config', SPEC], { encoding: 'utf8', timeout: 240000 * timeScale });
  try {
    const r = run(16, 'ok');
    assert.equal(r.status, 0, r.stderr + r.stdout);
    const point = JSON.parse(fs.readFileSync(path.join(dir, 'ok', 'cost.json'), 'utf8')).decode[0];
    assert.equal(point.skipped, null, JSON.stringify(point));
    assert.equal(point.text, text);
    assert.ok(point.context > 1000, JSON.stringify(point));  // the prompt's length, not --contexts
    assert.ok(point.mean_acceptance_length > 1.5, JSON.stringify(point));
    assert.match(r.stdout, /prompt and forced continuation: .*code_edit\.json; acceptance length \d\.\d\d \(ngram/);
    const short = run(2000, 'short');
    assert.equal(short.status, 0, short.stderr + short.stdout);
    const skipped = JSON.parse(fs.readFileSync(path.join(dir, 'short', 'cost.json'), 'utf8')).decode[0];
    assert.match(skipped.skipped, /^the continuation has \d+ tokens; 2002 steps may emit 8008$/);
  } finally {
    fs.rmSync(dir, { recursive: true, force: true });
  }
});

test('structured outputs speculate: a replayed JSON answer is the plain one, guesses accepted', { timeout: 300000 * timeScale }, async () => {
  // The replay drafter (engine/replay_drafter.h) guesses what the first request with the same
  // prompt produced, each guess right with probability 0.6 and a different token otherwise (often
  // one the grammar refuses). The first request of each kind decodes plainly (nothing recorded);
  // the second verifies guesses under the grammar: the same content, valid JSON, guesses accepted.
  const server = await startServer(['--max-model-len', '2048', '--max-num-seqs', '4', '--threads', '2',
    '--speculative-config', JSON.stringify({ method: 'replay', num_speculative_tokens: 3, replay_acceptance_rate: 0.6 })],
  { timeoutMs: 180000 * timeScale });
  try {
    const client = server.client();
    const schema = {
      type: 'object',
      properties: { name: { type: 'string', maxLength: 12 }, tags: { type: 'array', items: { enum: ['a', 'b', 'c'] }, maxItems: 4 },
        n: { type: 'integer', minimum: 0, maximum: 999 } },
      required: ['name', 'tags', 'n'], additionalProperties: false,
    };
    const kinds = [{ temperature: 0 }, { temperature: 1.0, seed: 11 }];
    const before = await specCounters(server.baseURL);
    for (const sampling of kinds) {
      const ask = () => client.chat.completions.create({
        model: 'gpt-oss', messages: [{ role: 'user', content: 'A record, please.' }], max_tokens: 400,
        response_format: { type: 'json_schema', json_schema: { name: 'record', schema, strict: true } },
        thinking_token_budget: 0, ...sampling,
      });
      const plain = await ask();
      const spec = await ask();
      const label = JSON.stringify(sampling);
      assert.equal(plain.choices[0].finish_reason, 'stop', `${label}: ${plain.choices[0].message.content}`);
      assert.equal(spec.choices[0].message.content, plain.choices[0].message.content, `${label}: the same answer`);
      const doc = JSON.parse(spec.choices[0].message.content);
      assert.deepEqual(Object.keys(doc).sort(), ['n', 'name', 'tags'], label);
      assert.ok(Number.isInteger(doc.n) && doc.n >= 0 && doc.n <= 999, label);
    }
    const after = await specCounters(server.baseURL);
    assert.ok(after.draftTokens > before.draftTokens, 'the second requests were drafted');
    assert.ok(after.accepted > before.accepted, 'some guesses were accepted');
    assert.ok(after.accepted - before.accepted < after.draftTokens - before.draftTokens, 'and some rejected');
  } finally {
    const exit = await server.stop('SIGTERM');
    assert.equal(exit.code, 0, server.output());
  }
});
