"""The simulation's settings: the flags given, else the recording server's, else pagetrace's defaults.

A trace recorded inside `vllm serve` names its scheduler's settings in its header (`server`,
trace.py), and a KV events file recorded there carries the same (events.py `SETTINGS_TOPIC`):
`simulate --trace T --events E` takes them as its defaults, so a recording reproduces its
server with no flag. A flag that contradicts them is used, and named (`Resolved.overridden`).
"""

from __future__ import annotations

from dataclasses import dataclass, field

# pagetrace's own defaults, where no server said otherwise (max_model_len: computed from the workload)
DEFAULTS = {"num_blocks": 1024, "block_size": 16, "max_num_batched_tokens": 4096, "max_num_seqs": 256, "max_model_len": None,
            "chunked_prefill": True, "prefix_caching": True}
OPTIONS = {"num_blocks": "--num-blocks", "block_size": "--block-size", "max_num_batched_tokens": "--max-num-batched-tokens",
           "max_num_seqs": "--max-num-seqs", "max_model_len": "--max-model-len", "chunked_prefill": "--chunked-prefill",
           "prefix_caching": "--prefix-caching"}


@dataclass(slots=True)
class Resolved:
    values: dict
    taken: dict[str, str] = field(default_factory=dict)  # setting -> the source it came from
    overridden: dict[str, dict] = field(default_factory=dict)  # setting -> {"given", "server", "source"}

    def line(self) -> str | None:
        """The one stderr line naming the flags that contradict the recording, or None."""
        if not self.overridden:
            return None
        parts = [f"{flag(k, o['given'])} (the server's: {show(o['server'])}, {o['source']})" for k, o in self.overridden.items()]
        return "note: simulating with " + "; ".join(parts) + ", as given"


def show(value) -> str:
    return ("on" if value else "off") if isinstance(value, bool) else f"{value:,}" if isinstance(value, int) else str(value)


def flag(key: str, value) -> str:
    if isinstance(value, bool):
        return OPTIONS[key] if value else OPTIONS[key].replace("--", "--no-", 1)
    return f"{OPTIONS[key]} {value}"


def resolve(given: dict, sources: list[tuple[str, dict]], defaults: dict | None = None) -> Resolved:
    """`given`: setting -> the flag's value or None (not given); `sources`: (name, settings) in
    order of trust (the trace's header, then the events file); `defaults`: over DEFAULTS."""
    base = {**DEFAULTS, **(defaults or {})}
    out = Resolved({})
    for key in DEFAULTS:
        server, source = None, None
        for name, settings in sources:
            if settings.get(key) is not None:
                server, source = settings[key], name
                break
        value = given.get(key)
        if value is not None:
            out.values[key] = value
            if server is not None and server != value:
                out.overridden[key] = {"given": value, "server": server, "source": source}
        elif server is not None:
            out.values[key] = server
            out.taken[key] = source
        else:
            out.values[key] = base[key]
    return out


__all__ = ["DEFAULTS", "OPTIONS", "Resolved", "resolve"]


def header_settings(text: str) -> dict | None:
    """The server settings a pagetrace trace's header records (its block size among them), or
    None when the text's first line is no header: what `simulate` and `fleet` take as defaults."""
    import json

    from .trace import header_from_json

    first = next((line for line in text.splitlines() if line.strip()), "")
    try:
        obj = json.loads(first)
    except ValueError:
        return None
    if not (isinstance(obj, dict) and "format" in obj):
        return None
    header = header_from_json(obj)
    return {**header.server, "block_size": header.server.get("block_size", header.block_size)}
