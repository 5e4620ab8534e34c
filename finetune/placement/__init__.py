"""Loading, placing and generating: every model the product loads for a run, on the run's device and precision.

    placement = of_plan(plan)                       # the plan's device and precision (Auto's, with its reason)
    model = load_placed(name, placement)            # loaded in that precision, on that device
    ids = generate_ids(model, tokenizer, prompts)   # the one decoder (replay, eval, retention, the demo, serving)

Training (train/model.py), self-replay, the forgetting curve, the adapter scale, the retention check, `finetune eval`,
the demo, serving and the DPO reference all load through here; the folder sits below ship/ and train/.
"""
