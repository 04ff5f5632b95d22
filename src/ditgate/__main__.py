import sys

from ditgate.cli import main

sys.exit(main())
