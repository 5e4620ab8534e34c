"""The one entry to the data path: a run's file becomes supervised records or preference pairs.

    prepared = prepare(config, tokenizer)    # PreparedData (supervised) or PreparedPairs (--method dpo)
    prepared.train, prepared.val, prepared.summary

The objective decides (config.objective); a file of pairs given to a supervised run is refused by name.
"""

from __future__ import annotations

import dataclasses

from finetune.data.pairs import PreparedPairs, prepare_pairs
from finetune.data.parallel import file_digest
from finetune.data.preference import is_preference_file
from finetune.data.prepare import PreparedData, prepare_data
from finetune.rules.model_facts import ModelFacts
from finetune.settings.config import RunConfig
from finetune.settings.errors import DataError, UserError
from finetune.settings.wording import ref


def prepare(
    config: RunConfig, tokenizer=None, workers: int | None = None, facts: ModelFacts | None = None
) -> PreparedData | PreparedPairs:
    """Read, validate, split and tokenize the run's data (from the token cache when it holds it). `facts`: the
    model's, when the caller read them (Auto's record length looks at them; read there otherwise).

    Raises DataError for data that cannot train (the message names the file); a setting that cannot work
    stays a plain UserError.
    """
    try:
        if config.objective == "dpo":
            prepared = prepare_pairs(config, tokenizer, facts)
        elif is_preference_file(config.data):
            raise DataError(
                f"{config.data} holds preference pairs (chosen/rejected): use it with {ref('method', 'dpo')}"
            )
        else:
            prepared = prepare_data(config, tokenizer, workers=workers, facts=facts)
    except DataError:
        raise
    except UserError as exc:
        raise DataError(exc.template) from None
    if prepared.summary.data_sha256 is None and tokenizer is not None:  # the pairs path reads small files whole
        digests = {"data_sha256": file_digest(config.data)}
        if config.val_file:
            digests["val_sha256"] = file_digest(config.val_file)
        prepared.summary = dataclasses.replace(prepared.summary, **digests)
    return prepared
