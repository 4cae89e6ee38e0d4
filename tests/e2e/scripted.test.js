// End to end with the official openai SDK against `ossrt serve --scripted-replies`: the server's
// whole output path (Harmony parser -> chat/responses JSON and SSE) on known token sequences,
// including malformed Harmony, plus every error code of issue 6.
'use strict';
const test = require('node:test');
const assert = require('node:assert/strict');
const path = require('node:path');
const { startServer, rawPost, assertErrorShape, metrics } = require('./harness');

const SCRIPT = path.join(__dirname, 'scripted_replies.json');
const tools = [{
  type: 'function',
  function: {
    name: 'get_weather', description: 'Current weather for a city',
    parameters: { type: 'object', properties: { city: { type: 'string' }, unit: { type: 'string', enum: ['celsius', 'fahrenheit'] } }, required: ['city'] },
  },
}];

let server;
let client;
test.before(async () => {
  server = await startServer(['--scripted-replies', SCRIPT, '--served-model-name', 'gpt-oss-test', '--max-model-len', '4096']);
  client = server.client();
});
test.after(async () => {
  const exit = await server.stop('SIGTERM');
  assert.equal(exit.code, 0, `server exit: ${JSON.stringify(exit)}\n${server.output()}`);
});

// The text of a response's message items (the SDK's output_text, computed here so the test
// does not depend on which SDK calls add it).
function outputText(response) {
  return response.output.filter((o) => o.type === 'message')
    .flatMap((o) => o.content).filter((c) => c.type === 'output_text').map((c) => c.text).join('');
}

async function collectChatStream(stream) {
  const out = { reasoning: '', content: '', calls: [], finish: null, usage: null, chunks: 0, roleFirst: null };
  for await (const chunk of stream) {
    out.chunks += 1;
    assert.equal(chunk.object, 'chat.completion.chunk');
    if (chunk.usage) out.usage = chunk.usage;
    if (!chunk.choices.length) continue;
    const c = chunk.choices[0];
    if (out.roleFirst === null) out.roleFirst = c.delta.role === 'assistant';
    if (c.delta.reasoning) out.reasoning += c.delta.reasoning;
    if (c.delta.content) out.content += c.delta.content;
    for (const tc of c.delta.tool_calls || []) {
      if (tc.id) out.calls[tc.index] = { id: tc.id, name: tc.function.name, arguments: tc.function.arguments || '' };
      else out.calls[tc.index].arguments += tc.function.arguments;
    }
    if (c.finish_reason) out.finish = c.finish_reason;
  }
  return out;
}

test('models lists the served name and max_model_len', async () => {
  const models = await client.models.list();
  assert.equal(models.data[0].id, 'gpt-oss-test');
  assert.equal(models.data[0].max_model_len, 4096);
  assert.ok(server.healthSeen503 === true || server.healthSeen503 === false);
});

test('chat non-stream: reasoning and content separated, usage sums', async () => {
  const r = await client.chat.completions.create({ model: 'gpt-oss-test', messages: [{ role: 'system', content: 'Be nice.' }, { role: 'user', content: 'Hi!' }] });
  const m = r.choices[0].message;
  assert.equal(m.content, 'Hello from ossrt!');
  assert.equal(m.reasoning, 'A greeting. Answer politely.');
  assert.equal(r.choices[0].finish_reason, 'stop');
  assert.equal(r.usage.total_tokens, r.usage.prompt_tokens + r.usage.completion_tokens);
  assert.ok(r.usage.completion_tokens_details.reasoning_tokens > 0);
  assert.ok(r.usage.completion_tokens_details.reasoning_tokens < r.usage.completion_tokens);
  assert.equal(r.usage.prompt_tokens_details.cached_tokens, 0);
});

test('chat stream equals non-stream, role first, include_usage chunk last', async () => {
  const stream = await client.chat.completions.create({ model: 'gpt-oss-test', messages: [{ role: 'user', content: 'Hi!' }], stream: true, stream_options: { include_usage: true } });
  const s = await collectChatStream(stream);
  assert.equal(s.roleFirst, true);
  assert.equal(s.content, 'Hello from ossrt!');
  assert.equal(s.reasoning, 'A greeting. Answer politely.');
  assert.equal(s.finish, 'stop');
  assert.ok(s.usage && s.usage.total_tokens === s.usage.prompt_tokens + s.usage.completion_tokens);
  const n = await client.chat.completions.create({ model: 'gpt-oss-test', messages: [{ role: 'user', content: 'Hi!' }] });
  assert.equal(s.usage.completion_tokens, n.usage.completion_tokens);
  assert.equal(s.usage.completion_tokens_details.reasoning_tokens, n.usage.completion_tokens_details.reasoning_tokens);
});

