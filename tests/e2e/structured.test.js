// Structured outputs end to end (issue 18): `ossrt serve` on the tiny random-weight model, whose
// unconstrained output is noise. Every constrained answer that ends with `stop` must validate
// against its schema, checked by an independent validator (ajv + ajv-formats); bounded schemas
// must end with `stop`. Plus the request surface (response_format, text.format, structured_outputs,
// guided_*, strict/forced tools, the SDK's chat.completions.parse with zod), the reasoning budget's
// exact bound (streamed and not), and the 400s.
'use strict';
const test = require('node:test');
const assert = require('node:assert/strict');
const path = require('node:path');
const { startServer, rawPost, assertErrorShape } = require('./harness');

const npm = path.resolve(__dirname, '..', '..', 'third_party', 'npm', 'node_modules');
const Ajv2020 = require(path.join(npm, 'ajv', 'dist', '2020')).default;
const addFormats = require(path.join(npm, 'ajv-formats')).default || require(path.join(npm, 'ajv-formats'));
const { z } = require(path.join(npm, 'zod'));
const { zodResponseFormat } = require(path.join(npm, 'openai', 'helpers', 'zod'));

function validator(schema) {
  const ajv = new Ajv2020({ strict: false, allErrors: true, validateSchema: false });
  addFormats(ajv);
  const copy = JSON.parse(JSON.stringify(schema));
  delete copy.$schema;  // draft-07 URIs from zod: the 2020 validator reads the same keywords
  return ajv.compile(copy);
}

function checkValid(schema, text, context) {
  let doc;
  try { doc = JSON.parse(text); } catch (e) { assert.fail(`not JSON (${context}): ${text}`); }
  const validate = validator(schema);
  assert.ok(validate(doc), `invalid (${context}): ${text}\nschema ${JSON.stringify(schema)}\n${JSON.stringify(validate.errors)}`);
  return doc;
}

let server;
let client;
test.before(async () => {
  server = await startServer(['--max-model-len', '4096', '--max-num-seqs', '16', '--threads', '2'], { timeoutMs: 180000 });
  client = server.client();
});
test.after(async () => {
  const exit = await server.stop('SIGTERM');
  assert.equal(exit.code, 0, server.output());
});

const chat = (extra) => client.chat.completions.create({
  model: 'gpt-oss', messages: [{ role: 'user', content: 'Answer in JSON.' }], max_tokens: 1500, ...extra,
});

// ---- random bounded schemas (every value has a bounded length, so generation must end) ----
function rng(seed) {
  let x = (seed * 2654435761 + 12345) >>> 0;
  return (n) => { x = (Math.imul(x, 1664525) + 1013904223) >>> 0; return (x >>> 8) % n; };
}

function genLeaf(r) {
  switch (r(9)) {
    case 0: { const lo = r(3); return { type: 'string', minLength: lo, maxLength: lo + r(8) }; }
    case 1: return { type: 'string', pattern: ['^[a-c]{2,4}$', '^x\\d{1,3}$', '^(yes|no)$', '^[A-Z][a-z]{0,5}-\\d{2}$'][r(4)] };
    case 2: {
      const f = ['date', 'time', 'date-time', 'uuid', 'ipv4', 'email'][r(6)];
      return f === 'email' ? { type: 'string', format: f, maxLength: 24 } : { type: 'string', format: f };
    }
    case 3: { const lo = r(200) - 100; const s = { type: 'integer' }; if (r(3)) s.minimum = lo; s[r(2) ? 'maximum' : 'exclusiveMaximum'] = lo + 1 + r(5000); return s; }
    case 4: { const lo = (r(20001) - 10000) / 100; return { type: 'number', [r(2) ? 'minimum' : 'exclusiveMinimum']: lo, maximum: lo + (1 + r(1000)) / 8 }; }
    case 5: return { type: 'boolean' };
    case 6: return { enum: ['red', 'green', 7, null, 'é"\\'].slice(0, 1 + r(5)) };
    case 7: return { const: r(2) ? 'fixed' : { k: 1 } };
    default: return { type: ['string', 'null'], maxLength: 4 };
  }
}

function genNode(r, depth) {
  const k = depth >= 2 ? 0 : r(5);
  if (k <= 1) return genLeaf(r);
  if (k === 2) {
    const properties = {}; const required = [];
    for (let i = 0, n = 1 + r(4); i < n; i++) {
      const name = String.fromCharCode(97 + i) + (r(3) === 0 ? '_x' : '');
      properties[name] = genNode(r, depth + 1);
      if (r(2)) required.push(name);
    }
    return { type: 'object', properties, required, additionalProperties: false };
  }
  if (k === 3) { const lo = r(3); return { type: 'array', items: genNode(r, depth + 1), minItems: lo, maxItems: lo + r(3) }; }
  return { [r(2) ? 'anyOf' : 'oneOf']: [{ type: 'integer', minimum: 0, maximum: 9 },
    { type: 'object', properties: { z: genNode(r, depth + 1) }, required: ['z'], additionalProperties: false }] };
}

