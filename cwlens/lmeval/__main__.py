import sys

from cwlens.lmeval.cli import main

sys.exit(main())
