import sys

from tfplan.cli.main import main

sys.exit(main())
