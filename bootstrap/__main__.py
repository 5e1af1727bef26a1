from bootstrap.cli import main

raise SystemExit(main())
