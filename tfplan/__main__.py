import sys

from tfplan.cli import main

sys.exit(main())
