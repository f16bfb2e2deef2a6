import sys

from flashcheck.cli.main import main

sys.exit(main())
