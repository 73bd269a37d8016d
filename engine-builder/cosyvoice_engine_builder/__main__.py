import sys

from cosyvoice_engine_builder.cli import main

sys.exit(main())
