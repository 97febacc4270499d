import sys

from cwlens.cli.main import main

sys.exit(main())
