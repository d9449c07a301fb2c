"""The tables benchmarks/sidebyside.py prints: each gateway beside direct, and kvgate's
hosted path beside its vLLM path."""

from __future__ import annotations

from benchmarks.load import P99_LIMIT_MS, Figures

SCENARIOS = (
    "json c=1",
    "json c=32",
    "stream c=1, whole",
    "stream c=1, first event",
    f"open loop, p99<{P99_LIMIT_MS:.0f}ms",
)


def ms(value: float) -> str:
    return "-" if value != value else f"{value:.2f}"


def table(results: dict[str, dict[str, Figures]]) -> str:
    direct, gateway, litellm = (results.get(n) for n in ("direct", "kvgate", "litellm"))
    head = f"{'scenario':<26}| {'direct p50':>10} {'p99':>7} {'req/s':>7} "
    head += f"| {'kvgate p50':>10} {'p99':>7} {'req/s':>7} {'+p50':>6} "
    head += f"| {'LiteLLM p50':>11} {'p99':>7} {'req/s':>7} {'+p50':>6} | kvgate vs LiteLLM"
    lines = [head, "-" * len(head)]
    for name in SCENARIOS:
        d = direct[name] if direct else None
        row = f"{name:<26}| "
        row += f"{ms(d.p50_ms):>10} {ms(d.p99_ms):>7} {d.rps:>7.0f} " if d else " " * 27
        for figures, width in ((gateway, 10), (litellm, 11)):
            f = figures[name] if figures else None
            if f is None:
                row += "| " + " " * (width + 24)
                continue
            added = ms(f.p50_ms - d.p50_ms) if d and name != SCENARIOS[4] else "-"
            row += f"| {ms(f.p50_ms):>{width}} {ms(f.p99_ms):>7} {f.rps:>7.0f} {added:>6} "
        if gateway and litellm:
            g, lt = gateway[name], litellm[name]
            faster = (
                f"p50 {lt.p50_ms / g.p50_ms:.1f}x lower, "
                if name != SCENARIOS[4] and g.ok and lt.ok
                else ""
            )
            rate = f"{g.rps / lt.rps:.1f}x" if lt.rps else "-"
            row += f"| {faster}req/s {rate}"
        lines.append(row.rstrip())
    for who, figures in results.items():
        for name, f in figures.items():
            said = ", ".join(filter(None, [f.note, f"{f.errors} errors" if f.errors else ""]))
            if said:
                lines.append(f"  {who}, {name}: {said}")
    return "\n".join(lines)


def hosted_table(results: dict[str, dict[str, Figures]]) -> str:
    """kvgate's hosted path beside its vLLM path, each with its p50 added to direct's."""
    direct, vllm, hosted = results["direct"], results["kvgate"], results["kvgate hosted"]
    head = f"{'scenario':<26}| {'vLLM path p50':>13} {'p99':>7} {'req/s':>7} {'+p50':>6} "
    head += f"| {'hosted p50':>10} {'p99':>7} {'req/s':>7} {'+p50':>6} | hosted - vLLM p50"
    lines = [head, "-" * len(head)]
    for name in SCENARIOS[:4]:
        d, v, h = direct[name], vllm[name], hosted[name]
        row = f"{name:<26}| {ms(v.p50_ms):>13} {ms(v.p99_ms):>7} {v.rps:>7.0f} "
        row += f"{ms(v.p50_ms - d.p50_ms):>6} "
        row += f"| {ms(h.p50_ms):>10} {ms(h.p99_ms):>7} {h.rps:>7.0f} "
        row += f"{ms(h.p50_ms - d.p50_ms):>6} | {ms(h.p50_ms - v.p50_ms)}"
        lines.append(row)
    return "\n".join(lines)
