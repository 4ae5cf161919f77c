#!/usr/bin/python3
"""Encodes a corpus with Debian's python3-sentencepiece and prints
{"ids": [[...], ...], "decoded": [...]} as JSON (no BOS/EOS added), for
vramgate's tokenizer tests to compare against.

  /usr/bin/python3 tools/tokenizer/reference_sentencepiece.py tokenizer.model CORPUS.json
"""
import json
import sys

import sentencepiece as spm


def main():
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    sp = spm.SentencePieceProcessor(model_file=sys.argv[1])
    with open(sys.argv[2], encoding="utf-8") as f:
        corpus = json.load(f)
    ids = [sp.encode(text) for text in corpus]
    json.dump({"ids": ids, "decoded": [sp.decode(x) for x in ids]}, sys.stdout, ensure_ascii=False)


if __name__ == "__main__":
    main()
