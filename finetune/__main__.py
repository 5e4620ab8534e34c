"""python -m finetune ... (the form torchrun uses: torchrun -m finetune train ...)"""

from finetune.commands.cli import main

raise SystemExit(main())
