"""``python -m gpu_impl.cuda``: see ``gpu_impl.cuda.cli``."""

import sys

from gpu_impl.cuda.cli import main

sys.exit(main())
