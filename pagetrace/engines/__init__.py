"""Real engines in: capture bundles, the engines' cache layouts and metadata, and their checks.

One module per engine, each citing the engine's own convention:
    views       K/V cache layouts as data (shape, strides, offset), checked against tensors
    bundle      the capture bundle on disk (manifest.json + safetensors) and its loader
    vllm        vLLM V1: metadata and cache from a live engine: `Tap`, `Recorder`, `capture`
    vllm_plugin the `vllm.general_plugins` entry point: capture and the guard in `vllm serve`
    guard       check's index invariants of a step, vectorised (NumPy or torch), before the kernel reads them
    guard_metrics the guard's counts on vLLM's own Prometheus /metrics
    quarantine  a flagged step's offending entries made safe before the forward
    meta_ring   every step's index tensors and request ids, delta-encoded (PAGETRACE_PAGES=flagged)
    flashinfer  FlashInfer's CSR page table (kv_indptr, kv_indices, kv_last_page_len)
    sglang      SGLang's req_to_token map and per-layer k_buffer / v_buffer
    export      any engine's block tables and cache written as a bundle
    check       the invariants of a step's paged metadata
    replay      a captured step through pagetrace's kernel
    address     one token's element and byte in the engine's cache (`lookup --from`)
"""
