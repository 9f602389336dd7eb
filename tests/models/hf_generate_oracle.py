#!/usr/bin/env python3
"""Oracle test: minititan's tools against Hugging Face transformers on random Llama models.

    python3 tests/models/hf_generate_oracle.py --build build [--shared-data ../shared/data]
                                              [--keep DIR]

Needs torch and transformers (CPU is enough; `pip install torch transformers tokenizers
safetensors numpy`). Without them it exits 77 (CTest's skip code) with a one-line reason, as it
does without the shared data (the GPT-2 tokenizer and tinyshakespeare.txt, in ../shared/data
beside the repository or $MT_SHARED_DATA).

1. transformers creates small random LlamaForCausalLM models (float32, GQA 8/2 heads, vocab
   50304 > the tokenizer's 50257) in four variants: llama3 RoPE scaling or none, tied embeddings
   or not, RMSNorm eps 1e-6 or 1e-5, and saves them (save_pretrained, safetensors). The weights
   are drawn with a larger std than transformers' default and the norm weights are not ones, so
   every mapping matters and greedy decoding has clear argmax gaps.
2. `mt_checkpoint import-hf` converts each; for several prompts `mt_generate --json` decodes 64
   greedy tokens, which must equal transformers' model.generate on the same prompt ids token for
   token (both stop at <|endoftext|> = 50256; neither generates the padded vocab's ids, which
   mt_generate never samples and transformers is told to suppress), and the prompt logits of `--logits-out` must equal
   transformers' within 1e-4 * max(1, max |logit|). `mt_checkpoint export-hf` of the imported
   checkpoint must give back the same config and weights.
3. The tied variant is fine-tuned a few steps with `train --model.flavor=from_checkpoint`, the
   last step is exported with `mt_checkpoint export-hf` and loaded by transformers: tied, every
   weight changed by training, and its logits equal mt_generate's on that checkpoint.

Prints one line per check (OK / MISMATCH); exits 1 on any mismatch or failed tool, 0 when all
pass.
"""
import argparse
import dataclasses
import json
import os
import pathlib
import shutil
import subprocess
import sys
import tempfile

SKIP = 77
ROOT = pathlib.Path(__file__).resolve().parents[2]
EOS = 50256  # GPT-2 <|endoftext|>
TOKENIZER_VOCAB = 50257
VOCAB = 50304  # padded past the tokenizer's 50257
PADDING_IDS = list(range(TOKENIZER_VOCAB, VOCAB))  # never generated (no text decodes them)
TOLERANCE = 1e-4
NEW_TOKENS = 64
PROMPTS = ["Once upon a time", "The quick brown fox", "ROMEO:"]
LLAMA3_SCALING = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                  "high_freq_factor": 4.0, "original_max_position_embeddings": 128}


@dataclasses.dataclass
class Variant:
    name: str
    scaling: bool
    tied: bool
    eps: float
    theta: float
    seed: int


VARIANTS = [
    Variant("a_llama3_scaling_untied", scaling=True, tied=False, eps=1e-6, theta=500000.0, seed=1),
    Variant("b_tied_no_scaling", scaling=False, tied=True, eps=1e-6, theta=10000.0, seed=2),
    Variant("c_tied_llama3_scaling", scaling=True, tied=True, eps=1e-6, theta=10000.0, seed=3),
    Variant("d_untied_eps1e-5", scaling=False, tied=False, eps=1e-5, theta=10000.0, seed=4),
]
TIED_FINETUNE = "b_tied_no_scaling"


