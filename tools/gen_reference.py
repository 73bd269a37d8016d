"""Writes docs/reference/{crd,cli,metrics}.md from the CRD, the CLI, the metrics, the chart's
alerts and the operator's Events (cosyvoice_operator.cli.reference_docs); --check only says
which are stale.

    .venv/bin/python tools/gen_reference.py [--check]
"""

import sys

from cosyvoice_operator.cli.reference_docs import main

if __name__ == "__main__":
    sys.exit(main())
