"""Programs the tests run as fresh Python processes (``python -m children.NAME`` with ``tests/`` on the
path; tests/childproc.py starts them): linted and type-checked like the rest of the repository."""