test('tool call round trip (non-stream and stream), prior reasoning accepted back', async () => {
  const messages = [{ role: 'user', content: 'What is the weather in Paris?' }];
  const first = await client.chat.completions.create({ model: 'gpt-oss-test', messages, tools, tool_choice: 'auto' });
  const msg = first.choices[0].message;
  assert.equal(first.choices[0].finish_reason, 'tool_calls');
  assert.equal(msg.content, null);
  assert.equal(msg.tool_calls.length, 1);
  assert.equal(msg.tool_calls[0].type, 'function');
  assert.equal(msg.tool_calls[0].function.name, 'get_weather');
  assert.deepEqual(JSON.parse(msg.tool_calls[0].function.arguments), { city: 'Paris', unit: 'celsius' });
  assert.match(msg.tool_calls[0].id, /^call_/);

  const streamed = await collectChatStream(await client.chat.completions.create({ model: 'gpt-oss-test', messages, tools, stream: true }));
  assert.equal(streamed.finish, 'tool_calls');
  assert.equal(streamed.calls.length, 1);
  assert.equal(streamed.calls[0].name, 'get_weather');
  assert.equal(streamed.calls[0].arguments, msg.tool_calls[0].function.arguments);
  assert.equal(streamed.content, '');

  messages.push({ role: 'assistant', content: null, reasoning: msg.reasoning, tool_calls: msg.tool_calls });
  messages.push({ role: 'tool', tool_call_id: msg.tool_calls[0].id, content: '{"weather": "SUNNY_22C"}' });
  const second = await client.chat.completions.create({ model: 'gpt-oss-test', messages, tools });
  assert.equal(second.choices[0].message.content, 'It is sunny in Paris, 22°C.');
  assert.equal(second.choices[0].finish_reason, 'stop');
  assert.deepEqual(second.choices[0].message.tool_calls ?? [], []);
});

test('calls to undeclared functions are never returned', async () => {
  const r = await client.chat.completions.create({ model: 'gpt-oss-test', messages: [{ role: 'user', content: 'UNDECLARED_TOOL' }], tools });
  assert.deepEqual(r.choices[0].message.tool_calls ?? [], []);
  assert.equal(r.choices[0].finish_reason, 'stop');
});

test('malformed Harmony is recovered, never a 500, no markers in content', async () => {
  for (const stream of [false, true]) {
    const req = { model: 'gpt-oss-test', messages: [{ role: 'user', content: 'MALFORMED_PLEASE' }] };
    let content;
    if (stream) content = (await collectChatStream(await client.chat.completions.create({ ...req, stream: true }))).content;
    else content = (await client.chat.completions.create(req)).choices[0].message.content;
    assert.ok(content.includes('Recovered answer.'), content);
    assert.ok(!content.includes('<|'), content);
  }
  const m = await metrics(server.baseURL);
  assert.ok(m.value('ossrt:harmony_recoveries_total') > 0, 'recoveries counted');
});

test('max_tokens cuts with finish_reason length', async () => {
  const r = await client.chat.completions.create({ model: 'gpt-oss-test', messages: [{ role: 'user', content: 'LONG_REPLY' }], max_tokens: 5 });
  assert.equal(r.choices[0].finish_reason, 'length');
  assert.equal(r.usage.completion_tokens, 5);
});

test('completions: raw prompt, non-stream and stream', async () => {
  const r = await client.completions.create({ model: 'gpt-oss-test', prompt: 'Say hi', max_tokens: 50 });
  assert.equal(r.object, 'text_completion');
  assert.ok(r.choices[0].text.includes('Hello from ossrt!'), r.choices[0].text);
  assert.ok(!r.choices[0].text.includes('<|'), 'specials skipped by default');
  assert.equal(r.usage.total_tokens, r.usage.prompt_tokens + r.usage.completion_tokens);
  const stream = await client.completions.create({ model: 'gpt-oss-test', prompt: 'Say hi', max_tokens: 50, stream: true, stream_options: { include_usage: true } });
  let text = '';
  let usage = null;
  for await (const c of stream) {
    if (c.usage) usage = c.usage;
    if (c.choices.length) text += c.choices[0].text;
  }
  assert.equal(text, r.choices[0].text);
  assert.equal(usage.completion_tokens, r.usage.completion_tokens);
});

