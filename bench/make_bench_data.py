"""Random training data for the GPU Llama benchmark, made without minititan's tools (the GPU
machine has Python, numpy and h5py but not our build): a stand-in byte-level BPE tokenizer with
Llama 3's vocabulary size (128,000 model tokens + 256 special tokens = 128,256 ids; the model's
vocab is the tokenizer's size) and a minititan token file of uniformly random ids.

    python3 bench/make_bench_data.py --out out/bench_data [--vocab 128256] [--tokens 2000000]

Writes OUT/tokenizer/{tokenizer.json,tokenizer_config.json} and OUT/tokens.h5. The token file
follows data/dataset/token_file.h (format "minititan-tokens" v1, /tokens u32, root attributes;
the tokenizer is identified by tokenizer_hash = FNV-1a 64 of tokenizer.json, fingerprint empty).
Throughput does not depend on which ids the batches hold, only on the vocabulary size.
"""
import argparse
import json
import os

import h5py
import numpy as np

N_SPECIAL = 256  # Llama 3: <|begin_of_text|> = 128000, <|end_of_text|> = 128001, reserved ...


def byte_level_alphabet():  # GPT-2's bytes_to_unicode, in byte order
    printable = [*range(ord("!"), ord("~") + 1), *range(0xA1, 0xAD), *range(0xAE, 0x100)]
    out, extra = {}, 0
    for b in range(256):
        if b in printable:
            out[b] = chr(b)
        else:
            out[b] = chr(256 + extra)
            extra += 1
    return [out[b] for b in range(256)]


def special_names(n):
    names = ["<|begin_of_text|>", "<|end_of_text|>"]
    return names + [f"<|reserved_special_token_{i}|>" for i in range(n - len(names))]


def write_tokenizer(folder, vocab_size):
    n_model = vocab_size - N_SPECIAL
    assert n_model > 256, "the vocabulary must hold the 256 byte tokens"
    vocab = {tok: i for i, tok in enumerate(byte_level_alphabet())}
    for i in range(256, n_model):  # filler tokens: no merge ever produces them
        vocab[f"t{i}"] = i
    added = [{"id": n_model + i, "content": name, "single_word": False, "lstrip": False,
              "rstrip": False, "normalized": False, "special": True}
             for i, name in enumerate(special_names(N_SPECIAL))]
    tokenizer = {
        "version": "1.0", "truncation": None, "padding": None, "added_tokens": added,
        "normalizer": None,
        "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True,
                          "use_regex": True},
        "post_processor": None, "decoder": {"type": "ByteLevel"},
        "model": {"type": "BPE", "dropout": None, "unk_token": None,
                  "continuing_subword_prefix": None, "end_of_word_suffix": None,
                  "fuse_unk": False, "byte_fallback": False, "vocab": vocab, "merges": []},
    }
    os.makedirs(folder, exist_ok=True)
    path = os.path.join(folder, "tokenizer.json")
    with open(path, "w") as f:
        json.dump(tokenizer, f, ensure_ascii=False)
    with open(os.path.join(folder, "tokenizer_config.json"), "w") as f:
        json.dump({"bos_token": added[0]["content"], "eos_token": added[1]["content"]}, f)
    return path, n_model + 1  # the EOS id


def fnv1a64_hex(path):  # data::tokenizer_file_hash
    h = 0xCBF29CE484222325
    with open(path, "rb") as f:
        for byte in f.read():
            h = ((h ^ byte) * 0x100000001B3) & 0xFFFFFFFFFFFFFFFF
    return f"{h:016x}"


def str_attr(attrs, name, value):  # fixed-size NUL-padded ASCII, as the C++ writer stores it
    data = value.encode() or b"\0"
    attrs.create(name, np.array(data, dtype=f"S{len(data)}"))


def write_tokens(path, tokenizer_json, vocab_size, eos_id, n_tokens, seed):
    ids = np.random.default_rng(seed).integers(0, vocab_size, n_tokens, dtype=np.uint32)
    ids[-1] = eos_id  # one document, followed by its EOS
    partial = path + ".partial"
    with h5py.File(partial, "w") as f:
        f.create_dataset("tokens", data=ids, dtype="<u4", chunks=(min(n_tokens, 1 << 16),),
                         maxshape=(None,))
        i64 = lambda name, v: f.attrs.create(name, v, dtype="<i8")
        str_attr(f.attrs, "format", "minititan-tokens")
        i64("format_version", 1)
        i64("eos_id", eos_id)
        str_attr(f.attrs, "tokenizer_path", os.path.abspath(tokenizer_json))
        i64("tokenizer_vocab_size", vocab_size)
        str_attr(f.attrs, "tokenizer_hash", fnv1a64_hex(tokenizer_json))
        str_attr(f.attrs, "tokenizer_fingerprint", "")
        i64("num_documents", 1)
        i64("num_tokens", n_tokens)
    os.replace(partial, path)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", required=True)
    p.add_argument("--vocab", type=int, default=128256)
    p.add_argument("--tokens", type=int, default=2_000_000)
    p.add_argument("--seed", type=int, default=0)
    a = p.parse_args()
    tokenizer_json, eos_id = write_tokenizer(os.path.join(a.out, "tokenizer"), a.vocab)
    write_tokens(os.path.join(a.out, "tokens.h5"), tokenizer_json, a.vocab, eos_id, a.tokens,
                 a.seed)
    print(f"data: {a.tokens} random ids of a {a.vocab}-token vocabulary in {a.out}/tokens.h5, "
          f"tokenizer in {a.out}/tokenizer")


if __name__ == "__main__":
    main()
