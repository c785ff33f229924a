"""Per-setting numbers from what every peer measured: means over peers, medians over the
interleaved repetitions, efficiencies and speedups."""

from __future__ import annotations

from typing import Any, Dict, List, Optional

from experiments.pages._bench import median as _median

from .measure import BenchConfig


def _block_means(block: Dict[str, Any], side: Optional[str] = None) -> Dict[str, float]:
    steps = [s for s in block["steps"] if side is None or s["side"] == side]
    n = max(1, len(steps))
    total = sum(s["total"] for s in steps) / n
    comm = sum(s["comm"] for s in steps) / n
    return {"total": total, "comm": comm, "compute": total - comm}


def _mean(means: List[Dict[str, float]]) -> Dict[str, float]:
    """Block means averaged over the peers."""
    return {k: sum(m[k] for m in means) / len(means) for k in ("total", "comm", "compute")}


def _ratios(a: List[Dict[str, float]], b: List[Dict[str, float]]) -> Dict[str, float]:
    """Compute and step-time ratios a / b, medians over adjacent (a, b) block pairs."""
    return {k: _median([x[k] / y[k] for x, y in zip(a, b)]) for k in ("compute", "total")}


def summarize_setting(
    cfg: BenchConfig, peers: List[Dict[str, Any]], isolated: Optional[Dict[str, Any]]
) -> Dict[str, Any]:
    """Per-setting numbers: means over peers, medians over the interleaved repetitions."""
    n = len(peers)
    first = peers[0]
    s: Dict[str, Any] = dict(model=cfg.model, topology=cfg.topology, backend=cfg.backend, peers=n)
    s.update(degree=first["degree"], params=first["param_bytes"] // 4)
    s.update({k: first[k] for k in ("compressed_fraction", "compressed_bytes", "gamma")})
    s.update(block_steps=cfg.block, reps=cfg.reps, bytes_only=cfg.bytes_only)
    s.update(exact_steps=cfg.exact_steps, exact_warmup=first["exact_warmup"])

    def bytes_of(blocks_per_peer, side=None):
        per_peer = []
        for blocks in blocks_per_peer:
            steps = [st for b in blocks for st in b["steps"] if side is None or st["side"] == side]
            per_peer.append(sum(st["bytes"] for st in steps) / max(1, len(steps)))
        return sum(per_peer) / n

    def matches(blocks_per_peer):
        return all(
            st["bytes"] == st["expected"]
            for blocks in blocks_per_peer
            for b in blocks
            for st in b["steps"]
        )

    exact_blocks = [[p["exact"]] for p in peers]
    s["exact"] = {"bytes": bytes_of(exact_blocks), "bytes_match": matches(exact_blocks)}
    if not cfg.bytes_only:
        s["exact"].update(_mean([_block_means(p["exact"]) for p in peers]))
    bw = [_median(p["bandwidth_concurrent"]) for p in peers if p["bandwidth_concurrent"]]
    s["bandwidth_concurrent"] = sum(bw) / len(bw) if bw else None
    s["variants"] = {}
    for name in peers[0]["variants"]:
        blocks = [p["variants"][name] for p in peers]
        v: Dict[str, Any] = {
            "bytes": bytes_of(blocks),
            "bytes_right": bytes_of(blocks, "right"),
            "bytes_left": bytes_of(blocks, "left"),
            "bytes_match": matches(blocks),
        }
        v["bytes_ratio"] = s["exact"]["bytes"] / v["bytes"]
        if not cfg.bytes_only:
            reps = [_mean([_block_means(b[r]) for b in blocks]) for r in range(len(blocks[0]))]
            v["reps"] = reps
            for k in ("total", "comm", "compute"):
                v[k] = _median([r[k] for r in reps])
            # K = 1 half-step per step, so compute per step is compute per half-step.
            if s["bandwidth_concurrent"]:
                v["efficiency_in_situ"] = (
                    3 * s["compressed_bytes"] / (v["compute"] * s["bandwidth_concurrent"] * 1e9)
                )
        s["variants"][name] = v
    if "naive" in s["variants"]:
        s["speedup"] = _ratios(s["variants"]["naive"]["reps"], s["variants"]["batched"]["reps"])
    if "before" in s["variants"]:
        s["before"] = summarize_before(cfg, peers, s["variants"])
    if isolated is not None:
        s["isolated"] = summarize_isolated(isolated)
    return s


def summarize_before(
    cfg: BenchConfig, peers: List[Dict[str, Any]], variants: Dict[str, Any]
) -> Dict[str, Any]:
    """`cfg.before`'s PowerGossip against this tree's (both batched, interleaved blocks): time
    ratios new / old, medians over adjacent block pairs; whether every peer sent the same bytes
    at every step; whether every peer's final parameters are bit-identical."""
    new, old = variants["batched"]["reps"], variants["before"]["reps"]

    def sent(p, name):
        return [st["bytes"] for b in p["variants"][name] for st in b["steps"]]

    return {
        "commit": cfg.before,
        "modules": peers[0]["before"]["modules"],
        "ratio": _ratios(new, old),
        "bytes_equal": all(sent(p, "batched") == sent(p, "before") for p in peers),
        "identical": all(p["before"]["identical"] for p in peers),
        "max_difference": max(p["before"]["max_difference"] for p in peers),
    }


def summarize_isolated(iso: Dict[str, Any]) -> Dict[str, Any]:
    """The isolated peer's compute times and efficiencies per side, medians over the rounds."""
    out: Dict[str, Any] = {
        "degree": iso["degree"],
        "threads": iso["threads"],
        "bandwidth": _median(iso["bandwidth"]),
        "variants": {},
    }
    c = iso["compressed_bytes"]
    for name, blocks in iso["variants"].items():
        v: Dict[str, Any] = {}
        for side in (None, "right", "left"):
            key = side or "all"
            times = [_block_means(b, side)["compute"] for b in blocks]
            effs = [3 * c / (t * bw * 1e9) for t, bw in zip(times, iso["bandwidth"])]
            v[key] = {"compute": _median(times), "efficiency": _median(effs)}
        out["variants"][name] = v

    def paired(a, b):  # compute a / compute b, median over the rounds (adjacent blocks)
        return _median(
            [_block_means(x)["compute"] / _block_means(y)["compute"] for x, y in zip(a, b)]
        )

    blocks = iso["variants"]
    if {"before", "batched"} <= set(blocks):  # this tree's / the earlier commit's
        out["before_ratio"] = paired(blocks["batched"], blocks["before"])
    if "naive" in blocks:
        out["speedup"] = paired(blocks["naive"], blocks["batched"])
    return out