test('several hundred generated schemas: every answer ends with stop and validates (ajv)', { timeout: 900000 }, async () => {
  // Fewer under the sanitizer stage of scripts/test.sh (it exports ASAN_OPTIONS; the engine runs
  // several times slower there); OSSRT_STRUCTURED_SCHEMAS overrides.
  const N = Number(process.env.OSSRT_STRUCTURED_SCHEMAS || (process.env.ASAN_OPTIONS ? 96 : 320));
  let validated = 0;
  for (let start = 0; start < N; start += 16) {
    const batch = [];
    for (let i = start; i < Math.min(N, start + 16); i++) {
      const r = rng(i + 1);
      const schema = genNode(r, 0);
      batch.push((async () => {
        const res = await chat({
          response_format: { type: 'json_schema', json_schema: { name: `s${i}`, schema, strict: true } },
          thinking_token_budget: r(3),  // 0..2: the random model reasons briefly, then answers
          temperature: 1.0, seed: i,
        });
        const c = res.choices[0];
        assert.equal(c.finish_reason, 'stop', `schema ${i} did not end: ${JSON.stringify(schema)}\n${c.message.content}`);
        assert.ok(res.usage.completion_tokens < 1500);
        checkValid(schema, c.message.content, `schema ${i}`);
        validated++;
      })());
    }
    await Promise.all(batch);
  }
  assert.equal(validated, N);
});

test('json_object, Responses text.format and completions guided_json', { timeout: 300000 }, async () => {
  for (let seed = 0; seed < 4; seed++) {
    const res = await chat({ response_format: { type: 'json_object' }, thinking_token_budget: 0, seed, max_tokens: 600 });
    const c = res.choices[0];
    if (c.finish_reason === 'stop') {
      const doc = JSON.parse(c.message.content);
      assert.equal(typeof doc, 'object');
      assert.ok(doc !== null && !Array.isArray(doc));
    } else {
      assert.equal(c.finish_reason, 'length');  // an unbounded object may run long
    }
  }
  const schema = { type: 'object', properties: { city: { type: 'string', maxLength: 10 }, temp: { type: 'integer', minimum: -40, maximum: 50 } },
    required: ['city', 'temp'], additionalProperties: false };
  const resp = await client.responses.create({
    model: 'gpt-oss', input: 'Weather?', max_output_tokens: 400, thinking_token_budget: 0,
    text: { format: { type: 'json_schema', name: 'weather', schema, strict: true } },
  });
  assert.equal(resp.status, 'completed');
  checkValid(schema, resp.output_text, 'responses text.format');
  const comp = await client.completions.create({ model: 'gpt-oss', prompt: 'JSON:', max_tokens: 300, guided_json: schema, seed: 3 });
  assert.equal(comp.choices[0].finish_reason, 'stop');
  checkValid(schema, comp.choices[0].text, 'completions guided_json');
});

test('regex, choice and grammar through structured_outputs and guided_*', { timeout: 300000 }, async () => {
  const regex = '[A-Z]{2}-\\d{3}( \\(ok\\))?';
  for (const extra of [{ guided_regex: regex }, { structured_outputs: { regex } }]) {
    const res = await chat({ ...extra, thinking_token_budget: 0, max_tokens: 100 });
    assert.equal(res.choices[0].finish_reason, 'stop');
    assert.match(res.choices[0].message.content, new RegExp(`^(${regex})$`));
  }
  const choices = ['positive', 'negative', 'neutral ☺'];
  for (const extra of [{ guided_choice: choices }, { structured_outputs: { choice: choices } }]) {
    const res = await chat({ ...extra, thinking_token_budget: 0, max_tokens: 50 });
    assert.ok(choices.includes(res.choices[0].message.content), res.choices[0].message.content);
  }
  const grammar = 'root ::= "(" expr ")"\nexpr ::= num (op num){0,3}\nop ::= [+*-]\nnum ::= [1-9] [0-9]?';
  for (const extra of [{ guided_grammar: grammar }, { structured_outputs: { grammar } }]) {
    const res = await chat({ ...extra, thinking_token_budget: 0, max_tokens: 100 });
    assert.equal(res.choices[0].finish_reason, 'stop');
    assert.match(res.choices[0].message.content, /^\([1-9][0-9]?([+*-][1-9][0-9]?){0,3}\)$/);
  }
  const comp = await client.completions.create({ model: 'gpt-oss', prompt: 'Pick:', max_tokens: 30, structured_outputs: { choice: choices } });
  assert.ok(choices.includes(comp.choices[0].text), comp.choices[0].text);
});

