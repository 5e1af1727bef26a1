"""fake_uv: a fast, file-level simulator of the parts of uv that kernel-bootstrap drives.

It builds real venvs and real (fake-content) installs so tests can import what was installed,
and it logs every invocation so tests can count uv calls. See `fake_uv.__main__` for the CLI.
"""
