"""`python -m deployfuse` is the `deployfuse` command."""

import sys

from deployfuse.cli import main

sys.exit(main())
