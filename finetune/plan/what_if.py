"""A what-if plan's data: `finetune plan --examples N [--tokens T]`, before there is a file. No torch."""

from __future__ import annotations

from finetune.data.split import auto_val_fraction
from finetune.data.types import DataSummary
from finetune.settings.config import AUTO, RunConfig
from finetune.settings.errors import UserError
from finetune.settings.wording import ref


def what_if_summary(config: RunConfig, examples: int, tokens: int | None) -> DataSummary:
    """A what-if plan: `examples` training records (after the validation split), `tokens` in them.

    The validation side is estimated from the validation share (or Auto's rule for the whole file), assuming
    one record per conversation unless the record policy is `each`.
    """
    if examples < 1:
        raise UserError(f"--examples must be at least 1, got {examples}")
    if tokens is not None and tokens < 0:
        raise UserError(f"--tokens must be 0 or more, got {tokens}")
    one_per_conversation = config.record_policy != "each"
    if config.val_file:
        val, fraction, reason = None, 0.0, f"your validation file {config.val_file} (not read in a what-if plan)"
    elif config.val_fraction == AUTO:
        fraction, _ = auto_val_fraction(examples)
        whole = round(examples / (1 - fraction)) if fraction else examples
        fraction, reason = auto_val_fraction(whole)
        val = round(fraction * whole)
        reason = f"{reason} (estimated for about {whole:,} conversations in the whole file)"
    else:
        fraction = float(config.val_fraction)
        val = round(examples * fraction / (1 - fraction))
        reason = (
            f"validation off ({ref('val_fraction', 0)})" if fraction == 0 else f"your {ref('val_fraction')} {fraction}"
        )
    return DataSummary(
        examples=examples,
        validation_examples=val,
        conversations=examples if one_per_conversation else None,
        validation_conversations=val if one_per_conversation else None,
        messages=None,
        tokens_in_file=tokens,
        counted_with_tokenizer=tokens is not None,
        val_fraction=fraction,
        val_fraction_reason=reason,
        what_if=True,
    )
