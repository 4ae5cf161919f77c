#!/usr/bin/env bash
# Builds the reference tokenizers and the reference encodings that vramgate's
# tokenizer tests (tests/unit/tokenizer/reference_test.cpp) compare against;
# ctest runs it as the fixture "tokenizer_refs".
#   tools/tokenizer/make_references.sh OUT_DIR
# OUT_DIR/gpt2          GPT-2 vocab.json, merges.txt, tokenizer.json from js-tiktoken's ranks
# OUT_DIR/gpt2-split    the same vocabulary behind LLaMA-3's Split pattern
# OUT_DIR/spm           a SentencePiece BPE model (byte fallback, no Unicode normalization:
#                       vramgate applies none) trained on fortunes
# OUT_DIR/metaspace*    that model as tokenizer.json (Metaspace / Prepend+Replace layouts)
# each with expected*.json: {"ids": [...], "decoded": [...]} per corpus string.
# Node parts are skipped (OUT_DIR/SKIP-node says why) only when node or the
# npm packages are missing; scripts/install-deps installs them.
set -euo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)"
out="${1:?usage: make_references.sh OUT_DIR}"
corpus="$root/tests/unit/tokenizer/corpus.json"
mkdir -p "$out"
rm -f "$out/SKIP-node"

# SentencePiece: Debian's spm_train and python3-sentencepiece.
mkdir -p "$out/spm"
if [ ! -s "$out/spm/tokenizer.model" ]; then
  for f in fortunes literature wisdom people science computers; do
    cat "/usr/share/games/fortunes/$f"
  done | grep -v '^%$' > "$out/spm/fortunes.txt"
  spm_train --input="$out/spm/fortunes.txt" --model_prefix="$out/spm/tokenizer" --vocab_size=1000 \
    --model_type=bpe --byte_fallback=true --character_coverage=0.999 --normalization_rule_name=identity \
    --num_threads=1 --minloglevel=2
fi
/usr/bin/python3 "$root/tools/tokenizer/reference_sentencepiece.py" "$out/spm/tokenizer.model" "$corpus" \
  > "$out/spm/expected.json"
/usr/bin/python3 "$root/tools/tokenizer/spm_to_tokenizer_json.py" "$out/spm/tokenizer.model" "$out"

if ! command -v node > /dev/null; then
  echo "node is not installed (scripts/install-deps installs nodejs and npm)" > "$out/SKIP-node"
  echo "make_references: $(cat "$out/SKIP-node"): skipping the js-tiktoken and @huggingface/tokenizers references"
  exit 0
fi
if [ ! -d "$root/node_modules/js-tiktoken" ] || [ ! -d "$root/node_modules/@huggingface/tokenizers" ]; then
  echo "npm packages missing: run 'npm ci' in $root (scripts/install-deps does)" > "$out/SKIP-node"
  echo "make_references: $(cat "$out/SKIP-node")"
  exit 0
fi
cd "$root"
if [ ! -s "$out/gpt2/merges.txt" ]; then node tools/tokenizer/gpt2_from_tiktoken.mjs "$out"; fi
node tools/tokenizer/reference_encode.mjs tiktoken-gpt2 "$corpus" > "$out/gpt2/expected_tiktoken.json"
for d in gpt2 gpt2-split metaspace metaspace-norm; do
  node tools/tokenizer/reference_encode.mjs hf "$out/$d" "$corpus" > "$out/$d/expected_hf.json"
done
echo "make_references: references written to $out"
