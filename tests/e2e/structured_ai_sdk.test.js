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
const { generateObject, zodSchema, NoObjectGeneratedError } = require(path.join(npm, 'ai'));
const Ajv = require(path.join(npm, 'ajv')).default;
const { createOpenAI } = require(path.join(npm, '@ai-sdk', 'openai'));
const { z } = require(path.join(npm, 'zod'));

const ajv = new Ajv({ strict: false, allErrors: true });

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

test('generateObject with a zod schema succeeds (Responses API and chat completions)', { timeout: 300000 }, async (t) => {
  const openai = createOpenAI({ baseURL: `${server.baseURL}/v1`, apiKey: 'unused' });
  for (const [label, model] of [['responses', openai('gpt-oss')], ['chat', openai.chat('gpt-oss')]]) {
    for (let seed = 0; seed < 3; seed++) {
      let result;
      try {
        result = await generateObject({
          model, schema: Recipe, prompt: `A recipe, please (${seed}).`, maxOutputTokens: 800, maxRetries: 0,
        });
      } catch (e) {
        if (!NoObjectGeneratedError.isInstance(e) || !e.text) throw e;
        // zod's string max counts UTF-16 code units, JSON Schema's maxLength (what the SDK sends and
        // the server enforces) counts code points, so a random-weight model's emoji (two units) can
        // fail zod on a valid answer. Accept only that: the text validates against the schema the
        // server was sent (ajv counts code points), and every zod issue is a string over its max.
        const sent = await zodSchema(Recipe).jsonSchema;
        const value = JSON.parse(e.text);
        assert.ok(ajv.validate(sent, value), `${label}: ${e.text}: ${JSON.stringify(ajv.errors)}`);
        const issues = Recipe.safeParse(value).error.issues;
        assert.ok(issues.every((i) => i.code === 'too_big' && i.type === 'string'), `${label}: ${e.text}`);
        assert.equal(e.finishReason, 'stop', label);
        t.diagnostic(`${label}: valid by JSON Schema, over a zod string max in UTF-16 units: ${e.text}`);
        continue;
      }
      const { object, finishReason } = result;
      assert.equal(finishReason, 'stop', label);
      assert.deepEqual(Recipe.parse(object), object, label);
    }
  }
});