test('the SDK\'s chat.completions.parse with a zod schema', { timeout: 300000 }, async () => {
  const Event = z.object({
    name: z.string().max(12),
    day: z.enum(['mon', 'tue', 'wed']),
    attendees: z.array(z.string().max(6)).max(3),
    priority: z.number().int().min(1).max(5),
    location: z.object({ room: z.string().max(4) }).nullable(),
  });
  for (let seed = 0; seed < 3; seed++) {
    const res = await client.beta.chat.completions.parse({
      model: 'gpt-oss', messages: [{ role: 'user', content: 'Plan an event.' }], max_tokens: 800, seed,
      response_format: zodResponseFormat(Event, 'event'), thinking_token_budget: 2,
    });
    const msg = res.choices[0].message;
    assert.equal(res.choices[0].finish_reason, 'stop');
    assert.ok(msg.parsed, `parsed: ${msg.content}`);
    assert.deepEqual(Event.parse(msg.parsed), msg.parsed);
  }
});

const weatherParams = {
  type: 'object',
  properties: { location: { type: 'string', maxLength: 16 }, unit: { type: 'string', enum: ['celsius', 'fahrenheit'] },
    days: { type: 'integer', minimum: 1, maximum: 14 } },
  required: ['location', 'unit', 'days'], additionalProperties: false,
};
const tools = [
  { type: 'function', function: { name: 'get_weather', description: 'Weather', parameters: weatherParams } },
  { type: 'function', function: { name: 'get_time', parameters: { type: 'object', properties: { tz: { type: 'string', maxLength: 8 } }, required: ['tz'] } } },
];

test('named and required tool_choice return calls whose arguments validate', { timeout: 300000 }, async () => {
  for (let seed = 0; seed < 3; seed++) {
    const res = await chat({ tools, tool_choice: { type: 'function', function: { name: 'get_weather' } }, seed, max_tokens: 400 });
    const c = res.choices[0];
    assert.equal(c.finish_reason, 'tool_calls');
    assert.equal(c.message.tool_calls.length, 1);
    assert.equal(c.message.tool_calls[0].function.name, 'get_weather');
    checkValid(weatherParams, c.message.tool_calls[0].function.arguments, 'named tool');
  }
  for (let seed = 0; seed < 4; seed++) {
    const res = await chat({ tools, tool_choice: 'required', seed, max_tokens: 400 });
    const call = res.choices[0].message.tool_calls[0];
    assert.ok(['get_weather', 'get_time'].includes(call.function.name));
    const params = tools.find((t) => t.function.name === call.function.name).function.parameters;
    checkValid(params, call.function.arguments, 'required tool');
  }
  // strict:true with tool_choice auto: either a final answer or a call, and a call validates.
  const strictTools = [{ type: 'function', function: { name: 'get_weather', parameters: weatherParams, strict: true } }];
  for (let seed = 0; seed < 4; seed++) {
    const res = await chat({ tools: strictTools, thinking_token_budget: 1, seed, max_tokens: 600 });
    const m = res.choices[0].message;
    if (m.tool_calls && m.tool_calls.length) checkValid(weatherParams, m.tool_calls[0].function.arguments, 'strict tool');
  }
});

// ---- the reasoning budget, counted on the returned token stream ----
async function tokenId(text) {
  const r = await rawPost(server.baseURL, '/tokenize', JSON.stringify({ prompt: text }));
  assert.equal(r.status, 200);
  assert.equal(r.json.tokens.length, 1, `${text} is one token`);
  return r.json.tokens[0];
}

// Analysis content tokens = those between the first <|message|> after an `analysis` header and <|end|>.
function analysisContentTokens(tokens) {
  const i = tokens.indexOf('<|message|>');
  assert.ok(i > 0 && tokens.slice(0, i).join('') === '<|channel|>analysis', `header: ${tokens.slice(0, 6)}`);
  const end = tokens.indexOf('<|end|>', i);
  assert.ok(end > i, 'the analysis ends');
  assert.equal(headerAt(tokens, end), '<|end|><|start|>assistant<|channel|>final<|message|>', 'then the final header');
  return end - i - 1;
}

// The tokens from `from` through the next <|message|>, joined (the model may spell a header word
// with several tokens).
function headerAt(tokens, from) {
  const m = tokens.indexOf('<|message|>', from);
  return m < 0 ? tokens.slice(from).join('') : tokens.slice(from, m + 1).join('');
}

