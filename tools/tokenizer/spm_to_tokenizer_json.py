#!/usr/bin/python3
"""Converts a SentencePiece BPE model (tokenizer.model) into a Hugging Face
tokenizer.json the way transformers' LlamaConverter does: BPE with byte
fallback, merges ordered by the merged piece's id, "<unk>"/"<s>"/"</s>" as
special tokens. Two layouts of the same tokenizer are written:

  metaspace/       pre_tokenizer Metaspace (prepend_scheme "first", no split)
  metaspace-norm/  normalizers Prepend("▁") + Replace(" ", "▁") (LLaMA-2/TinyLlama files)

  /usr/bin/python3 tools/tokenizer/spm_to_tokenizer_json.py tokenizer.model OUT_DIR
"""
import json
import os
import sys

import sentencepiece as spm


def main():
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    model, out = sys.argv[1], sys.argv[2]
    sp = spm.SentencePieceProcessor(model_file=model)
    vocab = {sp.id_to_piece(i): i for i in range(sp.get_piece_size())}
    merges = []
    for piece, pid in vocab.items():
        if sp.is_control(pid) or sp.is_unknown(pid) or sp.is_byte(pid):
            continue
        for k in range(1, len(piece)):
            left, right = piece[:k], piece[k:]
            if left in vocab and right in vocab:
                merges.append((pid, vocab[left], vocab[right], left, right))
    merges.sort()
    specials = [
        {"id": i, "content": sp.id_to_piece(i), "single_word": False, "lstrip": False, "rstrip": False,
         "normalized": False, "special": True}
        for i in range(sp.get_piece_size()) if sp.is_control(i) or sp.is_unknown(i)
    ]
    decoder = {"type": "Sequence", "decoders": [
        {"type": "Replace", "pattern": {"String": "\u2581"}, "content": " "},
        {"type": "ByteFallback"}, {"type": "Fuse"},
        {"type": "Strip", "content": " ", "start": 1, "stop": 0}]}
    bos = sp.id_to_piece(sp.bos_id())
    post = {"type": "TemplateProcessing",
            "single": [{"SpecialToken": {"id": bos, "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}}],
            "pair": [{"SpecialToken": {"id": bos, "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}},
                     {"SpecialToken": {"id": bos, "type_id": 1}}, {"Sequence": {"id": "B", "type_id": 1}}],
            "special_tokens": {bos: {"id": bos, "ids": [sp.bos_id()], "tokens": [bos]}}}
    model_json = {"type": "BPE", "dropout": None, "unk_token": sp.id_to_piece(sp.unk_id()),
                  "continuing_subword_prefix": None, "end_of_word_suffix": None, "fuse_unk": True,
                  "byte_fallback": True, "ignore_merges": False, "vocab": vocab,
                  "merges": [[m[3], m[4]] for m in merges]}
    layouts = {
        "metaspace": (None, {"type": "Metaspace", "replacement": "\u2581", "prepend_scheme": "first", "split": False}),
        "metaspace-norm": ({"type": "Sequence", "normalizers": [
            {"type": "Prepend", "prepend": "\u2581"},
            {"type": "Replace", "pattern": {"String": " "}, "content": "\u2581"}]}, None),
    }
    for name, (normalizer, pre) in layouts.items():
        os.makedirs(os.path.join(out, name), exist_ok=True)
        doc = {"version": "1.0", "truncation": None, "padding": None, "added_tokens": specials,
               "normalizer": normalizer, "pre_tokenizer": pre, "post_processor": post, "decoder": decoder,
               "model": model_json}
        with open(os.path.join(out, name, "tokenizer.json"), "w", encoding="utf-8") as f:
            json.dump(doc, f, ensure_ascii=False)
    print(f"{model}: {len(vocab)} pieces, {len(merges)} merges -> {out}/metaspace, {out}/metaspace-norm")


if __name__ == "__main__":
    main()
