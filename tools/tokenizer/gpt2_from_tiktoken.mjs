// Writes GPT-2's vocab.json, merges.txt and tokenizer.json, rebuilt from the
// BPE ranks that the npm package js-tiktoken ships (OpenAI's "gpt2"
// encoding). Each token's merge is found by running BPE on its bytes with
// only the lower ranks, which gives back GPT-2's original merges.txt order.
// Also writes a LLaMA-3-style variant (the same vocabulary behind a Split
// pre-tokenizer with LLaMA-3's pattern and ignore_merges) to exercise that path.
//
//   node tools/tokenizer/gpt2_from_tiktoken.mjs OUT_DIR
//   -> OUT_DIR/gpt2/{vocab.json,merges.txt,tokenizer.json}, OUT_DIR/gpt2-split/tokenizer.json
import fs from "node:fs";
import path from "node:path";
import { Tiktoken } from "js-tiktoken/lite";
import gpt2 from "js-tiktoken/ranks/gpt2";

const out = process.argv[2];
if (!out) {
  console.error("usage: gpt2_from_tiktoken.mjs OUT_DIR");
  process.exit(2);
}

// openai/gpt-2 encoder.py bytes_to_unicode().
const byteToChar = [];
{
  let n = 0;
  for (let b = 0; b < 256; b++) {
    const printable = (b >= 0x21 && b <= 0x7e) || (b >= 0xa1 && b <= 0xac) || (b >= 0xae && b <= 0xff);
    byteToChar[b] = String.fromCodePoint(printable ? b : 256 + n++);
  }
}
const show = (bytes) => Array.from(bytes, (b) => byteToChar[b]).join("");

const enc = new Tiktoken(gpt2);
const rankOf = enc.rankMap; // "b1,b2,..." -> rank
const bytesOf = enc.textMap; // rank -> Uint8Array

// BPE of `bytes` using only ranks below maxRank; returns the parts.
function parts(bytes, maxRank) {
  let p = Array.from(bytes, (b) => [b]);
  for (;;) {
    let best = -1;
    let bestRank = maxRank;
    for (let i = 0; i + 1 < p.length; i++) {
      const r = rankOf.get([...p[i], ...p[i + 1]].join(","));
      if (r !== undefined && r < bestRank) {
        bestRank = r;
        best = i;
      }
    }
    if (best < 0) return p;
    p.splice(best, 2, [...p[best], ...p[best + 1]]);
  }
}

const vocab = {};
const merges = [];
const ranks = [...bytesOf.keys()].sort((a, b) => a - b);
for (const rank of ranks) {
  const bytes = bytesOf.get(rank);
  vocab[show(bytes)] = rank;
  if (bytes.length < 2) continue;
  const p = parts(bytes, rank);
  if (p.length !== 2) throw new Error(`token ${rank} does not split into one merge`);
  merges.push([show(p[0]), show(p[1])]);
}
for (const [text, id] of Object.entries(gpt2.special_tokens)) vocab[text] = id;

const special = Object.entries(gpt2.special_tokens).map(([content, id]) => ({
  id, content, single_word: false, lstrip: false, rstrip: false, normalized: true, special: true,
}));
const byteLevel = { type: "ByteLevel", add_prefix_space: false, trim_offsets: true, use_regex: true };
const tokenizerJson = (preTokenizer, ignoreMerges) => ({
  version: "1.0",
  truncation: null,
  padding: null,
  added_tokens: special,
  normalizer: null,
  pre_tokenizer: preTokenizer,
  post_processor: byteLevel,
  decoder: byteLevel,
  model: {
    type: "BPE", dropout: null, unk_token: null, continuing_subword_prefix: "", end_of_word_suffix: "",
    fuse_unk: false, byte_fallback: false, ignore_merges: ignoreMerges, vocab, merges: merges.map((m) => m.join(" ")),
  },
});

const llama3Pattern =
  "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";

fs.mkdirSync(path.join(out, "gpt2"), { recursive: true });
fs.mkdirSync(path.join(out, "gpt2-split"), { recursive: true });
fs.writeFileSync(path.join(out, "gpt2", "vocab.json"), JSON.stringify(vocab));
fs.writeFileSync(path.join(out, "gpt2", "merges.txt"), "#version: 0.2\n" + merges.map((m) => m.join(" ")).join("\n") + "\n");
fs.writeFileSync(path.join(out, "gpt2", "tokenizer.json"), JSON.stringify(tokenizerJson(byteLevel, false)));
fs.writeFileSync(
  path.join(out, "gpt2-split", "tokenizer.json"),
  JSON.stringify(
    tokenizerJson(
      {
        type: "Sequence",
        pretokenizers: [
          { type: "Split", pattern: { Regex: llama3Pattern }, behavior: "Isolated", invert: false },
          { type: "ByteLevel", add_prefix_space: false, trim_offsets: true, use_regex: false },
        ],
      },
      true,
    ),
  ),
);
console.log(`gpt2: ${Object.keys(vocab).length} tokens, ${merges.length} merges -> ${out}`);
