import sys

from cosyvoice_engine_builder.serving.command import main

sys.exit(main())
