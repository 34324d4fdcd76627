"""Peak memory of ES member scoring: chosen-token log-probs kept step by step vs every score.

The ES scoring policy (:class:`leanrl.train.es.policy.TorchPolicy`) needs one log-prob per
generated token. ``old`` is how it got them before: ``generate(output_scores=True)`` keeps every
step's full-vocabulary scores (steps x batch x vocab floats), then ``compute_transition_scores``
picks the chosen ones. ``new`` is what it does now: a logits processor keeps only the chosen
token's log-prob each step (:class:`leanrl.train.es.policy._ChosenLogprobs`). Each measurement
runs in a fresh process (the peak RSS of a process only grows); modes alternate; reported is the
peak RSS above the process's RSS just before generating, and the two log-prob tables are
checked to agree.

The model is a random 2-layer Llama with a 32k vocabulary (made here); greedy decoding of
``--batch`` rows x ``--tokens`` new tokens, one torch thread.

    python benchmarks/es_scoring_memory.py [--batch 16 --tokens 512 --vocab 32000 --rounds 3]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys

MODES = ("old", "new")


def child(mode: str, batch: int, tokens: int, vocab: int) -> dict[str, float]:
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM, LogitsProcessorList

    from leanrl.train.es.policy import _ChosenLogprobs

    torch.set_num_threads(1)
    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=vocab, hidden_size=64, intermediate_size=128,
                      num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=4,
                      tie_word_embeddings=False, eos_token_id=0, pad_token_id=1)  # fmt: skip
    model = LlamaForCausalLM(cfg).eval()
    with torch.no_grad():
        model.lm_head.weight[0].zero_()  # EOS never wins: every row runs all `tokens` steps
    ids = torch.randint(2, vocab, (batch, 32))
    kw = dict(max_new_tokens=tokens, min_new_tokens=tokens, do_sample=False, pad_token_id=1,
              eos_token_id=0, top_k=None)  # fmt: skip
    with torch.no_grad():
        model.generate(input_ids=ids[:, :4], max_new_tokens=2, pad_token_id=1)  # warm-up
        before = _rss_mb()
        if mode == "old":
            g = model.generate(
                input_ids=ids, output_scores=True, return_dict_in_generate=True, **kw
            )
            lp = model.compute_transition_scores(g.sequences, g.scores, normalize_logits=True)
        else:
            rec = _ChosenLogprobs()
            seq = model.generate(input_ids=ids, logits_processor=LogitsProcessorList([rec]), **kw)
            lp = rec.finish(seq)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return {"peak_above_mb": peak - before, "checksum": float(lp.double().sum())}


def _rss_mb() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--tokens", type=int, default=512)
    ap.add_argument("--vocab", type=int, default=32000)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--child", choices=MODES, help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.child:
        print(json.dumps(child(a.child, a.batch, a.tokens, a.vocab)))
        return
    res: dict[str, list[dict[str, float]]] = {m: [] for m in MODES}
    for r in range(a.rounds):
        for m in MODES if r % 2 == 0 else MODES[::-1]:
            out = subprocess.run(
                [sys.executable, __file__, "--child", m, "--batch", str(a.batch),
                 "--tokens", str(a.tokens), "--vocab", str(a.vocab)],
                capture_output=True, text=True, check=True,
                env={**os.environ, "OMP_NUM_THREADS": "1"},
            ).stdout  # fmt: skip
            res[m].append(json.loads(out.strip().splitlines()[-1]))
    print(
        f"{a.batch} rows x {a.tokens} tokens, vocab {a.vocab}, {a.rounds} rounds (fresh process each)"
    )
    for m in MODES:
        v = [x["peak_above_mb"] for x in res[m]]
        print(
            f"  {m}: peak above start min {min(v):8.1f} MB  median {statistics.median(v):8.1f} MB  max {max(v):8.1f} MB"
        )
    same = all(abs(o["checksum"] - n["checksum"]) < 1e-3 * max(1.0, abs(o["checksum"]))
               for o, n in zip(res["old"], res["new"], strict=True))  # fmt: skip
    ratio = statistics.median(x["peak_above_mb"] for x in res["old"]) / max(
        1e-9, statistics.median(x["peak_above_mb"] for x in res["new"])
    )
    print(f"old / new peak: {ratio:.1f}x; log-probs agree: {same}")


if __name__ == "__main__":
    main()
