"""What-if: the same workload under other engine settings, side by side.

`simulate --what-if num-blocks=64 --what-if policy=sglang --what-if block-size=16,prefix-caching=off`
runs the workload once per setting (each a fresh copy of the requests: a run changes them) and
reports, per run, the prefix-cache hit rate, the blocks in use over time (peak and mean share
of the pool) and the preemptions.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from ..errors import UsageError

KEYS = ("num-blocks", "block-size", "policy", "prefix-caching", "max-num-batched-tokens", "max-num-seqs")


@dataclass(slots=True)
class Setting:
    num_blocks: int
    block_size: int
    policy: str
    prefix_caching: bool
    max_num_batched_tokens: int
    max_num_seqs: int

    def label(self, base: Setting | None = None) -> str:
        if base is None:
            return "as given"
        parts = []
        for key in KEYS:
            attr = key.replace("-", "_")
            mine, theirs = getattr(self, attr), getattr(base, attr)
            if mine != theirs:
                parts.append(f"{key}={'on' if mine is True else 'off' if mine is False else mine}")
        return ",".join(parts) or "as given"


def parse_what_if(text: str, base: Setting, policies) -> Setting:
    out = base
    for part in text.split(","):
        key, sep, value = part.strip().partition("=")
        if not sep or key not in KEYS:
            raise UsageError("--what-if", text, f"give key=value pairs separated by commas, keys: {', '.join(KEYS)}")
        if key == "policy":
            if value not in policies:
                raise UsageError("--what-if", text, f"policy must be one of: {', '.join(policies)}")
            out = replace(out, policy=value)
        elif key == "prefix-caching":
            if value not in ("on", "off"):
                raise UsageError("--what-if", text, "prefix-caching is on or off")
            out = replace(out, prefix_caching=value == "on")
        else:
            if not value.isascii() or not value.isdigit() or int(value) < (2 if key == "num-blocks" else 1):
                raise UsageError("--what-if", text, f"{key} must be a positive integer" + (" of at least 2" if key == "num-blocks" else ""))
            out = replace(out, **{key.replace("-", "_"): int(value)})
    return out


@dataclass(slots=True)
class Outcome:
    label: str
    setting: Setting
    hit_rate: float
    hit_tokens: int
    prompt_tokens: int
    peak_used: int
    mean_used_share: float
    preemptions: int
    steps: int
    evictions: int
    used_over_time: list[int]  # blocks in use after each step

    def to_json(self) -> dict:
        s = self.setting
        return {"label": self.label, "num_blocks": s.num_blocks, "block_size": s.block_size, "policy": s.policy,
                "prefix_caching": s.prefix_caching, "max_num_batched_tokens": s.max_num_batched_tokens, "max_num_seqs": s.max_num_seqs,
                "hit_rate": self.hit_rate, "hit_tokens": self.hit_tokens, "prompt_tokens": self.prompt_tokens,
                "peak_used_blocks": self.peak_used, "mean_used_share": self.mean_used_share, "preemptions": self.preemptions,
                "steps": self.steps, "evictions": self.evictions}


def outcome(label: str, setting: Setting, result) -> Outcome:
    used = [s.used_blocks for s in result.steps]
    usable = setting.num_blocks - 1
    hits = result.causes.get("hit", 0)
    prompt = sum(len(r.prompt) for r in result.requests)
    return Outcome(label, setting, hits / prompt if prompt else 0.0, hits, prompt, max(used, default=0),
                   (sum(used) / len(used) / usable) if used else 0.0, result.num_preemptions, len(result.steps),
                   result.policy.pool.evictions, used)
