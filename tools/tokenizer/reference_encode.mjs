// Encodes a corpus with a reference tokenizer written by others and prints
// {"ids": [[...], ...], "decoded": ["...", ...]} as JSON, for vramgate's
// tokenizer tests to compare against.
//
//   node tools/tokenizer/reference_encode.mjs tiktoken-gpt2 CORPUS.json   (js-tiktoken, OpenAI's gpt2 encoding)
//   node tools/tokenizer/reference_encode.mjs hf DIR CORPUS.json          (@huggingface/tokenizers on DIR/tokenizer.json)
//
// Special tokens written in the text are encoded as special tokens, and no
// BOS/EOS is added, as vramgate's encode() does.
import fs from "node:fs";
import path from "node:path";

const [mode, ...rest] = process.argv.slice(2);
const corpusFile = rest[rest.length - 1];
if (!mode || !corpusFile) {
  console.error("usage: reference_encode.mjs tiktoken-gpt2 CORPUS | hf DIR CORPUS");
  process.exit(2);
}
const corpus = JSON.parse(fs.readFileSync(corpusFile, "utf8"));
let encode;
let decode;
if (mode === "tiktoken-gpt2") {
  const { Tiktoken } = await import("js-tiktoken/lite");
  const gpt2 = (await import("js-tiktoken/ranks/gpt2")).default;
  const enc = new Tiktoken(gpt2);
  encode = (text) => enc.encode(text, "all");
  decode = (ids) => enc.decode(ids);
} else if (mode === "hf") {
  const { Tokenizer } = await import("@huggingface/tokenizers");
  const dir = rest[0];
  const json = JSON.parse(fs.readFileSync(path.join(dir, "tokenizer.json"), "utf8"));
  const tok = new Tokenizer(json, {});
  encode = (text) => tok.encode(text, { add_special_tokens: false }).ids;
  decode = (ids) => (ids.length ? tok.decode(ids, { skip_special_tokens: false, clean_up_tokenization_spaces: false }) : "");
} else {
  console.error(`unknown mode ${mode}`);
  process.exit(2);
}
const ids = corpus.map((text) => Array.from(encode(text), Number));
console.log(JSON.stringify({ ids, decoded: ids.map((x) => decode(x)) }));
