"""Per-setting numbers from what every peer measured: means over peers, medians over the
interleaved repetitions, efficiencies and speedups."""

from __future__ import annotations

from typing import Any, Dict, List, Optional

from experiments.pages._bench import median

from .measure import BenchConfig

TIMES = ("total", "comm", "compute")


def _block_means(block: Dict[str, Any], side: Optional[str] = None) -> Dict[str, float]:
    steps = [s for s in block["steps"] if side is None or s["side"] == side]
    n = max(1, len(steps))
    total, comm = sum(s["total"] for s in steps) / n, sum(s["comm"] for s in steps) / n
    return {"total": total, "comm": comm, "compute": total - comm}


def _mean(means: List[Dict[str, float]]) -> Dict[str, float]:
    """Block means averaged over the peers."""
    return {k: sum(m[k] for m in means) / len(means) for k in TIMES}


def _ratios(a: List[Dict[str, float]], b: List[Dict[str, float]]) -> Dict[str, float]:
    """Compute and step-time ratios a / b, medians over adjacent (a, b) block pairs."""
    return {k: median([x[k] / y[k] for x, y in zip(a, b)]) for k in ("compute", "total")}


def _steps(blocks_per_peer, side=None):
    """Each peer's steps (of one side), over its blocks."""
    return [
        [st for b in blocks for st in b["steps"] if side is None or st["side"] == side]
        for blocks in blocks_per_peer
    ]


def _sent(blocks_per_peer, side=None) -> float:
    """Bytes per step, mean over steps and peers."""
    per_peer = _steps(blocks_per_peer, side)
    return sum(sum(st["bytes"] for st in p) / max(1, len(p)) for p in per_peer) / len(per_peer)


def _match(blocks_per_peer) -> bool:
    return all(st["bytes"] == st["expected"] for p in _steps(blocks_per_peer) for st in p)


def summarize_setting(
    cfg: BenchConfig, peers: List[Dict[str, Any]], isolated: Optional[Dict[str, Any]]
) -> Dict[str, Any]:
    """Per-setting numbers: means over peers, medians over the interleaved repetitions."""
    first = peers[0]
    s: Dict[str, Any] = dict(model=cfg.model, topology=cfg.topology, backend=cfg.backend)
    s.update(peers=len(peers), degree=first["degree"], params=first["param_bytes"] // 4)
    s.update({k: first[k] for k in ("compressed_fraction", "compressed_bytes", "gamma")})
    s.update(block_steps=cfg.block, reps=cfg.reps, bytes_only=cfg.bytes_only)
    s.update(exact_steps=cfg.exact_steps, exact_warmup=first["exact_warmup"])
    exact_blocks = [[p["exact"]] for p in peers]
    s["exact"] = {"bytes": _sent(exact_blocks), "bytes_match": _match(exact_blocks)}
    if not cfg.bytes_only:
        s["exact"].update(_mean([_block_means(p["exact"]) for p in peers]))
    bw = [median(p["bandwidth_concurrent"]) for p in peers if p["bandwidth_concurrent"]]
    s["bandwidth_concurrent"] = sum(bw) / len(bw) if bw else None
    s["variants"] = {}
    for name in first["variants"]:
        blocks = [p["variants"][name] for p in peers]
        v: Dict[str, Any] = {"bytes": _sent(blocks)}
        v.update(bytes_right=_sent(blocks, "right"), bytes_left=_sent(blocks, "left"))
        v.update(bytes_match=_match(blocks), bytes_ratio=s["exact"]["bytes"] / v["bytes"])
        if not cfg.bytes_only:
            reps = [_mean([_block_means(b[r]) for b in blocks]) for r in range(len(blocks[0]))]
            v["reps"] = reps
            v.update({k: median([r[k] for r in reps]) for k in TIMES})
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

    def sent(p, name):
        return [st["bytes"] for b in p["variants"][name] for st in b["steps"]]

    return {
        "commit": cfg.before,
        "modules": peers[0]["before"]["modules"],
        "ratio": _ratios(variants["batched"]["reps"], variants["before"]["reps"]),
        "bytes_equal": all(sent(p, "batched") == sent(p, "before") for p in peers),
        "identical": all(p["before"]["identical"] for p in peers),
        "max_difference": max(p["before"]["max_difference"] for p in peers),
    }


def summarize_isolated(iso: Dict[str, Any]) -> Dict[str, Any]:
    """The isolated peer's compute times and efficiencies per side, medians over the rounds."""
    out: Dict[str, Any] = {k: iso[k] for k in ("degree", "threads")}
    out.update(bandwidth=median(iso["bandwidth"]), variants={})
    for name, blocks in iso["variants"].items():
        out["variants"][name] = v = {}
        for side in (None, "right", "left"):
            times = [_block_means(b, side)["compute"] for b in blocks]
            effs = [
                3 * iso["compressed_bytes"] / (t * bw * 1e9)
                for t, bw in zip(times, iso["bandwidth"])
            ]
            v[side or "all"] = {"compute": median(times), "efficiency": median(effs)}

    def paired(a, b):  # compute a / compute b, median over the rounds (adjacent blocks)
        return median(
            [_block_means(x)["compute"] / _block_means(y)["compute"] for x, y in zip(a, b)]
        )

    blocks = iso["variants"]
    if {"before", "batched"} <= set(blocks):  # this tree's / the earlier commit's
        out["before_ratio"] = paired(blocks["batched"], blocks["before"])
    if "naive" in blocks:
        out["speedup"] = paired(blocks["naive"], blocks["batched"])
    return out
