from queen.cli import main

raise SystemExit(main())
