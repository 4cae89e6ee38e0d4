#!/usr/bin/env python3
"""Writes the seed inputs of tests/fuzz/corpus/<target>/ (committed; rerun after changing it).

Seeds are small valid and near-valid inputs that lead the fuzzers into each parser's interesting
paths; crashes the fuzzers find are added next to them (as crash-<sha1>) and replayed by
fuzz_regression_test forever after.
"""
import json
import os
import struct

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))


def write(target, name, data):
    d = os.path.join(HERE, "corpus", target)
    os.makedirs(d, exist_ok=True)
    if isinstance(data, str):
        data = data.encode("utf-8")
    with open(os.path.join(d, name), "wb") as f:
        f.write(data)


# http_request: raw HTTP/1.1 requests.
for name, req in {
    "get_health": "GET /health HTTP/1.1\r\nHost: x\r\n\r\n",
    "head_health": "HEAD /health HTTP/1.1\r\nHost: x\r\n\r\n",
    "post_chat": 'POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer sk-fuzz\r\n'
                 'Content-Type: application/json\r\nContent-Length: 45\r\n\r\n{"messages":[{"role":"user","content":"hi"}]}',
    "chunked": "POST /v1/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer sk-fuzz\r\n"
               "Transfer-Encoding: chunked\r\n\r\n5\r\n{\"a\":\r\n2\r\n1}\r\n0\r\n\r\n",
    "te_gzip": "POST /v1/completions HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: gzip, chunked\r\n\r\n0\r\n\r\n",
    "te_and_length": "POST /tokenize HTTP/1.1\r\nHost: x\r\nContent-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n",
    "response_id": "GET /v1/responses/resp_0123456789abcdef/cancel?x=1 HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer nope\r\n\r\n",
    "bad_method": "DELETE /health HTTP/1.1\r\nHost: x\r\n\r\n",
}.items():
    write("http_request", name, req)

# request_json: first byte picks the endpoint (0 chat, 1 completions, 2 responses), the rest is the body.
chat_bodies = {
    "chat_simple": {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4},
    "chat_sampling": {"messages": [{"role": "system", "content": "s"}, {"role": "user", "content": "u"}],
                      "temperature": 0.5, "top_p": 0.9, "top_k": 40, "min_p": 0.1, "logit_bias": {"100": 2},
                      "stop": ["\n", "end"], "stop_token_ids": [200012], "seed": 7, "n": 2, "logprobs": True,
                      "top_logprobs": 3, "stream": True, "stream_options": {"include_usage": True},
                      "min_tokens": 1, "max_completion_tokens": 8, "metadata": {"k": "v"}},
    "chat_tools": {"messages": [{"role": "user", "content": "weather?"},
                                {"role": "assistant", "content": None, "reasoning": "think",
                                 "tool_calls": [{"id": "c1", "type": "function",
                                                 "function": {"name": "get_weather", "arguments": "{\"city\":\"x\"}"}}]},
                                {"role": "tool", "tool_call_id": "c1", "content": "sunny"}],
                   "tools": [{"type": "function", "function": {"name": "get_weather", "description": "d",
                                                                "parameters": {"type": "object", "properties": {
                                                                    "city": {"type": "string", "description": "c"},
                                                                    "unit": {"type": "string", "enum": ["c", "f"], "default": "c"},
                                                                    "days": {"oneOf": [{"type": "integer"}, {"type": "null"}]}},
                                                                    "required": ["city"]}}}],
                   "tool_choice": {"type": "function", "function": {"name": "get_weather"}},
                   "reasoning_effort": "high", "response_format": {"type": "json_schema", "json_schema": {"name": "n", "schema": {"type": "object"}}}},
}
for name, body in chat_bodies.items():
    write("request_json", name, b"\x00" + json.dumps(body).encode())
for name in ("B_request.json", "C_request.json"):
    with open(os.path.join(ROOT, "tests", "harmony", name), "rb") as f:
        write("request_json", "harmony_" + name, b"\x00" + f.read())
write("request_json", "completions_text", b"\x01" + json.dumps({"prompt": "<|start|>user<|message|>hi<|end|>", "max_tokens": 3, "echo": True, "logprobs": 2}).encode())
write("request_json", "completions_ids", b"\x01" + json.dumps({"prompt": [1, 2, 3, 200006], "max_tokens": 3, "stream": True}).encode())
write("request_json", "responses_items", b"\x02" + json.dumps({
    "input": [{"role": "user", "content": [{"type": "input_text", "text": "hi"}]},
              {"type": "reasoning", "content": [{"type": "reasoning_text", "text": "r"}]},
              {"type": "function_call", "call_id": "c", "name": "f", "arguments": "{}"},
              {"type": "function_call_output", "call_id": "c", "output": {"ok": True}}],
    "instructions": "be brief", "tools": [{"type": "function", "name": "f", "parameters": {"type": "object"}}],
    "tool_choice": "required", "reasoning": {"effort": "low"}, "text": {"format": {"type": "json_object"}},
    "max_output_tokens": 5, "metadata": {"a": "b"}, "truncation": "auto", "store": False}).encode())
