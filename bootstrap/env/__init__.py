"""The managed environment: the venv's layout, its marker and runtime identity, uv, the
requirements and their pins, the interpreter's platform and report, kernelspecs."""