test('responses: instructions, previous_response_id, GET by id, usage', async () => {
  const first = await client.responses.create({ model: 'gpt-oss-test', instructions: 'Be brief.', input: 'My name is Ada.', reasoning: { effort: 'low' } });
  assert.equal(first.status, 'completed');
  assert.equal(outputText(first), 'Hello from ossrt!');
  assert.equal(first.output[0].type, 'reasoning');
  assert.equal(first.output[0].content[0].type, 'reasoning_text');
  assert.equal(first.reasoning.effort, 'low');
  assert.ok(first.usage.output_tokens_details.reasoning_tokens > 0);
  assert.equal(first.usage.total_tokens, first.usage.input_tokens + first.usage.output_tokens);

  const second = await client.responses.create({ model: 'gpt-oss-test', previous_response_id: first.id, input: 'SECOND_TURN: what is my name?' });
  assert.equal(outputText(second), 'Your name is Ada.');
  assert.equal(second.previous_response_id, first.id);
  // The earlier turn is in the prompt: more input tokens than a fresh request with the same input.
  const fresh = await client.responses.create({ model: 'gpt-oss-test', input: 'SECOND_TURN: what is my name?' });
  assert.ok(second.usage.input_tokens > fresh.usage.input_tokens);

  const fetched = await client.responses.retrieve(second.id);
  assert.equal(fetched.id, second.id);
  assert.equal(outputText(fetched), 'Your name is Ada.');
  await assert.rejects(client.responses.create({ model: 'gpt-oss-test', previous_response_id: 'resp_doesnotexist', input: 'x' }),
    (e) => e.status === 404);
  const notStored = await client.responses.create({ model: 'gpt-oss-test', input: 'hi', store: false });
  await assert.rejects(client.responses.retrieve(notStored.id), (e) => e.status === 404);
});

test('responses: function call round trip and streamed event order', async () => {
  const rtools = [{ type: 'function', name: 'get_weather', description: 'weather', parameters: tools[0].function.parameters }];
  const stream = await client.responses.create({ model: 'gpt-oss-test', input: 'weather in Paris?', tools: rtools, stream: true });
  const types = [];
  let lastSeq = -1;
  let args = '';
  let completed = null;
  for await (const ev of stream) {
    assert.ok(ev.sequence_number > lastSeq, 'sequence_number increases');
    lastSeq = ev.sequence_number;
    types.push(ev.type);
    if (ev.type === 'response.function_call_arguments.delta') args += ev.delta;
    if (ev.type === 'response.completed') completed = ev.response;
  }
  assert.equal(types[0], 'response.created');
  assert.equal(types[1], 'response.in_progress');
  assert.equal(types[types.length - 1], 'response.completed');
  const expected = ['response.output_item.added', 'response.content_part.added', 'response.reasoning_text.delta',
    'response.reasoning_text.done', 'response.content_part.done', 'response.output_item.done',
    'response.output_item.added', 'response.function_call_arguments.delta', 'response.function_call_arguments.done',
    'response.output_item.done'];
  const compact = types.slice(2, -1).filter((t, i, a) => !(t.endsWith('.delta') && a[i - 1] === t));
  assert.deepEqual(compact, expected);
  const call = completed.output.find((o) => o.type === 'function_call');
  assert.equal(call.name, 'get_weather');
  assert.equal(call.arguments, args);
  assert.ok(completed.usage.output_tokens > 0);

  const followup = await client.responses.create({
    model: 'gpt-oss-test', previous_response_id: completed.id, tools: rtools,
    input: [{ type: 'function_call_output', call_id: call.call_id, output: '{"weather":"SUNNY_22C"}' }],
  });
  assert.equal(outputText(followup), 'It is sunny in Paris, 22°C.');
});

test('error codes: 400 JSON/type/context, 404 model/route, 413 body', async () => {
  let r = await rawPost(server.baseURL, '/v1/chat/completions', '{"model": "gpt-oss-test", "messages": [');
  assert.equal(r.status, 400); assertErrorShape(assert, r.json);
  r = await rawPost(server.baseURL, '/v1/chat/completions', JSON.stringify({ messages: [{ role: 'user', content: 'x' }], max_tokens: 'ten' }));
  assert.equal(r.status, 400); assertErrorShape(assert, r.json); assert.equal(r.json.error.param, 'max_tokens');
  await assert.rejects(client.chat.completions.create({ model: 'gpt-oss-test', messages: [{ role: 'user', content: 'x' }], max_tokens: 100000 }),
    (e) => e.status === 400 && e.code === 'context_length_exceeded' && /maximum context length is 4096 tokens/.test(e.message));
  await assert.rejects(client.chat.completions.create({ model: 'not-this-model', messages: [{ role: 'user', content: 'x' }] }),
    (e) => e.status === 404 && e.code === 'model_not_found');
  r = await rawPost(server.baseURL, '/v1/nothing-here', '{}');
  assert.equal(r.status, 404); assertErrorShape(assert, r.json);
  r = await rawPost(server.baseURL, '/v1/chat/completions', JSON.stringify({ messages: [{ role: 'user', content: 'x'.repeat(40 * 1024 * 1024) }] }));
  assert.equal(r.status, 413); assertErrorShape(assert, r.json);
});

test('tokenize / detokenize round trip', async () => {
  const t = await rawPost(server.baseURL, '/tokenize', JSON.stringify({ prompt: 'Hello world' }));
  assert.equal(t.status, 200);
  assert.deepEqual(t.json.tokens, [13225, 2375]);
  const d = await rawPost(server.baseURL, '/detokenize', JSON.stringify({ tokens: t.json.tokens }));
  assert.equal(d.json.prompt, 'Hello world');
});