write("request_json", "responses_stream", b"\x02" + json.dumps({"input": "hello", "stream": True, "top_logprobs": 2}).encode())

# harmony_parser: 2 bytes per id (see fuzz_targets.cpp for the mapping); a few deterministic streams.
import random
rng = random.Random(19)
for i in range(6):
    write("harmony_parser", f"random_{i}", bytes(rng.randrange(256) for _ in range(64 * (i + 1))))

# tokenizer: text of every kind.
for name, text in {
    "english": "Hello, world! The quick brown fox jumps over 13 lazy dogs.\n\n  indented\ttabs",
    "multilingual": "Grüße, 世界! Привет, мир. مرحبا بالعالم 🌍🎉 ",
    "specials": "<|start|>user<|message|>hi<|end|><|reserved_200017|><|channel|>",
    "code": "def f(x):\n    return {'a': [1, 2.5e-3, None]}  # comment\n",
    "spaces": " " * 300 + "x" + "\n" * 40,
}.items():
    write("tokenizer", name, text)
write("tokenizer", "invalid_utf8", b"ok \xff\xfe \xc3( \xe2\x82 \xf0\x9f\x98 end \xed\xa0\x80")

# safetensors_header: a valid two-tensor file and a few broken ones.
def safetensors(header, data):
    h = json.dumps(header).encode()
    return struct.pack("<Q", len(h)) + h + data
valid = safetensors({"a": {"dtype": "BF16", "shape": [2, 2], "data_offsets": [0, 8]},
                     "b": {"dtype": "U8", "shape": [3], "data_offsets": [8, 11]},
                     "__metadata__": {"format": "pt"}}, bytes(range(11)))
write("safetensors_header", "valid", valid)
write("safetensors_header", "offsets_past_end", safetensors({"a": {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]}}, b"\0" * 8))
write("safetensors_header", "shape_mismatch", safetensors({"a": {"dtype": "F32", "shape": [3], "data_offsets": [0, 8]}}, b"\0" * 8))
write("safetensors_header", "huge_header_len", struct.pack("<Q", 2 ** 62) + b"{}")
write("safetensors_header", "truncated", valid[:20])

# config_json: the golden fixtures' configs.
for case in ("bf16_single", "mxfp4_sharded", "long_yarn"):
    with open(os.path.join(ROOT, "tests", "golden", case, "config.json"), "rb") as f:
        write("config_json", case, f.read())


# structured_source: byte 0 = kind (0 JSON Schema, 1 regex, 2 EBNF, 3 choice list), byte 1 = seed.
for name, (kind, text) in {
    "schema_object": (0, '{"type":"object","properties":{"a":{"type":"integer","minimum":-5,"maximum":120},'
                         '"b":{"type":"string","maxLength":3},"c":{"enum":["x",1,null]}},"required":["a"],'
                         '"additionalProperties":false}'),
    "schema_recursive": (0, '{"$defs":{"n":{"type":"object","properties":{"k":{"type":"array","items":{"$ref":"#/$defs/n"},'
                            '"maxItems":2}}}},"$ref":"#/$defs/n"}'),
    "schema_anyof": (0, '{"anyOf":[{"type":"number","exclusiveMinimum":0.5},{"type":"string","format":"date"},{"type":"null"}]}'),
    "schema_pattern": (0, '{"type":"string","pattern":"^[a-z]+\\\\d?$","minLength":2}'),
    "schema_json_any": (0, '{}'),
    "regex_simple": (1, "[A-Z]{2}-\\d{3}( ok)?"),
    "regex_unicode": (1, "(é|€)+.[^a-c]\\s*"),
    "ebnf_expr": (2, 'root ::= "(" expr ")"\nexpr ::= num (op num)*\nop ::= [+*-]\nnum ::= [0-9]+ | root'),
    "ebnf_json": (2, 'root ::= obj\nobj ::= "{" (kv ("," kv)*)? "}"\nkv ::= "\\"" [a-z]* "\\":" (obj | [0-9]+)'),
    "choice": (3, "yes\nno\nmaybe"),
}.items():
    write("structured_source", name, bytes([kind, 7]) + text.encode("utf-8"))
