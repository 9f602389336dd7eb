#!/usr/bin/env python3
"""Checks minititan's Hugging Face export against transformers (not run in CI: needs torch and
transformers, several GB; `pip install torch --index-url https://download.pytorch.org/whl/cpu
transformers tokenizers safetensors`).

Logits (the thorough check, needs only a build):

    python3 scripts/verify_hf_export.py --logits [--build build] [--tolerance 1e-4]

runs `BUILD/tests/hf_checkpoint_test` with MT_HF_EXPORT_DIR set, which exports small random
Llamas (GQA with llama3 RoPE scaling; tied embeddings, multi-head, no scaling; multi-query stored
as bf16 in several shards) through models/llama/hf_checkpoint + checkpoint/safetensors and saves
our float32 logits for fixed tokens. Each export is loaded with LlamaForCausalLM.from_pretrained
(float32) and its logits must match ours within tolerance * max(1, max |logit|). Then transformers
re-saves each model (save_pretrained: its own safetensors and config.json) and the test's
ImportsWhatTransformersSaved imports that with our code; its logits must match too. Any error in
the name map, the q/k permutation, the config (heads, FFN size, eps, theta, RoPE scaling, tying)
or the files shows up as a large difference (the random weights make every mapping matter).

Greedy generation from a training checkpoint (the whole tool path):

    python3 scripts/verify_hf_export.py CHECKPOINT_STEP_DIR TOKENIZER_JSON [--prompt TEXT]

exports the checkpoint with `mt_checkpoint export-hf`, and compares transformers' greedy
model.generate with `mt_generate --checkpoint` (same prompt ids, no BOS, temperature 0, the
debugmodel flavor) token for token, both stopping at the tokenizer's special (end) tokens. Only
argmaxes are compared, so prefer --logits; this mode checks the tools and the saved config.
Exits 1 on a mismatch.
"""
import argparse
import json
import os
import pathlib
import subprocess
import sys
import tempfile

import torch
from transformers import LlamaForCausalLM

ROOT = pathlib.Path(__file__).resolve().parent.parent


def run_test(build: str, name: str, env_var: str, folder: pathlib.Path) -> None:
    test = pathlib.Path(build) / "tests" / "hf_checkpoint_test"
    subprocess.run([str(test), f"--gtest_filter=HfCheckpoint.{name}"], check=True,
                   env={**os.environ, env_var: str(folder)}, stdout=subprocess.DEVNULL)


def report(what: str, ours: torch.Tensor, theirs: torch.Tensor, tolerance: float) -> bool:
    diff = (theirs - ours).abs().max().item() if theirs.shape == ours.shape else float("inf")
    bound = tolerance * max(1.0, ours.abs().max().item())
    ok = diff <= bound
    print(f"{'OK' if ok else 'MISMATCH'} {what}: logits {list(ours.shape)}, max |ours - "
          f"transformers| = {diff:.3g} (bound {bound:.3g}, max |logit| {ours.abs().max().item():.3g})")
    return ok


