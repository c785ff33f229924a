"""The network-DP section of privacy_attacks.md: the exact pairwise ε of noisy exact gossip per
topology and case (`privacy.network_report`) beside the local-DP ceiling; a table and heat maps."""

from __future__ import annotations

from typing import Any, Dict, Mapping

from experiments.pages._markdown import fill, table_rows, template

HEATMAP_PNG = "privacy_attacks_network_dp.png"
NOISE_TEXT = {"once": "once", "every_step": "every step"}


def network_dp(c: Mapping[str, Any]) -> Dict[str, Any]:
    """Exact pairwise ε[u, v] of noisy exact gossip per case and topology of `c`."""
    from gossip_powersgd.privacy.network_report import pairwise_report

    sigma, delta = c["sigma"], c["delta"]
    cases = [
        pairwise_report(spec, steps, sigma, delta, noise)
        for noise, steps in c["cases"]
        for spec in c["topologies"]
    ]
    return {"sigma": sigma, "delta": delta, "cases": cases}


def network_text(network: Dict[str, Any]) -> str:
    """The section (its fixed text: network.md beside this file): the table and the heat maps."""
    lines = []
    for c in network["cases"]:
        summed = "n/a"
        if "per_message_min" in c:
            summed = f"{c['per_message_min']:.3g} – {c['per_message_max']:.3g}; "
            summed += f"{100 * c['per_message_below_exact']:.0f} %; "
            summed += f"{100 * c['per_message_above_local']:.0f} %"
        cells = [NOISE_TEXT[c["noise"]], c["steps"], c["topology"]]
        cells += [format(c[k], ".3g") for k in ("min", "median", "max")]
        lines.append(cells + [f"{100 * c['at_local']:.0f} %", format(c["local"], ".3g"), summed])
    made = f"{network['generated']} " if network.get("generated") else ""
    fields = dict(made=made, sigma=network["sigma"], delta=network["delta"], heatmap=HEATMAP_PNG)
    table = table_rows([[str(x) for x in cells] for cells in lines])
    return fill(template(__file__, "network.md"), **fields, table=table)


def plot_network(network: Dict[str, Any]) -> bytes:
    """ε[u, v] heat maps on one log scale, a row per case; white: u's noise never reaches v."""
    import numpy as np
    from matplotlib.colors import LogNorm

    from experiments.pages._figures import png, pyplot

    plt = pyplot()
    cases = network["cases"]
    specs = list(dict.fromkeys(c["topology"] for c in cases))
    rows = list(dict.fromkeys((c["noise"], c["steps"]) for c in cases))
    mats = [np.array(c["matrix"]) for c in cases]
    finite = np.concatenate([m[np.isfinite(m) & (m > 0)] for m in mats])
    norm = LogNorm(vmin=finite.min(), vmax=finite.max())
    size = (4.2 * len(specs), 3.8 * len(rows))
    fig, axes = plt.subplots(len(rows), len(specs), figsize=size, squeeze=False)
    for c, m in zip(cases, mats):
        ax = axes[rows.index((c["noise"], c["steps"])), specs.index(c["topology"])]
        image = ax.imshow(np.where(m > 0, m, np.nan), norm=norm, cmap="viridis")
        title = f"{c['topology']}, noise {NOISE_TEXT[c['noise']]}, T = {c['steps']}"
        ax.set_title(title, fontsize=9)
        ax.set_xlabel("observer v")
        if specs.index(c["topology"]) == 0:
            ax.set_ylabel("peer u")
    fig.colorbar(image, ax=axes.ravel().tolist(), label="ε of u towards v")
    return png(fig, dpi=100)
