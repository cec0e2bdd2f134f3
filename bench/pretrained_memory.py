"""Memory and time of loading a Hugging Face folder: ``zoo.gpt.from_pretrained`` against transformers'
``AutoModelForCausalLM.from_pretrained``, on a random-weight Llama of a few hundred MB.

The folder (transformers' ``LlamaConfig``, untied head, safetensors in ``--dtype``, a three-token ``tokenizer.json`` so
that the zoo's loader finds one) is written to a temporary directory, with a 2-layer one of the same architecture.
Each load runs in a fresh interpreter, the arms alternating (zoo, transformers, then transformers, zoo, ...),
``--rounds`` rounds. In the child:

1. import the arm's library, then load the small folder once: every lazy import and first-call cost is paid;
2. reset the peak resident set (``VmHWM``) to the RSS now (``/proc/self/clear_refs``) and note the RSS;
3. load the folder ("load s"), then sum every parameter ("+ read s"), so that weights left mapped from the file and
   not yet read are paged in and counted like the ones already copied (each net then holds all its weights);
4. peak = ``VmHWM`` minus the RSS at 2; at end = RSS now minus the RSS at 2; file-backed = the growth of the RSS's
   pages of mapped files (``RssFile``) since 2: weights left on the file's mapping.

``ru_maxrss`` is not used: Linux carries the parent's peak into a child at exec, so a child of this process (which
built the model, 1 GB) reports at least that. Both arms load with their default ``dtype="auto"``: the file's dtype
(``config.json`` states it), and the weights' size is their bytes in it (the file's weights). Both arms read the file
from the page cache (just written, and read by the previous rounds), which the RSS does not count. The sums of the
two nets' weights are compared (the zoo fuses q/k/v and gate/up, which leaves the sum unchanged): both arms loaded the
same weights.

    python bench/pretrained_memory.py                        # 125M parameters (476 MB), 3 rounds: ~45 s
    python bench/pretrained_memory.py --dtype bfloat16       # a bf16 file, loaded as bf16 by both (238 MB)
    python bench/pretrained_memory.py --layers 4 --rounds 1  # a quick look
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench._common import add_clock_arg, median, peer_header, table

ARMS = ("zoo", "transformers")


def write_folder(folder: Path, layers: int, width: int, vocab: int, dtype: str = "float32") -> int:
    """A random Llama (GQA with 4 KV heads, SwiGLU 8/3 x width, untied head) saved in ``dtype`` in ``folder``; the
    bytes of its weights in ``dtype``."""
    import torch
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=vocab,
        hidden_size=width,
        intermediate_size=64 * round(8 * width / 3 / 64),
        num_hidden_layers=layers,
        num_attention_heads=width // 64,
        num_key_value_heads=4,
        max_position_embeddings=2048,
        tie_word_embeddings=False,
        bos_token_id=1,
        eos_token_id=2,
    )
    torch.manual_seed(0)
    model = LlamaForCausalLM(config)
    model.to(getattr(torch, dtype)).save_pretrained(folder)
    size = sum(p.numel() * p.element_size() for p in model.parameters())
    words = {"<unk>": 0, "<s>": 1, "</s>": 2}
    tokenizer = Tokenizer(models.WordLevel(words, unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer.save(str(folder / "tokenizer.json"))
    return size


def loader(arm: str):
    """The arm's load function, its library imported."""
    if arm == "zoo":
        import zoo.gpt

        return lambda folder: zoo.gpt.from_pretrained(folder).net
    import transformers
    import transformers.models.llama.modeling_llama  # imported lazily by from_pretrained otherwise

    return lambda folder: transformers.AutoModelForCausalLM.from_pretrained(folder)


def status_kb() -> dict[str, int]:
    """VmRSS, VmHWM (its peak) and RssFile of this process in kB, from /proc."""
    fields = {}
    for line in open("/proc/self/status"):
        key, _, value = line.partition(":")
        if key in ("VmRSS", "VmHWM", "RssFile"):
            fields[key] = int(value.split()[0])
    return fields


