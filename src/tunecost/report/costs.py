"""Table IV as one chart: the cheapest provider per GPU for each model, routing and estimator, one bar each with
its dollar figure on it, cheapest first within a group."""

from __future__ import annotations

from tunecost.report.base import FigureResult, _need, _plt, routing_label
from tunecost.report.run_dir import RunRecords

COLUMNS = (
    "model",
    "experts_per_token",
    "estimator",
    "gpu",
    "provider",
    "price_date",
    "usd_per_hour",
    "max_batch_size",
    "queries_per_s",
    "hours",
    "usd",
)


def cost_chart(records: RunRecords) -> FigureResult | str:
    df = _need(records, "estimate", (*COLUMNS, "num_queries", "epochs", "dataset"))
    if isinstance(df, str):
        return df
    df = df[df["usd"].notna()]
    if df.empty:
        return "no estimate has both a throughput and a price"
    best = df.sort_values("usd").groupby(["model", "experts_per_token", "estimator", "gpu"], as_index=False).first()
    table = best[list(COLUMNS)].copy().sort_values(["model", "experts_per_token", "estimator", "usd"])
    for col, nd in (("queries_per_s", 3), ("hours", 1), ("usd", 2)):
        table[col] = table[col].astype(float).round(nd)
    groups = list(table.groupby(["model", "experts_per_token", "estimator"], sort=False))
    plt = _plt()
    fig, ax = plt.subplots(figsize=(9.0, 0.32 * len(table) + 0.5 * len(groups) + 1.2))
    labels: list[str] = []
    positions: list[float] = []
    y = 0.0
    for i, ((model, _k, estimator), sel) in enumerate(groups):
        color = f"C{i % 10}"
        name = f"{model} {routing_label(sel.iloc[0])}, {estimator}"
        for _, row in sel.iterrows():
            ax.barh(y, row["usd"], color=color)
            ax.text(row["usd"], y, f"  ${row['usd']:,.2f}", va="center", fontsize=8)
            labels.append(f"{row['gpu']} ({row['provider']})")
            positions.append(y)
            y += 1.0
        ax.text(0, y - len(sel) - 0.55, name, fontsize=9, fontweight="bold")
        y += 0.8
    ax.set_yticks(positions, labels, fontsize=8)
    ax.invert_yaxis()
    ax.set_xlabel("cost of the fine-tune (USD), cheapest provider per GPU")
    ax.set_xlim(0, float(table["usd"].max()) * 1.25)
    fig.tight_layout()
    q = df.iloc[0]
    caption = (
        f"Cheapest provider per GPU for {int(q['num_queries'])} queries x {q['epochs']:g} epochs of "
        f"{q['dataset'] if isinstance(q['dataset'], str) else 'fixed-length queries'}; groups are model, routing "
        "and estimator (bold); price dates in the table."
    )
    return FigureResult(fig, caption, table)
