"""`python -m demo` (`make demo`)."""

import sys

from demo.main import main

sys.exit(main())
