#!/usr/bin/env python3
"""Checks an `mt_checkpoint export-hf` export against Hugging Face transformers (not run in CI:
needs torch and transformers, several GB).

    python3 scripts/verify_hf_export.py CHECKPOINT_STEP_DIR TOKENIZER_JSON [--prompt TEXT]

Exports the checkpoint, loads it with transformers' LlamaForCausalLM (float32), and compares
greedy generation: transformers' model.generate against build/tools/mt_generate --checkpoint
(same prompt ids, no BOS, temperature 0, the checkpoint's debugmodel flavor), token for token:
every generated token is the argmax of the logits of both implementations, so any difference in
the weights' mapping, the q/k permutation or the config shows up. Exits 1 on a mismatch.
"""
import argparse
import json
import pathlib
import subprocess
import sys
import tempfile

import torch
from tokenizers import Tokenizer
from transformers import LlamaForCausalLM

ROOT = pathlib.Path(__file__).resolve().parent.parent


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("checkpoint")
    ap.add_argument("tokenizer")
    ap.add_argument("--prompt", default="ROMEO:\nWhat light through yonder window breaks?")
    ap.add_argument("--new-tokens", type=int, default=24)
    ap.add_argument("--build", default=str(ROOT / "build"))
    a = ap.parse_args()

    out = pathlib.Path(tempfile.mkdtemp(prefix="mt_hf_export_"))
    subprocess.run([f"{a.build}/tools/mt_checkpoint", "export-hf", a.checkpoint, str(out)], check=True)
    config = json.loads((out / "config.json").read_text())
    model = LlamaForCausalLM.from_pretrained(out, torch_dtype=torch.float32).eval()

    tok = Tokenizer.from_file(a.tokenizer)
    ids = tok.encode(a.prompt, add_special_tokens=False).ids
    max_new = min(a.new_tokens, config["max_position_embeddings"] - len(ids))
    with torch.no_grad():
        hf = model.generate(torch.tensor([ids]), max_new_tokens=max_new, do_sample=False,
                            min_new_tokens=max_new, pad_token_id=0)[0, len(ids):].tolist()
    ours_run = subprocess.run(
        [f"{a.build}/tools/mt_generate", "--tokenizer", a.tokenizer, "--checkpoint", a.checkpoint,
         "--prompt", a.prompt, "--no-bos", "--temperature", "0", "--max-new-tokens", str(max_new),
         "--max-seq-len", str(config["max_position_embeddings"]), "--flavor", "debugmodel"],
        check=True, capture_output=True, text=True)
    ours_text = ours_run.stdout[len(a.prompt):].rstrip("\n")
    hf_text = tok.decode(hf)
    print("transformers:", repr(hf_text))
    print("minititan:   ", repr(ours_text))
    if ours_text != hf_text:
        print("MISMATCH: greedy continuations differ", file=sys.stderr)
        return 1
    print(f"OK: {max_new} greedy tokens identical ({config['num_hidden_layers']} layers, "
          f"vocab {config['vocab_size']})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