class Oracle:
    def __init__(self, args, torch, transformers):
        self.torch = torch
        self.transformers = transformers
        self.failures = 0
        self.checks = 0
        self.build = pathlib.Path(args.build).resolve()
        self.data = pathlib.Path(args.shared_data).resolve()
        self.tokenizer = self.data / "gpt2" / "tokenizer.json"
        self.tools = {}

    # -- reporting -----------------------------------------------------------------------------

    def check(self, ok: bool, what: str) -> bool:
        self.checks += 1
        if not ok:
            self.failures += 1
        print(f"{'OK' if ok else 'MISMATCH'} {what}", flush=True)
        return ok

    def find_tools(self) -> bool:
        wanted = {"mt_checkpoint": "tools/mt_checkpoint", "mt_generate": "tools/mt_generate",
                  "train": "train/train"}
        for name, rel in wanted.items():
            path = self.build / rel
            if not (path.is_file() and os.access(path, os.X_OK)):
                found = [p for p in self.build.rglob(name)
                         if p.is_file() and os.access(p, os.X_OK) and "CMakeFiles" not in p.parts]
                if not found:
                    print(f"MISMATCH tools: no executable {name} under {self.build} "
                          "(build it first)")
                    self.failures += 1
                    return False
                path = found[0]
            self.tools[name] = str(path)
        return True

    def run(self, what: str, cmd, **kw):
        """Runs a tool; None (and a MISMATCH line with its stderr tail) when it fails."""
        try:
            r = subprocess.run([str(c) for c in cmd], capture_output=True, text=True, **kw)
        except OSError as e:
            self.check(False, f"{what}: cannot run {cmd[0]}: {e}")
            return None
        if r.returncode != 0:
            tail = " | ".join((r.stderr or r.stdout).strip().splitlines()[-6:])
            self.check(False, f"{what}: `{' '.join(str(c) for c in cmd[:2])} ...` exited "
                              f"{r.returncode}: {tail}")
            return None
        return r

    # -- transformers side ---------------------------------------------------------------------

    def make_model(self, v: Variant, out: pathlib.Path):
        torch, tf = self.torch, self.transformers
        import inspect
        kw = dict(vocab_size=VOCAB, hidden_size=256, intermediate_size=688, num_hidden_layers=4,
                  num_attention_heads=8, num_key_value_heads=2, max_position_embeddings=512,
                  rms_norm_eps=v.eps, tie_word_embeddings=v.tied, hidden_act="silu",
                  attention_bias=False, mlp_bias=False, bos_token_id=EOS, eos_token_id=EOS,
                  initializer_range=0.02)
        rope = dict(LLAMA3_SCALING) if v.scaling else None
        if "rope_parameters" in inspect.signature(tf.LlamaConfig.__init__).parameters:
            kw["rope_parameters"] = {**(rope or {"rope_type": "default"}), "rope_theta": v.theta}
        else:  # transformers 4
            kw["rope_theta"] = v.theta
            kw["rope_scaling"] = rope
        config = tf.LlamaConfig(**kw)
        torch.manual_seed(1000 + v.seed)
        model = tf.LlamaForCausalLM(config).to(torch.float32).eval()
        # Larger weights than the default init (clear argmax gaps), norm weights not all ones.
        gen = torch.Generator().manual_seed(v.seed)
        with torch.no_grad():
            for name, p in model.named_parameters():
                if p.dim() >= 2:
                    p.copy_(torch.randn(p.shape, generator=gen) * 0.06)
                else:
                    p.copy_(1.0 + 0.1 * torch.randn(p.shape, generator=gen))
        if v.tied:
            assert model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()
        model.save_pretrained(out, safe_serialization=True)
        return model

    def hf_logits(self, model, ids):
        torch = self.torch
        with torch.no_grad():
            return model(torch.tensor([ids])).logits[0].to(torch.float32)

    def hf_generate(self, model, ids):
        torch = self.torch
        x = torch.tensor([ids])
        with torch.no_grad():
            out = model.generate(input_ids=x, attention_mask=torch.ones_like(x), do_sample=False,
                                 max_new_tokens=NEW_TOKENS, eos_token_id=EOS, pad_token_id=EOS,
                                 suppress_tokens=PADDING_IDS)
        return out[0, len(ids):].tolist()

    # -- comparisons ---------------------------------------------------------------------------

    def compare_logits(self, what: str, ours, theirs) -> bool:
        if tuple(ours.shape) != tuple(theirs.shape):
            return self.check(False, f"{what}: logits shape {list(ours.shape)} vs transformers "
                                     f"{list(theirs.shape)}")
        diff = (ours - theirs).abs().max().item()
        peak = ours.abs().max().item()
        bound = TOLERANCE * max(1.0, peak)
        return self.check(diff <= bound, f"{what}: logits {list(ours.shape)} max |ours - "
                                         f"transformers| = {diff:.3g} (bound {bound:.3g}, "
                                         f"max |logit| {peak:.3g})")

    def compare_ids(self, what: str, ours, theirs, model, prompt_ids) -> bool:
        if ours == theirs:
            return self.check(True, f"{what}: {len(ours)} greedy tokens identical"
                                    f"{' (stopped at EOS)' if ours and ours[-1] == EOS else ''}")
        first = next((i for i, (a, b) in enumerate(zip(ours, theirs)) if a != b),
                     min(len(ours), len(theirs)))
        # The top-2 gap of transformers' logits there tells a near-tie from a real difference.
        gap = ""
        if first < len(theirs):
            logits = self.hf_logits(model, prompt_ids + theirs[:first])[-1, :TOKENIZER_VOCAB]
            top = logits.topk(2)
            gap = (f"; transformers' top-2 there {top.indices.tolist()} gap "
                   f"{(top.values[0] - top.values[1]).item():.3g}")
        return self.check(False, f"{what}: first difference at generated position {first} of "
                                 f"{len(ours)} (ours) / {len(theirs)} (transformers): ours "
                                 f"{ours[first:first + 4]}, transformers "
                                 f"{theirs[first:first + 4]}{gap}")

    def mt_generate(self, step_dir, prompt, logits_out):
        r = self.run(f"mt_generate {prompt!r}",
                     [self.tools["mt_generate"], "--checkpoint", step_dir, "--tokenizer",
                      self.tokenizer, "--prompt", prompt, "--max-new-tokens", NEW_TOKENS,
                      "--temperature", "0", "--json", "--logits-out", logits_out])
        if r is None:
            return None
        try:
            return json.loads(r.stdout)
        except json.JSONDecodeError as e:
            self.check(False, f"mt_generate {prompt!r}: stdout is not one JSON object ({e}): "
                              f"{r.stdout[:200]!r}")
            return None

    def load_logits(self, path):
        from safetensors.torch import load_file
        tensors = load_file(str(path))
        return tensors["logits"].to(self.torch.float32)

    def check_prompt(self, label, step_dir, model, prompt, work, expected_ids) -> None:
        logits_file = work / f"logits_{PROMPTS.index(prompt)}.safetensors"
        res = self.mt_generate(step_dir, prompt, logits_file)
        if res is None:
            return
        ids = res.get("prompt_ids")
        gen = res.get("generated_ids")
        if not isinstance(ids, list) or not isinstance(gen, list) or not ids:
            self.check(False, f"{label} {prompt!r}: JSON lacks prompt_ids/generated_ids: "
                              f"{sorted(res)}")
            return
        if expected_ids is not None and ids not in (expected_ids, [EOS] + expected_ids):
            self.check(False, f"{label} {prompt!r}: prompt_ids {ids} are not the tokenizers "
                              f"library's {expected_ids}")
        ours_logits = self.load_logits(logits_file)
        bos = "BOS 50256 + " if ids[0] == EOS and ids[1:] == expected_ids else ""
        self.compare_logits(f"{label} {prompt!r} prompt ({bos}{len(ids) - bool(bos)} ids)",
                            ours_logits, self.hf_logits(model, ids))
        theirs = self.hf_generate(model, ids)
        stop = res.get("stop_reason")
        self.compare_ids(f"{label} {prompt!r} generate (stop_reason {stop})", gen, theirs, model,
                         ids)

    def compare_configs(self, what, ours: dict, theirs: dict) -> bool:
        keys = ["vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
                "num_attention_heads", "num_key_value_heads", "max_position_embeddings",
                "rms_norm_eps", "tie_word_embeddings", "rope_theta", "rope_scaling"]

        def norm(cfg: dict) -> dict:
            out = {k: cfg.get(k) for k in keys}
            rp = cfg.get("rope_parameters")
            if rp:  # transformers 5 keeps theta and scaling together
                out["rope_theta"] = rp.get("rope_theta", out["rope_theta"])
                out["rope_scaling"] = {k: v for k, v in rp.items() if k != "rope_theta"}
            sc = out["rope_scaling"]
            if not sc or sc.get("rope_type", sc.get("type")) in (None, "default"):
                out["rope_scaling"] = None
            else:
                out["rope_scaling"] = {k: float(v) if isinstance(v, (int, float)) else v
                                       for k, v in sc.items() if k != "type"}
            if out["rope_theta"] is not None:
                out["rope_theta"] = float(out["rope_theta"])
            if out["tie_word_embeddings"] is None:
                out["tie_word_embeddings"] = True  # PretrainedConfig's default
            return out

        a, b = norm(ours), norm(theirs)
        diff = {k: (a[k], b[k]) for k in keys if a[k] != b[k]}
        return self.check(not diff, f"{what}: config {'matches' if not diff else diff}")

    # -- the checks ----------------------------------------------------------------------------

    def run_all(self, work: pathlib.Path) -> None:
        torch, tf = self.torch, self.transformers
        from tokenizers import Tokenizer
        tok = Tokenizer.from_file(str(self.tokenizer))
        enc = {p: tok.encode(p, add_special_tokens=False).ids for p in PROMPTS}
        models = {}
        for v in VARIANTS:
            hf_dir, step_dir = work / v.name / "hf", work / v.name / "imported" / "step-0"
            model = self.make_model(v, hf_dir)
            models[v.name] = (model, hf_dir, step_dir)
            label = (f"{v.name} ({'llama3 scaling' if v.scaling else 'no scaling'}, "
                     f"{'tied' if v.tied else 'untied'}, eps {v.eps:g}, theta {v.theta:g})")
            if self.run(f"{label} import-hf", [self.tools["mt_checkpoint"], "import-hf", hf_dir,
                                                step_dir, "--dtype", "float32"]) is None:
                continue
            for prompt in PROMPTS:
                self.check_prompt(v.name, step_dir, model, prompt, work / v.name, enc[prompt])
            # import-hf then export-hf gives back transformers' config and weights.
            back = work / v.name / "exported"
            if self.run(f"{v.name} export-hf", [self.tools["mt_checkpoint"], "export-hf",
                                                 step_dir, back]) is not None:
                self.compare_configs(f"{v.name} import-hf + export-hf",
                                     json.loads((back / "config.json").read_text()),
                                     json.loads((hf_dir / "config.json").read_text()))
                reloaded = tf.LlamaForCausalLM.from_pretrained(back, dtype=torch.float32)
                theirs = model.state_dict()
                worst = max((reloaded.state_dict()[k] - t).abs().max().item()
                            for k, t in theirs.items())
                self.check(worst == 0.0, f"{v.name} import-hf + export-hf: weights max |diff| "
                                         f"{worst:.3g} over {len(theirs)} tensors")
        self.finetune(work, *models[TIED_FINETUNE], enc)

    def finetune(self, work, model, hf_dir, step_dir, enc) -> None:
        torch, tf = self.torch, self.transformers
        if not step_dir.is_dir():
            return  # import failed, reported above
        text = work / "finetune.txt"
        text.write_bytes((self.data / "tinyshakespeare.txt").read_bytes()[:20000])
        dump = work / "finetune"
        steps = 4
        cmd = [self.tools["train"], "--config", ROOT / "configs" / "debug_model.toml",
               "--model.flavor=from_checkpoint", f"--checkpoint.initial_load_path={step_dir}",
               f"--model.tokenizer_path={self.tokenizer}", f"--training.dataset_path={text}",
               f"--training.steps={steps}", "--training.seq_len=64",
               "--training.local_batch_size=2", f"--job.dump_folder={dump}",
               "--checkpoint.enable=true", f"--checkpoint.interval={steps}",
               "--training.mixed_precision_param=float32", "--lr_scheduler.warmup_steps=1",
               "--validation.enable=false", "--metrics.plot=false"]
        if self.run(f"{TIED_FINETUNE} train {steps} steps from_checkpoint", cmd,
                    cwd=ROOT) is None:
            return
        final = dump / "checkpoint" / f"step-{steps}"
        if not self.check(final.is_dir(), f"{TIED_FINETUNE} train: saved {final.name}"):
            return
        out = work / "finetune_hf"
        if self.run(f"{TIED_FINETUNE} fine-tuned export-hf",
                    [self.tools["mt_checkpoint"], "export-hf", final, out]) is None:
            return
        config = json.loads((out / "config.json").read_text())
        tuned = tf.LlamaForCausalLM.from_pretrained(out, dtype=torch.float32).eval()
        tied = (config.get("tie_word_embeddings") is True and torch.equal(
            tuned.lm_head.weight, tuned.model.embed_tokens.weight))
        self.check(tied, f"{TIED_FINETUNE} fine-tuned export: tie_word_embeddings "
                         f"{config.get('tie_word_embeddings')}, lm_head == embed_tokens {tied}")
        self.compare_configs(f"{TIED_FINETUNE} fine-tuned export", config,
                             json.loads((hf_dir / "config.json").read_text()))
        before, after = model.state_dict(), tuned.state_dict()
        changes = {k: (after[k] - t).abs().max().item() for k, t in before.items() if k in after}
        unchanged = sorted(k for k, d in changes.items() if d == 0.0)
        self.check(len(changes) == len(before) and not unchanged,
                   f"{TIED_FINETUNE} fine-tuned export: {len(changes) - len(unchanged)}/"
                   f"{len(before)} tensors changed by training (max |change| "
                   f"{max(changes.values(), default=0.0):.3g})"
                   f"{'; unchanged: ' + ', '.join(unchanged[:5]) if unchanged else ''}")
        for prompt in PROMPTS:
            logits_file = work / f"finetune_logits_{PROMPTS.index(prompt)}.safetensors"
            res = self.mt_generate(final, prompt, logits_file)
            if res is None:
                continue
            ids = res["prompt_ids"]
            self.compare_logits(f"{TIED_FINETUNE} fine-tuned {prompt!r} prompt ({len(ids)} ids)",
                                self.load_logits(logits_file), self.hf_logits(tuned, ids))


