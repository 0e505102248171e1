from vllm_staging_plugin.cli import main

raise SystemExit(main())
