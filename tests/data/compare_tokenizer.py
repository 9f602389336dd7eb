#!/usr/bin/env python3
"""Encodes strings with Hugging Face `tokenizers`, as the reference for minititan's tokenizer.

  python3 tests/data/compare_tokenizer.py TOKENIZER_JSON [STRINGS_JSON]

STRINGS_JSON holds a JSON list of strings (default: a few built-in samples). Prints a JSON list
with, for each string, the list of token ids (no special tokens added, no truncation or padding).
Exits 2 when
`tokenizers` is not importable, so callers can skip. tests/data/tokenizer_test.cpp runs it.
"""
import json
import sys

SAMPLES = ["Hello world", "I'm here, they'll've 12345 items!",
           "emoji 😀 中文 العربية e\u0301"]


def main():
    try:
        from tokenizers import Tokenizer
    except ImportError:
        print("compare_tokenizer.py: the Python package `tokenizers` is not installed",
              file=sys.stderr)
        return 2
    if len(sys.argv) < 2:
        print(__doc__, file=sys.stderr)
        return 1
    tok = Tokenizer.from_file(sys.argv[1])
    tok.no_truncation()
    tok.no_padding()
    strings = SAMPLES
    if len(sys.argv) > 2:
        with open(sys.argv[2], encoding="utf-8") as f:
            strings = json.load(f)
    result = []
    for s in strings:
        result.append(tok.encode(s, add_special_tokens=False).ids)
    json.dump(result, sys.stdout)
    print()
    return 0


if __name__ == "__main__":
    sys.exit(main())
