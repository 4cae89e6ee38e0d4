// The issue 18 report, replayed: the Vercel AI SDK's generateObject (ai 6, zod schema) against
// `ossrt serve` on the tiny random-weight model, through the Responses API (the SDK's default)
// and chat completions. The server runs with `--thinking-token-budget 0` (the server default of
// the reasoning budget): the AI SDK has no field for it, and a random-weight model would otherwise
// reason until max_tokens.
'use strict';
const test = require('node:test');
const assert = require('node:assert/strict');
const path = require('node:path');
const { startServer } = require('./harness');

const npm = path.resolve(__dirname, '..', '..', 'third_party', 'npm', 'node_modules');
const { generateObject } = require(path.join(npm, 'ai'));
const { createOpenAI } = require(path.join(npm, '@ai-sdk', 'openai'));
const { z } = require(path.join(npm, 'zod'));

let server;
test.before(async () => {
  server = await startServer(['--max-model-len', '4096', '--threads', '2', '--thinking-token-budget', '0'], { timeoutMs: 180000 });
});
test.after(async () => {
  const exit = await server.stop('SIGTERM');
  assert.equal(exit.code, 0, server.output());
});

const Recipe = z.object({
  title: z.string().max(20),
  servings: z.number().int().min(1).max(12),
  vegetarian: z.boolean(),
  steps: z.array(z.string().max(16)).min(1).max(3),
  difficulty: z.enum(['easy', 'medium', 'hard']),
});

test('generateObject with a zod schema succeeds (Responses API and chat completions)', { timeout: 300000 }, async () => {
  const openai = createOpenAI({ baseURL: `${server.baseURL}/v1`, apiKey: 'unused' });
  for (const [label, model] of [['responses', openai('gpt-oss')], ['chat', openai.chat('gpt-oss')]]) {
    for (let seed = 0; seed < 3; seed++) {
      const { object, finishReason } = await generateObject({
        model, schema: Recipe, prompt: `A recipe, please (${seed}).`, maxOutputTokens: 800, maxRetries: 0,
      });
      assert.equal(finishReason, 'stop', label);
      assert.deepEqual(Recipe.parse(object), object, label);
    }
  }
});
