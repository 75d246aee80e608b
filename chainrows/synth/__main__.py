"""``python -m chainrows.synth OUT --rollouts N``: write a synthetic dataset."""

from chainrows.synth.writer import main

raise SystemExit(main())
