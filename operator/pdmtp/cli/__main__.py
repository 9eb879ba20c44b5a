"""`python -m pdmtp.cli`, as the tests and the images run the command without its script."""

import sys

from pdmtp.cli import main

sys.exit(main())
