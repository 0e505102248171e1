"""The stock-crash atlas (docs/stock-crashes.md) as a library; ``lab/stock_atlas.py`` is its command line.
A development tool beside the package, not in the wheel: no command of the plugin uses it.

:mod:`.releases` the vLLM releases this repository knows, :mod:`.overlay` an older release's files
overlaid on this environment and :mod:`.probe` the plugin's verdict there (all three shared with
``lab/compat_matrix.py``),
:mod:`.space` the searched configurations, :mod:`.condition` the crash family's arithmetic,
:mod:`.replay` one configuration's replay and classification, :mod:`.search` the search inside one
release, :mod:`.driver` one worker process per release, :mod:`.summary` the recorded JSON,
:mod:`.tables` and :mod:`.ranges` the printed tables.
"""
