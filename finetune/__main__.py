"""python -m finetune ... (the form torchrun uses: torchrun -m finetune train ...)"""

from finetune.cli import main

raise SystemExit(main())