def check_logits(build: str, tolerance: float) -> int:
    from safetensors.torch import load_file

    out = pathlib.Path(tempfile.mkdtemp(prefix="mt_hf_logits_"))
    run_test(build, "ExportedModelsGiveIdenticalLogits", "MT_HF_EXPORT_DIR", out)
    variants = sorted(p for p in out.iterdir() if (p / "expected.safetensors").exists())
    if not variants:
        print(f"MISMATCH: hf_checkpoint_test wrote no exports into {out}", file=sys.stderr)
        return 1
    ok = True
    hf_logits = {}
    for v in variants:
        # Export: our files loaded by transformers.
        config = json.loads((v / "hf" / "config.json").read_text())
        model = LlamaForCausalLM.from_pretrained(v / "hf", dtype=torch.float32).eval()
        expected = load_file(v / "expected.safetensors")
        with torch.no_grad():
            hf_logits[v] = model(expected["tokens"]).logits
        ok &= report(f"export {v.name} ({config['num_hidden_layers']} layers, "
                     f"{config['num_attention_heads']} heads / {config['num_key_value_heads']} kv, "
                     f"stored {config['torch_dtype']}, tied {config['tie_word_embeddings']})",
                     expected["logits"], hf_logits[v], tolerance)
        model.save_pretrained(v / "resaved")
    # Import: what transformers saved, read by our code (ImportsWhatTransformersSaved).
    run_test(build, "ImportsWhatTransformersSaved", "MT_HF_IMPORT_DIR", out)
    for v in variants:
        files = sorted(p.name for p in (v / "resaved").iterdir())
        ok &= report(f"import {v.name} (transformers saved {', '.join(files)})",
                     load_file(v / "imported.safetensors")["logits"], hf_logits[v], tolerance)
    print(f"files in {out}")
    return 0 if ok else 1


def check_generation(a) -> int:
    from tokenizers import Tokenizer

    out = pathlib.Path(tempfile.mkdtemp(prefix="mt_hf_export_"))
    subprocess.run([f"{a.build}/tools/mt_checkpoint", "export-hf", a.checkpoint, str(out)], check=True)
    config = json.loads((out / "config.json").read_text())
    model = LlamaForCausalLM.from_pretrained(out, dtype=torch.float32).eval()

    tok = Tokenizer.from_file(a.tokenizer)
    ids = tok.encode(a.prompt, add_special_tokens=False).ids
    max_new = min(a.new_tokens, config["max_position_embeddings"] - len(ids))
    # mt_generate stops at the tokenizer's end-of-sequence token: so does transformers here (the
    # exported config names no eos_token_id, and decode() would drop the token silently).
    eos = sorted(i for i, t in tok.get_added_tokens_decoder().items() if t.special)
    with torch.no_grad():
        hf = model.generate(torch.tensor([ids]), max_new_tokens=max_new, do_sample=False,
                            eos_token_id=eos or None, pad_token_id=0)[0, len(ids):].tolist()
    ours_run = subprocess.run(
        [f"{a.build}/tools/mt_generate", "--tokenizer", a.tokenizer, "--checkpoint", a.checkpoint,
         "--prompt", a.prompt, "--no-bos", "--temperature", "0", "--max-new-tokens", str(max_new),
         "--max-seq-len", str(config["max_position_embeddings"]), "--flavor", "debugmodel"],
        check=True, capture_output=True, text=True)
    ours_text = ours_run.stdout[len(a.prompt):]
    ours_text = ours_text[:-1] if ours_text.endswith("\n") else ours_text  # the line end it adds
    hf_text = tok.decode(hf)
    print("transformers:", repr(hf_text))
    print("minititan:   ", repr(ours_text))
    if ours_text != hf_text:
        print("MISMATCH: greedy continuations differ", file=sys.stderr)
        return 1
    print(f"OK: {len(hf)} greedy tokens identical ({config['num_hidden_layers']} layers, "
          f"vocab {config['vocab_size']})")
    return 0


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("checkpoint", nargs="?")
    ap.add_argument("tokenizer", nargs="?")
    ap.add_argument("--logits", action="store_true", help="compare logits of random test models")
    ap.add_argument("--tolerance", type=float, default=1e-4)
    ap.add_argument("--prompt", default="ROMEO:\nWhat light through yonder window breaks?")
    ap.add_argument("--new-tokens", type=int, default=24)
    ap.add_argument("--build", default=str(ROOT / "build"))
    a = ap.parse_args()
    if a.logits:
        return check_logits(a.build, a.tolerance)
    if not (a.checkpoint and a.tokenizer):
        ap.error("give CHECKPOINT_STEP_DIR TOKENIZER_JSON, or --logits")
    return check_generation(a)


if __name__ == "__main__":
    sys.exit(main())