def main() -> int:
    default_data = os.environ.get("MT_SHARED_DATA") or str(ROOT.parent / "shared" / "data")
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--build", default=str(ROOT / "build"), help="the CMake build folder")
    ap.add_argument("--shared-data", default=default_data,
                    help="folder with gpt2/tokenizer.json and tinyshakespeare.txt "
                         "(default $MT_SHARED_DATA or ../shared/data beside the repository)")
    ap.add_argument("--keep", help="work in this folder and keep it (models, checkpoints)")
    args = ap.parse_args()
    try:
        import torch
        import transformers
        import safetensors.torch  # noqa: F401
        import tokenizers  # noqa: F401
    except Exception as e:  # ImportError, or a broken install
        print(f"SKIP: hf_generate_oracle needs torch, transformers, safetensors and tokenizers "
              f"({type(e).__name__}: {e})")
        return SKIP
    data = pathlib.Path(args.shared_data)
    for f in ("gpt2/tokenizer.json", "tinyshakespeare.txt"):
        if not (data / f).is_file():
            print(f"SKIP: hf_generate_oracle needs {data / f} (shared data; set MT_SHARED_DATA)")
            return SKIP
    transformers.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()
    torch.set_grad_enabled(False)
    oracle = Oracle(args, torch, transformers)
    print(f"torch {torch.__version__}, transformers {transformers.__version__}, "
          f"build {oracle.build}", flush=True)
    if not oracle.find_tools():
        return 1
    if args.keep:
        work = pathlib.Path(args.keep).resolve()
        marker = work / ".hf_generate_oracle"
        if work.exists() and any(work.iterdir()):
            if not marker.exists():
                print(f"MISMATCH --keep {work}: not empty and not an earlier --keep folder")
                return 1
            shutil.rmtree(work)  # an earlier run's files
        work.mkdir(parents=True, exist_ok=True)
        marker.touch()
        oracle.run_all(work)
        print(f"files kept in {work}")
    else:
        with tempfile.TemporaryDirectory(prefix="mt_hf_oracle_") as tmp:
            oracle.run_all(pathlib.Path(tmp))
    passed = oracle.checks - oracle.failures
    print(f"hf_generate_oracle: {passed} passed, {oracle.failures} failed")
    return 1 if oracle.failures else 0


if __name__ == "__main__":
    sys.exit(main())
