from cosyvoice_operator.cli import main

raise SystemExit(main())