test('thinking_token_budget bounds the analysis exactly, streamed and not', { timeout: 300000 }, async () => {
  // A logit bias makes the random model choose `analysis`, and keep writing it: only the budget
  // can end the reasoning.
  const analysis = await tokenId('analysis');
  for (const budget of [0, 1, 7, 23]) {
    const req = { response_format: { type: 'json_object' }, thinking_token_budget: budget, logit_bias: { [analysis]: 100 },
      logprobs: true, max_tokens: 300, temperature: 0 };
    if (budget === 0) {
      const res = await chat(req);  // no analysis at all
      assert.equal(headerAt(res.choices[0].logprobs.content.map((t) => t.token), 0), '<|channel|>final<|message|>');
      assert.equal(res.usage.completion_tokens_details?.reasoning_tokens ?? 0, 0);
      continue;
    }
    const res = await chat(req);
    const tokens = res.choices[0].logprobs.content.map((t) => t.token);
    assert.equal(analysisContentTokens(tokens), budget);
    assert.equal(res.choices[0].message.reasoning, 'analysis'.repeat(budget));
    let streamed = [];
    let reasoning = '';
    for await (const chunk of await chat({ ...req, stream: true })) {
      if (!chunk.choices.length) continue;
      streamed = streamed.concat((chunk.choices[0].logprobs?.content || []).map((t) => t.token));
      reasoning += chunk.choices[0].delta.reasoning || '';
    }
    assert.equal(analysisContentTokens(streamed), budget);
    assert.equal(reasoning, 'analysis'.repeat(budget));
  }
});

test('thinking_token_budget alone (passive) on a pre-rendered completions prompt', { timeout: 120000 }, async () => {
  const prompt = '<|start|>user<|message|>Think.<|end|><|start|>assistant<|channel|>analysis<|message|>';
  const res = await client.completions.create({ model: 'gpt-oss', prompt, max_tokens: 40, thinking_token_budget: 5,
    logprobs: 0, skip_special_tokens: false, temperature: 0.8, seed: 9 });
  const tokens = res.choices[0].logprobs.tokens;
  const end = tokens.indexOf('<|end|>');
  assert.ok(end >= 0 && end <= 5, `tokens: ${JSON.stringify(tokens.slice(0, 12))}`);
  assert.equal(headerAt(tokens, end), '<|end|><|start|>assistant<|channel|>final<|message|>');
});

test('invalid or unsupported structured outputs are 400s naming the field', { timeout: 120000 }, async () => {
  const cases = [
    [{ response_format: { type: 'json_schema', json_schema: { name: 'x', schema: { type: 'object', properties: { a: { not: { type: 'null' } } } } } } },
      'response_format', /'not'/],
    [{ guided_regex: 'ab(?=c)' }, 'guided_regex', /position 2/],
    [{ structured_outputs: { grammar: 'root ::= "a" (' } }, 'structured_outputs.grammar', /position 13/],
    [{ guided_json: { type: 'string', format: 'credit-card' } }, 'guided_json', /credit-card/],
    [{ guided_regex: 'a', guided_choice: ['b'] }, 'guided_choice', /only one/],
    [{ tools: [{ type: 'function', function: { name: 'f', strict: true, parameters: { type: 'object', if: {} } } }] },
      'tools[0].function.parameters', /'if'/],
    [{ thinking_token_budget: -1 }, 'thinking_token_budget', /./],
  ];
  for (const [extra, param, message] of cases) {
    const body = { model: 'gpt-oss', messages: [{ role: 'user', content: 'x' }], max_tokens: 5, ...extra };
    const r = await rawPost(server.baseURL, '/v1/chat/completions', JSON.stringify(body));
    assert.equal(r.status, 400, `${JSON.stringify(extra)} -> ${r.text}`);
    assertErrorShape(assert, r.json);
    assert.equal(r.json.error.param, param, r.text);
    assert.match(r.json.error.message, message);
  }
  const r = await rawPost(server.baseURL, '/v1/responses', JSON.stringify({ model: 'gpt-oss', input: 'x',
    text: { format: { type: 'json_schema', name: 'x', schema: { type: 'array', uniqueItems: true } } } }));
  assert.equal(r.status, 400, r.text);
  assert.equal(r.json.error.param, 'text.format');
  // Hostile: a deep $ref cycle and a huge bound fail fast with 400s, and the server stays up.
  const cyclic = { $defs: { a: { $ref: '#/$defs/b' }, b: { anyOf: [{ $ref: '#/$defs/a' }, { type: 'null' }] } }, $ref: '#/$defs/a' };
  const r2 = await rawPost(server.baseURL, '/v1/chat/completions', JSON.stringify({ model: 'gpt-oss', messages: [{ role: 'user', content: 'x' }], guided_json: cyclic }));
  assert.equal(r2.status, 400, r2.text);
  assert.match(r2.json.error.message, /left recursion/);
  const r3 = await rawPost(server.baseURL, '/v1/chat/completions', JSON.stringify({ model: 'gpt-oss', messages: [{ role: 'user', content: 'x' }],
    guided_regex: '(a{2000}){2000}' }));
  assert.equal(r3.status, 400, r3.text);
  const health = await fetch(`${server.baseURL}/health`);
  assert.equal(health.status, 200);
});
