from vllm_staging_plugin._offline.cli import main

raise SystemExit(main())
