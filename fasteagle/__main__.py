from fasteagle.cli import main

raise SystemExit(main())
