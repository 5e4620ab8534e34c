"""OUT/eval.html: eval.json as one page a person reads: numbers per model, best and worst answers, every answer."""

from __future__ import annotations

from html import escape

from finetune.ship.eval.grounding import MEASURES as GROUNDING
from finetune.ship.eval.grounding import REFERENCE, cell, line
from finetune.ship.eval.retention import LABELS, points

STYLE = """
body { font-family: system-ui, sans-serif; margin: 2rem auto; max-width: 1200px; color: #222; }
table { border-collapse: collapse; margin: 1rem 0; width: 100%; }
th, td { border: 1px solid #ccc; padding: .4rem .6rem; vertical-align: top; text-align: left; }
th { background: #f3f3f3; }
td.num { text-align: right; font-variant-numeric: tabular-nums; white-space: nowrap; }
td.text { white-space: pre-wrap; }
.note { color: #555; }
.flag { color: #a61e1e; font-weight: bold; }
"""


def _num(value: float) -> str:
    return f"{value:.3f}"


def _summary(result: dict) -> str:
    summary = result["summary"]
    metrics = list(next(iter(summary.values()), {}))
    head = "".join(f"<th>{escape(m)}</th>" for m in metrics)
    wins = result.get("win_rate") or {}
    head += "<th>rule win rate vs base (wins/ties/losses)</th>" if wins else ""
    losses = result.get("val_loss") or {}
    head += "<th>validation loss at that step</th>" if losses else ""
    rows = []
    for name, numbers in summary.items():
        cells = "".join(f'<td class="num">{_num(numbers[m])}</td>' for m in metrics)
        if wins:
            w = wins.get(name)
            text = f"{w['win_rate']:.0%} ({w['wins']}/{w['ties']}/{w['losses']})" if w else ""
            cells += f'<td class="num">{text}</td>'
        if losses:
            cells += f'<td class="num">{f"{losses[name]:.4f}" if name in losses else ""}</td>'
        source = escape(result["models"].get(name, ""))
        rows.append(f'<tr><th title="{source}">{escape(name)}</th>{cells}</tr>')
    return f"<table><tr><th>model</th>{head}</tr>{''.join(rows)}</table>"


def _examples(title: str, examples: list[dict]) -> str:
    if not examples:
        return ""
    rows = "".join(
        f'<tr><td class="num">{ex["line"]}</td><td class="num">{_num(ex["token_f1"])}</td>'
        f'<td class="text">{escape(ex["prompt"])}</td><td class="text">{escape(ex["reference"])}</td>'
        f'<td class="text">{escape(ex["answer"])}</td><td class="text">{escape(ex["base"])}</td></tr>'
        for ex in examples
    )
    head = "<tr><th>line</th><th>F1</th><th>prompt</th><th>reference</th><th>answer</th><th>base</th></tr>"
    return f"<h2>{escape(title)}</h2><table>{head}{rows}</table>"


def _all_rows(result: dict) -> str:
    models = list(result["summary"])
    head = "<tr><th>line</th><th>prompt</th><th>reference</th>" + "".join(f"<th>{escape(m)} (F1)</th>" for m in models)
    rows = []
    for row in result["rows"]:
        cells = "".join(
            f'<td class="text">{escape(row[m])}<br><span class="note">F1 {_num(row["scores"][m]["token_f1"])}</span></td>'
            for m in models
        )
        rows.append(
            f'<tr><td class="num">{row["line"]}</td><td class="text">{escape(row["prompt"])}</td>'
            f'<td class="text">{escape(row["reference"])}</td>{cells}</tr>'
        )
    return f"<h2>Every answer</h2><table>{head}</tr>{''.join(rows)}</table>"


def _retention(retention: dict | None) -> str:
    """The retention check of the same call (finetune eval RUN --retention): numbers, verdict, remedies."""
    if not retention:
        return ""

    def rate(side: dict) -> str:
        return f"{side['rate']:.0%} ({side['low']:.0%}&ndash;{side['high']:.0%})"

    rows = []
    for key, name in LABELS.items():
        numbers = retention.get(key) or {"n": 0}
        if not numbers["n"]:
            continue
        change = numbers["change"]
        text = f"{points(change['value'])} ({points(change['low'])} to {points(change['high'])})"
        rows.append(
            f"<tr><th>{escape(name)}</th><td class='num'>{numbers['n']}</td><td class='num'>{rate(numbers['base'])}</td>"
            f"<td class='num'>{rate(numbers['tuned'])}</td><td class='num'>{text}"
            f"{' <strong>drop</strong>' if numbers.get('dropped') else ''}"
            f"{' <strong>rise</strong>' if numbers.get('rose') else ''}</td></tr>"
        )
    head = "<tr><th></th><th>prompts</th><th>base</th><th>tuned</th><th>change, points (95% interval)</th></tr>"
    remedies = "".join(f"<li>{escape(r)}</li>" for r in retention.get("remedies") or [])
    verdict = f"<p class='{'flag' if retention['flag'] else 'note'}'>{escape(retention['message'])}</p>"
    return (
        "<h2>Retention: the base and the tuned model on the general set</h2>"
        f"<table>{head}{''.join(rows)}</table>"
        f"<p>Mean KL(tuned || base) per token on the base's own answers: "
        f"{retention['kl']['mean_per_token']:.4g} nats ({retention['kl']['tokens']} tokens).</p>"
        + verdict
        + (f"<p>Usual remedies:</p><ul>{remedies}</ul>" if remedies else "")
    )


def _grounding(section: dict | None) -> str:
    """Invented specifics, recited training replies and distinct answers, per model and the team's replies."""
    if not section:
        return ""
    names = {name: "team's replies" if name == REFERENCE else name for name in section["models"]}
    head = "<tr><th></th>" + "".join(f"<th>{escape(n)}</th>" for n in names.values()) + "</tr>"
    rows = "".join(
        f"<tr><th>{escape(label)}</th>"
        + "".join(f"<td class='num'>{escape(cell(key, m[key]))}</td>" for m in section["models"].values())
        + "</tr>"
        for key, label in GROUNDING.items()
    )
    remedies = "".join(f"<li>{escape(r)}</li>" for r in section.get("remedies") or [])
    return (
        f"<h2>Answers the team would sign ({section['answers']} prompts, 95% intervals)</h2><table>{head}{rows}</table>"
        f"<p class='{'flag' if section['flag'] else 'note'}'>{escape(line(section))}</p>"
        + (f"<p>Usual remedies:</p><ul>{remedies}</ul>" if remedies else "")
    )


def render_html(result: dict) -> str:
    rules = result.get("rules") or {}
    rule_list = "".join(f"<li><code>{escape(n)}</code>: <code>{escape(p)}</code></li>" for n, p in rules.items())
    return (
        "<!doctype html><html><head><meta charset='utf-8'><title>finetune eval</title>"
        f"<style>{STYLE}</style></head><body>"
        f"<h1>Evaluation: {result['examples']} held-out conversations</h1>"
        f"<p class='note'>Test file {escape(result['test_file'])}. Greedy answers. Token F1 and ROUGE-L reward the "
        "team's wording, not correctness: read the answers.</p>"
        + (f"<p>Rules (rates are the share of answers that match):</p><ul>{rule_list}</ul>" if rules else "")
        + _summary(result)
        + _grounding(result.get("grounding"))
        + _retention(result.get("retention"))
        + _examples(f"Best by {result['ranked_by']}", result["best"])
        + _examples(f"Worst by {result['ranked_by']}", result["worst"])
        + _all_rows(result)
        + "</body></html>"
    )