def child(arm: str, folder: str, warm: str, clock: str) -> None:
    """One measured load (steps 1-4 of the header), printed as one JSON line."""
    import torch

    load = loader(arm)
    load(warm)
    with open("/proc/self/clear_refs", "w") as f:  # the peak so far (imports, warm-up) set to the RSS now
        f.write("5")
    base = status_kb()
    now = time.process_time if clock == "cpu" else time.perf_counter
    t0 = now()
    net = load(folder)
    seconds = now() - t0
    with torch.no_grad():
        # reads every weight; in float64 by chunks of 1M, so the sum is the same for both nets and allocates ~nothing
        total = sum(float(c.sum(dtype=torch.float64)) for p in net.parameters() for c in p.flatten().split(2**20))
    read = now() - t0
    end = status_kb()
    result = {
        "peak_mb": (end["VmHWM"] - base["VmRSS"]) / 1024,
        "end_mb": (end["VmRSS"] - base["VmRSS"]) / 1024,
        "file_mb": (end["RssFile"] - base["RssFile"]) / 1024,
        "seconds": seconds,
        "read_seconds": read,
        "sum": total,
        "params": sum(p.numel() for p in net.parameters()),
        "dtype": str(next(net.parameters()).dtype).removeprefix("torch."),
    }
    print(json.dumps(result))


def measure(arm: str, folder: Path, warm: Path, clock: str, threads: int) -> dict:
    env = dict(os.environ, OMP_NUM_THREADS=str(threads))
    cmd = [sys.executable, __file__, "--child", arm, str(folder), str(warm), "--clock", clock]
    out = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if out.returncode:
        raise SystemExit(f"{arm} child failed:\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def spread(xs: list[float], fmt: str) -> str:
    return f"{median(xs):{fmt}} [{min(xs):{fmt}}-{max(xs):{fmt}}]"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--layers", type=int, default=12)
    ap.add_argument("--width", type=int, default=768)
    ap.add_argument("--vocab", type=int, default=32000)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--dtype", choices=("float32", "bfloat16"), default="float32", help="the file's weights")
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    ap.add_argument("--child", nargs=3, metavar=("ARM", "FOLDER", "WARM"), help=argparse.SUPPRESS)
    add_clock_arg(ap)
    args = ap.parse_args()
    if args.child:
        return child(*args.child, args.clock)
    peer_header("Loading a Hugging Face folder: zoo.gpt.from_pretrained vs transformers", args.threads, args.clock)
    import transformers

    print(f"transformers {transformers.__version__}; every load in a fresh process")
    with tempfile.TemporaryDirectory(prefix="zoo-pretrained-memory-") as tmp:
        folder, warm = Path(tmp, "model"), Path(tmp, "warm")
        size = write_folder(folder, args.layers, args.width, args.vocab, args.dtype) / 2**20
        write_folder(warm, 2, args.width, args.vocab // 100, args.dtype)
        print(
            f"model: Llama, {args.layers} layers, width {args.width}, vocab {args.vocab}, saved in {args.dtype}: "
            f"{size:.0f} MB of weights in {args.dtype}, loaded as {args.dtype} by both (dtype auto)"
        )
        runs: dict[str, list[dict]] = {arm: [] for arm in ARMS}
        for r in range(args.rounds):
            for arm in ARMS if r % 2 == 0 else ARMS[::-1]:
                runs[arm].append(measure(arm, folder, warm, args.clock, args.threads))
    report(runs, size, 1.1 if args.dtype == "bfloat16" else 1.2)


def report(runs: dict[str, list[dict]], size: float, target: float) -> None:
    """The table, the check that both arms hold the same weights, and the target's verdict."""
    rows = []
    for arm, rs in runs.items():
        peak = [x["peak_mb"] for x in rs]
        rows.append(
            [
                arm,
                f"{rs[0]['params'] / 1e6:.1f}M",
                rs[0]["dtype"],
                spread(peak, ".0f"),
                f"{median(peak) / size:.2f}",
                spread([x["end_mb"] for x in rs], ".0f"),
                spread([x["file_mb"] for x in rs], ".0f"),
                spread([x["seconds"] for x in rs], ".2f"),
                spread([x["read_seconds"] for x in rs], ".2f"),
            ]
        )
    headers = [
        "arm",
        "params",
        "dtype",
        "peak MB med [min-max]",
        "peak / weights",
        "at end MB",
        "file-backed MB",
        "load s",
        "+ read s",
    ]
    print(table(headers, rows))
    sums = {arm: rs[0]["sum"] for arm, rs in runs.items()}
    same = abs(sums["zoo"] - sums["transformers"]) <= 1e-6 * max(1.0, abs(sums["zoo"]))
    verdict = "equal" if same else "DIFFER"
    print(f"sum of the weights: zoo {sums['zoo']:.6f}, transformers {sums['transformers']:.6f} ({verdict})")
    zoo_peak = median([x["peak_mb"] for x in runs["zoo"]])
    print(f"target: the zoo's peak at most {target} x the weights: {'MET' if zoo_peak <= target * size else 'MISSED'}")


if __name__ == "__main__":
    main()
